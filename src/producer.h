/*-------------------------------------------------------------------------
 *
 * producer.h
 *	  The worker's Kafka producer (librdkafka, in a process of its own):
 *	  configuration, producing a batch, delivery reports, and what each Kafka
 *	  error means for a message.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_PRODUCER_H
#define OUTBOX_PRODUCER_H

#include "message.h"

typedef struct OutboxProducer OutboxProducer;

/* How producer_await_deliveries() ended. */
typedef enum AwaitResult
{
	AWAIT_ALL_REPORTED,			/* every message produced has its report */
	AWAIT_WITHDRAWN,			/* what had none was withdrawn */
	AWAIT_WOKEN					/* the latch was set first */
} AwaitResult;

extern OutboxProducer *producer_create(char *errbuf, size_t errlen);
extern void producer_destroy(OutboxProducer *producer);
extern bool producer_settings_changed(OutboxProducer *producer);
extern bool producer_failed_fatally(OutboxProducer *producer);
extern void producer_serve_events(OutboxProducer *producer);
extern void producer_serve_events_for(OutboxProducer *producer, long timeout_ms);
extern bool producer_brokers_reachable(OutboxProducer *producer, int timeout_ms);
extern void producer_produce(OutboxProducer *producer, OutboxMessage *messages, int count);
extern AwaitResult producer_await_deliveries(OutboxProducer *producer, bool until_woken);
extern bool producer_refused_with_others(const OutboxMessage *message);
extern void producer_simulate_fatal_error(OutboxProducer *producer);

#endif							/* OUTBOX_PRODUCER_H */

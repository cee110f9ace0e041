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

#include "nodes/pg_list.h"

#include "message.h"

typedef struct OutboxProducer OutboxProducer;

/* How producer_await_deliveries() ended. */
typedef enum AwaitResult
{
	AWAIT_ALL_REPORTED,			/* every message produced has its report */
	AWAIT_WITHDRAWN,			/* what had none was withdrawn */
	AWAIT_WOKEN					/* the latch was set first */
} AwaitResult;

/*
 * What a transactional producer's start found (producer_recover()): the
 * progress records, each a palloc'd copy in context, of the transactions
 * Kafka committed since from_offset; the offset the next start reads from;
 * and how many records retention removed that it should have read.
 */
typedef struct ProducerRecovery
{
	MemoryContext context;
	List	   *records;
	int64		start_offset;
	int64		gone;
} ProducerRecovery;

extern OutboxProducer *producer_create(const char *transactional_id, char *errbuf, size_t errlen);
extern bool producer_transactional(OutboxProducer *producer);
extern bool producer_started(OutboxProducer *producer);
extern bool producer_recover(OutboxProducer *producer, int64 from_offset,
							 ProducerRecovery *recovery, char *errbuf, size_t errlen);
extern WireTransactionOutcome producer_end_transaction(OutboxProducer *producer, bool commit,
													   int64 *progress_offset);
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

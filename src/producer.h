/*-------------------------------------------------------------------------
 *
 * producer.h
 *	  The worker's Kafka producer (librdkafka): configuration, producing a
 *	  batch, delivery reports, and what each Kafka error means for a message.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_PRODUCER_H
#define OUTBOX_PRODUCER_H

#include "utils/jsonb.h"

/* What became of one message of a batch. */
typedef enum DeliveryOutcome
{
	DELIVERY_NOT_SENT = 0,		/* not produced, or withdrawn: leave the row as it is */
	DELIVERY_PENDING,			/* produced, no delivery report yet */
	DELIVERY_OK,				/* acknowledged by Kafka */
	DELIVERY_RETRY,				/* failed; may succeed later */
	DELIVERY_PERMANENT			/* failed; will never succeed: dead-letter it */
} DeliveryOutcome;

/* One claimed message, and what happened to it. */
typedef struct OutboxMessage
{
	int64		id;
	char	   *message_id;		/* uuid as text, sent as header outbox-message-id */
	char	   *topic;
	char	   *key;			/* NULL for no key */
	char	   *payload;
	size_t		payload_len;
	Jsonb	   *headers;		/* NULL for none */
	int64		timestamp_ms;	/* enqueue time, the record's timestamp */
	int			attempts;		/* failed attempts before this one */

	DeliveryOutcome outcome;
	int			error_code;		/* rd_kafka_resp_err_t when not DELIVERY_OK */
	bool		possibly_persisted;
	bool		produced_alone; /* sent again on its own after a refusal for size */
	int32		partition;
	int64		offset;
} OutboxMessage;

typedef struct OutboxProducer OutboxProducer;

extern OutboxProducer *producer_create(char *errbuf, size_t errlen);
extern void producer_destroy(OutboxProducer *producer);
extern bool producer_settings_changed(OutboxProducer *producer);
extern bool producer_failed_fatally(OutboxProducer *producer);
extern void producer_serve_events(OutboxProducer *producer);
extern bool producer_brokers_reachable(OutboxProducer *producer, int timeout_ms);
extern void producer_produce(OutboxProducer *producer, OutboxMessage *message);
extern bool producer_await_deliveries(OutboxProducer *producer);
extern bool producer_refused_for_size(const OutboxMessage *message);
extern void producer_simulate_fatal_error(OutboxProducer *producer);
extern const char *producer_error_text(int error_code);

#endif							/* OUTBOX_PRODUCER_H */

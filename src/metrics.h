/*-------------------------------------------------------------------------
 *
 * metrics.h
 *	  Per-topic delivery metrics of each database's publisher: how many
 *	  messages Kafka acknowledged in the last minute and their commit-to-ack
 *	  latency, as outbox_status shows them (through outbox_topic_metrics()).
 *	  metrics.c owns their shared memory; its header comment states the
 *	  layout, the bounds and the locking rule.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_METRICS_H
#define OUTBOX_METRICS_H

#include "datatype/timestamp.h"

#include "message.h"

/*
 * The most topics a database's metrics tell apart in a minute; the
 * deliveries of any further topic count under one row of this name, which
 * no Kafka topic can have.
 */
#define METRICS_MAX_TOPICS 64
#define METRICS_OTHER_TOPICS "(other topics)"

/* In the postmaster, from _PG_init. */
extern void metrics_init(void);

/* In a publisher. */
extern void metrics_attach(int slot, Oid database);
extern TimestampTz metrics_latency_start(TransactionId xmin, TimestampTz created_at,
										 int attempts, TimestampTz due_at);
extern void metrics_count_deliveries(const OutboxMessage *messages, int count,
									 TimestampTz settled_at);

#endif							/* OUTBOX_METRICS_H */

/*-------------------------------------------------------------------------
 *
 * store.h
 *	  The worker's statements on the outbox tables: claim a batch, record
 *	  what Kafka said about it, purge old sent rows.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_STORE_H
#define OUTBOX_STORE_H

#include "producer.h"

extern Oid	store_find_extension(void);
extern void store_forget_extension(void);
extern int	store_claim_batch(OutboxMessage **messages, int limit,
							  const OutboxMessage *in_flight, int in_flight_count);
extern void store_record_outcomes(OutboxMessage *messages, int count);
extern uint64 store_purge_sent(void);
extern long store_ms_until_next_retry(void);

#endif							/* OUTBOX_STORE_H */

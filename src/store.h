/*-------------------------------------------------------------------------
 *
 * store.h
 *	  The publishing worker's statements on the outbox tables: claim a
 *	  batch, record what Kafka said about it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_STORE_H
#define OUTBOX_STORE_H

#include "message.h"

/* How many messages of a batch each recording statement took. */
typedef struct RecordedOutcomes
{
	int			delivered;
	int			retries_scheduled;
	int			dead_lettered;
	bool		floor_lowered;	/* some message may wait below the claim floor */
} RecordedOutcomes;

extern Oid	store_find_extension(void);
extern int	store_claim_batch(OutboxMessage **messages, bool *full,
							  int max_count, int64 max_bytes,
							  const OutboxMessage *in_flight, int in_flight_count);
extern void store_record_outcomes(OutboxMessage *messages, int count,
								  RecordedOutcomes *recorded);
extern char *store_describe_failure(const OutboxMessage *m);
extern void store_lower_claim_floor(int64 id);
extern Oid	store_extension_namespace(void);
extern long store_ms_until_next_retry(void);
extern void store_rescan(bool from_left_edge);
extern void store_hand_over_passed_rows(void);

#endif							/* OUTBOX_STORE_H */

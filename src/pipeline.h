/*-------------------------------------------------------------------------
 *
 * pipeline.h
 *	  The publishing worker's pipeline: claim, produce, settle, record.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_PIPELINE_H
#define OUTBOX_PIPELINE_H

/* What one turn of the pipeline found. */
typedef enum TurnResult
{
	TURN_NO_EXTENSION,			/* CREATE EXTENSION outbox has not run here */
	TURN_DRAINED,				/* nothing in flight, nothing more to claim */
	TURN_IN_FLIGHT,				/* a partial batch in flight: go again, after
								 * what commits meanwhile has gathered */
	TURN_GO_ON					/* more waits: go again at once */
} TurnResult;

typedef struct Pipeline Pipeline;

extern Pipeline *pipeline_create(void);
extern bool pipeline_has_batch_in_flight(Pipeline *p);
extern bool pipeline_prepare_producer(Pipeline *p, long *wait_ms);
extern TurnResult pipeline_turn(Pipeline *p, bool late_claims, long *next_retry_ms);
extern void pipeline_gather(Pipeline *p, long timeout_ms);
extern void pipeline_finish(Pipeline *p);

#endif							/* OUTBOX_PIPELINE_H */

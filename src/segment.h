/*-------------------------------------------------------------------------
 *
 * segment.h
 *	  The outbox's segments: the partitions of outbox_message, which a row
 *	  joins by the time it is inserted and which the worker truncates once
 *	  drained.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_SEGMENT_H
#define OUTBOX_SEGMENT_H

#include "utils/timestamp.h"

/* As many as the install script makes: outbox_message_0 to _3. */
#define OUTBOX_SEGMENTS 4

/* How soon to try again a segment not yet drained, or not lockable. */
#define RECLAIM_RETRY_MS 1000

extern int	segment_at(TimestampTz t);
extern bool segments_to_reclaim(long *turn_ends_ms, bool *any_holds);
extern long segments_reclaim(bool in_reclaimer);

#endif							/* OUTBOX_SEGMENT_H */

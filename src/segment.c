/*-------------------------------------------------------------------------
 *
 * segment.c
 *	  The outbox's segments: outbox_message is partitioned by the column
 *	  segment, whose default, outbox_segment(), names the segment of the
 *	  time the inserting statement started.  The segments take turns, each
 *	  for SEGMENT_MIN_SECONDS (longer under outbox.sent_retention), and the
 *	  publisher truncates each once it is no longer the current one and
 *	  every message in it is delivered.
 *
 * Deleting a delivered row leaves a dead tuple, and its index entries, that
 * only VACUUM removes, and VACUUM removes none while a transaction anywhere
 * holds back the xmin horizon: a report running for an hour, a session idle
 * in a transaction, a standby's feedback.  TRUNCATE removes a segment's
 * dead and live tuples alike, whatever the horizon, and gives its disk
 * space back at once.  It needs the segment's ACCESS EXCLUSIVE lock, which
 * is only tried for (ConditionalLockRelationOid), never waited for: so the
 * worker never queues behind a reader of the outbox, nor makes a writer
 * queue behind it; a segment it cannot lock now is tried again later.  And
 * with the lock held, no transaction that wrote the segment is still in
 * progress, so a snapshot taken then sees every row it may ever hold.
 *
 * Which segment a row is in says nothing of its order, which is its id's;
 * a row may go to any segment (a transaction that started long ago writes
 * to the segment of its time) without harm to anything but the space.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/relation.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "segment.h"
#include "settings.h"
#include "store.h"

/* How long each segment takes new rows for, without outbox.sent_retention. */
#define SEGMENT_MIN_SECONDS 10

/* How soon to try again a segment not yet drained, or not lockable. */
#define RECLAIM_RETRY_MS 1000

PG_FUNCTION_INFO_V1(outbox_segment);

/*
 * Each segment's turn.  A sent row goes with its segment, so under
 * outbox.sent_retention a segment's rows must grow old enough before its
 * next turn: a turn of retention / (OUTBOX_SEGMENTS - 2) leaves a segment
 * a turn for its last rows to be sent and the retention to pass.  So sent
 * rows stay at least the retention, and at most about 1.5 times it.
 */
static int64
segment_usecs(void)
{
	int64		seconds = SEGMENT_MIN_SECONDS;

	if (outbox_sent_retention > 0)
		seconds = Max(seconds, ((int64) outbox_sent_retention + OUTBOX_SEGMENTS - 3) /
					  (OUTBOX_SEGMENTS - 2));
	return seconds * USECS_PER_SEC;
}

/* The segment that takes the rows inserted at time t. */
int
segment_at(TimestampTz t)
{
	int64		turn = t / segment_usecs();

	return (int) (((turn % OUTBOX_SEGMENTS) + OUTBOX_SEGMENTS) % OUTBOX_SEGMENTS);
}

/* Milliseconds until the segment of time t ends its turn. */
static long
ms_until_turn_ends(TimestampTz t)
{
	int64		usecs = segment_usecs();
	int64		into_turn = ((t % usecs) + usecs) % usecs;

	return (long) ((usecs - into_turn) / 1000) + 1;
}

/* The default of outbox_message.segment. */
Datum
outbox_segment(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT16((int16) segment_at(GetCurrentStatementStartTimestamp()));
}

/*
 * Does the segment hold anything on disk?  A truncated one holds no block.
 * One locked against reading (by an ALTER TABLE, say) counts as holding.
 */
static bool
segment_holds_blocks(Oid segment)
{
	Relation	rel;
	bool		holds;

	if (!ConditionalLockRelationOid(segment, AccessShareLock))
		return true;
	rel = relation_open(segment, NoLock);
	holds = RelationGetNumberOfBlocks(rel) > 0;
	relation_close(rel, NoLock);
	return holds;
}

/*
 * Truncate the segment if every message in it is delivered and, under
 * outbox.sent_retention, sent long enough ago.  Returns whether it did.
 * The lock, once taken, stays until the transaction ends; the statements
 * after it each take a snapshot of their own, after it (SPI does, for a
 * statement that is not read-only).
 */
static bool
truncate_if_drained(Oid segment, const char *qualified_name)
{
	Oid			argtypes[1] = {INT4OID};
	Datum		args[1] = {Int32GetDatum(outbox_sent_retention)};
	bool		isnull;
	bool		holds_messages;

	if (!ConditionalLockRelationOid(segment, AccessExclusiveLock))
		return false;
	if (SPI_execute_with_args(psprintf("SELECT EXISTS (SELECT FROM ONLY %1$s WHERE state <> 'sent')"
									   "    OR EXISTS (SELECT FROM ONLY %1$s WHERE state = 'sent'"
									   "       AND sent_at >= pg_catalog.now()"
									   "                      - $1::pg_catalog.float8 * interval '1 second')",
									   qualified_name),
							  1, argtypes, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox: could not look into segment %s", qualified_name);
	holds_messages = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
												1, &isnull));
	SPI_freetuptable(SPI_tuptable);
	if (holds_messages)
		return false;

	if (SPI_execute(psprintf("TRUNCATE ONLY %s", qualified_name), false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "outbox: could not truncate segment %s", qualified_name);
	elog(DEBUG1, "outbox: truncated segment %s", qualified_name);
	return true;
}

/*
 * Truncate every drained segment but the current one, in a transaction of
 * its own, so that each lock is held for moments only.  Returns how long
 * until there may be a segment to truncate: one not drained is tried again
 * soon; else the current one, which may take rows meanwhile, once its turn
 * ends.
 */
long
segments_reclaim(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int			current = segment_at(now);
	long		next_ms = ms_until_turn_ends(now);

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "outbox: SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	if (OidIsValid(store_find_extension()))
	{
		Oid			namespace = store_extension_namespace();

		for (int s = 0; s < OUTBOX_SEGMENTS; s++)
		{
			char	   *name = psprintf("outbox_message_%d", s);
			Oid			segment = get_relname_relid(name, namespace);

			if (s == current || !OidIsValid(segment) || !segment_holds_blocks(segment))
				continue;
			if (!truncate_if_drained(segment,
									 quote_qualified_identifier(get_namespace_name(namespace), name)))
				next_ms = Min(next_ms, RECLAIM_RETRY_MS);
		}
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	return next_ms;
}

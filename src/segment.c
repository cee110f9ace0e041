/*-------------------------------------------------------------------------
 *
 * segment.c
 *	  The outbox's segments: outbox_message is partitioned by the column
 *	  segment, whose default, outbox_segment(), names the segment of the
 *	  time the inserting statement started.  The segments take turns, each
 *	  for SEGMENT_MIN_SECONDS (longer under outbox.sent_retention), and
 *	  each is truncated once it is no longer the current one and every
 *	  message in it is delivered: by a reclaimer, a process the publisher
 *	  starts for that (publisher.c), or by the publisher itself when no
 *	  background worker slot is free.
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
 * What a truncation costs grows with what the segment held: the look for
 * a message not yet delivered reads every page (a few hundred thousand
 * dead rows: tens of milliseconds, the first time, which prunes the pages
 * and sets the rows' hint bits), and the commit removes the files (as
 * long again).  In the publisher, that would be as long without a message
 * published; so a reclaimer does it, and looks first without the lock,
 * which the publisher's claims would wait for: under the lock, the second
 * look is short, and the files go after the lock is released.
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
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "segment.h"
#include "settings.h"
#include "store.h"

/* How long each segment takes new rows for, without outbox.sent_retention. */
#define SEGMENT_MIN_SECONDS 10

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
 * How a segment is looked into: by a sequential scan, whatever the
 * worker's planning settings say.  A drained segment holds dead rows only,
 * which a sequential scan reads a page at a time, where the index of
 * waiting rows would visit a heap page for each.
 */
static const struct
{
	const char *name;
	const char *value;
}			look_by_pages[] = {
	{"enable_seqscan", "on"},
	{"enable_indexscan", "off"},
	{"enable_indexonlyscan", "off"},
	{"enable_bitmapscan", "off"},
};

/*
 * Does the segment hold a message not yet delivered or, under
 * outbox.sent_retention, one sent too recently to go?
 */
static bool
holds_messages(const char *qualified_name)
{
	Oid			argtypes[1] = {INT4OID};
	Datum		args[1] = {Int32GetDatum(outbox_sent_retention)};
	bool		isnull;
	bool		holds;

	/* for this transaction only */
	for (int i = 0; i < (int) lengthof(look_by_pages); i++)
		(void) set_config_option(look_by_pages[i].name, look_by_pages[i].value,
								 PGC_SUSET, PGC_S_OVERRIDE, GUC_ACTION_LOCAL, true, 0, false);
	if (SPI_execute_with_args(psprintf("SELECT EXISTS (SELECT FROM ONLY %1$s WHERE state <> 'sent')"
									   "    OR EXISTS (SELECT FROM ONLY %1$s WHERE state = 'sent'"
									   "       AND sent_at >= pg_catalog.now()"
									   "                      - $1::pg_catalog.float8 * interval '1 second')",
									   qualified_name),
							  1, argtypes, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox: could not look into segment %s", qualified_name);
	holds = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_freetuptable(SPI_tuptable);
	return holds;
}

/* What is done to each segment of a set, in reclaim_in_transaction(). */
typedef bool (*SegmentAction) (Oid segment, const char *qualified_name);

/*
 * The first look, with no lock but a reader's: does the segment seem to
 * hold no message?  Done first and for every segment that holds blocks, so
 * that the look under the lock, which blocks the worker's claims, finds
 * the segment's pages pruned and its rows' hint bits set, and takes a
 * fraction of the time; and so that a segment still in use is not locked
 * at all.
 */
static bool
looks_drained(Oid segment, const char *qualified_name)
{
	return !holds_messages(qualified_name);
}

static bool
holds_blocks(Oid segment, const char *qualified_name)
{
	return segment_holds_blocks(segment);
}

/*
 * How long a reclaimer tries for a segment's lock, a try every
 * LOCK_TRY_INTERVAL_MS: the publisher holds a lock on every segment
 * during each of its transactions, so a single try would most often fail
 * under a steady load, and waiting in the lock's queue would make the
 * publisher's next claim wait behind this one, and behind whatever it
 * waits for.
 */
#define LOCK_TRY_INTERVAL_MS 1
#define LOCK_TRIES 200

/* Is this process a reclaimer, which may take its time for a lock? */
static bool patient = false;

/*
 * Take the segment's ACCESS EXCLUSIVE lock, without waiting in its queue:
 * at once in the publisher (between its turns, it holds none), within
 * LOCK_TRIES tries in a reclaimer.  Returns whether it did.
 */
static bool
lock_segment(Oid segment)
{
	for (int tries = patient ? LOCK_TRIES : 1; tries > 0; tries--)
	{
		if (ConditionalLockRelationOid(segment, AccessExclusiveLock))
			return true;
		if (tries > 1)
			(void) WaitLatch(MyLatch, WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, LOCK_TRY_INTERVAL_MS,
							 PG_WAIT_EXTENSION);
		CHECK_FOR_INTERRUPTS();
	}
	return false;
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
	if (!lock_segment(segment) || holds_messages(qualified_name))
		return false;
	if (SPI_execute(psprintf("TRUNCATE ONLY %s", qualified_name), false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "outbox: could not truncate segment %s", qualified_name);
	elog(DEBUG1, "outbox: truncated segment %s", qualified_name);
	return true;
}

/*
 * Begin a transaction of the reclaim's own, with the extension locked
 * against DROP EXTENSION if it is there; returns whether it is.
 */
static bool
begin_reclaim_transaction(void)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "outbox: SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	return OidIsValid(store_find_extension());
}

static void
commit_reclaim_transaction(void)
{
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
}

/*
 * Do action to each segment in the set (a bit per segment), in a
 * transaction of its own; returns the set of those for which it returned
 * true.
 */
static int
reclaim_in_transaction(int segments, SegmentAction action)
{
	int			done = 0;

	if (begin_reclaim_transaction())
	{
		Oid			namespace = store_extension_namespace();

		for (int s = 0; s < OUTBOX_SEGMENTS; s++)
		{
			char	   *name = psprintf("outbox_message_%d", s);
			Oid			segment = get_relname_relid(name, namespace);

			if ((segments & (1 << s)) && OidIsValid(segment) &&
				action(segment, quote_qualified_identifier(get_namespace_name(namespace), name)))
				done |= 1 << s;
		}
	}
	commit_reclaim_transaction();
	return done;
}

#define ALL_SEGMENTS ((1 << OUTBOX_SEGMENTS) - 1)

/* Every segment but the current one. */
static int
all_but_current(TimestampTz now)
{
	return ALL_SEGMENTS & ~(1 << segment_at(now));
}

/*
 * Is any segment but the current one holding blocks, which a reclaim may
 * give back?  *turn_ends_ms says how long until the current one's turn
 * ends, when it may hold some too; *any_holds, whether any segment, the
 * current one too, holds blocks: if none does, the outbox holds no row.
 * Cheap: it reads the segments' sizes.
 */
bool
segments_to_reclaim(long *turn_ends_ms, bool *any_holds)
{
	TimestampTz now = GetCurrentTimestamp();
	int			holding = reclaim_in_transaction(ALL_SEGMENTS, holds_blocks);

	*turn_ends_ms = ms_until_turn_ends(now);
	*any_holds = holding != 0;
	return (holding & all_but_current(now)) != 0;
}

/*
 * In a reclaimer, before the segments: the look for rows the publisher's
 * claims passed (store.c's "The claim floor"), whose walk over the index
 * entries of the rows deleted since VACUUM last ran is not the publisher's
 * either.
 */
static void
hand_over_passed_rows(void)
{
	if (begin_reclaim_transaction())
		store_hand_over_passed_rows();
	commit_reclaim_transaction();
}

/*
 * Truncate every drained segment but the current one: in a reclaimer,
 * after the look for rows the claims passed, a first look at each, then
 * each that looked drained under its lock (in the publisher, each under
 * its lock at once), in a transaction of its own, so that each lock is
 * held for moments only (and given up before the commit removes the
 * segment's files, the slowest part).  Returns how long until there may
 * be a segment to truncate: one not drained is tried again soon; else the
 * current one, which may take rows meanwhile, once its turn ends.
 */
long
segments_reclaim(bool in_reclaimer)
{
	TimestampTz now = GetCurrentTimestamp();
	long		next_ms = ms_until_turn_ends(now);
	int			holding;
	int			drained;

	if (in_reclaimer)
		hand_over_passed_rows();
	holding = reclaim_in_transaction(all_but_current(now), holds_blocks);
	if (holding == 0)
		return next_ms;
	/* in the publisher, a first look would only be a second scan */
	drained = in_reclaimer ? reclaim_in_transaction(holding, looks_drained) : holding;
	patient = in_reclaimer;
	for (int s = 0; s < OUTBOX_SEGMENTS; s++)
	{
		if (!(holding & (1 << s)))
			continue;
		if (!(drained & (1 << s)) || !reclaim_in_transaction(1 << s, truncate_if_drained))
			next_ms = Min(next_ms, RECLAIM_RETRY_MS);
	}
	return next_ms;
}

/*-------------------------------------------------------------------------
 *
 * standby_slots.c
 *	  outbox.synchronized_standby_slots: a claimed batch is published only
 *	  once the standbys of the listed physical replication slots have
 *	  flushed the WAL of every transaction it holds.
 *
 * Under asynchronous streaming replication, a standby promoted after the
 * primary died may lack the last transactions the primary committed.  Had
 * the worker published their messages, Kafka would hold messages whose
 * transactions, business data and all, the new primary never had: phantoms.
 * So, with this setting, the worker holds each claimed batch until every
 * listed slot's restart_lsn (for a physical slot, the position its standby
 * has flushed and reported) has reached the batch's position (pipeline.c):
 * the later of the insert position read right after the claim, which every
 * commit the claim's snapshot saw precedes, and the end of the turn's own
 * commit, which also records the batch settled in that turn, so that a
 * failover publishes at most one batch twice, as a crash does.
 *
 * The wait runs after the turn's commit, with no transaction and no
 * snapshot open: a standby that is down may hold publishing for hours, and
 * a snapshot held that long would hold back vacuum.  The wait looks at the
 * slots every STANDBY_POLL_MIN_MS at first, backing off to
 * STANDBY_POLL_MAX_MS; from PostgreSQL 17 it is also woken by the standby's
 * reply, for a slot listed in PostgreSQL's own synchronized_standby_slots as
 * well (sleep_for_standby_reply(), pg_compat.h).  It ends at once on
 * SIGTERM (the batch is then left unproduced, and its rows wait), follows a
 * reload of the setting, and ends too when the extension is dropped.
 *
 * A listed slot that does not exist, is logical or is invalidated keeps the
 * wait going: publishing resumes only once it is fixed, or removed from the
 * list.  Each such problem is reported once, as a WARNING and in
 * outbox_worker.last_error; the worker's state says "waiting for standby"
 * for as long as it waits.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "pg_compat.h"
#include "pgstat.h"
#include "postmaster/interrupt.h"
#include "replication/slot.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "launcher.h"
#include "settings.h"
#include "standby_slots.h"
#include "worker_slot.h"

/* The pause between two looks at the slots: from the first to the longest. */
#define STANDBY_POLL_MIN_MS 1
#define STANDBY_POLL_MAX_MS 10

/* How often a long wait looks for the extension in the catalog. */
#define EXTENSION_CHECK_INTERVAL_MS 1000

/* Where a listed slot stands against the position waited for. */
typedef enum SlotCondition
{
	SLOT_REACHED,
	SLOT_BEHIND,				/* its standby has yet to flush that far */
	SLOT_MISSING,
	SLOT_LOGICAL,
	SLOT_INVALIDATED,
	SLOT_UNRESERVED				/* no WAL reserved: no standby streamed yet */
} SlotCondition;

/* What is reported of a slot in a condition that is a problem. */
typedef struct SlotProblem
{
	int			sqlerrcode;
	const char *what;
	const char *hint;			/* takes the slot's name */
} SlotProblem;

static const SlotProblem slot_problems[] = {
	[SLOT_MISSING] = {ERRCODE_UNDEFINED_OBJECT, "does not exist",
	"Create it with pg_create_physical_replication_slot('%s', true) and set the standby's primary_slot_name to it, or remove it from outbox.synchronized_standby_slots, and reload the configuration."},
	[SLOT_LOGICAL] = {ERRCODE_WRONG_OBJECT_TYPE, "is a logical slot, which says nothing of a standby",
	"Name the physical slot of a streaming standby instead of \"%s\" in outbox.synchronized_standby_slots, and reload the configuration."},
	[SLOT_INVALIDATED] = {ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "has been invalidated: its standby fell too far behind (max_slot_wal_keep_size)",
	"Rebuild the standby of \"%s\" and its slot, or remove the slot from outbox.synchronized_standby_slots, and reload the configuration."},
	[SLOT_UNRESERVED] = {ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "reserves no WAL: no standby has streamed from it yet",
	"Start the standby whose primary_slot_name is \"%s\", or remove the slot from outbox.synchronized_standby_slots, and reload the configuration."},
};

/* The slot and condition last reported, so that each problem is reported once. */
static NameData reported_slot;
static SlotCondition reported_condition = SLOT_REACHED;

bool
standby_wait_required(void)
{
	return outbox_synchronized_standby_slots[0] != '\0';
}

/*
 * Where the slot of this name stands against lsn.  Its fields are read
 * under its spinlock, and it is found under ReplicationSlotControlLock, as
 * PostgreSQL's own readers of the slots do.
 */
static SlotCondition
slot_condition(const char *name, XLogRecPtr lsn)
{
	ReplicationSlot *slot;
	SlotCondition condition = SLOT_MISSING;

	LWLockAcquire(ReplicationSlotControlLock, LW_SHARED);
	slot = SearchNamedReplicationSlot(name, false);
	if (slot)
	{
		bool		logical;
		XLogRecPtr	restart_lsn;
		bool		invalidated;

		SpinLockAcquire(&slot->mutex);
		logical = SlotIsLogical(slot);
		restart_lsn = slot->data.restart_lsn;
		invalidated = slot_is_invalidated(&slot->data);
		SpinLockRelease(&slot->mutex);

		if (logical)
			condition = SLOT_LOGICAL;
		else if (XLogRecPtrIsInvalid(restart_lsn))
			condition = invalidated ? SLOT_INVALIDATED : SLOT_UNRESERVED;
		else
			condition = restart_lsn >= lsn ? SLOT_REACHED : SLOT_BEHIND;
	}
	LWLockRelease(ReplicationSlotControlLock);
	return condition;
}

/* Report a slot's problem, unless it is the one reported last. */
static void
report_problem(const char *name, SlotCondition condition)
{
	const SlotProblem *problem = &slot_problems[condition];
	char		message[WORKER_LAST_ERROR_LEN];

	if (condition == reported_condition && strcmp(NameStr(reported_slot), name) == 0)
		return;
	reported_condition = condition;
	namestrcpy(&reported_slot, name);

	snprintf(message, sizeof(message),
			 "replication slot \"%s\" of outbox.synchronized_standby_slots %s: nothing is published meanwhile",
			 name, problem->what);
	ereport(WARNING,
			(errcode(problem->sqlerrcode),
			 errmsg("outbox: %s", message),
			 errhint(problem->hint, name)));
	worker_record_error(message);
}

/*
 * Have the standbys of all these slots flushed lsn?  Looks no further than
 * the first that has not, and reports it if it is a problem: so, of
 * several problems, the first is reported until it is fixed, and only once.
 */
static bool
slots_reached(List *names, XLogRecPtr lsn)
{
	ListCell   *lc;

	foreach(lc, names)
	{
		const char *name = lfirst(lc);
		SlotCondition condition = slot_condition(name, lsn);

		if (condition == SLOT_REACHED)
			continue;
		if (condition != SLOT_BEHIND)
			report_problem(name, condition);
		return false;
	}
	return true;
}

/* The end of a successful wait: a problem seen again is reported again. */
static void
forget_reported_problem(void)
{
	reported_condition = SLOT_REACHED;
}

/*
 * Wait, with no transaction open, until the standbys of every slot of
 * outbox.synchronized_standby_slots have flushed lsn, or the setting is
 * emptied.  Returns true to produce the batch; false if the worker is to
 * stop, or the extension is gone: the batch is then left unproduced.
 */
bool
standby_wait_for_flush(XLogRecPtr lsn)
{
	List	   *names;
	long		poll_ms = STANDBY_POLL_MIN_MS;
	TimestampTz extension_checked_at;
	bool		reported_waiting = false;

	Assert(!IsTransactionState());
	if (!standby_wait_required())
		return true;
	names = settings_standby_slot_names();
	extension_checked_at = GetCurrentTimestamp();

	/* the turn's commit may not have flushed it (synchronous_commit off) */
	XLogFlush(lsn);

	while (!slots_reached(names, lsn))
	{
		TimestampTz now;

		if (!reported_waiting)
		{
			worker_report_state(WORKER_WAITING_FOR_STANDBY);
			pgstat_report_activity(STATE_RUNNING, "outbox: waiting for standby");
			reported_waiting = true;
		}
		sleep_for_standby_reply(poll_ms);
		CHECK_FOR_INTERRUPTS();
		if (ShutdownRequestPending)
			return false;
		if (settings_reload_if_asked())
		{
			names = settings_standby_slot_names();
			if (names == NIL)
				break;
		}

		now = GetCurrentTimestamp();
		if (TimestampDifferenceExceeds(extension_checked_at, now, EXTENSION_CHECK_INTERVAL_MS))
		{
			if (!extension_installed_here())
				return false;
			extension_checked_at = now;
		}
		poll_ms = Min(poll_ms * 2, STANDBY_POLL_MAX_MS);
	}
	forget_reported_problem();
	return true;
}

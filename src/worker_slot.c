/*-------------------------------------------------------------------------
 *
 * worker_slot.c
 *	  The publishers' slots in the outbox's shared memory
 *	  (slot_internal.h, allocated by shared_memory.c): an array of
 *	  outbox.max_workers slots, one per publishing worker, each with its
 *	  database's inbox part (inbox_slot.c).  This file owns the slots'
 *	  publisher side: the launcher hands them out, publishers attach to
 *	  theirs and report through it, backends wake publishers and read it for
 *	  the views.  It also says where a worker's errors are recorded, for the
 *	  publisher and the inbox worker alike (worker_report_error()).
 *
 * Locking rule.  The array is sized at server start and never changes.  A
 * slot is handed out by the launcher alone (worker_slot_assign(): its
 * database and generation), and released by it once its worker has gone.
 * Every other field of a slot but the counters is read and written under
 * the slot's spinlock, held only to copy plain values: no palloc, no
 * ereport, no system call (timestamps are taken before it is acquired), and
 * SetLatch() only after it is released.  The counters are atomics, added to
 * by the slot's worker only and read by anyone without the lock.  Only the
 * slot's own worker writes the rest, except fatal_error_drill, which
 * outbox_simulate_fatal_error() sets, and the two atomic ids of its claim
 * floor, which backends lower (compare-and-swap) and only the worker
 * raises.  The slot's inbox part follows the same rule
 * (inbox_slot.c).  A slot's spinlock is never held with launcher_lock
 * (launcher_slot.c): a worker leaving its slot wakes the launcher after
 * releasing it.
 *
 * A worker's report functions run on the worker's one thread: also from
 * the handlers of its Kafka process's frames (ERROR, CONSUME_ERROR, in
 * producer.c and inbox_consumer.c), which kafka_link.c calls as it reads
 * the socket, and from kafka_link.c when that process has died.  librdkafka
 * runs in the Kafka process alone, never in a PostgreSQL process, so they
 * may ereport.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "port/atomics.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/spin.h"

#include "slot_internal.h"
#include "worker_slot.h"

/* An id in the claim floor's atomics, in an order-keeping unsigned form. */
static uint64
encode_id(int64 id)
{
	return (uint64) id ^ (UINT64CONST(1) << 63);
}

/* The id of encode_id()'s form. */
static int64
decode_id(uint64 v)
{
	return (int64) (v ^ (UINT64CONST(1) << 63));
}

/* Lower the atomic v to x, if it is above. */
static void
atomic_lower(pg_atomic_uint64 *v, uint64 x)
{
	uint64		old = pg_atomic_read_u64(v);

	while (x < old && !pg_atomic_compare_exchange_u64(v, &old, x))
		;
}

static OutboxWorkerSlot *my_slot = NULL;	/* this worker's, once attached */

/*
 * Where this process records the errors it lives through
 * (worker_record_error()), under error_slot's spinlock: a publisher's slot's
 * last_error, or an inbox worker's slot's inbox part's; and how its log
 * lines begin.  Set as it attaches, cleared as it leaves.
 */
static OutboxWorkerSlot *error_slot = NULL;
static const char *error_prefix = "outbox";
static char *error_text = NULL;
static TimestampTz *error_text_at = NULL;

/*
 * How many errors this process has put into its last_error, and whether one
 * shows there now: worker_error_mark() and worker_clear_error() compare
 * with it.  Only the worker writes its last_error (the launcher clears it
 * before the worker attaches), so its own count says whether the error
 * shown is still one it knows of.
 */
static uint64 errors_recorded = 0;
static bool error_shown = false;

static const char *const state_names[] = {
	[WORKER_STOPPED] = "stopped",
	[WORKER_STARTING] = "starting",
	[WORKER_WAITING_FOR_BROKERS] = "waiting for brokers",
	[WORKER_WAITING_FOR_STANDBY] = "waiting for standby",
	[WORKER_IDLE] = "idle",
	[WORKER_PUBLISHING] = "publishing",
};

/* How many slots there are: outbox.max_workers at server start. */
int
worker_slot_count(void)
{
	return outbox_shared->slot_count;
}

/* Copy slot number i; returns false if it is free. */
bool
worker_slot_read(int i, WorkerStatus *status)
{
	OutboxWorkerSlot *slot = &outbox_shared->slots[i];

	SpinLockAcquire(&slot->mutex);
	status->database = slot->database;
	status->pid = slot->pid;
	status->state = slot->state;
	status->brokers_reachable = slot->brokers_reachable;
	status->started_at = slot->started_at;
	status->last_publish_at = slot->last_publish_at;
	status->last_error_at = slot->last_error_at;
	memcpy(status->last_error, slot->last_error, WORKER_LAST_ERROR_LEN);
	SpinLockRelease(&slot->mutex);

	status->published = pg_atomic_read_u64(&slot->published);
	status->retries_scheduled = pg_atomic_read_u64(&slot->retries_scheduled);
	status->dead_lettered = pg_atomic_read_u64(&slot->dead_lettered);
	return OidIsValid(status->database);
}

/* The name of a publisher's state, as outbox_worker shows it. */
const char *
worker_state_name(OutboxWorkerState state)
{
	return state_names[state];
}

/*
 * Who is in the slot, copied at once: the one read of a slot's fields
 * under its spinlock that the launcher, a publisher and an inbox worker
 * make to learn whose it is.
 */
SlotOccupancy
slot_occupancy(OutboxWorkerSlot *slot)
{
	SlotOccupancy occupancy;

	SpinLockAcquire(&slot->mutex);
	occupancy.database = slot->database;
	occupancy.generation = slot->generation;
	occupancy.publisher_pid = slot->pid;
	occupancy.exit_reason = slot->exit_reason;
	occupancy.inbox_wanted = OidIsValid(slot->database) && slot->inbox.wanted;
	occupancy.inbox_pid = slot->inbox.pid;
	SpinLockRelease(&slot->mutex);
	return occupancy;
}

/* Who is in slot number i; see slot_occupancy(). */
SlotOccupancy
worker_slot_occupancy(int i)
{
	return slot_occupancy(&outbox_shared->slots[i]);
}

/*
 * The slot a publisher or an inbox worker was started for: its number is
 * the worker's main_arg, and *generation, that of the slot as it was
 * handed out, is in bgw_extra (as launcher.c's start_worker() puts them).
 */
OutboxWorkerSlot *
slot_asked_for(Datum main_arg, uint32 *generation)
{
	int			i = DatumGetInt32(main_arg);

	if (i < 0 || i >= outbox_shared->slot_count)
		elog(FATAL, "outbox: worker slot %d does not exist", i);
	memcpy(generation, MyBgworkerEntry->bgw_extra, sizeof(*generation));
	return &outbox_shared->slots[i];
}

/* Set the latch of the worker in this slot, if one runs. */
static void
wake(OutboxWorkerSlot *slot)
{
	Latch	   *latch;

	SpinLockAcquire(&slot->mutex);
	latch = slot->latch;
	SpinLockRelease(&slot->mutex);
	if (latch)
		SetLatch(latch);
}

/* The slot handed out for this database, or NULL if none is. */
OutboxWorkerSlot *
slot_of_database(Oid database)
{
	for (int i = 0; i < outbox_shared->slot_count; i++)
		if (slot_occupancy(&outbox_shared->slots[i]).database == database)
			return &outbox_shared->slots[i];
	return NULL;
}

/*
 * Wake the publisher of this database.  Returns false if no slot is handed
 * out for it: no publisher serves it, nor is about to.
 */
bool
worker_wake_publisher(Oid database)
{
	OutboxWorkerSlot *slot = slot_of_database(database);

	if (slot)
	{
		pg_atomic_fetch_add_u64(&slot->commits_woken, 1);
		wake(slot);
	}
	return slot != NULL;
}

/* How many transactions have committed messages and woken this worker. */
uint64
worker_commits_woken(void)
{
	return pg_atomic_read_u64(&my_slot->commits_woken);
}

/* Is a slot handed out for this database: does a publisher serve it? */
bool
worker_database_served(Oid database)
{
	return slot_of_database(database) != NULL;
}

/*
 * Tell the publisher of a database that a transaction committed (prepared
 * false) or prepared (true) rows from the id lowest on: its claim floor
 * comes down to it.  Call it once the transaction has ended, or prepared
 * (a commit is reported before, by commit_report_write(), which hands over
 * here what no claim took).  A publisher not yet attached starts from the
 * left edge anyway.
 */
void
worker_lower_claim_floor(Oid database, int64 lowest, bool prepared)
{
	OutboxWorkerSlot *slot = slot_of_database(database);

	if (slot)
		atomic_lower(prepared ? &slot->prepared_below : &slot->committed_below,
					 encode_id(lowest));
}

/*
 * Tell the publisher of this database that a transaction committed a
 * delayed message due at due: it waits no longer than that.  Call it before
 * the wake.
 */
void
worker_note_delayed_message(Oid database, TimestampTz due)
{
	OutboxWorkerSlot *slot = slot_of_database(database);

	if (slot)
		atomic_lower(&slot->delayed_due, encode_id(due));
}

/* Ask every publisher's producer to fail fatally during its next batch. */
void
worker_request_fatal_error_drill(void)
{
	for (int i = 0; i < outbox_shared->slot_count; i++)
	{
		OutboxWorkerSlot *slot = &outbox_shared->slots[i];

		pg_atomic_write_u32(&slot->fatal_error_drill, 1);
		wake(slot);
	}
}

/*
 * Ask every publisher to pause at this point of its next batch, or (with
 * PAUSE_NONE) let a paused one go on.  A publisher that paused marks its
 * drill PAUSE_PAUSED, which no point matches: a publisher started after a
 * crash at the pause does not pause again.
 */
void
worker_request_pause(WorkerPausePoint point)
{
	for (int i = 0; i < outbox_shared->slot_count; i++)
	{
		OutboxWorkerSlot *slot = &outbox_shared->slots[i];

		pg_atomic_write_u32(&slot->pause_drill, point);
		wake(slot);
	}
}

/*
 * Hand out a free slot for a publisher of this database, preferring the one
 * that served it last, whose counters it then keeps.  Returns the slot's
 * number and sets *generation, to pass to the worker; or -1 if none is
 * free.
 */
int
worker_slot_assign(Oid database, uint32 *generation)
{
	int			chosen = -1;
	OutboxWorkerSlot *slot;

	for (int i = 0; i < outbox_shared->slot_count; i++)
	{
		slot = &outbox_shared->slots[i];
		if (OidIsValid(slot_occupancy(slot).database))
			continue;
		if (chosen < 0 || slot->last_database == database)
			chosen = i;
	}
	if (chosen < 0)
		return -1;

	slot = &outbox_shared->slots[chosen];
	if (slot->last_database != database)
	{
		pg_atomic_write_u64(&slot->published, 0);
		pg_atomic_write_u64(&slot->retries_scheduled, 0);
		pg_atomic_write_u64(&slot->dead_lettered, 0);
		pg_atomic_write_u64(&slot->inbox.applied, 0);
		pg_atomic_write_u64(&slot->inbox.duplicates, 0);
		pg_atomic_write_u64(&slot->inbox.failed, 0);
		pg_atomic_write_u64(&slot->inbox.dead_lettered, 0);
	}
	SpinLockAcquire(&slot->mutex);
	if (slot->last_database != database)
	{
		slot->last_publish_at = 0;
		slot->last_error_at = 0;
		slot->last_error[0] = '\0';
		slot->inbox.wanted = false;
		slot->inbox.last_applied_at = 0;
		slot->inbox.last_error_at = 0;
		slot->inbox.last_error[0] = '\0';
	}
	slot->database = database;
	slot->last_database = database;
	slot->generation++;
	*generation = slot->generation;
	slot->exit_reason = WORKER_EXIT_UNSAID;
	slot->state = WORKER_STARTING;
	slot->started_at = 0;
	SpinLockRelease(&slot->mutex);
	return chosen;
}

/* The slot's worker has gone, and no other is to take its place. */
void
worker_slot_release(int i)
{
	OutboxWorkerSlot *slot = &outbox_shared->slots[i];

	SpinLockAcquire(&slot->mutex);
	slot->database = InvalidOid;
	slot->state = WORKER_STOPPED;
	SpinLockRelease(&slot->mutex);
}

/* The worker leaves its slot, and wakes the launcher to say so. */
static void
detach(int code, Datum arg)
{
	SpinLockAcquire(&my_slot->mutex);
	my_slot->pid = 0;
	my_slot->latch = NULL;
	my_slot->state = WORKER_STOPPED;
	my_slot->brokers_reachable = false;
	SpinLockRelease(&my_slot->mutex);
	my_slot = NULL;
	slot_record_errors_in(NULL, "outbox", NULL, NULL);

	launcher_wake();
}

/*
 * Take the slot this worker was started for (see slot_asked_for()), until
 * it exits.  Returns the database it was handed out for, or InvalidOid if
 * it has been handed out again since this worker was asked for: then the
 * worker has nothing to do.
 */
Oid
worker_slot_attach(Datum main_arg)
{
	TimestampTz now = GetCurrentTimestamp();
	uint32		generation;
	Oid			database = InvalidOid;

	my_slot = slot_asked_for(main_arg, &generation);
	SpinLockAcquire(&my_slot->mutex);
	if (my_slot->generation == generation && my_slot->pid == 0)
	{
		database = my_slot->database;
		my_slot->pid = MyProcPid;
		my_slot->latch = MyLatch;
		my_slot->state = WORKER_STARTING;
		my_slot->brokers_reachable = false;
		my_slot->started_at = now;
	}
	SpinLockRelease(&my_slot->mutex);
	if (!OidIsValid(database))
	{
		my_slot = NULL;
		return InvalidOid;
	}
	pg_atomic_write_u64(&my_slot->committed_below, NO_ID);
	pg_atomic_write_u64(&my_slot->prepared_below, NO_ID);
	pg_atomic_write_u64(&my_slot->delayed_due, NO_ID);
	slot_record_errors_in(my_slot, "outbox", my_slot->last_error, &my_slot->last_error_at);
	on_shmem_exit(detach, 0);
	return database;
}

/* Tell the launcher why this worker is about to exit. */
void
worker_report_exit(WorkerExitReason reason)
{
	SpinLockAcquire(&my_slot->mutex);
	my_slot->exit_reason = reason;
	SpinLockRelease(&my_slot->mutex);
}

/* Say what this publisher is doing, for outbox_worker. */
void
worker_report_state(OutboxWorkerState state)
{
	SpinLockAcquire(&my_slot->mutex);
	my_slot->state = state;
	SpinLockRelease(&my_slot->mutex);
}

/* Say whether the brokers answered this publisher last, for outbox_worker. */
void
worker_report_brokers_reachable(bool reachable)
{
	SpinLockAcquire(&my_slot->mutex);
	my_slot->brokers_reachable = reachable;
	SpinLockRelease(&my_slot->mutex);
}

/* Did the brokers answer this publisher last, as it reported? */
bool
worker_brokers_known_reachable(void)
{
	bool		reachable;

	SpinLockAcquire(&my_slot->mutex);
	reachable = my_slot->brokers_reachable;
	SpinLockRelease(&my_slot->mutex);
	return reachable;
}

/*
 * Report an error the worker lives through: into the server log at elevel
 * (LOG, or DEBUG1 for what librdkafka's own log lines already say) and into
 * outbox_worker's last_error, or in an inbox worker inbox_worker's.  Never
 * ERROR: the worker goes on.
 */
void
worker_report_error(int elevel, const char *fmt,...)
{
	char		message[WORKER_LAST_ERROR_LEN];
	va_list		args;

	Assert(elevel < ERROR);
	va_start(args, fmt);
	vsnprintf(message, sizeof(message), fmt, args);
	va_end(args);

	ereport(elevel, (errmsg("%s: %s", error_prefix, message)));
	worker_record_error(message);
}

/*
 * Put a message into outbox_worker's last_error (in an inbox worker,
 * inbox_worker's), for an error that the caller has reported to the log
 * itself (with an errcode and a hint, say).
 */
void
worker_record_error(const char *message)
{
	TimestampTz now = GetCurrentTimestamp();

	if (error_slot == NULL)
		return;					/* not attached: the log says it alone */
	errors_recorded++;
	error_shown = true;
	SpinLockAcquire(&error_slot->mutex);
	strlcpy(error_text, message, WORKER_LAST_ERROR_LEN);
	*error_text_at = now;
	SpinLockRelease(&error_slot->mutex);
}

/*
 * Record this process's errors from now on in last_error and
 * last_error_at, fields of slot (under its spinlock), and begin its log
 * lines with prefix: as a publisher or an inbox worker attaches; slot NULL
 * as it leaves.
 */
void
slot_record_errors_in(OutboxWorkerSlot *slot, const char *prefix,
					  char *last_error, TimestampTz *last_error_at)
{
	error_slot = slot;
	error_prefix = prefix;
	error_text = last_error;
	error_text_at = last_error_at;
}

/*
 * The mark of the last error this process recorded: given to
 * worker_clear_error() once what caused it is mended.
 */
uint64
worker_error_mark(void)
{
	return errors_recorded;
}

/*
 * Clear last_error and last_error_at, if no error was recorded since mark:
 * what caused the error shown is mended, and a newer error, which may not
 * be, is left to show.
 */
void
worker_clear_error(uint64 mark)
{
	if (!error_shown || mark != errors_recorded || error_slot == NULL)
		return;
	error_shown = false;
	SpinLockAcquire(&error_slot->mutex);
	error_text[0] = '\0';
	*error_text_at = 0;
	SpinLockRelease(&error_slot->mutex);
}

/* Count a recorded batch's outcomes. */
void
worker_count_outcomes(uint64 published, uint64 retries_scheduled, uint64 dead_lettered)
{
	pg_atomic_fetch_add_u64(&my_slot->published, published);
	pg_atomic_fetch_add_u64(&my_slot->retries_scheduled, retries_scheduled);
	pg_atomic_fetch_add_u64(&my_slot->dead_lettered, dead_lettered);
	if (published > 0)
	{
		TimestampTz now = GetCurrentTimestamp();

		SpinLockAcquire(&my_slot->mutex);
		my_slot->last_publish_at = now;
		SpinLockRelease(&my_slot->mutex);
	}
}

/*
 * Pause here if outbox_simulate_pause() asked for this point: say so in
 * pg_stat_activity, and wait until it lets the publisher go on, or for
 * PAUSE_MAX_MS, or until the publisher is asked to stop.  So a test can
 * crash it, or its Kafka process, at that very point.
 */
void
worker_pause_if_asked(WorkerPausePoint point, const char *activity)
{
	TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), PAUSE_MAX_MS);
	uint32		expected = point;

	/* read first: a turn that no drill asked to pause takes no locked operation */
	if (pg_atomic_read_u32(&my_slot->pause_drill) != point ||
		!pg_atomic_compare_exchange_u32(&my_slot->pause_drill, &expected, PAUSE_PAUSED))
		return;
	pgstat_report_activity(STATE_RUNNING, activity);
	while (pg_atomic_read_u32(&my_slot->pause_drill) == PAUSE_PAUSED &&
		   !ShutdownRequestPending && GetCurrentTimestamp() < until)
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 PAUSE_POLL_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	pg_atomic_write_u32(&my_slot->pause_drill, PAUSE_NONE);
	SetLatch(MyLatch);			/* a wake reset meanwhile is not lost */
}

/* Has a fatal error drill been asked for since the last call? */
bool
worker_take_fatal_error_drill(void)
{
	return pg_atomic_exchange_u32(&my_slot->fatal_error_drill, 0) != 0;
}

/*
 * The lowest id of the commit reports handed over since this worker last
 * asked (commit_report.c), or PG_INT64_MAX if none.
 */
int64
worker_take_claim_floor_request(void)
{
	uint64		v = pg_atomic_exchange_u64(&my_slot->committed_below, NO_ID);

	return v == NO_ID ? PG_INT64_MAX : decode_id(v);
}

/*
 * The earliest time a delayed message committed since this worker last
 * asked is due, or DT_NOEND if none.
 */
TimestampTz
worker_take_delayed_due(void)
{
	uint64		v = pg_atomic_exchange_u64(&my_slot->delayed_due, NO_ID);

	return v == NO_ID ? DT_NOEND : decode_id(v);
}

/* Hold this worker's claim floor down to lowest, for a prepared transaction. */
void
worker_hold_claim_floor(int64 lowest)
{
	atomic_lower(&my_slot->prepared_below, encode_id(lowest));
}

/* Is the claim floor held down for a prepared transaction?  To what id? */
bool
worker_claim_floor_held(int64 *lowest)
{
	uint64		v = pg_atomic_read_u64(&my_slot->prepared_below);

	*lowest = decode_id(v);
	return v != NO_ID;
}

/*
 * Release the hold at lowest, once no prepared transaction is left; fails
 * (returns false) if a transaction prepared since, lowering it again.
 */
bool
worker_release_claim_floor(int64 lowest)
{
	uint64		expected = encode_id(lowest);

	return pg_atomic_compare_exchange_u64(&my_slot->prepared_below, &expected, NO_ID);
}

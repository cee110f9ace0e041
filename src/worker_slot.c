/*-------------------------------------------------------------------------
 *
 * worker_slot.c
 *	  The outbox's shared memory: the launcher's part, and an array of
 *	  outbox.max_workers slots, one per publishing worker.  This file is the
 *	  only one that touches it: the launcher hands the slots out, publishers
 *	  attach to theirs and report through it, backends wake publishers,
 *	  tell the launcher about databases and read it all for the views.
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
 * floor, which any backend of its database lowers (compare-and-swap) and
 * only the worker raises.  The slot's inbox part (InboxPart) is written,
 * under the same spinlock, by the database's inbox worker, but for wanted,
 * which backends and the publisher set and the inbox worker clears; its
 * counters are atomics too.
 *
 * The launcher's part is read and written under launcher_lock (an LWLock),
 * never held with a slot's spinlock nor across anything but copying: the
 * backends append the databases they announce and the holds they take, the
 * probe its result, the launcher the rest.
 *
 * A worker's report functions may also run inside librdkafka's callbacks:
 * those run on the worker's own thread, from rd_kafka_poll() (producer.c),
 * never on librdkafka's threads, so they may ereport.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "storage/spin.h"

#include "settings.h"
#include "worker_slot.h"

/*
 * The inbox worker of a slot's database (inbox_worker.c), which consumes
 * for its subscriptions.  It lives beside the publisher, in its slot, and
 * under its spinlock: it attaches with the slot's generation and leaves once
 * the slot is handed out again.  wanted says the database has
 * subscriptions (or may have: a backend sets it when one is made, the
 * publisher when it finds some, the inbox worker clears it when it finds
 * none); the launcher starts an inbox worker while it is set.
 */
typedef struct InboxPart
{
	bool		wanted;
	int			pid;			/* 0 while no inbox worker runs */
	Latch	   *latch;
	InboxWorkerState state;
	TimestampTz started_at;
	TimestampTz last_applied_at;
	TimestampTz last_error_at;
	char		last_error[WORKER_LAST_ERROR_LEN];
	pg_atomic_uint64 applied;
	pg_atomic_uint64 duplicates;
	pg_atomic_uint64 failed;
	pg_atomic_uint64 dead_lettered;
} InboxPart;

typedef struct OutboxWorkerSlot
{
	slock_t		mutex;
	Oid			database;		/* the one it serves; InvalidOid: free */
	Oid			last_database;	/* the one it served last, for its counters */
	uint32		generation;		/* bumped each time it is handed out */
	int			pid;			/* 0 while no worker runs */
	Latch	   *latch;			/* set to wake the worker */
	OutboxWorkerState state;
	WorkerExitReason exit_reason;
	bool		brokers_reachable;
	TimestampTz started_at;
	TimestampTz last_publish_at;
	TimestampTz last_error_at;
	char		last_error[WORKER_LAST_ERROR_LEN];
	pg_atomic_uint64 published;
	pg_atomic_uint64 retries_scheduled;
	pg_atomic_uint64 dead_lettered;
	pg_atomic_uint32 fatal_error_drill; /* see outbox_simulate_fatal_error() */
	pg_atomic_uint64 committed_below;	/* lowest id committed since the worker
										 * last looked, or NO_ID (store.c's
										 * claim floor) */
	pg_atomic_uint64 prepared_below;	/* lowest id of a prepared transaction,
										 * or NO_ID */
	pg_atomic_uint64 delayed_due;	/* earliest time a delayed message
									 * committed since the worker last looked
									 * is due, encoded as an id, or NO_ID */
	InboxPart	inbox;
} OutboxWorkerSlot;

/*
 * Ids in those atomics, in an order-keeping unsigned form; NO_ID is above
 * all.  (The id PG_INT64_MAX cannot be told from none: no sequence reaches
 * it.)
 */
#define NO_ID PG_UINT64_MAX

static uint64
encode_id(int64 id)
{
	return (uint64) id ^ (UINT64CONST(1) << 63);
}

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

typedef struct DatabaseHold
{
	Oid			database;
	int			pid;			/* the backend that holds it */
} DatabaseHold;

typedef struct LauncherShared
{
	int			pid;			/* 0 while no launcher runs */
	Latch	   *latch;
	TimestampTz started_at;
	int			announced_count;
	Oid			announced[LAUNCHER_MAX_ANNOUNCED];
	bool		announcements_lost; /* announced overflowed */
	bool		rescan_requested;
	DatabaseHold holds[LAUNCHER_MAX_HOLDS];
	Oid			probe_database;
	ProbeResult probe_result;
	int			databases_waiting;
	int			listed_waiting;
	Oid			waiting[LAUNCHER_MAX_LISTED_WAITING];
	TimestampTz last_error_at;
	char		last_error[WORKER_LAST_ERROR_LEN];
} LauncherShared;

typedef struct OutboxShared
{
	LWLock	   *launcher_lock;
	LauncherShared launcher;
	int			slot_count;
	OutboxWorkerSlot slots[FLEXIBLE_ARRAY_MEMBER];
} OutboxShared;

static OutboxShared *shared = NULL;
static OutboxWorkerSlot *my_slot = NULL;	/* this worker's, once attached */
static OutboxWorkerSlot *my_inbox_slot = NULL;	/* an inbox worker's */
static uint32 my_inbox_generation;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static const char *const state_names[] = {
	[WORKER_STOPPED] = "stopped",
	[WORKER_STARTING] = "starting",
	[WORKER_WAITING_FOR_BROKERS] = "waiting for brokers",
	[WORKER_WAITING_FOR_STANDBY] = "waiting for standby",
	[WORKER_IDLE] = "idle",
	[WORKER_PUBLISHING] = "publishing",
};

static const char *const inbox_state_names[] = {
	[INBOX_STOPPED] = "stopped",
	[INBOX_STARTING] = "starting",
	[INBOX_WAITING_FOR_BROKERS] = "waiting for brokers",
	[INBOX_IDLE] = "idle",
	[INBOX_APPLYING] = "applying",
};

static Size
shared_size(void)
{
	return add_size(offsetof(OutboxShared, slots),
					mul_size(sizeof(OutboxWorkerSlot), outbox_max_workers));
}

static void
outbox_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(shared_size()));
	RequestNamedLWLockTranche("outbox", 1);
}

static void
outbox_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	shared = ShmemInitStruct("outbox", shared_size(), &found);
	if (!found)
	{
		memset(shared, 0, shared_size());
		shared->launcher_lock = &(GetNamedLWLockTranche("outbox"))->lock;
		shared->slot_count = outbox_max_workers;
		for (int i = 0; i < shared->slot_count; i++)
		{
			OutboxWorkerSlot *slot = &shared->slots[i];

			SpinLockInit(&slot->mutex);
			pg_atomic_init_u64(&slot->published, 0);
			pg_atomic_init_u64(&slot->retries_scheduled, 0);
			pg_atomic_init_u64(&slot->dead_lettered, 0);
			pg_atomic_init_u32(&slot->fatal_error_drill, 0);
			pg_atomic_init_u64(&slot->committed_below, NO_ID);
			pg_atomic_init_u64(&slot->prepared_below, NO_ID);
			pg_atomic_init_u64(&slot->delayed_due, NO_ID);
			pg_atomic_init_u64(&slot->inbox.applied, 0);
			pg_atomic_init_u64(&slot->inbox.duplicates, 0);
			pg_atomic_init_u64(&slot->inbox.failed, 0);
			pg_atomic_init_u64(&slot->inbox.dead_lettered, 0);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/* Ask for the shared memory; in _PG_init, once the settings are defined. */
void
worker_slots_init(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = outbox_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = outbox_shmem_startup;
}

int
worker_slot_count(void)
{
	return shared->slot_count;
}

/* Copy slot number i; returns false if it is free. */
bool
worker_slot_read(int i, WorkerStatus *status)
{
	OutboxWorkerSlot *slot = &shared->slots[i];

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

const char *
worker_state_name(OutboxWorkerState state)
{
	return state_names[state];
}

/* The database the slot is handed out for; InvalidOid while it is free. */
static Oid
slot_database(OutboxWorkerSlot *slot)
{
	Oid			served;

	SpinLockAcquire(&slot->mutex);
	served = slot->database;
	SpinLockRelease(&slot->mutex);
	return served;
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
static OutboxWorkerSlot *
slot_of_database(Oid database)
{
	for (int i = 0; i < shared->slot_count; i++)
		if (slot_database(&shared->slots[i]) == database)
			return &shared->slots[i];
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
		wake(slot);
	return slot != NULL;
}

/* Is a slot handed out for this database: does a publisher serve it? */
bool
worker_database_served(Oid database)
{
	return slot_of_database(database) != NULL;
}

/*
 * Tell the publisher of this database that a transaction committed
 * (prepared false) or prepared (true) rows from the id lowest on: its claim
 * floor comes down to it.  Call it once the transaction is visible to new
 * snapshots, and before the wake.  A publisher not yet attached starts
 * from the left edge anyway.
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
	for (int i = 0; i < shared->slot_count; i++)
	{
		OutboxWorkerSlot *slot = &shared->slots[i];

		pg_atomic_write_u32(&slot->fatal_error_drill, 1);
		wake(slot);
	}
}

/*
 * The launcher's part.
 */

/* Set the launcher's latch, if it runs; call it with launcher_lock held. */
static void
wake_launcher_locked(void)
{
	if (shared->launcher.latch)
		SetLatch(shared->launcher.latch);
}

void
launcher_read(LauncherStatus *status)
{
	LauncherShared *l = &shared->launcher;

	LWLockAcquire(shared->launcher_lock, LW_SHARED);
	status->pid = l->pid;
	status->started_at = l->started_at;
	status->databases_waiting = l->databases_waiting;
	status->listed_waiting = l->listed_waiting;
	memcpy(status->waiting, l->waiting, sizeof(status->waiting));
	status->last_error_at = l->last_error_at;
	memcpy(status->last_error, l->last_error, WORKER_LAST_ERROR_LEN);
	LWLockRelease(shared->launcher_lock);
}

/*
 * Tell the launcher that this database has the extension (it was created,
 * or a transaction there enqueued while no publisher serves it).  Call it
 * once that is committed.
 */
void
launcher_announce_database(Oid database)
{
	LauncherShared *l = &shared->launcher;
	bool		known = false;

	LWLockAcquire(shared->launcher_lock, LW_EXCLUSIVE);
	for (int i = 0; i < l->announced_count; i++)
		known |= l->announced[i] == database;
	if (known)
		;
	else if (l->announced_count < LAUNCHER_MAX_ANNOUNCED)
		l->announced[l->announced_count++] = database;
	else
		l->announcements_lost = true;
	wake_launcher_locked();
	LWLockRelease(shared->launcher_lock);
}

/* Ask the launcher to look at every database again (one was created). */
void
launcher_request_rescan(void)
{
	LWLockAcquire(shared->launcher_lock, LW_EXCLUSIVE);
	shared->launcher.rescan_requested = true;
	wake_launcher_locked();
	LWLockRelease(shared->launcher_lock);
}

/*
 * Is this database, which no slot serves, waiting for one?  Past the
 * databases listed, any may be.
 */
bool
launcher_database_waiting(Oid database)
{
	LauncherShared *l = &shared->launcher;
	bool		waiting;

	LWLockAcquire(shared->launcher_lock, LW_SHARED);
	waiting = l->databases_waiting > l->listed_waiting;
	for (int i = 0; i < l->listed_waiting; i++)
		waiting |= l->waiting[i] == database;
	LWLockRelease(shared->launcher_lock);
	return waiting;
}

/*
 * Hold the launcher off this database: it stops its publisher and starts
 * none until this backend releases it or exits.  Returns false if there
 * is no room for one more hold.
 */
bool
launcher_hold_database(Oid database)
{
	LauncherShared *l = &shared->launcher;
	bool		held = false;

	LWLockAcquire(shared->launcher_lock, LW_EXCLUSIVE);
	for (int i = 0; i < LAUNCHER_MAX_HOLDS && !held; i++)
	{
		if (l->holds[i].pid != 0)
			continue;
		l->holds[i].database = database;
		l->holds[i].pid = MyProcPid;
		held = true;
	}
	wake_launcher_locked();
	LWLockRelease(shared->launcher_lock);
	return held;
}

/* Release this backend's hold on the database. */
void
launcher_release_database(Oid database)
{
	LauncherShared *l = &shared->launcher;

	LWLockAcquire(shared->launcher_lock, LW_EXCLUSIVE);
	for (int i = 0; i < LAUNCHER_MAX_HOLDS; i++)
		if (l->holds[i].pid == MyProcPid && l->holds[i].database == database)
			l->holds[i].pid = 0;
	l->rescan_requested = true;
	wake_launcher_locked();
	LWLockRelease(shared->launcher_lock);
}

static void
launcher_detach(int code, Datum arg)
{
	LWLockAcquire(shared->launcher_lock, LW_EXCLUSIVE);
	shared->launcher.pid = 0;
	shared->launcher.latch = NULL;
	LWLockRelease(shared->launcher_lock);
}

/* Take the launcher's part for this process, until it exits. */
void
launcher_attach(void)
{
	TimestampTz now = GetCurrentTimestamp();

	LWLockAcquire(shared->launcher_lock, LW_EXCLUSIVE);
	shared->launcher.pid = MyProcPid;
	shared->launcher.latch = MyLatch;
	shared->launcher.started_at = now;
	shared->launcher.rescan_requested = true;
	LWLockRelease(shared->launcher_lock);
	on_shmem_exit(launcher_detach, 0);
}

/*
 * Take the databases announced since the last call, into databases
 * (LAUNCHER_MAX_ANNOUNCED of them at most), and returns how many.  *rescan
 * says whether pg_database is to be read again; *lost, whether some
 * announcements found no room, so that any database may have been
 * announced.
 */
int
launcher_take_announced(Oid *databases, bool *rescan, bool *lost)
{
	LauncherShared *l = &shared->launcher;
	int			count;

	LWLockAcquire(shared->launcher_lock, LW_EXCLUSIVE);
	count = l->announced_count;
	memcpy(databases, l->announced, count * sizeof(Oid));
	l->announced_count = 0;
	*rescan = l->rescan_requested;
	*lost = l->announcements_lost;
	l->rescan_requested = false;
	l->announcements_lost = false;
	LWLockRelease(shared->launcher_lock);
	return count;
}

/*
 * The databases that live backends hold the launcher off, into databases
 * (LAUNCHER_MAX_HOLDS of them at most); returns how many.  Holds of
 * backends that exited without releasing them go.
 */
int
launcher_read_holds(Oid *databases)
{
	LauncherShared *l = &shared->launcher;
	int			count = 0;

	LWLockAcquire(shared->launcher_lock, LW_EXCLUSIVE);
	for (int i = 0; i < LAUNCHER_MAX_HOLDS; i++)
	{
		DatabaseHold *hold = &l->holds[i];

		if (hold->pid == 0)
			continue;
		if (BackendPidGetProc(hold->pid) == NULL)
			hold->pid = 0;
		else
			databases[count++] = hold->database;
	}
	LWLockRelease(shared->launcher_lock);
	return count;
}

/* Say which databases wait for a slot (all of them counted, some listed). */
void
launcher_publish_waiting(const Oid *databases, int count)
{
	LauncherShared *l = &shared->launcher;

	LWLockAcquire(shared->launcher_lock, LW_EXCLUSIVE);
	l->databases_waiting = count;
	l->listed_waiting = Min(count, LAUNCHER_MAX_LISTED_WAITING);
	memcpy(l->waiting, databases, l->listed_waiting * sizeof(Oid));
	LWLockRelease(shared->launcher_lock);
}

/*
 * Report an error the launcher lives through: into the server log and
 * into outbox_launcher's last_error.
 */
void
launcher_report_error(const char *fmt,...)
{
	char		message[WORKER_LAST_ERROR_LEN];
	TimestampTz now = GetCurrentTimestamp();
	va_list		args;

	va_start(args, fmt);
	vsnprintf(message, sizeof(message), fmt, args);
	va_end(args);

	ereport(LOG, (errmsg("outbox launcher: %s", message)));

	LWLockAcquire(shared->launcher_lock, LW_EXCLUSIVE);
	memcpy(shared->launcher.last_error, message, sizeof(message));
	shared->launcher.last_error_at = now;
	LWLockRelease(shared->launcher_lock);
}

/* A probe of this database is about to start; it has no result yet. */
void
launcher_begin_probe(Oid database)
{
	LWLockAcquire(shared->launcher_lock, LW_EXCLUSIVE);
	shared->launcher.probe_database = database;
	shared->launcher.probe_result = PROBE_NONE;
	LWLockRelease(shared->launcher_lock);
}

/* What the probe that has ended found. */
ProbeResult
launcher_end_probe(void)
{
	ProbeResult result;

	LWLockAcquire(shared->launcher_lock, LW_EXCLUSIVE);
	result = shared->launcher.probe_result;
	shared->launcher.probe_database = InvalidOid;
	LWLockRelease(shared->launcher_lock);
	return result;
}

/* In a probe: what it found in its database. */
void
probe_report(Oid database, ProbeResult result)
{
	LWLockAcquire(shared->launcher_lock, LW_EXCLUSIVE);
	if (shared->launcher.probe_database == database)
		shared->launcher.probe_result = result;
	LWLockRelease(shared->launcher_lock);
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

	for (int i = 0; i < shared->slot_count; i++)
	{
		slot = &shared->slots[i];
		if (OidIsValid(slot_database(slot)))
			continue;
		if (chosen < 0 || slot->last_database == database)
			chosen = i;
	}
	if (chosen < 0)
		return -1;

	slot = &shared->slots[chosen];
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
	OutboxWorkerSlot *slot = &shared->slots[i];

	SpinLockAcquire(&slot->mutex);
	slot->database = InvalidOid;
	slot->state = WORKER_STOPPED;
	SpinLockRelease(&slot->mutex);
}

/* The pid of the slot's worker, 0 if none is attached. */
int
worker_slot_pid(int i)
{
	OutboxWorkerSlot *slot = &shared->slots[i];
	int			pid;

	SpinLockAcquire(&slot->mutex);
	pid = slot->pid;
	SpinLockRelease(&slot->mutex);
	return pid;
}

/* Why the slot's last worker left. */
WorkerExitReason
worker_slot_exit_reason(int i)
{
	OutboxWorkerSlot *slot = &shared->slots[i];
	WorkerExitReason reason;

	SpinLockAcquire(&slot->mutex);
	reason = slot->exit_reason;
	SpinLockRelease(&slot->mutex);
	return reason;
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

	LWLockAcquire(shared->launcher_lock, LW_SHARED);
	wake_launcher_locked();
	LWLockRelease(shared->launcher_lock);
}

/*
 * Take slot number i for this worker, until it exits.  Returns the database
 * it was handed out for, or InvalidOid if it has been handed out again
 * since this worker was asked for (generation): then the worker has
 * nothing to do.
 */
Oid
worker_slot_attach(int i, uint32 generation)
{
	TimestampTz now = GetCurrentTimestamp();
	Oid			database = InvalidOid;

	if (i < 0 || i >= shared->slot_count)
		elog(FATAL, "outbox: worker slot %d does not exist", i);
	my_slot = &shared->slots[i];

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

void
worker_report_state(OutboxWorkerState state)
{
	SpinLockAcquire(&my_slot->mutex);
	my_slot->state = state;
	SpinLockRelease(&my_slot->mutex);
}

void
worker_report_brokers_reachable(bool reachable)
{
	SpinLockAcquire(&my_slot->mutex);
	my_slot->brokers_reachable = reachable;
	SpinLockRelease(&my_slot->mutex);
}

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

	ereport(elevel, (errmsg("%s: %s", my_slot ? "outbox" : "outbox inbox", message)));
	worker_record_error(message);
}

/*
 * How many errors this process has put into its last_error, and whether one
 * shows there now: worker_error_mark() and worker_clear_error() compare
 * with it.  Only the worker writes its last_error (the launcher clears it
 * before the worker attaches), so its own count says whether the error
 * shown is still one it knows of.
 */
static uint64 errors_recorded = 0;
static bool error_shown = false;

/*
 * Put a message into outbox_worker's last_error (in an inbox worker,
 * inbox_worker's), for an error that the caller has reported to the log
 * itself (with an errcode and a hint, say).
 */
void
worker_record_error(const char *message)
{
	TimestampTz now = GetCurrentTimestamp();

	errors_recorded++;
	error_shown = true;
	if (my_slot == NULL)
	{
		SpinLockAcquire(&my_inbox_slot->mutex);
		strlcpy(my_inbox_slot->inbox.last_error, message, WORKER_LAST_ERROR_LEN);
		my_inbox_slot->inbox.last_error_at = now;
		SpinLockRelease(&my_inbox_slot->mutex);
		return;
	}
	SpinLockAcquire(&my_slot->mutex);
	strlcpy(my_slot->last_error, message, WORKER_LAST_ERROR_LEN);
	my_slot->last_error_at = now;
	SpinLockRelease(&my_slot->mutex);
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
	OutboxWorkerSlot *slot = my_slot ? my_slot : my_inbox_slot;

	if (!error_shown || mark != errors_recorded || slot == NULL)
		return;
	error_shown = false;
	SpinLockAcquire(&slot->mutex);
	if (slot == my_slot)
	{
		slot->last_error[0] = '\0';
		slot->last_error_at = 0;
	}
	else
	{
		slot->inbox.last_error[0] = '\0';
		slot->inbox.last_error_at = 0;
	}
	SpinLockRelease(&slot->mutex);
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

/* Has a fatal error drill been asked for since the last call? */
bool
worker_take_fatal_error_drill(void)
{
	return pg_atomic_exchange_u32(&my_slot->fatal_error_drill, 0) != 0;
}

/*
 * The lowest id committed below this worker's claim floor since it last
 * asked, or PG_INT64_MAX if none.
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

/*
 * The inbox part of the slots.
 */

const char *
inbox_state_name(InboxWorkerState state)
{
	return inbox_state_names[state];
}

/*
 * This database has a subscription now (call it once that is committed):
 * the launcher is to start its inbox worker, if none runs, and the one that
 * runs is to read its subscriptions again.  If no slot is handed out for
 * the database, its publisher sets wanted when it starts.
 */
void
inbox_want_worker(Oid database)
{
	OutboxWorkerSlot *slot = slot_of_database(database);
	Latch	   *latch = NULL;

	if (slot == NULL)
		return;
	SpinLockAcquire(&slot->mutex);
	if (slot->database == database)
	{
		slot->inbox.wanted = true;
		latch = slot->inbox.latch;
	}
	SpinLockRelease(&slot->mutex);
	if (latch)
		SetLatch(latch);
	LWLockAcquire(shared->launcher_lock, LW_SHARED);
	wake_launcher_locked();
	LWLockRelease(shared->launcher_lock);
}

/* Copy the inbox part of this database's slot; false if no slot serves it. */
bool
inbox_read(Oid database, InboxStatus *status)
{
	OutboxWorkerSlot *slot = slot_of_database(database);
	InboxPart  *inbox;
	bool		found;

	memset(status, 0, sizeof(*status));
	if (slot == NULL)
		return false;
	inbox = &slot->inbox;
	SpinLockAcquire(&slot->mutex);
	found = slot->database == database;
	if (found)
	{
		status->pid = inbox->pid;
		status->state = inbox->state;
		status->started_at = inbox->started_at;
		status->last_applied_at = inbox->last_applied_at;
		status->last_error_at = inbox->last_error_at;
		memcpy(status->last_error, inbox->last_error, WORKER_LAST_ERROR_LEN);
	}
	SpinLockRelease(&slot->mutex);
	status->applied = pg_atomic_read_u64(&inbox->applied);
	status->duplicates = pg_atomic_read_u64(&inbox->duplicates);
	status->failed = pg_atomic_read_u64(&inbox->failed);
	status->dead_lettered = pg_atomic_read_u64(&inbox->dead_lettered);
	return found;
}

/* In the launcher: should slot i's database have an inbox worker? */
bool
inbox_worker_wanted(int i)
{
	OutboxWorkerSlot *slot = &shared->slots[i];
	bool		wanted;

	SpinLockAcquire(&slot->mutex);
	wanted = OidIsValid(slot->database) && slot->inbox.wanted;
	SpinLockRelease(&slot->mutex);
	return wanted;
}

/* The pid of slot i's inbox worker, 0 if none is attached. */
int
inbox_worker_pid(int i)
{
	OutboxWorkerSlot *slot = &shared->slots[i];
	int			pid;

	SpinLockAcquire(&slot->mutex);
	pid = slot->inbox.pid;
	SpinLockRelease(&slot->mutex);
	return pid;
}

/* The generation slot i was last handed out with, for its inbox worker. */
uint32
worker_slot_generation(int i)
{
	OutboxWorkerSlot *slot = &shared->slots[i];
	uint32		generation;

	SpinLockAcquire(&slot->mutex);
	generation = slot->generation;
	SpinLockRelease(&slot->mutex);
	return generation;
}

/* The inbox worker leaves its slot, and wakes the launcher to say so. */
static void
inbox_detach(int code, Datum arg)
{
	InboxPart  *inbox = &my_inbox_slot->inbox;

	SpinLockAcquire(&my_inbox_slot->mutex);
	inbox->pid = 0;
	inbox->latch = NULL;
	inbox->state = INBOX_STOPPED;
	SpinLockRelease(&my_inbox_slot->mutex);
	my_inbox_slot = NULL;

	LWLockAcquire(shared->launcher_lock, LW_SHARED);
	wake_launcher_locked();
	LWLockRelease(shared->launcher_lock);
}

/*
 * Take the inbox part of slot i for this inbox worker, until it exits.
 * Returns the slot's database, or InvalidOid if the slot has been handed
 * out again since this worker was asked for, or has an inbox worker.
 */
Oid
inbox_attach(int i, uint32 generation)
{
	TimestampTz now = GetCurrentTimestamp();
	OutboxWorkerSlot *slot;
	Oid			database = InvalidOid;

	if (i < 0 || i >= shared->slot_count)
		elog(FATAL, "outbox: worker slot %d does not exist", i);
	slot = &shared->slots[i];

	SpinLockAcquire(&slot->mutex);
	if (slot->generation == generation && slot->inbox.pid == 0)
	{
		database = slot->database;
		slot->inbox.pid = MyProcPid;
		slot->inbox.latch = MyLatch;
		slot->inbox.state = INBOX_STARTING;
		slot->inbox.started_at = now;
	}
	SpinLockRelease(&slot->mutex);
	if (!OidIsValid(database))
		return InvalidOid;
	my_inbox_slot = slot;
	my_inbox_generation = generation;
	on_shmem_exit(inbox_detach, 0);
	return database;
}

/* Is this inbox worker's slot still handed out as it was when it attached? */
bool
inbox_slot_still_mine(void)
{
	bool		mine;

	SpinLockAcquire(&my_inbox_slot->mutex);
	mine = my_inbox_slot->generation == my_inbox_generation &&
		OidIsValid(my_inbox_slot->database);
	SpinLockRelease(&my_inbox_slot->mutex);
	return mine;
}

/*
 * The inbox worker found no subscription: the launcher is not to start
 * another until one is made.  Call it before looking a last time, so that a
 * subscription committed meanwhile sets wanted again.
 */
void
inbox_forget_wanted(void)
{
	SpinLockAcquire(&my_inbox_slot->mutex);
	my_inbox_slot->inbox.wanted = false;
	SpinLockRelease(&my_inbox_slot->mutex);
}

void
inbox_report_state(InboxWorkerState state)
{
	SpinLockAcquire(&my_inbox_slot->mutex);
	my_inbox_slot->inbox.state = state;
	SpinLockRelease(&my_inbox_slot->mutex);
}

/* Count a committed batch's outcomes. */
void
inbox_count_outcomes(uint64 applied, uint64 duplicates, uint64 failed, uint64 dead_lettered)
{
	InboxPart  *inbox = &my_inbox_slot->inbox;

	pg_atomic_fetch_add_u64(&inbox->applied, applied);
	pg_atomic_fetch_add_u64(&inbox->duplicates, duplicates);
	pg_atomic_fetch_add_u64(&inbox->failed, failed);
	pg_atomic_fetch_add_u64(&inbox->dead_lettered, dead_lettered);
	if (applied > 0)
	{
		TimestampTz now = GetCurrentTimestamp();

		SpinLockAcquire(&my_inbox_slot->mutex);
		my_inbox_slot->inbox.last_applied_at = now;
		SpinLockRelease(&my_inbox_slot->mutex);
	}
}

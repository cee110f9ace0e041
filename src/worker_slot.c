/*-------------------------------------------------------------------------
 *
 * worker_slot.c
 *	  The outbox's shared memory: an array of worker slots, one per
 *	  background worker of the extension, whatever its kind.  This file is
 *	  the only one that touches it: workers attach to their slot and report
 *	  through it, backends wake workers and read slots for the views.
 *
 * Locking rule.  The array is sized and each slot's kind set at server
 * start (worker_slot_reserve() in _PG_init, then outbox_shmem_startup());
 * neither changes while the server runs.  Every other field but the
 * counters is read and written under the slot's spinlock, held only to copy
 * plain values: no palloc, no ereport, no system call (timestamps are taken
 * before it is acquired), and SetLatch() only after it is released.  The
 * counters are atomics, added to by the slot's worker only and read by
 * anyone without the lock.  Only the slot's own worker writes it, except
 * fatal_error_drill, which outbox_simulate_fatal_error() sets, and the two
 * atomic ids of its claim floor, which any backend of its database lowers
 * (compare-and-swap) and only the worker raises.
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
#include "storage/shmem.h"
#include "storage/spin.h"

#include "worker_slot.h"

typedef struct OutboxWorkerSlot
{
	slock_t		mutex;
	OutboxWorkerKind kind;		/* set at server start */
	int			pid;			/* 0 while no worker runs */
	Latch	   *latch;			/* set to wake the worker */
	Oid			database;		/* the database it serves, once connected */
	OutboxWorkerState state;
	bool		brokers_reachable;
	bool		connecting;		/* set while connecting to its database */
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

typedef struct OutboxShared
{
	int			slot_count;
	OutboxWorkerSlot slots[FLEXIBLE_ARRAY_MEMBER];
} OutboxShared;

/* The kinds of the slots reserved in _PG_init, in the postmaster. */
#define MAX_RESERVED_SLOTS 8
static OutboxWorkerKind reserved_kinds[MAX_RESERVED_SLOTS];
static int	reserved_count = 0;

static OutboxShared *shared = NULL;
static OutboxWorkerSlot *my_slot = NULL;	/* this worker's, once attached */

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static const char *const state_names[] = {
	[WORKER_STOPPED] = "stopped",
	[WORKER_STARTING] = "starting",
	[WORKER_WAITING_FOR_DATABASE] = "waiting for database",
	[WORKER_WAITING_FOR_EXTENSION] = "waiting for extension",
	[WORKER_WAITING_FOR_BROKERS] = "waiting for brokers",
	[WORKER_IDLE] = "idle",
	[WORKER_PUBLISHING] = "publishing",
};

static Size
shared_size(void)
{
	return add_size(offsetof(OutboxShared, slots),
					mul_size(sizeof(OutboxWorkerSlot), reserved_count));
}

static void
outbox_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(shared_size()));
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
		shared->slot_count = reserved_count;
		for (int i = 0; i < reserved_count; i++)
		{
			OutboxWorkerSlot *slot = &shared->slots[i];

			SpinLockInit(&slot->mutex);
			slot->kind = reserved_kinds[i];
			pg_atomic_init_u64(&slot->published, 0);
			pg_atomic_init_u64(&slot->retries_scheduled, 0);
			pg_atomic_init_u64(&slot->dead_lettered, 0);
			pg_atomic_init_u32(&slot->fatal_error_drill, 0);
			pg_atomic_init_u64(&slot->committed_below, NO_ID);
			pg_atomic_init_u64(&slot->prepared_below, NO_ID);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/* Ask for the shared memory; in _PG_init. */
void
worker_slots_init(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = outbox_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = outbox_shmem_startup;
}

/*
 * Reserve a slot for a worker of this kind; in _PG_init, before shared
 * memory is sized.  Returns its number, to pass to the worker.
 */
int
worker_slot_reserve(OutboxWorkerKind kind)
{
	if (reserved_count >= MAX_RESERVED_SLOTS)
		elog(ERROR, "outbox: more than %d worker slots reserved", MAX_RESERVED_SLOTS);
	reserved_kinds[reserved_count] = kind;
	return reserved_count++;
}

int
worker_slot_count(void)
{
	return shared->slot_count;
}

/* Copy slot number i; returns false if no worker is reserved it. */
bool
worker_slot_read(int i, WorkerStatus *status)
{
	OutboxWorkerSlot *slot = &shared->slots[i];

	if (slot->kind == WORKER_KIND_NONE)
		return false;

	SpinLockAcquire(&slot->mutex);
	status->kind = slot->kind;
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
	return true;
}

const char *
worker_state_name(OutboxWorkerState state)
{
	return state_names[state];
}

/*
 * The database the publisher in this slot serves; InvalidOid while it is
 * not connected, and for a slot of another kind.
 */
static Oid
publisher_database(OutboxWorkerSlot *slot)
{
	Oid			served;

	if (slot->kind != WORKER_KIND_PUBLISHER)
		return InvalidOid;
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

/*
 * Wake the publisher of this database, and any publisher not yet connected
 * (it may be about to serve it).
 */
void
worker_wake_publisher(Oid database)
{
	for (int i = 0; i < shared->slot_count; i++)
	{
		OutboxWorkerSlot *slot = &shared->slots[i];
		Oid			served = publisher_database(slot);

		if (served == database || (slot->kind == WORKER_KIND_PUBLISHER && !OidIsValid(served)))
			wake(slot);
	}
}

/*
 * Tell the publisher of this database that a transaction committed
 * (prepared false) or prepared (true) rows from the id lowest on: its claim
 * floor comes down to it.  Call it once the transaction is visible to new
 * snapshots, and before the wake.  A publisher not yet connected starts
 * from the left edge anyway.
 */
void
worker_lower_claim_floor(Oid database, int64 lowest, bool prepared)
{
	for (int i = 0; i < shared->slot_count; i++)
	{
		OutboxWorkerSlot *slot = &shared->slots[i];

		if (publisher_database(slot) == database)
			atomic_lower(prepared ? &slot->prepared_below : &slot->committed_below,
						 encode_id(lowest));
	}
}

/* Ask every publisher's producer to fail fatally during its next batch. */
void
worker_request_fatal_error_drill(void)
{
	for (int i = 0; i < shared->slot_count; i++)
	{
		OutboxWorkerSlot *slot = &shared->slots[i];

		if (slot->kind != WORKER_KIND_PUBLISHER)
			continue;
		pg_atomic_write_u32(&slot->fatal_error_drill, 1);
		wake(slot);
	}
}

static void
detach(int code, Datum arg)
{
	SpinLockAcquire(&my_slot->mutex);
	my_slot->pid = 0;
	my_slot->latch = NULL;
	my_slot->database = InvalidOid;
	my_slot->state = WORKER_STOPPED;
	my_slot->brokers_reachable = false;
	SpinLockRelease(&my_slot->mutex);
	my_slot = NULL;
}

/* Take slot number i for this worker, until it exits. */
void
worker_slot_attach(int i)
{
	TimestampTz now = GetCurrentTimestamp();

	if (i < 0 || i >= shared->slot_count)
		elog(FATAL, "outbox: worker slot %d does not exist", i);
	my_slot = &shared->slots[i];

	SpinLockAcquire(&my_slot->mutex);
	my_slot->pid = MyProcPid;
	my_slot->latch = MyLatch;
	my_slot->database = InvalidOid;
	my_slot->state = WORKER_STARTING;
	my_slot->brokers_reachable = false;
	my_slot->started_at = now;
	SpinLockRelease(&my_slot->mutex);
	pg_atomic_write_u64(&my_slot->committed_below, NO_ID);
	pg_atomic_write_u64(&my_slot->prepared_below, NO_ID);
	on_shmem_exit(detach, 0);
}

/*
 * Say that this worker starts connecting to its database.  Returns whether
 * the worker before it in this slot died doing the same: connecting to a
 * database that does not exist ends the process.
 */
bool
worker_begin_connecting(void)
{
	bool		predecessor_failed;

	SpinLockAcquire(&my_slot->mutex);
	predecessor_failed = my_slot->connecting;
	my_slot->connecting = true;
	SpinLockRelease(&my_slot->mutex);
	return predecessor_failed;
}

/* Connected (database valid), or about to exit to connect afresh (invalid). */
void
worker_end_connecting(Oid database)
{
	SpinLockAcquire(&my_slot->mutex);
	my_slot->connecting = false;
	my_slot->database = database;
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
 * outbox_worker's last_error.  Never ERROR: the worker goes on.
 */
void
worker_report_error(int elevel, const char *fmt,...)
{
	char		message[WORKER_LAST_ERROR_LEN];
	TimestampTz now = GetCurrentTimestamp();
	va_list		args;

	Assert(elevel < ERROR);
	va_start(args, fmt);
	vsnprintf(message, sizeof(message), fmt, args);
	va_end(args);

	ereport(elevel, (errmsg("outbox: %s", message)));

	SpinLockAcquire(&my_slot->mutex);
	memcpy(my_slot->last_error, message, sizeof(message));
	my_slot->last_error_at = now;
	SpinLockRelease(&my_slot->mutex);
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

/*-------------------------------------------------------------------------
 *
 * inbox_slot.c
 *	  The inbox part of each publisher's slot (slot_internal.h's
 *	  InboxPart): a database's inbox worker attaches to its slot's part
 *	  and reports through it, backends and the publisher say the database
 *	  wants one, and inbox_worker reads it.  worker_slot.c hands the slots
 *	  out, clearing this part for a new database.
 *
 * Locking rule.  The inbox part is read and written under its slot's
 * spinlock, with the same rule as the rest of the slot (worker_slot.c):
 * held only to copy plain values, no palloc, no ereport, no system call
 * (timestamps are taken before it is acquired), SetLatch() only after it
 * is released.  The database's inbox worker writes it, but for wanted,
 * which backends and the publisher set and the inbox worker clears.  Its
 * counters are atomics, added to by the inbox worker only and read by
 * anyone without the lock.  The launcher is woken through launcher_wake(),
 * after the spinlock is released.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/spin.h"

#include "inbox_slot.h"
#include "slot_internal.h"

static OutboxWorkerSlot *my_inbox_slot = NULL;	/* an inbox worker's, once
												 * attached */
static uint32 my_inbox_generation;

static const char *const inbox_state_names[] = {
	[INBOX_STOPPED] = "stopped",
	[INBOX_STARTING] = "starting",
	[INBOX_WAITING_FOR_BROKERS] = "waiting for brokers",
	[INBOX_IDLE] = "idle",
	[INBOX_APPLYING] = "applying",
};

/* The name of an inbox worker's state, as inbox_worker shows it. */
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
	launcher_wake();
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
	slot_record_errors_in(NULL, "outbox", NULL, NULL);

	launcher_wake();
}

/*
 * Take the inbox part of the slot this inbox worker was started for (see
 * slot_asked_for()), until it exits.  Returns the slot's database, or
 * InvalidOid if the slot has been handed out again since this worker was
 * asked for, or has an inbox worker.
 */
Oid
inbox_attach(Datum main_arg)
{
	TimestampTz now = GetCurrentTimestamp();
	uint32		generation;
	OutboxWorkerSlot *slot = slot_asked_for(main_arg, &generation);
	Oid			database = InvalidOid;

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
	slot_record_errors_in(slot, "outbox inbox", slot->inbox.last_error,
						  &slot->inbox.last_error_at);
	on_shmem_exit(inbox_detach, 0);
	return database;
}

/* Is this inbox worker's slot still handed out as it was when it attached? */
bool
inbox_slot_still_mine(void)
{
	SlotOccupancy occupancy = slot_occupancy(my_inbox_slot);

	return occupancy.generation == my_inbox_generation &&
		OidIsValid(occupancy.database);
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

/* Say what this inbox worker is doing, for inbox_worker. */
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

/*-------------------------------------------------------------------------
 *
 * slot_internal.h
 *	  The outbox's shared memory as its owners see it: the publishers'
 *	  slots (worker_slot.c), the launcher's part (launcher_slot.c), each
 *	  slot's inbox part (inbox_slot.c) and the backends' commit reports
 *	  (commit_report.c), all in one piece that shared_memory.c allocates.
 *	  Private to those five files; every other file goes through
 *	  worker_slot.h, launcher_slot.h, inbox_slot.h or commit_report.h.
 *	  The locking rule is in each owner's header comment.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_SLOT_INTERNAL_H
#define OUTBOX_SLOT_INTERNAL_H

#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/spin.h"

#include "slot_state.h"

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

/* One publisher's slot, with its database's inbox part. */
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
	pg_atomic_uint32 pause_drill;	/* see outbox_simulate_pause() */
	pg_atomic_uint64 committed_below;	/* lowest id of a commit report
										 * handed over since the worker last
										 * looked, or NO_ID (commit_report.c) */
	pg_atomic_uint64 prepared_below;	/* lowest id of a prepared transaction,
										 * or NO_ID */
	pg_atomic_uint64 commits_woken;	/* transactions that committed messages
									 * and woke the worker, ever */
	pg_atomic_uint64 delayed_due;	/* earliest time a delayed message
									 * committed since the worker last looked
									 * is due, encoded as an id, or NO_ID */
	InboxPart	inbox;
} OutboxWorkerSlot;

/* A backend's hold on a database (launcher_hold_database()). */
typedef struct DatabaseHold
{
	Oid			database;
	int			pid;			/* the backend that holds it */
} DatabaseHold;

/* The launcher's part, under launcher_lock. */
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

/*
 * The claim floor's atomics hold ids in an order-keeping unsigned form;
 * NO_ID is above all.  (The id PG_INT64_MAX cannot be told from none: no
 * sequence reaches it.)
 */
#define NO_ID PG_UINT64_MAX

/*
 * A backend's report of the rows its transaction is committing
 * (commit_report.c), at its number (MyProcNumber), under its spinlock.
 */
typedef struct CommitReport
{
	slock_t		mutex;
	Oid			database;		/* InvalidOid: none, or taken */
	TransactionId xid;
	int64		lowest;			/* the lowest id the transaction wrote */
} CommitReport;

/*
 * All of it, one piece of shared memory: the slots, then a commit report
 * for each of MaxBackends.
 */
typedef struct OutboxShared
{
	LWLock	   *launcher_lock;
	LauncherShared launcher;
	CommitReport *commit_reports;
	int			commit_report_count;
	int			slot_count;
	OutboxWorkerSlot slots[FLEXIBLE_ARRAY_MEMBER];
} OutboxShared;

/* shared_memory.c */
extern OutboxShared *outbox_shared;

/* worker_slot.c */
extern OutboxWorkerSlot *slot_asked_for(Datum main_arg, uint32 *generation);
extern OutboxWorkerSlot *slot_of_database(Oid database);
extern SlotOccupancy slot_occupancy(OutboxWorkerSlot *slot);
extern void slot_record_errors_in(OutboxWorkerSlot *slot, const char *prefix,
								  char *last_error, TimestampTz *last_error_at);

/* launcher_slot.c */
extern void launcher_wake(void);

#endif							/* OUTBOX_SLOT_INTERNAL_H */

/*-------------------------------------------------------------------------
 *
 * worker_slot.h
 *	  The outbox's shared memory: the launcher's part, and one slot per
 *	  publishing worker with what it tells about itself and the latch that
 *	  wakes it.  worker_slot.c owns it; its header comment states the
 *	  locking rule.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_WORKER_SLOT_H
#define OUTBOX_WORKER_SLOT_H

#include "utils/timestamp.h"

/* What a publisher is doing, as outbox_worker shows it. */
typedef enum OutboxWorkerState
{
	WORKER_STOPPED = 0,
	WORKER_STARTING,
	WORKER_WAITING_FOR_BROKERS,
	WORKER_WAITING_FOR_STANDBY, /* outbox.synchronized_standby_slots */
	WORKER_IDLE,
	WORKER_PUBLISHING
} OutboxWorkerState;

/*
 * Why a publisher left, as it tells its launcher; WORKER_EXIT_UNSAID if it
 * died or failed before it could say.
 */
typedef enum WorkerExitReason
{
	WORKER_EXIT_UNSAID = 0,
	WORKER_EXIT_NO_EXTENSION	/* the extension is not (or no longer) there */
} WorkerExitReason;

/* What the extension's presence in a database is, as a probe found it. */
typedef enum ProbeResult
{
	PROBE_NONE = 0,				/* no probe ran, or it could not connect */
	PROBE_NO_EXTENSION,
	PROBE_HAS_EXTENSION
} ProbeResult;

#define WORKER_LAST_ERROR_LEN 256

/* A copy of one publisher's slot, as the views read it. */
typedef struct WorkerStatus
{
	Oid			database;		/* InvalidOid: the slot is free */
	int			pid;			/* 0 while no worker runs */
	OutboxWorkerState state;
	bool		brokers_reachable;
	TimestampTz started_at;
	TimestampTz last_publish_at;
	TimestampTz last_error_at;
	char		last_error[WORKER_LAST_ERROR_LEN];
	uint64		published;		/* messages Kafka acknowledged */
	uint64		retries_scheduled;	/* failed attempts that wait for a retry */
	uint64		dead_lettered;
} WorkerStatus;

/* What a database's inbox worker is doing, as inbox_worker shows it. */
typedef enum InboxWorkerState
{
	INBOX_STOPPED = 0,
	INBOX_STARTING,
	INBOX_WAITING_FOR_BROKERS,
	INBOX_IDLE,
	INBOX_APPLYING
} InboxWorkerState;

/* A copy of the inbox part of one database's slot. */
typedef struct InboxStatus
{
	int			pid;			/* 0 while no inbox worker runs */
	InboxWorkerState state;
	TimestampTz started_at;
	TimestampTz last_applied_at;
	TimestampTz last_error_at;
	char		last_error[WORKER_LAST_ERROR_LEN];
	uint64		applied;		/* messages whose handler committed */
	uint64		duplicates;		/* messages received again, not applied */
	uint64		failed;			/* handler calls that failed */
	uint64		dead_lettered;
} InboxStatus;

/* The most databases announced to the launcher between two of its passes. */
#define LAUNCHER_MAX_ANNOUNCED 32

/* The most databases backends hold the launcher off at once (drop, rename...). */
#define LAUNCHER_MAX_HOLDS 16

/* The most databases the launcher lists as waiting for a slot. */
#define LAUNCHER_MAX_LISTED_WAITING 64

/* A copy of the launcher's part, as outbox_launcher reads it. */
typedef struct LauncherStatus
{
	int			pid;			/* 0 while the launcher does not run */
	TimestampTz started_at;
	int			databases_waiting;	/* all of them, listed or not */
	int			listed_waiting;
	Oid			waiting[LAUNCHER_MAX_LISTED_WAITING];
	TimestampTz last_error_at;
	char		last_error[WORKER_LAST_ERROR_LEN];
} LauncherStatus;

/* In the postmaster, from _PG_init. */
extern void worker_slots_init(void);

/* In any backend. */
extern int	worker_slot_count(void);
extern bool worker_slot_read(int slot, WorkerStatus *status);
extern const char *worker_state_name(OutboxWorkerState state);
extern bool worker_wake_publisher(Oid database);
extern bool worker_database_served(Oid database);
extern void worker_lower_claim_floor(Oid database, int64 lowest, bool prepared);
extern void worker_note_delayed_message(Oid database, TimestampTz due);
extern void worker_request_fatal_error_drill(void);
extern void inbox_want_worker(Oid database);
extern bool inbox_read(Oid database, InboxStatus *status);
extern const char *inbox_state_name(InboxWorkerState state);
extern void launcher_read(LauncherStatus *status);
extern void launcher_announce_database(Oid database);
extern void launcher_request_rescan(void);
extern bool launcher_database_waiting(Oid database);
extern bool launcher_hold_database(Oid database);
extern void launcher_release_database(Oid database);

/* In the launcher, about itself and the slots it hands out. */
extern void launcher_attach(void);
extern int	launcher_take_announced(Oid *databases, bool *rescan, bool *lost);
extern int	launcher_read_holds(Oid *databases);
extern void launcher_publish_waiting(const Oid *databases, int count);
extern void launcher_report_error(const char *fmt,...) pg_attribute_printf(1, 2);
extern void launcher_begin_probe(Oid database);
extern ProbeResult launcher_end_probe(void);
extern int	worker_slot_assign(Oid database, uint32 *generation);
extern void worker_slot_release(int slot);
extern int	worker_slot_pid(int slot);
extern WorkerExitReason worker_slot_exit_reason(int slot);
extern bool inbox_worker_wanted(int slot);
extern int	inbox_worker_pid(int slot);
extern uint32 worker_slot_generation(int slot);

/* In a probe. */
extern void probe_report(Oid database, ProbeResult result);

/*
 * In a publisher, about itself, once attached to its slot; the report of
 * errors also in an inbox worker, about itself.
 */
extern Oid	worker_slot_attach(int slot, uint32 generation);
extern void worker_report_exit(WorkerExitReason reason);
extern void worker_report_state(OutboxWorkerState state);
extern void worker_report_brokers_reachable(bool reachable);
extern bool worker_brokers_known_reachable(void);
extern void worker_report_error(int elevel, const char *fmt,...) pg_attribute_printf(2, 3);
extern void worker_record_error(const char *message);
extern uint64 worker_error_mark(void);
extern void worker_clear_error(uint64 mark);
extern void worker_count_outcomes(uint64 published, uint64 retries_scheduled,
								  uint64 dead_lettered);
extern bool worker_take_fatal_error_drill(void);
extern int64 worker_take_claim_floor_request(void);
extern TimestampTz worker_take_delayed_due(void);
extern void worker_hold_claim_floor(int64 lowest);
extern bool worker_claim_floor_held(int64 *lowest);
extern bool worker_release_claim_floor(int64 lowest);

/* In an inbox worker, about itself, once attached to its database's slot. */
extern Oid	inbox_attach(int slot, uint32 generation);
extern bool inbox_slot_still_mine(void);
extern void inbox_forget_wanted(void);
extern void inbox_report_state(InboxWorkerState state);
extern void inbox_count_outcomes(uint64 applied, uint64 duplicates, uint64 failed,
								 uint64 dead_lettered);

#endif							/* OUTBOX_WORKER_SLOT_H */

/*-------------------------------------------------------------------------
 *
 * worker_slot.h
 *	  The publishers' slots in shared memory: one per publishing worker,
 *	  with what it tells about itself and the latch that wakes it.
 *	  worker_slot.c owns them; its header comment states the locking rule.
 *	  The launcher's part is launcher_slot.h's, a slot's inbox part
 *	  inbox_slot.h's.
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

/*
 * Who is in a slot, copied at once under its spinlock: what the launcher
 * and the slot's publisher read of it (worker_slot_occupancy()).
 */
typedef struct SlotOccupancy
{
	Oid			database;		/* InvalidOid: the slot is free */
	uint32		generation;		/* bumped each time it is handed out */
	int			publisher_pid;	/* 0 while no publisher is attached */
	WorkerExitReason exit_reason;	/* why its last publisher left */
	bool		inbox_wanted;	/* its database may have subscriptions
								 * (never for a free slot) */
	int			inbox_pid;		/* 0 while no inbox worker is attached */
} SlotOccupancy;

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

/* In the launcher, about the slots it hands out. */
extern int	worker_slot_assign(Oid database, uint32 *generation);
extern void worker_slot_release(int slot);

/* In the launcher, and in a publisher about its own slot. */
extern SlotOccupancy worker_slot_occupancy(int slot);

/*
 * In a publisher, about itself, once attached to its slot; the report of
 * errors also in an inbox worker, about itself.
 */
extern Oid	worker_slot_attach(Datum main_arg);
extern void worker_report_exit(WorkerExitReason reason);
extern void worker_report_state(OutboxWorkerState state);
extern void worker_report_brokers_reachable(bool reachable);
extern bool worker_brokers_known_reachable(void);
extern void worker_report_error(int elevel, const char *fmt,...) pg_attribute_printf(2, 3);
extern void worker_record_error(const char *message);
extern void worker_count_outcomes(uint64 published, uint64 retries_scheduled,
								  uint64 dead_lettered);
extern bool worker_take_fatal_error_drill(void);
extern int64 worker_take_claim_floor_request(void);
extern TimestampTz worker_take_delayed_due(void);
extern void worker_hold_claim_floor(int64 lowest);
extern bool worker_claim_floor_held(int64 *lowest);
extern bool worker_release_claim_floor(int64 lowest);

#endif							/* OUTBOX_WORKER_SLOT_H */

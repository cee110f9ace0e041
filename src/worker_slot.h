/*-------------------------------------------------------------------------
 *
 * worker_slot.h
 *	  The outbox's shared memory: one slot per background worker, whatever
 *	  its kind, with what it tells about itself and the latch that wakes it.
 *	  worker_slot.c owns it; its header comment states the locking rule.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_WORKER_SLOT_H
#define OUTBOX_WORKER_SLOT_H

#include "utils/timestamp.h"

/*
 * The kinds of background worker.  A new kind is a file with its main
 * function, a value here and a row in outbox.c's worker_kinds[].
 */
typedef enum OutboxWorkerKind
{
	WORKER_KIND_NONE = 0,		/* a slot no worker is reserved */
	WORKER_KIND_PUBLISHER		/* publishes one database's outbox to Kafka */
} OutboxWorkerKind;

/* What a worker is doing, as outbox_worker shows it. */
typedef enum OutboxWorkerState
{
	WORKER_STOPPED = 0,
	WORKER_STARTING,
	WORKER_WAITING_FOR_DATABASE,
	WORKER_WAITING_FOR_EXTENSION,
	WORKER_WAITING_FOR_BROKERS,
	WORKER_IDLE,
	WORKER_PUBLISHING
} OutboxWorkerState;

#define WORKER_LAST_ERROR_LEN 256

/* A copy of one slot, as the views read it. */
typedef struct WorkerStatus
{
	OutboxWorkerKind kind;
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

/* In the postmaster, from _PG_init. */
extern void worker_slots_init(void);
extern int	worker_slot_reserve(OutboxWorkerKind kind);

/* In any backend. */
extern int	worker_slot_count(void);
extern bool worker_slot_read(int slot, WorkerStatus *status);
extern const char *worker_state_name(OutboxWorkerState state);
extern void worker_wake_publisher(Oid database);
extern void worker_lower_claim_floor(Oid database, int64 lowest, bool prepared);
extern void worker_request_fatal_error_drill(void);

/* In a worker, about itself, once attached to its slot. */
extern void worker_slot_attach(int slot);
extern bool worker_begin_connecting(void);
extern void worker_end_connecting(Oid database);
extern void worker_report_state(OutboxWorkerState state);
extern void worker_report_brokers_reachable(bool reachable);
extern bool worker_brokers_known_reachable(void);
extern void worker_report_error(int elevel, const char *fmt,...) pg_attribute_printf(2, 3);
extern void worker_count_outcomes(uint64 published, uint64 retries_scheduled,
								  uint64 dead_lettered);
extern bool worker_take_fatal_error_drill(void);
extern int64 worker_take_claim_floor_request(void);
extern void worker_hold_claim_floor(int64 lowest);
extern bool worker_claim_floor_held(int64 *lowest);
extern bool worker_release_claim_floor(int64 lowest);

#endif							/* OUTBOX_WORKER_SLOT_H */

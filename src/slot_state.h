/*-------------------------------------------------------------------------
 *
 * slot_state.h
 *	  What the outbox's shared memory holds, as its readers copy it: the
 *	  states of the publishers and the inbox workers, why a publisher left,
 *	  what a probe found, the copies the views read, and the limits of the
 *	  launcher's lists.  Plain values, with no function: worker_slot.h,
 *	  inbox_slot.h and launcher_slot.h say who reads and writes them.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_SLOT_STATE_H
#define OUTBOX_SLOT_STATE_H

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
	WORKER_EXIT_NO_EXTENSION,	/* the extension is not (or no longer) there */
	WORKER_EXIT_ERROR			/* an error ended it (disk full, say) */
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

/* What the extension's presence in a database is, as a probe found it. */
typedef enum ProbeResult
{
	PROBE_NONE = 0,				/* no probe ran, or it could not connect */
	PROBE_NO_EXTENSION,
	PROBE_HAS_EXTENSION
} ProbeResult;

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

#endif							/* OUTBOX_SLOT_STATE_H */

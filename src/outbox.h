/*-------------------------------------------------------------------------
 *
 * outbox.h
 *	  Settings and shared memory of the outbox extension, shared by the
 *	  enqueue side (any backend) and the publishing worker.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_H
#define OUTBOX_H

#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/spin.h"
#include "utils/timestamp.h"

/* Settings (GUCs), defined in outbox.c. */
extern char *outbox_brokers;
extern char *outbox_database;
extern char *outbox_kafka_properties;
extern int	outbox_batch_size;
extern int	outbox_retry_backoff_base;
extern int	outbox_retry_backoff_max;
extern int	outbox_max_attempts;
extern int	outbox_poll_interval;
extern int	outbox_max_payload_size;
extern int	outbox_sent_retention;

#define OUTBOX_LAST_ERROR_LEN 256

/* What the worker is doing, as outbox_worker shows it. */
typedef enum OutboxWorkerState
{
	OUTBOX_WORKER_STOPPED = 0,
	OUTBOX_WORKER_STARTING,
	OUTBOX_WORKER_WAITING_FOR_DATABASE,
	OUTBOX_WORKER_WAITING_FOR_EXTENSION,
	OUTBOX_WORKER_WAITING_FOR_BROKERS,
	OUTBOX_WORKER_IDLE,
	OUTBOX_WORKER_PUBLISHING
} OutboxWorkerState;

/*
 * One worker's slot in shared memory.  The counters are atomics so that the
 * worker never takes a lock to count; the rest is written under the mutex.
 */
typedef struct OutboxWorkerSlot
{
	slock_t		mutex;
	int			pid;			/* 0 while no worker runs */
	Latch	   *latch;			/* set at commit to wake the worker */
	OutboxWorkerState state;
	bool		brokers_reachable;
	bool		connecting;		/* set while connecting to outbox.database */
	TimestampTz started_at;
	TimestampTz last_publish_at;
	TimestampTz last_error_at;
	char		last_error[OUTBOX_LAST_ERROR_LEN];
	pg_atomic_uint64 published;
	pg_atomic_uint64 failed;
	pg_atomic_uint64 dead_lettered;
	pg_atomic_uint32 simulate_fatal_error;	/* set by outbox_simulate_fatal_error() */
} OutboxWorkerSlot;

typedef struct OutboxShared
{
	OutboxWorkerSlot worker;
} OutboxShared;

extern OutboxShared *outbox_shared;

/* outbox.c */
extern uint64 outbox_key_hash(const char *topic, size_t topic_len,
							  const char *key, size_t key_len);

/* enqueue.c */
extern void outbox_register_commit_wake(void);

/* worker.c */
extern PGDLLEXPORT void outbox_worker_main(Datum main_arg);

/* status.c: helpers the worker uses to report what it does */
extern void outbox_report_state(OutboxWorkerState state);
extern void outbox_report_error(const char *fmt,...) pg_attribute_printf(1, 2);
extern void outbox_report_brokers_reachable(bool reachable);

#endif							/* OUTBOX_H */

/*-------------------------------------------------------------------------
 *
 * worker_slot.h
 *	  The publishers' slots in shared memory: one per publishing worker,
 *	  with what it tells about itself and the latch that wakes it.
 *	  worker_slot.c owns them; its header comment states the locking rule.
 *	  The launcher's part is launcher_slot.h's, a slot's inbox part
 *	  inbox_slot.h's; the values they hold, slot_state.h's.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_WORKER_SLOT_H
#define OUTBOX_WORKER_SLOT_H

#include "slot_state.h"

/*
 * Where outbox_simulate_pause() can hold a publisher (outbox.delivery =
 * exactly_once): with a batch's messages acknowledged, before its Kafka
 * transaction commits; once it committed, before the database records it;
 * once recorded, before the next batch is produced.
 */
typedef enum WorkerPausePoint
{
	PAUSE_NONE = 0,
	PAUSE_BEFORE_KAFKA_COMMIT,
	PAUSE_AFTER_KAFKA_COMMIT,
	PAUSE_AFTER_RECORDED,
	PAUSE_PAUSED				/* a publisher is paused */
} WorkerPausePoint;

/* How long a pause lasts at most, and how often it looks whether it is over. */
#define PAUSE_MAX_MS 60000
#define PAUSE_POLL_MS 10

/* In any backend. */
extern int	worker_slot_count(void);
extern bool worker_slot_read(int slot, WorkerStatus *status);
extern const char *worker_state_name(OutboxWorkerState state);
extern bool worker_wake_publisher(Oid database);
extern uint64 worker_commits_woken(void);
extern bool worker_database_served(Oid database);
extern void worker_lower_claim_floor(Oid database, int64 lowest, bool prepared);
extern void worker_note_delayed_message(Oid database, TimestampTz due);
extern void worker_request_fatal_error_drill(void);
extern void worker_request_pause(WorkerPausePoint point);

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
extern uint64 worker_error_mark(void);
extern void worker_clear_error(uint64 mark);
extern void worker_count_outcomes(uint64 published, uint64 retries_scheduled,
								  uint64 dead_lettered);
extern bool worker_take_fatal_error_drill(void);
extern void worker_pause_if_asked(WorkerPausePoint point, const char *activity);
extern int64 worker_take_claim_floor_request(void);
extern TimestampTz worker_take_delayed_due(void);
extern void worker_hold_claim_floor(int64 lowest);
extern bool worker_claim_floor_held(int64 *lowest);
extern bool worker_release_claim_floor(int64 lowest);

#endif							/* OUTBOX_WORKER_SLOT_H */

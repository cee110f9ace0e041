/*-------------------------------------------------------------------------
 *
 * status.c
 *	  The worker's slot in shared memory: what the worker tells about itself,
 *	  the function behind the outbox_worker view that reads it, and the
 *	  fault drill that asks the worker for a fatal producer error.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_worker_status);
PG_FUNCTION_INFO_V1(outbox_simulate_fatal_error);

static const char *const state_names[] = {
	[OUTBOX_WORKER_STOPPED] = "stopped",
	[OUTBOX_WORKER_STARTING] = "starting",
	[OUTBOX_WORKER_WAITING_FOR_DATABASE] = "waiting for database",
	[OUTBOX_WORKER_WAITING_FOR_EXTENSION] = "waiting for extension",
	[OUTBOX_WORKER_WAITING_FOR_BROKERS] = "waiting for brokers",
	[OUTBOX_WORKER_IDLE] = "idle",
	[OUTBOX_WORKER_PUBLISHING] = "publishing",
};

void
outbox_report_state(OutboxWorkerState state)
{
	OutboxWorkerSlot *slot = &outbox_shared->worker;

	SpinLockAcquire(&slot->mutex);
	slot->state = state;
	SpinLockRelease(&slot->mutex);
}

void
outbox_report_brokers_reachable(bool reachable)
{
	OutboxWorkerSlot *slot = &outbox_shared->worker;

	SpinLockAcquire(&slot->mutex);
	slot->brokers_reachable = reachable;
	SpinLockRelease(&slot->mutex);
}

/*
 * Keep the last error for outbox_worker.  No palloc: librdkafka's error
 * callback calls this too.
 */
void
outbox_report_error(const char *fmt,...)
{
	OutboxWorkerSlot *slot = &outbox_shared->worker;
	char		message[OUTBOX_LAST_ERROR_LEN];
	va_list		args;

	va_start(args, fmt);
	vsnprintf(message, sizeof(message), fmt, args);
	va_end(args);

	SpinLockAcquire(&slot->mutex);
	memcpy(slot->last_error, message, sizeof(message));
	slot->last_error_at = GetCurrentTimestamp();
	SpinLockRelease(&slot->mutex);
}

/* One row per worker: today there is one. */
Datum
outbox_worker_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	OutboxWorkerSlot *slot = &outbox_shared->worker;
	OutboxWorkerSlot copy;
	Datum		values[13];
	bool		nulls[13] = {0};

	InitMaterializedSRF(fcinfo, 0);

	SpinLockAcquire(&slot->mutex);
	memcpy(&copy, slot, offsetof(OutboxWorkerSlot, published));
	SpinLockRelease(&slot->mutex);

	values[0] = Int32GetDatum(1);
	values[1] = CStringGetTextDatum(outbox_database);
	values[2] = Int32GetDatum(copy.pid);
	nulls[2] = copy.pid == 0;
	values[3] = CStringGetTextDatum(state_names[copy.state]);
	values[4] = CStringGetTextDatum(outbox_brokers);
	values[5] = BoolGetDatum(copy.brokers_reachable);
	nulls[5] = copy.pid == 0;
	values[6] = TimestampTzGetDatum(copy.started_at);
	nulls[6] = copy.started_at == 0;
	values[7] = Int64GetDatum((int64) pg_atomic_read_u64(&slot->published));
	values[8] = Int64GetDatum((int64) pg_atomic_read_u64(&slot->failed));
	values[9] = Int64GetDatum((int64) pg_atomic_read_u64(&slot->dead_lettered));
	values[10] = TimestampTzGetDatum(copy.last_publish_at);
	nulls[10] = copy.last_publish_at == 0;
	values[11] = CStringGetTextDatum(copy.last_error);
	nulls[11] = copy.last_error[0] == '\0';
	values[12] = TimestampTzGetDatum(copy.last_error_at);
	nulls[12] = copy.last_error_at == 0;

	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/*
 * Ask the worker to make its producer fail fatally during its next batch,
 * as librdkafka's rd_kafka_test_fatal_error() does, so that an operator (or
 * a test) can see it rebuild the producer and lose nothing.
 */
Datum
outbox_simulate_fatal_error(PG_FUNCTION_ARGS)
{
	OutboxWorkerSlot *slot = &outbox_shared->worker;
	Latch	   *latch;

	pg_atomic_write_u32(&slot->simulate_fatal_error, 1);
	SpinLockAcquire(&slot->mutex);
	latch = slot->latch;
	SpinLockRelease(&slot->mutex);
	if (latch)
		SetLatch(latch);
	PG_RETURN_VOID();
}

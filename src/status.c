/*-------------------------------------------------------------------------
 *
 * status.c
 *	  The SQL functions over the workers' shared state: those behind the
 *	  outbox_worker and outbox_launcher views, and the fault drill that asks
 *	  the publishers for a fatal producer error.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "launcher_slot.h"
#include "settings.h"
#include "worker_slot.h"

PG_FUNCTION_INFO_V1(outbox_worker_status);
PG_FUNCTION_INFO_V1(outbox_launcher_status);
PG_FUNCTION_INFO_V1(outbox_simulate_fatal_error);

/* The columns of outbox_worker_status(), as the install script declares them. */
typedef enum WorkerStatusColumn
{
	COL_WORKER_ID,
	COL_DATABASE,
	COL_PID,
	COL_STATE,
	COL_BROKERS,
	COL_BROKERS_REACHABLE,
	COL_STARTED_AT,
	COL_PUBLISHED,
	COL_FAILED,
	COL_DEAD_LETTERED,
	COL_LAST_PUBLISH_AT,
	COL_LAST_ERROR,
	COL_LAST_ERROR_AT,
	NUM_WORKER_STATUS_COLUMNS
} WorkerStatusColumn;

/* The columns of outbox_launcher_status(). */
typedef enum LauncherStatusColumn
{
	COL_LAUNCHER_PID,
	COL_LAUNCHER_STARTED_AT,
	COL_MAX_WORKERS,
	COL_WORKERS,
	COL_DATABASES_WAITING,
	COL_WAITING,
	COL_LAUNCHER_LAST_ERROR,
	COL_LAUNCHER_LAST_ERROR_AT,
	NUM_LAUNCHER_STATUS_COLUMNS
} LauncherStatusColumn;

/*
 * A database's name as a text Datum, or *isnull: it is named by its oid in
 * shared memory, and may have just been dropped.
 */
static Datum
database_name_datum(Oid database, bool *isnull)
{
	char	   *name = get_database_name(database);

	*isnull = name == NULL;
	return name ? CStringGetTextDatum(name) : (Datum) 0;
}

/* One outbox_worker row from a publisher's slot. */
static void
put_publisher_row(ReturnSetInfo *rsinfo, int worker_id, const WorkerStatus *s)
{
	Datum		values[NUM_WORKER_STATUS_COLUMNS];
	bool		nulls[NUM_WORKER_STATUS_COLUMNS] = {0};

	values[COL_WORKER_ID] = Int32GetDatum(worker_id);
	values[COL_DATABASE] = database_name_datum(s->database, &nulls[COL_DATABASE]);
	values[COL_PID] = Int32GetDatum(s->pid);
	nulls[COL_PID] = s->pid == 0;
	values[COL_STATE] = CStringGetTextDatum(worker_state_name(s->state));
	values[COL_BROKERS] = CStringGetTextDatum(outbox_brokers);
	values[COL_BROKERS_REACHABLE] = BoolGetDatum(s->brokers_reachable);
	nulls[COL_BROKERS_REACHABLE] = s->pid == 0;
	values[COL_STARTED_AT] = TimestampTzGetDatum(s->started_at);
	nulls[COL_STARTED_AT] = s->started_at == 0;
	values[COL_PUBLISHED] = Int64GetDatum((int64) s->published);
	/* "failed" counts the failed attempts that were scheduled for a retry */
	values[COL_FAILED] = Int64GetDatum((int64) s->retries_scheduled);
	values[COL_DEAD_LETTERED] = Int64GetDatum((int64) s->dead_lettered);
	values[COL_LAST_PUBLISH_AT] = TimestampTzGetDatum(s->last_publish_at);
	nulls[COL_LAST_PUBLISH_AT] = s->last_publish_at == 0;
	values[COL_LAST_ERROR] = CStringGetTextDatum(s->last_error);
	nulls[COL_LAST_ERROR] = s->last_error[0] == '\0';
	values[COL_LAST_ERROR_AT] = TimestampTzGetDatum(s->last_error_at);
	nulls[COL_LAST_ERROR_AT] = s->last_error_at == 0;

	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * One row per database a publisher serves (its slot handed out for it),
 * numbered by its slot, from 1.
 */
Datum
outbox_worker_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	InitMaterializedSRF(fcinfo, 0);
	for (int i = 0; i < worker_slot_count(); i++)
	{
		WorkerStatus status;

		if (worker_slot_read(i, &status))
			put_publisher_row(rsinfo, i + 1, &status);
	}
	return (Datum) 0;
}

/* The names of the databases that wait for a slot, as a text[]. */
static Datum
waiting_names(const LauncherStatus *l)
{
	Datum	   *names = palloc(sizeof(Datum) * Max(l->listed_waiting, 1));
	int			count = 0;

	for (int i = 0; i < l->listed_waiting; i++)
	{
		bool		isnull;
		Datum		name = database_name_datum(l->waiting[i], &isnull);

		if (!isnull)
			names[count++] = name;
	}
	return PointerGetDatum(construct_array(names, count, TEXTOID, -1, false, TYPALIGN_INT));
}

/* The launcher's one row: its process, the budget used, who waits. */
Datum
outbox_launcher_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		values[NUM_LAUNCHER_STATUS_COLUMNS];
	bool		nulls[NUM_LAUNCHER_STATUS_COLUMNS] = {0};
	LauncherStatus l;
	int			workers = 0;

	InitMaterializedSRF(fcinfo, 0);
	launcher_read(&l);
	for (int i = 0; i < worker_slot_count(); i++)
	{
		WorkerStatus status;

		workers += worker_slot_read(i, &status);
	}

	values[COL_LAUNCHER_PID] = Int32GetDatum(l.pid);
	nulls[COL_LAUNCHER_PID] = l.pid == 0;
	values[COL_LAUNCHER_STARTED_AT] = TimestampTzGetDatum(l.started_at);
	nulls[COL_LAUNCHER_STARTED_AT] = l.started_at == 0;
	values[COL_MAX_WORKERS] = Int32GetDatum(outbox_max_workers);
	values[COL_WORKERS] = Int32GetDatum(workers);
	values[COL_DATABASES_WAITING] = Int32GetDatum(l.databases_waiting);
	values[COL_WAITING] = waiting_names(&l);
	values[COL_LAUNCHER_LAST_ERROR] = CStringGetTextDatum(l.last_error);
	nulls[COL_LAUNCHER_LAST_ERROR] = l.last_error[0] == '\0';
	values[COL_LAUNCHER_LAST_ERROR_AT] = TimestampTzGetDatum(l.last_error_at);
	nulls[COL_LAUNCHER_LAST_ERROR_AT] = l.last_error_at == 0;

	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/*
 * Ask the publishers to make their producer fail fatally during the next
 * batch, as librdkafka's rd_kafka_test_fatal_error() does, so that an
 * operator (or a test) can see it rebuilt and nothing lost.
 */
Datum
outbox_simulate_fatal_error(PG_FUNCTION_ARGS)
{
	worker_request_fatal_error_drill();
	PG_RETURN_VOID();
}

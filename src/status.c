/*-------------------------------------------------------------------------
 *
 * status.c
 *	  The SQL functions over the workers' shared state: those behind the
 *	  outbox_worker, outbox_launcher and inbox_worker views, and the fault
 *	  drill that asks the publishers for a fatal producer error.  Each
 *	  view's row is built with the same few helpers (StatusRow): a process
 *	  that does not run, a time that never came and an error never had
 *	  show as NULL in every view alike.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

#include "inbox_slot.h"
#include "launcher_slot.h"
#include "pg_compat.h"
#include "settings.h"
#include "worker_slot.h"

PG_FUNCTION_INFO_V1(outbox_worker_status);
PG_FUNCTION_INFO_V1(outbox_launcher_status);
PG_FUNCTION_INFO_V1(outbox_simulate_fatal_error);
PG_FUNCTION_INFO_V1(outbox_simulate_pause);
PG_FUNCTION_INFO_V1(inbox_worker_status);

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

/* The columns of inbox_worker_status(). */
typedef enum InboxWorkerColumn
{
	COL_INBOX_PID,
	COL_INBOX_STATE,
	COL_INBOX_STARTED_AT,
	COL_INBOX_APPLIED,
	COL_INBOX_DUPLICATES,
	COL_INBOX_FAILED,
	COL_INBOX_DEAD_LETTERED,
	COL_INBOX_LAST_APPLIED_AT,
	COL_INBOX_LAST_ERROR,
	COL_INBOX_LAST_ERROR_AT,
	NUM_INBOX_WORKER_COLUMNS
} InboxWorkerColumn;

/* Room for the widest of those rows, outbox_worker_status()'s. */
#define MAX_STATUS_COLUMNS ((int) NUM_WORKER_STATUS_COLUMNS)

StaticAssertDecl((int) NUM_LAUNCHER_STATUS_COLUMNS <= MAX_STATUS_COLUMNS &&
				 (int) NUM_INBOX_WORKER_COLUMNS <= MAX_STATUS_COLUMNS,
				 "a status row has room for every view's columns");

/* One row of a status function, filled column by column. */
typedef struct StatusRow
{
	Datum		values[MAX_STATUS_COLUMNS];
	bool		nulls[MAX_STATUS_COLUMNS];
} StatusRow;

/* A process's pid, NULL while none runs (0). */
static void
put_pid(StatusRow *row, int column, int pid)
{
	row->values[column] = Int32GetDatum(pid);
	row->nulls[column] = pid == 0;
}

/* A time, NULL if it never came (0). */
static void
put_time(StatusRow *row, int column, TimestampTz time)
{
	row->values[column] = TimestampTzGetDatum(time);
	row->nulls[column] = time == 0;
}

/* A count of shared memory's, as a bigint. */
static void
put_count(StatusRow *row, int column, uint64 count)
{
	row->values[column] = Int64GetDatum((int64) count);
	row->nulls[column] = false;
}

/* A text, never NULL. */
static void
put_text(StatusRow *row, int column, const char *text)
{
	row->values[column] = CStringGetTextDatum(text);
	row->nulls[column] = false;
}

/* The last error and when it came, both NULL if there was none. */
static void
put_last_error(StatusRow *row, int error_column, int at_column,
			   const char *last_error, TimestampTz last_error_at)
{
	row->values[error_column] = CStringGetTextDatum(last_error);
	row->nulls[error_column] = last_error[0] == '\0';
	put_time(row, at_column, last_error_at);
}

/* Add the row to the function's result. */
static void
put_row(ReturnSetInfo *rsinfo, StatusRow *row)
{
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row->values, row->nulls);
}

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
	StatusRow	row = {0};

	row.values[COL_WORKER_ID] = Int32GetDatum(worker_id);
	row.values[COL_DATABASE] = database_name_datum(s->database, &row.nulls[COL_DATABASE]);
	put_pid(&row, COL_PID, s->pid);
	put_text(&row, COL_STATE, worker_state_name(s->state));
	put_text(&row, COL_BROKERS, outbox_brokers);
	row.values[COL_BROKERS_REACHABLE] = BoolGetDatum(s->brokers_reachable);
	row.nulls[COL_BROKERS_REACHABLE] = s->pid == 0;
	put_time(&row, COL_STARTED_AT, s->started_at);
	put_count(&row, COL_PUBLISHED, s->published);
	/* "failed" counts the failed attempts that were scheduled for a retry */
	put_count(&row, COL_FAILED, s->retries_scheduled);
	put_count(&row, COL_DEAD_LETTERED, s->dead_lettered);
	put_time(&row, COL_LAST_PUBLISH_AT, s->last_publish_at);
	put_last_error(&row, COL_LAST_ERROR, COL_LAST_ERROR_AT, s->last_error, s->last_error_at);
	put_row(rsinfo, &row);
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
	StatusRow	row = {0};
	LauncherStatus l;
	int			workers = 0;

	InitMaterializedSRF(fcinfo, 0);
	launcher_read(&l);
	for (int i = 0; i < worker_slot_count(); i++)
	{
		WorkerStatus status;

		workers += worker_slot_read(i, &status);
	}

	put_pid(&row, COL_LAUNCHER_PID, l.pid);
	put_time(&row, COL_LAUNCHER_STARTED_AT, l.started_at);
	row.values[COL_MAX_WORKERS] = Int32GetDatum(outbox_max_workers);
	row.values[COL_WORKERS] = Int32GetDatum(workers);
	row.values[COL_DATABASES_WAITING] = Int32GetDatum(l.databases_waiting);
	row.values[COL_WAITING] = waiting_names(&l);
	put_last_error(&row, COL_LAUNCHER_LAST_ERROR, COL_LAUNCHER_LAST_ERROR_AT,
				   l.last_error, l.last_error_at);
	put_row(rsinfo, &row);
	return (Datum) 0;
}

/* One row: this database's inbox worker, or "stopped" if none runs. */
Datum
inbox_worker_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	StatusRow	row = {0};
	InboxStatus s;

	InitMaterializedSRF(fcinfo, 0);
	(void) inbox_read(MyDatabaseId, &s);
	put_pid(&row, COL_INBOX_PID, s.pid);
	put_text(&row, COL_INBOX_STATE, inbox_state_name(s.pid == 0 ? INBOX_STOPPED : s.state));
	/* a worker that left leaves its start behind */
	put_time(&row, COL_INBOX_STARTED_AT, s.pid == 0 ? 0 : s.started_at);
	put_count(&row, COL_INBOX_APPLIED, s.applied);
	put_count(&row, COL_INBOX_DUPLICATES, s.duplicates);
	put_count(&row, COL_INBOX_FAILED, s.failed);
	put_count(&row, COL_INBOX_DEAD_LETTERED, s.dead_lettered);
	put_time(&row, COL_INBOX_LAST_APPLIED_AT, s.last_applied_at);
	put_last_error(&row, COL_INBOX_LAST_ERROR, COL_INBOX_LAST_ERROR_AT,
				   s.last_error, s.last_error_at);
	put_row(rsinfo, &row);
	return (Datum) 0;
}

/*
 * Ask the publishers to pause at a point of their next batch under
 * outbox.delivery = exactly_once, or let a paused one go on ('none'): a
 * fault drill, so that a test (or an operator rehearsing one) can crash a
 * publisher, its Kafka process, the server or a broker at that point.
 */
Datum
outbox_simulate_pause(PG_FUNCTION_ARGS)
{
	static const char *const points[] = {
		[PAUSE_NONE] = "none",
		[PAUSE_BEFORE_KAFKA_COMMIT] = "before_kafka_commit",
		[PAUSE_AFTER_KAFKA_COMMIT] = "after_kafka_commit",
		[PAUSE_AFTER_RECORDED] = "after_recorded",
	};
	char	   *point = text_to_cstring(PG_GETARG_TEXT_PP(0));

	for (int i = 0; i < (int) lengthof(points); i++)
		if (strcmp(point, points[i]) == 0)
		{
			worker_request_pause((WorkerPausePoint) i);
			PG_RETURN_VOID();
		}
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unknown pause point \"%s\"", point),
			 errhint("The points are before_kafka_commit, after_kafka_commit, after_recorded and none.")));
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

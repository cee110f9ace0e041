/*-------------------------------------------------------------------------
 *
 * publisher.c
 *	  The publishing worker: a background worker that publishes the
 *	  committed messages of outbox.database to Kafka.
 *
 * It connects to its database, then loops: a turn of the pipeline
 * (pipeline.c) while a batch is in flight or more waits; otherwise a sleep
 * on its latch, which every transaction that enqueues sets at commit, until
 * then, until the next retry is due, or for outbox.poll_interval.  SIGHUP
 * reloads the settings, SIGTERM ends it once the batch in flight is
 * recorded (to be started again unless the server is shutting down), and it
 * leaves at once if the postmaster dies.  Each pass of the
 * loop allocates in a context that is reset after it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "access/xact.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "pipeline.h"
#include "segment.h"
#include "settings.h"
#include "worker_slot.h"

/* The shortest sleep: a retry due now still waits this long. */
#define MIN_SLEEP_MS 1

/* The only schemas the worker's statements may find names in. */
#define WORKER_SEARCH_PATH "pg_catalog, pg_temp"

/* Exit code that makes the postmaster start the worker again. */
#define EXIT_TO_RESTART 1

extern PGDLLEXPORT void outbox_publisher_main(Datum main_arg);

/* Set when SIGTERM came from the postmaster: the server is shutting down. */
static volatile sig_atomic_t stopped_by_postmaster = false;

/*
 * SIGTERM: stop once the batch in flight is recorded.  Who sent it decides
 * how the worker exits: the postmaster at shutdown, or a backend through
 * pg_terminate_backend(), after which the postmaster must start it again,
 * as it does autovacuum, or the outbox would stop until the next restart.
 */
static void
handle_sigterm(int signo, siginfo_t *info, void *context)
{
	stopped_by_postmaster = info != NULL && info->si_pid == PostmasterPid;
	SignalHandlerForShutdownRequest(signo);
}

static void
install_sigterm_handler(void)
{
	struct sigaction action;

	memset(&action, 0, sizeof(action));
	action.sa_sigaction = handle_sigterm;
	action.sa_flags = SA_SIGINFO | SA_RESTART;
	sigemptyset(&action.sa_mask);
	if (sigaction(SIGTERM, &action, NULL) != 0)
		elog(FATAL, "outbox: could not install the SIGTERM handler: %m");
}

/* Exit as asked: for good at shutdown, to be started again otherwise. */
static void
exit_stopped(void)
{
	proc_exit(stopped_by_postmaster ? 0 : EXIT_TO_RESTART);
}

static void
wait_for_wake(long timeout_ms)
{
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 Max(timeout_ms, MIN_SLEEP_MS), PG_WAIT_EXTENSION);
}

/*
 * Wait, connected to no database, until outbox.database exists, then exit
 * so that the postmaster starts the worker again: a process connects to one
 * database only, once.
 */
static void
wait_for_database(void)
{
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("outbox worker");
	worker_report_state(WORKER_WAITING_FOR_DATABASE);
	pgstat_report_activity(STATE_IDLE, "outbox: waiting for outbox.database to be created");

	for (;;)
	{
		bool		exists;

		StartTransactionCommand();
		exists = OidIsValid(get_database_oid(outbox_database, true));
		CommitTransactionCommand();
		if (exists)
			break;

		wait_for_wake(outbox_poll_interval);
		ResetLatch(MyLatch);
		if (ShutdownRequestPending)
			exit_stopped();
	}

	worker_end_connecting(InvalidOid);
	ereport(LOG,
			(errmsg("outbox: database \"%s\" exists now, restarting the worker to connect to it",
					outbox_database)));
	proc_exit(EXIT_TO_RESTART);
}

/*
 * Connect to outbox.database.  Connecting to a database that does not exist
 * ends the process; so a worker that finds its predecessor died while
 * connecting waits for the database instead of failing every few seconds.
 *
 * The worker runs as the bootstrap superuser, so the names in its
 * statements must resolve in pg_catalog only: with the database's or a
 * role's search_path, an operator or function that another role created in
 * a schema on it (public, say) would run as superuser.  The override holds
 * for the worker's life, against ALTER DATABASE ... SET and reloads alike.
 */
static void
connect_to_database(void)
{
	if (worker_begin_connecting())
		wait_for_database();

	BackgroundWorkerInitializeConnection(outbox_database, NULL, 0);
	SetConfigOption("search_path", WORKER_SEARCH_PATH, PGC_SUSET, PGC_S_OVERRIDE);
	pgstat_report_appname("outbox worker");
	worker_end_connecting(MyDatabaseId);
}

/* When the drained segments are next to be truncated. */
static TimestampTz reclaim_at = 0;

/*
 * Truncate the drained segments, between two turns, when due; lower
 * *wait_ms to the time until it is due again.
 */
static void
reclaim_segments_when_due(long *wait_ms)
{
	MemoryContext loop_context = CurrentMemoryContext;
	TimestampTz now = GetCurrentTimestamp();

	if (now >= reclaim_at)
	{
		long		next_ms = segments_reclaim();

		MemoryContextSwitchTo(loop_context);
		reclaim_at = TimestampTzPlusMilliseconds(now, next_ms);
	}
	*wait_ms = Min(*wait_ms, TimestampDifferenceMilliseconds(now, reclaim_at));
}

/*
 * One pass of the loop: reload the settings if asked, get the producer
 * ready, run a turn of the pipeline, and truncate the drained segments.
 * Returns true to go on at once; else *wait_ms says how long to sleep.
 */
static bool
publish_once(Pipeline *pipeline, long *wait_ms)
{
	long		next_retry_ms;
	TurnResult	result;

	*wait_ms = outbox_poll_interval;
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}

	if (!pipeline_prepare_producer(pipeline, wait_ms))
		return false;

	result = pipeline_turn(pipeline, &next_retry_ms);
	if (result == TURN_NO_EXTENSION)
	{
		worker_report_state(WORKER_WAITING_FOR_EXTENSION);
		return false;
	}
	reclaim_segments_when_due(wait_ms);
	if (result == TURN_GO_ON)
		return true;
	worker_report_state(WORKER_IDLE);
	if (next_retry_ms >= 0)
		*wait_ms = Min(*wait_ms, next_retry_ms);
	return false;
}

void
outbox_publisher_main(Datum main_arg)
{
	Pipeline   *pipeline;
	MemoryContext loop_context;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	install_sigterm_handler();
	BackgroundWorkerUnblockSignals();

	worker_slot_attach(DatumGetInt32(main_arg));
	connect_to_database();

	pipeline = pipeline_create();
	loop_context = AllocSetContextCreate(TopMemoryContext, "outbox publisher loop",
										 ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(loop_context);

	while (!ShutdownRequestPending)
	{
		long		wait_ms;
		bool		go_on = publish_once(pipeline, &wait_ms);

		MemoryContextReset(loop_context);
		if (!go_on)
			wait_for_wake(wait_ms);
	}

	pipeline_finish(pipeline);
	exit_stopped();
}

/*-------------------------------------------------------------------------
 *
 * publisher.c
 *	  The publishing worker: a background worker that publishes the
 *	  committed messages of one database to Kafka.
 *
 * The launcher (launcher.c) starts it, in a slot handed out for its
 * database.  It connects to that database, then loops: a turn of the pipeline
 * (pipeline.c) while a batch is in flight or more waits; otherwise a sleep
 * on its latch, which every transaction that enqueues sets at commit, until
 * then, until the next retry is due, or for outbox.poll_interval.  SIGHUP
 * reloads the settings, SIGTERM ends it once the batch in flight is
 * recorded (the launcher starts another unless it asked it to stop), it
 * exits when the extension is gone, and it leaves at once if the
 * postmaster dies.  Each pass of the loop allocates in a context that is
 * reset after it.
 *
 * It also tells the launcher that its database wants an inbox worker when
 * it finds inbox subscriptions that no one told of: as it starts (after a
 * server restart), and at its first pass INBOX_LOOK_INTERVAL_MS after the
 * last look while no inbox worker is wanted (subscriptions restored by
 * pg_restore or psql, whose COPY calls no inbox_subscribe(), once the
 * restore's CREATE EXTENSION has started this worker).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "access/xact.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "inbox_slot.h"
#include "inbox_store.h"
#include "launcher.h"
#include "metrics.h"
#include "pipeline.h"
#include "segment.h"
#include "settings.h"
#include "store.h"
#include "worker_session.h"
#include "worker_slot.h"

/* The shortest sleep: a retry due now still waits this long. */
#define MIN_SLEEP_MS 1

/* How often the database is looked at for inbox subscriptions no one told of. */
#define INBOX_LOOK_INTERVAL_MS 5000

/* The only schemas the worker's statements may find names in. */
#define WORKER_SEARCH_PATH "pg_catalog, pg_temp"

/* This worker's slot and database. */
static int	my_slot = -1;
static Oid	my_database = InvalidOid;

/*
 * How the worker's statements are planned (store.c's PLAN_ONCE): each by
 * the index it is written for, whatever the outbox's statistics say; a list
 * of ids joined by probes of the primary key, not by a scan of every
 * segment into a hash table; and no JIT, which a disabled plan node's cost
 * would otherwise set off for batches of at most outbox.batch_size rows.
 * test/t/114_worker_plans.pl reads the plans.
 */
static const struct
{
	const char *name;
	const char *value;
}			worker_planning[] = {
	{"plan_cache_mode", "auto"},	/* so that each statement's own choice holds */
	{"enable_seqscan", "off"},
	{"enable_bitmapscan", "off"},
	{"enable_sort", "off"},
	{"enable_hashjoin", "off"},
	{"enable_mergejoin", "off"},
	{"enable_material", "off"},
	{"jit", "off"},
};

/* The reclaimer's bgw_type, and the longest pause between two. */
#define RECLAIMER_TYPE "outbox reclaimer"
#define RECLAIMER_RETRY_MAX_MS 10000

extern PGDLLEXPORT void outbox_publisher_main(Datum main_arg);
extern PGDLLEXPORT void outbox_reclaimer_main(Datum main_arg);

static void
wait_for_wake(long timeout_ms)
{
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 Max(timeout_ms, MIN_SLEEP_MS), PG_WAIT_EXTENSION);
}

/*
 * The rate at which transactions commit messages, measured over windows of
 * COMMIT_RATE_WINDOW_MS: above COALESCE_ABOVE_COMMITS_PER_S, a turn per
 * Kafka round trip costs the machine more than the latency it saves
 * (coalesce_wakes()); below it, a turn waiting for Kafka claims what commits
 * meanwhile (pipeline.c's late claims).
 */
#define COMMIT_RATE_WINDOW_MS 100
#define COALESCE_ABOVE_COMMITS_PER_S 2000

static TimestampTz commit_rate_window_began = 0;
static uint64 commits_at_window_began = 0;
static double commits_per_s = 0;

static void
measure_commit_rate(TimestampTz now)
{
	long		elapsed_ms = TimestampDifferenceMilliseconds(commit_rate_window_began, now);
	uint64		commits = worker_commits_woken();

	if (elapsed_ms < COMMIT_RATE_WINDOW_MS)
		return;
	commits_per_s = (commits - commits_at_window_began) * 1000.0 / elapsed_ms;
	commit_rate_window_began = now;
	commits_at_window_began = commits;
}

/* Do commits come too fast for a turn per Kafka round trip? */
static bool
under_load(void)
{
	return commits_per_s >= COALESCE_ABOVE_COMMITS_PER_S;
}

/*
 * Coalesce wakes: if commits woke the worker while its last turn ran and
 * they come faster than COALESCE_ABOVE_COMMITS_PER_S, let more gather for
 * outbox.max_wake_delay before the next turn.  Each turn costs the same
 * whatever it carries, in the worker, its Kafka process and the broker
 * (a produce request); under such a load fewer, larger turns leave the
 * application its CPU.  Below that rate a commit is published at once.
 * The same after a turn that left a partial batch in flight: else, once a
 * backlog (a full batch) has set the pipeline claiming while Kafka has the
 * batch before, each turn would carry what commits in one round trip, for as
 * long as commits come (under B1's load with a delay of 80 ms: 480 turns a
 * second instead of about 12, four times the CPU in the worker, its Kafka
 * process and the broker).  A SIGTERM ends the wait only at its end.
 */
static void
coalesce_wakes(Pipeline *pipeline)
{
	measure_commit_rate(GetCurrentTimestamp());
	if (outbox_max_wake_delay <= 0 || !MyLatch->is_set || !under_load())
		return;
	pipeline_gather(pipeline, outbox_max_wake_delay);
}

/*
 * Connect to the database the launcher handed this worker's slot out for.
 * If it has gone, connecting ends the process, and the launcher finds out.
 *
 * The worker runs as the bootstrap superuser, so the names in its
 * statements must resolve in pg_catalog only: with the database's or a
 * role's search_path, an operator or function that another role created in
 * a schema on it (public, say) would run as superuser.  The override holds
 * for the worker's life, against ALTER DATABASE ... SET and reloads alike;
 * so do the settings its plans are made with, and those that say who it is
 * and how its transactions run (worker_session.c).
 */
static void
connect_to_database(Oid database, const char *appname)
{
	BackgroundWorkerInitializeConnectionByOid(database, InvalidOid, 0);
	worker_pin_session_settings();
	SetConfigOption("search_path", WORKER_SEARCH_PATH, PGC_SUSET, PGC_S_OVERRIDE);
	for (int i = 0; i < (int) lengthof(worker_planning); i++)
		SetConfigOption(worker_planning[i].name, worker_planning[i].value,
						PGC_SUSET, PGC_S_OVERRIDE);
	pgstat_report_appname(appname);
}

/*
 * When the drained segments are next looked at; when the rows the claims
 * passed are next looked for (store.c, "The claim floor").
 */
static TimestampTz reclaim_at = 0;
static TimestampTz passed_rows_look_at = 0;

/*
 * The reclaimer last started, until it is seen gone; and how long to wait
 * before the next, which doubles, up to RECLAIMER_RETRY_MAX_MS, each time
 * one leaves a segment that may not go yet (not drained; under
 * outbox.sent_retention, sent too recently), so that such a segment costs
 * a process every few seconds, not every second.
 */
static BackgroundWorkerHandle *reclaimer = NULL;
static long reclaimer_retry_ms = RECLAIM_RETRY_MS;
static bool warned_no_reclaimer = false;

/*
 * The rows the claims passed are looked for (or, from_left_edge, the next
 * claim will): next in outbox.poll_interval, when the time until the next
 * retry is asked again too (store_rescan()).
 */
static void
passed_rows_looked_for(TimestampTz now, bool from_left_edge)
{
	store_rescan(from_left_edge);
	passed_rows_look_at = TimestampTzPlusMilliseconds(now, outbox_poll_interval);
}

/*
 * Have the drained segments truncated and, with look_due, the rows the
 * claims passed looked for: by a reclaimer, a process of its own
 * (outbox_reclaimer_main()), which does both, or by this worker if no
 * background worker slot is free.  A drained segment's first look reads
 * every page it holds, its truncation gives back its files, and the look
 * for passed rows walks the index entries of the rows deleted since VACUUM
 * last ran: each in proportion to what the outbox held, tens of
 * milliseconds after a burst of a few hundred thousand rows, in which this
 * worker would publish nothing.  Segments that hold no block hold no row to
 * look for.  Returns how long until the segments are to be looked at again.
 */
static long
reclaim_segments(TimestampTz now, bool look_due)
{
	bool		one_ran = reclaimer != NULL;
	long		turn_ends_ms;
	bool		any_holds;
	bool		to_reclaim;

	if (reclaimer != NULL && !worker_gone(reclaimer))
	{
		/* it may have looked before the look was due: another, once it is gone */
		if (look_due)
			passed_rows_look_at = TimestampTzPlusMilliseconds(now, RECLAIM_RETRY_MS);
		return RECLAIM_RETRY_MS;
	}
	if (reclaimer != NULL)
		pfree(reclaimer);
	reclaimer = NULL;
	to_reclaim = segments_to_reclaim(&turn_ends_ms, &any_holds);
	if (!to_reclaim)
		reclaimer_retry_ms = RECLAIM_RETRY_MS;
	else if (one_ran)
		reclaimer_retry_ms = Min(reclaimer_retry_ms * 2, RECLAIMER_RETRY_MAX_MS);
	if (look_due && !any_holds)
	{
		passed_rows_looked_for(now, false);
		look_due = false;
	}
	if (!to_reclaim && !look_due)
		return turn_ends_ms;

	reclaimer = start_worker("outbox_reclaimer_main", RECLAIMER_TYPE, psprintf("of database %u", my_database),
							 ObjectIdGetDatum(my_database), 0);
	if (reclaimer != NULL)
	{
		passed_rows_looked_for(now, false); /* every reclaimer looks */
		return to_reclaim ? reclaimer_retry_ms : turn_ends_ms;
	}
	if (!warned_no_reclaimer)
		ereport(LOG,
				(errmsg("outbox worker: no background worker slot is free for a reclaimer: this worker truncates its drained segments, and looks for the messages its claims passed, itself, and publishes nothing meanwhile"),
				 errhint("Raise max_worker_processes.")));
	warned_no_reclaimer = true;
	if (look_due)
		passed_rows_looked_for(now, true);
	return to_reclaim ? segments_reclaim(false) : turn_ends_ms;
}

/*
 * Between two turns: have the drained segments truncated when due, and the
 * rows the claims passed looked for every outbox.poll_interval; lower
 * *wait_ms to the time until either is due again.
 */
static void
reclaim_segments_when_due(long *wait_ms)
{
	MemoryContext loop_context = CurrentMemoryContext;
	TimestampTz now = GetCurrentTimestamp();
	bool		look_due = now >= passed_rows_look_at;

	if (now >= reclaim_at || look_due)
	{
		long		next_ms = reclaim_segments(now, look_due);

		MemoryContextSwitchTo(loop_context);
		reclaim_at = TimestampTzPlusMilliseconds(now, next_ms);
	}
	*wait_ms = Min(*wait_ms, TimestampDifferenceMilliseconds(now, Min(reclaim_at, passed_rows_look_at)));
}

/* When the database is next looked at for inbox subscriptions. */
static TimestampTz inbox_look_at = 0;

/*
 * While no inbox worker is wanted for the database, look for subscriptions
 * when due, and if there are, have the launcher start one.  A subscription
 * made by inbox_subscribe() sets wanted as it commits; this finds those
 * that came otherwise, restored ones.  Not a reason to wake: a pass comes
 * at least every outbox.poll_interval.  Outside a transaction, between two
 * turns.
 */
static void
look_for_inbox_subscriptions_when_due(void)
{
	MemoryContext loop_context = CurrentMemoryContext;
	TimestampTz now;

	if (worker_slot_occupancy(my_slot).inbox_wanted)
		return;
	now = GetCurrentTimestamp();
	if (now >= inbox_look_at)
	{
		if (inbox_subscriptions_exist())
			inbox_want_worker(my_database);
		MemoryContextSwitchTo(loop_context);
		inbox_look_at = TimestampTzPlusMilliseconds(now, INBOX_LOOK_INTERVAL_MS);
	}
}

/* The extension is gone (DROP EXTENSION): say so, and leave the loop. */
static void
leave_without_extension(void)
{
	worker_report_exit(WORKER_EXIT_NO_EXTENSION);
	ShutdownRequestPending = true;
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
	(void) settings_reload_if_asked();
	look_for_inbox_subscriptions_when_due();

	/* while Kafka cannot be reached no turn runs: look for the extension */
	if (!pipeline_prepare_producer(pipeline, wait_ms))
	{
		if (!extension_installed_here())
			leave_without_extension();
		return false;
	}

	result = pipeline_turn(pipeline, !under_load(), &next_retry_ms);
	if (result == TURN_NO_EXTENSION)
	{
		leave_without_extension();
		return false;
	}
	reclaim_segments_when_due(wait_ms);
	if (result == TURN_IN_FLIGHT)
		coalesce_wakes(pipeline);
	if (result == TURN_GO_ON || result == TURN_IN_FLIGHT)
		return true;
	worker_report_state(WORKER_IDLE);
	if (next_retry_ms >= 0)
		*wait_ms = Min(*wait_ms, next_retry_ms);
	return false;
}

/*
 * An error ends the worker (a background worker has no loop to go back
 * to): before it does, put it into outbox_worker.last_error, and tell the
 * launcher, which starts the next one after a pause that grows while
 * errors follow one another (launcher.c).  An error that every start meets
 * again, as a full disk under the segments, is then visible where the
 * worker's state is, and does not start a worker once a second.
 */
static void
record_fatal_error(void)
{
	MemoryContext error_context = MemoryContextSwitchTo(TopMemoryContext);
	ErrorData  *edata = CopyErrorData();

	MemoryContextSwitchTo(error_context);
	worker_record_error(edata->message);
	worker_report_exit(WORKER_EXIT_ERROR);
	FreeErrorData(edata);
}

static void publish_until_stopped(Oid database);

void
outbox_publisher_main(Datum main_arg)
{
	Oid			database;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	database = worker_slot_attach(main_arg);
	if (!OidIsValid(database))
		proc_exit(0);			/* asked for by a launcher before this one */
	my_slot = DatumGetInt32(main_arg);
	my_database = database;
	metrics_attach(my_slot, database);
	connect_to_database(database, "outbox worker");
	PG_TRY();
	{
		publish_until_stopped(database);
	}
	PG_CATCH();
	{
		record_fatal_error();
		PG_RE_THROW();
	}
	PG_END_TRY();
	proc_exit(0);
}

/* The worker's life once connected: the loop, until it is asked to stop. */
static void
publish_until_stopped(Oid database)
{
	Pipeline   *pipeline;
	MemoryContext loop_context;

	/* after a restart, the launcher learns here of the database's subscriptions */
	if (inbox_subscriptions_exist())
		inbox_want_worker(database);
	inbox_look_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), INBOX_LOOK_INTERVAL_MS);
	passed_rows_looked_for(GetCurrentTimestamp(), true);	/* the first claim does */

	pipeline = pipeline_create();
	loop_context = AllocSetContextCreate(TopMemoryContext, "outbox publisher loop",
										 ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(loop_context);

	while (!ShutdownRequestPending)
	{
		long		wait_ms;
		bool		go_on = publish_once(pipeline, &wait_ms);

		MemoryContextReset(loop_context);
		if (!go_on && !ShutdownRequestPending)
		{
			coalesce_wakes(pipeline);
			wait_for_wake(wait_ms);
		}
	}

	pipeline_finish(pipeline);
}

/*
 * The reclaimer: connect to the database in main_arg as its publisher
 * does, look for the rows the publisher's claims passed, truncate the
 * drained segments (segments_reclaim()), and exit.  The
 * segment's lock, which the publisher's claims wait for, is held for the
 * look under it and the TRUNCATE only; the first looks and the removal of
 * the files, the slow parts, take no lock that the publisher meets.
 */
void
outbox_reclaimer_main(Datum main_arg)
{
	BackgroundWorkerUnblockSignals();
	connect_to_database(DatumGetObjectId(main_arg), RECLAIMER_TYPE);
	(void) segments_reclaim(true);
	proc_exit(0);
}

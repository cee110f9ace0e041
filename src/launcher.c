/*-------------------------------------------------------------------------
 *
 * launcher.c
 *	  The launcher: a background worker, connected to no database, that
 *	  starts a publishing worker for every database whose outbox is to be
 *	  published, within outbox.max_workers, and a probe to find out which
 *	  databases have the extension.
 *
 * It keeps a table of the databases pg_database lists, each in a named
 * state (DatabaseState), and moves each along in manage_database():
 *
 *	 UNCHECKED --probe--> PROBING --> NO_EXTENSION
 *	                         |
 *	                         +------> WAITING --slot--> SERVED
 *
 * and to SKIPPED, from any state, while the database is a template,
 * refuses connections, is outside outbox.databases or is held by a backend
 * that drops, renames or copies it (launcher_slot.c's holds); back to
 * UNCHECKED once it is none of those.  A database announced by a backend
 * (CREATE EXTENSION outbox, or an enqueue that no publisher serves) goes
 * to WAITING without a probe (or, if one runs in it, once it ends, even
 * if it found none); a publisher that finds the extension gone sends its
 * database back to NO_EXTENSION (unless it was announced meanwhile).  A
 * publisher that exits for another reason is started again, after a
 * pause.
 *
 * A process connects to one database in its life, so a probe is a
 * short-lived background worker of its own, one at a time, outside the
 * budget: it connects, looks for the extension, says what it found
 * (probe_report()) and exits.
 *
 * Beside the publisher of a served database runs its inbox worker, while
 * the database has inbox subscriptions (manage_inbox()).
 *
 * The launcher wakes on its latch, which backends set when they announce
 * a database or hold one, publishers when they exit and the postmaster
 * when a worker it was asked for starts or stops; and every
 * SCAN_INTERVAL_MS to read pg_database again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pg_compat.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "launcher.h"
#include "launcher_slot.h"
#include "settings.h"
#include "worker_session.h"
#include "worker_slot.h"

/* How often pg_database is read again without being asked. */
#define SCAN_INTERVAL_MS 5000

/*
 * The pause before a publisher that exited is started again; doubled for
 * each error in a row that ended one (a disk full, which the next one
 * meets too), up to MAX_RESTART_PAUSE_MS.  A publisher that ran that long
 * before its error starts the count again.
 */
#define RESTART_PAUSE_MS 1000
#define MAX_RESTART_PAUSE_MS (60 * 1000)

/* The pause before a failed start or probe is tried again. */
#define RETRY_PAUSE_MS 5000

/* The background workers the launcher takes besides the budget: itself and a probe. */
#define LAUNCHER_OWN_WORKERS 2

/* The first size of the table of databases. */
#define INITIAL_DATABASES 64

/* What pg_stat_activity calls the workers the launcher starts. */
#define PUBLISHER_TYPE "outbox worker"
#define PROBE_TYPE "outbox probe"
#define INBOX_TYPE "outbox inbox"

extern PGDLLEXPORT void outbox_launcher_main(Datum main_arg);
extern PGDLLEXPORT void outbox_probe_main(Datum main_arg);
extern PGDLLEXPORT void outbox_inbox_main(Datum main_arg);

typedef enum DatabaseState
{
	DB_UNCHECKED,				/* not known whether it has the extension */
	DB_PROBING,					/* the probe is in it */
	DB_NO_EXTENSION,
	DB_WAITING,					/* has the extension, waits for a slot */
	DB_SERVED,					/* a slot is handed out for it */
	DB_SKIPPED					/* not to be published; see eligible() */
} DatabaseState;

typedef struct KnownDatabase
{
	Oid			oid;			/* the hash key */
	NameData	name;
	bool		connectable;	/* neither a template nor refusing connections */
	bool		listed;			/* in the last scan of pg_database */
	DatabaseState state;
	TimestampTz not_before;		/* no start or probe before then */
	bool		start_failed;	/* reported the last failed start */
	bool		wait_logged;	/* logged that it waits for a slot */
	bool		announced;		/* said to have the extension since it was
								 * last found without */
	bool		probe_failed;	/* reported the last failed probe */
	int			slot;			/* while SERVED */
	TimestampTz restart_at;		/* while SERVED, its publisher gone: when the
								 * next starts */
	TimestampTz started_at;		/* while SERVED: when its publisher was asked for */
	int			errors_in_row;	/* publishers an error ended, one after the other */
	BackgroundWorkerHandle *worker;	/* while SERVED and its worker asked for */
	bool		stop_asked;		/* SIGTERM sent to its worker */
	BackgroundWorkerHandle *inbox;	/* its inbox worker, if asked for */
	bool		inbox_stop_asked;
	bool		inbox_start_failed; /* reported the last failed start */
	TimestampTz inbox_not_before;	/* no inbox worker started before then */
} KnownDatabase;

static HTAB *databases = NULL;

/* The probe that runs, if any (its database is in DB_PROBING). */
static BackgroundWorkerHandle *probe = NULL;

static TimestampTz next_scan_at = 0;

/* The databases backends hold the launcher off, as this pass read them. */
static Oid	held[LAUNCHER_MAX_HOLDS];
static int	held_count = 0;

/* Exit code that makes the postmaster start the launcher again. */
#define EXIT_TO_RESTART 1

/* Set when SIGTERM came from the postmaster: the server is shutting down. */
static volatile sig_atomic_t stopped_by_postmaster = false;

/*
 * SIGTERM: stop.  Who sent it decides how the launcher exits: the
 * postmaster at shutdown, or a backend through pg_terminate_backend(),
 * after which the postmaster must start it again, as it does autovacuum's
 * launcher, or no database would be served again until the next restart.
 */
static void
handle_sigterm(int signo, siginfo_t *info, void *context)
{
	int			save_errno = errno;

	stopped_by_postmaster = info != NULL && info->si_pid == PostmasterPid;
	/* as SignalHandlerForShutdownRequest(), whose arguments change by major */
	ShutdownRequestPending = true;
	SetLatch(MyLatch);
	errno = save_errno;
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

/*
 * Register a dynamic background worker of the extension, whose postmaster
 * tells this process when it starts and stops.  Returns its handle, or
 * NULL if no background worker slot is free.  The launcher starts its
 * probes, publishers and inbox workers so; a publisher its reclaimers.
 */
BackgroundWorkerHandle *
start_worker(const char *function_name, const char *type, const char *name,
			 Datum main_arg, uint32 extra)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	MemoryContext caller;
	bool		registered;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	worker.bgw_main_arg = main_arg;
	memcpy(worker.bgw_extra, &extra, sizeof(extra));
	worker.bgw_notify_pid = MyProcPid;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "outbox");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "%s", function_name);
	snprintf(worker.bgw_name, BGW_MAXLEN, "%s %s", type, name);
	snprintf(worker.bgw_type, BGW_MAXLEN, "%s", type);

	/* the handle outlives the pass of the loop that asks for the worker */
	caller = MemoryContextSwitchTo(TopMemoryContext);
	registered = RegisterDynamicBackgroundWorker(&worker, &handle);
	MemoryContextSwitchTo(caller);
	return registered ? handle : NULL;
}

/* Has this worker gone (or never started)? */
bool
worker_gone(BackgroundWorkerHandle *handle)
{
	pid_t		pid;

	return GetBackgroundWorkerPid(handle, &pid) == BGWH_STOPPED;
}

/*
 * Should the database's outbox be published?  Its publisher may connect,
 * the allow-list names it, and no backend holds it.
 */
static bool
eligible(KnownDatabase *db)
{
	for (int i = 0; i < held_count; i++)
		if (held[i] == db->oid)
			return false;
	return db->connectable && settings_database_allowed(NameStr(db->name));
}

/*
 * Read pg_database: add the databases not yet known, note each one's name
 * and whether it may be connected to, and forget those that have gone
 * (their publisher, if any, has gone with them or is about to).
 */
static void
scan_databases(void)
{
	MemoryContext caller = CurrentMemoryContext;
	HASH_SEQ_STATUS seq;
	KnownDatabase *db;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tuple;

	hash_seq_init(&seq, databases);
	while ((db = hash_seq_search(&seq)) != NULL)
		db->listed = false;

	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database form = (Form_pg_database) GETSTRUCT(tuple);
		bool		found;

		db = hash_search(databases, &form->oid, HASH_ENTER, &found);
		if (!found)
		{
			/* all after the key zero: DB_UNCHECKED, nothing asked, no slot */
			memset((char *) db + sizeof(Oid), 0, sizeof(KnownDatabase) - sizeof(Oid));
			db->slot = -1;
		}
		db->name = form->datname;
		db->connectable = form->datallowconn && !form->datistemplate &&
			!database_is_invalid_form(form);
		db->listed = true;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	PopActiveSnapshot();
	CommitTransactionCommand();
	MemoryContextSwitchTo(caller);

	hash_seq_init(&seq, databases);
	while ((db = hash_seq_search(&seq)) != NULL)
		if (!db->listed && db->state != DB_SERVED && db->state != DB_PROBING)
			hash_search(databases, &db->oid, HASH_REMOVE, NULL);
}

/*
 * A database announced to have the extension waits for a slot, unprobed;
 * one being probed, or whose publisher leaves, may be found without it by
 * a look older than the announcement, which then wins.
 */
static void
take_announcement(KnownDatabase *db)
{
	if (db->state == DB_UNCHECKED || db->state == DB_NO_EXTENSION)
	{
		db->state = DB_WAITING;
		db->not_before = 0;
	}
	else if (db->state == DB_PROBING || db->state == DB_SERVED)
		db->announced = true;
}

/*
 * Take what backends told: the databases announced, whether pg_database is
 * to be read again (also when due), the holds.  When announcements were
 * lost for want of room, every database may have been announced: those
 * found without the extension are probed again.
 */
static void
take_what_backends_told(void)
{
	Oid			announced[LAUNCHER_MAX_ANNOUNCED];
	bool		rescan;
	bool		lost;
	int			count = launcher_take_announced(announced, &rescan, &lost);
	TimestampTz now = GetCurrentTimestamp();
	HASH_SEQ_STATUS seq;
	KnownDatabase *db;

	if (rescan || lost || count > 0 || now >= next_scan_at)
	{
		scan_databases();
		next_scan_at = TimestampTzPlusMilliseconds(now, SCAN_INTERVAL_MS);
	}
	for (int i = 0; i < count; i++)
		if ((db = hash_search(databases, &announced[i], HASH_FIND, NULL)) != NULL)
			take_announcement(db);
	if (lost)
	{
		hash_seq_init(&seq, databases);
		while ((db = hash_seq_search(&seq)) != NULL)
		{
			if (db->state == DB_NO_EXTENSION)
				db->state = DB_UNCHECKED;
			else if (db->state == DB_PROBING || db->state == DB_SERVED)
				db->announced = true;
		}
	}
	held_count = launcher_read_holds(held);
}

/* Start the probe in this database, if none runs. */
static void
start_probe(KnownDatabase *db)
{
	if (probe != NULL || GetCurrentTimestamp() < db->not_before)
		return;
	launcher_begin_probe(db->oid);
	probe = start_worker("outbox_probe_main", PROBE_TYPE, NameStr(db->name),
						 ObjectIdGetDatum(db->oid), 0);
	if (probe == NULL)
	{
		/* once, as a failed start: not every RETRY_PAUSE_MS while it lasts */
		if (!db->probe_failed)
			launcher_report_error("could not start a probe of database \"%s\": no background worker slot is free; raise max_worker_processes",
								  NameStr(db->name));
		db->probe_failed = true;
		db->not_before = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), RETRY_PAUSE_MS);
		return;
	}
	db->probe_failed = false;
	db->state = DB_PROBING;
}

/*
 * Once the probe has gone: what it found moves its database on.  A
 * database announced while it was probed has the extension even if the
 * probe found none: it may have read the catalog before CREATE EXTENSION
 * committed.
 */
static void
finish_probe(KnownDatabase *db)
{
	bool		announced;

	if (!worker_gone(probe))
		return;
	pfree(probe);
	probe = NULL;
	announced = db->announced;
	db->announced = false;
	switch (launcher_end_probe())
	{
		case PROBE_HAS_EXTENSION:
			db->state = DB_WAITING;
			break;
		case PROBE_NO_EXTENSION:
			db->state = announced ? DB_WAITING : DB_NO_EXTENSION;
			break;
		case PROBE_NONE:
			/* it could not connect: the database may be on its way out */
			db->state = DB_UNCHECKED;
			db->not_before = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), RETRY_PAUSE_MS);
			break;
	}
}

/* Start a publisher for the database in its slot; false if none could start. */
static bool
start_publisher(KnownDatabase *db, uint32 generation)
{
	db->worker = start_worker("outbox_publisher_main", PUBLISHER_TYPE, NameStr(db->name),
							  Int32GetDatum(db->slot), generation);
	db->stop_asked = false;
	db->started_at = GetCurrentTimestamp();
	if (db->worker != NULL)
	{
		db->start_failed = false;
		return true;
	}
	if (!db->start_failed)
		launcher_report_error("could not start the worker of database \"%s\": no background worker slot is free; raise max_worker_processes",
							  NameStr(db->name));
	db->start_failed = true;
	db->not_before = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), RETRY_PAUSE_MS);
	return false;
}

/* Hand a waiting database a slot, if one is free, and start its publisher. */
static void
serve(KnownDatabase *db)
{
	uint32		generation;

	if (GetCurrentTimestamp() < db->not_before)
		return;
	db->slot = worker_slot_assign(db->oid, &generation);
	if (db->slot < 0)
	{
		if (!db->wait_logged)
			ereport(LOG,
					(errmsg("outbox launcher: database \"%s\" waits for a worker: the %d of outbox.max_workers serve other databases",
							NameStr(db->name), outbox_max_workers)));
		db->wait_logged = true;
		return;
	}
	db->wait_logged = false;
	if (!start_publisher(db, generation))
	{
		worker_slot_release(db->slot);
		db->slot = -1;
		return;
	}
	db->state = DB_SERVED;
}

/* Ask the database's publisher to stop, once. */
static void
stop_publisher(KnownDatabase *db)
{
	int			pid;

	if (db->stop_asked)
		return;
	db->stop_asked = true;
	if (db->worker)
		TerminateBackgroundWorker(db->worker);
	else if ((pid = worker_slot_occupancy(db->slot).publisher_pid) != 0)
		kill(pid, SIGTERM);		/* adopted from a launcher before this one */
}

/* Has the database's publisher gone? */
static bool
publisher_gone(KnownDatabase *db)
{
	if (db->worker)
		return worker_gone(db->worker);
	return worker_slot_occupancy(db->slot).publisher_pid == 0;
}

/* Ask the database's inbox worker to stop, once. */
static void
stop_inbox(KnownDatabase *db)
{
	if (db->inbox && !db->inbox_stop_asked)
		TerminateBackgroundWorker(db->inbox);
	db->inbox_stop_asked = true;
}

/* The database's slot goes back; it moves to this state. */
static void
release_slot(KnownDatabase *db, DatabaseState state)
{
	stop_inbox(db);
	worker_slot_release(db->slot);
	db->slot = -1;
	db->restart_at = 0;
	db->state = state;
}

/*
 * How long to wait before the next publisher of a database whose publisher
 * left for reason: RESTART_PAUSE_MS, doubled for each error in a row, so
 * that a publisher that meets the same error at each start (its
 * tablespace full) is not started once a second for as long as it lasts.
 * Its error is in outbox_worker.last_error meanwhile (publisher.c).
 */
static long
restart_pause_ms(KnownDatabase *db, WorkerExitReason reason)
{
	long		pause_ms = RESTART_PAUSE_MS;
	TimestampTz now = GetCurrentTimestamp();

	if (reason != WORKER_EXIT_ERROR ||
		TimestampDifferenceExceeds(db->started_at, now, MAX_RESTART_PAUSE_MS))
	{
		db->errors_in_row = 0;
		return pause_ms;
	}
	db->errors_in_row++;
	for (int i = 1; i < db->errors_in_row && pause_ms < MAX_RESTART_PAUSE_MS; i++)
		pause_ms *= 2;
	pause_ms = Min(pause_ms, MAX_RESTART_PAUSE_MS);
	ereport(LOG,
			(errmsg("outbox launcher: the worker of database \"%s\" ended with an error (%d in a row); the next starts in %ld s",
					NameStr(db->name), db->errors_in_row, pause_ms / 1000),
			 errhint("outbox_worker.last_error says why.")));
	return pause_ms;
}

/*
 * Its publisher has gone: the slot goes back if the database is not to be
 * published, or if the extension has gone (and was not created again
 * since); otherwise the next publisher starts after a pause.
 */
static void
publisher_left(KnownDatabase *db, bool should_run)
{
	WorkerExitReason reason = worker_slot_occupancy(db->slot).exit_reason;
	bool		announced = db->announced;

	if (db->worker)
		pfree(db->worker);
	db->worker = NULL;
	db->announced = false;
	if (!should_run)
		release_slot(db, DB_SKIPPED);
	else if (reason == WORKER_EXIT_NO_EXTENSION && !announced)
		release_slot(db, DB_NO_EXTENSION);
	else
		db->restart_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													 restart_pause_ms(db, reason));
}

/* Start the next publisher in the database's slot, or wait for one again. */
static void
restart_publisher(KnownDatabase *db)
{
	uint32		generation;

	worker_slot_release(db->slot);
	db->slot = worker_slot_assign(db->oid, &generation);	/* the same slot */
	db->restart_at = 0;
	if (!start_publisher(db, generation))
		release_slot(db, DB_WAITING);
}

/*
 * A served database: stop its publisher if it is not to be published any
 * more; once it has gone, start the next after a pause (see
 * publisher_left()).
 */
static void
manage_served(KnownDatabase *db, bool should_run)
{
	if (!should_run)
		stop_publisher(db);

	if (db->restart_at == 0)
	{
		if (publisher_gone(db))
			publisher_left(db, should_run);
	}
	else if (!should_run)
		release_slot(db, DB_SKIPPED);
	else if (GetCurrentTimestamp() >= db->restart_at)
		restart_publisher(db);
}

/* Start the inbox worker of a served database, or note when to try again. */
static void
start_inbox(KnownDatabase *db)
{
	db->inbox = start_worker("outbox_inbox_main", INBOX_TYPE, NameStr(db->name),
							 Int32GetDatum(db->slot),
							 worker_slot_occupancy(db->slot).generation);
	db->inbox_stop_asked = false;
	if (db->inbox != NULL)
	{
		db->inbox_start_failed = false;
		return;
	}
	if (!db->inbox_start_failed)
		launcher_report_error("could not start the inbox worker of database \"%s\": no background worker slot is free; raise max_worker_processes",
							  NameStr(db->name));
	db->inbox_start_failed = true;
	db->inbox_not_before = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), RETRY_PAUSE_MS);
}

/*
 * A database's inbox worker runs beside its publisher while its slot says
 * it has subscriptions (inbox_want_worker()): started after a pause if it
 * exited, stopped with its publisher.  It leaves by itself when it finds
 * no subscription, and when its slot is handed out again.  One that a
 * launcher before this one started runs on, adopted.
 */
static void
manage_inbox(KnownDatabase *db)
{
	bool		served = db->state == DB_SERVED && db->restart_at == 0 && !db->stop_asked;
	SlotOccupancy occupancy;

	if (db->inbox && worker_gone(db->inbox))
	{
		pfree(db->inbox);
		db->inbox = NULL;
		db->inbox_not_before = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														   RESTART_PAUSE_MS);
	}
	if (!served)
	{
		stop_inbox(db);
		return;
	}
	occupancy = worker_slot_occupancy(db->slot);
	if (db->inbox == NULL && occupancy.inbox_wanted && occupancy.inbox_pid == 0 &&
		GetCurrentTimestamp() >= db->inbox_not_before)
		start_inbox(db);
}

/* Take one step of a database's way; see the file's header comment. */
static void
step_database(KnownDatabase *db, bool should_run)
{
	switch (db->state)
	{
		case DB_SKIPPED:
			if (should_run)
				db->state = DB_UNCHECKED;
			break;
		case DB_UNCHECKED:
			if (!should_run)
				db->state = DB_SKIPPED;
			else
				start_probe(db);
			break;
		case DB_PROBING:
			finish_probe(db);
			break;
		case DB_NO_EXTENSION:
			if (!should_run)
				db->state = DB_SKIPPED;
			break;
		case DB_WAITING:
			if (!should_run)
				db->state = DB_SKIPPED;
			else
				serve(db);
			break;
		case DB_SERVED:
			manage_served(db, should_run);
			break;
	}
}

/* Move one database along as far as it goes now. */
static void
manage_database(KnownDatabase *db)
{
	bool		should_run = db->listed && eligible(db);
	DatabaseState before;

	do
	{
		before = db->state;
		step_database(db, should_run);
	} while (db->state != before);
	manage_inbox(db);
}

/* The databases that wait for a slot, as the views and the WARNING see it. */
static void
publish_waiting(void)
{
	HASH_SEQ_STATUS seq;
	KnownDatabase *db;
	Oid		   *waiting = palloc(sizeof(Oid) * Max(hash_get_num_entries(databases), 1));
	int			count = 0;

	hash_seq_init(&seq, databases);
	while ((db = hash_seq_search(&seq)) != NULL)
		if (db->state == DB_WAITING)
			waiting[count++] = db->oid;
	launcher_publish_waiting(waiting, count);
	pfree(waiting);
}

/* How long to sleep: until the next scan, or the next start due. */
static long
time_to_next_event(void)
{
	HASH_SEQ_STATUS seq;
	KnownDatabase *db;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz next = next_scan_at;

	hash_seq_init(&seq, databases);
	while ((db = hash_seq_search(&seq)) != NULL)
	{
		if (db->not_before > now && (db->state == DB_UNCHECKED || db->state == DB_WAITING))
			next = Min(next, db->not_before);
		if (db->restart_at > now)
			next = Min(next, db->restart_at);
		if (db->inbox_not_before > now && db->state == DB_SERVED)
			next = Min(next, db->inbox_not_before);
	}
	return TimestampDifferenceMilliseconds(now, next);
}

/*
 * Slots handed out by a launcher before this one (which exited, and was
 * started again) keep their publishers: adopt those that run, free those
 * whose worker has gone or never came (a worker asked for that starts late
 * finds its slot free, and exits).
 */
static void
adopt_running_publishers(void)
{
	scan_databases();
	for (int i = 0; i < worker_slot_count(); i++)
	{
		WorkerStatus status;
		KnownDatabase *db;

		if (!worker_slot_read(i, &status))
			continue;
		db = hash_search(databases, &status.database, HASH_FIND, NULL);
		if (status.pid == 0 || db == NULL)
		{
			worker_slot_release(i);
			continue;
		}
		db->state = DB_SERVED;
		db->slot = i;
	}
}

/* One pass of the loop: every database moved along, the state told. */
static void
launch_once(void)
{
	HASH_SEQ_STATUS seq;
	KnownDatabase *db;

	take_what_backends_told();
	hash_seq_init(&seq, databases);
	while ((db = hash_seq_search(&seq)) != NULL)
		manage_database(db);
	publish_waiting();
}

void
outbox_launcher_main(Datum main_arg)
{
	HASHCTL		ctl;
	MemoryContext loop_context;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	install_sigterm_handler();
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("outbox launcher");
	launcher_attach();

	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(KnownDatabase);
	ctl.hcxt = TopMemoryContext;
	databases = hash_create("outbox launcher databases", INITIAL_DATABASES, &ctl,
							HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	adopt_running_publishers();
	if (outbox_database[0] != '\0')
		ereport(LOG,
				(errmsg("outbox launcher: outbox.database is deprecated"),
				 errhint("Set outbox.databases = '%s' instead, or leave both empty to publish every database that has the extension.",
						 outbox_database)));
	if (outbox_max_workers + LAUNCHER_OWN_WORKERS > max_worker_processes)
		launcher_report_error("outbox.max_workers (%d) and the launcher's own %d need more than max_worker_processes (%d): raise it to at least %d, plus what parallel queries and other extensions use",
							  outbox_max_workers, LAUNCHER_OWN_WORKERS, max_worker_processes,
							  outbox_max_workers + LAUNCHER_OWN_WORKERS);

	loop_context = AllocSetContextCreate(TopMemoryContext, "outbox launcher loop",
										 ALLOCSET_DEFAULT_SIZES);
	while (!ShutdownRequestPending)
	{
		MemoryContextSwitchTo(loop_context);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		(void) settings_reload_if_asked();
		launch_once();
		MemoryContextReset(loop_context);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Max(time_to_next_event(), 1), PG_WAIT_EXTENSION);
	}
	proc_exit(stopped_by_postmaster ? 0 : EXIT_TO_RESTART);
}

/*
 * Is the extension installed in the database this process is connected
 * to?  In a transaction of its own; it runs no SQL, it reads the catalog.
 * Leaves the caller's memory context current.
 */
bool
extension_installed_here(void)
{
	MemoryContext caller = CurrentMemoryContext;
	bool		installed;

	StartTransactionCommand();
	installed = OidIsValid(get_extension_oid("outbox", true));
	CommitTransactionCommand();
	MemoryContextSwitchTo(caller);
	return installed;
}

/*
 * The probe: connect to the database in main_arg, say whether the
 * extension is there, and exit.
 */
void
outbox_probe_main(Datum main_arg)
{
	Oid			database = DatumGetObjectId(main_arg);

	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(database, InvalidOid, 0);
	worker_pin_session_settings();
	pgstat_report_appname("outbox probe");
	probe_report(database, extension_installed_here() ? PROBE_HAS_EXTENSION : PROBE_NO_EXTENSION);
	proc_exit(0);
}

/*-------------------------------------------------------------------------
 *
 * serving.c
 *	  Which databases are served: the backends' side of the launcher.
 *
 * A backend tells the launcher (launcher.c) what it cannot see for itself,
 * at the commit that makes it true: that CREATE EXTENSION outbox ran here
 * (and DROP EXTENSION wakes the publisher, which then leaves),
 * that a transaction enqueued here while no publisher serves the database
 * (it may have come from a template that has the extension), or that a
 * database was created or altered.
 *
 * DROP DATABASE, ALTER DATABASE ... RENAME or SET TABLESPACE, and CREATE
 * DATABASE ... TEMPLATE wait (five seconds) for every other session of the
 * database to leave, and then fail.  So before one of those runs, by a role
 * that may run it, this backend holds the launcher off the database: its
 * publisher stops, once the batch it has in flight is recorded, and no
 * other starts until the statement's transaction ends.
 *
 * An enqueue in a database that no publisher will serve raises a WARNING,
 * once per session, that says why and what to change.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "pg_compat.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "serving.h"
#include "launcher_slot.h"
#include "settings.h"
#include "worker_slot.h"

/* How long a statement on a database waits for its publisher to leave. */
#define STEP_ASIDE_TIMEOUT_MS 5000
#define STEP_ASIDE_POLL_MS 10

/* A backend announces an unserved database at most this often. */
#define ANNOUNCE_INTERVAL_MS 1000

static ProcessUtility_hook_type prev_process_utility = NULL;

/* What this transaction tells the launcher at its end. */
static bool announce_at_commit = false; /* CREATE EXTENSION outbox ran */
static bool wake_at_commit = false; /* DROP EXTENSION outbox ran */
static bool rescan_at_commit = false;	/* a database was created or altered */
static Oid	held_database = InvalidOid; /* held off until the end */

static TimestampTz last_announced_at = 0;
static bool unserved_warned = false;

/*
 * The database a statement must have no other session in, if it is one of
 * those, and the current role may run it on that database: the database's
 * publisher then has to step aside.
 */
static Oid
database_to_vacate(Node *stmt)
{
	const char *name = NULL;
	Oid			database;
	ListCell   *lc;

	if (IsA(stmt, DropdbStmt))
		name = ((DropdbStmt *) stmt)->dbname;
	else if (IsA(stmt, RenameStmt) && ((RenameStmt *) stmt)->renameType == OBJECT_DATABASE)
		name = ((RenameStmt *) stmt)->subname;
	else if (IsA(stmt, AlterDatabaseStmt))
	{
		foreach(lc, ((AlterDatabaseStmt *) stmt)->options)
			if (strcmp(((DefElem *) lfirst(lc))->defname, "tablespace") == 0)
				name = ((AlterDatabaseStmt *) stmt)->dbname;
	}
	else if (IsA(stmt, CreatedbStmt))
	{
		foreach(lc, ((CreatedbStmt *) stmt)->options)
		{
			DefElem    *option = lfirst(lc);

			/* TEMPLATE DEFAULT has no argument */
			if (strcmp(option->defname, "template") == 0 && option->arg)
				name = defGetString(option);
		}
	}
	if (name == NULL)
		return InvalidOid;

	/*
	 * A role that may not run it must not be able to stop a publisher, nor
	 * may a statement that PostgreSQL refuses anyway: the database this
	 * session is connected to cannot be dropped, renamed or copied, nor a
	 * database dropped or created inside a transaction block, nor anything
	 * done to one on a standby, where no publisher runs.
	 */
	if (RecoveryInProgress())
		return InvalidOid;
	database = get_database_oid(name, true);
	if (!OidIsValid(database) || database == MyDatabaseId ||
		!object_ownercheck(DatabaseRelationId, database, GetUserId()))
		return InvalidOid;
	if ((IsA(stmt, DropdbStmt) || IsA(stmt, CreatedbStmt)) && IsTransactionBlock())
		return InvalidOid;
	return database;
}

/*
 * Hold the launcher off the database (so that no publisher starts there
 * meanwhile either), and wait a while for its publisher to leave.  If it
 * does not, the statement runs anyway, and PostgreSQL says that the
 * database is in use.
 */
static void
vacate_database(Oid database)
{
	TimestampTz deadline;

	if (OidIsValid(held_database) || !launcher_hold_database(database))
		return;
	held_database = database;

	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), STEP_ASIDE_TIMEOUT_MS);
	while (worker_database_served(database) && GetCurrentTimestamp() < deadline)
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 STEP_ASIDE_POLL_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/* Is this CREATE EXTENSION outbox? */
static bool
creates_this_extension(Node *stmt)
{
	return IsA(stmt, CreateExtensionStmt) &&
		strcmp(((CreateExtensionStmt *) stmt)->extname, "outbox") == 0;
}

/* Is this DROP EXTENSION, of outbox among others? */
static bool
drops_this_extension(Node *stmt)
{
	ListCell   *lc;

	if (!IsA(stmt, DropStmt) || ((DropStmt *) stmt)->removeType != OBJECT_EXTENSION)
		return false;
	foreach(lc, ((DropStmt *) stmt)->objects)
		if (strcmp(strVal(lfirst(lc)), "outbox") == 0)
			return true;
	return false;
}

static void
serving_process_utility(PlannedStmt *pstmt, const char *queryString,
						bool readOnlyTree, ProcessUtilityContext context,
						ParamListInfo params, QueryEnvironment *queryEnv,
						DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;
	Oid			database = database_to_vacate(stmt);

	if (OidIsValid(database))
		vacate_database(database);

	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context,
							 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);

	if (creates_this_extension(stmt))
		announce_at_commit = true;
	else if (drops_this_extension(stmt))
		wake_at_commit = true;
	else if (IsA(stmt, CreatedbStmt) || IsA(stmt, AlterDatabaseStmt) ||
			 (IsA(stmt, RenameStmt) && ((RenameStmt *) stmt)->renameType == OBJECT_DATABASE))
		rescan_at_commit = true;
}

/* At the end of a transaction, tell the launcher what it did. */
static void
tell_launcher_at_transaction_end(XactEvent event, void *arg)
{
	bool		committed = event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT;

	if (!committed && event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT)
		return;

	if (committed && announce_at_commit)
		launcher_announce_database(MyDatabaseId);
	if (committed && wake_at_commit)
		(void) worker_wake_publisher(MyDatabaseId); /* to find it gone, and leave */
	if (OidIsValid(held_database))
		launcher_release_database(held_database);	/* asks for a rescan too */
	else if (committed && rescan_at_commit)
		launcher_request_rescan();
	announce_at_commit = false;
	wake_at_commit = false;
	rescan_at_commit = false;
	held_database = InvalidOid;
}

/*
 * At the commit of a transaction that enqueued here while no publisher
 * serves the database: tell the launcher, which may not know that it has
 * the extension, now and then.
 */
void
serving_announce_unserved(void)
{
	TimestampTz now = GetCurrentTimestamp();

	if (!TimestampDifferenceExceeds(last_announced_at, now, ANNOUNCE_INTERVAL_MS))
		return;
	last_announced_at = now;
	launcher_announce_database(MyDatabaseId);
}

/* Raise the WARNING about this database's unserved outbox, with its reason. */
static void
warn_unserved(const char *name, const char *detail, const char *hint)
{
	unserved_warned = true;
	ereport(WARNING,
			(errcode(ERRCODE_WARNING),
			 errmsg("outbox: no worker publishes the messages of database \"%s\"", name),
			 errdetail_internal("%s", detail),
			 errhint("%s", hint)));
}

/*
 * At a transaction's first enqueue: if no publisher will serve this
 * database, say why, once per session.  A database that a publisher serves,
 * or that the launcher has yet to find, is not warned of.
 */
void
serving_warn_if_unserved(void)
{
	HeapTuple	tuple;
	bool		connectable;
	char	   *name;

	if (unserved_warned || worker_database_served(MyDatabaseId))
		return;

	tuple = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(MyDatabaseId));
	if (!HeapTupleIsValid(tuple))
		return;
	connectable = ((Form_pg_database) GETSTRUCT(tuple))->datallowconn &&
		!((Form_pg_database) GETSTRUCT(tuple))->datistemplate;
	ReleaseSysCache(tuple);
	name = get_database_name(MyDatabaseId);

	if (!connectable)
		warn_unserved(name, "It is a template database, or it does not allow connections: no worker connects to it.",
					  "Enqueue in a database that is not a template and allows connections.");
	else if (!settings_database_allowed(name) && settings_database_list_deprecated())
		warn_unserved(name, "outbox.database does not list it.",
					  psprintf("outbox.database is deprecated: set outbox.databases to the databases to publish, \"%s\" among them, or leave both empty to publish every database, and reload the configuration.",
							   name));
	else if (!settings_database_allowed(name))
		warn_unserved(name, "outbox.databases does not list it.",
					  psprintf("Add \"%s\" to outbox.databases, or set it to '' to publish every database, and reload the configuration.",
							   name));
	else if (launcher_database_waiting(MyDatabaseId))
		warn_unserved(name, psprintf("It waits for a worker: the %d of outbox.max_workers serve other databases, or max_worker_processes has none left (outbox_launcher says which).",
							   outbox_max_workers),
					  "Raise outbox.max_workers, within max_worker_processes, and restart the server; or drop the extension where it is not used.");
}

/* Install the hook and the transaction callback; in _PG_init. */
void
serving_init(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = serving_process_utility;
	RegisterXactCallback(tell_launcher_at_transaction_end, NULL);
}

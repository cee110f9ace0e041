/*-------------------------------------------------------------------------
 *
 * statements.c
 *	  The workers' prepared statements.  A worker's SQL is a StatementSet:
 *	  statements named for its errors, prepared with SPI once per extension
 *	  schema (SPI_keepplan()), again if the extension is dropped and created
 *	  anew.  Callers run inside a transaction with SPI connected.  And what
 *	  runs in a subtransaction of its own, so that its failure undoes only
 *	  its own work; and, for the SQL functions that write the extension's
 *	  tables for their caller, a statement run as the extension's owner.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_extension.h"
#include "lib/stringinfo.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"

#include "statements.h"

/*
 * The schema the outbox extension is created in, or InvalidOid; and its oid
 * and, if owner is not NULL, the role that owns it (and so its tables).
 */
Oid
extension_namespace(Oid *extension, Oid *owner)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	Oid			namespace = InvalidOid;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber,
				F_NAMEEQ, CStringGetDatum("outbox"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		namespace = ((Form_pg_extension) GETSTRUCT(tuple))->extnamespace;
		*extension = ((Form_pg_extension) GETSTRUCT(tuple))->oid;
		if (owner)
			*owner = ((Form_pg_extension) GETSTRUCT(tuple))->extowner;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return namespace;
}

/*
 * Run one statement through SPI, connected by the caller, as role: the
 * extension's owner, for a function that has checked who calls it and
 * writes the extension's tables, which are granted to no one.  Returns
 * SPI's result code; the rows, if any, are in SPI_tuptable until
 * SPI_finish().  An error of the statement is raised as it is, and the
 * role is put back by the (sub)transaction's abort.
 */
int
statement_run_as(Oid role, const char *sql, int nargs, Oid *types, Datum *values,
				 const char *nulls)
{
	Oid			saved_user;
	int			saved_context;
	int			rc;

	GetUserIdAndSecContext(&saved_user, &saved_context);
	SetUserIdAndSecContext(role, saved_context | SECURITY_LOCAL_USERID_CHANGE);
	rc = SPI_execute_with_args(sql, nargs, types, values, nulls, false, 0);
	SetUserIdAndSecContext(saved_user, saved_context);
	if (rc < 0)
		elog(ERROR, "outbox: a statement as the extension's owner failed: %s",
			 SPI_result_code_string(rc));
	return rc;
}

/* Has the outbox of this schema the column target_partition (0.6.0 on)? */
bool
schema_has_target_partition(Oid namespace)
{
	Oid			table = get_relname_relid("outbox_message", namespace);

	return OidIsValid(table) && get_attnum(table, "target_partition") != InvalidAttrNumber;
}

/* s with every occurrence of token replaced, in a new string. */
static char *
replace_all(char *s, const char *token, const char *with)
{
	StringInfoData out;
	char	   *p = s;
	char	   *found;

	initStringInfo(&out);
	while ((found = strstr(p, token)) != NULL)
	{
		appendBinaryStringInfo(&out, p, found - p);
		appendStringInfoString(&out, with);
		p = found + strlen(token);
	}
	appendStringInfoString(&out, p);
	pfree(s);
	return out.data;
}

/* A statement's text for this schema (see statements.h). */
static char *
statement_text(const char *sql, const char *schema, bool has_target_partition)
{
	char	   *text = psprintf(sql, schema);

	text = replace_all(text, TARGET_PARTITION_VALUE,
					   has_target_partition ? "m.target_partition" : "NULL::pg_catalog.int4");
	text = replace_all(text, TARGET_PARTITION_COLUMN, has_target_partition ? ", target_partition" : "");
	return replace_all(text, TARGET_PARTITION_COLUMN_VALUE, has_target_partition ? ", m.target_partition" : "");
}

/* Drop the prepared statements, after DROP EXTENSION for instance. */
void
statements_forget(StatementSet *set)
{
	for (int i = 0; set->plans && i < set->count; i++)
	{
		if (set->plans[i])
			SPI_freeplan(set->plans[i]);
		set->plans[i] = NULL;
	}
	set->namespace = InvalidOid;
	set->extension = InvalidOid;
}

/*
 * Is the extension created in this database?  If so, lock it against DROP
 * EXTENSION until the transaction ends, so that its tables stay for the
 * transaction, make sure the statements are prepared for its schema, and
 * return its oid; else drop them and return InvalidOid.
 */
Oid
statements_find_extension(StatementSet *set)
{
	Oid			extension = InvalidOid;
	Oid			namespace = extension_namespace(&extension, NULL);
	const char *schema;
	bool		has_target_partition;

	if (OidIsValid(namespace))
	{
		Oid			locked = extension;

		/* it may have gone while we waited for the lock: look again */
		LockDatabaseObject(ExtensionRelationId, locked, 0, AccessShareLock);
		namespace = extension_namespace(&extension, NULL);
		if (extension != locked)
			namespace = InvalidOid;
	}
	if (!OidIsValid(namespace))
	{
		statements_forget(set);
		return InvalidOid;
	}

	/* a schema that has the column keeps it; one that lacks it may gain it */
	if (namespace == set->namespace && extension == set->extension &&
		(set->has_target_partition || !schema_has_target_partition(namespace)))
		return extension;
	has_target_partition = schema_has_target_partition(namespace);

	statements_forget(set);
	if (set->plans == NULL)
		set->plans = MemoryContextAllocZero(TopMemoryContext, sizeof(SPIPlanPtr) * set->count);
	schema = quote_identifier(get_namespace_name(namespace));
	for (int i = 0; i < set->count; i++)
	{
		const StatementDef *def = &set->defs[i];
		char	   *sql = statement_text(def->sql, schema, has_target_partition);

		set->plans[i] = SPI_prepare_cursor(sql, def->nargs, (Oid *) def->argtypes, def->plan);
		if (set->plans[i] == NULL)
			elog(ERROR, "outbox: could not prepare worker statement \"%s\": %s",
				 def->name, SPI_result_code_string(SPI_result));
		SPI_keepplan(set->plans[i]);
		pfree(sql);
	}
	set->namespace = namespace;
	set->extension = extension;
	set->has_target_partition = has_target_partition;
	return extension;
}

/*
 * Run a prepared statement (nulls as SPI_execute_plan() takes them);
 * anything but the expected result is an ERROR.  Returns the rows
 * processed.
 */
int
statement_run(StatementSet *set, int stmt, Datum *args, const char *nulls, int expected)
{
	int			rc = SPI_execute_plan(set->plans[stmt], args, nulls, false, 0);

	if (rc != expected)
		elog(ERROR, "outbox: worker statement \"%s\" failed: %s",
			 set->defs[stmt].name, SPI_result_code_string(rc));
	return (int) SPI_processed;
}

/* An array of these elements of this type, as a statement's parameter. */
Datum
statement_array(Datum *elements, int count, Oid type)
{
	int16		typlen;
	bool		typbyval;
	char		typalign;

	get_typlenbyvalalign(type, &typlen, &typbyval, &typalign);
	return PointerGetDatum(construct_array(elements, count, type, typlen, typbyval, typalign));
}

/*
 * Run run(arg) in a subtransaction of its own.  Returns NULL if it
 * returned; else its error, copied into the caller's memory context, with
 * what it did rolled back and the error state cleared.
 */
ErrorData *
run_in_subtransaction(void (*run) (void *arg), void *arg)
{
	MemoryContext context = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	ErrorData  *volatile error = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(context);
	PG_TRY();
	{
		run(arg);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(context);
		error = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(context);
	CurrentResourceOwner = owner;
	return error;
}

/*
 * Begin one of a worker's own transactions, SPI connected and a snapshot
 * pushed, and say what it does in pg_stat_activity.
 */
void
statements_begin_transaction(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "outbox: SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
}

/*
 * Commit it, and go back to the caller's memory context
 * (CommitTransactionCommand() leaves TopMemoryContext current).
 */
void
statements_commit_transaction(MemoryContext caller)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	MemoryContextSwitchTo(caller);
}

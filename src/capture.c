/*-------------------------------------------------------------------------
 *
 * capture.c
 *	  outbox_capture() and outbox_uncapture(), the table of captured tables
 *	  (outbox_captured), and outbox_capture_trigger(), which publishes each
 *	  row inserted into a captured table in the inserting transaction.
 *
 * An application written for Debezium's outbox inserts rows into a table
 * of its own (id, aggregatetype, aggregateid, type, payload), and Debezium
 * publishes each insert it reads from the WAL.  outbox_capture() makes the
 * extension do that instead: it records the table and its settings in
 * outbox_captured and creates an AFTER INSERT OR UPDATE row trigger on it,
 * whose function makes a message of each inserted row (capture_row.c) and
 * enqueues it with enqueue_message(), as outbox_enqueue() does: the same
 * checks, the key's lock, the same atomicity, order, retries and dead
 * letters.
 *
 * AFTER, not BEFORE: the trigger sees the row as inserted (defaults and
 * other BEFORE triggers applied), and a row an INSERT ... ON CONFLICT DO
 * NOTHING skips, or that a BEFORE trigger suppresses, publishes nothing.
 * It fires at the end of the INSERT, so a row that the same transaction
 * deletes afterwards (the Quarkus outbox extension deletes each row right
 * after inserting it) is published, and the DELETE fires nothing.  An
 * UPDATE warns (or, with table.op.invalid.behavior "fatal", is refused)
 * and publishes nothing, as EventRouter skips updates.
 *
 * Who may do what.  outbox_capture() and outbox_uncapture() are not for
 * PUBLIC; a role granted them may capture a table it owns only.  They
 * write outbox_captured, which is granted to no one, and create or drop
 * the trigger, as the extension's owner; the trigger function's EXECUTE is
 * granted to no one, so only they (and superusers) make triggers with it.
 * The trigger fires only on a table outbox_captured lists (or a partition
 * of one): attached by anyone to any other table it refuses, before it
 * reads a column, since it would let that table's owner publish as the
 * extension's owner without having been granted anything.  The row's
 * values are made text as the inserting role (capture_row.c); only
 * enqueue_message() runs as the extension's owner, in a security-
 * restricted operation, as outbox_enqueue() runs by SECURITY DEFINER.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/relation.h"
#include "access/xact.h"
#include "catalog/catalog.h"
#include "catalog/dependency.h"
#include "catalog/partition.h"
#include "catalog/pg_class.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"

#include "capture.h"
#include "enqueue.h"
#include "pg_compat.h"
#include "topic_grant.h"
#include "statements.h"

PG_FUNCTION_INFO_V1(outbox_capture);
PG_FUNCTION_INFO_V1(outbox_uncapture);
PG_FUNCTION_INFO_V1(outbox_capture_trigger);

/* The extension, as these functions need it. */
typedef struct CaptureExtension
{
	Oid			namespace;
	const char *schema;			/* quoted, for statements */
	Oid			owner;
	Oid			trigger_function;	/* outbox_capture_trigger() */
	Oid			extension;
} CaptureExtension;

/* What a trigger keeps for the statement it fires in (fn_extra). */
typedef struct CaptureState
{
	Oid			relid;
	CaptureExtension extension;
	CaptureSettings *settings;	/* read against the table it fires on */
} CaptureState;

/*
 * The extension's schema, oid and owner as the trigger last read them
 * (known_extension valid), kept from one statement to the next: the scan of
 * pg_extension, which has no syscache, was a quarter of the trigger's time
 * on a one-row INSERT.  pg_extension's own changes send no invalidation;
 * so the cache is forgotten on a relcache invalidation of outbox_captured
 * (captured_tables_invalidate()), which the changes of them send: DROP
 * EXTENSION drops the table, and REASSIGN OWNED, which moves the extension
 * to another owner, writes the table's pg_class row too, as the
 * extension's owner owns its tables (the extension is not relocatable);
 * and on any change of a role, so that an owner that is dropped is never
 * run as.  The schema's name is not kept: ALTER SCHEMA RENAME sends
 * neither.
 */
typedef struct KnownExtension
{
	bool		valid;
	Oid			namespace;
	Oid			extension;
	Oid			owner;
} KnownExtension;

static KnownExtension known_extension;
static Oid	captured_registry = InvalidOid; /* outbox_captured, once read */

static void remember_captured_tables(void);

static CaptureExtension
find_extension(void)
{
	CaptureExtension e;

	remember_captured_tables();
	if (!known_extension.valid)
	{
		known_extension.namespace = extension_namespace(&known_extension.extension,
														&known_extension.owner);
		if (!OidIsValid(known_extension.namespace))
			elog(ERROR, "outbox: the extension is not installed in this database");
		captured_registry = get_relname_relid("outbox_captured", known_extension.namespace);
		known_extension.valid = true;
	}
	e.namespace = known_extension.namespace;
	e.extension = known_extension.extension;
	e.owner = known_extension.owner;
	e.schema = quote_identifier(get_namespace_name(e.namespace));
	e.trigger_function = GetSysCacheOid3(PROCNAMEARGSNSP, Anum_pg_proc_oid,
										 CStringGetDatum("outbox_capture_trigger"),
										 PointerGetDatum(buildoidvector(NULL, 0)),
										 ObjectIdGetDatum(e.namespace));
	return e;
}

/*
 * Make every backend read the captured tables' settings again
 * (table_settings()).
 */
static void
registry_changed(const CaptureExtension *e)
{
	CacheInvalidateRelcacheByRelid(get_relname_relid("outbox_captured", e->namespace));
}

/* rel's name, schema-qualified and quoted, for a statement. */
static const char *
qualified_name(Relation rel)
{
	return quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
									  RelationGetRelationName(rel));
}

/*
 * Run one statement, with %s for the extension's schema (and no other
 * format), as its owner.
 */
static int
run_as_owner(const CaptureExtension *e, const char *sql, int nargs, Oid *types, Datum *values)
{
	return statement_run_as(e->owner, psprintf(sql, e->schema), nargs, types, values, NULL);
}

/*
 * Open a table that outbox_capture() or outbox_uncapture() is asked about,
 * locked as CREATE TRIGGER locks it, once it is known to be a table its
 * caller owns that may be captured.
 */
static Relation
open_table_to_capture(Oid relid, const CaptureExtension *e, const char *function)
{
	Relation	rel;
	const char *name;
	char		kind;

	/* before the lock, which would hold off the owner's writes */
	if (!object_ownercheck(RelationRelationId, relid, GetUserId()))
		aclcheck_error(ACLCHECK_NOT_OWNER, OBJECT_TABLE, get_rel_name(relid));
	rel = relation_open(relid, ShareRowExclusiveLock);
	name = RelationGetRelationName(rel);
	kind = rel->rd_rel->relkind;
	if (kind != RELKIND_RELATION && kind != RELKIND_PARTITIONED_TABLE)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("%s() captures tables, and \"%s\" is not a table", function, name)));
	if (rel->rd_rel->relispartition)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("%s() captures a partitioned table as a whole, and \"%s\" is one of its partitions",
						function, name),
				 errhint("Capture the partitioned table: its partitions are captured with it.")));
	if (IsSystemRelation(rel) || getExtensionOfObject(RelationRelationId, relid) == e->extension)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("%s() captures the application's tables, and \"%s\" is %s's own",
						function, name, IsSystemRelation(rel) ? "PostgreSQL" : "the outbox extension")));
	return rel;
}

/* Forget the tables that have been dropped since they were captured. */
static void
forget_dropped_tables(const CaptureExtension *e)
{
	run_as_owner(e, "DELETE FROM %s.outbox_captured c WHERE NOT EXISTS"
				 " (SELECT FROM pg_catalog.pg_class r WHERE r.oid OPERATOR(pg_catalog.=) c.tbl)",
				 0, NULL, NULL);
}

/*
 * Create the capture trigger on rel, unless it has one already (under any
 * name: its owner may have renamed it).  A trigger of another function by
 * the name is refused rather than replaced.
 */
static void
create_capture_trigger(Relation rel, const CaptureExtension *e)
{
	TriggerDesc *triggers = rel->trigdesc;

	for (int i = 0; triggers && i < triggers->numtriggers; i++)
	{
		Trigger    *t = &triggers->triggers[i];

		if (t->tgfoid == e->trigger_function)
			return;
		if (strcmp(t->tgname, CAPTURE_TRIGGER_NAME) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_DUPLICATE_OBJECT),
					 errmsg("table \"%s\" has a trigger named \"%s\" already", RelationGetRelationName(rel),
							CAPTURE_TRIGGER_NAME),
					 errhint("Rename that trigger: outbox_capture() creates one of its own by that name.")));
	}
	statement_run_as(e->owner,
					 psprintf("CREATE TRIGGER %s AFTER INSERT OR UPDATE ON %s"
							  " FOR EACH ROW EXECUTE FUNCTION %s.outbox_capture_trigger()",
							  quote_identifier(CAPTURE_TRIGGER_NAME), qualified_name(rel), e->schema),
					 0, NULL, NULL, NULL);
}

/* Drop every capture trigger of rel (its partitions' go with them). */
static void
drop_capture_triggers(Relation rel, const CaptureExtension *e)
{
	TriggerDesc *triggers = rel->trigdesc;
	List	   *names = NIL;
	ListCell   *lc;

	for (int i = 0; triggers && i < triggers->numtriggers; i++)
		if (triggers->triggers[i].tgfoid == e->trigger_function)
			names = lappend(names, pstrdup(triggers->triggers[i].tgname));
	foreach(lc, names)
		statement_run_as(e->owner, psprintf("DROP TRIGGER %s ON %s", quote_identifier(lfirst(lc)),
											qualified_name(rel)),
						 0, NULL, NULL, NULL);
}

/*
 * outbox_capture(tbl regclass, settings jsonb DEFAULT '{}') RETURNS jsonb:
 * publish every row inserted into tbl from now on, as Debezium's
 * EventRouter would with these settings (its option names); returns every
 * setting as it applies, defaults included.  Called again, it replaces the
 * settings.  Rows already in the table are not published.
 */
Datum
outbox_capture(PG_FUNCTION_ARGS)
{
	CaptureExtension e;
	Relation	rel;
	Jsonb	   *settings;
	Jsonb	   *effective;
	Oid			types[2] = {OIDOID, JSONBOID};
	Datum		values[2];

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outbox_capture() needs a table")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outbox_capture() settings must not be NULL"),
				 errhint("Pass '{}' for EventRouter's defaults; outbox_uncapture() stops capturing.")));
	e = find_extension();
	rel = open_table_to_capture(PG_GETARG_OID(0), &e, "outbox_capture");
	settings = PG_GETARG_JSONB_P(1);
	effective = capture_settings_effective(capture_settings_read(settings, rel));

	values[0] = ObjectIdGetDatum(RelationGetRelid(rel));
	values[1] = JsonbPGetDatum(settings);
	SPI_connect();
	forget_dropped_tables(&e);
	run_as_owner(&e, "INSERT INTO %s.outbox_captured AS c (tbl, settings) VALUES ($1, $2)"
				 " ON CONFLICT (tbl) DO UPDATE SET settings = excluded.settings,"
				 " captured_at = pg_catalog.now()",
				 2, types, values);
	create_capture_trigger(rel, &e);
	SPI_finish();
	registry_changed(&e);
	relation_close(rel, NoLock);
	PG_RETURN_JSONB_P(effective);
}

/*
 * outbox_uncapture(tbl regclass) RETURNS boolean: stop capturing tbl;
 * returns whether it was captured.  What it published stays published.
 */
Datum
outbox_uncapture(PG_FUNCTION_ARGS)
{
	CaptureExtension e = find_extension();
	Relation	rel = open_table_to_capture(PG_GETARG_OID(0), &e, "outbox_uncapture");
	Oid			type = OIDOID;
	Datum		value = ObjectIdGetDatum(RelationGetRelid(rel));
	bool		was_captured;

	SPI_connect();
	run_as_owner(&e, "DELETE FROM %s.outbox_captured WHERE tbl OPERATOR(pg_catalog.=) $1",
				 1, &type, &value);
	was_captured = SPI_processed > 0;
	drop_capture_triggers(rel, &e);
	forget_dropped_tables(&e);
	SPI_finish();
	registry_changed(&e);
	relation_close(rel, NoLock);
	PG_RETURN_BOOL(was_captured);
}

/*
 * The settings outbox_captured holds for rel, or for the partitioned table
 * it is a partition of; NULL if neither is captured.  Read as the
 * extension's owner, who alone may read outbox_captured.
 */
static Jsonb *
registered_settings(Relation rel, const CaptureExtension *e)
{
	MemoryContext outer = CurrentMemoryContext;
	List	   *candidates = list_make1_oid(RelationGetRelid(rel));
	ListCell   *lc;
	Jsonb	   *settings = NULL;

	if (rel->rd_rel->relispartition)
		candidates = list_concat(candidates, get_partition_ancestors(RelationGetRelid(rel)));
	SPI_connect();
	foreach(lc, candidates)
	{
		Oid			type = OIDOID;
		Datum		value = ObjectIdGetDatum(lfirst_oid(lc));
		bool		isnull;
		Datum		found;

		run_as_owner(e, "SELECT settings FROM %s.outbox_captured WHERE tbl OPERATOR(pg_catalog.=) $1",
					 1, &type, &value);
		if (SPI_processed == 0)
			continue;
		found = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		MemoryContextSwitchTo(outer);
		settings = DatumGetJsonbPCopy(found);
		break;
	}
	SPI_finish();
	return settings;
}

/*
 * The settings of each captured table the trigger fired on in this backend,
 * read against the table's columns.  Reading them again at each statement
 * (a query of outbox_captured as the extension's owner, then the settings
 * read against the table) cost more than the rest of a one-row INSERT.  An
 * entry is forgotten on a relcache invalidation of its table (ALTER TABLE,
 * CREATE or DROP TRIGGER), and every entry on one of outbox_captured, which
 * outbox_capture() and outbox_uncapture() send as they write it
 * (registry_changed()).  A forgotten entry's memory is freed only at the end
 * of the transaction: a statement that began before may still use it.
 */
typedef struct CapturedTable
{
	Oid			relid;			/* the key */
	Oid			extension;
	bool		valid;			/* false once an invalidation came */
	MemoryContext context;		/* holds settings */
	CaptureSettings *settings;
} CapturedTable;

static HTAB *captured_tables = NULL;
static List *retired_contexts = NIL;

static void
captured_tables_invalidate(Datum arg, Oid relid)
{
	HASH_SEQ_STATUS scan;
	CapturedTable *entry;

	if (OidIsValid(relid) && relid != captured_registry)
	{
		entry = hash_search(captured_tables, &relid, HASH_FIND, NULL);
		if (entry)
			entry->valid = false;
		return;
	}
	known_extension.valid = false;
	hash_seq_init(&scan, captured_tables);
	while ((entry = hash_seq_search(&scan)) != NULL)
		entry->valid = false;
}

static void
role_changed(Datum arg, int cacheid, uint32 hashvalue)
{
	known_extension.valid = false;
}

static void
free_retired_contexts(XactEvent event, void *arg)
{
	ListCell   *lc;

	if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_PARALLEL_COMMIT &&
		event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT &&
		event != XACT_EVENT_PREPARE)
		return;
	foreach(lc, retired_contexts)
		MemoryContextDelete(lfirst(lc));
	list_free(retired_contexts);
	retired_contexts = NIL;
}

static void
remember_captured_tables(void)
{
	HASHCTL		ctl = {0};

	if (captured_tables)
		return;
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(CapturedTable);
	ctl.hcxt = CacheMemoryContext;
	captured_tables = hash_create("outbox captured tables", 16, &ctl,
								  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	CacheRegisterRelcacheCallback(captured_tables_invalidate, (Datum) 0);
	CacheRegisterSyscacheCallback(AUTHOID, role_changed, (Datum) 0);
	RegisterXactCallback(free_retired_contexts, NULL);
}

/*
 * The settings of the captured table rel, or of the partitioned table it is
 * a partition of, read against rel.  Refuses a table that outbox_capture()
 * did not register.
 */
static CaptureSettings *
table_settings(Relation rel, const CaptureExtension *e)
{
	Oid			relid = RelationGetRelid(rel);
	CapturedTable *entry;
	MemoryContext context;
	MemoryContext old;
	Jsonb	   *json;
	CaptureSettings *settings;
	bool		found;

	remember_captured_tables();
	entry = hash_search(captured_tables, &relid, HASH_FIND, NULL);
	if (entry && entry->valid && entry->extension == e->extension)
		return entry->settings;

	/* made under the statement's context, which an error frees */
	context = AllocSetContextCreate(CurrentMemoryContext, "outbox captured table",
									ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(context);
	json = registered_settings(rel, e);
	if (json == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("outbox_capture_trigger() fires only on tables captured by outbox_capture(), not on \"%s\"",
						RelationGetRelationName(rel)),
				 errhint("The table's owner, once granted outbox_capture(), captures it with outbox_capture().")));
	settings = capture_settings_read(json, rel);
	MemoryContextSwitchTo(old);

	MemoryContextSetParent(context, CacheMemoryContext);
	entry = hash_search(captured_tables, &relid, HASH_ENTER, &found);
	if (found)
	{
		old = MemoryContextSwitchTo(TopMemoryContext);
		retired_contexts = lappend(retired_contexts, entry->context);
		MemoryContextSwitchTo(old);
	}
	entry->extension = e->extension;
	entry->valid = true;
	entry->context = context;
	entry->settings = settings;
	return settings;
}

/* The trigger's state for this statement: the extension, and rel's settings. */
static CaptureState *
capture_state(FunctionCallInfo fcinfo, Relation rel)
{
	CaptureState *state = fcinfo->flinfo->fn_extra;

	if (state != NULL && state->relid == RelationGetRelid(rel))
		return state;
	state = MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(CaptureState));
	state->relid = RelationGetRelid(rel);
	state->extension = find_extension();
	state->settings = table_settings(rel, &state->extension);
	fcinfo->flinfo->fn_extra = state;
	return state;
}

/* EventRouter publishes inserts only; an UPDATE is reported, or refused. */
static void
report_update(const CaptureState *state, Relation rel)
{
	bool		refuse = state->settings->refuse_updates;

	ereport(refuse ? ERROR : WARNING,
			(errcode(refuse ? ERRCODE_TRIGGERED_ACTION_EXCEPTION : ERRCODE_WARNING),
			 errmsg("an UPDATE of captured table \"%s\" is not published", RelationGetRelationName(rel)),
			 errdetail("An outbox table is a queue: its rows are inserted, not updated, and only inserts are published, as by Debezium's EventRouter."),
			 refuse ? errhint("The table's setting table.op.invalid.behavior is \"fatal\": it takes no UPDATE.") : 0));
}

/*
 * Enqueue the message of an inserted row, as the extension's owner in a
 * security-restricted operation (nothing of another role's runs there);
 * an error puts the role back as the (sub)transaction aborts.
 */
static void
enqueue_as_owner(const CaptureState *state, NewMessage *message)
{
	Oid			saved_user;
	int			saved_context;

	/* the inserting role's grant counts, as for an INSERT INTO outbox_message */
	check_kafka_topic("outbox", message->topic);
	topic_grant_check_publish(message->topic);
	GetUserIdAndSecContext(&saved_user, &saved_context);
	SetUserIdAndSecContext(state->extension.owner, saved_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	(void) enqueue_message(state->extension.namespace, message);
	SetUserIdAndSecContext(saved_user, saved_context);
}

/*
 * AFTER INSERT OR UPDATE FOR EACH ROW on a captured table: enqueue the
 * message of an inserted row; report an updated one.
 */
Datum
outbox_capture_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	CaptureState *state;
	NewMessage	message;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!(TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) || TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event)))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("outbox_capture_trigger() must be an AFTER INSERT OR UPDATE FOR EACH ROW trigger")));
	state = capture_state(fcinfo, trigdata->tg_relation);
	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		report_update(state, trigdata->tg_relation);
	else
	{
		capture_row_message(state->settings, trigdata->tg_relation, trigdata->tg_trigtuple, &message);
		enqueue_as_owner(state, &message);
	}
	return PointerGetDatum(NULL);
}

/*-------------------------------------------------------------------------
 *
 * inbox_sql.c
 *	  The inbox's SQL functions: inbox_subscribe(), inbox_unsubscribe(),
 *	  inbox_requeue() and inbox_discard(); and the error of a dead letter
 *	  that is not there, theirs and that of outbox_requeue() and
 *	  outbox_discard() (outbox_no_dead_letter()).  (inbox_worker_status() is
 *	  with the other views' functions, in status.c.)
 *
 * The inbox's tables are granted to no one.  These functions are not
 * SECURITY DEFINER, so that they know who calls them: each checks that the
 * caller may act for the subscription's role (is a member of it), and then
 * writes the tables as the extension's owner, with statements that name the
 * extension's schema and take every value as a parameter.  At commit they
 * tell the database's inbox worker (or the launcher, which starts it) to
 * read the subscriptions again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "enqueue.h"
#include "inbox.h"
#include "inbox_slot.h"
#include "pg_compat.h"
#include "settings.h"
#include "statements.h"
#include "topic_grant.h"

PG_FUNCTION_INFO_V1(inbox_subscribe);
PG_FUNCTION_INFO_V1(inbox_unsubscribe);
PG_FUNCTION_INFO_V1(inbox_requeue);
PG_FUNCTION_INFO_V1(inbox_discard);
PG_FUNCTION_INFO_V1(outbox_no_dead_letter);

/* The longest subscription name, in bytes. */
#define MAX_SUBSCRIPTION_NAME 200

/* inbox_subscribe()'s arguments, as the install script declares them. */
typedef enum SubscribeArgument
{
	ARG_NAME,
	ARG_TOPICS,
	ARG_HANDLER,
	ARG_MAX_ATTEMPTS,
	ARG_START_FROM,
	ARG_RUN_AS
} SubscribeArgument;

/* What the transaction is to tell the inbox worker at commit. */
static bool tell_inbox_at_commit = false;
static bool xact_callback_registered = false;

static void
tell_inbox_at_transaction_end(XactEvent event, void *arg)
{
	if (!tell_inbox_at_commit)
		return;
	if (event == XACT_EVENT_COMMIT)
	{
		tell_inbox_at_commit = false;
		inbox_want_worker(MyDatabaseId);
	}
	else if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PREPARE)
		tell_inbox_at_commit = false;
}

/*
 * At commit, the database's inbox worker is to read its subscriptions and
 * retries again, and the launcher to start one if none runs.
 */
static void
tell_inbox_at_commit_of_this_transaction(void)
{
	if (!xact_callback_registered)
	{
		RegisterXactCallback(tell_inbox_at_transaction_end, NULL);
		xact_callback_registered = true;
	}
	tell_inbox_at_commit = true;
}

/*
 * The extension, as each function finds it: its schema (also quoted, for
 * statements) and its owner.
 */
static Oid	extension_schema = InvalidOid;
static const char *extension_schema_quoted = NULL;
static Oid	extension_owner = InvalidOid;

static void
find_extension(void)
{
	Oid			extension;

	extension_schema = extension_namespace(&extension, &extension_owner);
	extension_schema_quoted = quote_identifier(get_namespace_name(extension_schema));
}

/*
 * Run one statement (with %s for the extension's schema, as often as it
 * appears) as the extension's owner.  Returns SPI's result code; the rows,
 * if any, are in SPI_tuptable until SPI_finish().
 */
static int
run_as_owner(const char *sql, int nargs, Oid *types, Datum *values, const char *nulls)
{
	const char *schema = extension_schema_quoted;

	return statement_run_as(extension_owner, psprintf(sql, schema, schema, schema, schema),
							nargs, types, values, nulls);
}

/* Refuse unless the caller may act for the role (is it, a member, or a superuser). */
static void
check_may_act_for(Oid role, const char *action)
{
	if (!has_privs_of_role(GetUserId(), role))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to %s as role \"%s\"", action,
						GetUserNameFromId(role, false)),
				 errhint("Only the role a subscription runs as, its members and superusers may.")));
}

static void
check_subscription_name(text *name)
{
	int			len = VARSIZE_ANY_EXHDR(name);

	if (len == 0 || len > MAX_SUBSCRIPTION_NAME)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("inbox subscription name must be 1 to %d bytes long", MAX_SUBSCRIPTION_NAME)));
}

/* The topics, each one a name Kafka allows; returns them without repeats. */
static ArrayType *
check_topics(ArrayType *topics)
{
	Datum	   *elems;
	bool	   *nulls;
	int			count;
	int			kept = 0;

	if (ARR_NDIM(topics) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("inbox topics must be a one-dimensional array")));
	deconstruct_array(topics, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &count);
	if (count == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("inbox subscription must name at least one topic")));
	for (int i = 0; i < count; i++)
	{
		text	   *topic = nulls[i] ? NULL : DatumGetTextPP(elems[i]);
		bool		repeated = false;

		check_kafka_topic("inbox", topic);
		for (int j = 0; j < kept && !repeated; j++)
		{
			text	   *other = DatumGetTextPP(elems[j]);

			repeated = VARSIZE_ANY_EXHDR(other) == VARSIZE_ANY_EXHDR(topic) &&
				memcmp(VARDATA_ANY(other), VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic)) == 0;
		}
		if (!repeated)
			elems[kept++] = elems[i];
	}
	return construct_array(elems, kept, TEXTOID, -1, false, TYPALIGN_INT);
}

/*
 * A handler is a plain function of one inbox_message, which the role it
 * runs as could call by name: it has USAGE on its schema and may execute
 * it (handler_fault()).  A handler given by its oid is held to the
 * same rights as one given by name, whose look-up needs the schema's USAGE
 * of the caller.
 */
static void
check_handler(Oid handler, Oid run_as)
{
	char	   *why;

	switch (handler_fault(handler, run_as, &why))
	{
		case HANDLER_FITS:
			return;
		case HANDLER_MISSING:
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_FUNCTION),
					 errmsg("%s", why)));
			break;
		case HANDLER_NOT_A_HANDLER:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_FUNCTION_DEFINITION),
					 errmsg("%s", why),
					 errhint("A handler is a function of one argument, not a procedure nor a set-returning function: CREATE FUNCTION apply_order(m inbox_message) RETURNS void ...")));
			break;
		case HANDLER_NOT_PERMITTED:
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("%s", why),
					 errhint("The role a handler runs as needs USAGE on the handler's schema and EXECUTE on the handler, as it would to call the handler itself.")));
			break;
	}
}

/*
 * The role a handler runs as: never a superuser, so that a handler never
 * runs with more rights than the role that could have run it itself.
 */
static void
check_run_as(Oid run_as)
{
	check_may_act_for(run_as, "subscribe");
	if (superuser_arg(run_as))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("an inbox handler may not run as superuser \"%s\"",
						GetUserNameFromId(run_as, false)),
				 errhint("Subscribe with run_as => a role that is no superuser, granted what the handler needs.")));
}

static void
check_start_from(const char *start_from)
{
	if (strcmp(start_from, "earliest") != 0 && strcmp(start_from, "now") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("inbox start_from must be 'earliest' or 'now', not \"%s\"", start_from),
				 errhint("'earliest' reads each partition from its first message, 'now' from the first message stamped after the subscription was made.")));
}

/*
 * Has inbox_subscription the columns that bind a subscription to its
 * handler's oid and record who subscribed (0.8.0 on)?  Until ALTER
 * EXTENSION UPDATE an older schema is served as it is.
 */
static bool
schema_binds_handlers(void)
{
	Oid			table = get_relname_relid("inbox_subscription", extension_schema);

	return OidIsValid(table) && get_attnum(table, "handler_oid") != InvalidAttrNumber;
}

/*
 * Refuse a subscription more than outbox.max_subscriptions: each one is a
 * consumer, a Kafka process of its own with its connections.  The table is
 * locked against another subscribe until commit, so that two at once do
 * not both find room for one.
 */
static void
check_room_for_a_subscription(void)
{
	bool		isnull;
	int64		subscriptions;

	run_as_owner("LOCK TABLE %s.inbox_subscription IN SHARE ROW EXCLUSIVE MODE", 0, NULL, NULL, NULL);
	run_as_owner("SELECT pg_catalog.count(*) FROM %s.inbox_subscription", 0, NULL, NULL, NULL);
	subscriptions = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
												&isnull));
	if (subscriptions >= outbox_max_subscriptions)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("this database has " INT64_FORMAT " inbox subscriptions, as many as outbox.max_subscriptions allows",
						subscriptions),
				 errhint("Unsubscribe one that is no longer needed, or have a superuser raise outbox.max_subscriptions (each subscription runs a Kafka consumer process of its own).")));
}

/*
 * Insert a subscription's row (inbox_subscribe()'s nine values: a schema
 * before 0.8.0 takes the first seven), unless its name is taken or the
 * database has all the subscriptions it may.  From 0.9.0 the table's
 * trigger (inbox_subscription_bind()) records the row as bound in this
 * cluster, as it does a restored row.
 */
static void
insert_subscription(Oid *types, Datum *values, const char *nulls)
{
	SPI_connect();
	if (run_as_owner("SELECT FROM %s.inbox_subscription WHERE name OPERATOR(pg_catalog.=) $1",
					 1, types, values, nulls) == SPI_OK_SELECT && SPI_processed > 0)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("inbox subscription \"%s\" already exists",
						TextDatumGetCString(values[0]))));
	check_room_for_a_subscription();
	if (schema_binds_handlers())
		run_as_owner("INSERT INTO %s.inbox_subscription"
					 " (name, topics, handler, run_as, max_attempts, start_from, search_path,"
					 "  handler_oid, subscribed_by)"
					 " VALUES ($1, $2, $3, $4::pg_catalog.regrole, $5, $6, $7,"
					 "         $8, $9::pg_catalog.regrole)",
					 9, types, values, nulls);
	else
		run_as_owner("INSERT INTO %s.inbox_subscription"
					 " (name, topics, handler, run_as, max_attempts, start_from, search_path)"
					 " VALUES ($1, $2, $3, $4::pg_catalog.regrole, $5, $6, $7)",
					 7, types, values, nulls);
	SPI_finish();
}

Datum
inbox_subscribe(PG_FUNCTION_ARGS)
{
	Oid			types[9] = {TEXTOID, TEXTARRAYOID, TEXTOID, OIDOID, INT4OID, TEXTOID, TEXTOID,
	OIDOID, OIDOID};
	Datum		values[9];
	char		nulls[9] = "         ";
	text	   *name;
	Oid			handler;
	Oid			run_as;
	char	   *start_from;

	for (int arg = ARG_NAME; arg <= ARG_START_FROM; arg++)
		if (PG_ARGISNULL(arg) && arg != ARG_MAX_ATTEMPTS)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("inbox_subscribe: argument %d must not be NULL", arg + 1)));
	find_extension();
	name = PG_GETARG_TEXT_PP(ARG_NAME);
	handler = PG_GETARG_OID(ARG_HANDLER);
	run_as = PG_ARGISNULL(ARG_RUN_AS) ? GetUserId() : PG_GETARG_OID(ARG_RUN_AS);
	start_from = text_to_cstring(PG_GETARG_TEXT_PP(ARG_START_FROM));

	check_subscription_name(name);
	values[1] = PointerGetDatum(check_topics(PG_GETARG_ARRAYTYPE_P(ARG_TOPICS)));
	check_run_as(run_as);
	check_handler(handler, run_as);
	topic_grant_check_subscribe(GetUserId(), DatumGetArrayTypeP(values[1]));
	topic_grant_check_subscribe(run_as, DatumGetArrayTypeP(values[1]));
	if (!PG_ARGISNULL(ARG_MAX_ATTEMPTS) && PG_GETARG_INT32(ARG_MAX_ATTEMPTS) < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("inbox max_attempts must be at least 1")));
	check_start_from(start_from);

	values[0] = PointerGetDatum(name);
	values[2] = CStringGetTextDatum(format_procedure_qualified(handler));
	values[3] = ObjectIdGetDatum(run_as);
	values[4] = PG_ARGISNULL(ARG_MAX_ATTEMPTS) ? (Datum) 0 : PG_GETARG_DATUM(ARG_MAX_ATTEMPTS);
	nulls[4] = PG_ARGISNULL(ARG_MAX_ATTEMPTS) ? 'n' : ' ';
	values[5] = CStringGetTextDatum(start_from);
	values[6] = CStringGetTextDatum(GetConfigOption("search_path", false, false));
	values[7] = ObjectIdGetDatum(handler);
	values[8] = ObjectIdGetDatum(GetUserId());

	insert_subscription(types, values, nulls);
	tell_inbox_at_commit_of_this_transaction();
	PG_RETURN_VOID();
}

/*
 * The role that the row a statement finds (with one parameter, of this
 * type) belongs to, checked that the caller may act for it; InvalidOid if
 * there is no such row.
 */
static Oid
role_of(const char *sql, Oid type, Datum value, const char *action)
{
	bool		isnull;
	Oid			run_as;

	run_as_owner(sql, 1, &type, &value, NULL);
	if (SPI_processed == 0)
		return InvalidOid;
	run_as = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
											&isnull));
	check_may_act_for(run_as, action);
	return run_as;
}

static Oid
subscription_role(text *name, const char *action)
{
	return role_of("SELECT run_as::pg_catalog.oid FROM %s.inbox_subscription"
				   " WHERE name OPERATOR(pg_catalog.=) $1",
				   TEXTOID, PointerGetDatum(name), action);
}

/*
 * An id that no dead letter has, given to requeue or discard: an error, so
 * that a mistyped id, or one requeued or discarded meanwhile, says so.
 * listed_in is the table that lists the dead letters.
 */
static void
report_no_dead_letter(int64 dead_letter_id, const char *listed_in)
{
	ereport(ERROR,
			(errcode(ERRCODE_NO_DATA_FOUND),
			 errmsg("no dead letter has id " INT64_FORMAT, dead_letter_id),
			 errhint("%s lists the messages that can be requeued or discarded.", listed_in)));
}

/* outbox_requeue()'s and outbox_discard()'s error for an unknown id. */
Datum
outbox_no_dead_letter(PG_FUNCTION_ARGS)
{
	report_no_dead_letter(PG_GETARG_INT64(0), "outbox_dead_letter");
	PG_RETURN_NULL();			/* not reached */
}

static Oid
dead_letter_role(Datum dead_letter_id, const char *action)
{
	return role_of("SELECT run_as::pg_catalog.oid FROM %s.inbox_dead_letter"
				   " WHERE id OPERATOR(pg_catalog.=) $1",
				   INT8OID, dead_letter_id, action);
}

Datum
inbox_unsubscribe(PG_FUNCTION_ARGS)
{
	text	   *name;
	bool		discard_pending = !PG_ARGISNULL(1) && PG_GETARG_BOOL(1);
	Oid			types[1] = {TEXTOID};
	Datum		values[1];
	bool		isnull;
	int64		pending;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("inbox subscription name must not be NULL")));
	find_extension();
	name = PG_GETARG_TEXT_PP(0);
	values[0] = PointerGetDatum(name);

	SPI_connect();
	if (!OidIsValid(subscription_role(name, "unsubscribe")))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("inbox subscription \"%s\" does not exist", text_to_cstring(name))));
	run_as_owner("SELECT (SELECT pg_catalog.count(*) FROM %s.inbox_retry"
				 "         WHERE subscription OPERATOR(pg_catalog.=) $1)"
				 " OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM %s.inbox_dead_letter"
				 "         WHERE subscription OPERATOR(pg_catalog.=) $1)",
				 1, types, values, NULL);
	pending = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (pending > 0 && !discard_pending)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("inbox subscription \"%s\" has " INT64_FORMAT " messages waiting to retry or dead-lettered",
						text_to_cstring(name), pending),
				 errhint("Requeue or discard them first, or drop them with the subscription: inbox_unsubscribe(name, discard_pending => true).")));
	run_as_owner("DELETE FROM %s.inbox_dead_letter WHERE subscription OPERATOR(pg_catalog.=) $1",
				 1, types, values, NULL);
	run_as_owner("DELETE FROM %s.inbox_received WHERE subscription OPERATOR(pg_catalog.=) $1",
				 1, types, values, NULL);
	run_as_owner("DELETE FROM %s.inbox_subscription WHERE name OPERATOR(pg_catalog.=) $1",
				 1, types, values, NULL);
	SPI_finish();
	tell_inbox_at_commit_of_this_transaction();
	PG_RETURN_VOID();
}

/*
 * A dead letter goes back to be applied again, behind the messages of its
 * key that wait (if any do), as a retry with no failed attempt.
 */
Datum
inbox_requeue(PG_FUNCTION_ARGS)
{
	Oid			types[1] = {INT8OID};
	Datum		values[1] = {PG_GETARG_DATUM(0)};
	bool		isnull = true;
	Datum		requeued = (Datum) 0;

	find_extension();
	SPI_connect();
	if (!OidIsValid(dead_letter_role(values[0], "requeue")))
		report_no_dead_letter(DatumGetInt64(values[0]), "inbox_dead_letter");
	else
	{
		run_as_owner("WITH d AS (DELETE FROM %s.inbox_dead_letter WHERE id OPERATOR(pg_catalog.=) $1"
					 "           RETURNING *)"
					 " INSERT INTO %s.inbox_retry (subscription, run_as, topic, \"partition\", \"offset\","
					 "     key, headers, payload, message_id, \"timestamp\", next_attempt_at, received_at)"
					 " SELECT d.subscription, d.run_as, d.topic, d.\"partition\", d.\"offset\", d.key,"
					 "     d.headers, d.payload, d.message_id, d.\"timestamp\","
					 "     CASE WHEN EXISTS (SELECT FROM %s.inbox_retry r"
					 "                       WHERE r.subscription OPERATOR(pg_catalog.=) d.subscription"
					 "                         AND r.topic OPERATOR(pg_catalog.=) d.topic"
					 "                         AND r.key OPERATOR(pg_catalog.=) d.key)"
					 "          THEN NULL ELSE pg_catalog.now() END,"
					 "     d.received_at"
					 " FROM d JOIN %s.inbox_subscription s ON s.name OPERATOR(pg_catalog.=) d.subscription"
					 " RETURNING id",
					 1, types, values, NULL);
		if (SPI_processed == 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the subscription of inbox dead letter " INT64_FORMAT " no longer exists",
							DatumGetInt64(values[0])),
					 errhint("Subscribe again under the same name, or discard it with inbox_discard().")));
		requeued = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		tell_inbox_at_commit_of_this_transaction();
	}
	SPI_finish();
	if (isnull)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(requeued);
}

Datum
inbox_discard(PG_FUNCTION_ARGS)
{
	Oid			types[1] = {INT8OID};
	Datum		values[1] = {PG_GETARG_DATUM(0)};
	bool		existed = false;

	find_extension();
	SPI_connect();
	if (OidIsValid(dead_letter_role(values[0], "discard")))
	{
		run_as_owner("DELETE FROM %s.inbox_dead_letter WHERE id OPERATOR(pg_catalog.=) $1",
					 1, types, values, NULL);
		existed = SPI_processed > 0;
	}
	if (!existed)
		report_no_dead_letter(DatumGetInt64(values[0]), "inbox_dead_letter");
	SPI_finish();
	PG_RETURN_BOOL(existed);
}

/*-------------------------------------------------------------------------
 *
 * inbox_store.c
 *	  The inbox worker's SQL: every statement it runs, named in
 *	  statement_defs[] and prepared once per extension schema (a
 *	  statements.c set); its transactions; reading the subscriptions, and
 *	  binding again a handler bound in another cluster (pg_upgrade, a
 *	  restore) or dropped;
 *	  reading and recording where each partition is read from next
 *	  (inbox_offset); the ids received (inbox_received) and their
 *	  forgetting; the messages waiting in inbox_retry, and those moved to
 *	  inbox_dead_letter.  What to do with a message is inbox_apply.c's.
 *
 * The statements are written as the publisher's are (store.c): they name
 * the extension's schema, take every value as a parameter, and bind every
 * operator to pg_catalog's, so that nothing on the worker's search_path
 * could be chosen instead.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "mb/pg_wchar.h"
#include "port/pg_bswap.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "inbox_store.h"
#include "settings.h"
#include "statements.h"

/* The most rows a pass of retries, or of forgetting old ids, takes. */
#define RETRIES_PER_PASS 1000
#define IDS_FORGOTTEN_PER_PASS 10000

/*
 * The most of a handler's error message, or of its context, that
 * inbox_retry and inbox_dead_letter keep, in bytes, the mark of a cut
 * included: a handler that raises a message of megabytes would otherwise
 * have each message it fails on keep a copy.
 */
#define STORED_ERROR_MAX_BYTES 4096
#define STORED_ERROR_CUT_MARK "... (truncated)"

typedef enum InboxStatement
{
	STMT_SUBSCRIPTIONS,
	STMT_POSITIONS,
	STMT_ADD_POSITIONS,
	STMT_ADVANCE_POSITIONS,
	STMT_HELD_KEYS,
	STMT_ADD_NEW_RECEIVED,
	STMT_ADD_RECEIVED,
	STMT_ADD_RETRY,
	STMT_DUE_RETRIES,
	STMT_NEXT_HELD,
	STMT_DELETE_RETRY,
	STMT_FAIL_RETRY,
	STMT_DEAD_LETTER,
	STMT_NEXT_RETRY,
	STMT_FORGET_IDS,
	STMT_FORGET_RECEIVED,
	STMT_COUNT
} InboxStatement;

/* The columns of a message row, as inbox_retry holds them and the handler gets them. */
#define RETRY_COLUMNS \
	"id, topic, \"partition\", \"offset\", key, headers, payload, message_id, \"timestamp\", attempts"

/*
 * A message r of inbox_retry waiting behind its key with no earlier message
 * of its key left: one was requeued (inbox_requeue()) behind messages that
 * a retry, whose snapshot did not see it, then applied.  It is due now.
 */
#define ORPHANED \
	"r.next_attempt_at IS NULL AND NOT EXISTS (" \
	"  SELECT FROM %1$s.inbox_retry e WHERE e.subscription OPERATOR(pg_catalog.=) r.subscription" \
	"     AND e.topic OPERATOR(pg_catalog.=) r.topic AND e.key OPERATOR(pg_catalog.=) r.key" \
	"     AND e.id OPERATOR(pg_catalog.<) r.id)"

/*
 * The positions of the two offset statements, from their arrays $2 to $5
 * (position_arrays()), each a partition's row of inbox_offset to insert or
 * update.
 */
#define POSITIONS_FROM_ARRAYS \
	"  FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[]), pg_catalog.unnest($3::pg_catalog.int4[])," \
	"                  pg_catalog.unnest($4::pg_catalog.int8[]), pg_catalog.unnest($5::pg_catalog.int8[]))" \
	"       AS f(topic, p, n, h)" \
	" ON CONFLICT (subscription, topic, \"partition\") DO UPDATE"

/* No function has the handler_oid of row r any more: it was dropped. */
#define HANDLER_GONE(r) \
	"NOT EXISTS (SELECT FROM pg_catalog.pg_proc p" \
	"            WHERE p.oid OPERATOR(pg_catalog.=) " r ".handler_oid)"

/*
 * Bind the subscriptions whose handler_oid means nothing in this cluster,
 * $1 its system identifier: one bound in another cluster (pg_upgrade'd, or
 * restored with its triggers off) to the function its signature names here,
 * or none; one whose function was dropped to none, for good (0 is never
 * bound again by name).  Returns what it did, for the log.  Not a prepared
 * statement: it runs once after an upgrade, and a schema of before 0.9.0,
 * which the others serve, has no handler_bound_in.
 */
#define BIND_HANDLERS_AGAIN \
	"WITH was AS (SELECT name, handler_oid, handler_bound_in FROM %1$s.inbox_subscription)" \
	" UPDATE %1$s.inbox_subscription s" \
	"    SET handler_oid = CASE WHEN s.handler_bound_in OPERATOR(pg_catalog.=) $1" \
	"                           THEN 0::pg_catalog.oid" \
	"                           ELSE coalesce(pg_catalog.to_regprocedure(s.handler)::pg_catalog.oid," \
	"                                         0::pg_catalog.oid) END," \
	"        handler_bound_in = $1" \
	"   FROM was" \
	"  WHERE was.name OPERATOR(pg_catalog.=) s.name" \
	"    AND s.handler_oid OPERATOR(pg_catalog.<>) 0::pg_catalog.oid" \
	"    AND (s.handler_bound_in OPERATOR(pg_catalog.<>) $1 OR " HANDLER_GONE("s") ")" \
	" RETURNING s.name, s.handler, s.handler_oid, was.handler_oid," \
	"           was.handler_bound_in OPERATOR(pg_catalog.<>) $1, was.handler_bound_in"

/* The column of STMT_SUBSCRIPTIONS that says a row must be bound again. */
#define SUBSCRIPTION_NEEDS_BINDING 11

/* A message of inbox_retry whose next attempt is due. */
#define DUE_NOW \
	"(r.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp() OR " ORPHANED ")"

/*
 * The statements are planned once (PLAN_ONCE), for any values: each is an
 * insert, an upsert or a probe of the index it is written for, whatever
 * the tables' statistics say, and at a thousand messages a second, in
 * batches of a few, planning them anew for each batch cost more than
 * running them.  Forgetting old ids, a scan of a range of received_at, is
 * planned for its values.
 */
static const StatementDef statement_defs[STMT_COUNT] = {
	/*
	 * handler_oid and subscribed_by are read from the row as jsonb (made
	 * once a row), so that
	 * the statement also reads a schema of before 0.8.0, which has neither:
	 * until ALTER EXTENSION UPDATE binds them, its handlers are found by
	 * their signature and its subscriptions' roles stand for who subscribed.
	 * So is handler_bound_in (0.9.0 on): the last column says whether the
	 * row must be bound again (bind_handlers_again()), $1 being this
	 * cluster's system identifier.
	 */
	[STMT_SUBSCRIPTIONS] = {
		"read the subscriptions",
		"SELECT name, topics, handler, run_as::pg_catalog.oid,"
		"       coalesce(max_attempts, 0), start_from OPERATOR(pg_catalog.=) 'earliest',"
		"       created_at, search_path,"
		"       coalesce(b.handler_oid, pg_catalog.to_regprocedure(handler)::pg_catalog.oid,"
		"                0::pg_catalog.oid),"
		"       coalesce(b.subscribed_by, run_as::pg_catalog.oid),"
		"       b.bound_in IS NOT NULL AND b.handler_oid OPERATOR(pg_catalog.<>) 0::pg_catalog.oid"
		"       AND (b.bound_in OPERATOR(pg_catalog.<>) $1 OR " HANDLER_GONE("b") ")"
		"  FROM %1$s.inbox_subscription s,"
		"       LATERAL (SELECT pg_catalog.to_jsonb(s) AS r) j,"
		"       LATERAL (SELECT (j.r OPERATOR(pg_catalog.->>) 'handler_oid')::pg_catalog.oid AS handler_oid,"
		"                       (j.r OPERATOR(pg_catalog.->>) 'handler_bound_in')::pg_catalog.int8 AS bound_in,"
		"                       (j.r OPERATOR(pg_catalog.->>) 'subscribed_by')"
		"                           ::pg_catalog.regrole::pg_catalog.oid AS subscribed_by) b"
		" ORDER BY name",
		1, {INT8OID}, PLAN_ONCE
	},
	[STMT_POSITIONS] = {
		"read the offsets",
		"SELECT topic, \"partition\", next_offset, coalesce(high_watermark, -1)"
		"  FROM %1$s.inbox_offset WHERE subscription OPERATOR(pg_catalog.=) $1",
		1, {TEXTOID}, PLAN_ONCE
	},
	/* the partitions a consumer was assigned: where each starts, unless known */
	[STMT_ADD_POSITIONS] = {
		"record the partitions assigned",
		"INSERT INTO %1$s.inbox_offset AS o"
		"       (subscription, topic, \"partition\", next_offset, high_watermark)"
		"SELECT $1, f.topic, f.p, f.n, CASE WHEN f.h OPERATOR(pg_catalog.>=) 0 THEN f.h END"
		POSITIONS_FROM_ARRAYS
		"   SET high_watermark = coalesce(EXCLUDED.high_watermark, o.high_watermark)",
		5, {TEXTOID, TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID, INT8ARRAYOID}, PLAN_ONCE
	},
	[STMT_ADVANCE_POSITIONS] = {
		"record the offsets",
		"INSERT INTO %1$s.inbox_offset AS o"
		"       (subscription, topic, \"partition\", next_offset, high_watermark, last_applied_at)"
		"SELECT $1, f.topic, f.p, f.n, CASE WHEN f.h OPERATOR(pg_catalog.>=) 0 THEN f.h END, pg_catalog.clock_timestamp()"
		POSITIONS_FROM_ARRAYS
		"   SET next_offset = EXCLUDED.next_offset,"
		"       high_watermark = coalesce(EXCLUDED.high_watermark, o.high_watermark),"
		"       last_applied_at = EXCLUDED.last_applied_at",
		5, {TEXTOID, TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID, INT8ARRAYOID}, PLAN_ONCE
	},
	/*
	 * The ids of the batch go into inbox_received before its handlers run
	 * (in the same transaction).  First as if none were a duplicate: a
	 * plain insert, whose look into the primary key for its leaf is also
	 * the check that the id is new.  If one is a duplicate, that fails, and
	 * they go in again without the ids inbox_received holds, nor the repeats
	 * of an id within the batch, and with the ids inserted returned.
	 */
	[STMT_ADD_NEW_RECEIVED] = {
		"record the messages received",
		"INSERT INTO %1$s.inbox_received (subscription, message_id)"
		"SELECT $1, pg_catalog.unnest($2::pg_catalog.uuid[])",
		2, {TEXTOID, UUIDARRAYOID}, PLAN_ONCE
	},
	[STMT_ADD_RECEIVED] = {
		"record the messages received, but for duplicates",
		"INSERT INTO %1$s.inbox_received (subscription, message_id)"
		"SELECT $1, pg_catalog.unnest($2::pg_catalog.uuid[])"
		" ON CONFLICT DO NOTHING RETURNING message_id",
		2, {TEXTOID, UUIDARRAYOID}, PLAN_ONCE
	},
	[STMT_HELD_KEYS] = {
		"look for keys held back",
		"SELECT DISTINCT k.topic, k.key"
		"  FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[]), pg_catalog.unnest($3::pg_catalog.text[]))"
		"       AS k(topic, key),"
		"       LATERAL (SELECT FROM %1$s.inbox_retry r"
		"                 WHERE r.subscription OPERATOR(pg_catalog.=) $1"
		"                   AND r.topic OPERATOR(pg_catalog.=) k.topic"
		"                   AND r.key OPERATOR(pg_catalog.=) k.key LIMIT 1) AS held",
		3, {TEXTOID, TEXTARRAYOID, TEXTARRAYOID}, PLAN_ONCE
	},
	/* $11: the delay before the next attempt in ms, NULL to wait behind its key */
	[STMT_ADD_RETRY] = {
		"put a message in inbox_retry",
		"INSERT INTO %1$s.inbox_retry (subscription, run_as, topic, \"partition\", \"offset\","
		"       key, headers, payload, message_id, \"timestamp\", attempts, next_attempt_at,"
		"       failed_at, sqlstate, error, error_context)"
		"VALUES ($1, $2::pg_catalog.regrole, $3, $4, $5, $6, $7, $8, $9, $10,"
		"        CASE WHEN $11 IS NULL THEN 0 ELSE 1 END,"
		"        pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)"
		"            ($11::pg_catalog.float8 OPERATOR(pg_catalog.*) interval '1 millisecond'),"
		"        CASE WHEN $11 IS NOT NULL THEN pg_catalog.clock_timestamp() END, $12, $13, $14)"
		" RETURNING id",
		14, {TEXTOID, OIDOID, TEXTOID, INT4OID, INT8OID, TEXTOID, JSONBOID, BYTEAOID, UUIDOID,
		TIMESTAMPTZOID, INT8OID, TEXTOID, TEXTOID, TEXTOID}, PLAN_ONCE
	},
	[STMT_DUE_RETRIES] = {
		"find the retries due",
		"SELECT " RETRY_COLUMNS " FROM %1$s.inbox_retry r"
		" WHERE subscription OPERATOR(pg_catalog.=) $1 AND " DUE_NOW
		" ORDER BY next_attempt_at NULLS FIRST, id LIMIT $2",
		2, {TEXTOID, INT4OID}, PLAN_ONCE
	},
	[STMT_NEXT_HELD] = {
		"find the next message of a key",
		"SELECT " RETRY_COLUMNS " FROM %1$s.inbox_retry"
		" WHERE subscription OPERATOR(pg_catalog.=) $1 AND topic OPERATOR(pg_catalog.=) $2"
		"   AND key OPERATOR(pg_catalog.=) $3 AND id OPERATOR(pg_catalog.>) $4"
		" ORDER BY id LIMIT 1",
		4, {TEXTOID, TEXTOID, TEXTOID, INT8OID}, PLAN_ONCE
	},
	[STMT_DELETE_RETRY] = {
		"delete a message applied from inbox_retry",
		"DELETE FROM %1$s.inbox_retry WHERE id OPERATOR(pg_catalog.=) $1",
		1, {INT8OID}, PLAN_ONCE
	},
	[STMT_FAIL_RETRY] = {
		"schedule a message's next attempt",
		"UPDATE %1$s.inbox_retry"
		"   SET attempts = $2, failed_at = pg_catalog.clock_timestamp(),"
		"       next_attempt_at = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+)"
		"           ($3::pg_catalog.float8 OPERATOR(pg_catalog.*) interval '1 millisecond'),"
		"       sqlstate = $4, error = $5, error_context = $6"
		" WHERE id OPERATOR(pg_catalog.=) $1",
		6, {INT8OID, INT4OID, INT8OID, TEXTOID, TEXTOID, TEXTOID}, PLAN_ONCE
	},
	[STMT_DEAD_LETTER] = {
		"move a message to inbox_dead_letter",
		"WITH r AS (DELETE FROM %1$s.inbox_retry WHERE id OPERATOR(pg_catalog.=) $1 RETURNING *)"
		" INSERT INTO %1$s.inbox_dead_letter (id, subscription, run_as, topic, \"partition\","
		"        \"offset\", key, headers, payload, message_id, \"timestamp\", attempts, received_at,"
		"        sqlstate, error, error_context)"
		" SELECT id, subscription, run_as, topic, \"partition\", \"offset\", key, headers, payload,"
		"        message_id, \"timestamp\", $2, received_at, $3, $4, $5 FROM r",
		5, {INT8OID, INT4OID, TEXTOID, TEXTOID, TEXTOID}, PLAN_ONCE
	},
	[STMT_NEXT_RETRY] = {
		"find the next retry",
		"SELECT CASE WHEN EXISTS (SELECT FROM %1$s.inbox_retry r"
		"                          WHERE subscription OPERATOR(pg_catalog.=) $1 AND " ORPHANED ")"
		"            THEN 0"
		"            ELSE (extract(epoch FROM (pg_catalog.min(next_attempt_at) OPERATOR(pg_catalog.-)"
		"                                      pg_catalog.clock_timestamp()))"
		"                  OPERATOR(pg_catalog.*) 1000::pg_catalog.numeric)::pg_catalog.int8 END"
		"  FROM %1$s.inbox_retry"
		" WHERE subscription OPERATOR(pg_catalog.=) $1 AND next_attempt_at IS NOT NULL",
		1, {TEXTOID}, PLAN_ONCE
	},
	[STMT_FORGET_IDS] = {
		"forget old message ids",
		"DELETE FROM %1$s.inbox_received WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
		"  SELECT ctid FROM %1$s.inbox_received"
		"   WHERE received_at OPERATOR(pg_catalog.<) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)"
		"         ($1::pg_catalog.float8 OPERATOR(pg_catalog.*) interval '1 second'))"
		"   LIMIT $2))",
		2, {INT4OID, INT4OID}, PLAN_EACH_TIME
	},
	/* the ids of messages left for the subscription's next turn (inbox_apply.c) */
	[STMT_FORGET_RECEIVED] = {
		"forget the ids of messages left for later",
		"DELETE FROM %1$s.inbox_received"
		" WHERE subscription OPERATOR(pg_catalog.=) $1"
		"   AND message_id OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.uuid[])",
		2, {TEXTOID, UUIDARRAYOID}, PLAN_ONCE
	},
};

static StatementSet statements = {statement_defs, STMT_COUNT};

/*
 * An error's text as it is stored: at most STORED_ERROR_MAX_BYTES, cut at a
 * character's end and marked as cut if it was longer.
 */
static Datum
stored_error_text(const char *error)
{
	int			len = strlen(error);
	int			kept;

	if (len <= STORED_ERROR_MAX_BYTES)
		return CStringGetTextDatum(error);
	kept = pg_mbcliplen(error, len, STORED_ERROR_MAX_BYTES - strlen(STORED_ERROR_CUT_MARK));
	return CStringGetTextDatum(psprintf("%.*s%s", kept, error, STORED_ERROR_CUT_MARK));
}

/* Run a statement of the set; see statement_run(). */
static int
run(InboxStatement stmt, Datum *args, const char *nulls, int expected)
{
	return statement_run(&statements, stmt, args, nulls, expected);
}

/* Strings as a text[] parameter. */
static Datum
text_array(char **strings, int count)
{
	Datum	   *elems = palloc(sizeof(Datum) * Max(count, 1));

	for (int i = 0; i < count; i++)
		elems[i] = CStringGetTextDatum(strings[i]);
	return statement_array(elems, count, TEXTOID);
}

/* Column column of an SPI result's row, as text. */
static char *
column_text(HeapTuple tuple, TupleDesc desc, int column)
{
	return SPI_getvalue(tuple, desc, column);
}

/* Column column of an SPI result's row, as a Datum. */
static Datum
column_datum(HeapTuple tuple, TupleDesc desc, int column, bool *isnull)
{
	return SPI_getbinval(tuple, desc, column, isnull);
}

/*
 * Start a transaction at the current time: a background worker's
 * transactions would all take its start's as their now(), which the
 * handlers and inbox_received.received_at (and so what
 * outbox.inbox_dedup_retention forgets) read.
 */
static void
start_transaction(void)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
}

/*
 * Begin a transaction of the worker's, with SPI and a snapshot; false if
 * the extension has gone.
 */
bool
inbox_begin_transaction(void)
{
	start_transaction();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	if (OidIsValid(statements_find_extension(&statements)))
		return true;
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	return false;
}

/*
 * In a PG_CATCH() of such a transaction: take the error, in the caller's
 * memory context, and roll the transaction back (its SPI and snapshot with
 * it).  Returns the error.
 */
ErrorData *
inbox_abort_transaction(MemoryContext caller)
{
	ErrorData  *edata;

	MemoryContextSwitchTo(caller);
	edata = CopyErrorData();
	FlushErrorState();
	AbortOutOfAnyTransaction();
	MemoryContextSwitchTo(caller);
	return edata;
}

/* Commit it, and go back to the caller's memory context. */
void
inbox_commit_transaction(MemoryContext caller)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	MemoryContextSwitchTo(caller);
}

/*
 * The schema of the extension, if it is there at a version with the
 * inbox; else InvalidOid.  In a transaction.
 */
static Oid
inbox_namespace(void)
{
	Oid			extension = InvalidOid;
	Oid			namespace = extension_namespace(&extension, NULL);

	if (OidIsValid(namespace) && OidIsValid(get_relname_relid("inbox_subscription", namespace)))
		return namespace;
	return InvalidOid;
}

/*
 * Is the extension there, at a version with the inbox?  Leaves the
 * caller's memory context current.
 */
bool
inbox_extension_ready(void)
{
	MemoryContext caller = CurrentMemoryContext;
	bool		ready;

	start_transaction();
	ready = OidIsValid(inbox_namespace());
	CommitTransactionCommand();
	MemoryContextSwitchTo(caller);
	return ready;
}

/*
 * Does the database have an inbox subscription?  For its publisher, as it
 * starts (after a server restart, say) and now and then while no inbox
 * worker is wanted (after a restore), so that the launcher starts the
 * inbox worker too.
 */
bool
inbox_subscriptions_exist(void)
{
	MemoryContext caller = CurrentMemoryContext;
	Oid			namespace;
	bool		exist = false;

	start_transaction();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	namespace = inbox_namespace();
	if (OidIsValid(namespace))
		exist = SPI_execute(psprintf("SELECT FROM %s.inbox_subscription LIMIT 1",
									 quote_identifier(get_namespace_name(namespace))),
							true, 1) == SPI_OK_SELECT && SPI_processed > 0;
	inbox_commit_transaction(caller);
	return exist;
}

/* A subscription from a row of STMT_SUBSCRIPTIONS, in the current memory context. */
static InboxSubscription *
subscription_from_row(HeapTuple t, TupleDesc d)
{
	InboxSubscription *s = palloc0(sizeof(InboxSubscription));
	bool		isnull;
	Datum	   *topics;

	s->name = column_text(t, d, 1);
	deconstruct_array(DatumGetArrayTypeP(column_datum(t, d, 2, &isnull)), TEXTOID, -1, false,
					  TYPALIGN_INT, &topics, NULL, &s->topic_count);
	s->topics = palloc(sizeof(char *) * s->topic_count);
	for (int i = 0; i < s->topic_count; i++)
		s->topics[i] = TextDatumGetCString(topics[i]);
	s->handler = column_text(t, d, 3);
	s->run_as = DatumGetObjectId(column_datum(t, d, 4, &isnull));
	s->max_attempts = DatumGetInt32(column_datum(t, d, 5, &isnull));
	s->from_earliest = DatumGetBool(column_datum(t, d, 6, &isnull));
	s->created_at = DatumGetTimestampTz(column_datum(t, d, 7, &isnull));
	s->search_path = column_text(t, d, 8);
	s->handler_oid = DatumGetObjectId(column_datum(t, d, 9, &isnull));
	s->subscribed_by = DatumGetObjectId(column_datum(t, d, 10, &isnull));
	return s;
}

/* Does a subscription just read need bind_handlers_again()? */
static bool
some_subscription_needs_binding(void)
{
	bool		isnull;

	for (uint64 row = 0; row < SPI_processed; row++)
		if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc,
									   SUBSCRIPTION_NEEDS_BINDING, &isnull)))
			return true;
	return false;
}

/* Say in the log what bind_handlers_again() did to one subscription. */
static void
log_binding(HeapTuple t, TupleDesc d)
{
	bool		isnull;
	char	   *name = column_text(t, d, 1);
	char	   *handler = column_text(t, d, 2);
	Oid			now_oid = DatumGetObjectId(column_datum(t, d, 3, &isnull));
	Oid			was_oid = DatumGetObjectId(column_datum(t, d, 4, &isnull));
	bool		moved = DatumGetBool(column_datum(t, d, 5, &isnull));

	if (!moved)
		ereport(LOG,
				(errmsg("inbox subscription \"%s\": its handler %s (oid %u) was dropped; the subscription waits, bound to no function",
						name, handler, was_oid),
				 errdetail("A function made later under its name is never called: unsubscribe, and subscribe again to use one.")));
	else if (OidIsValid(now_oid))
		ereport(LOG,
				(errmsg("inbox subscription \"%s\" was bound in another cluster (system identifier %s): its handler %s is bound again, to oid %u (was %u)",
						name, column_text(t, d, 6), handler, now_oid, was_oid),
				 errdetail("pg_upgrade and a restore give functions new oids; the handler is found again by its signature.")));
	else
		ereport(LOG,
				(errmsg("inbox subscription \"%s\" was bound in another cluster (system identifier %s) and its handler %s does not exist in this one; the subscription waits",
						name, column_text(t, d, 6), handler)));
}

/*
 * Bind again, in the worker's transaction, the subscriptions whose
 * handler_oid means nothing here (BIND_HANDLERS_AGAIN), and say so in the
 * log, once: the row no longer needs it afterwards.  Only after a read
 * found one, so that the worker does not lock inbox_subscription against
 * inbox_subscribe() otherwise.
 */
static void
bind_handlers_again(Datum system_identifier)
{
	Oid			types[1] = {INT8OID};
	const char *schema = quote_identifier(get_namespace_name(statements.namespace));
	int			rc = SPI_execute_with_args(psprintf(BIND_HANDLERS_AGAIN, schema), 1, types,
										   &system_identifier, NULL, false, 0);

	if (rc != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "outbox: could not bind the inbox handlers again: %s",
			 SPI_result_code_string(rc));
	for (uint64 row = 0; row < SPI_processed; row++)
		log_binding(SPI_tuptable->vals[row], SPI_tuptable->tupdesc);
}

/*
 * The subscriptions, in the caller's memory context; NIL if the extension
 * has gone.  Those whose handler must be bound again are, first.
 */
List *
inbox_read_subscriptions(void)
{
	MemoryContext caller = CurrentMemoryContext;
	List	   *subscriptions = NIL;
	Datum		system_identifier = Int64GetDatum((int64) GetSystemIdentifier());

	if (!inbox_begin_transaction())
		return NIL;
	run(STMT_SUBSCRIPTIONS, &system_identifier, NULL, SPI_OK_SELECT);
	if (some_subscription_needs_binding())
	{
		bind_handlers_again(system_identifier);
		run(STMT_SUBSCRIPTIONS, &system_identifier, NULL, SPI_OK_SELECT);
	}
	for (uint64 row = 0; row < SPI_processed; row++)
	{
		MemoryContext spi = MemoryContextSwitchTo(caller);

		subscriptions = lappend(subscriptions,
								subscription_from_row(SPI_tuptable->vals[row], SPI_tuptable->tupdesc));
		MemoryContextSwitchTo(spi);
	}
	inbox_commit_transaction(caller);
	return subscriptions;
}

/* Where the subscription's partitions are read from next, as recorded. */
List *
inbox_read_positions(const InboxSubscription *s)
{
	MemoryContext caller = CurrentMemoryContext;
	Datum		args[1] = {CStringGetTextDatum(s->name)};
	List	   *positions = NIL;

	if (!inbox_begin_transaction())
		return NIL;
	run(STMT_POSITIONS, args, NULL, SPI_OK_SELECT);
	for (uint64 row = 0; row < SPI_processed; row++)
	{
		HeapTuple	t = SPI_tuptable->vals[row];
		TupleDesc	d = SPI_tuptable->tupdesc;
		MemoryContext spi = MemoryContextSwitchTo(caller);
		PartitionPosition *p = palloc(sizeof(PartitionPosition));
		bool		isnull;

		p->topic = column_text(t, d, 1);
		p->partition = DatumGetInt32(column_datum(t, d, 2, &isnull));
		p->next_offset = DatumGetInt64(column_datum(t, d, 3, &isnull));
		p->high_watermark = DatumGetInt64(column_datum(t, d, 4, &isnull));
		positions = lappend(positions, p);
		MemoryContextSwitchTo(spi);
	}
	inbox_commit_transaction(caller);
	return positions;
}

/* The positions' columns as the offset statements take them: $2 to $5. */
static void
position_arrays(List *positions, Datum *args)
{
	int			count = list_length(positions);
	char	  **topics = palloc(sizeof(char *) * Max(count, 1));
	Datum	   *partitions = palloc(sizeof(Datum) * Max(count, 1));
	Datum	   *offsets = palloc(sizeof(Datum) * Max(count, 1));
	Datum	   *watermarks = palloc(sizeof(Datum) * Max(count, 1));
	int			i = 0;
	ListCell   *lc;

	foreach(lc, positions)
	{
		PartitionPosition *p = lfirst(lc);

		topics[i] = p->topic;
		partitions[i] = Int32GetDatum(p->partition);
		offsets[i] = Int64GetDatum(p->next_offset);
		watermarks[i] = Int64GetDatum(p->high_watermark);
		i++;
	}
	args[1] = text_array(topics, count);
	args[2] = statement_array(partitions, count, INT4OID);
	args[3] = statement_array(offsets, count, INT8OID);
	args[4] = statement_array(watermarks, count, INT8OID);
}

/*
 * Record the partitions a consumer was assigned, each with where it
 * starts, unless inbox_offset knows where it is read from already: so
 * inbox_status lists every partition, and a start at "now" is kept.
 */
void
inbox_record_positions(const InboxSubscription *s, List *positions)
{
	MemoryContext caller = CurrentMemoryContext;
	Datum		args[5];

	if (positions == NIL || !inbox_begin_transaction())
		return;
	args[0] = CStringGetTextDatum(s->name);
	position_arrays(positions, args);
	run(STMT_ADD_POSITIONS, args, NULL, SPI_OK_INSERT);
	inbox_commit_transaction(caller);
}

/*
 * A batch's statements, in its transaction.
 */

/*
 * Ids in their order in inbox_received's key.  Inserted in that order, the
 * ids of one batch from the outbox (version 7, time first: mostly above
 * every id received before) go to the index's rightmost page one after the
 * other, where a B-tree insert needs no descent from the root.
 */
static int
compare_ids(const void *a, const void *b)
{
	const unsigned char *x = DatumGetUUIDP(*(const Datum *) a)->data;
	const unsigned char *y = DatumGetUUIDP(*(const Datum *) b)->data;
	uint64		x_high;
	uint64		y_high;

	memcpy(&x_high, x, sizeof(x_high));
	memcpy(&y_high, y, sizeof(y_high));
	x_high = pg_ntoh64(x_high);
	y_high = pg_ntoh64(y_high);

	/* the first 8 bytes, as one big-endian number, nearly always decide */
	if (x_high != y_high)
		return x_high < y_high ? -1 : 1;
	return memcmp(x + 8, y + 8, UUID_LEN - 8);
}

/* Insert all the ids as new; run_in_subtransaction()'s function. */
static void
insert_all_as_new(void *args)
{
	run(STMT_ADD_NEW_RECEIVED, args, NULL, SPI_OK_INSERT);
}

/*
 * Insert the batch's ids into inbox_received in a subtransaction, as if none
 * were a duplicate; false (and nothing inserted) if one was.
 */
static bool
insert_if_all_new(Datum *args)
{
	ErrorData  *error = run_in_subtransaction(insert_all_as_new, args);

	if (error && error->sqlerrcode != ERRCODE_UNIQUE_VIOLATION)
		ReThrowError(error);
	return error == NULL;
}

/*
 * Insert the ids into inbox_received, in their order there.  Returns true
 * if none was there before, nor repeated: all are inserted, in a
 * subtransaction (a duplicate rolls it back).  Otherwise only the new ones
 * are inserted, and *inserted points to them, *inserted_count of them, in
 * SPI's memory.
 */
bool
inbox_insert_received(const InboxSubscription *s, Datum *ids, int count,
					  pg_uuid_t ***inserted, uint64 *inserted_count)
{
	Datum		args[2];

	qsort(ids, count, sizeof(Datum), compare_ids);
	args[0] = CStringGetTextDatum(s->name);
	args[1] = statement_array(ids, count, UUIDOID);
	if (insert_if_all_new(args))
		return true;

	run(STMT_ADD_RECEIVED, args, NULL, SPI_OK_INSERT_RETURNING);
	*inserted_count = SPI_processed;
	*inserted = palloc(sizeof(pg_uuid_t *) * Max(SPI_processed, 1));
	for (uint64 row = 0; row < SPI_processed; row++)
	{
		bool		isnull;

		(*inserted)[row] = DatumGetUUIDP(column_datum(SPI_tuptable->vals[row],
													   SPI_tuptable->tupdesc, 1, &isnull));
	}
	return false;
}

/* Forget the ids received of messages not applied yet (in this transaction). */
void
inbox_forget_received(const InboxSubscription *s, Datum *ids, int count)
{
	Datum		args[2];

	args[0] = CStringGetTextDatum(s->name);
	args[1] = statement_array(ids, count, UUIDOID);
	run(STMT_FORGET_RECEIVED, args, NULL, SPI_OK_DELETE);
}

/*
 * Of these (topic, key) pairs, those that inbox_retry holds a message of,
 * for the subscription: a list of InboxMessages with only topic and key.
 */
List *
inbox_held_keys(const InboxSubscription *s, char **topics, char **keys, int count)
{
	Datum		args[3];
	List	   *held = NIL;

	args[0] = CStringGetTextDatum(s->name);
	args[1] = text_array(topics, count);
	args[2] = text_array(keys, count);
	run(STMT_HELD_KEYS, args, NULL, SPI_OK_SELECT);
	for (uint64 row = 0; row < SPI_processed; row++)
	{
		InboxMessage *m = palloc0(sizeof(InboxMessage));

		m->topic = column_text(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, 1);
		m->key = column_text(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, 2);
		held = lappend(held, m);
	}
	return held;
}

/* Record where the subscription's partitions are read from next. */
void
inbox_advance_positions(const InboxSubscription *s, List *positions)
{
	Datum		args[5];

	args[0] = CStringGetTextDatum(s->name);
	position_arrays(positions, args);
	run(STMT_ADVANCE_POSITIONS, args, NULL, SPI_OK_INSERT);
}

/*
 * Put a message in inbox_retry: failed (its first attempt, with the
 * handler's error) or, with failure NULL, held back (no attempt yet,
 * waiting behind its key).  Returns its id there.
 */
int64
inbox_add_retry(const InboxSubscription *s, const MessageRow *row,
				const HandlerError *failure)
{
	Datum		args[14];
	char		nulls[14];
	bool		isnull;

	memset(nulls, ' ', sizeof(nulls));
	args[0] = row->values[COL_SUBSCRIPTION];
	args[1] = ObjectIdGetDatum(s->run_as);
	for (int col = COL_TOPIC; col <= COL_TIMESTAMP; col++)
	{
		args[col + 1] = row->values[col];
		nulls[col + 1] = row->nulls[col] ? 'n' : ' ';
	}
	args[10] = Int64GetDatum(failure ? retry_backoff_ms(0) : 0);
	nulls[10] = failure ? ' ' : 'n';
	args[11] = failure ? CStringGetTextDatum(failure->sqlstate) : (Datum) 0;
	args[12] = failure ? stored_error_text(failure->message) : (Datum) 0;
	args[13] = failure && failure->context ? stored_error_text(failure->context) : (Datum) 0;
	nulls[11] = nulls[12] = failure ? ' ' : 'n';
	nulls[13] = failure && failure->context ? ' ' : 'n';
	run(STMT_ADD_RETRY, args, nulls, SPI_OK_INSERT_RETURNING);
	return DatumGetInt64(column_datum(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/* Move a message of inbox_retry, out of attempts, to inbox_dead_letter. */
void
inbox_dead_letter(int64 retry_id, int attempts, const HandlerError *e)
{
	Datum		args[5] = {Int64GetDatum(retry_id), Int32GetDatum(attempts),
		CStringGetTextDatum(e->sqlstate), stored_error_text(e->message),
	e->context ? stored_error_text(e->context) : (Datum) 0};
	char		nulls[5] = {' ', ' ', ' ', ' ', e->context ? ' ' : 'n'};

	run(STMT_DEAD_LETTER, args, nulls, SPI_OK_INSERT);
}

/*
 * Retries.
 */

/* Copy the row of RETRY_COLUMNS of SPI_tuptable, in the current context. */
static RetryRow *
copy_retry_row(const InboxSubscription *s, uint64 index)
{
	HeapTuple	t = SPI_tuptable->vals[index];
	TupleDesc	d = SPI_tuptable->tupdesc;
	RetryRow   *r = palloc(sizeof(RetryRow));
	bool		isnull;

	r->id = DatumGetInt64(column_datum(t, d, 1, &isnull));
	r->row.values[COL_SUBSCRIPTION] = CStringGetTextDatum(s->name);
	r->row.nulls[COL_SUBSCRIPTION] = false;
	for (int col = COL_TOPIC; col <= COL_TIMESTAMP; col++)
	{
		Form_pg_attribute att = TupleDescAttr(d, col);	/* column col + 1 */
		Datum		v = column_datum(t, d, col + 1, &r->row.nulls[col]);

		r->row.values[col] = r->row.nulls[col] ? (Datum) 0 :
			datumCopy(v, att->attbyval, att->attlen);
	}
	r->attempts = DatumGetInt32(column_datum(t, d, 10, &isnull));
	return r;
}

/* The message after r of r's key in inbox_retry, or NULL. */
RetryRow *
inbox_next_retry_of_key(const InboxSubscription *s, const RetryRow *r)
{
	Datum		args[4];

	if (r->row.nulls[COL_KEY])
		return NULL;
	args[0] = CStringGetTextDatum(s->name);
	args[1] = r->row.values[COL_TOPIC];
	args[2] = r->row.values[COL_KEY];
	args[3] = Int64GetDatum(r->id);
	run(STMT_NEXT_HELD, args, NULL, SPI_OK_SELECT);
	return SPI_processed > 0 ? copy_retry_row(s, 0) : NULL;
}

/*
 * The subscription's messages in inbox_retry whose next attempt is due,
 * RETRIES_PER_PASS of them at most, as RetryRows.
 */
List *
inbox_due_retries(const InboxSubscription *s)
{
	Datum		args[2] = {CStringGetTextDatum(s->name), Int32GetDatum(RETRIES_PER_PASS)};
	List	   *due = NIL;

	run(STMT_DUE_RETRIES, args, NULL, SPI_OK_SELECT);
	for (uint64 row = 0; row < SPI_processed; row++)
		due = lappend(due, copy_retry_row(s, row));
	return due;
}

/* A message of inbox_retry was applied: it leaves inbox_retry. */
void
inbox_delete_retry(int64 retry_id)
{
	Datum		id = Int64GetDatum(retry_id);

	run(STMT_DELETE_RETRY, &id, NULL, SPI_OK_DELETE);
}

/* A message of inbox_retry failed again: its next attempt is after a longer wait. */
void
inbox_schedule_next_attempt(const RetryRow *r, const HandlerError *e)
{
	Datum		args[6] = {Int64GetDatum(r->id), Int32GetDatum(r->attempts + 1),
		Int64GetDatum(retry_backoff_ms(r->attempts)),
		CStringGetTextDatum(e->sqlstate), stored_error_text(e->message),
	e->context ? stored_error_text(e->context) : (Datum) 0};
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', e->context ? ' ' : 'n'};

	run(STMT_FAIL_RETRY, args, nulls, SPI_OK_UPDATE);
}

/*
 * Milliseconds until the subscription's next retry is due (0 if one is),
 * or -1 if no message waits in inbox_retry.
 */
long
inbox_ms_until_next_retry(const InboxSubscription *s)
{
	MemoryContext caller = CurrentMemoryContext;
	Datum		args[1] = {CStringGetTextDatum(s->name)};
	bool		isnull = true;
	int64		ms = 0;

	if (!inbox_begin_transaction())
		return -1;
	run(STMT_NEXT_RETRY, args, NULL, SPI_OK_SELECT);
	if (SPI_processed > 0)
		ms = DatumGetInt64(column_datum(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	inbox_commit_transaction(caller);
	return isnull ? -1 : (long) Max(ms, 0);
}

/*
 * Forget the ids received longer ago than outbox.inbox_dedup_retention, at
 * most IDS_FORGOTTEN_PER_PASS of them.  Returns whether there may be more.
 */
bool
inbox_forget_old_ids(void)
{
	MemoryContext caller = CurrentMemoryContext;
	Datum		args[2] = {Int32GetDatum(outbox_inbox_dedup_retention),
	Int32GetDatum(IDS_FORGOTTEN_PER_PASS)};
	int			forgotten;

	if (!inbox_begin_transaction())
		return false;
	forgotten = run(STMT_FORGET_IDS, args, NULL, SPI_OK_DELETE);
	inbox_commit_transaction(caller);
	return forgotten == IDS_FORGOTTEN_PER_PASS;
}

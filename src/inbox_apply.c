/*-------------------------------------------------------------------------
 *
 * inbox_apply.c
 *	  The inbox worker's SQL: apply a batch of messages of one subscription
 *	  in one transaction, retry the messages a handler failed on, and read
 *	  and record where each partition is read from.
 *
 * A batch is applied in one transaction, which also records the messages'
 * ids (inbox_received) and the offset after the last message of each
 * partition (inbox_offset): the handlers' writes and that record commit
 * together or not at all, so after any crash the consumer reads on from the
 * first message whose effects are not committed, and a message that comes
 * twice (by its outbox-message-id) is applied once.
 *
 * Each message goes one of these ways, in the order received:
 *	- a duplicate: its id is in inbox_received, or earlier in the batch;
 *	- held back: an earlier message of its (topic, key) waits in
 *	  inbox_retry, so it waits there too, behind it;
 *	- applied: its handler returned;
 *	- failed: its handler raised an error; its effects are rolled back, and
 *	  it waits in inbox_retry for its next attempt (or, out of attempts,
 *	  goes to inbox_dead_letter), holding back the later messages of its key.
 *
 * A handler is called without a subtransaction, which would cost an xid per
 * message and overflow every snapshot's subtransaction cache; when one
 * raises an error, the whole transaction is rolled back and the batch
 * applied again with a subtransaction for each message from the one that
 * failed on ("guarded"), so that only the failing message's effects go.
 *
 * Handlers run as their subscription's role, in a security-restricted
 * operation (no SET ROLE, no temporary objects), with the search_path the
 * subscription was made with; every setting they change is put back
 * before the worker's own statements run.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/pg_bswap.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "inbox.h"
#include "message.h"
#include "settings.h"
#include "statements.h"
#include "worker_slot.h"

/* The most rows a pass of retries, or of forgetting old ids, takes. */
#define RETRIES_PER_PASS 1000
#define IDS_FORGOTTEN_PER_PASS 10000

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
	[STMT_SUBSCRIPTIONS] = {
		"read the subscriptions",
		"SELECT name, topics, handler, run_as::pg_catalog.oid,"
		"       coalesce(max_attempts, 0), start_from OPERATOR(pg_catalog.=) 'earliest',"
		"       created_at, search_path"
		"  FROM %1$s.inbox_subscription ORDER BY name",
		0, {InvalidOid}, PLAN_ONCE
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
		"  FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[]), pg_catalog.unnest($3::pg_catalog.int4[]),"
		"                  pg_catalog.unnest($4::pg_catalog.int8[]), pg_catalog.unnest($5::pg_catalog.int8[]))"
		"       AS f(topic, p, n, h)"
		" ON CONFLICT (subscription, topic, \"partition\") DO UPDATE"
		"   SET high_watermark = coalesce(EXCLUDED.high_watermark, o.high_watermark)",
		5, {TEXTOID, TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID, INT8ARRAYOID}, PLAN_ONCE
	},
	[STMT_ADVANCE_POSITIONS] = {
		"record the offsets",
		"INSERT INTO %1$s.inbox_offset AS o"
		"       (subscription, topic, \"partition\", next_offset, high_watermark, last_applied_at)"
		"SELECT $1, f.topic, f.p, f.n, CASE WHEN f.h OPERATOR(pg_catalog.>=) 0 THEN f.h END, pg_catalog.clock_timestamp()"
		"  FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[]), pg_catalog.unnest($3::pg_catalog.int4[]),"
		"                  pg_catalog.unnest($4::pg_catalog.int8[]), pg_catalog.unnest($5::pg_catalog.int8[]))"
		"       AS f(topic, p, n, h)"
		" ON CONFLICT (subscription, topic, \"partition\") DO UPDATE"
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
};

static StatementSet statements = {statement_defs, STMT_COUNT};

/* The columns of inbox_message, in its order. */
typedef enum MessageColumn
{
	COL_SUBSCRIPTION,
	COL_TOPIC,
	COL_PARTITION,
	COL_OFFSET,
	COL_KEY,
	COL_HEADERS,
	COL_PAYLOAD,
	COL_MESSAGE_ID,
	COL_TIMESTAMP,
	NUM_MESSAGE_COLUMNS
} MessageColumn;

/* A message as the handler gets it: inbox_message's columns. */
typedef struct MessageRow
{
	Datum		values[NUM_MESSAGE_COLUMNS];
	bool		nulls[NUM_MESSAGE_COLUMNS];
} MessageRow;

/* How a message of a batch went. */
typedef enum MessageFate
{
	FATE_APPLIED,
	FATE_DUPLICATE,
	FATE_HELD,
	FATE_FAILED
} MessageFate;

/* What a handler's error says, for inbox_retry and inbox_dead_letter. */
typedef struct HandlerError
{
	char	   *sqlstate;
	char	   *message;
	char	   *context;
} HandlerError;

/* A subscription's handler, ready to be called in this transaction. */
typedef struct Handler
{
	const InboxSubscription *subscription;
	FmgrInfo	flinfo;
	TupleDesc	desc;			/* inbox_message's */
	MemoryContext call_context; /* reset after each call */
	int			guc_nest_level;
	Oid			saved_user;
	int			saved_context;
} Handler;

/* Run a statement of the set; see statement_run(). */
static int
run(InboxStatement stmt, Datum *args, const char *nulls, int expected)
{
	return statement_run(&statements, stmt, args, nulls, expected);
}

static Datum
text_array(char **strings, int count)
{
	Datum	   *elems = palloc(sizeof(Datum) * Max(count, 1));

	for (int i = 0; i < count; i++)
		elems[i] = CStringGetTextDatum(strings[i]);
	return statement_array(elems, count, TEXTOID);
}


static char *
column_text(HeapTuple tuple, TupleDesc desc, int column)
{
	return SPI_getvalue(tuple, desc, column);
}

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

/* Begin a transaction of the worker's, with SPI and a snapshot; false if the extension has gone. */
static bool
begin_transaction(void)
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

static void
commit_transaction(MemoryContext caller)
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
	commit_transaction(caller);
	return exist;
}

/* The subscriptions, in the caller's memory context; NIL if the extension has gone. */
List *
inbox_read_subscriptions(void)
{
	MemoryContext caller = CurrentMemoryContext;
	List	   *subscriptions = NIL;

	if (!begin_transaction())
		return NIL;
	run(STMT_SUBSCRIPTIONS, NULL, NULL, SPI_OK_SELECT);
	for (uint64 row = 0; row < SPI_processed; row++)
	{
		HeapTuple	t = SPI_tuptable->vals[row];
		TupleDesc	d = SPI_tuptable->tupdesc;
		MemoryContext spi = MemoryContextSwitchTo(caller);
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
		subscriptions = lappend(subscriptions, s);
		MemoryContextSwitchTo(spi);
	}
	commit_transaction(caller);
	return subscriptions;
}

/* Where the subscription's partitions are read from next, as recorded. */
List *
inbox_read_positions(const InboxSubscription *s)
{
	MemoryContext caller = CurrentMemoryContext;
	Datum		args[1] = {CStringGetTextDatum(s->name)};
	List	   *positions = NIL;

	if (!begin_transaction())
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
	commit_transaction(caller);
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

	if (positions == NIL || !begin_transaction())
		return;
	args[0] = CStringGetTextDatum(s->name);
	position_arrays(positions, args);
	run(STMT_ADD_POSITIONS, args, NULL, SPI_OK_INSERT);
	commit_transaction(caller);
}

/*
 * The handler.
 */

/*
 * Get the subscription's handler ready to be called, or say why it cannot
 * be: it was dropped, or its role was, became a superuser or lost EXECUTE
 * on it (the direct call below checks no privilege).
 */
static bool
handler_open(Handler *h, const InboxSubscription *s, char **why)
{
	Oid			function = DatumGetObjectId(DirectFunctionCall1(to_regprocedure,
																 CStringGetTextDatum(s->handler)));
	Oid		   *argtypes;
	int			nargs;

	*why = NULL;
	if (!OidIsValid(function))
		*why = psprintf("its handler %s does not exist", s->handler);
	else if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(s->run_as)))
		*why = psprintf("its role (oid %u) does not exist", s->run_as);
	else if (superuser_arg(s->run_as))
		*why = psprintf("its role \"%s\" is a superuser, which a handler never runs as",
						GetUserNameFromId(s->run_as, false));
	else if (pg_proc_aclcheck(function, s->run_as, ACL_EXECUTE) != ACLCHECK_OK)
		*why = psprintf("its role \"%s\" may not execute its handler %s",
						GetUserNameFromId(s->run_as, false), s->handler);
	if (*why)
		return false;
	(void) get_func_signature(function, &argtypes, &nargs);
	h->subscription = s;
	fmgr_info(function, &h->flinfo);
	h->desc = lookup_rowtype_tupdesc_copy(argtypes[0], -1);
	BlessTupleDesc(h->desc);
	h->call_context = AllocSetContextCreate(CurrentMemoryContext, "inbox handler call",
											ALLOCSET_DEFAULT_SIZES);
	return true;
}

/*
 * Become the subscription's role, in a security-restricted operation, with
 * its search_path; every setting a handler changes from here on is put
 * back by handler_leave().
 */
static void
handler_enter(Handler *h)
{
	GetUserIdAndSecContext(&h->saved_user, &h->saved_context);
	h->guc_nest_level = NewGUCNestLevel();
	SetUserIdAndSecContext(h->subscription->run_as,
						   h->saved_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	(void) set_config_option("search_path", h->subscription->search_path, PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
}

static void
handler_leave(Handler *h)
{
	AtEOXact_GUC(false, h->guc_nest_level);
	SetUserIdAndSecContext(h->saved_user, h->saved_context);
}

/*
 * Call the handler with one message; what it returns is ignored.  Each call
 * is a statement as statement_timeout sees it (the worker's value: the
 * server's, the database's), as a call from a client would be: a handler
 * that runs longer is cancelled, its message failed, and retried.
 */
static void
handler_call(Handler *h, MessageRow *row)
{
	MemoryContext caller = MemoryContextSwitchTo(h->call_context);
	LOCAL_FCINFO(fcinfo, 1);
	HeapTuple	tuple = heap_form_tuple(h->desc, row->values, row->nulls);

	/* the handler may change statement_timeout: disarm what was armed */
	bool		timed = StatementTimeout > 0;

	InitFunctionCallInfoData(*fcinfo, &h->flinfo, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = HeapTupleGetDatum(tuple);
	fcinfo->args[0].isnull = false;
	if (timed)
		enable_timeout_after(STATEMENT_TIMEOUT, StatementTimeout);
	PG_TRY();
	{
		(void) FunctionCallInvoke(fcinfo);
	}
	PG_FINALLY();
	{
		if (timed)
			disable_timeout(STATEMENT_TIMEOUT, false);
	}
	PG_END_TRY();
	CommandCounterIncrement();
	MemoryContextSwitchTo(caller);
	MemoryContextReset(h->call_context);
}

/* What handler_call_guarded() passes to run_in_subtransaction(). */
typedef struct HandlerCall
{
	Handler    *handler;
	MessageRow *row;
} HandlerCall;

static void
run_handler_call(void *arg)
{
	HandlerCall *call = arg;

	handler_call(call->handler, call->row);
}

/*
 * Call the handler in a subtransaction of its own: returns true if it
 * returned, false with its error if it raised one (its effects then rolled
 * back).
 */
static bool
handler_call_guarded(Handler *h, MessageRow *row, HandlerError *error)
{
	HandlerCall call = {h, row};
	ErrorData  *edata = run_in_subtransaction(run_handler_call, &call);

	if (edata == NULL)
		return true;
	error->sqlstate = pstrdup(unpack_sql_state(edata->sqlerrcode));
	error->message = edata->message;
	error->context = edata->context;
	return false;
}

/*
 * A message's columns.
 */

/* A string as a jsonb value. */
static JsonbValue *
jsonb_string(JsonbValue *v, char *s)
{
	v->type = s ? jbvString : jbvNull;
	if (s)
	{
		v->val.string.val = s;
		v->val.string.len = strlen(s);
	}
	return v;
}

/*
 * The headers as a jsonb object of their values, or NULL if there are none;
 * built as a jsonb value, not parsed from text, which cost more than the
 * rest of the message.  Of a name repeated, the last value is kept.
 */
static Datum
headers_jsonb(const InboxMessage *m, bool *isnull)
{
	JsonbParseState *state = NULL;
	JsonbValue	v;

	*isnull = m->header_count == 0;
	if (*isnull)
		return (Datum) 0;
	(void) pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	for (int i = 0; i < m->header_count; i++)
	{
		(void) pushJsonbValue(&state, WJB_KEY, jsonb_string(&v, m->header_names[i]));
		(void) pushJsonbValue(&state, WJB_VALUE, jsonb_string(&v, m->header_values[i]));
	}
	return JsonbPGetDatum(JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, NULL)));
}

/*
 * The text datums of a batch's subscription name and of its last topic,
 * made once rather than for every message (the consumer gives the messages
 * of one topic the same string).
 */
typedef struct RowTexts
{
	Datum		subscription;
	const char *topic;
	Datum		topic_text;
} RowTexts;

static void
message_row(const InboxSubscription *s, const InboxMessage *m, MessageRow *row, RowTexts *texts)
{
	if (texts->subscription == (Datum) 0)
		texts->subscription = CStringGetTextDatum(s->name);
	if (texts->topic != m->topic)
	{
		texts->topic = m->topic;
		texts->topic_text = CStringGetTextDatum(m->topic);
	}
	memset(row->nulls, 0, sizeof(row->nulls));
	row->values[COL_SUBSCRIPTION] = texts->subscription;
	row->values[COL_TOPIC] = texts->topic_text;
	row->values[COL_PARTITION] = Int32GetDatum(m->partition);
	row->values[COL_OFFSET] = Int64GetDatum(m->offset);
	row->nulls[COL_KEY] = m->key == NULL;
	row->values[COL_KEY] = m->key ? CStringGetTextDatum(m->key) : (Datum) 0;
	row->values[COL_HEADERS] = headers_jsonb(m, &row->nulls[COL_HEADERS]);
	row->nulls[COL_PAYLOAD] = m->value_len < 0;
	if (m->value_len >= 0)
	{
		bytea	   *payload = palloc(VARHDRSZ + m->value_len);

		SET_VARSIZE(payload, VARHDRSZ + m->value_len);
		memcpy(VARDATA(payload), m->value, m->value_len);
		row->values[COL_PAYLOAD] = PointerGetDatum(payload);
	}
	row->nulls[COL_MESSAGE_ID] = !m->has_message_id;
	row->values[COL_MESSAGE_ID] = m->has_message_id ? UUIDPGetDatum(&m->message_id) : (Datum) 0;
	row->nulls[COL_TIMESTAMP] = m->timestamp_ms < 0;
	row->values[COL_TIMESTAMP] = TimestampTzGetDatum(timestamptz_of_unix_epoch_ms(m->timestamp_ms));
}

/*
 * A batch.
 */

/* What applying one batch keeps track of, message by message. */
typedef struct BatchState
{
	const InboxSubscription *subscription;
	InboxBatch *batch;
	MessageRow *rows;
	MessageFate *fates;
	HandlerError *errors;
	RowTexts	texts;
	bool		keys_may_be_held;	/* inbox_retry may hold messages */
	int			guarded_from;	/* a subtransaction for each message from here */
	volatile int calling;		/* the message whose handler runs unguarded, or -1 */
} BatchState;

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
 * Record the batch's ids in inbox_received, and mark the duplicates: the
 * messages whose id it held already, and the later messages of an id
 * repeated within the batch.  A hash table of the ids inserted, so that a
 * batch costs one look per message.
 */
static void
record_received(BatchState *st)
{
	InboxBatch *b = st->batch;
	Datum	   *ids = palloc(sizeof(Datum) * Max(b->count, 1));
	int			count = 0;
	Datum		args[2];
	HASHCTL		ctl;
	HTAB	   *inserted;

	for (int i = 0; i < b->count; i++)
		if (b->messages[i].has_message_id)
			ids[count++] = UUIDPGetDatum(&b->messages[i].message_id);
	if (count == 0)
		return;
	qsort(ids, count, sizeof(Datum), compare_ids);
	args[0] = CStringGetTextDatum(st->subscription->name);
	args[1] = statement_array(ids, count, UUIDOID);
	if (insert_if_all_new(args))
		return;
	run(STMT_ADD_RECEIVED, args, NULL, SPI_OK_INSERT_RETURNING);

	ctl.keysize = ctl.entrysize = sizeof(pg_uuid_t);
	ctl.hcxt = CurrentMemoryContext;
	inserted = hash_create("inbox ids inserted", Max(SPI_processed, 1), &ctl,
						   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	for (uint64 row = 0; row < SPI_processed; row++)
	{
		bool		isnull;

		(void) hash_search(inserted, DatumGetUUIDP(column_datum(SPI_tuptable->vals[row],
																 SPI_tuptable->tupdesc, 1, &isnull)),
						   HASH_ENTER, NULL);
	}
	/* the first message of each id inserted is new; any other a duplicate */
	for (int i = 0; i < b->count; i++)
	{
		bool		found;

		if (!b->messages[i].has_message_id)
			continue;
		(void) hash_search(inserted, &b->messages[i].message_id, HASH_REMOVE, &found);
		if (!found)
			st->fates[i] = FATE_DUPLICATE;
	}
	hash_destroy(inserted);
}

static bool
same_key(const InboxMessage *a, const InboxMessage *b)
{
	return a->key && b->key && strcmp(a->topic, b->topic) == 0 && strcmp(a->key, b->key) == 0;
}

/* Hold back the messages whose key has an earlier message in inbox_retry. */
static void
find_held_keys(BatchState *st)
{
	InboxBatch *b = st->batch;
	char	  **topics = palloc(sizeof(char *) * Max(b->count, 1));
	char	  **keys = palloc(sizeof(char *) * Max(b->count, 1));
	int			count = 0;
	Datum		args[3];

	for (int i = 0; i < b->count; i++)
		if (b->messages[i].key && st->fates[i] != FATE_DUPLICATE)
		{
			topics[count] = b->messages[i].topic;
			keys[count++] = b->messages[i].key;
		}
	if (count == 0)
		return;
	args[0] = CStringGetTextDatum(st->subscription->name);
	args[1] = text_array(topics, count);
	args[2] = text_array(keys, count);
	run(STMT_HELD_KEYS, args, NULL, SPI_OK_SELECT);
	for (uint64 row = 0; row < SPI_processed; row++)
	{
		InboxMessage held = {0};

		held.topic = column_text(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, 1);
		held.key = column_text(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, 2);
		for (int i = 0; i < b->count; i++)
			if (st->fates[i] != FATE_DUPLICATE && same_key(&b->messages[i], &held))
				st->fates[i] = FATE_HELD;
	}
}

/* Hold back the later messages of the batch with the key of message i. */
static void
hold_back_behind(BatchState *st, int i)
{
	for (int j = i + 1; j < st->batch->count; j++)
		if (st->fates[j] == FATE_APPLIED && same_key(&st->batch->messages[j], &st->batch->messages[i]))
			st->fates[j] = FATE_HELD;
}

/* Call the handler for each message to apply, in order. */
static void
call_handlers(BatchState *st, Handler *h)
{
	handler_enter(h);
	for (int i = 0; i < st->batch->count; i++)
	{
		if (st->fates[i] != FATE_APPLIED)
			continue;
		message_row(st->subscription, &st->batch->messages[i], &st->rows[i], &st->texts);
		if (i < st->guarded_from)
		{
			st->calling = i;
			handler_call(h, &st->rows[i]);
			st->calling = -1;
		}
		else if (!handler_call_guarded(h, &st->rows[i], &st->errors[i]))
		{
			st->fates[i] = FATE_FAILED;
			hold_back_behind(st, i);
		}
	}
	handler_leave(h);
}

static int
max_attempts_of(const InboxSubscription *s)
{
	return s->max_attempts > 0 ? s->max_attempts : outbox_max_attempts;
}

/* Move a message of inbox_retry, out of attempts, to inbox_dead_letter. */
static void
dead_letter(int64 retry_id, int attempts, const HandlerError *e)
{
	Datum		args[5] = {Int64GetDatum(retry_id), Int32GetDatum(attempts),
		CStringGetTextDatum(e->sqlstate), CStringGetTextDatum(e->message),
	e->context ? CStringGetTextDatum(e->context) : (Datum) 0};
	char		nulls[5] = {' ', ' ', ' ', ' ', e->context ? ' ' : 'n'};

	run(STMT_DEAD_LETTER, args, nulls, SPI_OK_INSERT);
}

/*
 * Show a handler's failure in inbox_worker.last_error, as the latest error.
 * Not in the server log, which a handler failing on every message would
 * flood: the message's retry or dead letter keeps the error in full.
 */
static void
show_handler_failure(const InboxSubscription *s, const MessageRow *row,
					 const HandlerError *e, bool dead_lettered)
{
	char		message[WORKER_LAST_ERROR_LEN];

	snprintf(message, sizeof(message),
			 "subscription \"%s\": the handler failed on topic \"%s\" partition %d offset %lld (%s): %s",
			 s->name, TextDatumGetCString(row->values[COL_TOPIC]),
			 DatumGetInt32(row->values[COL_PARTITION]),
			 (long long) DatumGetInt64(row->values[COL_OFFSET]),
			 dead_lettered ? "dead-lettered" : "to be retried", e->message);
	worker_record_error(message);
}

/*
 * Put a message of the batch in inbox_retry: failed (its first attempt) or
 * held back (no attempt yet, waiting behind its key).  Returns whether it
 * was dead-lettered instead, out of attempts.
 */
static bool
add_retry(BatchState *st, int i)
{
	const InboxSubscription *s = st->subscription;
	MessageRow *row = &st->rows[i];
	HandlerError *e = &st->errors[i];
	bool		failed = st->fates[i] == FATE_FAILED;
	Datum		args[14];
	char		nulls[14];
	bool		isnull;
	int64		retry_id;

	if (!failed)
		message_row(s, &st->batch->messages[i], row, &st->texts);
	memset(nulls, ' ', sizeof(nulls));
	args[0] = row->values[COL_SUBSCRIPTION];
	args[1] = ObjectIdGetDatum(s->run_as);
	for (int col = COL_TOPIC; col <= COL_TIMESTAMP; col++)
	{
		args[col + 1] = row->values[col];
		nulls[col + 1] = row->nulls[col] ? 'n' : ' ';
	}
	args[10] = Int64GetDatum(failed ? retry_backoff_ms(0) : 0);
	nulls[10] = failed ? ' ' : 'n';
	args[11] = failed ? CStringGetTextDatum(e->sqlstate) : (Datum) 0;
	args[12] = failed ? CStringGetTextDatum(e->message) : (Datum) 0;
	args[13] = failed && e->context ? CStringGetTextDatum(e->context) : (Datum) 0;
	nulls[11] = nulls[12] = failed ? ' ' : 'n';
	nulls[13] = failed && e->context ? ' ' : 'n';
	run(STMT_ADD_RETRY, args, nulls, SPI_OK_INSERT_RETURNING);
	retry_id = DatumGetInt64(column_datum(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (failed)
		show_handler_failure(s, row, e, max_attempts_of(s) <= 1);
	if (!failed || max_attempts_of(s) > 1)
		return false;
	dead_letter(retry_id, 1, e);
	return true;
}

/* The watermark a MESSAGES frame told for a partition, or -1. */
static int64
watermark_of(InboxBatch *b, const char *topic, int32 partition)
{
	for (int i = 0; i < b->watermark_count; i++)
		if (b->watermarks[i].partition == partition && strcmp(b->watermarks[i].topic, topic) == 0)
			return b->watermarks[i].high_watermark;
	return -1;
}

/* Each partition of the batch is read on from after its last message. */
static void
advance_positions(BatchState *st)
{
	InboxBatch *b = st->batch;
	List	   *positions = NIL;
	Datum		args[5];

	for (int i = b->count - 1; i >= 0; i--)
	{
		InboxMessage *m = &b->messages[i];
		bool		known = false;
		ListCell   *lc;
		PartitionPosition *p;

		foreach(lc, positions)
		{
			p = lfirst(lc);
			known |= p->partition == m->partition && strcmp(p->topic, m->topic) == 0;
		}
		if (known)
			continue;
		p = palloc(sizeof(PartitionPosition));
		p->topic = m->topic;
		p->partition = m->partition;
		p->next_offset = m->offset + 1;
		p->high_watermark = watermark_of(b, m->topic, m->partition);
		positions = lappend(positions, p);
	}
	args[0] = CStringGetTextDatum(st->subscription->name);
	position_arrays(positions, args);
	run(STMT_ADVANCE_POSITIONS, args, NULL, SPI_OK_INSERT);
}

/* Record the batch: its retries and dead letters, its offsets. */
static void
record_batch(BatchState *st, InboxOutcome *outcome)
{
	memset(outcome, 0, sizeof(*outcome));
	for (int i = 0; i < st->batch->count; i++)
	{
		switch (st->fates[i])
		{
			case FATE_APPLIED:
				outcome->applied++;
				break;
			case FATE_DUPLICATE:
				outcome->duplicates++;
				break;
			case FATE_FAILED:
				outcome->failed++;
				/* fall through */
			case FATE_HELD:
				if (add_retry(st, i))
					outcome->dead_lettered++;
				else if (st->fates[i] == FATE_FAILED)
					outcome->retry_error_mark = worker_error_mark();
				outcome->retries_added = true;
				break;
		}
	}
	advance_positions(st);
}

/* What one try at a batch came to. */
typedef enum BatchTry
{
	TRY_COMMITTED,
	TRY_UNGUARDED_FAILURE,		/* a handler failed outside a subtransaction */
	TRY_FAILED					/* the worker's own statements failed */
} BatchTry;

static BatchTry
try_batch(BatchState *st, InboxOutcome *outcome)
{
	MemoryContext caller = CurrentMemoryContext;
	volatile BatchTry result = TRY_COMMITTED;

	for (int i = 0; i < st->batch->count; i++)
		st->fates[i] = FATE_APPLIED;
	st->calling = -1;
	memset(&st->texts, 0, sizeof(st->texts));	/* made in the transaction's memory */
	PG_TRY();
	{
		Handler		h;
		char	   *why;

		if (!begin_transaction())
			elog(ERROR, "the extension is not there");
		if (!handler_open(&h, st->subscription, &why))
			elog(ERROR, "subscription \"%s\" cannot be applied: %s", st->subscription->name, why);
		record_received(st);
		if (st->keys_may_be_held)
			find_held_keys(st);
		call_handlers(st, &h);
		record_batch(st, outcome);
		commit_transaction(caller);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(caller);
		edata = CopyErrorData();
		FlushErrorState();
		AbortOutOfAnyTransaction();
		MemoryContextSwitchTo(caller);
		if (st->calling >= 0)
		{
			st->guarded_from = st->calling;
			result = TRY_UNGUARDED_FAILURE;
		}
		else
		{
			worker_report_error(LOG, "could not apply a batch of subscription \"%s\": %s",
							   st->subscription->name, edata->message);
			result = TRY_FAILED;
		}
	}
	PG_END_TRY();
	return result;
}

/*
 * Apply a batch of the subscription's messages in one transaction, and
 * record them.  keys_may_be_held is false if the caller knows inbox_retry
 * holds none of the subscription's messages (the common case), which
 * spares the look for keys held back.  Returns false if that failed for a
 * reason of the worker's own (reported): nothing of the batch is
 * committed, and the consumer is to read from the recorded offsets again.
 */
bool
inbox_apply_batch(const InboxSubscription *s, InboxBatch *batch, bool keys_may_be_held,
				  InboxOutcome *outcome)
{
	BatchState	st;
	BatchTry	result;

	st.subscription = s;
	st.keys_may_be_held = keys_may_be_held;
	st.batch = batch;
	st.rows = palloc0(sizeof(MessageRow) * Max(batch->count, 1));
	st.fates = palloc(sizeof(MessageFate) * Max(batch->count, 1));
	st.errors = palloc0(sizeof(HandlerError) * Max(batch->count, 1));
	st.guarded_from = batch->count;
	do
		result = try_batch(&st, outcome);
	while (result == TRY_UNGUARDED_FAILURE);
	return result == TRY_COMMITTED;
}

/*
 * Retries.
 */

/* A message of inbox_retry, copied out of its statement's result. */
typedef struct RetryRow
{
	int64		id;
	int			attempts;
	MessageRow	row;
} RetryRow;

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
static RetryRow *
next_of_key(const InboxSubscription *s, RetryRow *r)
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

/* One attempt at a message, as its role, in a subtransaction of its own. */
static bool
attempt(Handler *h, MessageRow *row, HandlerError *error)
{
	bool		returned;

	handler_enter(h);
	returned = handler_call_guarded(h, row, error);
	handler_leave(h);
	return returned;
}

/* A message of inbox_retry failed again: its next attempt is after a longer wait. */
static void
schedule_next_attempt(RetryRow *r, const HandlerError *e)
{
	Datum		args[6] = {Int64GetDatum(r->id), Int32GetDatum(r->attempts + 1),
		Int64GetDatum(retry_backoff_ms(r->attempts)),
		CStringGetTextDatum(e->sqlstate), CStringGetTextDatum(e->message),
	e->context ? CStringGetTextDatum(e->context) : (Datum) 0};
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', e->context ? ' ' : 'n'};

	run(STMT_FAIL_RETRY, args, nulls, SPI_OK_UPDATE);
}

/*
 * Try a message due again, and then the messages of its key that waited
 * behind it, in order, until one fails: each that is applied leaves
 * inbox_retry, as does each out of attempts, for inbox_dead_letter.
 */
static void
settle_key(Handler *h, RetryRow *r, InboxOutcome *outcome)
{
	const InboxSubscription *s = h->subscription;
	HandlerError e;

	for (; r != NULL; r = next_of_key(s, r))
	{
		Datum		id = Int64GetDatum(r->id);

		if (attempt(h, &r->row, &e))
		{
			run(STMT_DELETE_RETRY, &id, NULL, SPI_OK_DELETE);
			outcome->applied++;
			continue;
		}
		outcome->failed++;
		if (r->attempts + 1 < max_attempts_of(s))
		{
			schedule_next_attempt(r, &e);
			show_handler_failure(s, &r->row, &e, false);
			outcome->retry_error_mark = worker_error_mark();
			outcome->retries_added = true;
			return;
		}
		dead_letter(r->id, r->attempts + 1, &e);
		show_handler_failure(s, &r->row, &e, true);
		outcome->dead_lettered++;
	}
}

/*
 * Try the subscription's messages whose next attempt is due, each with the
 * messages of its key behind it, in one transaction.  Returns false if that
 * failed for a reason of the worker's own (reported).
 */
bool
inbox_apply_due_retries(const InboxSubscription *s, InboxOutcome *outcome)
{
	MemoryContext caller = CurrentMemoryContext;
	volatile bool done = true;

	memset(outcome, 0, sizeof(*outcome));
	PG_TRY();
	{
		Handler		h;
		char	   *why;
		Datum		args[2] = {CStringGetTextDatum(s->name), Int32GetDatum(RETRIES_PER_PASS)};
		List	   *due = NIL;
		ListCell   *lc;

		if (!begin_transaction())
			elog(ERROR, "the extension is not there");
		if (!handler_open(&h, s, &why))
			elog(ERROR, "subscription \"%s\" cannot be applied: %s", s->name, why);
		run(STMT_DUE_RETRIES, args, NULL, SPI_OK_SELECT);
		for (uint64 row = 0; row < SPI_processed; row++)
			due = lappend(due, copy_retry_row(s, row));
		foreach(lc, due)
			settle_key(&h, lfirst(lc), outcome);
		commit_transaction(caller);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(caller);
		edata = CopyErrorData();
		FlushErrorState();
		AbortOutOfAnyTransaction();
		MemoryContextSwitchTo(caller);
		worker_report_error(LOG, "could not retry messages of subscription \"%s\": %s",
						   s->name, edata->message);
		memset(outcome, 0, sizeof(*outcome));
		done = false;
	}
	PG_END_TRY();
	return done;
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

	if (!begin_transaction())
		return -1;
	run(STMT_NEXT_RETRY, args, NULL, SPI_OK_SELECT);
	if (SPI_processed > 0)
		ms = DatumGetInt64(column_datum(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	commit_transaction(caller);
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

	if (!begin_transaction())
		return false;
	forgotten = run(STMT_FORGET_IDS, args, NULL, SPI_OK_DELETE);
	commit_transaction(caller);
	return forgotten == IDS_FORGOTTEN_PER_PASS;
}

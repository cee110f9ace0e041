/*-------------------------------------------------------------------------
 *
 * store.c
 *	  The publishing worker's SQL: claim a batch of messages; record what
 *	  Kafka said of a batch: delete (or mark sent) the delivered messages,
 *	  schedule retries for the failed ones and move the hopeless ones to
 *	  outbox_dead_letter.  The claim floor, from which a claim starts.
 *
 * Every statement is prepared once per extension schema and takes the whole
 * batch as arrays, so a batch costs a handful of statements whatever its
 * size.  Callers run inside a transaction with SPI connected.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/genam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "storage/lmgr.h"
#include "executor/spi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "commit_report.h"
#include "metrics.h"
#include "pg_compat.h"
#include "settings.h"
#include "statements.h"
#include "store.h"
#include "worker_slot.h"

typedef enum StoreStatement
{
	STMT_CLAIM_RETRIES,
	STMT_CLAIM_BELOW,
	STMT_CLAIM_AMONG,
	STMT_CLAIM_ABOVE,
	STMT_CLAIM_EXCEPT,
	STMT_DELETE_SENT,
	STMT_DELETE_RANGE,
	STMT_MARK_SENT,
	STMT_RETRY,
	STMT_DEAD_LETTER,
	STMT_NEXT_RETRY,
	STMT_LOWEST_CLAIMABLE,
	STMT_PREPARED_EXIST,
	STMT_COUNT
} StoreStatement;


/*
 * How a statement is planned.  Planning the claim and the delete anew for
 * each turn was most of the worker's CPU at a thousand messages a second
 * (turns of one to five messages): those that scan a range of ids are
 * planned once, for any values, and again only when the catalog or the
 * statistics change (a segment truncated, an ANALYZE).  Such a generic plan
 * is made on statistics that a queue gets wrong, swinging from empty to
 * millions of rows: the worker plans with sequential and bitmap scans,
 * sorts and hash joins off (publisher.c's worker_planning), which leaves
 * each of them only the scan of the index it is written for, in id order,
 * and a plan made while a segment was empty still walks that index once it
 * holds a backlog (test/t/114_worker_plans.pl reads them).  The statements
 * that join a list of ids are planned for each list, which the planner
 * then knows the length of: a generic plan made on an empty outbox scanned
 * every segment whole for each id.
 */

/*
 * The claim takes waiting rows in id order, skipping rows that another
 * session has locked and the later messages of any key whose earlier message
 * waits to retry: nothing overtakes a message of its own key.  Only retries
 * wait for next_attempt_at: a pending row's is the start of the transaction
 * that wrote it, which can be later than this transaction's now() although
 * the row is committed and visible, and skipping it would let the next
 * message of its key overtake it.  Whether any message waits to retry is
 * asked once per statement (an InitPlan), so that a claim with none spends
 * no probe per row on each segment's index.
 *
 * It walks from the claim floor, $4 (see "The claim floor" below), or from
 * the index's left edge when $4 is BELOW_EVERY_ID; the retries due below
 * the floor are claimed first, from the index of retrying rows.
 *
 * The rows of the batch still in flight are no longer locked, since the
 * transaction that claimed them has committed, so the claim leaves them out
 * by id.  Walking past them would cost as much as claiming them; so it
 * claims around them, by index ranges: the rows below the batch, the few ids
 * among its ids that are not its own, and the rows above it; and only when
 * those ids are too many, walks past them after all.
 *
 * A batch is capped in bytes as well as in messages, so a statement may be
 * run again for the rest of its range: past the id $3, where it stopped
 * (BELOW_EVERY_ID the first time).
 */
#define NOT_HELD_BACK \
		"(m.key IS NULL" \
		"        OR (SELECT NOT EXISTS (SELECT FROM %1$s.outbox_message WHERE state = 'retrying'))" \
		"        OR NOT EXISTS (" \
		"        SELECT FROM %1$s.outbox_message earlier" \
		"         WHERE earlier.state = 'retrying' AND earlier.topic = m.topic" \
		"           AND earlier.key = m.key AND earlier.id < m.id))"
#define CLAIM_SQL(ids_to_claim) \
		"SELECT " CLAIMED_COLUMNS \
		"  FROM %1$s.outbox_message m" \
		" WHERE " ids_to_claim " AND m.id > $3" \
		"   AND m.state <> 'sent'" \
		"   AND (m.state = 'pending' OR m.next_attempt_at <= pg_catalog.now())" \
		"   AND " NOT_HELD_BACK \
		" ORDER BY m.id LIMIT $1" \
		" FOR UPDATE OF m SKIP LOCKED"

#define ABOVE_FLOOR "m.id >= $4 AND "

/*
 * Below every id: outbox_message_id_seq (and the identity of schema 0.1.0)
 * starts at 1, and a restored row keeps an id it drew.
 */
#define BELOW_EVERY_ID 0

static const StatementDef statement_defs[STMT_COUNT] = {
	[STMT_CLAIM_RETRIES] = {
		"claim the retries due below the claim floor",
		CLAIM_SQL("m.state = 'retrying' AND m.id < $4 AND m.id <> ALL ($2)"),
		4, {INT4OID, INT8ARRAYOID, INT8OID, INT8OID},
		PLAN_ONCE
	},
	[STMT_CLAIM_BELOW] = {"claim below the batch in flight", CLAIM_SQL(ABOVE_FLOOR "m.id < $2"), 4, {INT4OID, INT8OID, INT8OID, INT8OID}, PLAN_ONCE},
	[STMT_CLAIM_AMONG] = {"claim among the batch in flight", CLAIM_SQL(ABOVE_FLOOR "m.id = ANY ($2)"), 4, {INT4OID, INT8ARRAYOID, INT8OID, INT8OID}, PLAN_ONCE},
	[STMT_CLAIM_ABOVE] = {"claim above the batch in flight", CLAIM_SQL(ABOVE_FLOOR "m.id > $2"), 4, {INT4OID, INT8OID, INT8OID, INT8OID}, PLAN_ONCE},
	[STMT_CLAIM_EXCEPT] = {"claim all but the batch in flight", CLAIM_SQL(ABOVE_FLOOR "m.id <> ALL ($2)"), 4, {INT4OID, INT8ARRAYOID, INT8OID, INT8OID}, PLAN_ONCE},
	/*
	 * One scan of the primary key's range ($2, $3) instead of a descent per
	 * id: the ids are tested against the array, hashed, as a filter, which
	 * IS TRUE keeps from becoming an index condition.
	 */
	[STMT_DELETE_SENT] = {
		"delete delivered messages",
		"DELETE FROM %1$s.outbox_message"
		" WHERE id BETWEEN $2 AND $3 AND (id = ANY ($1)) IS TRUE",
		3, {INT8ARRAYOID, INT8OID, INT8OID},
		PLAN_ONCE
	},
	/* The same, for a run that holds every id of its range. */
	[STMT_DELETE_RANGE] = {
		"delete delivered messages",
		"DELETE FROM %1$s.outbox_message WHERE id BETWEEN $1 AND $2",
		2, {INT8OID, INT8OID},
		PLAN_ONCE
	},
	[STMT_MARK_SENT] = {
		"mark delivered messages sent",
		"UPDATE %1$s.outbox_message m"
		"   SET state = 'sent', sent_at = pg_catalog.clock_timestamp(), last_error = NULL,"
		"       kafka_partition = d.kafka_partition, kafka_offset = d.kafka_offset"
		"  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3))"
		"       AS d(id, kafka_partition, kafka_offset)"
		" WHERE m.id = d.id",
		3, {INT8ARRAYOID, INT4ARRAYOID, INT8ARRAYOID},
		PLAN_EACH_TIME
	},
	[STMT_RETRY] = {
		"schedule retries",
		"UPDATE %1$s.outbox_message m"
		"   SET state = 'retrying', attempts = m.attempts + 1, last_error = f.error,"
		"       next_attempt_at = pg_catalog.clock_timestamp()"
		"                         + f.delay_ms::pg_catalog.float8 * interval '1 millisecond'"
		"  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3))"
		"       AS f(id, delay_ms, error)"
		" WHERE m.id = f.id",
		3, {INT8ARRAYOID, INT8ARRAYOID, TEXTARRAYOID},
		PLAN_EACH_TIME
	},
	/*
	 * A message whose id outbox_dead_letter already holds (a dead letter
	 * inserted by hand, or restored beside a reused id) is not moved: it
	 * stays in the outbox, and only the rows that were inserted are deleted.
	 * Returns the moved ids in ascending order.
	 */
	[STMT_DEAD_LETTER] = {
		"move messages to outbox_dead_letter",
		"WITH inserted AS ("
		"  INSERT INTO %1$s.outbox_dead_letter"
		"         (id, message_id, topic, key, payload, headers, attempts, created_at, error"
		TARGET_PARTITION_COLUMN ")"
		"  SELECT m.id, m.message_id, m.topic, m.key, m.payload, m.headers,"
		"         m.attempts + 1, m.created_at, f.error" TARGET_PARTITION_COLUMN_VALUE
		"    FROM %1$s.outbox_message m,"
		"         ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS f(id, error)"
		"   WHERE m.id = f.id"
		"  ON CONFLICT (id) DO NOTHING"
		"  RETURNING id"
		"), moved AS ("
		"  DELETE FROM %1$s.outbox_message m USING inserted WHERE m.id = inserted.id"
		"  RETURNING m.id"
		")"
		" SELECT id FROM moved ORDER BY id",
		2, {INT8ARRAYOID, TEXTARRAYOID},
		PLAN_EACH_TIME
	},
	[STMT_NEXT_RETRY] = {
		"find the next retry",
		"SELECT (extract(epoch FROM pg_catalog.min(next_attempt_at) - pg_catalog.clock_timestamp())"
		"        * 1000::pg_catalog.numeric)::pg_catalog.int8"
		"  FROM %1$s.outbox_message WHERE state = 'retrying'",
		0, {InvalidOid},
		PLAN_ONCE
	},
	/*
	 * The lowest row a claim would take but for a lock, found without
	 * taking any (store_hand_over_passed_rows()).
	 */
	[STMT_LOWEST_CLAIMABLE] = {
		"look for a message the claim passed",
		"SELECT m.id FROM %1$s.outbox_message m"
		" WHERE m.state <> 'sent' AND m.state = 'pending' AND " NOT_HELD_BACK
		" ORDER BY m.id LIMIT 1",
		0, {InvalidOid},
		PLAN_ONCE
	},
	[STMT_PREPARED_EXIST] = {
		"look for prepared transactions",
		"SELECT EXISTS (SELECT FROM pg_catalog.pg_prepared_xacts"
		"                WHERE database = pg_catalog.current_database())",
		0, {InvalidOid},
		PLAN_ONCE
	},
};

/* Ids this far apart are deleted by two range scans rather than one. */
#define DELETE_RUN_GAP 1000

static StatementSet statements = {statement_defs, STMT_COUNT};

/*
 * The claim floor.  Deleting a delivered row leaves its index entries
 * until VACUUM removes them, which it cannot while a transaction anywhere
 * holds back the xmin horizon; a claim that started from the left edge of
 * the index would walk every one of them, at every claim.  So the claim
 * starts from the floor: every row with a lower id is delivered, in
 * flight, waiting to retry, or held back behind a row waiting to retry.
 * The floor moves up past each batch claimed, and down again to the id of
 * any row that may now wait below it:
 *
 * - a transaction that committed rows below it (it drew their ids before
 *   the floor passed them, and committed after): each reports its lowest
 *   id as it commits, before it is visible, and the first claim whose
 *   snapshot shows it ended starts from there (commit_report.c,
 *   lower_floor_for_commits());
 * - a prepared transaction, which may commit at any time later: its lowest
 *   id holds the floor down until no prepared transaction is left in the
 *   database (worker_hold_claim_floor());
 * - a batch, or a message, that was claimed but left as it was (not
 *   produced, not sent, held back behind a failure), and a message that
 *   had waited to retry and is now delivered or dead-lettered, behind
 *   which the later messages of its key may wait (store_record_outcomes());
 * - a row that another session had locked when the claim passed it: no
 *   claim can see that, so every outbox.poll_interval a reclaimer
 *   (publisher.c) looks for the lowest row a claim would take, without
 *   locking any, and hands its id over as a committing transaction does
 *   (store_hand_over_passed_rows()).  The look walks the index entries of
 *   the rows deleted since VACUUM last ran, half a million after a burst,
 *   tens of milliseconds in which the publisher would publish nothing.
 *   Without a reclaimer, the publisher's next claim starts from the left
 *   edge instead (store_rescan()).
 *
 * Unknown (from the left edge) when the worker starts and when the
 * extension changes.
 */
static bool claim_floor_known = false;
static int64 claim_floor = 0;

/*
 * When the next retry is due, as store_ms_until_next_retry() last found;
 * 0 when not known, DT_NOEND when none waits.  The claim asks for the
 * retries below the floor only once one is due: the in-flight ids it
 * leaves out cost milliseconds to plan.  It is asked again only once that
 * time has come, or the worker scheduled retries, or every
 * outbox.poll_interval (store_rescan(): a row restored as retrying tells
 * the worker nothing more), not at every turn that drains the outbox.
 */
static TimestampTz next_retry_at = 0;
static bool prepared_looked_for = false;

/* Forget what was known of the extension, after DROP EXTENSION for instance. */
static void
forget_extension(void)
{
	claim_floor_known = false;
	next_retry_at = 0;
}

/*
 * Is the extension created in this database?  If so, lock it against DROP
 * EXTENSION until the transaction ends, so that its tables stay for the
 * batch, make sure the statements are prepared for its schema, and return
 * its oid; else return InvalidOid.
 */
Oid
store_find_extension(void)
{
	Oid			known = statements.extension;
	Oid			extension = statements_find_extension(&statements);

	if (extension != known)
		forget_extension();
	return extension;
}

/* The schema of the extension store_find_extension() last found. */
Oid
store_extension_namespace(void)
{
	return statements.namespace;
}

/* Run a prepared statement; anything but the expected result is an ERROR. */
static void
run(StoreStatement stmt, Datum *args, int expected)
{
	(void) statement_run(&statements, stmt, args, NULL, expected);
}


/*
 * Kafka's keys and headers are UTF-8 text, whatever the database's
 * encoding: the claim converts them, in its transaction (a conversion is
 * looked up in the catalog).  A database of encoding UTF-8 or SQL_ASCII
 * sends its bytes as they are.
 */
static bool
texts_to_convert(void)
{
	return GetDatabaseEncoding() != PG_UTF8 && GetDatabaseEncoding() != PG_SQL_ASCII;
}

/* A string of the database's encoding as UTF-8: a jsonb string value. */
static void
jsonb_string_to_utf8(JsonbValue *v)
{
	char	   *utf8 = pg_server_to_any(v->val.string.val, v->val.string.len, PG_UTF8);

	if (utf8 != v->val.string.val)
	{
		v->val.string.val = utf8;
		v->val.string.len = strlen(utf8);
	}
}

/* The headers, an object of strings (or nulls), with UTF-8 names and values. */
static Jsonb *
headers_to_utf8(Jsonb *headers)
{
	JsonbInState state = {0};
	JsonbIterator *it = JsonbIteratorInit(&headers->root);
	JsonbValue	v;
	JsonbIteratorToken token;

	while ((token = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		if ((token == WJB_KEY || token == WJB_VALUE) && v.type == jbvString)
			jsonb_string_to_utf8(&v);
		pushJsonbValue(&state, token, token < WJB_BEGIN_ARRAY ? &v : NULL);
	}
	return JsonbValueToJsonb(state.result);
}

/* Copy one row of the claim's result into m, in the current memory context. */
static void
copy_claimed_row(HeapTuple tuple, TupleDesc desc, OutboxMessage *m)
{
	bool		isnull;
	Datum		d;
	bytea	   *payload;
	TimestampTz created_at;
	TransactionId xmin;

	MemSet(m, 0, sizeof(OutboxMessage));
	m->id = DatumGetInt64(SPI_getbinval(tuple, desc, Anum_claimed_id, &isnull));
	m->message_id = TextDatumGetCString(SPI_getbinval(tuple, desc, Anum_claimed_message_id, &isnull));
	m->topic = TextDatumGetCString(SPI_getbinval(tuple, desc, Anum_claimed_topic, &isnull));
	d = SPI_getbinval(tuple, desc, Anum_claimed_key, &isnull);
	m->key = isnull ? NULL : TextDatumGetCString(d);
	if (m->key && texts_to_convert())
		m->key = pg_server_to_any(m->key, strlen(m->key), PG_UTF8);
	d = SPI_getbinval(tuple, desc, Anum_claimed_payload, &isnull);
	if (!isnull)				/* NULL: a tombstone */
	{
		payload = DatumGetByteaPCopy(d);
		m->payload = VARDATA(payload);
		m->payload_len = VARSIZE(payload) - VARHDRSZ;
	}
	d = SPI_getbinval(tuple, desc, Anum_claimed_headers, &isnull);
	m->headers = isnull ? NULL : DatumGetJsonbPCopy(d);
	if (m->headers && texts_to_convert())
		m->headers = headers_to_utf8(m->headers);
	created_at = DatumGetTimestampTz(SPI_getbinval(tuple, desc, Anum_claimed_created_at, &isnull));
	m->timestamp_ms = unix_epoch_ms(created_at);
	m->attempts = DatumGetInt32(SPI_getbinval(tuple, desc, Anum_claimed_attempts, &isnull));
	d = SPI_getbinval(tuple, desc, Anum_claimed_target_partition, &isnull);
	m->target_partition = isnull ? ANY_PARTITION : DatumGetInt32(d);
	m->waited = DatumGetBool(SPI_getbinval(tuple, desc, Anum_claimed_waited, &isnull));
	xmin = DatumGetTransactionId(SPI_getbinval(tuple, desc, Anum_claimed_xmin, &isnull));
	d = SPI_getbinval(tuple, desc, Anum_claimed_next_attempt_at, &isnull);
	/* a delayed message's latency starts at its time */
	m->latency_from = metrics_latency_start(xmin, created_at, m->attempts,
											m->waited && m->attempts == 0 ?
											DatumGetTimestampTz(d) : DT_NOBEGIN);
}

/*
 * A batch being claimed: what it holds so far, and the limits that end it.
 * bytes counts what the sender chose the size of: payloads, keys, headers.
 */
typedef struct Claim
{
	OutboxMessage *messages;
	int			count;
	int			max_count;
	int64		bytes;
	int64		max_bytes;
	int64		mean_bytes_in_flight;	/* per message; 0 with none in flight */
	bool		full;			/* a limit ended it, not a lack of rows */
	MemoryContext context;		/* where the messages are copied to */
} Claim;

/*
 * The bytes of a claimed message, near enough as the claim counts a row:
 * for the mean size that sizes the claim's statements.
 */
static int64
message_bytes(const OutboxMessage *m)
{
	return (int64) m->payload_len + (m->key ? strlen(m->key) : 0) +
		(m->headers ? VARSIZE(m->headers) : 0);
}

/*
 * The same for a row of the claim's result (with each value's few bytes of
 * length header), read before any value is detoasted: a row may be claimed
 * but left for the next batch.
 */
static int64
claimed_row_bytes(HeapTuple tuple, TupleDesc desc)
{
	static const ClaimedColumn sized[] = {
		Anum_claimed_payload, Anum_claimed_key, Anum_claimed_headers
	};
	int64		bytes = 0;

	for (int i = 0; i < (int) lengthof(sized); i++)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(tuple, desc, sized[i], &isnull);

		if (!isnull)
			bytes += toast_raw_datum_size(d);
	}
	return bytes;
}

/*
 * How many rows to ask the next claim statement for: as many as the bytes
 * left fit at the mean size seen (in this batch, else in the batch in
 * flight), and one more, since a smaller one may fit too; with no size seen
 * yet, all that the count leaves.  A row asked for and not taken stays
 * locked until the commit, for nothing.
 */
static int
rows_to_ask(const Claim *c)
{
	int			rows_left = c->max_count - c->count;
	int64		mean = c->count > 0 ? c->bytes / c->count : c->mean_bytes_in_flight;

	if (mean == 0)
		return rows_left;
	return (int) Min((int64) rows_left, (c->max_bytes - c->bytes) / mean + 1);
}

/*
 * Copy the rows of one claim statement's result into the batch, in the
 * claim's memory context, until one would go past a limit.  Every batch
 * takes its first row, however large.
 */
static void
take_claimed_rows(Claim *c)
{
	/*
	 * Under SPI, palloc allocates in SPI's procedure context, which
	 * SPI_finish() frees; the batch outlives the transaction.
	 */
	MemoryContext spi = MemoryContextSwitchTo(c->context);

	for (uint64 i = 0; i < SPI_processed && !c->full; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		int64		bytes = claimed_row_bytes(tuple, SPI_tuptable->tupdesc);

		if (c->count > 0 && c->bytes + bytes > c->max_bytes)
			c->full = true;
		else
		{
			copy_claimed_row(tuple, SPI_tuptable->tupdesc, &c->messages[c->count++]);
			c->bytes += bytes;
			c->full = c->count == c->max_count || c->bytes >= c->max_bytes;
		}
	}
	MemoryContextSwitchTo(spi);
}

/* The id of the last row of the claim statement's result. */
static int64
last_claimed_id(void)
{
	bool		isnull;

	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[SPI_processed - 1],
									   SPI_tuptable->tupdesc, Anum_claimed_id, &isnull));
}

/*
 * Run one claim statement, ids being its range and floor the claim's floor
 * (if known), until the batch is full or
 * the range has no more rows to claim; a few rows at a time when they are
 * large, so that SPI's result, and the rows locked, stay within the limits.
 */
static void
claim_more(Claim *c, StoreStatement stmt, Datum ids, Datum floor, bool floor_known)
{
	Datum		args[4] = {0, ids, Int64GetDatum(BELOW_EVERY_ID),
	floor_known ? floor : Int64GetDatum(BELOW_EVERY_ID)};

	while (!c->full)
	{
		int			asked = rows_to_ask(c);
		uint64		returned;

		/*
		 * Every claim statement of a batch sees the same snapshot, as one
		 * statement would: with a snapshot each, a transaction committing
		 * between them could show its later rows and hide its earlier ones.
		 */
		args[0] = Int32GetDatum(asked);
		if (SPI_execute_snapshot(statements.plans[stmt], args, NULL, GetActiveSnapshot(),
								 InvalidSnapshot, false, true, 0) != SPI_OK_SELECT)
			elog(ERROR, "outbox: worker statement \"%s\" failed", statement_defs[stmt].name);
		returned = SPI_processed;
		take_claimed_rows(c);
		if (returned > 0)
			args[2] = Int64GetDatum(last_claimed_id());
		SPI_freetuptable(SPI_tuptable);
		if (returned < (uint64) asked)
			break;
	}
}

/* How many ids between the lowest and the highest in flight are not in flight. */
static int64
count_gaps(const OutboxMessage *in_flight, int count)
{
	return in_flight[count - 1].id - in_flight[0].id + 1 - count;
}

/* Those ids, as an array. */
static Datum
gaps_array(const OutboxMessage *in_flight, int count)
{
	Datum	   *gaps = palloc(sizeof(Datum) * Max(count_gaps(in_flight, count), 1));
	int			ngaps = 0;
	int			next = 0;

	for (int64 id = in_flight[0].id; id <= in_flight[count - 1].id; id++)
	{
		if (id == in_flight[next].id)
			next++;
		else
			gaps[ngaps++] = Int64GetDatum(id);
	}
	return statement_array(gaps, ngaps, INT8OID);
}

/* The ids in flight, as an array. */
static Datum
ids_array(const OutboxMessage *in_flight, int count)
{
	Datum	   *ids = palloc(sizeof(Datum) * count);

	for (int i = 0; i < count; i++)
		ids[i] = Int64GetDatum(in_flight[i].id);
	return statement_array(ids, count, INT8OID);
}

/* The mean bytes of the messages in flight, or 0 with none. */
static int64
mean_bytes(const OutboxMessage *messages, int count)
{
	int64		bytes = 0;

	for (int i = 0; i < count; i++)
		bytes += message_bytes(&messages[i]);
	return count > 0 ? Max(bytes / count, 1) : 0;
}

/* Let the floor down to id, if it is above. */
void
store_lower_claim_floor(int64 id)
{
	if (claim_floor_known && id < claim_floor)
		claim_floor = id;
}

/*
 * Every outbox.poll_interval, in the publisher: ask the table again when
 * the next retry is due; and with from_left_edge, when no reclaimer could
 * look for rows the claims passed, have the next claim start from the left
 * edge of the index (see "The claim floor").
 */
void
store_rescan(bool from_left_edge)
{
	next_retry_at = 0;
	if (from_left_edge)
		claim_floor_known = false;
}

/*
 * In a reclaimer: hand the publisher of this database the lowest row its
 * claims would take but for a lock, if any (see "The claim floor").  It may
 * be one of a batch in flight, or one the publisher has claimed since:
 * its claims leave those out, and a floor let down to a row they passed
 * costs a walk from there once.
 */
void
store_hand_over_passed_rows(void)
{
	bool		isnull;
	int64		lowest;

	run(STMT_LOWEST_CLAIMABLE, NULL, SPI_OK_SELECT);
	if (SPI_processed == 0)
		return;
	lowest = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	worker_lower_claim_floor(MyDatabaseId, lowest, false);
	elog(DEBUG1, "outbox: the lowest message a claim would take is " INT64_FORMAT
		 "; the publisher's next claim starts from it", lowest);
}

/* Is any prepared transaction left in this database? */
static bool
prepared_transactions_exist(void)
{
	bool		isnull;

	run(STMT_PREPARED_EXIST, NULL, SPI_OK_SELECT);
	return DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * Where this claim starts, as far as is known before its snapshot: the
 * floor, held down by prepared transactions; with *known false, from the
 * left edge (see "The claim floor").  Called before the claim takes its
 * snapshot, so that the rows of a prepared transaction found committed
 * since are visible to it.
 */
static int64
claim_floor_for_claim(bool *known)
{
	int64		prepared;
	int64		floor;

	/* one prepared before this worker started has told no one */
	if (!prepared_looked_for)
	{
		if (prepared_transactions_exist())
			worker_hold_claim_floor(PG_INT64_MIN);
		prepared_looked_for = true;
	}
	if (worker_claim_floor_held(&prepared) &&
		!prepared_transactions_exist() && worker_release_claim_floor(prepared))
	{
		store_lower_claim_floor(prepared);
		prepared = PG_INT64_MAX;
	}
	floor = Min(claim_floor, prepared);
	*known = claim_floor_known;
	if (floor == PG_INT64_MIN)
		*known = false;			/* from the left edge, without a bound to probe */
	return floor;
}

/*
 * Let the floor down by what committed below it since the last claim, once
 * the claim has its snapshot (commit_report.c): the reports of transactions
 * the snapshot shows ended, and what was handed over, which also goes to
 * the next claim, whose snapshot is sure to show its transactions.  Returns
 * floor, let down.
 */
static int64
lower_floor_for_commits(int64 floor, Snapshot snapshot)
{
	static int64 handed_over_last = PG_INT64_MAX;
	int64		ended = commit_report_take_ended(snapshot);
	int64		handed_over = worker_take_claim_floor_request();
	int64		lowest = Min(Min(ended, handed_over), handed_over_last);

	handed_over_last = handed_over;
	store_lower_claim_floor(lowest);
	return Min(floor, lowest);
}

/* May a retry be due now?  Asks the table only when one may be. */
static bool
retry_may_be_due(void)
{
	return store_ms_until_next_retry() == 0;
}

/*
 * The claim statements in the order of the ids they claim: the retries due
 * below the floor (if claim_retries), then the rows from the floor on,
 * around the batch in flight.  Returns whether any row at or above the
 * floor was claimed, whose last one moves the floor up.
 */
static bool
claim_in_order(Claim *c, const OutboxMessage *in_flight, int in_flight_count,
			   Datum floor, bool floor_known, bool claim_retries)
{
	int			below_floor;

	if (claim_retries)
		claim_more(c, STMT_CLAIM_RETRIES, ids_array(in_flight, in_flight_count), floor, true);
	below_floor = c->count;

	/* with none in flight above the floor, "all but none": no bound for the planner to probe */
	if (in_flight_count == 0 ||
		(floor_known && in_flight[in_flight_count - 1].id < DatumGetInt64(floor)))
		claim_more(c, STMT_CLAIM_EXCEPT, ids_array(in_flight, 0), floor, floor_known);
	else if (count_gaps(in_flight, in_flight_count) > c->max_count)
		claim_more(c, STMT_CLAIM_EXCEPT, ids_array(in_flight, in_flight_count), floor, floor_known);
	else
	{
		claim_more(c, STMT_CLAIM_BELOW, Int64GetDatum(in_flight[0].id), floor, floor_known);
		if (count_gaps(in_flight, in_flight_count) > 0)
			claim_more(c, STMT_CLAIM_AMONG, gaps_array(in_flight, in_flight_count), floor, floor_known);
		claim_more(c, STMT_CLAIM_ABOVE, Int64GetDatum(in_flight[in_flight_count - 1].id), floor, floor_known);
	}
	return c->count > below_floor;
}

/*
 * Claim up to max_count messages, of up to max_bytes together (but at least
 * one), in id order, locked until the transaction ends, leaving out the
 * in_flight ones (in id order, as claimed).  The messages are allocated in
 * the caller's memory context.  Sets *full if a limit ended the batch: then
 * more rows may wait, from the id after its last on.  The claim takes a
 * snapshot of its own, once it has taken what committed transactions
 * reported to its floor.
 */
int
store_claim_batch(OutboxMessage **messages, bool *full, int max_count, int64 max_bytes,
				  const OutboxMessage *in_flight, int in_flight_count)
{
	Claim		c = {0};
	MemoryContext caller = CurrentMemoryContext;
	bool		floor_known;
	int64		floor = claim_floor_for_claim(&floor_known);
	bool		claim_retries = floor_known && retry_may_be_due();

	/*
	 * A statement run under SPI returns in SPI's procedure context, which
	 * the commit frees: the batch is the caller's, and outlives it.
	 */
	MemoryContextSwitchTo(caller);
	c.messages = palloc(sizeof(OutboxMessage) * Max(max_count, 1));
	c.max_count = max_count;
	c.max_bytes = max_bytes;
	c.mean_bytes_in_flight = mean_bytes(in_flight, in_flight_count);
	c.full = max_count <= 0;
	c.context = CurrentMemoryContext;

	if (outbox_claim_snapshot_delay > 0)
		(void) WaitLatch(NULL, WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, outbox_claim_snapshot_delay,
						 PG_WAIT_EXTENSION);
	PushActiveSnapshot(GetTransactionSnapshot());
	floor = lower_floor_for_commits(floor, GetActiveSnapshot());
	if (claim_in_order(&c, in_flight, in_flight_count, Int64GetDatum(floor), floor_known,
					   claim_retries))
	{
		claim_floor = Max(floor_known ? claim_floor : PG_INT64_MIN, c.messages[c.count - 1].id + 1);
		claim_floor_known = true;
	}
	PopActiveSnapshot();
	*messages = c.messages;
	*full = c.full;
	return c.count;
}

/* Is this failed attempt of m its last? */
static bool
out_of_attempts(const OutboxMessage *m)
{
	return m->attempts + 1 >= outbox_max_attempts;
}

char *
store_describe_failure(const OutboxMessage *m)
{
	return psprintf("%s%s", m->error, m->possibly_persisted ? " (possibly persisted)" : "");
}

/*
 * The recording statements take the batch as arrays, one per column: what
 * each message puts in a column.  reason, if not NULL, says why a message
 * that was to be dead-lettered waits for a retry instead.
 */
typedef Datum (*MessageColumn) (OutboxMessage *m, const char *reason);

static Datum
id_of(OutboxMessage *m, const char *reason)
{
	return Int64GetDatum(m->id);
}

static Datum
partition_of(OutboxMessage *m, const char *reason)
{
	return Int32GetDatum(m->partition);
}

static Datum
offset_of(OutboxMessage *m, const char *reason)
{
	return Int64GetDatum(m->offset);
}

static Datum
retry_delay_of(OutboxMessage *m, const char *reason)
{
	return Int64GetDatum(retry_backoff_ms(m->attempts));
}

static Datum
failure_of(OutboxMessage *m, const char *reason)
{
	if (reason)
		return CStringGetTextDatum(psprintf("%s: %s", reason, store_describe_failure(m)));
	return CStringGetTextDatum(store_describe_failure(m));
}

static Datum
dead_letter_reason_of(OutboxMessage *m, const char *reason)
{
	if (m->outcome == DELIVERY_RETRY)
		return CStringGetTextDatum(psprintf("%s, after %d attempts",
											store_describe_failure(m), m->attempts + 1));
	return failure_of(m, NULL);
}

/*
 * Run a recording statement for these messages; its arguments are the
 * columns' arrays, typed as the statement declares them.
 */
static void
run_for_messages(StoreStatement stmt, const MessageColumn *columns, const char *reason,
				 OutboxMessage **messages, int count, int expected)
{
	const StatementDef *def = &statement_defs[stmt];
	Datum		args[lengthof(def->argtypes)];

	for (int arg = 0; arg < def->nargs; arg++)
	{
		Datum	   *values = palloc(sizeof(Datum) * count);

		for (int i = 0; i < count; i++)
			values[i] = columns[arg] (messages[i], reason);
		args[arg] = statement_array(values, count, get_element_type(def->argtypes[arg]));
	}
	run(stmt, args, expected);
}

/*
 * Delete delivered rows (in ascending id order), one dense run of ids at a
 * time: a batch is mostly one run, but may hold a straggler far below, and
 * one range scan over both would walk every row between.
 */
static void
delete_delivered(OutboxMessage **messages, int count)
{
	int			first = 0;

	for (int i = 1; i <= count; i++)
	{
		int64		low;
		int64		high;

		if (i < count && messages[i]->id - messages[i - 1]->id <= DELETE_RUN_GAP)
			continue;
		low = messages[first]->id;
		high = messages[i - 1]->id;

		/*
		 * A run that holds every id of its range, as a drain's batches do,
		 * is its range: no other row has those ids.  Else the ids go as an
		 * array, whose elements the planner weighs one by one, in each
		 * segment: milliseconds for a thousand.
		 */
		if (high - low + 1 == i - first)
		{
			Datum		args[2] = {Int64GetDatum(low), Int64GetDatum(high)};

			run(STMT_DELETE_RANGE, args, SPI_OK_DELETE);
		}
		else
		{
			Datum	   *ids = palloc(sizeof(Datum) * (i - first));
			Datum		args[3];

			for (int j = first; j < i; j++)
				ids[j - first] = id_of(messages[j], NULL);
			args[0] = statement_array(ids, i - first, INT8OID);
			args[1] = Int64GetDatum(low);
			args[2] = Int64GetDatum(high);
			run(STMT_DELETE_SENT, args, SPI_OK_DELETE);
		}
		first = i;
	}
}

/* Keep delivered rows as 'sent', with where Kafka put them. */
static void
mark_sent(OutboxMessage **messages, int count)
{
	static const MessageColumn columns[] = {id_of, partition_of, offset_of};

	run_for_messages(STMT_MARK_SENT, columns, NULL, messages, count, SPI_OK_UPDATE);
}

/*
 * A recording step that may fail without undoing what was recorded before
 * it: the retries and the dead letters of a batch.
 */
typedef struct RecordingStep
{
	OutboxMessage **messages;
	int			count;
	const char *reason;			/* for retries: why not dead-lettered, or NULL */
	OutboxMessage **kept;		/* for dead letters: those not moved */
	int			kept_count;
} RecordingStep;

static void
schedule_retries(RecordingStep *step)
{
	static const MessageColumn columns[] = {id_of, retry_delay_of, failure_of};

	run_for_messages(STMT_RETRY, columns, step->reason, step->messages, step->count,
					 SPI_OK_UPDATE);
	next_retry_at = 0;			/* to be found again */
}

/*
 * Move the messages to outbox_dead_letter; those whose id it already holds
 * are kept.  The messages and the moved ids are both in ascending id order.
 */
static void
move_to_dead_letter(RecordingStep *step)
{
	static const MessageColumn columns[] = {id_of, dead_letter_reason_of};
	uint64		moved = 0;

	run_for_messages(STMT_DEAD_LETTER, columns, NULL, step->messages, step->count,
					 SPI_OK_SELECT);
	step->kept_count = 0;
	for (int i = 0; i < step->count; i++)
	{
		bool		isnull;

		if (moved < SPI_processed &&
			DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[moved], SPI_tuptable->tupdesc,
										1, &isnull)) == step->messages[i]->id)
			moved++;
		else
			step->kept[step->kept_count++] = step->messages[i];
	}
	SPI_freetuptable(SPI_tuptable);
}

/* A recording step, as run_in_subtransaction() runs it. */
typedef struct IsolatedStep
{
	void		(*run_step) (RecordingStep *step);
	RecordingStep *step;
} IsolatedStep;

static void
run_isolated_step(void *arg)
{
	IsolatedStep *isolated = arg;

	isolated->run_step(isolated->step);
}

/*
 * Run a recording step in a subtransaction of its own, as a PL/pgSQL
 * exception block does, so that its failure undoes only what it did, and
 * never the record of what Kafka acknowledged, written before it in the
 * same transaction: a turn that rolled back would have Kafka's acknowledged
 * messages claimed and published again.  The SPI connection is the turn's,
 * made outside the subtransaction, so it survives the rollback.  Returns
 * the error's message if the step failed, after reporting it; else NULL.
 */
static char *
run_isolated(const char *what, void (*run_step) (RecordingStep *step),
			 RecordingStep *step)
{
	IsolatedStep isolated = {run_step, step};
	ErrorData  *error = run_in_subtransaction(run_isolated_step, &isolated);

	if (error == NULL)
		return NULL;
	worker_report_error(LOG, "could not %s: %s", what, error->message);
	return error->message;
}

/*
 * Sort a settled batch's messages by what becomes of them: delivered,
 * retried or dead-lettered (DELIVERY_NOT_SENT ones are left as they are).
 * A message not delivered, or one that waited behind it, stays below the
 * claim floor, or the later messages of its key may.
 */
static void
sort_by_outcome(OutboxMessage *messages, int count, OutboxMessage **delivered,
				RecordingStep *retries, RecordingStep *dead, RecordedOutcomes *recorded)
{
	for (int i = 0; i < count; i++)
	{
		OutboxMessage *m = &messages[i];

		if (m->outcome != DELIVERY_OK || m->waited)
		{
			store_lower_claim_floor(m->id);
			recorded->floor_lowered = true;
		}
		if (m->outcome == DELIVERY_OK)
			delivered[recorded->delivered++] = m;
		else if (m->outcome == DELIVERY_RETRY && !out_of_attempts(m))
			retries->messages[retries->count++] = m;
		else if (m->outcome == DELIVERY_RETRY || m->outcome == DELIVERY_PERMANENT)
			dead->messages[dead->count++] = m;
	}
}

/*
 * Move the hopeless messages to outbox_dead_letter, isolated; those that
 * cannot be moved (all of them if the statement failed, else those whose
 * id is there already) wait for a retry instead, with the reason.
 */
static void
record_dead_letters(RecordingStep *dead, RecordedOutcomes *recorded)
{
	char	   *failure = run_isolated("move messages to outbox_dead_letter",
									   move_to_dead_letter, dead);
	RecordingStep kept = {0};

	kept.messages = dead->kept;
	kept.count = dead->kept_count;

	if (failure)
	{
		kept.messages = dead->messages;
		kept.count = dead->count;
		kept.reason = psprintf("not moved to outbox_dead_letter (%s)", failure);
	}
	else if (kept.count > 0)
	{
		kept.reason = "not moved to outbox_dead_letter, which holds a dead letter with its id";
		worker_report_error(LOG, "message %lld to topic \"%s\": %s",
							(long long) kept.messages[0]->id, kept.messages[0]->topic,
							kept.reason);
	}
	recorded->dead_lettered = dead->count - kept.count;
	if (kept.count > 0 && run_isolated("schedule retries", schedule_retries, &kept) == NULL)
		recorded->retries_scheduled += kept.count;
}

/*
 * Record a settled batch, its messages in id order: delivered rows go (or
 * stay as 'sent'), failed ones wait for a retry or, when hopeless or out of
 * attempts, move to outbox_dead_letter.  DELIVERY_NOT_SENT rows are left as
 * they are.  Fills in how many went each way.
 *
 * The deliveries are recorded first, and nothing after them can undo them:
 * the retries and the dead letters run isolated.  A message that cannot be
 * moved to outbox_dead_letter (its id is there already, or the statement
 * failed) waits for a retry instead, with the reason in its last_error: it
 * is not lost, and it comes back only after its backoff.  If scheduling
 * retries fails too, the rows stay as they were, to be claimed again.
 */
void
store_record_outcomes(OutboxMessage *messages, int count, RecordedOutcomes *recorded)
{
	OutboxMessage **delivered = palloc(sizeof(OutboxMessage *) * count);
	RecordingStep retries = {0};
	RecordingStep dead = {0};

	retries.messages = palloc(sizeof(OutboxMessage *) * count);
	dead.messages = palloc(sizeof(OutboxMessage *) * count);
	dead.kept = palloc(sizeof(OutboxMessage *) * count);
	memset(recorded, 0, sizeof(RecordedOutcomes));
	sort_by_outcome(messages, count, delivered, &retries, &dead, recorded);

	if (recorded->delivered > 0 && outbox_sent_retention == 0)
		delete_delivered(delivered, recorded->delivered);
	else if (recorded->delivered > 0)
		mark_sent(delivered, recorded->delivered);
	if (dead.count > 0)
		record_dead_letters(&dead, recorded);
	if (retries.count > 0 && run_isolated("schedule retries", schedule_retries, &retries) == NULL)
		recorded->retries_scheduled += retries.count;
}

/*
 * Milliseconds until the next retry (or delayed message) is due, or -1 if
 * none waits.
 */
long
store_ms_until_next_retry(void)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz delayed_due = worker_take_delayed_due();
	bool		isnull;
	Datum		d;
	int64		ms;

	/* a delayed message committed since may be due sooner */
	if (next_retry_at != 0 && delayed_due < next_retry_at)
		next_retry_at = delayed_due;
	/* as last found, until it comes (see next_retry_at) */
	if (next_retry_at == DT_NOEND)
		return -1;
	if (next_retry_at > now)
		return TimestampDifferenceMilliseconds(now, next_retry_at);

	run(STMT_NEXT_RETRY, NULL, SPI_OK_SELECT);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (isnull)
	{
		next_retry_at = DT_NOEND;
		return -1;
	}
	ms = Max(DatumGetInt64(d), 0);
	next_retry_at = TimestampTzPlusMilliseconds(now, ms);
	return (long) ms;
}

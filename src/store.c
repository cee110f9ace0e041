/*-------------------------------------------------------------------------
 *
 * store.c
 *	  The worker's SQL: claim a batch of messages, then, in the same
 *	  transaction, delete (or mark sent) the delivered ones, schedule retries
 *	  for the failed ones and move the hopeless ones to outbox_dead_letter.
 *
 * Every statement is prepared once per extension schema and takes the whole
 * batch as arrays, so a batch costs a handful of statements whatever its
 * size.  Callers run inside a transaction with SPI connected.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "storage/lmgr.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "outbox.h"
#include "store.h"

typedef enum StoreStatement
{
	STMT_CLAIM_BELOW,
	STMT_CLAIM_AMONG,
	STMT_CLAIM_ABOVE,
	STMT_CLAIM_EXCEPT,
	STMT_DELETE_SENT,
	STMT_MARK_SENT,
	STMT_RETRY,
	STMT_DEAD_LETTER,
	STMT_PURGE_SENT,
	STMT_NEXT_RETRY,
	STMT_COUNT
} StoreStatement;

typedef struct StoreStatementDef
{
	const char *sql;			/* %1$s is the extension's schema */
	int			nargs;
	Oid			argtypes[3];
} StoreStatementDef;

/*
 * The claim takes waiting rows in id order, skipping rows that another
 * session has locked and the later messages of any key whose earlier message
 * waits to retry: nothing overtakes a message of its own key.  Only retries
 * wait for next_attempt_at: a pending row's is the start of the transaction
 * that wrote it, which can be later than this transaction's now() although
 * the row is committed and visible, and skipping it would let the next
 * message of its key overtake it.
 *
 * The rows of the batch still in flight are no longer locked, since the
 * transaction that claimed them has committed, so the claim leaves them out
 * by id.  Walking past them would cost as much as claiming them; so it
 * claims around them, by index ranges: the rows below the batch, the few ids
 * among its ids that are not its own, and the rows above it; and only when
 * those ids are too many, walks past them after all.
 */
#define CLAIM_SQL(ids_to_claim) \
		"SELECT m.id, m.message_id::text, m.topic, m.key, m.payload, m.headers," \
		"       m.created_at, m.attempts" \
		"  FROM %1$s.outbox_message m" \
		" WHERE " ids_to_claim \
		"   AND m.state <> 'sent'" \
		"   AND (m.state = 'pending' OR m.next_attempt_at <= now())" \
		"   AND (m.key IS NULL OR NOT EXISTS (" \
		"        SELECT FROM %1$s.outbox_message earlier" \
		"         WHERE earlier.state = 'retrying' AND earlier.topic = m.topic" \
		"           AND earlier.key = m.key AND earlier.id < m.id))" \
		" ORDER BY m.id LIMIT $1" \
		" FOR UPDATE OF m SKIP LOCKED"

static const StoreStatementDef statement_defs[STMT_COUNT] = {
	[STMT_CLAIM_BELOW] = {CLAIM_SQL("m.id < $2"), 2, {INT4OID, INT8OID}},
	[STMT_CLAIM_AMONG] = {CLAIM_SQL("m.id = ANY ($2)"), 2, {INT4OID, INT8ARRAYOID}},
	[STMT_CLAIM_ABOVE] = {CLAIM_SQL("m.id > $2"), 2, {INT4OID, INT8OID}},
	[STMT_CLAIM_EXCEPT] = {CLAIM_SQL("m.id <> ALL ($2)"), 2, {INT4OID, INT8ARRAYOID}},
	/*
	 * One scan of the primary key's range ($2, $3) instead of a descent per
	 * id: the ids are tested against the array, hashed, as a filter, which
	 * IS TRUE keeps from becoming an index condition.
	 */
	[STMT_DELETE_SENT] = {
		"DELETE FROM %1$s.outbox_message"
		" WHERE id BETWEEN $2 AND $3 AND (id = ANY ($1)) IS TRUE",
		3, {INT8ARRAYOID, INT8OID, INT8OID}
	},
	[STMT_MARK_SENT] = {
		"UPDATE %1$s.outbox_message m"
		"   SET state = 'sent', sent_at = clock_timestamp(), last_error = NULL,"
		"       kafka_partition = d.kafka_partition, kafka_offset = d.kafka_offset"
		"  FROM unnest($1, $2, $3) AS d(id, kafka_partition, kafka_offset)"
		" WHERE m.id = d.id",
		3, {INT8ARRAYOID, INT4ARRAYOID, INT8ARRAYOID}
	},
	[STMT_RETRY] = {
		"UPDATE %1$s.outbox_message m"
		"   SET state = 'retrying', attempts = m.attempts + 1, last_error = f.error,"
		"       next_attempt_at = clock_timestamp() + f.delay_ms * interval '1 millisecond'"
		"  FROM unnest($1, $2, $3) AS f(id, delay_ms, error)"
		" WHERE m.id = f.id",
		3, {INT8ARRAYOID, INT8ARRAYOID, TEXTARRAYOID}
	},
	[STMT_DEAD_LETTER] = {
		"WITH moved AS ("
		"  DELETE FROM %1$s.outbox_message m"
		"   USING unnest($1, $2) AS f(id, error)"
		"   WHERE m.id = f.id"
		"  RETURNING m.id, m.message_id, m.topic, m.key, m.payload, m.headers,"
		"            m.attempts + 1, m.created_at, f.error)"
		" INSERT INTO %1$s.outbox_dead_letter"
		"        (id, message_id, topic, key, payload, headers, attempts, created_at, error)"
		" SELECT * FROM moved",
		2, {INT8ARRAYOID, TEXTARRAYOID}
	},
	[STMT_PURGE_SENT] = {
		"DELETE FROM %1$s.outbox_message WHERE id IN ("
		"  SELECT id FROM %1$s.outbox_message"
		"   WHERE state = 'sent' AND sent_at < now() - $1 * interval '1 second'"
		"   LIMIT 1000)",
		1, {INT4OID}
	},
	[STMT_NEXT_RETRY] = {
		"SELECT (extract(epoch FROM min(next_attempt_at) - clock_timestamp()) * 1000)::int8"
		"  FROM %1$s.outbox_message WHERE state = 'retrying'",
		0, {InvalidOid}
	},
};

/* Ids this far apart are deleted by two range scans rather than one. */
#define DELETE_RUN_GAP 1000

static SPIPlanPtr plans[STMT_COUNT];
static Oid	plans_namespace = InvalidOid;
static Oid	plans_extension = InvalidOid;

/* The schema the outbox extension is created in, or InvalidOid; and its oid. */
static Oid
extension_namespace(Oid *extension)
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
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return namespace;
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
	Oid			extension = InvalidOid;
	Oid			namespace = extension_namespace(&extension);
	const char *schema;

	if (OidIsValid(namespace))
	{
		Oid			locked = extension;

		/* it may have gone while we waited for the lock: look again */
		LockDatabaseObject(ExtensionRelationId, locked, 0, AccessShareLock);
		namespace = extension_namespace(&extension);
		if (extension != locked)
			namespace = InvalidOid;
	}
	if (!OidIsValid(namespace))
	{
		store_forget_extension();
		return InvalidOid;
	}

	if (namespace == plans_namespace && extension == plans_extension)
		return extension;

	store_forget_extension();
	schema = quote_identifier(get_namespace_name(namespace));
	for (int i = 0; i < STMT_COUNT; i++)
	{
		const StoreStatementDef *def = &statement_defs[i];
		char	   *sql = psprintf(def->sql, schema);

		/*
		 * Always plan for the values at hand: the outbox swings from empty
		 * to a large backlog, and a generic plan cached while it was empty
		 * (a sequential scan to delete a batch by id) drained a backlog
		 * fifteen times slower.  Planning costs far less than that, per
		 * batch.
		 */
		plans[i] = SPI_prepare_cursor(sql, def->nargs, (Oid *) def->argtypes,
									  CURSOR_OPT_CUSTOM_PLAN);
		if (plans[i] == NULL)
			elog(ERROR, "outbox: could not prepare \"%s\": %s",
				 sql, SPI_result_code_string(SPI_result));
		SPI_keepplan(plans[i]);
		pfree(sql);
	}
	plans_namespace = namespace;
	plans_extension = extension;
	return extension;
}

/* Drop the prepared statements, after DROP EXTENSION for instance. */
void
store_forget_extension(void)
{
	for (int i = 0; i < STMT_COUNT; i++)
	{
		if (plans[i])
			SPI_freeplan(plans[i]);
		plans[i] = NULL;
	}
	plans_namespace = InvalidOid;
	plans_extension = InvalidOid;
}

static int
run(StoreStatement stmt, Datum *args, int expected)
{
	int			rc = SPI_execute_plan(plans[stmt], args, NULL, false, 0);

	if (rc != expected)
		elog(ERROR, "outbox: worker statement %d failed: %s",
			 (int) stmt, SPI_result_code_string(rc));
	return rc;
}

static Datum
make_array(Datum *elements, int count, Oid type)
{
	int16		typlen;
	bool		typbyval;
	char		typalign;

	get_typlenbyvalalign(type, &typlen, &typbyval, &typalign);
	return PointerGetDatum(construct_array(elements, count, type, typlen, typbyval, typalign));
}

/*
 * Run one claim statement for up to limit - count more messages, and append
 * them to batch, allocating them in context.  Returns the new count.
 */
static int
claim_more(StoreStatement stmt, Datum ids, OutboxMessage *batch, int count,
		   int limit, MemoryContext context)
{
	Datum		args[2] = {Int32GetDatum(limit - count), ids};
	TupleDesc	desc;

	if (count >= limit)
		return count;

	/*
	 * Every claim statement of a batch sees the same snapshot, as one
	 * statement would: with a snapshot each, a transaction committing
	 * between them could show its later rows and hide its earlier ones.
	 */
	if (SPI_execute_snapshot(plans[stmt], args, NULL, GetActiveSnapshot(),
							 InvalidSnapshot, false, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox: claim statement %d failed", (int) stmt);
	desc = SPI_tuptable->tupdesc;
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		OutboxMessage *m = &batch[count++];
		MemoryContext spi = MemoryContextSwitchTo(context);
		bool		isnull;
		Datum		d;
		bytea	   *payload;

		MemSet(m, 0, sizeof(OutboxMessage));

		m->id = DatumGetInt64(SPI_getbinval(tuple, desc, 1, &isnull));
		m->message_id = TextDatumGetCString(SPI_getbinval(tuple, desc, 2, &isnull));
		m->topic = TextDatumGetCString(SPI_getbinval(tuple, desc, 3, &isnull));
		d = SPI_getbinval(tuple, desc, 4, &isnull);
		m->key = isnull ? NULL : TextDatumGetCString(d);
		payload = DatumGetByteaPCopy(SPI_getbinval(tuple, desc, 5, &isnull));
		m->payload = VARDATA(payload);
		m->payload_len = VARSIZE(payload) - VARHDRSZ;
		d = SPI_getbinval(tuple, desc, 6, &isnull);
		m->headers = isnull ? NULL : DatumGetJsonbPCopy(d);
		m->timestamp_ms = DatumGetTimestampTz(SPI_getbinval(tuple, desc, 7, &isnull)) / 1000 +
			(int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000;
		m->attempts = DatumGetInt32(SPI_getbinval(tuple, desc, 8, &isnull));
		MemoryContextSwitchTo(spi);
	}
	SPI_freetuptable(SPI_tuptable);
	return count;
}

/*
 * Claim up to limit messages in id order, locked until the transaction ends,
 * leaving out the in_flight ones (in id order, as claimed).  The messages are
 * allocated in the caller's memory context.
 */
int
store_claim_batch(OutboxMessage **messages, int limit,
				  const OutboxMessage *in_flight, int in_flight_count)
{
	MemoryContext caller = CurrentMemoryContext;
	OutboxMessage *batch = MemoryContextAlloc(caller, sizeof(OutboxMessage) * Max(limit, 1));
	int64		lowest,
				highest,
				others;
	int			count = 0;

	if (in_flight_count == 0)
	{
		count = claim_more(STMT_CLAIM_ABOVE, Int64GetDatum(PG_INT64_MIN),
						   batch, count, limit, caller);
		*messages = batch;
		return count;
	}

	/* the ids between the lowest and the highest in flight that are not */
	lowest = in_flight[0].id;
	highest = in_flight[in_flight_count - 1].id;
	others = highest - lowest + 1 - in_flight_count;
	if (others <= limit)
	{
		Datum	   *ids = palloc(sizeof(Datum) * Max(others, 1));
		int			nids = 0;
		int			next = 0;

		for (int64 id = lowest; id <= highest; id++)
		{
			if (id == in_flight[next].id)
				next++;
			else
				ids[nids++] = Int64GetDatum(id);
		}
		count = claim_more(STMT_CLAIM_BELOW, Int64GetDatum(lowest),
						   batch, count, limit, caller);
		if (nids > 0)
			count = claim_more(STMT_CLAIM_AMONG, make_array(ids, nids, INT8OID),
							   batch, count, limit, caller);
		count = claim_more(STMT_CLAIM_ABOVE, Int64GetDatum(highest),
						   batch, count, limit, caller);
	}
	else
	{
		Datum	   *ids = palloc(sizeof(Datum) * in_flight_count);

		for (int i = 0; i < in_flight_count; i++)
			ids[i] = Int64GetDatum(in_flight[i].id);
		count = claim_more(STMT_CLAIM_EXCEPT, make_array(ids, in_flight_count, INT8OID),
						   batch, count, limit, caller);
	}
	*messages = batch;
	return count;
}

/*
 * Exponential backoff with jitter: base * 2^attempts, capped, then drawn at
 * random from its upper half so that retries of many messages spread out.
 */
static int64
retry_delay_ms(int attempts)
{
	double		delay = outbox_retry_backoff_base;

	for (int i = 0; i < attempts && delay < outbox_retry_backoff_max; i++)
		delay *= 2;
	delay = Min(delay, (double) outbox_retry_backoff_max);
	return (int64) pg_prng_uint64_range(&pg_global_prng_state,
										(uint64) (delay / 2), (uint64) delay);
}

static char *
describe_failure(OutboxMessage *m)
{
	return psprintf("%s%s", producer_error_text(m->error_code),
					m->possibly_persisted ? " (possibly persisted)" : "");
}

/*
 * Delete the rows of ids (in ascending order), one dense run of ids at a
 * time: a batch is mostly one run, but may hold a straggler far below, and
 * one range scan over both would walk every row between.
 */
static void
delete_by_runs(Datum *ids, int count)
{
	int			first = 0;

	for (int i = 1; i <= count; i++)
	{
		Datum		args[3];

		if (i < count &&
			DatumGetInt64(ids[i]) - DatumGetInt64(ids[i - 1]) <= DELETE_RUN_GAP)
			continue;
		args[0] = make_array(&ids[first], i - first, INT8OID);
		args[1] = ids[first];
		args[2] = ids[i - 1];
		run(STMT_DELETE_SENT, args, SPI_OK_DELETE);
		first = i;
	}
}

/*
 * Record a published batch: delivered rows go (or stay as 'sent'), failed
 * ones wait for a retry or, when hopeless or out of attempts, move to
 * outbox_dead_letter.  DELIVERY_NOT_SENT rows are left as they are.
 */
void
store_record_outcomes(OutboxMessage *messages, int count)
{
	Datum	   *sent_ids = palloc(sizeof(Datum) * count);
	Datum	   *sent_partitions = palloc(sizeof(Datum) * count);
	Datum	   *sent_offsets = palloc(sizeof(Datum) * count);
	Datum	   *retry_ids = palloc(sizeof(Datum) * count);
	Datum	   *retry_delays = palloc(sizeof(Datum) * count);
	Datum	   *retry_errors = palloc(sizeof(Datum) * count);
	Datum	   *dead_ids = palloc(sizeof(Datum) * count);
	Datum	   *dead_errors = palloc(sizeof(Datum) * count);
	int			nsent = 0,
				nretry = 0,
				ndead = 0;

	for (int i = 0; i < count; i++)
	{
		OutboxMessage *m = &messages[i];

		switch (m->outcome)
		{
			case DELIVERY_OK:
				sent_ids[nsent] = Int64GetDatum(m->id);
				sent_partitions[nsent] = Int32GetDatum(m->partition);
				sent_offsets[nsent] = Int64GetDatum(m->offset);
				nsent++;
				break;
			case DELIVERY_RETRY:
				if (m->attempts + 1 < outbox_max_attempts)
				{
					retry_ids[nretry] = Int64GetDatum(m->id);
					retry_delays[nretry] = Int64GetDatum(retry_delay_ms(m->attempts));
					retry_errors[nretry] = CStringGetTextDatum(describe_failure(m));
					nretry++;
					break;
				}
				/* out of attempts */
				dead_ids[ndead] = Int64GetDatum(m->id);
				dead_errors[ndead] = CStringGetTextDatum(psprintf("%s, after %d attempts",
																  describe_failure(m),
																  m->attempts + 1));
				ndead++;
				break;
			case DELIVERY_PERMANENT:
				dead_ids[ndead] = Int64GetDatum(m->id);
				dead_errors[ndead] = CStringGetTextDatum(describe_failure(m));
				ndead++;
				break;
			case DELIVERY_NOT_SENT:
			case DELIVERY_PENDING:
				break;
		}
	}

	if (nsent > 0 && outbox_sent_retention == 0)
		delete_by_runs(sent_ids, nsent);
	else if (nsent > 0)
	{
		Datum		args[3] = {make_array(sent_ids, nsent, INT8OID),
			make_array(sent_partitions, nsent, INT4OID),
		make_array(sent_offsets, nsent, INT8OID)};

		run(STMT_MARK_SENT, args, SPI_OK_UPDATE);
	}
	if (nretry > 0)
	{
		Datum		args[3] = {make_array(retry_ids, nretry, INT8OID),
			make_array(retry_delays, nretry, INT8OID),
		make_array(retry_errors, nretry, TEXTOID)};

		run(STMT_RETRY, args, SPI_OK_UPDATE);
	}
	if (ndead > 0)
	{
		Datum		args[2] = {make_array(dead_ids, ndead, INT8OID),
		make_array(dead_errors, ndead, TEXTOID)};

		run(STMT_DEAD_LETTER, args, SPI_OK_INSERT);
	}

	pg_atomic_fetch_add_u64(&outbox_shared->worker.published, nsent);
	pg_atomic_fetch_add_u64(&outbox_shared->worker.failed, nretry);
	pg_atomic_fetch_add_u64(&outbox_shared->worker.dead_lettered, ndead);
	if (nsent > 0)
	{
		SpinLockAcquire(&outbox_shared->worker.mutex);
		outbox_shared->worker.last_publish_at = GetCurrentTimestamp();
		SpinLockRelease(&outbox_shared->worker.mutex);
	}
	if (nretry + ndead > 0)
	{
		for (int i = 0; i < count; i++)
			if (messages[i].outcome == DELIVERY_RETRY || messages[i].outcome == DELIVERY_PERMANENT)
			{
				outbox_report_error("message %lld to topic \"%s\": %s",
									(long long) messages[i].id, messages[i].topic,
									describe_failure(&messages[i]));
				break;
			}
	}
}

/* Delete one small batch of sent rows older than outbox.sent_retention. */
uint64
store_purge_sent(void)
{
	Datum		args[1] = {Int32GetDatum(outbox_sent_retention)};

	run(STMT_PURGE_SENT, args, SPI_OK_DELETE);
	return SPI_processed;
}

/* Milliseconds until the next retry is due, or -1 if none waits. */
long
store_ms_until_next_retry(void)
{
	bool		isnull;
	Datum		d;

	run(STMT_NEXT_RETRY, NULL, SPI_OK_SELECT);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (isnull)
		return -1;
	return (long) Max(DatumGetInt64(d), 0);
}

/*-------------------------------------------------------------------------
 *
 * exactly_once.c
 *	  outbox.delivery = exactly_once, the publisher's side: its producer's
 *	  transactional.id, the progress record that ends each Kafka
 *	  transaction, and what a transactional producer's start finds.
 *
 * Each batch is one Kafka transaction (pipeline.c), which ends with a
 * progress record listing its messages, (id, message_id) each.  The worker
 * records a batch in its database only once Kafka said the transaction
 * committed, and before it produces the next batch; so if it crashes, at
 * most the transactions after the last one recorded committed unrecorded
 * (one, or more on a standby promoted while it lagged).  A new producer's
 * start, before anything is claimed, fences every earlier producer of the
 * transactional.id (a previous Kafka process, or a publisher on another
 * server holding the same database, after a failover) and reads the
 * progress records that committed since the offset kept in
 * outbox_exactly_once; each message they list that outbox_message still
 * holds with the same message_id is recorded as delivered, as if its
 * report had been read.  The message_id is compared as well as the id, for
 * after a failover two servers may have given one id to two messages.
 *
 * The transactional.id is the cluster's system identifier and the
 * database's oid: a standby, promoted, fences its old primary's publisher;
 * a database restored elsewhere, or copied with CREATE DATABASE, has an id
 * of its own.
 *
 * outbox_exactly_once keeps, for the transactional.id, the progress topic
 * and the offset from which the next start reads.  The start sets it to
 * its own start record's; the recording of a batch moves it to the batch's
 * progress record at most every PROGRESS_SAVE_INTERVAL_MS, so that a start
 * reads the records of a few seconds, not those of the publisher's life.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "exactly_once.h"
#include "settings.h"
#include "statements.h"
#include "store.h"
#include "worker_slot.h"

/* How often the recording of batches moves the offset a start reads from. */
#define PROGRESS_SAVE_INTERVAL_MS 10000

#define STATE_TABLE "outbox_exactly_once"

/* When the offset was last moved; 0: not since the start. */
static TimestampTz progress_saved_at = 0;

bool
exactly_once_wanted(void)
{
	return outbox_delivery == OUTBOX_DELIVERY_EXACTLY_ONCE;
}

/* "outbox-<system identifier>-<database oid>"; see the header comment. */
char *
exactly_once_transactional_id(void)
{
	return psprintf("outbox-" UINT64_FORMAT "-%u", GetSystemIdentifier(), MyDatabaseId);
}

/* The extension's schema, quoted, for the statements below. */
static const char *
schema(void)
{
	return quote_identifier(get_namespace_name(store_extension_namespace()));
}

/*
 * The progress record of messages about to be produced into the open
 * transaction: each one's id and message_id.  The transaction is committed
 * only if each of them is delivered.  Sets *len.
 */
char *
exactly_once_progress_record(const OutboxMessage *messages, int count, int *len)
{
	char	   *record;
	char	   *entry;

	*len = PROGRESS_HEADER_SIZE + count * PROGRESS_ENTRY_SIZE;
	record = palloc(*len);
	progress_header(record, PROGRESS_KIND_BATCH, count);
	entry = record + PROGRESS_HEADER_SIZE;
	for (int i = 0; i < count; i++)
	{
		const OutboxMessage *m = &messages[i];

		progress_put_le(entry, (uint64) m->id, 8);
		memcpy(entry + 8,
			   DatumGetUUIDP(DirectFunctionCall1(uuid_in, CStringGetDatum(m->message_id)))->data,
			   PROGRESS_UUID_SIZE);
		entry += PROGRESS_ENTRY_SIZE;
	}
	return record;
}

static void
commit_transaction(MemoryContext caller)
{
	statements_commit_transaction(caller);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*
 * Are the extension and its outbox_exactly_once there?  The table is not
 * before ALTER EXTENSION UPDATE to 0.10.0: the worker says so, and
 * publishes nothing.
 */
static bool
state_table_ready(char *errbuf, size_t errlen)
{
	if (!OidIsValid(store_find_extension()))
		snprintf(errbuf, errlen, "the extension is not there");
	else if (!OidIsValid(get_relname_relid(STATE_TABLE, store_extension_namespace())))
		snprintf(errbuf, errlen,
				 "outbox.delivery = exactly_once needs the extension's version 0.10.0 or later: run ALTER EXTENSION outbox UPDATE");
	else
		return true;
	return false;
}

/* The offset the start reads from: the one kept for this id and topic, else -1. */
static int64
saved_progress_offset(const char *transactional_id)
{
	Oid			types[2] = {TEXTOID, TEXTOID};
	Datum		values[2] = {CStringGetTextDatum(transactional_id),
	CStringGetTextDatum(outbox_progress_topic)};
	bool		isnull;
	char	   *sql = psprintf("SELECT progress_offset FROM %s." STATE_TABLE
						   " WHERE transactional_id = $1 AND progress_topic = $2",
						   schema());

	if (SPI_execute_with_args(sql, 2, types, values, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox: cannot read " STATE_TABLE);
	if (SPI_processed == 0)
		return -1;
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/* Keep the offset the next start reads from, for this id alone. */
static void
save_progress_offset(const char *transactional_id, int64 offset)
{
	Oid			types[3] = {TEXTOID, TEXTOID, INT8OID};
	Datum		values[3] = {CStringGetTextDatum(transactional_id),
		CStringGetTextDatum(outbox_progress_topic), Int64GetDatum(offset)};
	char	   *sql = psprintf("WITH others AS (DELETE FROM %1$s." STATE_TABLE
						   "                 WHERE transactional_id <> $1)"
						   " INSERT INTO %1$s." STATE_TABLE
						   "        (transactional_id, progress_topic, progress_offset, recorded_at)"
						   " VALUES ($1, $2, $3, pg_catalog.now())"
						   " ON CONFLICT (transactional_id) DO UPDATE"
						   " SET progress_topic = EXCLUDED.progress_topic,"
						   "     progress_offset = EXCLUDED.progress_offset,"
						   "     recorded_at = EXCLUDED.recorded_at",
						   schema());

	if (SPI_execute_with_args(sql, 3, types, values, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "outbox: cannot write " STATE_TABLE);
	progress_saved_at = GetCurrentTimestamp();
}

/*
 * Record as delivered the messages a progress record lists that
 * outbox_message holds, with the same message_id, and has not recorded so.
 * Returns how many.
 */
static uint64
settle_listed(const char *record)
{
	uint32		count = (uint32) progress_get_le(record + 5, 4);
	Datum	   *ids = palloc(sizeof(Datum) * count);
	Datum	   *message_ids = palloc(sizeof(Datum) * count);
	Oid			types[2] = {INT8ARRAYOID, UUIDARRAYOID};
	Datum		values[2];
	const char *entry = record + PROGRESS_HEADER_SIZE;
	char	   *sql;

	for (uint32 i = 0; i < count; i++, entry += PROGRESS_ENTRY_SIZE)
	{
		pg_uuid_t  *uuid = palloc(sizeof(pg_uuid_t));

		ids[i] = Int64GetDatum((int64) progress_get_le(entry, 8));
		memcpy(uuid->data, entry + 8, PROGRESS_UUID_SIZE);
		message_ids[i] = UUIDPGetDatum(uuid);
	}
	values[0] = statement_array(ids, count, INT8OID);
	values[1] = statement_array(message_ids, count, UUIDOID);
	if (outbox_sent_retention == 0)
		sql = psprintf("DELETE FROM %s.outbox_message m"
					   " USING ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS l(id, message_id)"
					   " WHERE m.id = l.id AND m.message_id = l.message_id AND m.state <> 'sent'",
					   schema());
	else
		sql = psprintf("UPDATE %s.outbox_message m"
					   "   SET state = 'sent', sent_at = pg_catalog.clock_timestamp(), last_error = NULL"
					   "  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS l(id, message_id)"
					   " WHERE m.id = l.id AND m.message_id = l.message_id AND m.state <> 'sent'",
					   schema());
	if (SPI_execute_with_args(sql, 2, types, values, NULL, false, 0) < 0)
		elog(ERROR, "outbox: cannot record the messages of a committed Kafka transaction");
	return SPI_processed;
}

/*
 * A transactional producer's start: read the offset kept, have the producer
 * fence its predecessors and read the progress records since, and record
 * the messages they list as delivered, and where the next start reads
 * from, in one transaction.  On failure returns false, with the reason in
 * errbuf; nothing may be published then.
 */
bool
exactly_once_start(OutboxProducer *producer, const char *transactional_id,
				   char *errbuf, size_t errlen)
{
	MemoryContext caller = CurrentMemoryContext;
	ProducerRecovery recovery = {caller, NIL, -1, 0};
	int64		from;
	uint64		settled = 0;
	ListCell   *lc;

	statements_begin_transaction("outbox: reading outbox_exactly_once");
	if (!state_table_ready(errbuf, errlen))
	{
		commit_transaction(caller);
		return false;
	}
	from = saved_progress_offset(transactional_id);
	commit_transaction(caller);

	if (!producer_recover(producer, from, &recovery, errbuf, errlen))
		return false;

	statements_begin_transaction("outbox: recording what Kafka committed");
	if (!state_table_ready(errbuf, errlen))
	{
		commit_transaction(caller);
		return false;
	}
	foreach(lc, recovery.records)
		settled += settle_listed(lfirst(lc));
	save_progress_offset(transactional_id, recovery.start_offset);
	commit_transaction(caller);

	if (settled > 0)
		ereport(LOG,
				(errmsg("outbox: " UINT64_FORMAT " messages published in Kafka transactions that committed before the publisher restarted are recorded as delivered",
						settled)));
	if (recovery.gone > 0)
		worker_report_error(WARNING,
							"the progress topic \"%s\" no longer holds " INT64_FORMAT " of the records a restart reads (its retention): messages of a transaction committed before the restart may be published again",
							outbox_progress_topic, recovery.gone);
	return true;
}

/*
 * In the transaction that records a batch: move the offset a start reads
 * from to the batch's progress record, if it was last moved long enough
 * ago.  Every record below it is recorded here.
 */
void
exactly_once_note_recorded(int64 progress_offset)
{
	if (progress_offset < 0 ||
		!TimestampDifferenceExceeds(progress_saved_at, GetCurrentTimestamp(),
									PROGRESS_SAVE_INTERVAL_MS))
		return;
	save_progress_offset(exactly_once_transactional_id(), progress_offset);
}

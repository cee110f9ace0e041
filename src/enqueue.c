/*-------------------------------------------------------------------------
 *
 * enqueue.c
 *	  The application's side: outbox_enqueue(), the checks on every new
 *	  outbox row, per-key ordering of concurrent enqueues, and the wake of
 *	  the worker when a transaction that enqueued commits.
 *
 * Both ways in, outbox_enqueue() and a plain INSERT INTO outbox_message,
 * end in the row trigger outbox_message_check(), so both get the same checks
 * and the same wake.  Checks raise an ERROR in the application's own
 * transaction, so a message that could never be delivered is refused before
 * it is committed.  Each way in, and the capture's, also refuses a topic
 * that the role enqueueing was not granted (topic_grant.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/partition.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "commit_report.h"
#include "enqueue.h"
#include "key_lock.h"
#include "message.h"
#include "row_writer.h"
#include "serving.h"
#include "settings.h"
#include "statements.h"
#include "topic_grant.h"
#include "trace_context.h"
#include "worker_slot.h"

/*
 * The most framing a Kafka record can need around its key, value and
 * headers: the varints of its length, timestamp and offset deltas, key and
 * value lengths and header count, and its attributes byte.
 */
#define KAFKA_RECORD_MAX_FRAMING 36

/*
 * The most headers a message may have, besides the message id header.
 * Kafka sets no limit, but every consumer reads every header of a record,
 * and a librdkafka consumer has been seen to fail ("Bad message format") on
 * a record of 100,000 small headers.  10,000 leave room for any use of
 * headers; test/t/103_fuzz.pl reads 10,000 back through librdkafka.
 */
#define MAX_HEADERS 10000

/*
 * Header names the extension writes into every record itself: a message
 * that named one would reach Kafka with two, and a consumer that reads the
 * first (most do) would take the enqueuer's value for the extension's, and
 * deduplicate on it.  Compared without regard to case, as some consumers'
 * header maps do.
 */
static const char *const reserved_header_names[] = {MESSAGE_ID_HEADER};

/* Set when this transaction wrote an outbox row; the commit wakes the worker. */
static bool wake_worker_at_commit = false;

/* The lowest id this transaction wrote, while wake_worker_at_commit is set. */
static int64 lowest_id_written;

/* When the first delayed message it wrote is due; DT_NOEND if it wrote none. */
static TimestampTz earliest_delayed_due = DT_NOEND;

/*
 * Set while outbox_enqueue() inserts the row it has checked and whose key it
 * has locked, so that the trigger does not do it all again.
 */
static bool inserting_checked_row = false;

/*
 * The INSERT that outbox_enqueue() runs, prepared once per schema; it sets
 * the columns 0.6.0 added only on a table that has them.
 */
static SPIPlanPtr enqueue_plan = NULL;
static Oid	enqueue_plan_namespace = InvalidOid;

#define ENQUEUE_INSERT_ARGS 6

/* outbox_enqueue()'s arguments, by position. */
typedef enum EnqueueArg
{
	ARG_TOPIC,
	ARG_PAYLOAD,
	ARG_KEY,
	ARG_HEADERS,
	ARG_PARTITION,				/* from schema 0.6.0 on */
	ARG_DELIVER_AFTER,
	ARG_DELIVER_AT
} EnqueueArg;

static void note_row_written(int64 id);

PG_FUNCTION_INFO_V1(outbox_enqueue_jsonb);
PG_FUNCTION_INFO_V1(outbox_enqueue_bytes);
PG_FUNCTION_INFO_V1(outbox_message_check);
PG_FUNCTION_INFO_V1(outbox_uuid_v7);

/*
 * Refuse a topic Kafka would refuse: Kafka allows only ASCII letters,
 * digits, '.', '_' and '-', at most KAFKA_MAX_TOPIC_LENGTH characters, and
 * not "." or "..".  what names whose topic it is, in the error: "outbox"
 * or "inbox".
 */
void
check_kafka_topic(const char *what, text *topic)
{
	const char *s;
	int			len;

	if (topic == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s topic must not be NULL", what),
				 errhint("Name the Kafka topic the message goes to.")));

	s = VARDATA_ANY(topic);
	len = VARSIZE_ANY_EXHDR(topic);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s topic must not be empty", what),
				 errhint("Name the Kafka topic the message goes to.")));
	if (len > KAFKA_MAX_TOPIC_LENGTH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s topic is %d characters long, Kafka allows at most %d",
						what, len, KAFKA_MAX_TOPIC_LENGTH),
				 errhint("Use a shorter topic name.")));
	if ((len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.'))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s topic \"%.*s\" is not a valid Kafka topic name", what, len, s),
				 errhint("Kafka does not allow the topic names \".\" and \"..\".")));
	for (int i = 0; i < len; i++)
	{
		if (!kafka_topic_char(s[i]))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s topic \"%.*s\" is not a valid Kafka topic name", what, len, s),
					 errdetail("Character %d is not allowed.", i + 1),
					 errhint("Kafka topic names may contain only ASCII letters, digits, \".\", \"_\" and \"-\".")));
	}
}

/*
 * The bytes a zigzag varint takes to encode a length: Kafka's record format
 * writes every length of a record this way.
 */
static Size
kafka_varint_size(Size length)
{
	uint64		zigzag = (uint64) length << 1;
	Size		size = 1;

	while (zigzag >= 0x80)
	{
		zigzag >>= 7;
		size++;
	}
	return size;
}

/* One header as a Kafka record holds it: name and value, each with its length. */
static Size
kafka_header_size(Size name_len, Size value_len)
{
	return kafka_varint_size(name_len) + name_len + kafka_varint_size(value_len) + value_len;
}

/*
 * Refuse a message whose Kafka record would be larger than
 * outbox.max_payload_size.  The record is counted as librdkafka counts it
 * against message.max.bytes before it takes a message (librdkafka 2.0.2,
 * rd_kafka_msg_max_wire_size()): key, value and headers, the header the
 * worker adds included, plus KAFKA_RECORD_MAX_FRAMING.  A message that
 * passed a check of its payload alone could still be refused by librdkafka
 * for its key or headers, and would then be dead-lettered long after its
 * transaction committed.
 */
static Size
record_size(Size payload_len, text *key, Size headers_size)
{
	Size		key_len = key ? VARSIZE_ANY_EXHDR(key) : 0;

	/* the worker adds the message id header */
	return KAFKA_RECORD_MAX_FRAMING + payload_len + key_len + headers_size +
		kafka_header_size(strlen(MESSAGE_ID_HEADER), UUID_TEXT_LENGTH);
}

static void
check_record_size(Size payload_len, text *key, Size headers_size)
{
	Size		key_len = key ? VARSIZE_ANY_EXHDR(key) : 0;
	Size		all_headers;
	Size		size = record_size(payload_len, key, headers_size);

	all_headers = headers_size + kafka_header_size(strlen(MESSAGE_ID_HEADER), UUID_TEXT_LENGTH);
	if (size > (Size) outbox_max_record_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("outbox message would be a Kafka record of %zu bytes, more than outbox.max_payload_size (%d bytes)",
						size, outbox_max_record_size),
				 errdetail("Payload %zu bytes, key %zu bytes, headers %zu bytes (%s included), framing %d bytes.",
						   payload_len, key_len, all_headers, MESSAGE_ID_HEADER,
						   KAFKA_RECORD_MAX_FRAMING),
				 errhint("Kafka refuses larger records unless the producer's message.max.bytes and the topic's max.message.bytes allow them; "
						 "store large content elsewhere and enqueue a reference to it.")));
}

/* Refuse a header name that the extension writes itself. */
static void
check_header_name(const char *name, int len)
{
	for (int i = 0; i < (int) lengthof(reserved_header_names); i++)
		if (len == (int) strlen(reserved_header_names[i]) &&
			pg_strncasecmp(name, reserved_header_names[i], len) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("outbox header \"%.*s\" is reserved", len, name),
					 errdetail("The extension adds the header \"%s\" to every record itself.",
							   reserved_header_names[i]),
					 errhint("Give the header another name; the record's own \"%s\" is the message's message_id.",
							 reserved_header_names[i])));
}

/*
 * Kafka headers are name/value pairs of bytes: a JSON object of strings,
 * none named as a header the extension writes.  Returns the size the
 * headers take in a Kafka record.
 */
static Size
check_headers(Jsonb *headers)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken token;
	bool		expect_value = false;
	Size		name_len = 0;
	Size		size = 0;

	if (headers == NULL)
		return 0;

	if (!JB_ROOT_IS_OBJECT(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox headers must be a JSON object"),
				 errhint("Pass headers as an object of string values, for example '{\"trace-id\": \"abc\"}'.")));
	if (JB_ROOT_COUNT(headers) > MAX_HEADERS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("outbox message has %u headers, more than the %d allowed",
						JB_ROOT_COUNT(headers), MAX_HEADERS),
				 errhint("Every consumer reads every header of a record; put such data in the payload.")));

	it = JsonbIteratorInit(&headers->root);
	while ((token = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (token == WJB_KEY)
		{
			check_header_name(v.val.string.val, v.val.string.len);
			name_len = v.val.string.len;
			expect_value = true;
		}
		else if (token == WJB_VALUE && expect_value)
		{
			if (v.type != jbvString && v.type != jbvNull)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("outbox header values must be strings or null"),
						 errhint("Turn numbers, booleans and nested values into strings.")));
			size += kafka_header_size(name_len, v.type == jbvString ? v.val.string.len : 0);
			expect_value = false;
		}
	}
	return size;
}

/*
 * Prepare the enqueue INSERT for the extension's schema, once per schema
 * (SPI connected): with the partition and the delay where the schema has
 * the columns for them.
 */
static void
prepare_enqueue_insert(Oid namespace)
{
	Oid			argtypes[ENQUEUE_INSERT_ARGS] = {TEXTOID, TEXTOID, BYTEAOID, JSONBOID, INT4OID, TIMESTAMPTZOID};
	const char *schema = quote_identifier(get_namespace_name(namespace));
	char	   *sql;
	SPIPlanPtr	plan;

	if (enqueue_plan != NULL && enqueue_plan_namespace == namespace)
		return;
	if (schema_has_target_partition(namespace))
		sql = psprintf("INSERT INTO %s.outbox_message"
					   " (topic, key, payload, headers, target_partition, state, next_attempt_at)"
					   " VALUES ($1, $2, $3, $4, $5,"
					   "         CASE WHEN $6 IS NULL THEN 'pending' ELSE 'retrying' END,"
					   "         coalesce($6, pg_catalog.now()))"
					   " RETURNING id", schema);
	else
		sql = psprintf("INSERT INTO %s.outbox_message (topic, key, payload, headers) "
					   "VALUES ($1, $2, $3, $4) RETURNING id", schema);
	plan = SPI_prepare(sql, ENQUEUE_INSERT_ARGS, argtypes);
	if (plan == NULL)
		elog(ERROR, "outbox: could not prepare the enqueue statement: %s",
			 SPI_result_code_string(SPI_result));
	SPI_keepplan(plan);
	if (enqueue_plan)
		SPI_freeplan(enqueue_plan);
	enqueue_plan = plan;
	enqueue_plan_namespace = namespace;
}

/* The enqueue INSERT's parameters for a message; NULL where it has none. */
static void
enqueue_insert_args(const NewMessage *message, Datum *values, char *nulls)
{
	values[0] = PointerGetDatum(message->topic);
	nulls[0] = ' ';
	values[1] = PointerGetDatum(message->key);
	nulls[1] = message->key ? ' ' : 'n';
	values[2] = PointerGetDatum(message->payload);
	nulls[2] = message->payload ? ' ' : 'n';
	values[3] = PointerGetDatum(message->headers);
	nulls[3] = message->headers ? ' ' : 'n';
	values[4] = Int32GetDatum(message->target_partition);
	nulls[4] = message->target_partition != ANY_PARTITION ? ' ' : 'n';
	values[5] = TimestampTzGetDatum(message->deliver_at);
	nulls[5] = message->deliver_at != 0 ? ' ' : 'n';
}

/*
 * Insert a checked message through an INSERT prepared once, which fires the
 * trigger (told by inserting_checked_row that the row is checked); returns
 * its id.
 */
static int64
insert_through_spi(Oid namespace, const NewMessage *message)
{
	Datum		values[ENQUEUE_INSERT_ARGS];
	char		nulls[ENQUEUE_INSERT_ARGS];
	bool		isnull;
	int64		id;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "outbox: SPI_connect failed");
	prepare_enqueue_insert(namespace);
	enqueue_insert_args(message, values, nulls);

	inserting_checked_row = true;
	PG_TRY();
	{
		if (SPI_execute_plan(enqueue_plan, values, nulls, false, 1) != SPI_OK_INSERT_RETURNING ||
			SPI_processed != 1)
			elog(ERROR, "outbox: enqueue insert did not return an id");
	}
	PG_FINALLY();
	{
		inserting_checked_row = false;
	}
	PG_END_TRY();

	id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	return id;
}

/*
 * Insert a checked message whose key is locked; returns its id.  The row
 * writer writes it straight into its segment, doing the trigger's work
 * itself; a table it does not write gets an INSERT.
 */
static int64
insert_message(Oid namespace, const NewMessage *message)
{
	int64		id;

	if (row_writer_insert(namespace, message, &id))
		note_row_written(id);
	else
		id = insert_through_spi(namespace, message);
	if (message->deliver_at != 0)
		earliest_delayed_due = Min(earliest_delayed_due, message->deliver_at);
	return id;
}

/*
 * The headers of a message with the trace context added, if it has one and
 * the record stays within outbox.max_payload_size with it; *headers_size
 * is updated.  A trace context never makes a write fail: one that would
 * make the record too large is left out, with a NOTICE.
 */
static Jsonb *
with_trace_context(Jsonb *headers, Size payload_len, text *key, Size *headers_size)
{
	Jsonb	   *traced = trace_context_add_headers(headers);
	Size		traced_size;

	if (traced == headers)
		return headers;
	traced_size = check_headers(traced);
	if (record_size(payload_len, key, traced_size) > (Size) outbox_max_record_size &&
		record_size(payload_len, key, *headers_size) <= (Size) outbox_max_record_size)
	{
		ereport(NOTICE,
				(errmsg("outbox: the message is enqueued without its trace context, which would make its record larger than outbox.max_payload_size (%d bytes)",
						outbox_max_record_size)));
		return headers;
	}
	*headers_size = traced_size;
	return traced;
}

/*
 * Check a message, add the trace context to its headers, lock its key and
 * insert it into the outbox of this namespace; returns its id.  The one way
 * in for outbox_enqueue() and for the rows outbox_capture() captures.
 */
int64
enqueue_message(Oid namespace, NewMessage *message)
{
	Size		headers_size;
	Size		payload_len = message->payload ? VARSIZE_ANY_EXHDR(message->payload) : 0;

	check_kafka_topic("outbox", message->topic);
	headers_size = check_headers(message->headers);
	message->headers = with_trace_context(message->headers, payload_len, message->key,
										  &headers_size);
	check_record_size(payload_len, message->key, headers_size);
	if (message->key)
		key_lock_acquire(message->topic, message->key);
	return insert_message(namespace, message);
}

/*
 * Refuse a delay longer than outbox.max_delay: until it is sent, a delayed
 * message holds back every later message of its key, whoever enqueues
 * them.  Both ways to delay, deliver_after and deliver_at, come here.
 */
static void
check_delay_ceiling(TimestampTz now, TimestampTz due)
{
	if (due > now && (due - now) / USECS_PER_SEC > (int64) outbox_max_delay)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox delivery time %s is more than outbox.max_delay (%s) from now",
						timestamptz_to_str(due), GetConfigOptionByName("outbox.max_delay", NULL, false)),
				 errdetail("A delayed message holds back every later message of its key until it is sent."),
				 errhint("Give a shorter delay, or keep far-off schedules in a table of your own and enqueue when they are due; "
						 "a superuser may raise outbox.max_delay.")));
}

/*
 * When a message enqueued with deliver_after or deliver_at is due: 0 for
 * now (neither given, or a time already past).
 */
static TimestampTz
delivery_time(FunctionCallInfo fcinfo)
{
	TimestampTz now;
	TimestampTz due;

	if (PG_ARGISNULL(ARG_DELIVER_AFTER) && PG_ARGISNULL(ARG_DELIVER_AT))
		return 0;
	if (!PG_ARGISNULL(ARG_DELIVER_AFTER) && !PG_ARGISNULL(ARG_DELIVER_AT))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox_enqueue() takes deliver_after or deliver_at, not both")));
	now = GetCurrentTimestamp();
	if (!PG_ARGISNULL(ARG_DELIVER_AFTER))
	{
		due = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
													  TimestampTzGetDatum(now),
													  PG_GETARG_DATUM(ARG_DELIVER_AFTER)));
		if (due < now)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("outbox deliver_after must not be negative"),
					 errhint("Pass an interval of zero or more, or deliver_at.")));
	}
	else
		due = PG_GETARG_TIMESTAMPTZ(ARG_DELIVER_AT);
	if (TIMESTAMP_NOT_FINITE(due))
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("outbox delivery time must be finite")));
	check_delay_ceiling(now, due);
	return due > now ? due : 0;
}

/*
 * The outbox_enqueue() function's schema, whose outbox it writes, and its
 * owner, the extension's: found once per query (fn_extra).
 */
typedef struct EnqueueFunction
{
	Oid			namespace;
	Oid			owner;
} EnqueueFunction;

static const EnqueueFunction *
enqueue_function(FunctionCallInfo fcinfo)
{
	FmgrInfo   *flinfo = fcinfo->flinfo;
	EnqueueFunction *found = flinfo->fn_extra;
	HeapTuple	tuple;

	if (found != NULL)
		return found;
	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(flinfo->fn_oid));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for function %u", flinfo->fn_oid);
	found = MemoryContextAlloc(flinfo->fn_mcxt, sizeof(EnqueueFunction));
	found->namespace = ((Form_pg_proc) GETSTRUCT(tuple))->pronamespace;
	found->owner = ((Form_pg_proc) GETSTRUCT(tuple))->proowner;
	ReleaseSysCache(tuple);
	flinfo->fn_extra = found;
	return found;
}

/*
 * Enqueue a message as the caller, once its topic is checked: the caller
 * must be granted it (topic_grant.c), the check being of the role that
 * calls, as PostgreSQL checks a privilege.  The message is then written as
 * the function's owner, the extension's, as a SECURITY DEFINER function
 * would (so that the caller needs no privilege on outbox_message); an
 * error puts the role back as the (sub)transaction aborts.
 */
static int64
enqueue_as_caller(FunctionCallInfo fcinfo, NewMessage *message)
{
	const EnqueueFunction *function = enqueue_function(fcinfo);
	Oid			saved_user;
	int			saved_context;
	int64		id;

	check_kafka_topic("outbox", message->topic);
	topic_grant_check_publish(message->topic);
	GetUserIdAndSecContext(&saved_user, &saved_context);
	SetUserIdAndSecContext(function->owner, saved_context | SECURITY_LOCAL_USERID_CHANGE);
	id = enqueue_message(function->namespace, message);
	SetUserIdAndSecContext(saved_user, saved_context);
	return id;
}

/*
 * The common part of the outbox_enqueue() variants, once the payload
 * is in its bytes.  Checking here rather than in the trigger lets the errors
 * name the function's arguments.  The functions of a schema before 0.6.0
 * take four arguments.
 */
static Datum
enqueue(FunctionCallInfo fcinfo, bytea *payload)
{
	NewMessage	message;

	message.topic = PG_ARGISNULL(ARG_TOPIC) ? NULL : PG_GETARG_TEXT_PP(ARG_TOPIC);
	message.key = PG_ARGISNULL(ARG_KEY) ? NULL : PG_GETARG_TEXT_PP(ARG_KEY);
	message.payload = payload;
	message.headers = PG_ARGISNULL(ARG_HEADERS) ? NULL : PG_GETARG_JSONB_P(ARG_HEADERS);
	message.target_partition = ANY_PARTITION;
	message.deliver_at = 0;
	if (PG_NARGS() > ARG_DELIVER_AT)
	{
		if (!PG_ARGISNULL(ARG_PARTITION))
		{
			message.target_partition = PG_GETARG_INT32(ARG_PARTITION);
			if (message.target_partition < 0)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("outbox partition must be 0 or more, not %d", message.target_partition),
						 errhint("Pass NULL to leave the partition to the producer's partitioner, by key.")));
		}
		message.deliver_at = delivery_time(fcinfo);
	}

	PG_RETURN_INT64(enqueue_as_caller(fcinfo, &message));
}

static void
check_payload_not_null(FunctionCallInfo fcinfo)
{
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outbox payload must not be NULL"),
				 errhint("Enqueue an empty payload ('') or a JSON null ('null'::jsonb) if the message has no content.")));
}

Datum
outbox_enqueue_jsonb(PG_FUNCTION_ARGS)
{
	Jsonb	   *json;
	char	   *serialized;

	check_payload_not_null(fcinfo);
	json = PG_GETARG_JSONB_P(1);
	serialized = JsonbToCString(NULL, &json->root, VARSIZE(json));
	return enqueue(fcinfo, (bytea *) cstring_to_text(serialized));
}

/* text and bytea share their representation: the bytes go as they are. */
Datum
outbox_enqueue_bytes(PG_FUNCTION_ARGS)
{
	bytea	   *payload;

	check_payload_not_null(fcinfo);
	payload = PG_GETARG_BYTEA_PP(1);
	return enqueue(fcinfo, payload);
}

/*
 * The checks of outbox_enqueue() on a row inserted directly; returns its
 * topic and key.
 */
static void
check_inserted_row(HeapTuple tuple, TupleDesc desc, text **topic, text **key)
{
	bool		isnull;
	Datum		value;
	Size		payload_len;
	Size		headers_size;

	value = heap_getattr(tuple, SPI_fnumber(desc, "topic"), desc, &isnull);
	*topic = isnull ? NULL : DatumGetTextPP(value);
	check_kafka_topic("outbox", *topic);

	value = heap_getattr(tuple, SPI_fnumber(desc, "payload"), desc, &isnull);
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outbox payload must not be NULL"),
				 errhint("Insert an empty payload ('') if the message has no content.")));
	payload_len = toast_raw_datum_size(value) - VARHDRSZ;

	value = heap_getattr(tuple, SPI_fnumber(desc, "headers"), desc, &isnull);
	headers_size = check_headers(isnull ? NULL : DatumGetJsonbP(value));

	value = heap_getattr(tuple, SPI_fnumber(desc, "key"), desc, &isnull);
	*key = isnull ? NULL : DatumGetTextPP(value);

	check_record_size(payload_len, *key, headers_size);

	value = heap_getattr(tuple, SPI_fnumber(desc, "state"), desc, &isnull);
	if (!isnull && strcmp(TextDatumGetCString(value), "pending") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a new outbox message must be in state \"pending\""),
				 errhint("Leave the state column out of the INSERT.")));
}

/*
 * A row inserted directly, with the trace context added to its headers
 * (where the record stays within outbox.max_payload_size with it).
 */
static HeapTuple
add_trace_context(HeapTuple tuple, TupleDesc desc)
{
	int			attnum = SPI_fnumber(desc, "headers");
	bool		isnull;
	Datum		value = heap_getattr(tuple, attnum, desc, &isnull);
	Jsonb	   *headers = isnull ? NULL : DatumGetJsonbP(value);
	Size		headers_size = check_headers(headers);
	Size		payload_len = 0;
	text	   *key = NULL;
	Jsonb	   *traced;

	value = heap_getattr(tuple, SPI_fnumber(desc, "payload"), desc, &isnull);
	if (!isnull)
		payload_len = toast_raw_datum_size(value) - VARHDRSZ;
	value = heap_getattr(tuple, SPI_fnumber(desc, "key"), desc, &isnull);
	if (!isnull)
		key = DatumGetTextPP(value);
	traced = with_trace_context(headers, payload_len, key, &headers_size);

	if (traced == headers)
		return tuple;
	value = JsonbPGetDatum(traced);
	isnull = false;
	return heap_modify_tuple_by_cols(tuple, desc, 1, &attnum, &value, &isnull);
}

/*
 * The outbox's table and the sequence of its ids, the ones beside the
 * trigger function; the segment the trigger fires on, once it is known to
 * be one of that table's, and its id column.  Found once per query and
 * segment (so never stale after ALTER EXTENSION UPDATE, which replaces the
 * table and the sequence): each segment has its own copy of the trigger.
 */
typedef struct OutboxRelations
{
	Oid			table;
	Oid			id_sequence;
	Oid			segment;
	AttrNumber	id_attnum;
} OutboxRelations;

static OutboxRelations *
outbox_relations(FunctionCallInfo fcinfo)
{
	FmgrInfo   *flinfo = fcinfo->flinfo;
	OutboxRelations *found = flinfo->fn_extra;

	if (found == NULL)
	{
		Oid			namespace = get_func_namespace(flinfo->fn_oid);

		found = MemoryContextAllocZero(flinfo->fn_mcxt, sizeof(OutboxRelations));
		found->table = get_relname_relid("outbox_message", namespace);
		found->id_sequence = get_relname_relid("outbox_message_id_seq", namespace);
		flinfo->fn_extra = found;
	}
	return found;
}

/* Is rel the outbox's table, or one of its segments? */
static bool
is_outbox_table(Relation rel, Oid table)
{
	if (RelationGetRelid(rel) == table)
		return true;			/* under schema 0.1.0 and 0.2.0 */
	return rel->rd_rel->relispartition &&
		get_partition_parent(RelationGetRelid(rel), false) == table;
}

/*
 * Refuse to fire on any table but the outbox's own.  The trigger reads its
 * table's columns as the outbox's types and takes key locks: attached to a
 * table of another shape it would read a number as a pointer and crash the
 * server, and on a look-alike table it would let any role take the key
 * locks of another.  Returns the table's id column.
 */
static AttrNumber
check_fires_on_outbox(FunctionCallInfo fcinfo, Relation rel)
{
	OutboxRelations *outbox = outbox_relations(fcinfo);

	if (outbox->segment != RelationGetRelid(rel))
	{
		if (!is_outbox_table(rel, outbox->table))
			ereport(ERROR,
					(errcode(ERRCODE_WRONG_OBJECT_TYPE),
					 errmsg("outbox_message_check() fires only on the outbox's own table, not on \"%s\"",
							RelationGetRelationName(rel)),
					 errhint("To enqueue, call outbox_enqueue() or insert into outbox_message.")));
		outbox->segment = RelationGetRelid(rel);
		outbox->id_attnum = get_attnum(outbox->segment, "id");
	}
	return outbox->id_attnum;
}

/* Note a row this transaction writes, for the wake and the claim floor. */
static void
note_row_written(int64 id)
{
	if (!wake_worker_at_commit)
	{
		serving_warn_if_unserved();
		lowest_id_written = id;
	}
	else if (id < lowest_id_written)
		lowest_id_written = id;
	wake_worker_at_commit = true;
}

/* Refuse to run as anything but a BEFORE INSERT FOR EACH ROW trigger. */
static void
check_called_as_row_trigger(FunctionCallInfo fcinfo)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		elog(ERROR, "outbox_message_check must be a BEFORE INSERT FOR EACH ROW trigger");
}

/*
 * Does the row come with its id?  Then it is one being restored (pg_restore,
 * or psql running pg_dumpall's output): only the owner may write the id
 * column.  It was checked when it was first enqueued, may be retrying or
 * sent, and keeps its id, so that its order and its dead letters' ids stay
 * as they were.  Under schema 0.1.0 the identity default has filled in
 * every id, and no row is taken for a restored one.
 */
static bool
row_is_restored(HeapTuple tuple, TupleDesc desc, int id_attnum, int64 *id)
{
	bool		id_isnull;
	Datum		value = heap_getattr(tuple, id_attnum, desc, &id_isnull);

	if (id_isnull || TupleDescAttr(desc, id_attnum - 1)->attidentity != '\0')
		return false;
	*id = DatumGetInt64(value);
	return true;
}

/*
 * The row with its id drawn, now that the key's lock is held, so that ids of
 * one key follow the order in which their transactions commit.  (Under
 * schema 0.1.0 this draws the identity sequence a second time.)  No
 * privilege on the sequence is checked: no role but the owner has one.
 */
static HeapTuple
row_with_new_id(FunctionCallInfo fcinfo, HeapTuple tuple, TupleDesc desc, int id_attnum)
{
	Datum		id = Int64GetDatum(nextval_internal(outbox_relations(fcinfo)->id_sequence, false));
	bool		id_isnull = false;

	note_row_written(DatumGetInt64(id));
	return heap_modify_tuple_by_cols(tuple, desc, 1, &id_attnum, &id, &id_isnull);
}

/*
 * BEFORE INSERT row trigger on outbox_message: the same checks as
 * outbox_enqueue(), the per-key lock, and the wake at commit.  A restored
 * row is left as it is.
 */
Datum
outbox_message_check(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	HeapTuple	tuple;
	TupleDesc	desc;
	bool		checked;
	int			id_attnum;
	int64		restored_id;
	text	   *topic;
	text	   *key;

	check_called_as_row_trigger(fcinfo);
	rel = trigdata->tg_relation;
	id_attnum = check_fires_on_outbox(fcinfo, rel);
	tuple = trigdata->tg_trigtuple;
	desc = RelationGetDescr(rel);
	checked = inserting_checked_row;
	inserting_checked_row = false;

	if (row_is_restored(tuple, desc, id_attnum, &restored_id))
	{
		note_row_written(restored_id);
		return PointerGetDatum(tuple);
	}

	/* outbox_enqueue() has checked its row and locked its key */
	if (!checked)
	{
		tuple = add_trace_context(tuple, desc);
		check_inserted_row(tuple, desc, &topic, &key);
		topic_grant_check_publish(topic);
		if (key)
			key_lock_acquire(topic, key);
	}
	return PointerGetDatum(row_with_new_id(fcinfo, tuple, desc, id_attnum));
}

/*
 * As a transaction that wrote outbox rows commits, tell the publisher of
 * this database the lowest id it wrote (which its claim may have passed
 * while the transaction was in progress: see store.c's claim floor), before
 * the rows are visible (commit_report.c); once they are, wake it, once
 * however many rows it wrote, or, if no publisher serves this database,
 * tell the launcher (serving.c).  A prepared transaction's rows commit
 * later, from any session: its lowest id holds the claim floor down until
 * no prepared transaction is left.  An abort forgets it all.
 */
static void
wake_worker_at_transaction_end(XactEvent event, void *arg)
{
	if (!wake_worker_at_commit)
		return;

	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			commit_report_write(lowest_id_written);
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (earliest_delayed_due != DT_NOEND)
				worker_note_delayed_message(MyDatabaseId, earliest_delayed_due);
			if (!worker_wake_publisher(MyDatabaseId))
				serving_announce_unserved();
			wake_worker_at_commit = false;
			earliest_delayed_due = DT_NOEND;
			break;
		case XACT_EVENT_PREPARE:
			worker_lower_claim_floor(MyDatabaseId, lowest_id_written, true);
			wake_worker_at_commit = false;
			earliest_delayed_due = DT_NOEND;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			wake_worker_at_commit = false;
			earliest_delayed_due = DT_NOEND;
			break;
		default:
			break;
	}
}

/* Register the commit-time wake; in _PG_init. */
void
enqueue_init(void)
{
	RegisterXactCallback(wake_worker_at_transaction_end, NULL);
}

/*
 * A new message_id: a UUID of version 7 (RFC 9562), the milliseconds since
 * the Unix epoch in its first 48 bits and 74 random ones after.  Ids of
 * messages enqueued one after the other sort near each other, so that
 * inserting them into a B-tree keyed by id, as a consumer's table of ids
 * received is (the inbox's inbox_received), touches the index's right edge,
 * not a random page of it for every message.
 */
Datum
outbox_uuid_v7(PG_FUNCTION_ARGS)
{
	pg_uuid_t  *uuid = palloc(sizeof(pg_uuid_t));
	uint64		ms = (uint64) unix_epoch_ms(GetCurrentTimestamp());

	if (!pg_strong_random(uuid->data + 6, UUID_LEN - 6))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate random values")));
	for (int i = 0; i < 6; i++)
		uuid->data[i] = (uint8) (ms >> (40 - 8 * i));
	uuid->data[6] = (uuid->data[6] & 0x0f) | 0x70;	/* the version, 7 */
	uuid->data[8] = (uuid->data[8] & 0x3f) | 0x80;	/* the variant, RFC 9562's */
	PG_RETURN_UUID_P(uuid);
}

/*-------------------------------------------------------------------------
 *
 * capture_row.c
 *	  The message of one row inserted into a captured table, made as
 *	  Debezium's EventRouter, and Kafka Connect's converters after it,
 *	  would make its record: topic, key, value, headers and partition.
 *
 * It runs in the inserting session, as the role that inserts: the column
 * values are turned into text and bytes by their types' output functions,
 * which are that role's to trust (a type's output function is another
 * role's code, and must never run with the extension owner's rights).
 * Only the message it makes is written as the extension's owner.
 *
 * How each part is written (docs/capture.md's "The records" has the
 * table, test/t/209_debezium_bytes.pl the bytes, case by case):
 *
 * - Text, as StringConverter writes a Kafka Connect value, in UTF-8: a
 *   column's text, by its type's output function, but a boolean true or
 *   false and a float as Java writes it; a header's value the same, a
 *   bytea base64, as SimpleHeaderConverter writes them.
 * - JSON, as JsonConverter writes a value without its schema, with
 *   Jackson (capture_json.c): a string column (json, jsonb, text, ...) a
 *   JSON string of its text, unless table.expand.json.payload expands a
 *   payload as EventRouter does; a bytea a base64 string; a float as Java
 *   writes it; any other type as PostgreSQL's to_json() writes it.
 * - An envelope, when a field is placed there: the JSON object
 *   {"payload": ..., "<alias>": ...} in that order.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "common/base64.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "nodes/makefuncs.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "capture.h"
#include "message.h"
#include "pg_compat.h"
#include "trace_context.h"

/* A column's value in the inserted row. */
typedef struct ColumnValue
{
	Datum		datum;
	bool		isnull;
	Oid			type;
} ColumnValue;

/* What a row's tracing span context says. */
typedef struct SpanContext
{
	char	   *traceparent;
	char	   *tracestate;
} SpanContext;

static ColumnValue
column_value(HeapTuple tuple, TupleDesc desc, const CapturedColumn *column)
{
	ColumnValue v;

	v.datum = heap_getattr(tuple, column->attnum, desc, &v.isnull);
	v.type = column->type;
	return v;
}

/* A value's text, by its type's output function. */
static char *
value_text(ColumnValue v)
{
	Oid			output;
	bool		varlena;

	getTypeOutputInfo(v.type, &output, &varlena);
	return OidOutputFunctionCall(output, v.datum);
}

static bool
is_string_type(Oid type)
{
	char		category;
	bool		preferred;

	get_type_category_preferred(type, &category, &preferred);
	return category == TYPCATEGORY_STRING || type == JSONOID || type == JSONBOID;
}

static void
append_base64(StringInfo out, bytea *bytes)
{
	int			len = VARSIZE_ANY_EXHDR(bytes);
	int			encoded_len = pg_b64_enc_len(len);
	char	   *encoded = palloc(encoded_len + 1);

	/* void: 18 takes the bytes as uint8, earlier majors as char */
	encoded_len = pg_b64_encode((const void *) VARDATA_ANY(bytes), len, encoded, encoded_len);
	if (encoded_len < 0)
		elog(ERROR, "outbox: could not encode a bytea value as base64");
	appendBinaryStringInfo(out, encoded, encoded_len);
}

/*
 * A value's text as Kafka Connect's StringConverter and SimpleHeaderConverter
 * write its Java value: a boolean true or false, a float as Java writes it
 * (Debezium makes them BOOLEAN, FLOAT64 and FLOAT32), others their text.
 */
static char *
connect_text(ColumnValue v)
{
	StringInfoData out;

	if (v.type == BOOLOID)
		return pstrdup(DatumGetBool(v.datum) ? "true" : "false");
	if (v.type != FLOAT8OID && v.type != FLOAT4OID)
		return value_text(v);
	initStringInfo(&out);
	capture_java_number(&out, v.type == FLOAT8OID ? DatumGetFloat8(v.datum) : DatumGetFloat4(v.datum),
						v.type == FLOAT4OID);
	return out.data;
}

/*
 * A value's text in UTF-8, as Kafka Connect's converters write a string
 * whatever the database's encoding.
 */
static char *
value_utf8(ColumnValue v, int *len)
{
	char	   *text = connect_text(v);
	char	   *utf8;

	*len = strlen(text);
	utf8 = pg_server_to_any(text, *len, PG_UTF8);
	if (utf8 != text)
		*len = strlen(utf8);
	return utf8;
}

/* Text of the database's encoding as a JSON string, in UTF-8. */
static void
append_json_text(StringInfo out, const char *text)
{
	char	   *utf8 = pg_server_to_any(text, strlen(text), PG_UTF8);

	capture_json_string(out, utf8, strlen(utf8));
}

/* A value of a type without a JSON form of its own, as to_json() writes it. */
static void
append_to_json(StringInfo out, ColumnValue v)
{
	FmgrInfo	flinfo;
	FuncExpr   *call;
	char	   *json;

	/* to_json() learns its argument's type from its call expression */
	call = makeFuncExpr(F_TO_JSON, JSONOID, list_make1(makeNullConst(v.type, -1, InvalidOid)),
						InvalidOid, InvalidOid, COERCE_EXPLICIT_CALL);
	fmgr_info(F_TO_JSON, &flinfo);
	flinfo.fn_expr = (Node *) call;
	json = TextDatumGetCString(FunctionCall1(&flinfo, v.datum));
	appendStringInfoString(out, pg_server_to_any(json, strlen(json), PG_UTF8));
}

/*
 * A value as JsonConverter writes it without schemas (see the header), in
 * UTF-8.  A float8 or float4 is Kafka Connect's FLOAT64 or FLOAT32, which
 * Jackson writes as Java does.
 */
static void
append_json_value(StringInfo out, ColumnValue v, bool expand)
{
	char	   *text;
	int			len;

	if (v.isnull)
		appendStringInfoString(out, "null");
	else if (v.type == BYTEAOID)
	{
		appendStringInfoChar(out, '"');
		append_base64(out, DatumGetByteaPP(v.datum));
		appendStringInfoChar(out, '"');
	}
	else if (v.type == FLOAT8OID || v.type == FLOAT4OID)
		capture_json_number(out, v.type == FLOAT8OID ? DatumGetFloat8(v.datum) : DatumGetFloat4(v.datum),
							v.type == FLOAT4OID);
	else if (is_string_type(v.type))
	{
		text = value_utf8(v, &len);
		if (expand)
			capture_expand_payload(out, text, len, v.type == JSONBOID);
		else
			capture_json_string(out, text, len);
	}
	else
		append_to_json(out, v);
}

static bytea *
string_bytes(StringInfo s)
{
	return (bytea *) cstring_to_text_with_len(s->data, s->len);
}

/* A header's value, as SimpleHeaderConverter writes a Kafka Connect value. */
static char *
header_text(ColumnValue v)
{
	StringInfoData out;

	if (v.type != BYTEAOID)
		return connect_text(v);
	initStringInfo(&out);
	append_base64(&out, DatumGetByteaPP(v.datum));
	return out.data;
}

/* The record's topic: route.topic.replacement with the row's route.by.field. */
static text *
row_topic(const CaptureSettings *s, HeapTuple tuple, TupleDesc desc)
{
	ColumnValue v = column_value(tuple, desc, &s->route_by);

	if (v.isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a captured row must name its topic: column \"%s\" (route.by.field) is NULL",
						s->route_by.name)));
	return cstring_to_text(capture_topic_name(s->topic_replacement, value_text(v)));
}

/* The record's key: table.field.event.key, as key.converter writes it. */
static text *
row_key(const CaptureSettings *s, HeapTuple tuple, TupleDesc desc)
{
	ColumnValue v = column_value(tuple, desc, &s->event_key);
	StringInfoData json;

	if (v.isnull && s->key_converter != CONVERTER_JSON)
		return NULL;			/* no key; JsonConverter writes null */
	if (s->key_converter != CONVERTER_JSON)
		return cstring_to_text(connect_text(v));
	initStringInfo(&json);
	append_json_value(&json, v, false);
	/* a key is text, in the database's encoding until it is published */
	return cstring_to_text(pg_any_to_server(json.data, json.len, PG_UTF8));
}

/* Is the payload empty, as EventRouter tells a tombstone: NULL, or blank text? */
static bool
payload_is_empty(ColumnValue v)
{
	char	   *text;
	size_t		len;

	if (v.isnull)
		return true;
	if (v.type == BYTEAOID)
		return false;			/* a byte array is never blank to EventRouter */
	text = value_text(v);
	len = strlen(text);
	while (len > 0 && (unsigned char) text[len - 1] <= ' ')
		len--;
	while (len > 0 && (unsigned char) *text <= ' ')
		text++, len--;
	return len == 0;
}

/* The envelope: {"payload": ..., "<alias>": ...}, as JsonConverter writes EventRouter's struct. */
static bytea *
envelope(const CaptureSettings *s, ColumnValue payload, HeapTuple tuple, TupleDesc desc)
{
	StringInfoData out;

	initStringInfo(&out);
	appendStringInfoString(&out, "{\"payload\":");
	append_json_value(&out, payload, s->expand_json);
	for (int i = 0; i < s->num_fields; i++)
	{
		const AdditionalField *field = &s->fields[i];

		if (field->placement != PLACEMENT_ENVELOPE)
			continue;
		appendStringInfoChar(&out, ',');
		append_json_text(&out, field->alias);
		appendStringInfoChar(&out, ':');
		append_json_value(&out, column_value(tuple, desc, &field->column), false);
	}
	appendStringInfoChar(&out, '}');
	return string_bytes(&out);
}

/*
 * The record's value, NULL for none.  Under route.tombstone.on.empty.payload
 * a NULL or blank payload has none; otherwise JsonConverter writes a NULL
 * payload as null, and StringConverter and BinaryDataConverter as no
 * value, as Debezium publishes it.
 */
static bytea *
row_value(const CaptureSettings *s, HeapTuple tuple, TupleDesc desc)
{
	ColumnValue payload = column_value(tuple, desc, &s->payload);
	StringInfoData json;
	char	   *text;
	int			len;

	if (s->tombstone_on_empty && payload_is_empty(payload))
		return NULL;
	if (s->has_envelope)
		return envelope(s, payload, tuple, desc);
	if (s->value_converter == CONVERTER_JSON)
	{
		initStringInfo(&json);
		append_json_value(&json, payload, s->expand_json);
		return string_bytes(&json);
	}
	if (payload.isnull)
		return NULL;
	if (payload.type == BYTEAOID)
		return DatumGetByteaPCopy(payload.datum);
	text = value_utf8(payload, &len);
	return (bytea *) cstring_to_text_with_len(text, len);
}

/* The partition a field placed as the partition names, or ANY_PARTITION. */
static int32
row_partition(const CaptureSettings *s, HeapTuple tuple, TupleDesc desc)
{
	const AdditionalField *field = s->partition_field;
	ColumnValue v;
	int64		partition;

	if (field == NULL)
		return ANY_PARTITION;
	v = column_value(tuple, desc, &field->column);
	if (v.isnull)
		return ANY_PARTITION;
	partition = v.type == INT2OID ? DatumGetInt16(v.datum)
		: v.type == INT4OID ? DatumGetInt32(v.datum) : DatumGetInt64(v.datum);
	if (partition < 0 || partition > PG_INT32_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a captured row names partition " INT64_FORMAT " in column \"%s\", which is no partition number",
						partition, field->column.name),
				 errhint("Partitions are numbered from 0; NULL leaves the partition to the producer's partitioner.")));
	return (int32) partition;
}

/*
 * One escape of a java.util.Properties text, at p (past its backslash):
 * appended to out, returns what follows it; NULL for a malformed \uXXXX.
 * A character outside ASCII is appended as '\x80', which no trace context
 * holds, so that such a value is never taken for one.
 */
static const char *
unescape_property_char(const char *p, const char *end, StringInfo out)
{
	unsigned int code = 0;

	if (p >= end)
		return p;				/* a lone backslash at the end: Properties drops it */
	switch (*p)
	{
		case 't':
			appendStringInfoChar(out, '\t');
			return p + 1;
		case 'n':
			appendStringInfoChar(out, '\n');
			return p + 1;
		case 'r':
			appendStringInfoChar(out, '\r');
			return p + 1;
		case 'f':
			appendStringInfoChar(out, '\f');
			return p + 1;
		case 'u':
			for (int i = 1; i <= 4; i++)
			{
				if (p + i >= end || !isxdigit((unsigned char) p[i]))
					return NULL;
				code = code * 16 + (isdigit((unsigned char) p[i]) ? p[i] - '0'
									: pg_tolower((unsigned char) p[i]) - 'a' + 10);
			}
			appendStringInfoChar(out, code < 0x80 ? (char) code : '\x80');
			return p + 5;
		default:
			appendStringInfoChar(out, *p);
			return p + 1;
	}
}

/* A key or value of a Properties line, its escapes undone; NULL if malformed. */
static char *
unescape_property(const char *p, const char *end)
{
	StringInfoData out;

	initStringInfo(&out);
	while (p && p < end)
	{
		if (*p == '\\')
			p = unescape_property_char(p + 1, end, &out);
		else
			appendStringInfoChar(&out, *p++);
	}
	return p ? out.data : NULL;
}

static bool
is_property_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\f';
}

/*
 * One logical line of a Properties text, as Properties.load() splits it:
 * the key ends at the first '=', ':' or blank not escaped; blanks, one
 * '=' or ':' and blanks again come before the value.
 */
static void
read_property(const char *line, const char *end, SpanContext *context)
{
	const char *key_end = line;
	const char *value;
	bool		escaped = false;
	bool		separated = false;
	char	   *key;

	for (; key_end < end; key_end++)
	{
		if (!escaped && (*key_end == '=' || *key_end == ':' || is_property_blank(*key_end)))
			break;
		escaped = *key_end == '\\' && !escaped;
	}
	value = key_end;
	if (value < end && (*value == '=' || *value == ':'))
		separated = true, value++;
	for (; value < end; value++)
	{
		if (is_property_blank(*value))
			continue;
		if (separated || (*value != '=' && *value != ':'))
			break;
		separated = true;
	}
	key = unescape_property(line, key_end);
	if (key == NULL)
		return;
	if (strcmp(key, TRACEPARENT_HEADER) == 0)
		context->traceparent = unescape_property(value, end);
	else if (strcmp(key, TRACESTATE_HEADER) == 0)
		context->tracestate = unescape_property(value, end);
}

/*
 * The next logical line of a Properties text from *p, read as
 * Properties.load() reads one: leading blanks dropped, blank lines and
 * comments ('#' or '!' first) skipped, and a natural line that ends in an
 * odd number of backslashes continued on the next, whose leading blanks go
 * too.  Returns false at the end of the text.
 */
static bool
next_property_line(const char **p, StringInfo line)
{
	const char *s;
	bool		skip_blanks = true;
	bool		line_start = true;
	bool		comment = false;
	bool		continued = false;
	bool		escaped = false;

	resetStringInfo(line);
	for (s = *p; *s; s++)
	{
		bool		end_of_line = *s == '\n' || *s == '\r';

		if (skip_blanks && (is_property_blank(*s) || (end_of_line && !continued)))
			continue;
		skip_blanks = continued = false;
		if (line_start && (*s == '#' || *s == '!'))
			comment = true;
		line_start = false;
		if (!end_of_line)
		{
			if (!comment)
			{
				appendStringInfoChar(line, *s);
				escaped = *s == '\\' && !escaped;
			}
			continue;
		}
		if (comment || line->len == 0)
		{
			comment = false;
			line_start = skip_blanks = true;
			resetStringInfo(line);
			continue;
		}
		if (!escaped)
		{
			*p = s + 1;
			return true;
		}
		line->data[--line->len] = '\0';	/* continued on the next line */
		escaped = false;
		skip_blanks = continued = true;
		if (*s == '\r' && s[1] == '\n')
			s++;
	}
	*p = s;
	if (escaped)
		line->data[--line->len] = '\0';
	return !comment && line->len > 0;
}

/*
 * The trace context of a tracingspancontext value: the text of a
 * java.util.Properties that OpenTelemetry's propagator filled in, as the
 * Quarkus outbox extension stores it (Properties.store(): a date comment,
 * then traceparent=... and tracestate=..., ':' and '=' escaped with a
 * backslash).  Only a traceparent W3C allows is taken (a later version's
 * as version 00), and a tracestate only with it; anything else is ignored,
 * as OpenTelemetry ignores it.
 */
static SpanContext
row_span_context(const CaptureSettings *s, HeapTuple tuple, TupleDesc desc)
{
	SpanContext context = {NULL, NULL};
	ColumnValue v;
	StringInfoData line;
	const char *p;

	if (s->span_context.attnum == InvalidAttrNumber)
		return context;
	v = column_value(tuple, desc, &s->span_context);
	if (v.isnull)
		return context;
	p = value_text(v);
	initStringInfo(&line);
	while (next_property_line(&p, &line))
		read_property(line.data, line.data + line.len, &context);
	context.traceparent = traceparent_normalize(context.traceparent);
	if (context.traceparent == NULL)
		context.tracestate = NULL;
	if (context.tracestate != NULL && !tracestate_is_valid(context.tracestate))
		context.tracestate = NULL;
	return context;
}

static bool
header_placed(const CaptureSettings *s, const char *name)
{
	for (int i = 0; i < s->num_fields; i++)
		if (s->fields[i].placement == PLACEMENT_HEADER && strcmp(s->fields[i].alias, name) == 0)
			return true;
	return false;
}

/*
 * The record's headers: "id", the event id; the fields placed as headers;
 * the row's trace context, where no field is placed under its names.
 */
static Jsonb *
row_headers(const CaptureSettings *s, HeapTuple tuple, TupleDesc desc)
{
	JsonbInState state = {0};
	ColumnValue id = column_value(tuple, desc, &s->event_id);
	SpanContext context = row_span_context(s, tuple, desc);

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	headers_push(&state, "id", id.isnull ? NULL : value_text(id));
	for (int i = 0; i < s->num_fields; i++)
	{
		const AdditionalField *field = &s->fields[i];
		ColumnValue v;

		if (field->placement != PLACEMENT_HEADER)
			continue;
		v = column_value(tuple, desc, &field->column);
		headers_push(&state, field->alias, v.isnull ? NULL : header_text(v));
	}
	if (context.traceparent && !header_placed(s, TRACEPARENT_HEADER))
	{
		headers_push(&state, TRACEPARENT_HEADER, context.traceparent);
		if (context.tracestate && !header_placed(s, TRACESTATE_HEADER))
			headers_push(&state, TRACESTATE_HEADER, context.tracestate);
	}
	pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	return JsonbValueToJsonb(state.result);
}

/*
 * The message of a row inserted into rel, a captured table (or one of its
 * partitions), whose settings were read against rel.
 */
void
capture_row_message(const CaptureSettings *s, Relation rel, HeapTuple tuple, NewMessage *m)
{
	TupleDesc	desc = RelationGetDescr(rel);

	m->topic = row_topic(s, tuple, desc);
	m->key = row_key(s, tuple, desc);
	m->payload = row_value(s, tuple, desc);
	m->headers = row_headers(s, tuple, desc);
	m->target_partition = row_partition(s, tuple, desc);
	m->deliver_at = 0;
}

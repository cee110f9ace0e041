/*-------------------------------------------------------------------------
 *
 * capture_settings.c
 *	  The settings of a captured table: a JSON object whose keys are
 *	  Debezium EventRouter's option names (and Kafka Connect's converter
 *	  options, which decide the bytes a consumer reads), read into a
 *	  CaptureSettings whose columns are found in the table.
 *
 * outbox_capture() reads them to refuse a wrong setting before anything is
 * stored: an unknown key, a value of the wrong type (SQLSTATE 22023), a
 * column the table lacks (42703) or of a type the setting cannot use
 * (42804).  The trigger reads them again, from the table of captured
 * tables, once per statement, against the table it fires on (a partition
 * has columns of its own numbers); a column dropped or renamed since
 * fails the insert with the same error, rather than publish without it.
 *
 * Each option's default is EventRouter's (see the README's table and
 * test/t/206_debezium_capture.pl's header for where the documentation
 * says so).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/rel.h"

#include "capture.h"
#include "message.h"
#include "pg_compat.h"

/* EventRouter's defaults. */
#define DEFAULT_ROUTE_BY_FIELD "aggregatetype"
#define DEFAULT_TOPIC_REPLACEMENT "outbox.event.${routedByValue}"
#define DEFAULT_EVENT_ID_FIELD "id"
#define DEFAULT_EVENT_KEY_FIELD "aggregateid"
#define DEFAULT_PAYLOAD_FIELD "payload"
#define DEFAULT_SPAN_CONTEXT_FIELD "tracingspancontext"
#define DEFAULT_INVALID_OP_BEHAVIOR "warn"

/* What route.topic.replacement's ${routedByValue} stands for. */
#define ROUTED_BY_VALUE "${routedByValue}"

/* The headers the record always has, which no additional field may be. */
#define EVENT_ID_HEADER "id"

/* Kafka Connect's converters, by class name. */
#define STRING_CONVERTER "org.apache.kafka.connect.storage.StringConverter"
#define JSON_CONVERTER "org.apache.kafka.connect.json.JsonConverter"
#define BINARY_DATA_CONVERTER "io.debezium.converters.BinaryDataConverter"
#define BYTE_ARRAY_CONVERTER "org.apache.kafka.connect.converters.ByteArrayConverter"

typedef enum OptionKind
{
	OPTION_COLUMN,				/* a CapturedColumn, by name */
	OPTION_TOPIC,				/* route.topic.replacement */
	OPTION_BOOL,
	OPTION_KEY_CONVERTER,
	OPTION_VALUE_CONVERTER,
	OPTION_SCHEMAS_ENABLE,		/* accepted as false only */
	OPTION_NULL_BEHAVIOR,		/* accepted as ignore only */
	OPTION_INVALID_OP,			/* table.op.invalid.behavior */
	OPTION_PLACEMENT			/* table.fields.additional.placement */
} OptionKind;

typedef struct CaptureOption
{
	const char *name;
	OptionKind	kind;
	size_t		field;			/* where in CaptureSettings it goes */
} CaptureOption;

static const CaptureOption capture_options[] = {
	{"route.by.field", OPTION_COLUMN, offsetof(CaptureSettings, route_by)},
	{"route.topic.replacement", OPTION_TOPIC, offsetof(CaptureSettings, topic_replacement)},
	{"route.tombstone.on.empty.payload", OPTION_BOOL, offsetof(CaptureSettings, tombstone_on_empty)},
	{"table.field.event.id", OPTION_COLUMN, offsetof(CaptureSettings, event_id)},
	{"table.field.event.key", OPTION_COLUMN, offsetof(CaptureSettings, event_key)},
	{"table.field.event.payload", OPTION_COLUMN, offsetof(CaptureSettings, payload)},
	{"table.fields.additional.placement", OPTION_PLACEMENT, offsetof(CaptureSettings, placement_text)},
	{"table.expand.json.payload", OPTION_BOOL, offsetof(CaptureSettings, expand_json)},
	{"table.json.payload.null.behavior", OPTION_NULL_BEHAVIOR, 0},
	{"table.op.invalid.behavior", OPTION_INVALID_OP, offsetof(CaptureSettings, invalid_op_behavior)},
	{"tracing.span.context.field", OPTION_COLUMN, offsetof(CaptureSettings, span_context)},
	{"key.converter", OPTION_KEY_CONVERTER, offsetof(CaptureSettings, key_converter)},
	{"key.converter.schemas.enable", OPTION_SCHEMAS_ENABLE, 0},
	{"value.converter", OPTION_VALUE_CONVERTER, offsetof(CaptureSettings, value_converter)},
	{"value.converter.schemas.enable", OPTION_SCHEMAS_ENABLE, 0},
};

/* EventRouter's options that outbox_capture() does not take, and why. */
typedef struct UnsupportedOption
{
	const char *name;
	const char *why;
} UnsupportedOption;

static const UnsupportedOption unsupported_options[] = {
	{"route.topic.regex",
	"The topic is route.topic.replacement with ${routedByValue} replaced by the whole value of route.by.field, as under EventRouter's default regex."},
	{"table.field.event.timestamp",
	"A record's timestamp is the time its row was inserted."},
	{"table.field.event.schema.version",
	"No Kafka Connect schema is written."},
	{"table.field.additional.missing",
	"Every column the settings name must exist; outbox_capture() checks that they do."},
	{"tracing.operation.name",
	"No span is made: the traceparent of the row's span context becomes the record's."},
	{"tracing.with.context.field.only",
	"No span is made: the traceparent of the row's span context becomes the record's."},
};

pg_noreturn static void refuse_value(const char *option, const char *expected);
pg_noreturn static void refuse_unknown_option(const char *name);
pg_noreturn static void refuse_placement(const char *entry, const char *why);
static char *java_trim(const char *s, int len);

/* The hint of every refused setting: the keys outbox_capture() takes. */
static const char *
accepted_options_hint(void)
{
	static char *hint = NULL;

	if (hint == NULL)
	{
		StringInfoData buf;

		initStringInfo(&buf);
		appendStringInfoString(&buf, "The settings outbox_capture() takes are");
		for (size_t i = 0; i < lengthof(capture_options); i++)
			appendStringInfo(&buf, "%s %s", i == 0 ? "" : ",", capture_options[i].name);
		appendStringInfoString(&buf, ".");
		hint = MemoryContextStrdup(TopMemoryContext, buf.data);
		pfree(buf.data);
	}
	return hint;
}

static void
refuse_value(const char *option, const char *expected)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("outbox_capture() setting \"%s\" must be %s", option, expected),
			 errhint("%s", accepted_options_hint())));
}

static void
refuse_unknown_option(const char *name)
{
	for (size_t i = 0; i < lengthof(unsupported_options); i++)
		if (strcmp(name, unsupported_options[i].name) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("outbox_capture() does not take EventRouter's option \"%s\"", name),
					 errdetail("%s", unsupported_options[i].why),
					 errhint("%s", accepted_options_hint())));
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unknown outbox_capture() setting \"%s\"", name),
			 errhint("%s", accepted_options_hint())));
}

/* A setting's value as a string: a JSON string, not empty. */
static char *
string_value(const char *option, JsonbValue *v)
{
	if (v->type != jbvString || v->val.string.len == 0)
		refuse_value(option, "a non-empty string");
	return pnstrdup(v->val.string.val, v->val.string.len);
}

/*
 * A word of a setting (a boolean, an enumerated value), as Kafka's
 * configuration reads one: blanks around it ignored, in any case.
 */
static char *
word_value(const char *option, JsonbValue *v, const char *expected)
{
	char	   *word;

	if (v->type != jbvString)
		refuse_value(option, expected);
	word = java_trim(v->val.string.val, v->val.string.len);
	for (char *c = word; *c; c++)
		*c = pg_tolower((unsigned char) *c);
	return word;
}

/*
 * A boolean setting: a JSON boolean, or the string "true" or "false" (a
 * connector's configuration holds strings).
 */
static bool
bool_value(const char *option, JsonbValue *v)
{
	char	   *word;

	if (v->type == jbvBool)
		return v->val.boolean;
	word = word_value(option, v, "true or false");
	if (strcmp(word, "true") != 0 && strcmp(word, "false") != 0)
		refuse_value(option, "true or false");
	return strcmp(word, "true") == 0;
}

/* A converter setting: one of the class names this writes as Kafka Connect would. */
static CaptureConverter
converter_value(const char *option, JsonbValue *v, bool for_value)
{
	char	   *name = string_value(option, v);

	if (strcmp(name, STRING_CONVERTER) == 0)
		return CONVERTER_STRING;
	if (strcmp(name, JSON_CONVERTER) == 0)
		return CONVERTER_JSON;
	if (for_value && (strcmp(name, BINARY_DATA_CONVERTER) == 0 ||
					  strcmp(name, BYTE_ARRAY_CONVERTER) == 0))
		return CONVERTER_BINARY;
	refuse_value(option, for_value ? STRING_CONVERTER ", " JSON_CONVERTER ", "
				 BINARY_DATA_CONVERTER " or " BYTE_ARRAY_CONVERTER
				 : STRING_CONVERTER " or " JSON_CONVERTER);
	return CONVERTER_STRING;	/* not reached */
}

/*
 * The topic of route.topic.replacement, with ${routedByValue} replaced by
 * the value, read as Java's Matcher.replaceFirst() reads a replacement: a
 * backslash takes the next character as it is, a dollar sign starts a
 * group reference, of which EventRouter's default regex has one,
 * routedByValue.
 */
char *
capture_topic_name(const char *replacement, const char *routed_by_value)
{
	StringInfoData topic;
	const char *p = replacement;

	initStringInfo(&topic);
	while (*p)
	{
		if (*p == '\\' && p[1] != '\0')
		{
			appendStringInfoChar(&topic, p[1]);
			p += 2;
		}
		else if (strncmp(p, ROUTED_BY_VALUE, strlen(ROUTED_BY_VALUE)) == 0)
		{
			appendStringInfoString(&topic, routed_by_value);
			p += strlen(ROUTED_BY_VALUE);
		}
		else if (*p == '\\' || *p == '$')
			refuse_value("route.topic.replacement",
						 "a topic name in which ${routedByValue} stands for the value of route.by.field "
						 "(a \"$\" or \"\\\" otherwise is escaped with \"\\\")");
		else
			appendStringInfoChar(&topic, *p++);
	}
	return topic.data;
}

/*
 * Refuse a route.topic.replacement that would make no topic Kafka takes,
 * whatever the value: a character Kafka refuses, or a name too long
 * before the value is even in it.
 */
static void
check_topic_replacement(const char *replacement)
{
	char	   *fixed = capture_topic_name(replacement, "");

	if (strlen(fixed) > KAFKA_MAX_TOPIC_LENGTH)
		refuse_value("route.topic.replacement", psprintf("at most %d characters besides ${routedByValue}",
														 KAFKA_MAX_TOPIC_LENGTH));
	for (const char *c = fixed; *c; c++)
		if (!kafka_topic_char(*c))
			refuse_value("route.topic.replacement",
						 "a Kafka topic name (ASCII letters, digits, \".\", \"_\" and \"-\") "
						 "in which ${routedByValue} stands for the value of route.by.field");
}

/* table.op.invalid.behavior: warn, error or fatal. */
static const char *
invalid_op_value(const char *option, JsonbValue *v)
{
	const char *expected = "\"warn\", \"error\" or \"fatal\"";
	char	   *word = word_value(option, v, expected);

	if (strcmp(word, "warn") != 0 && strcmp(word, "error") != 0 && strcmp(word, "fatal") != 0)
		refuse_value(option, expected);
	return word;
}

/* Take one setting into settings. */
static void
apply_option(CaptureSettings *settings, const CaptureOption *option, JsonbValue *v)
{
	char	   *field = (char *) settings + option->field;

	switch (option->kind)
	{
		case OPTION_COLUMN:
			((CapturedColumn *) field)->name = string_value(option->name, v);
			if (field == (char *) &settings->span_context)
				settings->span_context_named = true;
			break;
		case OPTION_TOPIC:
			*(const char **) field = string_value(option->name, v);
			check_topic_replacement(settings->topic_replacement);
			break;
		case OPTION_BOOL:
			*(bool *) field = bool_value(option->name, v);
			break;
		case OPTION_KEY_CONVERTER:
		case OPTION_VALUE_CONVERTER:
			*(CaptureConverter *) field = converter_value(option->name, v,
														  option->kind == OPTION_VALUE_CONVERTER);
			if (option->kind == OPTION_VALUE_CONVERTER)
				settings->value_converter_named = true;
			break;
		case OPTION_SCHEMAS_ENABLE:
			if (bool_value(option->name, v))
				refuse_value(option->name,
							 "false: JsonConverter's form is written without its schema envelope");
			break;
		case OPTION_NULL_BEHAVIOR:
			if (strcmp(word_value(option->name, v, "\"ignore\""), "ignore") != 0)
				refuse_value(option->name,
							 "\"ignore\": an expanded payload leaves out its null fields, as EventRouter does by default");
			break;
		case OPTION_INVALID_OP:
			settings->invalid_op_behavior = invalid_op_value(option->name, v);
			settings->refuse_updates = strcmp(settings->invalid_op_behavior, "fatal") == 0;
			break;
		case OPTION_PLACEMENT:
			if (v->type != jbvString)
				refuse_value(option->name, "a string of column:placement[:alias] separated by commas");
			settings->placement_text = pnstrdup(v->val.string.val, v->val.string.len);
			break;
	}
}

static CaptureSettings *
default_settings(void)
{
	CaptureSettings *settings = palloc0(sizeof(CaptureSettings));

	settings->route_by.name = DEFAULT_ROUTE_BY_FIELD;
	settings->topic_replacement = DEFAULT_TOPIC_REPLACEMENT;
	settings->event_id.name = DEFAULT_EVENT_ID_FIELD;
	settings->event_key.name = DEFAULT_EVENT_KEY_FIELD;
	settings->payload.name = DEFAULT_PAYLOAD_FIELD;
	settings->span_context.name = DEFAULT_SPAN_CONTEXT_FIELD;
	settings->invalid_op_behavior = DEFAULT_INVALID_OP_BEHAVIOR;
	settings->key_converter = CONVERTER_STRING;
	settings->value_converter = CONVERTER_STRING;
	settings->placement_text = "";
	return settings;
}

/* Take every setting of the JSON object into settings. */
static void
apply_options(CaptureSettings *settings, Jsonb *json)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken token;
	char	   *name = NULL;

	if (!JB_ROOT_IS_OBJECT(json))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox_capture() settings must be a JSON object"),
				 errhint("%s", accepted_options_hint())));
	it = JsonbIteratorInit(&json->root);
	while ((token = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		const CaptureOption *option = NULL;

		if (token == WJB_KEY)
		{
			name = pnstrdup(v.val.string.val, v.val.string.len);
			continue;
		}
		if (token != WJB_VALUE)
			continue;
		for (size_t i = 0; i < lengthof(capture_options); i++)
			if (strcmp(name, capture_options[i].name) == 0)
				option = &capture_options[i];
		if (option == NULL)
			refuse_unknown_option(name);
		apply_option(settings, option, &v);
	}
}

/*
 * Find the column a setting names in the table; one the table lacks is an
 * error if required, else left as InvalidAttrNumber.
 */
static void
find_column(CapturedColumn *column, const char *option, Relation rel, bool required)
{
	TupleDesc	desc = RelationGetDescr(rel);

	column->attnum = InvalidAttrNumber;
	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute attr = TupleDescAttr(desc, i);

		if (!attr->attisdropped && strcmp(NameStr(attr->attname), column->name) == 0)
		{
			column->attnum = attr->attnum;
			column->type = attr->atttypid;
			return;
		}
	}
	if (required)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" of table \"%s\", which outbox_capture() setting \"%s\" names, does not exist",
						column->name, RelationGetRelationName(rel), option),
				 errhint("Name a column of the table in the setting, or call outbox_capture() again with settings that do.")));
}

static void
refuse_placement(const char *entry, const char *why)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("outbox_capture() setting \"table.fields.additional.placement\" cannot place \"%s\"", entry),
			 errdetail("%s", why),
			 errhint("Write column:header[:alias], column:envelope[:alias] or column:partition, separated by commas.")));
}

/* Is another field of the same kind already named alias? */
static bool
alias_taken(const CaptureSettings *settings, const AdditionalField *field)
{
	for (int i = 0; i < settings->num_fields; i++)
	{
		const AdditionalField *other = &settings->fields[i];

		if (other != field && other->placement == field->placement &&
			field->placement != PLACEMENT_PARTITION && strcmp(other->alias, field->alias) == 0)
			return true;
	}
	return false;
}

/* Refuse a field that would collide with the record's own parts. */
static void
check_field(CaptureSettings *settings, AdditionalField *field, const char *entry)
{
	Oid			type = field->column.type;

	if (field->placement == PLACEMENT_HEADER &&
		(strcmp(field->alias, EVENT_ID_HEADER) == 0 || strcmp(field->alias, MESSAGE_ID_HEADER) == 0))
		refuse_placement(entry, psprintf("The record's header \"%s\" is the %s.", field->alias,
										 strcmp(field->alias, EVENT_ID_HEADER) == 0
										 ? "event id (table.field.event.id)" : "outbox's message id"));
	if (field->placement == PLACEMENT_ENVELOPE && strcmp(field->alias, "payload") == 0)
		refuse_placement(entry, "The envelope's field \"payload\" is the payload.");
	if (alias_taken(settings, field))
		refuse_placement(entry, psprintf("Another column is placed as \"%s\" already.", field->alias));
	if (field->placement == PLACEMENT_PARTITION)
	{
		if (settings->partition_field != NULL)
			refuse_placement(entry, "Only one column can choose the partition.");
		if (type != INT2OID && type != INT4OID && type != INT8OID)
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("column \"%s\", placed as the partition, must be an integer, not %s",
							field->column.name, format_type_be(type))));
		settings->partition_field = field;
	}
	if (field->placement == PLACEMENT_ENVELOPE)
		settings->has_envelope = true;
}

static FieldPlacement
placement_of(const char *word, const char *entry)
{
	if (pg_strcasecmp(word, "header") == 0)
		return PLACEMENT_HEADER;
	if (pg_strcasecmp(word, "envelope") == 0)
		return PLACEMENT_ENVELOPE;
	if (pg_strcasecmp(word, "partition") == 0)
		return PLACEMENT_PARTITION;
	refuse_placement(entry, psprintf("\"%s\" is no placement: header, envelope or partition.", word));
	return PLACEMENT_HEADER;	/* not reached */
}

/* A string with the blanks Java's String.trim() removes gone from both ends. */
static char *
java_trim(const char *s, int len)
{
	while (len > 0 && (unsigned char) *s <= ' ')
		s++, len--;
	while (len > 0 && (unsigned char) s[len - 1] <= ' ')
		len--;
	return pnstrdup(s, len);
}

/*
 * One entry of table.fields.additional.placement: column:placement[:alias],
 * each part trimmed, the placement in any case, as EventRouter reads it.
 */
static void
read_field(CaptureSettings *settings, char *entry, Relation rel)
{
	AdditionalField *field = &settings->fields[settings->num_fields];
	char	   *parts[3];
	int			count = 0;
	char	   *p = entry;

	while (count < 3)
	{
		char	   *colon = strchr(p, ':');

		parts[count++] = java_trim(p, colon ? (int) (colon - p) : (int) strlen(p));
		if (colon == NULL)
			break;
		p = colon + 1;
		if (count == 3)
			refuse_placement(entry, "An entry has at most three parts.");
	}
	if (count < 2 || parts[0][0] == '\0')
		refuse_placement(entry, "An entry is a column and a placement, and may have an alias.");
	field->column.name = parts[0];
	field->placement = placement_of(parts[1], entry);
	field->alias = count == 3 && parts[2][0] != '\0' ? parts[2] : parts[0];
	find_column(&field->column, "table.fields.additional.placement", rel, true);
	settings->num_fields++;
	check_field(settings, field, entry);
}

/* table.fields.additional.placement: entries separated by commas. */
static void
read_placements(CaptureSettings *settings, Relation rel)
{
	char	   *text = pstrdup(settings->placement_text);
	int			entries = 1;
	char	   *entry = text;

	if (java_trim(text, strlen(text))[0] == '\0')
		return;
	for (char *c = text; *c; c++)
		entries += *c == ',';
	settings->fields = palloc0(entries * sizeof(AdditionalField));
	while (entry != NULL)
	{
		char	   *comma = strchr(entry, ',');

		if (comma)
			*comma = '\0';
		read_field(settings, entry, rel);
		entry = comma ? comma + 1 : NULL;
	}
}

/*
 * Refuse converters that could not write the payload: EventRouter's
 * converters would fail, or write what no consumer reads (StringConverter
 * writes a bytea as Java's name of a byte array, an envelope as a Struct's
 * toString()).  Without value.converter, a bytea payload's bytes go as they
 * are, and any other's text.
 */
static void
check_converters(CaptureSettings *settings)
{
	bool		bytes = settings->payload.type == BYTEAOID;

	if (!settings->value_converter_named)
		settings->value_converter = bytes ? CONVERTER_BINARY : CONVERTER_STRING;
	if (settings->value_converter == CONVERTER_BINARY && (!bytes || settings->has_envelope))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("outbox_capture() setting \"value.converter\" %s",
						bytes ? "cannot be BinaryDataConverter with fields placed in the envelope"
						: "can be BinaryDataConverter only for a bytea payload"),
				 errhint("An envelope is written as JSON: name JsonConverter.")));
	if (settings->value_converter == CONVERTER_STRING && bytes)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("outbox_capture() setting \"value.converter\" cannot be StringConverter for a bytea payload"),
				 errhint("Leave value.converter out: a bytea payload's bytes are the record's value.")));
	if (settings->expand_json && settings->value_converter != CONVERTER_JSON && !settings->has_envelope)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox_capture() setting \"table.expand.json.payload\" needs value.converter JsonConverter, or fields placed in the envelope"),
				 errhint("Without them the record's value is the payload's text already: a JSON payload is its document.")));
}

/*
 * The settings of a captured table, read from the JSON object its owner
 * gave outbox_capture(), with every column they name found in rel.
 */
CaptureSettings *
capture_settings_read(Jsonb *json, Relation rel)
{
	CaptureSettings *settings = default_settings();

	apply_options(settings, json);
	find_column(&settings->route_by, "route.by.field", rel, true);
	find_column(&settings->event_id, "table.field.event.id", rel, true);
	find_column(&settings->event_key, "table.field.event.key", rel, true);
	find_column(&settings->payload, "table.field.event.payload", rel, true);
	find_column(&settings->span_context, "tracing.span.context.field", rel,
				settings->span_context_named);
	read_placements(settings, rel);
	check_converters(settings);
	return settings;
}

static void
push_setting(JsonbInState *state, const char *name, JsonbValue *value)
{
	JsonbValue	key;

	key.type = jbvString;
	key.val.string.val = (char *) name;
	key.val.string.len = strlen(name);
	pushJsonbValue(state, WJB_KEY, &key);
	pushJsonbValue(state, WJB_VALUE, value);
}

static JsonbValue *
string_jsonb(JsonbValue *v, const char *s)
{
	v->type = jbvString;
	v->val.string.val = (char *) s;
	v->val.string.len = strlen(s);
	return v;
}

static JsonbValue *
bool_jsonb(JsonbValue *v, bool b)
{
	v->type = jbvBool;
	v->val.boolean = b;
	return v;
}

static const char *
converter_name(CaptureConverter converter)
{
	switch (converter)
	{
		case CONVERTER_STRING:
			return STRING_CONVERTER;
		case CONVERTER_JSON:
			return JSON_CONVERTER;
		case CONVERTER_BINARY:
			return BINARY_DATA_CONVERTER;
	}
	return NULL;				/* not reached */
}

/*
 * Every setting's value as the trigger uses it, defaults included:
 * outbox_capture() returns it, so its caller sees what was chosen.
 */
Jsonb *
capture_settings_effective(const CaptureSettings *s)
{
	JsonbInState state = {0};
	JsonbValue	v;

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	push_setting(&state, "route.by.field", string_jsonb(&v, s->route_by.name));
	push_setting(&state, "route.topic.replacement", string_jsonb(&v, s->topic_replacement));
	push_setting(&state, "route.tombstone.on.empty.payload", bool_jsonb(&v, s->tombstone_on_empty));
	push_setting(&state, "table.field.event.id", string_jsonb(&v, s->event_id.name));
	push_setting(&state, "table.field.event.key", string_jsonb(&v, s->event_key.name));
	push_setting(&state, "table.field.event.payload", string_jsonb(&v, s->payload.name));
	push_setting(&state, "table.fields.additional.placement", string_jsonb(&v, s->placement_text));
	push_setting(&state, "table.expand.json.payload", bool_jsonb(&v, s->expand_json));
	push_setting(&state, "table.op.invalid.behavior", string_jsonb(&v, s->invalid_op_behavior));
	push_setting(&state, "tracing.span.context.field", string_jsonb(&v, s->span_context.name));
	push_setting(&state, "key.converter", string_jsonb(&v, converter_name(s->key_converter)));
	push_setting(&state, "value.converter", string_jsonb(&v, converter_name(s->value_converter)));
	pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	return JsonbValueToJsonb(state.result);
}

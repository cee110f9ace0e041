/*-------------------------------------------------------------------------
 *
 * capture_expand.c
 *	  A payload under table.expand.json.payload, as Debezium's EventRouter
 *	  expands it and Kafka Connect's JsonConverter writes it (with
 *	  capture_json.c): the bytes a consumer of Debezium's records reads.
 *
 * A payload that table.expand.json.payload expands goes the way
 * EventRouter takes it (Debezium 3.6, JsonSchemaData with its default
 * table.json.payload.null.behavior, ignore):
 *
 * 1. Jackson reads the text into a tree: a number is an int, a long or a
 *    BigInteger if it has neither '.' nor an exponent, else a double; of
 *    a member named twice, the last value in the first one's place; the
 *    text after the document is not read.
 * 2. A Kafka Connect schema is inferred from the tree: an object is a
 *    struct of its members in order, less those that are null or an empty
 *    array; a number INT32, INT64 or FLOAT64 (a BigInteger too); an array
 *    the schema of its first element that is not null, all its elements
 *    of one kind (numbers of one schema), and for objects the fields of
 *    every element merged.  Where no schema can be inferred, EventRouter
 *    keeps the payload a string, and so does this.
 * 3. The tree is converted to that schema, every value of its field's
 *    type, and JsonConverter writes every field of a struct, null where
 *    the document has none.  (Of objects that differ, EventRouter merges
 *    the fields in an order of its JVM's hash codes; here in the order
 *    they come.)
 *
 * Where a schema is inferred but the tree does not convert to it (a
 * top-level array, a BigInteger, arrays in an array of different kinds),
 * Debezium's task fails and stops publishing.  Here the document is then
 * written as Jackson writes the tree it read, everything kept.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "port/pg_bitutils.h"

#include "capture.h"
#include "settings.h"

/*
 * Jackson's StreamReadConstraints (jackson-core 2.21, as Debezium 3.6
 * ships it): a document beyond them is not read, and EventRouter keeps the
 * payload a string.
 */
#define JACKSON_MAX_NESTING_DEPTH	1000
#define JACKSON_MAX_NUMBER_LENGTH	1000	/* its digits; not a 0 before '.' */
#define JACKSON_MAX_NAME_LENGTH		50000	/* in UTF-16 code units */
#define JACKSON_MAX_STRING_LENGTH	20000000	/* in UTF-16 code units */

/* Names are looked up by a hash index past this many (see find_name()). */
#define NAME_INDEX_MIN				8

typedef struct JsonText
{
	char	   *data;			/* UTF-8; a lone surrogate as its 3 bytes */
	int			len;
} JsonText;

/*
 * An open-addressing index of an array of distinct names, built when
 * first needed and extended as the array grows: an object's members or a
 * struct's fields may number tens of thousands, and a linear search for
 * each would make a payload's cost grow with the square of its size.
 */
typedef struct NameIndex
{
	int		   *slots;			/* a name's position + 1; 0 is empty */
	int			size;			/* a power of two, at least twice the names */
	int			indexed;		/* the names in it: the array's first ones */
} NameIndex;

/* A node of the tree Jackson reads (JsonNode). */
typedef enum JsonNodeKind
{
	NODE_NULL,
	NODE_BOOLEAN,
	NODE_INT,
	NODE_LONG,
	NODE_BIG_INTEGER,
	NODE_DOUBLE,
	NODE_STRING,
	NODE_ARRAY,
	NODE_OBJECT
} JsonNodeKind;

typedef struct JsonNode
{
	JsonNodeKind kind;
	bool		boolean;
	int64		integer;		/* NODE_INT, NODE_LONG */
	double		number;			/* NODE_DOUBLE */
	JsonText	text;			/* NODE_STRING; NODE_BIG_INTEGER's digits */
	int			count;			/* NODE_ARRAY's elements, NODE_OBJECT's members */
	JsonText   *names;			/* NODE_OBJECT */
	NameIndex  *index;			/* of names, or NULL */
	struct JsonNode **items;
} JsonNode;

/*
 * A Kafka Connect schema, as EventRouter infers it: optional, but for the
 * struct it merges of an array's objects that differ, which it copies
 * without its optional flag (so that such an array may hold no null).
 */
typedef enum ConnectType
{
	CONNECT_STRING,
	CONNECT_BOOLEAN,
	CONNECT_INT32,
	CONNECT_INT64,
	CONNECT_FLOAT64,
	CONNECT_ARRAY,
	CONNECT_STRUCT
} ConnectType;

typedef struct ConnectSchema
{
	ConnectType type;
	bool		required;		/* a merged struct: no null element */
	struct ConnectSchema *element;	/* CONNECT_ARRAY */
	int			count;			/* CONNECT_STRUCT's fields */
	int			allocated;
	JsonText   *names;
	NameIndex  *index;			/* of names, or NULL */
	struct ConnectSchema **fields;
} ConnectSchema;

typedef struct JsonReader
{
	const char *p;
	const char *end;
	int			depth;
	bool		names_unique;	/* jsonb's text: no member named twice */
} JsonReader;

static JsonNode *read_value(JsonReader *r);

static bool
names_equal(const JsonText *a, const JsonText *b)
{
	return a->len == b->len && memcmp(a->data, b->data, a->len) == 0;
}

static void
index_name(NameIndex *index, const JsonText *names, int position)
{
	uint32		slot = hash_bytes((const unsigned char *) names[position].data, names[position].len);

	for (slot &= index->size - 1; index->slots[slot] != 0; slot = (slot + 1) & (index->size - 1))
		;
	index->slots[slot] = position + 1;
}

/*
 * The position of name among the count distinct names, or -1: a linear
 * search for a few, else by *index, made or grown to hold them all.
 */
static int
find_name(NameIndex **index, const JsonText *names, int count, const JsonText *name)
{
	NameIndex  *ix = *index;
	uint32		slot;

	if (count <= NAME_INDEX_MIN)
	{
		for (int i = 0; i < count; i++)
			if (names_equal(&names[i], name))
				return i;
		return -1;
	}
	if (ix == NULL || ix->size < 2 * count)
	{
		if (ix == NULL)
			ix = *index = palloc(sizeof(NameIndex));
		else
			pfree(ix->slots);
		ix->size = pg_nextpower2_32(4 * count);
		ix->slots = palloc0(ix->size * sizeof(int));
		ix->indexed = 0;
	}
	for (; ix->indexed < count; ix->indexed++)
		index_name(ix, names, ix->indexed);
	slot = hash_bytes((const unsigned char *) name->data, name->len);
	for (slot &= ix->size - 1; ix->slots[slot] != 0; slot = (slot + 1) & (ix->size - 1))
		if (names_equal(&names[ix->slots[slot] - 1], name))
			return ix->slots[slot] - 1;
	return -1;
}

/* ---------- reading, as Jackson's ObjectMapper.readTree() ---------- */

static JsonNode *
new_node(JsonNodeKind kind)
{
	JsonNode   *node = palloc0(sizeof(JsonNode));

	node->kind = kind;
	return node;
}

static void
skip_blanks(JsonReader *r)
{
	while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
		r->p++;
}

static bool
read_literal(JsonReader *r, const char *word)
{
	int			len = strlen(word);

	if (r->end - r->p < len || memcmp(r->p, word, len) != 0)
		return false;
	r->p += len;
	return true;
}

static int
hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = pg_tolower((unsigned char) c);
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* A \u escape's UTF-16 code unit, appended as UTF-8 (a surrogate alone too). */
static bool
read_unicode_escape(JsonReader *r, StringInfo out)
{
	unsigned int code = 0;
	unsigned char utf8[4];

	if (r->end - r->p < 4)
		return false;
	for (int i = 0; i < 4; i++)
	{
		int			v = hex_value(r->p[i]);

		if (v < 0)
			return false;
		code = code * 16 + v;
	}
	r->p += 4;
	unicode_to_utf8(code, utf8);
	appendBinaryStringInfo(out, (char *) utf8, pg_utf_mblen(utf8));
	return true;
}

/* The length of a text in UTF-16 code units, as Java counts a String. */
static int64
utf16_length(const JsonText *text)
{
	int64		length = 0;

	for (int i = 0; i < text->len; i += pg_utf_mblen((const unsigned char *) text->data + i))
		length += pg_utf_mblen((const unsigned char *) text->data + i) == 4 ? 2 : 1;
	return length;
}

/* A string, from past its opening quote, no longer than max_length. */
static bool
read_string(JsonReader *r, JsonText *text, int64 max_length)
{
	StringInfoData out;
	static const char escaped[] = "\"\\/bfnrt";
	static const char meant[] = "\"\\/\b\f\n\r\t";

	initStringInfo(&out);
	for (;;)
	{
		const char *e;

		if (r->p >= r->end || (unsigned char) *r->p < 0x20)
			return false;
		if (*r->p == '"')
			break;
		if (*r->p != '\\')
		{
			appendStringInfoChar(&out, *r->p++);
			continue;
		}
		if (++r->p >= r->end)
			return false;
		if (*r->p == 'u')
		{
			r->p++;
			if (!read_unicode_escape(r, &out))
				return false;
			continue;
		}
		if (*r->p == '\0' || (e = strchr(escaped, *r->p)) == NULL)
			return false;
		appendStringInfoChar(&out, meant[e - escaped]);
		r->p++;
	}
	r->p++;
	text->data = out.data;
	text->len = out.len;
	/* a byte is at most one code unit */
	return text->len <= max_length || utf16_length(text) <= max_length;
}

static int
count_digits(JsonReader *r)
{
	const char *start = r->p;

	while (r->p < r->end && isdigit((unsigned char) *r->p))
		r->p++;
	return r->p - start;
}

/* An integer's node: an int, a long or a BigInteger, as Jackson reads it. */
static JsonNode *
integer_node(const char *start, const char *digits, int ndigits)
{
	JsonNode   *node;
	uint64		magnitude = 0;
	bool		negative = *start == '-';

	if (ndigits <= 19)
		for (int i = 0; i < ndigits; i++)
			magnitude = magnitude * 10 + (digits[i] - '0');
	if (ndigits > 19 || magnitude > (uint64) PG_INT64_MAX + (negative ? 1 : 0))
	{
		node = new_node(NODE_BIG_INTEGER);
		/* BigInteger.toString(): no sign for zero, no leading zero */
		node->text.data = pnstrdup(start, digits + ndigits - start);
		node->text.len = digits + ndigits - start;
		return node;
	}
	node = new_node(NODE_LONG);
	node->integer = negative ? (int64) (0 - magnitude) : (int64) magnitude;
	if (node->integer >= PG_INT32_MIN && node->integer <= PG_INT32_MAX)
		node->kind = NODE_INT;
	return node;
}

/* A number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, no leading zero. */
static JsonNode *
read_number(JsonReader *r)
{
	const char *start = r->p;
	const char *digits;
	int			ndigits;
	int			length;			/* as Jackson counts it against its limit */
	bool		fraction = false;
	JsonNode   *node;
	char	   *token;

	if (*r->p == '-')
		r->p++;
	digits = r->p;
	ndigits = count_digits(r);
	if (ndigits == 0 || (ndigits > 1 && *digits == '0'))
		return NULL;
	length = ndigits;
	if (r->p < r->end && *r->p == '.')
	{
		r->p++;
		if (*digits == '0')
			length = 0;
		if ((ndigits = count_digits(r)) == 0)
			return NULL;
		length += ndigits;
		fraction = true;
	}
	if (r->p < r->end && (*r->p == 'e' || *r->p == 'E'))
	{
		r->p++;
		if (r->p < r->end && (*r->p == '+' || *r->p == '-'))
			r->p++;
		if ((ndigits = count_digits(r)) == 0)
			return NULL;
		length += ndigits;
		fraction = true;
	}
	if (length > JACKSON_MAX_NUMBER_LENGTH)
		return NULL;
	if (!fraction)
		return integer_node(start, digits, r->p - digits);
	token = pnstrdup(start, r->p - start);
	node = new_node(NODE_DOUBLE);
	node->number = strtod(token, NULL);
	return node;
}

/* An object's members or an array's elements, from past its bracket. */
static JsonNode *
read_container(JsonReader *r, JsonNodeKind kind)
{
	JsonNode   *node = new_node(kind);
	int			allocated = 8;
	char		close = kind == NODE_OBJECT ? '}' : ']';

	if (++r->depth > JACKSON_MAX_NESTING_DEPTH)
		return NULL;
	node->items = palloc(allocated * sizeof(JsonNode *));
	if (kind == NODE_OBJECT)
		node->names = palloc(allocated * sizeof(JsonText));
	skip_blanks(r);
	if (r->p < r->end && *r->p == close)
	{
		r->p++;
		r->depth--;
		return node;
	}
	for (;;)
	{
		JsonText	name = {NULL, 0};
		JsonNode   *item;
		int			slot = node->count;

		CHECK_FOR_INTERRUPTS();
		skip_blanks(r);
		if (kind == NODE_OBJECT)
		{
			if (r->p >= r->end || *r->p++ != '"' || !read_string(r, &name, JACKSON_MAX_NAME_LENGTH))
				return NULL;
			skip_blanks(r);
			if (r->p >= r->end || *r->p++ != ':')
				return NULL;
		}
		if ((item = read_value(r)) == NULL)
			return NULL;
		/* a member named again: its last value, in its first place */
		if (kind == NODE_OBJECT && !r->names_unique)
		{
			int			earlier = find_name(&node->index, node->names, node->count, &name);

			if (earlier >= 0)
				slot = earlier;
		}
		if (slot == node->count)
		{
			if (node->count == allocated)
			{
				allocated *= 2;
				node->items = repalloc(node->items, allocated * sizeof(JsonNode *));
				if (kind == NODE_OBJECT)
					node->names = repalloc(node->names, allocated * sizeof(JsonText));
			}
			node->count++;
		}
		node->items[slot] = item;
		if (kind == NODE_OBJECT)
			node->names[slot] = name;
		skip_blanks(r);
		if (r->p < r->end && *r->p == ',')
		{
			r->p++;
			continue;
		}
		if (r->p < r->end && *r->p++ == close)
			break;
		return NULL;
	}
	r->depth--;
	return node;
}

/* A value, or NULL where Jackson would refuse the text. */
static JsonNode *
read_value(JsonReader *r)
{
	JsonNode   *node;

	check_stack_depth();
	skip_blanks(r);
	if (r->p >= r->end)
		return NULL;
	switch (*r->p)
	{
		case '{':
			r->p++;
			return read_container(r, NODE_OBJECT);
		case '[':
			r->p++;
			return read_container(r, NODE_ARRAY);
		case '"':
			r->p++;
			node = new_node(NODE_STRING);
			return read_string(r, &node->text, JACKSON_MAX_STRING_LENGTH) ? node : NULL;
		case 't':
		case 'f':
			node = new_node(NODE_BOOLEAN);
			node->boolean = *r->p == 't';
			return read_literal(r, node->boolean ? "true" : "false") ? node : NULL;
		case 'n':
			return read_literal(r, "null") ? new_node(NODE_NULL) : NULL;
		default:
			return (*r->p == '-' || isdigit((unsigned char) *r->p)) ? read_number(r) : NULL;
	}
}

/* ---------- EventRouter's schema, and JsonConverter's bytes ---------- */

static ConnectSchema *
new_schema(ConnectType type)
{
	ConnectSchema *schema = palloc0(sizeof(ConnectSchema));

	schema->type = type;
	return schema;
}

static void
add_field(ConnectSchema *schema, const JsonText *name, ConnectSchema *field)
{
	if (schema->count == schema->allocated)
	{
		schema->allocated = Max(8, 2 * schema->allocated);
		schema->names = schema->count == 0 ? palloc(schema->allocated * sizeof(JsonText))
			: repalloc(schema->names, schema->allocated * sizeof(JsonText));
		schema->fields = schema->count == 0 ? palloc(schema->allocated * sizeof(ConnectSchema *))
			: repalloc(schema->fields, schema->allocated * sizeof(ConnectSchema *));
	}
	schema->names[schema->count] = *name;
	schema->fields[schema->count++] = field;
}

static ConnectSchema *infer_schema(const JsonNode *node, bool *failed);

/* Kafka Connect's Schema.equals(): the same type, fields in the same order. */
static bool
schemas_equal(const ConnectSchema *a, const ConnectSchema *b)
{
	if (a == NULL || b == NULL)
		return a == b;
	if (a->type != b->type || a->required != b->required || a->count != b->count ||
		!schemas_equal(a->element, b->element))
		return false;
	for (int i = 0; i < a->count; i++)
		if (!names_equal(&a->names[i], &b->names[i]) || !schemas_equal(a->fields[i], b->fields[i]))
			return false;
	return true;
}

/*
 * The fields of right added to left, each the first one seen.  The merge
 * of two schemas that differ is a new struct that is not optional, as
 * EventRouter's copy of a schema's basics leaves it; merged again, it
 * takes the new fields in place.
 */
static ConnectSchema *
merge_struct_schemas(ConnectSchema *left, ConnectSchema *right)
{
	ConnectSchema *merged = left;

	if (left == NULL)
		return right;
	if (schemas_equal(left, right))
		return left;
	if (!left->required)
	{
		merged = new_schema(CONNECT_STRUCT);
		merged->required = true;
		for (int f = 0; f < left->count; f++)
			add_field(merged, &left->names[f], left->fields[f]);
	}
	for (int f = 0; f < right->count; f++)
		if (find_name(&merged->index, merged->names, merged->count, &right->names[f]) < 0)
			add_field(merged, &right->names[f], right->fields[f]);
	return merged;
}

/*
 * An array's element schema: its first element that is not null's, every
 * other of that kind (and, for numbers, schema); for objects, the fields
 * of every element merged, in the order they come (EventRouter merges
 * the distinct schemas of a HashSet, in an order of their hash codes).
 */
static ConnectSchema *
infer_element_schema(const JsonNode *array, bool *failed)
{
	const JsonNode *sample = NULL;
	ConnectSchema *merged = NULL;

	for (int i = 0; i < array->count; i++)
	{
		const JsonNode *item = array->items[i];

		if (item->kind == NODE_NULL)
			continue;
		if (sample == NULL)
			sample = item;
		else if (item->kind != sample->kind &&
				 !(item->kind == NODE_DOUBLE && sample->kind == NODE_BIG_INTEGER) &&
				 !(item->kind == NODE_BIG_INTEGER && sample->kind == NODE_DOUBLE))
		{
			*failed = true;		/* not a homogenous array */
			return NULL;
		}
	}
	if (sample == NULL || sample->kind != NODE_OBJECT)
	{
		ConnectSchema *schema = sample ? infer_schema(sample, failed) : NULL;

		if (schema == NULL)
			*failed = true;		/* an unrecognized member schema */
		return schema;
	}
	for (int i = 0; i < array->count && !*failed; i++)
	{
		CHECK_FOR_INTERRUPTS();
		if (array->items[i]->kind == NODE_OBJECT)
			merged = merge_struct_schemas(merged, infer_schema(array->items[i], failed));
	}
	return merged;
}

/* EventRouter's schema of a node: NULL for one it leaves out (null, []). */
static ConnectSchema *
infer_schema(const JsonNode *node, bool *failed)
{
	ConnectSchema *schema;

	switch (node->kind)
	{
		case NODE_STRING:
			return new_schema(CONNECT_STRING);
		case NODE_BOOLEAN:
			return new_schema(CONNECT_BOOLEAN);
		case NODE_INT:
			return new_schema(CONNECT_INT32);
		case NODE_LONG:
			return new_schema(CONNECT_INT64);
		case NODE_BIG_INTEGER:
		case NODE_DOUBLE:
			return new_schema(CONNECT_FLOAT64);
		case NODE_ARRAY:
			if (node->count == 0)
				return NULL;
			schema = new_schema(CONNECT_ARRAY);
			schema->element = infer_element_schema(node, failed);
			return schema;
		case NODE_OBJECT:
			schema = new_schema(CONNECT_STRUCT);
			for (int i = 0; i < node->count && !*failed; i++)
			{
				ConnectSchema *field = infer_schema(node->items[i], failed);

				if (field != NULL)
					add_field(schema, &node->names[i], field);
			}
			return schema;
		case NODE_NULL:
			break;
	}
	return NULL;
}

/*
 * An object's member of that name, or NULL.  *next, past the member found
 * last, is tried first: a struct's fields come in its members' order.
 */
static JsonNode *
member(JsonNode *object, const JsonText *name, int *next)
{
	int			i = *next;

	if (i >= object->count || !names_equal(&object->names[i], name))
		i = find_name(&object->index, object->names, object->count, name);
	if (i < 0)
		return NULL;
	*next = i + 1;
	return object->items[i];
}

/*
 * Stop writing an expanded payload that is already larger than a record
 * may be, as the enqueue would refuse it: objects of an array that differ
 * each get the fields of them all, which can make a payload of a megabyte
 * into gigabytes.
 */
static void
check_expanded_size(StringInfo out)
{
	CHECK_FOR_INTERRUPTS();
	if (out->len > outbox_max_record_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("a captured payload expanded as EventRouter expands it is more than outbox.max_payload_size (%d bytes)",
						outbox_max_record_size),
				 errdetail("Each object of an array gets the fields of every object of the array, null where it has none."),
				 errhint("Set table.expand.json.payload to false, or give the objects of an array the same fields.")));
}

/*
 * A node converted to its schema and written as JsonConverter writes it;
 * false where Kafka Connect refuses the value for the schema.
 */
static bool
write_converted(StringInfo out, JsonNode *node, const ConnectSchema *schema)
{
	int			next;

	if (node == NULL || node->kind == NODE_NULL)
	{
		appendStringInfoString(out, "null");
		return !schema->required;
	}
	switch (schema->type)
	{
		case CONNECT_STRING:
			if (node->kind != NODE_STRING)
				return false;
			capture_json_string(out, node->text.data, node->text.len);
			return true;
		case CONNECT_BOOLEAN:
			if (node->kind != NODE_BOOLEAN)
				return false;
			appendStringInfoString(out, node->boolean ? "true" : "false");
			return true;
		case CONNECT_INT32:
		case CONNECT_INT64:
			if (node->kind != (schema->type == CONNECT_INT32 ? NODE_INT : NODE_LONG))
				return false;
			appendStringInfo(out, INT64_FORMAT, node->integer);
			return true;
		case CONNECT_FLOAT64:
			if (node->kind != NODE_DOUBLE)
				return false;	/* a BigInteger is a BigDecimal, not a double */
			capture_json_number(out, node->number, false);
			return true;
		case CONNECT_ARRAY:
			if (node->kind != NODE_ARRAY)
				return false;
			appendStringInfoChar(out, '[');
			for (int i = 0; i < node->count; i++)
			{
				check_expanded_size(out);
				if (i > 0)
					appendStringInfoChar(out, ',');
				if (!write_converted(out, node->items[i], schema->element))
					return false;
			}
			appendStringInfoChar(out, ']');
			return true;
		case CONNECT_STRUCT:
			if (node->kind != NODE_OBJECT)
				return false;
			next = 0;
			appendStringInfoChar(out, '{');
			for (int i = 0; i < schema->count; i++)
			{
				check_expanded_size(out);
				if (i > 0)
					appendStringInfoChar(out, ',');
				capture_json_string(out, schema->names[i].data, schema->names[i].len);
				appendStringInfoChar(out, ':');
				if (!write_converted(out, member(node, &schema->names[i], &next), schema->fields[i]))
					return false;
			}
			appendStringInfoChar(out, '}');
			return true;
	}
	return false;
}

/* The tree as Jackson writes what it read: everything kept. */
static void
write_tree(StringInfo out, const JsonNode *node)
{
	switch (node->kind)
	{
		case NODE_NULL:
			appendStringInfoString(out, "null");
			break;
		case NODE_BOOLEAN:
			appendStringInfoString(out, node->boolean ? "true" : "false");
			break;
		case NODE_INT:
		case NODE_LONG:
			appendStringInfo(out, INT64_FORMAT, node->integer);
			break;
		case NODE_BIG_INTEGER:
			appendBinaryStringInfo(out, node->text.data, node->text.len);
			break;
		case NODE_DOUBLE:
			capture_json_number(out, node->number, false);
			break;
		case NODE_STRING:
			capture_json_string(out, node->text.data, node->text.len);
			break;
		case NODE_ARRAY:
		case NODE_OBJECT:
			appendStringInfoChar(out, node->kind == NODE_ARRAY ? '[' : '{');
			for (int i = 0; i < node->count; i++)
			{
				check_expanded_size(out);
				if (i > 0)
					appendStringInfoChar(out, ',');
				if (node->kind == NODE_OBJECT)
				{
					capture_json_string(out, node->names[i].data, node->names[i].len);
					appendStringInfoChar(out, ':');
				}
				write_tree(out, node->items[i]);
			}
			appendStringInfoChar(out, node->kind == NODE_ARRAY ? ']' : '}');
			break;
	}
}

/*
 * A string payload under table.expand.json.payload, as EventRouter and
 * JsonConverter write it (see the header): UTF-8 text in, JSON out.
 */
void
capture_expand_payload(StringInfo out, const char *text, int len, bool names_unique)
{
	JsonReader	reader = {text, text + len, 0, names_unique};
	JsonNode   *document = NULL;
	ConnectSchema *schema = NULL;
	bool		failed = false;
	int			start = out->len;

	/* EventRouter reads only a text that starts as an object or array */
	if (len > 0 && (text[0] == '{' || text[0] == '['))
		document = read_value(&reader);
	if (document != NULL)
		schema = infer_schema(document, &failed);
	if (document == NULL || failed || schema == NULL)
	{
		capture_json_string(out, text, len);
		return;
	}
	if (document->kind == NODE_OBJECT && write_converted(out, document, schema))
		return;
	/* Debezium's task fails here: the document as Jackson read it */
	out->len = start;
	out->data[start] = '\0';
	write_tree(out, document);
}

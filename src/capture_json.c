/*-------------------------------------------------------------------------
 *
 * capture_json.c
 *	  JSON as Kafka Connect's JsonConverter writes it with Jackson: the
 *	  bytes a consumer of Debezium's records reads, which capture_row.c
 *	  writes for JsonConverter keys, values and envelopes.  Everything here
 *	  takes and writes UTF-8, as Kafka Connect does whatever the database's
 *	  encoding.
 *
 * Jackson writes JSON compact (nothing after ':' or ','); in a string it
 * escapes '"', '\' and the control characters (\b \t \n \f \r, the others
 * as \u00XX in upper-case hexadecimal), writes every other character of
 * the Basic Multilingual Plane as its UTF-8 bytes, and one outside it as
 * the escapes of its UTF-16 surrogate pair (\uD83D\uDE00).  A double is
 * written as Java's Double.toString() writes it (1.0E-7, 100.0, 0.001),
 * an infinite one as the string "Infinity".  Kafka Connect's
 * StringConverter and SimpleHeaderConverter write a float as Java does too.
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

#include <math.h>

#include "mb/pg_wchar.h"
#include "miscadmin.h"

#include "capture.h"

/*
 * Jackson's StreamReadConstraints (jackson-core 2.21, as Debezium 3.6
 * ships it): a document beyond them is not read, and EventRouter keeps the
 * payload a string.
 */
#define JACKSON_MAX_NESTING_DEPTH	1000
#define JACKSON_MAX_NUMBER_LENGTH	1000	/* its digits; not a 0 before '.' */
#define JACKSON_MAX_NAME_LENGTH		50000	/* in UTF-16 code units */
#define JACKSON_MAX_STRING_LENGTH	20000000	/* in UTF-16 code units */

/* Java's Double.toString(): plain notation for 10^-3 <= |d| < 10^7. */
#define JAVA_PLAIN_MIN_EXPONENT		(-3)
#define JAVA_PLAIN_MAX_EXPONENT		7
#define JAVA_MAX_DIGITS				17	/* a double never needs more */

typedef struct JsonText
{
	char	   *data;			/* UTF-8; a lone surrogate as its 3 bytes */
	int			len;
} JsonText;

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
	JsonText   *names;
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

/* ---------- writing, as Jackson's UTF8JsonGenerator ---------- */

static void
append_escape(StringInfo out, unsigned int code_unit)
{
	appendStringInfo(out, "\\u%04X", code_unit);
}

/*
 * A JSON string of UTF-8 text.  A 3-byte sequence may also be a lone
 * surrogate (read from a \uD800 escape, which Jackson takes too).
 */
void
capture_json_string(StringInfo out, const char *text, int len)
{
	const unsigned char *p = (const unsigned char *) text;
	const unsigned char *end = p + len;

	appendStringInfoChar(out, '"');
	while (p < end)
	{
		int			n = pg_utf_mblen(p);
		pg_wchar	c;

		if (*p >= 0x80)
		{
			c = utf8_to_unicode(p);
			if (c >= 0x10000)
			{
				append_escape(out, 0xD800 + ((c - 0x10000) >> 10));
				append_escape(out, 0xDC00 + ((c - 0x10000) & 0x3FF));
			}
			else if (c >= 0xD800 && c <= 0xDFFF)
				append_escape(out, c);
			else
				appendBinaryStringInfo(out, (const char *) p, n);
			p += n;
			continue;
		}
		switch (*p)
		{
			case '"':
			case '\\':
				appendStringInfoChar(out, '\\');
				appendStringInfoChar(out, *p);
				break;
			case '\b':
				appendStringInfoString(out, "\\b");
				break;
			case '\t':
				appendStringInfoString(out, "\\t");
				break;
			case '\n':
				appendStringInfoString(out, "\\n");
				break;
			case '\f':
				appendStringInfoString(out, "\\f");
				break;
			case '\r':
				appendStringInfoString(out, "\\r");
				break;
			default:
				if (*p < 0x20)
					append_escape(out, *p);
				else
					appendStringInfoChar(out, *p);
		}
		p++;
	}
	appendStringInfoChar(out, '"');
}

/*
 * The significant digits (no leading or trailing zero) and the decimal
 * exponent of the first of them, of a number printf's %e wrote.
 */
static void
read_decimal(const char *s, char *digits, int *exponent)
{
	int			n = 0;

	for (; *s && *s != 'e'; s++)
		if (isdigit((unsigned char) *s))
			digits[n++] = *s;
	while (n > 1 && digits[n - 1] == '0')
		n--;
	digits[n] = '\0';
	*exponent = atoi(s + 1);
}

/* Does this decimal read back as the value, rounded to the nearest? */
static bool
reads_back(const char *decimal, double value, bool is_float)
{
	return is_float ? strtof(decimal, NULL) == (float) value : strtod(decimal, NULL) == value;
}

/*
 * The decimal of that many digits next to the one %e wrote, above or below
 * it (step +1 or -1 in its last digit), written as %e writes.
 */
static void
step_decimal(const char *decimal, int step, char *next, size_t size)
{
	char		digits[32];
	int			exponent;
	int			n = 0;
	const char *s;

	for (s = decimal; *s && *s != 'e'; s++)
		if (isdigit((unsigned char) *s))
			digits[n++] = *s;
	exponent = atoi(s + 1);
	for (int i = n - 1; i >= 0; i--)
	{
		digits[i] += step;
		if (digits[i] >= '0' && digits[i] <= '9')
			break;
		digits[i] = step > 0 ? '0' : '9';	/* carried on */
		if (i == 0)
		{
			/* 9.99 + 1 is 1.00 and 1.00 - 1 is 9.99, an exponent away */
			digits[0] = step > 0 ? '1' : '9';
			exponent += step;
		}
	}
	digits[n] = '\0';
	snprintf(next, size, "%c.%se%d", digits[0], digits + 1, exponent);
}

/*
 * The decimal of that many digits closest to the value that reads back as
 * it, into decimal; false if there is none.  %e's own may not read back
 * where the value's neighbours are not as far above as below (a power of
 * two): then the one on the other side may.
 */
static bool
closest_reading_back(double value, int precision, bool is_float, char *decimal, size_t size)
{
	char		other[64];

	snprintf(decimal, size, "%.*e", precision - 1, value);
	if (reads_back(decimal, value, is_float))
		return true;
	for (int step = -1; step <= 1; step += 2)
	{
		step_decimal(decimal, step, other, sizeof(other));
		if (reads_back(other, value, is_float))
		{
			strlcpy(decimal, other, size);
			return true;
		}
	}
	return false;
}

/*
 * A double or a float as Java's Double.toString() or Float.toString()
 * writes it (Java 19 and later): of the decimals that read back as the
 * value, the shortest (but of two digits where one would do: 4.9E-324,
 * not 5E-324), and of those the closest; plain between 10^-3 and 10^7,
 * else as 1.0E-7.  printf's %e rounds exactly, so the first precision
 * at which it, or a neighbour, reads back gives that decimal.
 * (PostgreSQL's shortest output differs where a decimal only reads back
 * by rounding a tie to even: 1.0E23, not 9.999999999999999E22.)
 */
void
capture_java_number(StringInfo out, double value, bool is_float)
{
	char		decimal[64];
	char		digits[32];
	int			exponent;
	int			precision;
	int			ndigits;

	if (isnan(value) || isinf(value))
	{
		appendStringInfoString(out, isnan(value) ? "NaN" : value > 0 ? "Infinity" : "-Infinity");
		return;
	}
	if (signbit(value))
		appendStringInfoChar(out, '-');
	if (value == 0)
	{
		appendStringInfoString(out, "0.0");
		return;
	}
	for (precision = 1; precision < JAVA_MAX_DIGITS; precision++)
		if (closest_reading_back(fabs(value), precision, is_float, decimal, sizeof(decimal)))
			break;
	if (precision == JAVA_MAX_DIGITS)
		snprintf(decimal, sizeof(decimal), "%.*e", JAVA_MAX_DIGITS - 1, fabs(value));
	else if (precision == 1)
	{
		char		two_digits[64];

		if (closest_reading_back(fabs(value), 2, is_float, two_digits, sizeof(two_digits)))
			strlcpy(decimal, two_digits, sizeof(decimal));
	}
	read_decimal(decimal, digits, &exponent);
	ndigits = strlen(digits);
	if (exponent >= JAVA_PLAIN_MIN_EXPONENT && exponent < JAVA_PLAIN_MAX_EXPONENT)
	{
		if (exponent < 0)
		{
			appendStringInfoString(out, "0.");
			for (int i = exponent + 1; i < 0; i++)
				appendStringInfoChar(out, '0');
			appendStringInfoString(out, digits);
			return;
		}
		for (int i = 0; i <= exponent; i++)
			appendStringInfoChar(out, i < ndigits ? digits[i] : '0');
		appendStringInfoChar(out, '.');
		if (ndigits > exponent + 1)
			appendStringInfoString(out, digits + exponent + 1);
		else
			appendStringInfoChar(out, '0');
		return;
	}
	appendStringInfo(out, "%c.%sE%d", digits[0], ndigits > 1 ? digits + 1 : "0", exponent);
}

/* A number as Jackson writes a double or float: NaN and Infinity quoted. */
void
capture_json_number(StringInfo out, double value, bool is_float)
{
	bool		quoted = isnan(value) || isinf(value);

	if (quoted)
		appendStringInfoChar(out, '"');
	capture_java_number(out, value, is_float);
	if (quoted)
		appendStringInfoChar(out, '"');
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
		for (int i = 0; kind == NODE_OBJECT && !r->names_unique && i < node->count; i++)
			if (node->names[i].len == name.len && memcmp(node->names[i].data, name.data, name.len) == 0)
				slot = i;
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

static int
field_index(const ConnectSchema *schema, const JsonText *name)
{
	for (int i = 0; i < schema->count; i++)
		if (schema->names[i].len == name->len && memcmp(schema->names[i].data, name->data, name->len) == 0)
			return i;
	return -1;
}

static void
add_field(ConnectSchema *schema, const JsonText *name, ConnectSchema *field)
{
	schema->names = schema->count == 0 ? palloc(sizeof(JsonText))
		: repalloc(schema->names, (schema->count + 1) * sizeof(JsonText));
	schema->fields = schema->count == 0 ? palloc(sizeof(ConnectSchema *))
		: repalloc(schema->fields, (schema->count + 1) * sizeof(ConnectSchema *));
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
		if (a->names[i].len != b->names[i].len ||
			memcmp(a->names[i].data, b->names[i].data, a->names[i].len) != 0 ||
			!schemas_equal(a->fields[i], b->fields[i]))
			return false;
	return true;
}

/*
 * The fields of right added to left, each the first one seen.  The merge
 * of two schemas that differ is a new struct that is not optional, as
 * EventRouter's copy of a schema's basics leaves it.
 */
static ConnectSchema *
merge_struct_schemas(ConnectSchema *left, const ConnectSchema *right)
{
	ConnectSchema *merged;

	if (left == NULL)
		return (ConnectSchema *) right;
	if (schemas_equal(left, right))
		return left;
	merged = new_schema(CONNECT_STRUCT);
	merged->required = true;
	for (int f = 0; f < left->count; f++)
		add_field(merged, &left->names[f], left->fields[f]);
	for (int f = 0; f < right->count; f++)
		if (field_index(merged, &right->names[f]) < 0)
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
		if (array->items[i]->kind == NODE_OBJECT)
			merged = merge_struct_schemas(merged, infer_schema(array->items[i], failed));
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
 * An object's member of that name, or NULL.  The search starts at *next,
 * past the member found last: a struct's fields come in its members' order.
 */
static const JsonNode *
member(const JsonNode *object, const JsonText *name, int *next)
{
	for (int k = 0; k < object->count; k++)
	{
		int			i = (*next + k) % object->count;

		if (object->names[i].len == name->len && memcmp(object->names[i].data, name->data, name->len) == 0)
		{
			*next = i + 1;
			return object->items[i];
		}
	}
	return NULL;
}

/*
 * A node converted to its schema and written as JsonConverter writes it;
 * false where Kafka Connect refuses the value for the schema.
 */
static bool
write_converted(StringInfo out, const JsonNode *node, const ConnectSchema *schema)
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
capture_json_expand(StringInfo out, const char *text, int len, bool names_unique)
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

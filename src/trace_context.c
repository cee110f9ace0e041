/*-------------------------------------------------------------------------
 *
 * trace_context.c
 *	  W3C trace context (https://www.w3.org/TR/trace-context/) from the
 *	  enqueuing transaction to the Kafka record's headers, traceparent and
 *	  tracestate, without the application passing it on every call.
 *
 * Two sources, the first that has a traceparent wins:
 *
 * 1. The settings outbox.traceparent and outbox.tracestate, which the
 *    application's tracing sets for its transaction (SET LOCAL).  A value
 *    that is not W3C's format is refused when it is set.
 * 2. A sqlcommenter comment (https://google.github.io/sqlcommenter/) at the
 *    end of the statement the client sent: traceparent='...' and
 *    tracestate='...', URL-encoded, as OpenTelemetry's sqlcommenter
 *    integrations write it.  One that does not parse, or whose traceparent
 *    or tracestate is not W3C's grammar, is ignored, with a NOTICE: a
 *    comment must never make a write fail.
 *
 * A traceparent of a later version than 00 is sent as version 00 from the
 * fields the two share, as W3C says a vendor passes on a version it does
 * not know: so a header holds only lower-case hex and '-', 55 bytes, and a
 * tracestate at most 512 bytes of printable ASCII, valid in every server
 * encoding, whatever the comment, the setting or a captured row held.
 *
 * A message whose headers name a traceparent of their own keeps them as
 * they are, without either header of the trace context: a tracestate
 * belongs to its traceparent.  Other headers the message names win over
 * the trace context's.  tracestate travels only with a traceparent, as W3C
 * says it must.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "pg_compat.h"
#include "trace_context.h"

/* W3C: version 00 is "00-" 32 hex "-" 16 hex "-" 2 hex. */
#define TRACEPARENT_LENGTH 55
/* W3C: a tracestate has at most 32 list members, and 512 bytes are kept. */
#define TRACESTATE_MAX_MEMBERS 32
#define TRACESTATE_MAX_LENGTH 512
/* W3C: a simple key, or a multi-tenant key's parts, and a value, at most. */
#define TRACESTATE_MAX_KEY 256
#define TRACESTATE_MAX_TENANT 241
#define TRACESTATE_MAX_SYSTEM 14
#define TRACESTATE_MAX_VALUE 256

char	   *outbox_traceparent = NULL;
char	   *outbox_tracestate = NULL;

/* The trace context of the last statement whose comment was read. */
static const char *comment_query = NULL;
static TimestampTz comment_statement_start = 0;
static char *comment_traceparent = NULL;
static char *comment_tracestate = NULL;

static bool
is_lower_hex(const char *s, int n, bool *all_zero)
{
	*all_zero = true;
	for (int i = 0; i < n; i++)
	{
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
		if (s[i] != '0')
			*all_zero = false;
	}
	return true;
}

/*
 * Is s a traceparent as W3C writes it?  Its first 55 characters are
 * version "-" trace-id "-" parent-id "-" flags, in lower-case hex, version
 * ff invalid and neither id all zeros.  Version 00 is exactly those; a
 * later version may only add fields after a '-', which W3C says a parser
 * must not read (traceparent_normalize() drops them).  strnlen(): a value
 * of any length is looked at no further than that.
 */
bool
traceparent_is_valid(const char *s)
{
	size_t		len = strnlen(s, TRACEPARENT_LENGTH + 1);
	bool		zero;

	if (len < TRACEPARENT_LENGTH)
		return false;
	if (!is_lower_hex(s, 2, &zero) || strncmp(s, "ff", 2) == 0 || s[2] != '-')
		return false;
	if (!is_lower_hex(s + 3, 32, &zero) || zero || s[35] != '-')
		return false;
	if (!is_lower_hex(s + 36, 16, &zero) || zero || s[52] != '-')
		return false;
	if (!is_lower_hex(s + 53, 2, &zero))
		return false;
	if (strncmp(s, "00", 2) == 0)
		return len == TRACEPARENT_LENGTH;
	return len == TRACEPARENT_LENGTH || s[TRACEPARENT_LENGTH] == '-';
}

/*
 * The traceparent to send for s, palloc'd, or NULL if s is not valid: as
 * W3C says a vendor passes on a version it does not know, rewritten to the
 * highest it knows, 00, from the fields that version shares with it.  So
 * what a later version adds after them, of any length and any bytes, is
 * never stored.
 */
char *
traceparent_normalize(const char *s)
{
	char	   *normal;

	if (s == NULL || !traceparent_is_valid(s))
		return NULL;
	normal = pnstrdup(s, TRACEPARENT_LENGTH);
	normal[0] = normal[1] = '0';
	return normal;
}

/* W3C's lcalpha, and the other characters of a tracestate key. */
static bool
is_key_char(char c, bool first)
{
	if (c >= 'a' && c <= 'z')
		return true;
	if (first)
		return false;
	return (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '*' || c == '/';
}

/*
 * Is key[0..len) a tracestate key: a simple key, lcalpha then up to 255
 * key characters; or a multi-tenant key, tenant "@" system, the tenant
 * starting with lcalpha or a digit (up to 241), the system with lcalpha (up
 * to 14)?
 */
static bool
tracestate_key_is_valid(const char *key, size_t len)
{
	const char *at = memchr(key, '@', len);
	size_t		part = at ? (size_t) (at - key) : len;

	if (part == 0 || part > (at ? TRACESTATE_MAX_TENANT : TRACESTATE_MAX_KEY))
		return false;
	if (!is_key_char(key[0], true) && !(at && key[0] >= '0' && key[0] <= '9'))
		return false;
	for (size_t i = 1; i < part; i++)
		if (!is_key_char(key[i], false))
			return false;
	if (at == NULL)
		return true;
	key = at + 1;
	len -= part + 1;
	if (len == 0 || len > TRACESTATE_MAX_SYSTEM || !is_key_char(key[0], true))
		return false;
	for (size_t i = 1; i < len; i++)
		if (!is_key_char(key[i], false))
			return false;
	return true;
}

/*
 * Is value[0..len) a tracestate value: up to 256 characters of 0x20 to
 * 0x7e but ',' and '=', not ending in a space?
 */
static bool
tracestate_value_is_valid(const char *value, size_t len)
{
	if (len == 0 || len > TRACESTATE_MAX_VALUE || value[len - 1] == ' ')
		return false;
	for (size_t i = 0; i < len; i++)
		if (value[i] < 0x20 || value[i] > 0x7e || value[i] == ',' || value[i] == '=')
			return false;
	return true;
}

/* Is member[0..len), blanks trimmed, key=value with a valid key and value? */
static bool
tracestate_member_is_valid(const char *member, size_t len)
{
	const char *eq = memchr(member, '=', len);

	if (eq == NULL)
		return false;
	return tracestate_key_is_valid(member, eq - member) &&
		tracestate_value_is_valid(eq + 1, len - (eq - member) - 1);
}

/*
 * Is s a tracestate by W3C's grammar: list members separated by commas,
 * each key=value with optional blanks (space, tab) around it, empty ones
 * allowed, at most 32 members, at most 512 bytes?  (W3C lets a longer one
 * be cut at member boundaries; it is dropped whole here, its traceparent
 * kept.)
 */
bool
tracestate_is_valid(const char *s)
{
	int			members = 0;
	const char *p = s;

	if (strnlen(s, TRACESTATE_MAX_LENGTH + 1) > TRACESTATE_MAX_LENGTH)
		return false;
	for (;;)
	{
		const char *end = strchr(p, ',');
		size_t		n = end ? (size_t) (end - p) : strlen(p);

		while (n > 0 && (*p == ' ' || *p == '\t'))
			p++, n--;
		while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
			n--;
		if (n > 0)
		{
			if (!tracestate_member_is_valid(p, n) || ++members > TRACESTATE_MAX_MEMBERS)
				return false;
		}
		if (end == NULL)
			return true;
		p = end + 1;
	}
}

static int
hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/*
 * A sqlcommenter value, between its single quotes at p: unescaped (\') and
 * URL-decoded, in the caller's memory context.  Sets *end past the closing
 * quote; NULL if there is none.
 */
static char *
comment_value(const char *p, const char **end)
{
	StringInfoData value;

	initStringInfo(&value);
	for (; *p && *p != '\''; p++)
	{
		if (*p == '\\' && p[1] != '\0')
			p++;
		else if (*p == '%' && hex_value(p[1]) >= 0 && hex_value(p[2]) >= 0)
		{
			appendStringInfoChar(&value, (char) (hex_value(p[1]) * 16 + hex_value(p[2])));
			p += 2;
			continue;
		}
		appendStringInfoChar(&value, *p);
	}
	if (*p != '\'')
		return NULL;
	*end = p + 1;
	return value.data;
}

/*
 * A comment's trace context that is not W3C's is dropped, the statement
 * going on without it (a comment must never make a write fail): a NOTICE
 * says so, to the client whose tracing wrote it, and not to the server's
 * log, which a client could otherwise fill, once per statement.  The value
 * itself is not shown: it may be of any length and any bytes.
 */
static void
note_dropped(const char *field, const char *format)
{
	ereport(NOTICE,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("outbox: the %s of the statement's sqlcommenter comment is not W3C's trace context, and is ignored",
					field),
			 errdetail("A %s is %s.", field, format),
			 errhint("The messages this statement enqueues carry no trace context from the comment; "
					 "fix the tracing library's propagator, or set outbox.traceparent.")));
}

/*
 * Read traceparent and tracestate from the sqlcommenter comment that ends
 * query, if it has one: "/ *key='value',key='value'* /", the last comment,
 * followed by nothing but blanks and semicolons.
 */
static void
read_comment(const char *query, char **traceparent, char **tracestate)
{
	const char *start = NULL;
	const char *close;
	const char *p;

	*traceparent = *tracestate = NULL;
	for (p = strstr(query, "/*"); p; p = strstr(p + 2, "/*"))
		start = p;
	if (start == NULL || (close = strstr(start + 2, "*/")) == NULL)
		return;
	for (p = close + 2; *p; p++)
		if (!(*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ';'))
			return;

	p = start + 2;
	while (p < close)
	{
		const char *eq;
		char	   *value;
		size_t		key_len;

		while (p < close && (*p == ' ' || *p == ','))
			p++;
		eq = strchr(p, '=');
		if (eq == NULL || eq >= close || eq[1] != '\'')
			return;
		key_len = eq - p;
		value = comment_value(eq + 2, &p);
		if (value == NULL || p > close)
			return;
		if (key_len == strlen("traceparent") && strncmp(eq - key_len, "traceparent", key_len) == 0)
		{
			*traceparent = traceparent_normalize(value);
			if (*traceparent == NULL)
				note_dropped("traceparent", "version-traceid-parentid-flags in lower-case hex");
		}
		else if (key_len == strlen("tracestate") && strncmp(eq - key_len, "tracestate", key_len) == 0)
		{
			*tracestate = tracestate_is_valid(value) ? value : NULL;
			if (*tracestate == NULL)
				note_dropped("tracestate", "at most 32 key=value list members, at most 512 bytes");
		}
	}
}

/*
 * The trace context of the current statement's comment, read once per
 * statement: a statement that enqueues many messages parses it once.
 */
static void
statement_comment_context(const char **traceparent, const char **tracestate)
{
	TimestampTz statement_start = GetCurrentStatementStartTimestamp();

	if (debug_query_string == NULL)
	{
		*traceparent = *tracestate = NULL;
		return;
	}
	if (debug_query_string != comment_query || statement_start != comment_statement_start)
	{
		char	   *parent;
		char	   *state;

		if (comment_traceparent)
			pfree(comment_traceparent);
		if (comment_tracestate)
			pfree(comment_tracestate);
		comment_traceparent = comment_tracestate = NULL;
		/* read in the statement's memory: a comment may be of any size */
		read_comment(debug_query_string, &parent, &state);
		if (parent)
			comment_traceparent = MemoryContextStrdup(TopMemoryContext, parent);
		if (parent && state)
			comment_tracestate = MemoryContextStrdup(TopMemoryContext, state);
		comment_query = debug_query_string;
		comment_statement_start = statement_start;
	}
	*traceparent = comment_traceparent;
	*tracestate = comment_tracestate;
}

/*
 * Push one header, name and value (NULL for a null value), into headers
 * being built as a jsonb object.
 */
void
headers_push(JsonbInState *state, const char *name, const char *value)
{
	JsonbValue	v;

	v.type = jbvString;
	v.val.string.val = (char *) name;
	v.val.string.len = strlen(name);
	pushJsonbValue(state, WJB_KEY, &v);
	if (value == NULL)
		v.type = jbvNull;
	else
	{
		v.val.string.val = (char *) value;
		v.val.string.len = strlen(value);
	}
	pushJsonbValue(state, WJB_VALUE, &v);
}

/* Do these headers name a traceparent of their own? */
static bool
names_traceparent(Jsonb *headers)
{
	JsonbValue	key;

	if (headers == NULL || !JB_ROOT_IS_OBJECT(headers))
		return false;
	key.type = jbvString;
	key.val.string.val = TRACEPARENT_HEADER;
	key.val.string.len = strlen(TRACEPARENT_HEADER);
	return findJsonbValueFromContainer(&headers->root, JB_FOBJECT, &key) != NULL;
}

/*
 * The headers of a message enqueued now: its own, with the trace context's
 * traceparent and tracestate added unless they name a traceparent.
 * Returns headers itself (NULL for none) when there is no trace context.
 */
Jsonb *
trace_context_add_headers(Jsonb *headers)
{
	const char *traceparent = NULL;
	const char *tracestate = NULL;
	JsonbInState state = {0};
	Jsonb	   *context;

	if (names_traceparent(headers))
		return headers;
	if (outbox_traceparent && outbox_traceparent[0] != '\0')
	{
		traceparent = traceparent_normalize(outbox_traceparent);
		tracestate = outbox_tracestate && outbox_tracestate[0] != '\0' ? outbox_tracestate : NULL;
	}
	else
		statement_comment_context(&traceparent, &tracestate);
	if (traceparent == NULL || names_traceparent(headers))
		return headers;

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	headers_push(&state, TRACEPARENT_HEADER, traceparent);
	if (tracestate)
		headers_push(&state, TRACESTATE_HEADER, tracestate);
	pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	context = JsonbValueToJsonb(state.result);
	if (headers == NULL)
		return context;
	/* the right side wins: a tracestate the message names is kept */
	return DatumGetJsonbP(DirectFunctionCall2(jsonb_concat, JsonbPGetDatum(context),
											  JsonbPGetDatum(headers)));
}

/* GUC check hooks of outbox.traceparent and outbox.tracestate. */
bool
check_traceparent(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0' || traceparent_is_valid(*newval))
		return true;
	GUC_check_errcode(ERRCODE_INVALID_PARAMETER_VALUE);
	GUC_check_errdetail("A traceparent is W3C's version-traceid-parentid-flags, "
						"such as 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01: "
						"lower-case hex, neither id all zeros.");
	return false;
}

bool
check_tracestate(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || tracestate_is_valid(*newval))
		return true;
	GUC_check_errcode(ERRCODE_INVALID_PARAMETER_VALUE);
	GUC_check_errdetail("A tracestate is W3C's list of at most %d key=value members separated by commas, "
						"of printable ASCII, at most %d bytes.",
						TRACESTATE_MAX_MEMBERS, TRACESTATE_MAX_LENGTH);
	return false;
}

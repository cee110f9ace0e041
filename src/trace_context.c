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
 *    is not W3C's format, is ignored: a comment must never make a write
 *    fail.
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

#include "trace_context.h"

/* W3C: version 00 is "00-" 32 hex "-" 16 hex "-" 2 hex. */
#define TRACEPARENT_LENGTH 55
/* W3C: a tracestate has at most 32 list members, and 512 bytes are kept. */
#define TRACESTATE_MAX_MEMBERS 32
#define TRACESTATE_MAX_LENGTH 512

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
 * Is s a traceparent as W3C writes it?  Version 00 is exactly its 55
 * characters; a later version may add fields after a '-'; version ff is
 * invalid, and so are an all-zero trace id or parent id.
 */
bool
traceparent_is_valid(const char *s)
{
	size_t		len = strlen(s);
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
 * Is s a tracestate W3C allows: at most 32 comma-separated key=value
 * members of printable ASCII, at most 512 bytes?  (The rules for each
 * key's characters are the vendors'; this checks what a consumer needs to
 * read it as a list.)
 */
bool
tracestate_is_valid(const char *s)
{
	int			members = 0;
	const char *p = s;

	if (strlen(s) > TRACESTATE_MAX_LENGTH)
		return false;
	while (*p)
	{
		const char *end = strchr(p, ',');
		const char *eq;
		size_t		n = end ? (size_t) (end - p) : strlen(p);

		while (n > 0 && (*p == ' ' || *p == '\t'))
			p++, n--;
		if (n > 0)
		{
			eq = memchr(p, '=', n);
			if (eq == NULL || eq == p || eq == p + n - 1)
				return false;
			for (size_t i = 0; i < n; i++)
				if (p[i] < 0x20 || p[i] > 0x7e)
					return false;
			if (++members > TRACESTATE_MAX_MEMBERS)
				return false;
		}
		if (end == NULL)
			break;
		p = end + 1;
	}
	return true;
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
			*traceparent = traceparent_is_valid(value) ? value : NULL;
		else if (key_len == strlen("tracestate") && strncmp(eq - key_len, "tracestate", key_len) == 0)
			*tracestate = tracestate_is_valid(value) ? value : NULL;
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
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
		char	   *parent;
		char	   *state;

		if (comment_traceparent)
			pfree(comment_traceparent);
		if (comment_tracestate)
			pfree(comment_tracestate);
		read_comment(debug_query_string, &parent, &state);
		comment_traceparent = parent;
		comment_tracestate = parent ? state : NULL;
		if (state && !parent)
			pfree(state);
		comment_query = debug_query_string;
		comment_statement_start = statement_start;
		MemoryContextSwitchTo(old);
	}
	*traceparent = comment_traceparent;
	*tracestate = comment_tracestate;
}

/*
 * Push one header, name and value (NULL for a null value), into headers
 * being built as a jsonb object.
 */
void
headers_push(JsonbParseState **state, const char *name, const char *value)
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
	JsonbParseState *state = NULL;
	JsonbValue *object;
	Jsonb	   *context;

	if (names_traceparent(headers))
		return headers;
	if (outbox_traceparent && outbox_traceparent[0] != '\0')
	{
		traceparent = outbox_traceparent;
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
	object = pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	context = JsonbValueToJsonb(object);
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

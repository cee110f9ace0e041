/*-------------------------------------------------------------------------
 *
 * trace_context.h
 *	  W3C trace context from the enqueuing transaction to a record's
 *	  headers: outbox.traceparent and outbox.tracestate, or a sqlcommenter
 *	  comment.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_TRACE_CONTEXT_H
#define OUTBOX_TRACE_CONTEXT_H

#include "utils/guc.h"
#include "utils/jsonb.h"

#include "pg_compat.h"

/* The Kafka headers, as OpenTelemetry's Kafka instrumentations name them. */
#define TRACEPARENT_HEADER "traceparent"
#define TRACESTATE_HEADER "tracestate"

extern char *outbox_traceparent;
extern char *outbox_tracestate;

extern bool traceparent_is_valid(const char *s);
extern bool tracestate_is_valid(const char *s);
extern char *traceparent_normalize(const char *s);
extern Jsonb *trace_context_add_headers(Jsonb *headers);
extern void headers_push(JsonbInState *state, const char *name, const char *value);
extern bool check_traceparent(char **newval, void **extra, GucSource source);
extern bool check_tracestate(char **newval, void **extra, GucSource source);

#endif							/* OUTBOX_TRACE_CONTEXT_H */

/*-------------------------------------------------------------------------
 *
 * capture.h
 *	  outbox_capture(): a table shaped like Debezium's outbox table, whose
 *	  inserts are published as Debezium's EventRouter would route them.
 *
 * capture_settings.c reads a table's settings (EventRouter's option names)
 * into a CaptureSettings, its columns found in the table; capture_row.c
 * makes the message of one inserted row, capture_json.c its JSON as Kafka
 * Connect's JsonConverter writes it, and capture_expand.c a payload
 * expanded as EventRouter expands it; capture.c has the SQL functions,
 * the table of captured tables and the trigger.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_CAPTURE_H
#define OUTBOX_CAPTURE_H

#include "access/htup.h"
#include "access/tupdesc.h"
#include "lib/stringinfo.h"
#include "utils/jsonb.h"
#include "utils/relcache.h"

#include "row_writer.h"

/*
 * How Kafka Connect's converter would write a key or value, which is what
 * a consumer written for Debezium reads.
 */
typedef enum CaptureConverter
{
	CONVERTER_STRING,			/* StringConverter: the value's text */
	CONVERTER_BINARY,			/* BinaryDataConverter: a bytea's bytes */
	CONVERTER_JSON				/* JsonConverter, schemas.enable=false */
} CaptureConverter;

/* Where table.fields.additional.placement puts a column. */
typedef enum FieldPlacement
{
	PLACEMENT_HEADER,
	PLACEMENT_ENVELOPE,
	PLACEMENT_PARTITION
} FieldPlacement;

/* A column a setting names, as found in the table the trigger fires on. */
typedef struct CapturedColumn
{
	const char *name;
	AttrNumber	attnum;			/* InvalidAttrNumber: the table has none */
	Oid			type;
} CapturedColumn;

typedef struct AdditionalField
{
	CapturedColumn column;
	FieldPlacement placement;
	const char *alias;			/* the header's or the envelope field's name */
} AdditionalField;

typedef struct CaptureSettings
{
	CapturedColumn route_by;	/* route.by.field */
	const char *topic_replacement;	/* route.topic.replacement */
	CapturedColumn event_id;	/* table.field.event.id: the header "id" */
	CapturedColumn event_key;	/* table.field.event.key */
	CapturedColumn payload;		/* table.field.event.payload */
	CapturedColumn span_context;	/* tracing.span.context.field, optional */
	bool		span_context_named; /* given in the settings, so required */
	bool		tombstone_on_empty; /* route.tombstone.on.empty.payload */
	bool		expand_json;	/* table.expand.json.payload */
	const char *invalid_op_behavior;	/* table.op.invalid.behavior */
	bool		refuse_updates; /* it is "fatal" */
	CaptureConverter key_converter;
	CaptureConverter value_converter;
	bool		value_converter_named;
	const char *placement_text; /* table.fields.additional.placement, as given */
	int			num_fields;
	AdditionalField *fields;
	bool		has_envelope;	/* a field placed in the envelope */
	const AdditionalField *partition_field; /* or NULL */
} CaptureSettings;

/* The name of the trigger outbox_capture() creates on a captured table. */
#define CAPTURE_TRIGGER_NAME "outbox_capture"

extern CaptureSettings *capture_settings_read(Jsonb *settings, Relation rel);
extern Jsonb *capture_settings_effective(const CaptureSettings *settings);
extern char *capture_topic_name(const char *replacement, const char *routed_by_value);
extern void capture_row_message(const CaptureSettings *settings, Relation rel,
								HeapTuple tuple, NewMessage *message);

/* capture_json.c: JSON as JsonConverter writes it with Jackson, in UTF-8 */
extern void capture_json_string(StringInfo out, const char *text, int len);
extern void capture_json_number(StringInfo out, double value, bool is_float);
extern void capture_java_number(StringInfo out, double value, bool is_float);

/* capture_expand.c: a payload expanded as EventRouter expands it */
extern void capture_expand_payload(StringInfo out, const char *text, int len, bool names_unique);

#endif							/* OUTBOX_CAPTURE_H */

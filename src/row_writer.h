/*-------------------------------------------------------------------------
 *
 * row_writer.h
 *	  outbox_enqueue()'s insert, straight into the segment.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_ROW_WRITER_H
#define OUTBOX_ROW_WRITER_H

#include "utils/jsonb.h"

/* A message outbox_enqueue() has checked, and whose key it has locked. */
typedef struct NewMessage
{
	text	   *topic;
	text	   *key;			/* NULL for none */
	bytea	   *payload;
	Jsonb	   *headers;		/* NULL for none */
} NewMessage;

extern bool row_writer_insert(Oid namespace, const NewMessage *message, int64 *id);

#endif							/* OUTBOX_ROW_WRITER_H */

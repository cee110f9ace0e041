/*-------------------------------------------------------------------------
 *
 * row_writer.h
 *	  outbox_enqueue()'s insert, straight into the segment.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_ROW_WRITER_H
#define OUTBOX_ROW_WRITER_H

#include "datatype/timestamp.h"
#include "utils/jsonb.h"

/*
 * A message to enqueue.  Once enqueue_message() has checked it and locked
 * its key, the row writer writes it.
 */
typedef struct NewMessage
{
	text	   *topic;
	text	   *key;			/* NULL for none */
	bytea	   *payload;		/* NULL for a tombstone, only from outbox_capture() */
	Jsonb	   *headers;		/* NULL for none */
	int32		target_partition;	/* ANY_PARTITION (message.h) for none */
	TimestampTz deliver_at;		/* 0: now; later: a delayed message */
} NewMessage;

extern bool row_writer_insert(Oid namespace, const NewMessage *message, int64 *id);

#endif							/* OUTBOX_ROW_WRITER_H */

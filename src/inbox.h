/*-------------------------------------------------------------------------
 *
 * inbox.h
 *	  The inbox worker's messages, subscriptions and batches, shared by its
 *	  process (inbox_worker.c), its consumers (inbox_consumer.c), what
 *	  applies the messages (inbox_apply.c) and its SQL (inbox_store.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_INBOX_H
#define OUTBOX_INBOX_H

#include <signal.h>

#include "datatype/timestamp.h"
#include "nodes/pg_list.h"
#include "utils/uuid.h"

/* The header that carries an outbox message's id (producer.c puts it on). */
#define MESSAGE_ID_HEADER "outbox-message-id"

/* One Kafka message, as the consumer received it. */
typedef struct InboxMessage
{
	char	   *topic;
	int32		partition;
	int64		offset;
	int64		timestamp_ms;	/* -1 if Kafka has none */
	char	   *key;			/* NULL for none; text of the database's
								 * encoding, once the batch's are converted */
	int			value_len;		/* -1 for a NULL value */
	char	   *value;
	int			header_count;
	char	  **header_names;
	char	  **header_values;	/* NULL for a NULL value */
	bool		has_message_id;
	pg_uuid_t	message_id;
} InboxMessage;

/* The high watermark of one partition, as a MESSAGES frame told it. */
typedef struct PartitionWatermark
{
	char	   *topic;
	int32		partition;
	int64		high_watermark;
} PartitionWatermark;

/* The messages of one MESSAGES frame, in its own memory context. */
typedef struct InboxBatch
{
	MemoryContext context;
	bool		texts_in_utf8;	/* keys and headers not yet in the database's
								 * encoding (inbox_consumer.c) */
	int			count;
	InboxMessage *messages;
	int			watermark_count;
	PartitionWatermark *watermarks;
} InboxBatch;

/* Where a partition is to be read from next. */
typedef struct PartitionPosition
{
	char	   *topic;
	int32		partition;
	int64		next_offset;
	int64		high_watermark;	/* -1 if not known */
} PartitionPosition;

/* A subscription, as inbox_subscription holds it. */
typedef struct InboxSubscription
{
	char	   *name;
	int			topic_count;
	char	  **topics;
	char	   *handler;		/* its signature, schema-qualified, as it
								 * was when subscribing */
	Oid			handler_oid;	/* the function it is bound to */
	Oid			run_as;
	Oid			subscribed_by;	/* who subscribed: a member of run_as */
	int			max_attempts;	/* 0: outbox.max_attempts */
	bool		from_earliest;	/* else from created_at */
	TimestampTz created_at;
	char	   *search_path;
} InboxSubscription;

/* What applying a batch or a pass of retries came to. */
typedef struct InboxOutcome
{
	uint64		applied;
	uint64		duplicates;
	uint64		failed;
	uint64		dead_lettered;
	bool		retries_added;	/* the next retry may be sooner */
	uint64		retry_error_mark;	/* worker_error_mark() of the last failure
									 * retried, or 0 */
} InboxOutcome;

/* inbox_apply.c; the statements that read and record are inbox_store.h's */
extern bool inbox_apply_batch(const InboxSubscription *s, InboxBatch *batch,
							  bool keys_may_be_held, InboxOutcome *outcome);
extern bool inbox_apply_due_retries(const InboxSubscription *s, InboxOutcome *outcome);

/* inbox_rights.c: what a subscription needs to run */
typedef enum HandlerFault
{
	HANDLER_FITS,
	HANDLER_MISSING,			/* no function has its oid */
	HANDLER_NOT_A_HANDLER,		/* not a plain function of one inbox_message */
	HANDLER_NOT_PERMITTED		/* run_as lacks USAGE on its schema or EXECUTE */
} HandlerFault;

extern HandlerFault handler_fault(Oid handler, Oid run_as, char **why);
extern bool subscription_may_run(const InboxSubscription *s, char **why);

/* Set by the inbox worker's SIGINT handler: a handler's call is cancelled. */
extern PGDLLIMPORT volatile sig_atomic_t inbox_call_cancelled;
extern PGDLLIMPORT bool inbox_take_turns;

#endif							/* OUTBOX_INBOX_H */

/*-------------------------------------------------------------------------
 *
 * inbox_store.h
 *	  The inbox worker's SQL (inbox_store.c): its statements and
 *	  transactions, the subscriptions, the offsets, inbox_received,
 *	  inbox_retry and inbox_dead_letter, as inbox_apply.c and inbox_worker.c
 *	  use them.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_INBOX_STORE_H
#define OUTBOX_INBOX_STORE_H

#include "inbox.h"

/* The columns of inbox_message, in its order. */
typedef enum MessageColumn
{
	COL_SUBSCRIPTION,
	COL_TOPIC,
	COL_PARTITION,
	COL_OFFSET,
	COL_KEY,
	COL_HEADERS,
	COL_PAYLOAD,
	COL_MESSAGE_ID,
	COL_TIMESTAMP,
	NUM_MESSAGE_COLUMNS
} MessageColumn;

/* A message as the handler gets it: inbox_message's columns. */
typedef struct MessageRow
{
	Datum		values[NUM_MESSAGE_COLUMNS];
	bool		nulls[NUM_MESSAGE_COLUMNS];
} MessageRow;

/* What a handler's error says, for inbox_retry and inbox_dead_letter. */
typedef struct HandlerError
{
	char	   *sqlstate;
	char	   *message;
	char	   *context;
} HandlerError;

/* A message of inbox_retry, copied out of its statement's result. */
typedef struct RetryRow
{
	int64		id;
	int			attempts;
	MessageRow	row;
} RetryRow;

/* Each in a transaction of its own, called outside any. */
extern bool inbox_extension_ready(void);
extern bool inbox_subscriptions_exist(void);
extern List *inbox_read_subscriptions(void);
extern List *inbox_read_positions(const InboxSubscription *s);
extern void inbox_record_positions(const InboxSubscription *s, List *positions);
extern long inbox_ms_until_next_retry(const InboxSubscription *s);
extern bool inbox_forget_old_ids(void);

/* A transaction of the inbox worker's, for a batch or a pass of retries. */
extern bool inbox_begin_transaction(void);
extern void inbox_commit_transaction(MemoryContext caller);
extern ErrorData *inbox_abort_transaction(MemoryContext caller);

/* Inside such a transaction. */
extern bool inbox_insert_received(const InboxSubscription *s, Datum *ids, int count,
								  pg_uuid_t ***inserted, uint64 *inserted_count);
extern void inbox_forget_received(const InboxSubscription *s, Datum *ids, int count);
extern List *inbox_held_keys(const InboxSubscription *s, char **topics, char **keys,
							 int count);
extern void inbox_advance_positions(const InboxSubscription *s, List *positions);
extern int64 inbox_add_retry(const InboxSubscription *s, const MessageRow *row,
							 const HandlerError *failure);
extern void inbox_dead_letter(int64 retry_id, int attempts, const HandlerError *e);
extern List *inbox_due_retries(const InboxSubscription *s);
extern RetryRow *inbox_next_retry_of_key(const InboxSubscription *s, const RetryRow *r);
extern void inbox_delete_retry(int64 retry_id);
extern void inbox_schedule_next_attempt(const RetryRow *r, const HandlerError *e);

#endif							/* OUTBOX_INBOX_STORE_H */

/*-------------------------------------------------------------------------
 *
 * inbox_apply.c
 *	  Apply a batch of messages of one subscription in one transaction,
 *	  and retry the messages a handler failed on: what becomes of each
 *	  message, and the handler's call and its security context.  The
 *	  statements and transactions are inbox_store.c's.
 *
 * A batch is applied in one transaction, which also records the messages'
 * ids (inbox_received) and the offset after the last message of each
 * partition (inbox_offset): the handlers' writes and that record commit
 * together or not at all, so after any crash the consumer reads on from the
 * first message whose effects are not committed, and a message that comes
 * twice (by its outbox-message-id) is applied once.
 *
 * Each message goes one of these ways, in the order received:
 *	- a duplicate: its id is in inbox_received, or earlier in the batch;
 *	- held back: an earlier message of its (topic, key) waits in
 *	  inbox_retry, so it waits there too, behind it;
 *	- applied: its handler returned;
 *	- failed: its handler raised an error; its effects are rolled back, and
 *	  it waits in inbox_retry for its next attempt (or, out of attempts,
 *	  goes to inbox_dead_letter), holding back the later messages of its key.
 *
 * A handler is called without a subtransaction, which would cost an xid per
 * message and overflow every snapshot's subtransaction cache; when one
 * raises an error, the whole transaction is rolled back and the batch
 * applied again with a subtransaction for each message from the one that
 * failed on ("guarded"), so that only the failing message's effects go.
 *
 * Handlers run as their subscription's role (also as session_user), in a
 * security-restricted operation (no SET ROLE, no temporary objects), with
 * the search_path the subscription was made with; every setting they
 * change is put back before the worker's own statements run, and what
 * they took that would outlive them is dropped (session advisory locks
 * after each call, sequences' last values after the batch).  A call lasts
 * at most outbox.inbox_handler_timeout, and a cancelled call stays
 * cancelled whatever the handler catches.  With more than one subscription,
 * a batch whose handlers take longer than outbox.inbox_turn_time is
 * committed in part, the rest left for the subscription's next turn
 * (inbox_worker.c), so that one slow subscription does not hold up the
 * others.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "commands/sequence.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "inbox_consumer.h"
#include "inbox_store.h"
#include "message.h"
#include "pg_compat.h"
#include "settings.h"
#include "statements.h"
#include "topic_grant.h"
#include "worker_slot.h"

/* How a message of a batch went. */
typedef enum MessageFate
{
	FATE_APPLIED,
	FATE_DUPLICATE,
	FATE_HELD,
	FATE_FAILED,
	FATE_DEFERRED				/* left for the subscription's next turn */
} MessageFate;

/* A subscription's handler, ready to be called in this transaction. */
typedef struct Handler
{
	const InboxSubscription *subscription;
	FmgrInfo	flinfo;
	TupleDesc	desc;			/* inbox_message's */
	MemoryContext call_context; /* reset after each call */
	int			guc_nest_level;
	Oid			saved_user;
	int			saved_context;
} Handler;

/* The worker's session user while a handler's role stands in for it, or InvalidOid. */
static Oid	worker_session_user = InvalidOid;
static bool worker_session_user_is_superuser = false;

/*
 * The limits of one handler call.  The cancel of a call (its timeout,
 * statement_timeout, pg_cancel_backend()) is raised again at every
 * subtransaction the handler rolls back while the call lasts, so that
 * catching query_canceled (an EXCEPTION block) does not outlive it.
 * inbox_call_cancelled is set by the worker's SIGINT handler and by the
 * timeout, in signal handlers.
 */
volatile sig_atomic_t inbox_call_cancelled = false;

/*
 * Whether the subscriptions take turns (the worker has more than one): a
 * lone subscription's batch is never cut, which would only cost it the
 * statements of a second commit.
 */
bool		inbox_take_turns = false;
static volatile sig_atomic_t call_deadline_passed = false;
static bool call_running = false;
static TimeoutId handler_timeout_id = MAX_TIMEOUTS;	/* registered at the first call */
static bool cancel_again_registered = false;

/* outbox.inbox_handler_timeout passed: cancel the call, as a SIGINT would. */
static void
handler_deadline_passed(void)
{
	call_deadline_passed = true;
	inbox_call_cancelled = true;
	QueryCancelPending = true;
	InterruptPending = true;
	SetLatch(MyLatch);
}

/*
 * A subtransaction of a cancelled call was rolled back: the handler caught
 * the cancel.  Raise it again at the next interrupt check (PL/pgSQL checks
 * at every statement, and at every turn of an empty loop).
 */
static void
cancel_again(SubXactEvent event, SubTransactionId subxact, SubTransactionId parent, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB && call_running && inbox_call_cancelled)
	{
		QueryCancelPending = true;
		InterruptPending = true;
	}
}

static void
register_cancel_again(void)
{
	if (cancel_again_registered)
		return;
	RegisterSubXactCallback(cancel_again, NULL);
	cancel_again_registered = true;
}

/*
 * The handler.
 */

/*
 * Get the subscription's handler ready to be called, or say why it cannot
 * be (subscription_may_run(): the function it was bound to was dropped, or
 * a right it needs was revoked).  The direct call below checks no
 * privilege: that check is every check there is.
 */
static bool
handler_open(Handler *h, const InboxSubscription *s, char **why)
{
	Oid			function = s->handler_oid;
	Oid		   *argtypes;
	int			nargs;

	if (!subscription_may_run(s, why))
		return false;
	(void) get_func_signature(function, &argtypes, &nargs);
	h->subscription = s;
	fmgr_info(function, &h->flinfo);
	h->desc = lookup_rowtype_tupdesc_copy(argtypes[0], -1);
	BlessTupleDesc(h->desc);
	h->call_context = AllocSetContextCreate(CurrentMemoryContext, "inbox handler call",
											ALLOCSET_DEFAULT_SIZES);
	return true;
}

/*
 * Get the handler ready, in the batch's transaction, or raise the error
 * that leaves the batch unapplied (its messages read again later) and that
 * inbox_worker.last_error then shows: a right revoked (the handler's, or a
 * topic's grant), the handler dropped.
 */
static void
handler_open_or_wait(Handler *h, const InboxSubscription *s)
{
	char	   *why;

	if (!handler_open(h, s, &why))
		elog(ERROR, "subscription \"%s\" cannot be applied: %s", s->name, why);
	topic_grant_check_subscription(s);
}

/*
 * Become the subscription's role, in a security-restricted operation, with
 * its search_path; every setting a handler changes from here on is put
 * back by handler_leave().  The session user becomes the role too, and
 * is_superuser off: a handler learns no more of the worker than a session
 * of its role would.  SetSessionAuthorization() wants no security context,
 * so the worker's is set after it.
 */
static void
handler_enter(Handler *h)
{
	GetUserIdAndSecContext(&h->saved_user, &h->saved_context);
	worker_session_user = GetSessionUserId();
	worker_session_user_is_superuser = superuser_arg(worker_session_user);
	h->guc_nest_level = NewGUCNestLevel();
	SetUserIdAndSecContext(h->saved_user, 0);
	SetSessionAuthorization(h->subscription->run_as, false);
	SetUserIdAndSecContext(h->subscription->run_as,
						   h->saved_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	(void) set_config_option("search_path", h->subscription->search_path, PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	register_cancel_again();
}

/*
 * Be the worker's session user again, and forget the sequences' last
 * values the calls left; also after an error, once its transaction was
 * rolled back (which put back the current user and settings, not these).
 */
static void
handler_restore_session(void)
{
	int			context;
	Oid			user;

	ResetSequenceCaches();
	if (!OidIsValid(worker_session_user))
		return;
	GetUserIdAndSecContext(&user, &context);
	SetUserIdAndSecContext(user, 0);
	SetSessionAuthorization(worker_session_user, worker_session_user_is_superuser);
	SetUserIdAndSecContext(user, context);
	worker_session_user = InvalidOid;
}

/*
 * Put back the role, security context and settings handler_enter()
 * changed; forget the sequences' last values the calls left.
 */
static void
handler_leave(Handler *h)
{
	AtEOXact_GUC(false, h->guc_nest_level);
	SetUserIdAndSecContext(h->saved_user, h->saved_context);
	handler_restore_session();
}

/*
 * Drop what a call took that would outlive it, as DISCARD ALL would: its
 * session advisory locks.  The sequences' last values (currval(),
 * lastval()) are forgotten by handler_leave(), after the batch: forgetting
 * them after each call would build the sequences' cache anew for each
 * message of a handler that inserts with one.  The rest a
 * security-restricted operation refuses (LISTEN, PREPARE, temporary
 * objects, cursors WITH HOLD, DISCARD itself), or handler_leave() puts
 * back (settings).
 */
static void
drop_call_state(void)
{
	LockReleaseSession(USER_LOCKMETHOD);
}

/*
 * The call ran out of time, or was cancelled: fail it, whatever the handler
 * caught or returned, with an error that says so.  The cancel itself is
 * answered: the worker's own statements go on.
 */
static void
fail_overdue_call(void)
{
	bool		timed_out = call_deadline_passed;

	QueryCancelPending = false;
	inbox_call_cancelled = false;
	call_deadline_passed = false;
	if (timed_out)
		ereport(ERROR,
				(errcode(ERRCODE_QUERY_CANCELED),
				 errmsg("the handler ran longer than outbox.inbox_handler_timeout (%d ms)",
						outbox_inbox_handler_timeout),
				 errhint("Make the handler quicker, or raise outbox.inbox_handler_timeout.")));
	ereport(ERROR,
			(errcode(ERRCODE_QUERY_CANCELED),
			 errmsg("the handler's call was cancelled")));
}

/* Arm the limits of one call: outbox.inbox_handler_timeout, statement_timeout. */
static void
begin_call(void)
{
	if (handler_timeout_id == MAX_TIMEOUTS)
		handler_timeout_id = RegisterTimeout(USER_TIMEOUT, handler_deadline_passed);
	inbox_call_cancelled = false;
	call_deadline_passed = false;
	call_running = true;
	if (outbox_inbox_handler_timeout > 0)
		enable_timeout_after(handler_timeout_id, outbox_inbox_handler_timeout);
}

/* Disarm them (the handler may have changed statement_timeout: not that). */
static void
end_call(bool statement_timed)
{
	call_running = false;
	if (outbox_inbox_handler_timeout > 0)
		disable_timeout(handler_timeout_id, false);
	if (statement_timed)
		disable_timeout(STATEMENT_TIMEOUT, false);
	drop_call_state();
}

/*
 * Call the handler with one message; what it returns is ignored.  Each call
 * is a statement as statement_timeout sees it (the worker's value: the
 * server's, the database's), as a call from a client would be, and has at
 * most outbox.inbox_handler_timeout.  A call cancelled (by either, or by
 * pg_cancel_backend()) stays cancelled until it ends (cancel_again()), and
 * fails even if the handler returns: its message is failed, and retried.
 */
static void
handler_call(Handler *h, MessageRow *row)
{
	MemoryContext caller = MemoryContextSwitchTo(h->call_context);
	LOCAL_FCINFO(fcinfo, 1);
	HeapTuple	tuple = heap_form_tuple(h->desc, row->values, row->nulls);
	bool		statement_timed = StatementTimeout > 0;

	InitFunctionCallInfoData(*fcinfo, &h->flinfo, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = HeapTupleGetDatum(tuple);
	fcinfo->args[0].isnull = false;
	begin_call();
	if (statement_timed)
		enable_timeout_after(STATEMENT_TIMEOUT, StatementTimeout);
	PG_TRY();
	{
		(void) FunctionCallInvoke(fcinfo);
	}
	PG_CATCH();
	{
		end_call(statement_timed);
		if (!call_deadline_passed)
		{
			/* its own error, or the cancel's (statement_timeout's, a user's) */
			if (inbox_call_cancelled)
				QueryCancelPending = false;
			inbox_call_cancelled = false;
			PG_RE_THROW();
		}
		MemoryContextSwitchTo(caller);
		FlushErrorState();
		fail_overdue_call();
	}
	PG_END_TRY();
	end_call(statement_timed);
	if (inbox_call_cancelled)
		fail_overdue_call();
	CommandCounterIncrement();
	MemoryContextSwitchTo(caller);
	MemoryContextReset(h->call_context);
}

/* What handler_call_guarded() passes to run_in_subtransaction(). */
typedef struct HandlerCall
{
	Handler    *handler;
	MessageRow *row;
} HandlerCall;

/* Call a handler; run_in_subtransaction()'s function. */
static void
run_handler_call(void *arg)
{
	HandlerCall *call = arg;

	handler_call(call->handler, call->row);
}

/*
 * Call the handler in a subtransaction of its own: returns true if it
 * returned, false with its error if it raised one (its effects then rolled
 * back).
 */
static bool
handler_call_guarded(Handler *h, MessageRow *row, HandlerError *error)
{
	HandlerCall call = {h, row};
	ErrorData  *edata = run_in_subtransaction(run_handler_call, &call);

	if (edata == NULL)
		return true;
	error->sqlstate = pstrdup(unpack_sql_state(edata->sqlerrcode));
	error->message = edata->message;
	error->context = edata->context;
	return false;
}

/*
 * A message's columns.
 */

/* A string as a jsonb value. */
static JsonbValue *
jsonb_string(JsonbValue *v, char *s)
{
	v->type = s ? jbvString : jbvNull;
	if (s)
	{
		v->val.string.val = s;
		v->val.string.len = strlen(s);
	}
	return v;
}

/*
 * The headers as a jsonb object of their values, or NULL if there are none;
 * built as a jsonb value, not parsed from text, which cost more than the
 * rest of the message.  Of a name repeated, the last value is kept.
 */
static Datum
headers_jsonb(const InboxMessage *m, bool *isnull)
{
	JsonbInState state = {0};
	JsonbValue	v;

	*isnull = m->header_count == 0;
	if (*isnull)
		return (Datum) 0;
	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	for (int i = 0; i < m->header_count; i++)
	{
		pushJsonbValue(&state, WJB_KEY, jsonb_string(&v, m->header_names[i]));
		pushJsonbValue(&state, WJB_VALUE, jsonb_string(&v, m->header_values[i]));
	}
	pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	return JsonbPGetDatum(JsonbValueToJsonb(state.result));
}

/*
 * The text datums of a batch's subscription name and of its last topic,
 * made once rather than for every message (the consumer gives the messages
 * of one topic the same string).
 */
typedef struct RowTexts
{
	Datum		subscription;
	const char *topic;
	Datum		topic_text;
} RowTexts;

/* The row the handler gets for message m, its texts made once in texts. */
static void
message_row(const InboxSubscription *s, const InboxMessage *m, MessageRow *row, RowTexts *texts)
{
	if (texts->subscription == (Datum) 0)
		texts->subscription = CStringGetTextDatum(s->name);
	if (texts->topic != m->topic)
	{
		texts->topic = m->topic;
		texts->topic_text = CStringGetTextDatum(m->topic);
	}
	memset(row->nulls, 0, sizeof(row->nulls));
	row->values[COL_SUBSCRIPTION] = texts->subscription;
	row->values[COL_TOPIC] = texts->topic_text;
	row->values[COL_PARTITION] = Int32GetDatum(m->partition);
	row->values[COL_OFFSET] = Int64GetDatum(m->offset);
	row->nulls[COL_KEY] = m->key == NULL;
	row->values[COL_KEY] = m->key ? CStringGetTextDatum(m->key) : (Datum) 0;
	row->values[COL_HEADERS] = headers_jsonb(m, &row->nulls[COL_HEADERS]);
	row->nulls[COL_PAYLOAD] = m->value_len < 0;
	if (m->value_len >= 0)
	{
		bytea	   *payload = palloc(VARHDRSZ + m->value_len);

		SET_VARSIZE(payload, VARHDRSZ + m->value_len);
		memcpy(VARDATA(payload), m->value, m->value_len);
		row->values[COL_PAYLOAD] = PointerGetDatum(payload);
	}
	row->nulls[COL_MESSAGE_ID] = !m->has_message_id;
	row->values[COL_MESSAGE_ID] = m->has_message_id ? UUIDPGetDatum(&m->message_id) : (Datum) 0;
	row->nulls[COL_TIMESTAMP] = m->timestamp_ms < 0;
	row->values[COL_TIMESTAMP] = TimestampTzGetDatum(timestamptz_of_unix_epoch_ms(m->timestamp_ms));
}

/*
 * A batch.
 */

/* What applying one batch keeps track of, message by message. */
typedef struct BatchState
{
	const InboxSubscription *subscription;
	InboxBatch *batch;
	MessageRow *rows;
	MessageFate *fates;
	HandlerError *errors;
	RowTexts	texts;
	bool		keys_may_be_held;	/* inbox_retry may hold messages */
	int			guarded_from;	/* a subtransaction for each message from here */
	volatile int calling;		/* the message whose handler runs unguarded, or -1 */
	int			cancelled;		/* the message whose call was cancelled unguarded, or -1 */
	int			deferred_from;	/* the first message left for the next turn */
	TimestampTz turn_ends_at;	/* outbox.inbox_turn_time after the batch began */
} BatchState;

/*
 * Mark as duplicates the messages of the batch whose id is not among those
 * inserted into inbox_received, and the later messages of an id repeated
 * within the batch.
 */
static void
mark_duplicates(BatchState *st, pg_uuid_t **inserted, uint64 inserted_count)
{
	InboxBatch *b = st->batch;
	HASHCTL		ctl;
	HTAB	   *new_ids;

	ctl.keysize = ctl.entrysize = sizeof(pg_uuid_t);
	ctl.hcxt = CurrentMemoryContext;
	new_ids = hash_create("inbox ids inserted", Max(inserted_count, 1), &ctl,
						  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	for (uint64 i = 0; i < inserted_count; i++)
		(void) hash_search(new_ids, inserted[i], HASH_ENTER, NULL);
	/* the first message of each id inserted is new; any other a duplicate */
	for (int i = 0; i < b->count; i++)
	{
		bool		found;

		if (!b->messages[i].has_message_id)
			continue;
		(void) hash_search(new_ids, &b->messages[i].message_id, HASH_REMOVE, &found);
		if (!found)
			st->fates[i] = FATE_DUPLICATE;
	}
	hash_destroy(new_ids);
}

/*
 * Record the batch's ids in inbox_received, and mark the duplicates: the
 * messages whose id it held already, and the later messages of an id
 * repeated within the batch.  A hash table of the ids inserted, so that a
 * batch costs one look per message.
 */
static void
record_received(BatchState *st)
{
	InboxBatch *b = st->batch;
	Datum	   *ids = palloc(sizeof(Datum) * Max(b->count, 1));
	int			count = 0;
	pg_uuid_t **inserted;
	uint64		inserted_count;

	for (int i = 0; i < b->count; i++)
		if (b->messages[i].has_message_id)
			ids[count++] = UUIDPGetDatum(&b->messages[i].message_id);
	if (count == 0)
		return;
	if (inbox_insert_received(st->subscription, ids, count, &inserted, &inserted_count))
		return;
	mark_duplicates(st, inserted, inserted_count);
}

/* Are the two messages of one (topic, key)?  A message with no key has none. */
static bool
same_key(const InboxMessage *a, const InboxMessage *b)
{
	return a->key && b->key && strcmp(a->topic, b->topic) == 0 && strcmp(a->key, b->key) == 0;
}

/* Hold back the messages whose key has an earlier message in inbox_retry. */
static void
find_held_keys(BatchState *st)
{
	InboxBatch *b = st->batch;
	char	  **topics = palloc(sizeof(char *) * Max(b->count, 1));
	char	  **keys = palloc(sizeof(char *) * Max(b->count, 1));
	int			count = 0;
	ListCell   *lc;

	for (int i = 0; i < b->count; i++)
		if (b->messages[i].key && st->fates[i] != FATE_DUPLICATE)
		{
			topics[count] = b->messages[i].topic;
			keys[count++] = b->messages[i].key;
		}
	if (count == 0)
		return;
	foreach(lc, inbox_held_keys(st->subscription, topics, keys, count))
	{
		InboxMessage *held = lfirst(lc);

		for (int i = 0; i < b->count; i++)
			if (st->fates[i] != FATE_DUPLICATE && same_key(&b->messages[i], held))
				st->fates[i] = FATE_HELD;
	}
}

/* Hold back the later messages of the batch with the key of message i. */
static void
hold_back_behind(BatchState *st, int i)
{
	for (int j = i + 1; j < st->batch->count; j++)
		if (st->fates[j] == FATE_APPLIED && same_key(&st->batch->messages[j], &st->batch->messages[i]))
			st->fates[j] = FATE_HELD;
}

/* When a turn that begins now ends; DT_NOEND if the subscriptions take none. */
static TimestampTz
turn_end(void)
{
	if (!inbox_take_turns)
		return DT_NOEND;
	return TimestampTzPlusMilliseconds(GetCurrentTimestamp(), outbox_inbox_turn_time);
}

/*
 * Is the subscription's turn over before message i?  Not before its first
 * message, nor before the message whose failure made this try guarded:
 * each turn applies something.
 */
static bool
turn_over(BatchState *st, int i)
{
	if (st->turn_ends_at == DT_NOEND || i == 0 ||
		(st->guarded_from < st->batch->count && i <= st->guarded_from))
		return false;
	return GetCurrentTimestamp() >= st->turn_ends_at;
}

/* Leave the messages from i on for the subscription's next turn. */
static void
defer_from(BatchState *st, int i)
{
	st->deferred_from = i;
	for (int j = i; j < st->batch->count; j++)
		if (st->fates[j] != FATE_DUPLICATE)
			st->fates[j] = FATE_DEFERRED;
}

/* Call the handler for each message to apply, in order, while the turn lasts. */
static void
call_handlers(BatchState *st, Handler *h)
{
	handler_enter(h);
	for (int i = 0; i < st->batch->count; i++)
	{
		if (st->fates[i] != FATE_APPLIED)
			continue;
		if (turn_over(st, i))
		{
			defer_from(st, i);
			break;
		}
		message_row(st->subscription, &st->batch->messages[i], &st->rows[i], &st->texts);
		if (i < st->guarded_from)
		{
			st->calling = i;
			handler_call(h, &st->rows[i]);
			st->calling = -1;
		}
		else if (i == st->cancelled || !handler_call_guarded(h, &st->rows[i], &st->errors[i]))
		{
			/* a call cancelled unguarded is not made again: it failed */
			st->fates[i] = FATE_FAILED;
			hold_back_behind(st, i);
		}
	}
	handler_leave(h);
}

/* How many attempts a message of the subscription has before a dead letter. */
static int
max_attempts_of(const InboxSubscription *s)
{
	return s->max_attempts > 0 ? s->max_attempts : outbox_max_attempts;
}

/*
 * Show a handler's failure in inbox_worker.last_error, as the latest error.
 * Not in the server log, which a handler failing on every message would
 * flood: the message's retry or dead letter keeps the error in full.
 */
static void
show_handler_failure(const InboxSubscription *s, const MessageRow *row,
					 const HandlerError *e, bool dead_lettered)
{
	char		message[WORKER_LAST_ERROR_LEN];

	snprintf(message, sizeof(message),
			 "subscription \"%s\": the handler failed on topic \"%s\" partition %d offset %lld (%s): %s",
			 s->name, TextDatumGetCString(row->values[COL_TOPIC]),
			 DatumGetInt32(row->values[COL_PARTITION]),
			 (long long) DatumGetInt64(row->values[COL_OFFSET]),
			 dead_lettered ? "dead-lettered" : "to be retried", e->message);
	worker_record_error(message);
}

/*
 * Put a message of the batch in inbox_retry: failed (its first attempt) or
 * held back (no attempt yet, waiting behind its key).  Returns whether it
 * was dead-lettered instead, out of attempts.
 */
static bool
add_retry(BatchState *st, int i)
{
	const InboxSubscription *s = st->subscription;
	HandlerError *e = &st->errors[i];
	bool		failed = st->fates[i] == FATE_FAILED;
	int64		retry_id;

	if (!failed)
		message_row(s, &st->batch->messages[i], &st->rows[i], &st->texts);
	retry_id = inbox_add_retry(s, &st->rows[i], failed ? e : NULL);
	if (failed)
		show_handler_failure(s, &st->rows[i], e, max_attempts_of(s) <= 1);
	if (!failed || max_attempts_of(s) > 1)
		return false;
	inbox_dead_letter(retry_id, 1, e);
	return true;
}

/* The watermark a MESSAGES frame told for a partition, or -1. */
static int64
watermark_of(InboxBatch *b, const char *topic, int32 partition)
{
	for (int i = 0; i < b->watermark_count; i++)
		if (b->watermarks[i].partition == partition && strcmp(b->watermarks[i].topic, topic) == 0)
			return b->watermarks[i].high_watermark;
	return -1;
}

/* Each partition of the batch is read on from after its last message. */
static void
advance_positions(BatchState *st)
{
	InboxBatch *b = st->batch;
	List	   *positions = NIL;

	for (int i = st->deferred_from - 1; i >= 0; i--)
	{
		InboxMessage *m = &b->messages[i];
		bool		known = false;
		ListCell   *lc;
		PartitionPosition *p;

		foreach(lc, positions)
		{
			p = lfirst(lc);
			known |= p->partition == m->partition && strcmp(p->topic, m->topic) == 0;
		}
		if (known)
			continue;
		p = palloc(sizeof(PartitionPosition));
		p->topic = m->topic;
		p->partition = m->partition;
		p->next_offset = m->offset + 1;
		p->high_watermark = watermark_of(b, m->topic, m->partition);
		positions = lappend(positions, p);
	}
	inbox_advance_positions(st->subscription, positions);
}

/*
 * The ids of the messages left for the next turn leave inbox_received
 * again, to be recorded with their effects: a message whose id stayed
 * would be taken for a duplicate, at the next turn or after a crash.  A
 * duplicate among them stays one (of a message before, or of an id that
 * was there already).
 */
static void
forget_deferred(BatchState *st)
{
	InboxBatch *b = st->batch;
	int			left = b->count - st->deferred_from;
	Datum	   *ids;
	int			count = 0;

	if (left <= 0)
		return;
	ids = palloc(sizeof(Datum) * left);
	for (int i = st->deferred_from; i < b->count; i++)
		if (st->fates[i] == FATE_DEFERRED && b->messages[i].has_message_id)
			ids[count++] = UUIDPGetDatum(&b->messages[i].message_id);
	if (count > 0)
		inbox_forget_received(st->subscription, ids, count);
}

/* Record the batch: its retries and dead letters, its offsets. */
static void
record_batch(BatchState *st, InboxOutcome *outcome)
{
	memset(outcome, 0, sizeof(*outcome));
	for (int i = 0; i < st->batch->count; i++)
	{
		switch (st->fates[i])
		{
			case FATE_APPLIED:
				outcome->applied++;
				break;
			case FATE_DUPLICATE:
				if (i < st->deferred_from)
					outcome->duplicates++;
				break;
			case FATE_DEFERRED:
				break;
			case FATE_FAILED:
				outcome->failed++;
				pg_fallthrough;
			case FATE_HELD:
				if (add_retry(st, i))
					outcome->dead_lettered++;
				else if (st->fates[i] == FATE_FAILED)
					outcome->retry_error_mark = worker_error_mark();
				outcome->retries_added = true;
				break;
		}
	}
	forget_deferred(st);
	advance_positions(st);
}

/* Message i's handler failed with edata, and is not to be called again in this batch. */
static void
keep_error(BatchState *st, int i, ErrorData *edata)
{
	st->cancelled = i;
	st->errors[i].sqlstate = pstrdup(unpack_sql_state(edata->sqlerrcode));
	st->errors[i].message = edata->message;
	st->errors[i].context = edata->context;
}

/* What one try at a batch came to. */
typedef enum BatchTry
{
	TRY_COMMITTED,
	TRY_UNGUARDED_FAILURE,		/* a handler failed outside a subtransaction */
	TRY_FAILED					/* the worker's own statements failed */
} BatchTry;

/*
 * One try at the batch, in one transaction: record the ids, find the keys
 * held back, call the handlers, record the outcomes, commit.  On an error
 * the transaction is rolled back; a handler's, outside a subtransaction,
 * says where the next try guards from.
 */
static BatchTry
try_batch(BatchState *st, InboxOutcome *outcome)
{
	MemoryContext caller = CurrentMemoryContext;
	volatile BatchTry result = TRY_COMMITTED;

	for (int i = 0; i < st->batch->count; i++)
		st->fates[i] = FATE_APPLIED;
	st->calling = -1;
	st->deferred_from = st->batch->count;
	memset(&st->texts, 0, sizeof(st->texts));	/* made in the transaction's memory */
	PG_TRY();
	{
		Handler		h;

		if (!inbox_begin_transaction())
			elog(ERROR, "the extension is not there");
		handler_open_or_wait(&h, st->subscription);
		consumer_convert_batch(st->batch);
		record_received(st);
		if (st->keys_may_be_held)
			find_held_keys(st);
		call_handlers(st, &h);
		record_batch(st, outcome);
		inbox_commit_transaction(caller);
	}
	PG_CATCH();
	{
		ErrorData  *edata = inbox_abort_transaction(caller);

		handler_restore_session();
		if (st->calling >= 0)
		{
			st->guarded_from = st->calling;
			if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED)
				keep_error(st, st->calling, edata);
			result = TRY_UNGUARDED_FAILURE;
		}
		else
		{
			worker_report_error(LOG, "could not apply a batch of subscription \"%s\": %s",
							   st->subscription->name, edata->message);
			result = TRY_FAILED;
		}
	}
	PG_END_TRY();
	return result;
}

/*
 * Apply a batch of the subscription's messages in one transaction, and
 * record them.  keys_may_be_held is false if the caller knows inbox_retry
 * holds none of the subscription's messages (the common case), which
 * spares the look for keys held back.  Returns false if that failed for a
 * reason of the worker's own (reported): nothing of the batch is
 * committed, and the consumer is to read from the recorded offsets again.
 * A batch whose handlers take longer than outbox.inbox_turn_time is applied
 * in part: the batch then holds the messages left, for the subscription's
 * next turn, after the other subscriptions had theirs.
 */
bool
inbox_apply_batch(const InboxSubscription *s, InboxBatch *batch, bool keys_may_be_held,
				  InboxOutcome *outcome)
{
	BatchState	st;
	BatchTry	result;

	st.subscription = s;
	st.keys_may_be_held = keys_may_be_held;
	st.batch = batch;
	st.rows = palloc0(sizeof(MessageRow) * Max(batch->count, 1));
	st.fates = palloc(sizeof(MessageFate) * Max(batch->count, 1));
	st.errors = palloc0(sizeof(HandlerError) * Max(batch->count, 1));
	st.guarded_from = batch->count;
	st.cancelled = -1;
	st.turn_ends_at = turn_end();
	do
		result = try_batch(&st, outcome);
	while (result == TRY_UNGUARDED_FAILURE);
	if (result == TRY_COMMITTED)
	{
		/* what is left is the next turn's */
		batch->messages += st.deferred_from;
		batch->count -= st.deferred_from;
	}
	return result == TRY_COMMITTED;
}

/*
 * Retries.
 */

/* One attempt at a message, as its role, in a subtransaction of its own. */
static bool
attempt(Handler *h, MessageRow *row, HandlerError *error)
{
	bool		returned;

	handler_enter(h);
	returned = handler_call_guarded(h, row, error);
	handler_leave(h);
	return returned;
}

/*
 * Try a message due again, and then the messages of its key that waited
 * behind it, in order, until one fails: each that is applied leaves
 * inbox_retry, as does each out of attempts, for inbox_dead_letter.
 */
static void
settle_key(Handler *h, RetryRow *r, InboxOutcome *outcome, TimestampTz turn_ends_at)
{
	const InboxSubscription *s = h->subscription;
	HandlerError e;

	for (; r != NULL; r = inbox_next_retry_of_key(s, r))
	{
		/* the messages left behind are due at the next turn */
		if (turn_ends_at != DT_NOEND && outcome->applied + outcome->failed > 0 &&
			GetCurrentTimestamp() >= turn_ends_at)
			return;
		if (attempt(h, &r->row, &e))
		{
			inbox_delete_retry(r->id);
			outcome->applied++;
			continue;
		}
		outcome->failed++;
		if (r->attempts + 1 < max_attempts_of(s))
		{
			inbox_schedule_next_attempt(r, &e);
			show_handler_failure(s, &r->row, &e, false);
			outcome->retry_error_mark = worker_error_mark();
			outcome->retries_added = true;
			return;
		}
		inbox_dead_letter(r->id, r->attempts + 1, &e);
		show_handler_failure(s, &r->row, &e, true);
		outcome->dead_lettered++;
	}
}

/*
 * Try the subscription's messages whose next attempt is due, each with the
 * messages of its key behind it, in one transaction, for at most
 * outbox.inbox_turn_time: those left are still due at the next turn.  Returns false if that
 * failed for a reason of the worker's own (reported).
 */
bool
inbox_apply_due_retries(const InboxSubscription *s, InboxOutcome *outcome)
{
	MemoryContext caller = CurrentMemoryContext;
	volatile bool done = true;
	TimestampTz turn_ends_at = turn_end();

	memset(outcome, 0, sizeof(*outcome));
	PG_TRY();
	{
		Handler		h;
		ListCell   *lc;

		if (!inbox_begin_transaction())
			elog(ERROR, "the extension is not there");
		handler_open_or_wait(&h, s);
		foreach(lc, inbox_due_retries(s))
			settle_key(&h, lfirst(lc), outcome, turn_ends_at);
		inbox_commit_transaction(caller);
	}
	PG_CATCH();
	{
		ErrorData  *edata = inbox_abort_transaction(caller);

		handler_restore_session();
		worker_report_error(LOG, "could not retry messages of subscription \"%s\": %s",
						   s->name, edata->message);
		memset(outcome, 0, sizeof(*outcome));
		done = false;
	}
	PG_END_TRY();
	return done;
}

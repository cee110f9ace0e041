/*-------------------------------------------------------------------------
 *
 * inbox_worker.c
 *	  The inbox worker: a dynamic background worker per database that has
 *	  inbox subscriptions, started by the launcher beside the database's
 *	  publisher (launcher.c's manage_inbox()).  For each subscription it
 *	  runs a consumer (inbox_consumer.c), a Kafka process reading the
 *	  subscription's topics from the offsets recorded in inbox_offset, and
 *	  applies what it reads, a batch per transaction (inbox_apply.c).
 *
 * Its loop: read the subscriptions again when woken (a backend made,
 * dropped or requeued something: inbox_sql.c) or every
 * outbox.poll_interval; start the consumers that are missing; ask each for
 * its next batch; wait for a batch, the latch or a timeout; apply the
 * batches that came, then the retries that are due.  A consumer whose
 * batch could not be applied for a reason of the worker's own, or that
 * died, is stopped and started again after a pause, from the recorded
 * offsets: nothing it had read past them is lost; and the subscriptions are
 * read again at once, which records a handler found dropped as none
 * (inbox_store.c's bind_handlers_again()), for good, before a pg_upgrade
 * or a restore could have it bound again by name.  The worker leaves when
 * its database has no subscription left, when the extension is not there,
 * and when the launcher hands its slot out again.
 *
 * Each subscription's batch is applied for one turn (inbox_apply.c ends it
 * after outbox.inbox_turn_time); what is left of it waits in memory for the
 * subscription's next turn, after the others had theirs.  SIGTERM (a
 * shutdown, pg_terminate_backend(), DROP DATABASE ... WITH (FORCE)) ends
 * the worker as it ends a backend, with a FATAL at the next interrupt
 * check, which no handler can catch: the batch's transaction rolls back,
 * and its Kafka processes, whose sockets close, end too.  SIGINT cancels the
 * handler call under way.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <malloc.h>

#include "miscadmin.h"
#include "pg_compat.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "inbox.h"
#include "inbox_consumer.h"
#include "inbox_store.h"
#include "inbox_slot.h"
#include "settings.h"
#include "worker_session.h"
#include "worker_slot.h"

/* The pause before a consumer that failed, or whose batch failed, starts again. */
#define CONSUMER_RESTART_PAUSE_MS 5000

/*
 * How often the ids older than outbox.inbox_dedup_retention are forgotten:
 * every minute, or four times in a retention if that is shorter, but not
 * more often than every second.
 */
#define FORGET_INTERVAL_MS (60 * 1000)
#define MIN_FORGET_INTERVAL_MS 1000

/*
 * Memory that malloc() keeps for the worker rather than give back to the
 * kernel: every batch allocates about as much as the last (up to
 * outbox.max_batch_bytes of messages, and the executor's own), and giving
 * it back after each one, to fault it in again for the next, cost a tenth
 * of the worker's time.
 */
#define MALLOC_KEPT_BYTES (64 * 1024 * 1024)

/* The only schemas the worker's own statements may find names in. */
#define WORKER_SEARCH_PATH "pg_catalog, pg_temp"

extern PGDLLEXPORT void outbox_inbox_main(Datum main_arg);

/*
 * SIGINT: cancel the handler's call that runs, as pg_cancel_backend() does
 * a backend's statement; inbox_apply.c keeps it cancelled until the call
 * ends.
 */
static void
cancel_handler_call(SIGNAL_ARGS)
{
	inbox_call_cancelled = true;
	StatementCancelHandler(PASS_SIGNAL_ARGS);
}

/* A subscription and what the worker runs for it. */
typedef struct Subscriber
{
	MemoryContext context;		/* the subscription's copy */
	InboxSubscription *subscription;
	InboxConsumer *consumer;	/* NULL while none runs */
	TimestampTz start_after;	/* no consumer starts before then */
	TimestampTz next_retry_at;	/* 0: to be asked; DT_NOEND: none waits */

	/*
	 * The worker_error_mark() of the errors last shown about the
	 * subscription, cleared once mended: a consumer that could not start,
	 * once one is assigned partitions; a batch or retries the worker could
	 * not apply, once a batch or retries are; a handler's failure that is
	 * to be retried, once no message of the subscription waits in
	 * inbox_retry.  0 for none.
	 */
	uint64		start_error_mark;
	uint64		apply_error_mark;
	uint64		retry_error_mark;

	/* what is left of a batch whose turn ended (inbox_apply_batch()), or NULL */
	InboxBatch *left;
} Subscriber;

static List *subscribers = NIL;
static TimestampTz subscriptions_read_at = 0;
static TimestampTz forget_at = 0;
static bool woken = true;		/* the latch was set: read the subscriptions */
static bool batch_failed = false;	/* read them again too */

static bool
same_strings(char **a, int a_count, char **b, int b_count)
{
	if (a_count != b_count)
		return false;
	for (int i = 0; i < a_count; i++)
		if (strcmp(a[i], b[i]) != 0)
			return false;
	return true;
}

/* Does the subscription read and apply as it did (it was not made anew)? */
static bool
same_subscription(const InboxSubscription *a, const InboxSubscription *b)
{
	return strcmp(a->name, b->name) == 0 &&
		same_strings(a->topics, a->topic_count, b->topics, b->topic_count) &&
		strcmp(a->handler, b->handler) == 0 && a->handler_oid == b->handler_oid &&
		a->run_as == b->run_as && a->subscribed_by == b->subscribed_by &&
		a->max_attempts == b->max_attempts && a->from_earliest == b->from_earliest &&
		a->created_at == b->created_at && strcmp(a->search_path, b->search_path) == 0;
}

/* Drop what was left of a batch: it is read again from the recorded offsets. */
static void
drop_left(Subscriber *sub)
{
	if (sub->left)
		MemoryContextDelete(sub->left->context);
	sub->left = NULL;
}

static void
stop_consumer(Subscriber *sub, long pause_ms)
{
	drop_left(sub);
	if (sub->consumer)
		consumer_stop(sub->consumer);
	sub->consumer = NULL;
	sub->start_after = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), pause_ms);
}

static void
drop_subscriber(Subscriber *sub)
{
	stop_consumer(sub, 0);
	MemoryContextDelete(sub->context);
	pfree(sub);
}

/* A deep copy of a subscription, in the current memory context. */
static InboxSubscription *
copy_subscription(const InboxSubscription *s)
{
	InboxSubscription *copy = palloc(sizeof(InboxSubscription));

	*copy = *s;
	copy->name = pstrdup(s->name);
	copy->topics = palloc(sizeof(char *) * s->topic_count);
	for (int i = 0; i < s->topic_count; i++)
		copy->topics[i] = pstrdup(s->topics[i]);
	copy->handler = pstrdup(s->handler);
	copy->search_path = pstrdup(s->search_path);
	return copy;
}

static Subscriber *
new_subscriber(const InboxSubscription *s)
{
	MemoryContext caller = MemoryContextSwitchTo(TopMemoryContext);
	Subscriber *sub = palloc0(sizeof(Subscriber));

	sub->context = AllocSetContextCreate(TopMemoryContext, "inbox subscription",
										 ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(sub->context);
	sub->subscription = copy_subscription(s);
	MemoryContextSwitchTo(caller);
	return sub;
}

/*
 * Read the subscriptions again: keep the subscribers of those unchanged,
 * stop those dropped or made anew, add the new ones.  What is read is in
 * the loop's memory context; the subscribers are in their own.
 */
static void
refresh_subscriptions_when_due(void)
{
	List	   *read;
	List	   *kept = NIL;
	ListCell   *lc;

	if (!woken && !batch_failed &&
		TimestampDifferenceMilliseconds(subscriptions_read_at, GetCurrentTimestamp())
		< outbox_poll_interval)
		return;
	batch_failed = false;
	read = inbox_read_subscriptions();
	foreach(lc, read)
	{
		InboxSubscription *s = lfirst(lc);
		Subscriber *found = NULL;
		ListCell   *old;
		MemoryContext caller;

		foreach(old, subscribers)
		{
			Subscriber *sub = lfirst(old);

			if (sub && same_subscription(sub->subscription, s))
			{
				found = sub;
				lfirst(old) = NULL;
			}
		}
		caller = MemoryContextSwitchTo(TopMemoryContext);
		kept = lappend(kept, found ? found : new_subscriber(s));
		MemoryContextSwitchTo(caller);
	}
	foreach(lc, subscribers)
		if (lfirst(lc))
			drop_subscriber(lfirst(lc));
	list_free(subscribers);
	subscribers = kept;
	subscriptions_read_at = GetCurrentTimestamp();
	woken = false;
}

/* Start the consumers that are missing and due, from the recorded offsets. */
static void
start_consumers(void)
{
	ListCell   *lc;

	foreach(lc, subscribers)
	{
		Subscriber *sub = lfirst(lc);
		char		reason[256];

		if (sub->consumer && !consumer_alive(sub->consumer))
			stop_consumer(sub, CONSUMER_RESTART_PAUSE_MS);
		if (sub->consumer && consumer_settings_changed(sub->consumer))
			stop_consumer(sub, 0);
		if (sub->consumer || GetCurrentTimestamp() < sub->start_after)
			continue;
		sub->consumer = consumer_start(sub->subscription,
									   inbox_read_positions(sub->subscription),
									   reason, sizeof(reason));
		if (sub->consumer == NULL)
		{
			inbox_report_state(INBOX_WAITING_FOR_BROKERS);
			worker_report_error(LOG, "could not start the consumer of subscription \"%s\": %s",
							   sub->subscription->name, reason);
			sub->start_error_mark = worker_error_mark();
			sub->start_after = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														   CONSUMER_RESTART_PAUSE_MS);
		}
	}
}

/* How long the loop may sleep: until a retry or a consumer's start is due. */
static long
time_to_next_event(void)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz next = TimestampTzPlusMilliseconds(now, outbox_poll_interval);
	ListCell   *lc;

	foreach(lc, subscribers)
	{
		Subscriber *sub = lfirst(lc);

		if (sub->left)
			next = now;
		if (sub->consumer == NULL)
			next = Min(next, sub->start_after);
		if (sub->next_retry_at != DT_NOEND)
			next = Min(next, sub->next_retry_at);
	}
	next = Min(next, forget_at);
	return Max(TimestampDifferenceMilliseconds(now, next), 0);
}

/*
 * Ask each consumer for its next batch, and wait for one of them to
 * answer, for the latch, or until the next event is due.
 */
static void
wait_for_batches(void)
{
	WaitEventSet *set = create_wait_event_set(2 + list_length(subscribers));
	WaitEvent	event;
	ListCell   *lc;

	AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
	foreach(lc, subscribers)
	{
		Subscriber *sub = lfirst(lc);

		if (sub->consumer == NULL || sub->left)
			continue;
		consumer_fetch(sub->consumer, outbox_inbox_batch_size, outbox_max_batch_kb * 1024);
		if (consumer_alive(sub->consumer))
			AddWaitEventToSet(set, WL_SOCKET_READABLE, consumer_socket(sub->consumer), NULL, NULL);
	}
	if (WaitEventSetWait(set, time_to_next_event(), &event, 1, PG_WAIT_EXTENSION) > 0 &&
		(event.events & WL_LATCH_SET))
	{
		ResetLatch(MyLatch);
		woken = true;
	}
	FreeWaitEventSet(set);
}

/* Clear the error of *mark, if it is still the one shown; forget the mark. */
static void
clear_error(uint64 *mark)
{
	if (*mark != 0)
		worker_clear_error(*mark);
	*mark = 0;
}

/* When the subscription's next retry is due; DT_NOEND if inbox_retry holds none of its messages. */
static void
ask_next_retry(Subscriber *sub)
{
	long		ms = inbox_ms_until_next_retry(sub->subscription);

	sub->next_retry_at = ms < 0 ? DT_NOEND : TimestampTzPlusMilliseconds(GetCurrentTimestamp(), ms);
	if (ms < 0)
		clear_error(&sub->retry_error_mark);
}

/*
 * Count what a batch or a round of retries, committed, came to; the error
 * of one the worker could not apply before is mended.
 */
static void
count_outcome(const InboxOutcome *outcome, Subscriber *sub)
{
	inbox_count_outcomes(outcome->applied, outcome->duplicates, outcome->failed,
						 outcome->dead_lettered);
	if (outcome->retries_added)
		sub->next_retry_at = 0;
	if (outcome->retry_error_mark != 0)
		sub->retry_error_mark = outcome->retry_error_mark;
	clear_error(&sub->apply_error_mark);
}

/*
 * Read what each consumer sent: record the partitions it was assigned,
 * apply its batch, or what was left of its last one, for one turn (at most
 * outbox.inbox_turn_time of its handlers' time, and one call).  A batch that could not be applied (nothing of it is
 * committed) stops the consumer, to read from the recorded offsets again.
 */
static void
apply_batches(void)
{
	ListCell   *lc;

	foreach(lc, subscribers)
	{
		Subscriber *sub = lfirst(lc);
		InboxBatch *batch;
		List	   *assigned;
		InboxOutcome outcome;

		if (sub->consumer == NULL)
			continue;
		consumer_serve(sub->consumer);
		if ((assigned = consumer_take_assigned(sub->consumer)) != NIL)
		{
			inbox_record_positions(sub->subscription, assigned);
			clear_error(&sub->start_error_mark);
		}
		batch = sub->left ? sub->left : consumer_take_batch(sub->consumer);
		sub->left = NULL;
		if (batch == NULL)
			continue;
		inbox_report_state(INBOX_APPLYING);
		if (sub->next_retry_at == 0)
			ask_next_retry(sub);
		if (inbox_apply_batch(sub->subscription, batch, sub->next_retry_at != DT_NOEND, &outcome))
			count_outcome(&outcome, sub);
		else
		{
			sub->apply_error_mark = worker_error_mark();
			stop_consumer(sub, CONSUMER_RESTART_PAUSE_MS);
			batch->count = 0;
			/* read them again now: a handler found dropped is recorded so at once */
			batch_failed = true;
		}
		if (batch->count > 0)
		{
			/* its turn ended: the rest at its next, past the loop's memory */
			MemoryContextSetParent(batch->context, sub->context);
			sub->left = batch;
		}
		else
			MemoryContextDelete(batch->context);
	}
}

/* Try the messages whose next attempt is due; ask when the next one is. */
static void
apply_due_retries(void)
{
	ListCell   *lc;

	foreach(lc, subscribers)
	{
		Subscriber *sub = lfirst(lc);
		InboxOutcome outcome;

		if (woken)
			sub->next_retry_at = 0; /* a dead letter may have been requeued */
		if (sub->next_retry_at == 0)
			ask_next_retry(sub);
		if (GetCurrentTimestamp() < sub->next_retry_at)
			continue;
		inbox_report_state(INBOX_APPLYING);
		if (inbox_apply_due_retries(sub->subscription, &outcome))
		{
			count_outcome(&outcome, sub);
			sub->next_retry_at = 0;
		}
		else
		{
			/* not at once again: the cause (a right revoked) may last */
			sub->apply_error_mark = worker_error_mark();
			sub->next_retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
															 CONSUMER_RESTART_PAUSE_MS);
		}
	}
}

static long
forget_interval_ms(void)
{
	int64		quarter_ms = (int64) outbox_inbox_dedup_retention * 1000 / 4;

	return (long) Max(Min(quarter_ms, FORGET_INTERVAL_MS), MIN_FORGET_INTERVAL_MS);
}

static void
forget_old_ids_when_due(void)
{
	bool		more;

	if (GetCurrentTimestamp() < forget_at)
		return;
	more = inbox_forget_old_ids();
	/* at any rate of messages, as many are forgotten as come */
	forget_at = more ? 0 : TimestampTzPlusMilliseconds(GetCurrentTimestamp(), forget_interval_ms());
}

/*
 * Is there still something to consume for?  With no subscription left, the
 * launcher is told not to start another inbox worker, and the
 * subscriptions are read a last time: one made meanwhile says so again.
 */
static bool
have_subscriptions(void)
{
	if (subscribers != NIL)
		return true;
	inbox_forget_wanted();
	woken = true;
	refresh_subscriptions_when_due();
	return subscribers != NIL;
}

/*
 * Connect to the slot's database.  The worker runs as the bootstrap
 * superuser, so its own statements must resolve in pg_catalog only: the
 * search_path is set for the session, over the database's and the role's
 * settings.  Not as an override, as the publisher does, so that the
 * handlers' search_path (inbox_apply.c) and their functions' SET clauses
 * apply to them.
 */
static void
connect_to_database(Oid database)
{
	BackgroundWorkerInitializeConnectionByOid(database, InvalidOid, 0);
	worker_pin_session_settings();	/* who it is, how it runs: worker_session.c */
	SetConfigOption("search_path", WORKER_SEARCH_PATH, PGC_SUSET, PGC_S_SESSION);
	pgstat_report_appname("outbox inbox");
}

void
outbox_inbox_main(Datum main_arg)
{
	MemoryContext loop_context;
	Oid			database;
	ListCell   *lc;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	pqsignal(SIGINT, cancel_handler_call);
	BackgroundWorkerUnblockSignals();

	database = inbox_attach(main_arg);
	if (!OidIsValid(database))
		proc_exit(0);			/* its slot was handed out again */
	connect_to_database(database);
#ifdef M_TRIM_THRESHOLD
	mallopt(M_TRIM_THRESHOLD, MALLOC_KEPT_BYTES);
	mallopt(M_MMAP_THRESHOLD, MALLOC_KEPT_BYTES);
#endif
	if (!inbox_extension_ready())
	{
		inbox_forget_wanted();
		proc_exit(0);
	}

	loop_context = AllocSetContextCreate(TopMemoryContext, "outbox inbox loop",
										 ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(loop_context);
	while (inbox_slot_still_mine())
	{
		QueryCancelPending = false; /* a cancel between calls has nothing to cancel */
		CHECK_FOR_INTERRUPTS();
		if (settings_reload_if_asked())
			forget_at = 0;		/* outbox.inbox_dedup_retention may have changed */
		refresh_subscriptions_when_due();
		if (!have_subscriptions())
			break;
		start_consumers();
		inbox_take_turns = list_length(subscribers) > 1;
		inbox_report_state(INBOX_IDLE);
		wait_for_batches();
		apply_batches();
		apply_due_retries();
		forget_old_ids_when_due();
		MemoryContextReset(loop_context);
	}

	foreach(lc, subscribers)
		stop_consumer(lfirst(lc), 0);
	proc_exit(0);
}

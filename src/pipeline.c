/*-------------------------------------------------------------------------
 *
 * pipeline.c
 *	  The publishing worker's pipeline: two batches and the producer.  Kafka
 *	  acknowledges one batch while the worker claims the next.
 *
 * A batch goes through four states:
 *
 *	 EMPTY --claim--> CLAIMED --produce--> IN_FLIGHT --settle--> SETTLED
 *	   ^                  |                                          |
 *	   +---- not produced +------------------- emptied --------------+
 *
 * Each turn claims the next batch in a transaction, settles the batch in
 * flight (waits for Kafka's delivery reports on it and records them),
 * commits, and then produces the batch it claimed: that one is in flight
 * until the next turn.  The commit does not wait for its WAL flush, but no
 * batch is produced before the worker's last commit is flushed
 * (make_last_commit_durable()).  So at most one batch is acknowledged and
 * not yet durably recorded, the most a crash can publish twice (none under
 * exactly-once, which does not wait).  With nothing in flight, the claimed
 * batch is produced before the commit; a partial one (one that neither
 * outbox.batch_size nor outbox.max_batch_bytes cut short) is also settled
 * in that transaction, which spares a second transaction per wake when
 * messages come a few at a time, and while it waits for Kafka, what
 * commits meanwhile is claimed into it and produced at once
 * (claim_late()), unless the publisher coalesces wakes or publishes
 * exactly once.  Not so under
 * outbox.synchronized_standby_slots: then every batch is produced after the
 * commit, once the standbys have flushed it (standby_slots.c), a wait that
 * holds no transaction open.  Its position is the later of the insert
 * position read right after the claim and the end of the turn's commit.
 *
 * A claimed batch is produced only if the batch settled before it went
 * through whole: a message to retry holds back the later messages of its
 * key, which the claim sees only once the retry is recorded; and a failing
 * Kafka is better not given more.  Otherwise its rows, unlocked at commit,
 * wait for the next turn.
 *
 * Memory: each batch has a context of its own, since a batch in flight
 * lives from one turn into the next; the producer lives in
 * TopMemoryContext.  Everything else a turn allocates goes to the caller's
 * context, which the caller resets after each turn.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/interrupt.h"
#include "replication/syncrep.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "exactly_once.h"
#include "metrics.h"
#include "pipeline.h"
#include "producer.h"
#include "settings.h"
#include "standby_slots.h"
#include "statements.h"
#include "store.h"
#include "worker_slot.h"

/* How long one probe for the brokers may take, and the pause between two. */
#define BROKER_PROBE_TIMEOUT_MS 2000
#define BROKER_PROBE_INTERVAL_MS 1000

/* The smallest hash table of held keys worth making. */
#define MIN_HELD_KEYS 16

/*
 * How long a turn that produced a partial batch at once goes on claiming
 * into it what commits meanwhile (claim_late()).  The batch is recorded,
 * and its transaction ends, once the window is over and every report in.
 */
#define LATE_CLAIM_WINDOW_MS 20

typedef enum BatchState
{
	BATCH_EMPTY,
	BATCH_CLAIMED,				/* its rows locked by this turn's transaction */
	BATCH_IN_FLIGHT,			/* handed to librdkafka */
	BATCH_SETTLED				/* every message has its outcome, recorded */
} BatchState;

typedef struct Batch
{
	BatchState	state;
	MemoryContext context;		/* holds the messages; reset when emptied */
	Oid			extension;		/* the outbox extension whose rows they are */
	OutboxMessage *messages;
	int			count;
	int			room;			/* messages has room for this many */
	bool		full;			/* claimed up to a limit: more may wait */
	XLogRecPtr	claimed_lsn;	/* after every commit the claim saw */
	bool		settled_whole;	/* every message delivered or dead-lettered */
	int64		progress_offset;	/* of its last committed Kafka
									 * transaction's progress record, or -1 */
} Batch;

struct Pipeline
{
	Batch		batches[2];		/* one in flight while the other is claimed */
	OutboxProducer *producer;	/* NULL until made, and after it failed */
	bool		claim_again;	/* outcomes recorded may have left messages
								 * to claim: a held back one, or the later
								 * ones of a key whose retry or delay is over */
};

Pipeline *
pipeline_create(void)
{
	Pipeline   *p = MemoryContextAllocZero(TopMemoryContext, sizeof(Pipeline));

	for (int i = 0; i < (int) lengthof(p->batches); i++)
		p->batches[i].context = AllocSetContextCreate(TopMemoryContext, "outbox batch",
													  ALLOCSET_DEFAULT_SIZES);
	return p;
}

/* The pipeline's batch in this state, or NULL. */
static Batch *
batch_in_state(Pipeline *p, BatchState state)
{
	for (int i = 0; i < (int) lengthof(p->batches); i++)
		if (p->batches[i].state == state)
			return &p->batches[i];
	return NULL;
}

bool
pipeline_has_batch_in_flight(Pipeline *p)
{
	return batch_in_state(p, BATCH_IN_FLIGHT) != NULL;
}

static void
empty_batch(Batch *batch)
{
	MemoryContextReset(batch->context);
	batch->messages = NULL;
	batch->count = 0;
	batch->state = BATCH_EMPTY;
}

/*
 * The set of keys held back in a batch.  Two keys that share a hash hold
 * each other back, which costs a message a turn of the loop and breaks no
 * order.
 */
static HTAB *
make_key_set(int size)
{
	HASHCTL		ctl;

	ctl.keysize = sizeof(uint64);
	ctl.entrysize = sizeof(uint64);
	ctl.hcxt = CurrentMemoryContext;
	return hash_create("outbox held keys", Max(size, MIN_HELD_KEYS), &ctl,
					   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

static uint64
key_hash(const OutboxMessage *m)
{
	return message_key_hash(m->topic, strlen(m->topic), m->key, strlen(m->key));
}

/* Is the key of m held back?  A message without a key has no order to keep. */
static bool
key_is_held(HTAB *held, const OutboxMessage *m)
{
	uint64		hash;
	bool		found = false;

	if (m->key == NULL)
		return false;
	hash = key_hash(m);
	hash_search(held, &hash, HASH_FIND, &found);
	return found;
}

/* Hold back the later messages of the key of m. */
static void
hold_key(HTAB *held, const OutboxMessage *m)
{
	uint64		hash;

	if (m->key == NULL)
		return;
	hash = key_hash(m);
	(void) hash_search(held, &hash, HASH_ENTER, NULL);
}

/* Can the producer take a new batch now? */
static bool
producer_ready(OutboxProducer *producer)
{
	return producer != NULL &&
		!producer_settings_changed(producer) &&
		!producer_failed_fatally(producer) &&
		worker_brokers_known_reachable();
}

/*
 * Make a producer from the current settings, a transactional one under
 * outbox.delivery = exactly_once; report why not if it fails.
 */
static bool
make_producer(Pipeline *p)
{
	char		reason[WORKER_LAST_ERROR_LEN];

	worker_report_brokers_reachable(false);
	p->producer = producer_create(exactly_once_wanted() ? exactly_once_transactional_id() : NULL,
								  reason, sizeof(reason));
	if (p->producer != NULL)
		return true;
	worker_report_state(WORKER_WAITING_FOR_BROKERS);
	worker_report_error(LOG, "cannot create the Kafka producer: %s", reason);
	return false;
}

/*
 * A transactional producer's start, once the brokers answer: it settles
 * what its predecessors left in doubt (exactly_once.c) before anything is
 * claimed.  If it fails, the producer goes, and the reason is reported.
 */
static bool
start_transactions(Pipeline *p)
{
	char		reason[WORKER_LAST_ERROR_LEN] = "";

	if (exactly_once_start(p->producer, exactly_once_transactional_id(), reason, sizeof(reason)))
		return true;
	producer_destroy(p->producer);
	p->producer = NULL;
	worker_report_brokers_reachable(false);
	worker_report_state(WORKER_WAITING_FOR_BROKERS);
	worker_report_error(LOG, "cannot start exactly-once publishing: %s", reason);
	return false;
}

/*
 * Ask the brokers whether they answer; report it.  A producer made and
 * answered mends whatever kept the worker from publishing (a property
 * librdkafka refused, a fatal error, an outage): the error shown goes.
 */
static bool
probe_brokers(Pipeline *p)
{
	bool		reachable = producer_brokers_reachable(p->producer, BROKER_PROBE_TIMEOUT_MS);

	worker_report_brokers_reachable(reachable);
	if (!reachable)
		worker_report_state(WORKER_WAITING_FOR_BROKERS);
	else
		worker_clear_error(worker_error_mark());
	return reachable;
}

/*
 * The producer's lifecycle, before a turn: the producer of a batch in
 * flight stays until its reports are in; otherwise one whose settings
 * changed or that failed fatally is destroyed, a new one made, the brokers
 * asked whether they answer, and a transactional one started.  Claim nothing while Kafka cannot take
 * it, so that no attempt is spent: returns false, with *wait_ms set, then.
 */
bool
pipeline_prepare_producer(Pipeline *p, long *wait_ms)
{
	if (pipeline_has_batch_in_flight(p))
		return true;

	if (p->producer && (producer_settings_changed(p->producer) ||
						producer_failed_fatally(p->producer)))
	{
		producer_destroy(p->producer);
		p->producer = NULL;
	}
	if (p->producer == NULL && !make_producer(p))
	{
		*wait_ms = outbox_poll_interval;
		return false;
	}

	producer_serve_events(p->producer);
	if (!worker_brokers_known_reachable() && !probe_brokers(p))
	{
		*wait_ms = BROKER_PROBE_INTERVAL_MS;
		return false;
	}
	if (!producer_started(p->producer) && !start_transactions(p))
	{
		*wait_ms = outbox_poll_interval;
		return false;
	}
	return true;
}

/* Claim the next batch, leaving out the one in flight, if any. */
static void
claim_batch(Batch *batch, Oid extension, const Batch *in_flight)
{
	MemoryContext caller = MemoryContextSwitchTo(batch->context);

	batch->extension = extension;
	batch->room = outbox_batch_size;
	batch->progress_offset = -1;
	batch->count = store_claim_batch(&batch->messages, &batch->full,
									 outbox_batch_size, (int64) outbox_max_batch_kb * 1024,
									 in_flight ? in_flight->messages : NULL,
									 in_flight ? in_flight->count : 0);

	/*
	 * Each transaction the claim's snapshot saw had inserted its commit
	 * record before the snapshot was taken.
	 */
	batch->claimed_lsn = GetXLogInsertRecPtr();
	MemoryContextSwitchTo(caller);
	if (batch->count > 0)
		batch->state = BATCH_CLAIMED;
	else
		empty_batch(batch);
}

/*
 * The worker's commits do not wait for their WAL flush
 * (commit_turn_transaction()): what they record is that Kafka has messages,
 * and a commit lost in a crash only publishes those again.  But the promise
 * is at most one batch: so before a batch goes to Kafka, the worker's last
 * commit, which recorded the batch before it, is made as durable as
 * synchronous_commit would have made it (flushed; with synchronous standbys
 * named, confirmed by them).  Most often an application's commit, whose
 * flush came before it woke the worker, has flushed it already; and the
 * worker's turn no longer waits, with the application's messages that came
 * meanwhile, behind fsyncs queued by other commits.  Under exactly-once a
 * lost commit publishes nothing twice (the next producer's start settles
 * it from the progress records): no wait then.
 */
static void
make_last_commit_durable(OutboxProducer *producer)
{
	if (XactLastCommitEnd == InvalidXLogRecPtr || synchronous_commit == SYNCHRONOUS_COMMIT_OFF ||
		producer_transactional(producer))
		return;
	XLogFlush(XactLastCommitEnd);
	SyncRepWaitForLSN(XactLastCommitEnd, true);
}

/*
 * Hand a claimed batch to the producer if it can take it.  Returns whether
 * it did.  The producer keeps per-key order: once a message of a key cannot
 * be produced, the later messages of that key in the batch are not produced
 * either.
 */
static bool
produce_batch(Pipeline *p, Batch *batch)
{
	if (batch->state != BATCH_CLAIMED || !producer_ready(p->producer))
		return false;

	make_last_commit_durable(p->producer);
	worker_report_state(WORKER_PUBLISHING);
	producer_produce(p->producer, batch->messages, batch->count);
	if (worker_take_fatal_error_drill())
		producer_simulate_fatal_error(p->producer);
	batch->state = BATCH_IN_FLIGHT;
	return true;
}

/*
 * Kafka refuses a whole record batch for one record's fault, one too large
 * for its topic or one invalid, so a message can be refused for the messages
 * sent with it (producer_refused_with_others()).  Produce each message so
 * refused again, alone, in id order, so that its refusal, if it comes again,
 * is its own.  One whose key an earlier message of the batch holds, not
 * delivered and to be tried again, is not: it stays not sent, behind that
 * one.  One delivered now comes after any later message of its key delivered
 * the first time: the caller holds its key, so that those are sent again
 * after it.  One whose turn does not come, because the producer failed, is
 * left as not sent.  healthy says whether the producer still works; returns
 * whether it still does.
 */
static bool
produce_alone_refused_with_others(OutboxProducer *producer, Batch *batch,
								  bool healthy)
{
	HTAB	   *held;
	int			produced = 0;

	for (int i = 0; i < batch->count; i++)
		if (batch->messages[i].outcome != DELIVERY_NOT_SENT)
			produced++;
	if (produced < 2)
		return healthy;			/* it was alone already */

	held = make_key_set(batch->count);
	for (int i = 0; i < batch->count; i++)
	{
		OutboxMessage *m = &batch->messages[i];

		if (producer_refused_with_others(m))
		{
			if (healthy && !key_is_held(held, m))
			{
				m->produced_alone = true;
				producer_produce(producer, m, 1);
				healthy = producer_await_deliveries(producer, false) == AWAIT_ALL_REPORTED;
			}
			else
				m->outcome = DELIVERY_NOT_SENT;
		}
		if (m->outcome == DELIVERY_RETRY || m->outcome == DELIVERY_NOT_SENT ||
			m->outcome == DELIVERY_PENDING)
			hold_key(held, m);
	}
	hash_destroy(held);
	return healthy;
}

/* Is the message's delivery still owed, or not to be recorded now? */
static bool
not_delivered(const OutboxMessage *m)
{
	return m->outcome == DELIVERY_RETRY || m->outcome == DELIVERY_NOT_SENT ||
		m->outcome == DELIVERY_PENDING;
}

/*
 * Would per-key order take back a message of the open transaction that
 * Kafka acknowledged, since an earlier message of its key was not
 * delivered (hold_back_behind_failures())?  Committed, it would be sent
 * again: a duplicate.
 */
static bool
holds_back_acknowledged(Batch *batch)
{
	HTAB	   *held = make_key_set(batch->count);
	bool		found = false;

	for (int i = 0; i < batch->count && !found; i++)
	{
		OutboxMessage *m = &batch->messages[i];

		found = m->in_transaction && m->outcome == DELIVERY_OK && key_is_held(held, m);
		if (not_delivered(m))
			hold_key(held, m);
	}
	hash_destroy(held);
	return found;
}

/*
 * outbox.delivery = exactly_once: end the Kafka transaction of the batch's
 * messages produced since the last one ended.  Its progress records list
 * them all (producer_produce()): so it is committed only if Kafka
 * acknowledged each of them, the producer works, and per-key order would
 * take none of them back (holds_back_acknowledged()); else aborted, and
 * its messages are not sent: a read_committed consumer never sees them,
 * and they go again in a later transaction.  A message that failed keeps
 * its failure, to be retried or dead-lettered.  An outcome in doubt fails
 * the producer, whose successor's start settles it (exactly_once.c).
 * Returns whether the producer still works.
 */
static bool
end_transaction(Pipeline *p, Batch *batch, bool healthy)
{
	bool		commit = healthy && !holds_back_acknowledged(batch);
	int64		progress_offset;
	WireTransactionOutcome outcome;
	TimestampTz committed_at;

	for (int i = 0; i < batch->count && commit; i++)
		commit = !batch->messages[i].in_transaction || batch->messages[i].outcome == DELIVERY_OK;
	if (commit)
		worker_pause_if_asked(PAUSE_BEFORE_KAFKA_COMMIT, "outbox: paused before_kafka_commit");
	outcome = producer_end_transaction(p->producer, commit, &progress_offset);
	committed_at = GetCurrentTimestamp();
	if (outcome == TRANSACTION_COMMITTED)
		worker_pause_if_asked(PAUSE_AFTER_KAFKA_COMMIT, "outbox: paused after_kafka_commit");
	for (int i = 0; i < batch->count; i++)
	{
		OutboxMessage *m = &batch->messages[i];

		if (!m->in_transaction)
			continue;
		m->in_transaction = false;
		if (outcome != TRANSACTION_COMMITTED &&
			(m->outcome == DELIVERY_OK || m->outcome == DELIVERY_PENDING))
			m->outcome = DELIVERY_NOT_SENT;
		else if (m->outcome == DELIVERY_OK)
			m->acked_at = committed_at; /* what a read_committed consumer sees */
	}
	if (outcome == TRANSACTION_COMMITTED)
		batch->progress_offset = Max(batch->progress_offset, progress_offset);
	return healthy && outcome != TRANSACTION_UNKNOWN;
}

/*
 * Wait for the reports on what was produced into the open transaction, end
 * it, and hold back the keys of those of its messages not delivered.
 */
static bool
settle_transaction(Pipeline *p, Batch *batch, HTAB *held, bool healthy)
{
	if (healthy)
		healthy = producer_await_deliveries(p->producer, false) == AWAIT_ALL_REPORTED;
	for (int i = 0; i < batch->count; i++)
		if (batch->messages[i].in_transaction)
		{
			healthy = end_transaction(p, batch, healthy);
			break;
		}
	for (int i = 0; i < batch->count; i++)
		if (not_delivered(&batch->messages[i]))
			hold_key(held, &batch->messages[i]);
	return healthy;
}

/*
 * outbox.delivery = exactly_once: Kafka refused a record batch for one
 * record's fault (see produce_alone_refused_with_others()), and so the
 * whole transaction was aborted.  Produce the batch again, in its order, in
 * transactions that hold no such message beside others: each one alone,
 * the messages between them together.  A message whose key an earlier one
 * holds back, not delivered, stays not sent; so does what a failed
 * producer leaves.  Returns whether the producer still works.
 */
static bool
produce_again_around_refused(Pipeline *p, Batch *batch, bool healthy)
{
	HTAB	   *held;
	bool		refusals = false;

	for (int i = 0; i < batch->count; i++)
		refusals |= producer_refused_with_others(&batch->messages[i]);
	if (!refusals || !healthy)
		return healthy;

	held = make_key_set(batch->count);
	for (int i = 0; i < batch->count && healthy; i++)
	{
		OutboxMessage *m = &batch->messages[i];
		bool		refused = producer_refused_with_others(m);

		if ((!refused && m->outcome != DELIVERY_NOT_SENT) || key_is_held(held, m))
		{
			if (not_delivered(m))
				hold_key(held, m);
			continue;
		}
		if (refused)
			healthy = settle_transaction(p, batch, held, healthy);
		if (!healthy || key_is_held(held, m))
			continue;
		producer_produce(p->producer, m, 1);
		if (refused)
			healthy = settle_transaction(p, batch, held, healthy);
	}
	healthy = settle_transaction(p, batch, held, healthy);
	hash_destroy(held);
	return healthy;
}

/*
 * Keep per-key order in a batch's outcomes: once a message of a key is not
 * delivered, the later messages of that key are neither recorded as
 * delivered ahead of it nor charged an attempt: they stay as they were, and
 * the claim holds them back until their turn.  A message produced alone
 * (produce_alone_refused_with_others()) reached Kafka after the later
 * messages of its key delivered the first time, in another request: those
 * are not recorded as delivered either, so that they are sent again after
 * it; the later ones produced alone came after it, in id order.  Sets
 * settled_whole if every message was delivered or dead-lettered, so that no
 * key is held back.
 */
static void
hold_back_behind_failures(Batch *batch)
{
	HTAB	   *held = make_key_set(batch->count);
	HTAB	   *sent_late = make_key_set(batch->count);

	batch->settled_whole = true;
	for (int i = 0; i < batch->count; i++)
	{
		OutboxMessage *m = &batch->messages[i];

		if (m->outcome == DELIVERY_PENDING)
			m->outcome = DELIVERY_NOT_SENT;

		if ((m->outcome == DELIVERY_OK || m->outcome == DELIVERY_RETRY) &&
			(key_is_held(held, m) ||
			 (!m->produced_alone && key_is_held(sent_late, m))))
			m->outcome = DELIVERY_NOT_SENT; /* its turn comes after the held one */

		if (m->outcome == DELIVERY_RETRY || m->outcome == DELIVERY_NOT_SENT)
		{
			hold_key(held, m);
			batch->settled_whole = false;
		}
		else if (m->outcome == DELIVERY_OK && m->produced_alone)
			hold_key(sent_late, m);
	}
	hash_destroy(sent_late);
	hash_destroy(held);
}

/*
 * Report a settled batch's first failure, record its outcomes and count
 * them, for outbox_worker and, with their latency to their acknowledgement,
 * for outbox_status (metrics.c).  The report comes first, so that an error in
 * recording them, which store_record_outcomes() reports, is the one
 * outbox_worker shows.  A batch delivered and recorded without a failure
 * says the worker publishes again: the error shown before it goes.  And
 * messages acknowledged say the brokers answer, whatever a connection's
 * error said meanwhile.
 */
static void
record_outcomes(Pipeline *p, Batch *batch, TimestampTz settled_at)
{
	RecordedOutcomes recorded;
	uint64		error_before = worker_error_mark();
	bool		failed = false;

	for (int i = 0; i < batch->count; i++)
	{
		OutboxMessage *m = &batch->messages[i];

		if (m->outcome == DELIVERY_RETRY || m->outcome == DELIVERY_PERMANENT)
		{
			worker_report_error(LOG, "message %lld to topic \"%s\": %s",
								(long long) m->id, m->topic, store_describe_failure(m));
			failed = true;
			break;
		}
	}
	store_record_outcomes(batch->messages, batch->count, &recorded);
	exactly_once_note_recorded(batch->progress_offset);
	if (!failed && recorded.delivered > 0)
		worker_clear_error(error_before);
	/* acknowledged: whatever an error said since the last probe, they answer */
	if (recorded.delivered > 0 && !worker_brokers_known_reachable())
		worker_report_brokers_reachable(true);
	p->claim_again |= recorded.floor_lowered;
	worker_count_outcomes(recorded.delivered, recorded.retries_scheduled,
						  recorded.dead_lettered);
	metrics_count_deliveries(batch->messages, batch->count, settled_at);
}

/* Batch messages a and b in id order, for qsort(). */
static int
compare_ids(const void *a, const void *b)
{
	int64		x = ((const OutboxMessage *) a)->id;
	int64		y = ((const OutboxMessage *) b)->id;

	return (x > y) - (x < y);
}

/*
 * The store records a batch's outcomes in id order, which a late claim's
 * messages, produced after the batch's, may not follow.  Once the outcomes
 * keep each key's order, the messages need no other.
 */
static void
put_in_id_order(Batch *batch)
{
	for (int i = 1; i < batch->count; i++)
		if (batch->messages[i].id < batch->messages[i - 1].id)
		{
			qsort(batch->messages, batch->count, sizeof(OutboxMessage), compare_ids);
			return;
		}
}

/*
 * May the batch take more?  Not once a limit ended a claim, nor while the
 * worker stops or the producer has failed; nor under exactly-once, where a
 * message is seen when its transaction commits: what a late claim adds
 * would hold back the commit of the messages produced before it.
 */
static bool
may_claim_late(Pipeline *p, Batch *batch)
{
	return !batch->full && batch->count < batch->room && !ShutdownRequestPending &&
		!producer_failed_fatally(p->producer) && !producer_transactional(p->producer);
}

/*
 * Claim what committed since the batch was claimed, into its room, and
 * produce it at once, behind the batch's messages: Kafka gets each key's
 * messages in the order they are produced, and hold_back_behind_failures()
 * keeps that order in the outcomes, as for the messages of one claim.
 * The claim leaves out the batch's own messages, which it takes in id
 * order.  The messages stay where produce gave them their tokens.
 */
static void
claim_late(Pipeline *p, Batch *batch)
{
	MemoryContext caller = CurrentMemoryContext;
	OutboxMessage *claimed = palloc(sizeof(OutboxMessage) * batch->count);
	OutboxMessage *late;
	int64		bytes = 0;
	int			count;

	for (int i = 0; i < batch->count; i++)
		bytes += batch->messages[i].payload_len;
	memcpy(claimed, batch->messages, sizeof(OutboxMessage) * batch->count);
	qsort(claimed, batch->count, sizeof(OutboxMessage), compare_ids);

	MemoryContextSwitchTo(batch->context);
	count = store_claim_batch(&late, &batch->full, batch->room - batch->count,
							  Max((int64) outbox_max_batch_kb * 1024 - bytes, 1),
							  claimed, batch->count);
	MemoryContextSwitchTo(caller);
	if (count == 0)
		return;
	memcpy(&batch->messages[batch->count], late, sizeof(OutboxMessage) * count);
	producer_produce(p->producer, &batch->messages[batch->count], count);
	batch->count += count;
	p->claim_again |= batch->full;
}

/*
 * Wait for Kafka's reports on a batch produced at once; meanwhile, for
 * LATE_CLAIM_WINDOW_MS, with late_claims, each commit that wakes the worker
 * has its messages claimed into the batch and produced (claim_late()), not
 * left for the next turn, after the batch is recorded: so a message
 * committed while a turn waits for Kafka is published a round trip later,
 * not two.  Returns whether every message got its report.
 */
static bool
await_claiming_late(Pipeline *p, Batch *batch, bool late_claims)
{
	TimestampTz window_ends = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														  LATE_CLAIM_WINDOW_MS);

	for (;;)
	{
		bool		listen = late_claims && may_claim_late(p, batch) &&
			GetCurrentTimestamp() < window_ends;
		AwaitResult awaited = producer_await_deliveries(p->producer, listen);

		if (awaited != AWAIT_WOKEN)
			return awaited == AWAIT_ALL_REPORTED;
		/* reset before the claim's snapshot: a commit after it wakes again */
		ResetLatch(MyLatch);
		if (may_claim_late(p, batch))	/* not woken by a SIGTERM */
			claim_late(p, batch);
	}
}

/*
 * Wait for Kafka's reports on a batch in flight and record them.  The
 * producer is destroyed if anything had to be withdrawn, before the batch's
 * memory goes, since reports may still be owed for it.  After DROP
 * EXTENSION the ids may be another table's: then nothing is recorded.
 */
static void
settle_batch(Pipeline *p, Batch *batch, Oid extension, bool late_claims)
{
	bool		healthy;
	TimestampTz settled_at;

	pgstat_report_activity(STATE_RUNNING, "outbox: waiting for Kafka");
	healthy = await_claiming_late(p, batch, late_claims && batch->extension == extension);
	if (producer_transactional(p->producer))
	{
		healthy = end_transaction(p, batch, healthy);
		healthy = produce_again_around_refused(p, batch, healthy);
	}
	else
		healthy = produce_alone_refused_with_others(p->producer, batch, healthy);
	settled_at = GetCurrentTimestamp();	/* every report of the batch is in */
	hold_back_behind_failures(batch);
	if (!healthy || producer_failed_fatally(p->producer))
	{
		producer_destroy(p->producer);
		p->producer = NULL;
	}
	put_in_id_order(batch);		/* the producer has let go of the messages */
	if (batch->extension == extension)
		record_outcomes(p, batch, settled_at);
	batch->state = BATCH_SETTLED;
}

/*
 * Commit, without waiting for the WAL flush (see make_last_commit_durable()).
 * Then report the turn's table statistics (at most once a second, as a
 * backend does between statements), so that autovacuum counts the rows the
 * worker deleted.
 */
static void
commit_turn_transaction(MemoryContext turn_context)
{
	(void) set_config_option("synchronous_commit", "off", PGC_SUSET, PGC_S_SESSION,
							 GUC_ACTION_LOCAL, true, 0, false);
	statements_commit_transaction(turn_context);
	pgstat_report_stat(false);
}

/*
 * The half of a turn in its transaction: claim the next batch (unless the
 * worker is stopping), settle the batch in flight; or, with none in flight,
 * produce the claimed batch at once, and settle it too if it is partial.
 * Returns the extension's oid, or InvalidOid without the extension; sets
 * *next_retry_ms when nothing more waits to be claimed.
 */
static Oid
turn_in_transaction(Pipeline *p, Batch *next, Batch *in_flight, bool late_claims,
					long *next_retry_ms)
{
	Oid			extension;

	statements_begin_transaction("outbox: claiming a batch");
	extension = store_find_extension();
	if (OidIsValid(extension) && !ShutdownRequestPending)
		claim_batch(next, extension, in_flight);

	if (in_flight)
		settle_batch(p, in_flight, extension, false);
	else if (!standby_wait_required() && produce_batch(p, next) && !next->full)
		settle_batch(p, next, extension, late_claims);

	if (OidIsValid(extension) &&
		(next->state == BATCH_EMPTY || next->state == BATCH_SETTLED))
		*next_retry_ms = store_ms_until_next_retry();
	return extension;
}

/*
 * The half of a turn after the commit: the settled batches go, and the
 * claimed batch, if the one before it went through whole, is produced, once
 * the standbys have flushed it.  The end of the commit, which the claim's
 * row locks made write WAL, covers the batch settled in it too.  Returns
 * whether a claimed batch was left unproduced: its rows wait.
 */
static bool
turn_after_commit(Pipeline *p, Batch *next, Batch *settled)
{
	bool		may_produce = true;

	if (settled)
	{
		may_produce = settled->settled_whole;
		empty_batch(settled);
	}
	if (next->state == BATCH_CLAIMED && may_produce &&
		standby_wait_for_flush(Max(next->claimed_lsn, XactLastCommitEnd)))
		(void) produce_batch(p, next);
	if (next->state == BATCH_SETTLED)
		empty_batch(next);
	if (next->state != BATCH_CLAIMED)
		return false;
	store_lower_claim_floor(next->messages[0].id);
	empty_batch(next);
	return true;
}

/*
 * One turn of the pipeline; see the file's header comment.  Sets
 * *next_retry_ms to the time until the next retry is due, or -1.
 */
TurnResult
pipeline_turn(Pipeline *p, bool late_claims, long *next_retry_ms)
{
	MemoryContext turn_context = CurrentMemoryContext;
	Batch	   *in_flight = batch_in_state(p, BATCH_IN_FLIGHT);
	Batch	   *next = batch_in_state(p, BATCH_EMPTY);
	Batch	   *left_in_flight;
	Oid			extension;
	bool		claimed_waits;
	TurnResult	result;

	Assert(next != NULL);		/* a turn empties all but the batch in flight */
	*next_retry_ms = -1;
	p->claim_again = false;
	extension = turn_in_transaction(p, next, in_flight, late_claims, next_retry_ms);
	commit_turn_transaction(turn_context);
	if (in_flight || next->state == BATCH_SETTLED)
		worker_pause_if_asked(PAUSE_AFTER_RECORDED, "outbox: paused after_recorded");
	claimed_waits = turn_after_commit(p, next, in_flight);

	left_in_flight = batch_in_state(p, BATCH_IN_FLIGHT);
	if (!OidIsValid(extension))
		result = TURN_NO_EXTENSION;
	else if (claimed_waits || p->claim_again || (left_in_flight && left_in_flight->full))
		result = TURN_GO_ON;
	else if (left_in_flight)
		result = TURN_IN_FLIGHT;
	else
		result = TURN_DRAINED;
	pgstat_report_activity(STATE_IDLE, NULL);
	return result;
}

/*
 * Let commits gather for timeout_ms before the next turn (the publisher's
 * coalescing).  The reports on a batch in flight are read as they come, so
 * that each acknowledgement is timed when it came (its latency), not when
 * the wait ended.
 */
void
pipeline_gather(Pipeline *p, long timeout_ms)
{
	if (p->producer != NULL && pipeline_has_batch_in_flight(p))
		producer_serve_events_for(p->producer, timeout_ms);
	else
		(void) WaitLatch(MyLatch, WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms,
						 PG_WAIT_EXTENSION);
}

/* At shutdown: record what Kafka says of the batch in flight, then let go. */
void
pipeline_finish(Pipeline *p)
{
	long		next_retry_ms;

	if (pipeline_has_batch_in_flight(p))
		(void) pipeline_turn(p, false, &next_retry_ms);
	producer_destroy(p->producer);
	p->producer = NULL;
}

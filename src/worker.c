/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The outbox worker: a background worker that publishes the committed
 *	  messages of outbox.database to Kafka.
 *
 * Each turn of the loop claims a batch in a transaction, waits for Kafka's
 * delivery reports on the batch produced by the turn before, records what
 * became of every message of it, commits, and then produces the batch it
 * claimed: Kafka acknowledges one batch while the worker claims the next.
 * A partial batch, with nothing in flight, is produced and recorded in the
 * transaction that claimed it.  While a batch is in flight the next turn
 * follows at once; otherwise the worker sleeps on its latch, which every
 * transaction that enqueues sets at commit, until then or until the next
 * retry is due.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "outbox.h"
#include "producer.h"
#include "store.h"

/* How long one probe for the brokers may take, and the pause between two. */
#define BROKER_PROBE_TIMEOUT_MS 2000
#define BROKER_PROBE_INTERVAL_MS 1000

/* What one turn of the loop found. */
typedef enum TurnResult
{
	TURN_NO_EXTENSION,			/* CREATE EXTENSION outbox has not run here */
	TURN_DRAINED,				/* nothing in flight, nothing more to claim */
	TURN_GO_ON					/* a batch is in flight, or more waits: go again */
} TurnResult;

/* A claimed batch, from its claim until its outcome is recorded. */
typedef struct Batch
{
	MemoryContext context;		/* holds the messages; reset once recorded */
	Oid			extension;		/* the outbox extension whose rows they are */
	OutboxMessage *messages;
	int			count;
} Batch;

static void
detach_from_slot(int code, Datum arg)
{
	OutboxWorkerSlot *slot = &outbox_shared->worker;

	SpinLockAcquire(&slot->mutex);
	slot->pid = 0;
	slot->latch = NULL;
	slot->state = OUTBOX_WORKER_STOPPED;
	slot->brokers_reachable = false;
	SpinLockRelease(&slot->mutex);
}

static void
attach_to_slot(void)
{
	OutboxWorkerSlot *slot = &outbox_shared->worker;

	SpinLockAcquire(&slot->mutex);
	slot->pid = MyProcPid;
	slot->latch = MyLatch;
	slot->state = OUTBOX_WORKER_STARTING;
	slot->brokers_reachable = false;
	slot->started_at = GetCurrentTimestamp();
	SpinLockRelease(&slot->mutex);
	on_shmem_exit(detach_from_slot, 0);
}

static bool
brokers_known_reachable(void)
{
	bool		reachable;

	SpinLockAcquire(&outbox_shared->worker.mutex);
	reachable = outbox_shared->worker.brokers_reachable;
	SpinLockRelease(&outbox_shared->worker.mutex);
	return reachable;
}

/*
 * Look the key of m up in the set of keys held back in this batch, entering
 * it with HASH_ENTER; returns whether it was there.  Two keys that share a
 * hash hold each other back, which costs a message a turn of the loop and
 * breaks no order.
 */
static bool
lookup_held_key(HTAB *held, OutboxMessage *m, HASHACTION action)
{
	uint64		hash;
	bool		found;

	if (m->key == NULL)
		return false;			/* no key, no order to keep */
	hash = outbox_key_hash(m->topic, strlen(m->topic), m->key, strlen(m->key));
	hash_search(held, &hash, action, &found);
	return found;
}

static HTAB *
make_key_set(int size)
{
	HASHCTL		ctl;

	ctl.keysize = sizeof(uint64);
	ctl.entrysize = sizeof(uint64);
	ctl.hcxt = CurrentMemoryContext;
	return hash_create("outbox held keys", Max(size, 16), &ctl,
					   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/*
 * Hand a claimed batch to librdkafka, keeping per-key order: once a message
 * of a key cannot be produced, the later messages of that key in the batch
 * are not produced either.
 */
static void
produce_batch(OutboxProducer *producer, Batch *batch)
{
	HTAB	   *held = make_key_set(batch->count);

	for (int i = 0; i < batch->count; i++)
	{
		OutboxMessage *m = &batch->messages[i];

		if (lookup_held_key(held, m, HASH_FIND))
			continue;			/* outcome stays DELIVERY_NOT_SENT */
		producer_produce(producer, m);
		if (m->outcome == DELIVERY_RETRY || m->outcome == DELIVERY_NOT_SENT)
			(void) lookup_held_key(held, m, HASH_ENTER);
	}
	hash_destroy(held);

	if (pg_atomic_exchange_u32(&outbox_shared->worker.simulate_fatal_error, 0))
		producer_simulate_fatal_error(producer);
}

/*
 * Kafka refuses a whole record batch when it is larger than the topic
 * allows, so one message too large for its topic gets the messages sent with
 * it refused too.  Produce each message refused for its size again, alone,
 * in id order, so that the refusal, if it comes again, is its own.  One that
 * is delivered now comes after any later message of its key delivered the
 * first time: the caller holds its key, so that those are sent again after
 * it.  One whose turn does not come, because the producer failed, is left as
 * not sent.  healthy says whether the producer still works; returns whether
 * it still does.
 */
static bool
produce_alone_refused_for_size(OutboxProducer *producer, Batch *batch,
							   bool healthy)
{
	int			produced = 0;

	for (int i = 0; i < batch->count; i++)
		if (batch->messages[i].outcome != DELIVERY_NOT_SENT)
			produced++;
	if (produced < 2)
		return healthy;			/* it was alone already */

	for (int i = 0; i < batch->count; i++)
	{
		OutboxMessage *m = &batch->messages[i];

		if (!producer_refused_for_size(m))
			continue;
		if (!healthy)
		{
			m->outcome = DELIVERY_NOT_SENT;
			continue;
		}
		m->produced_alone = true;
		producer_produce(producer, m);
		healthy = producer_await_deliveries(producer);
	}
	return healthy;
}

/*
 * Wait for the delivery reports of a produced batch, keeping per-key order:
 * once a message of a key is not delivered, the later messages of that key
 * are neither recorded as delivered ahead of it nor charged an attempt: they
 * stay as they were, and the claim holds them back until their turn.
 * Returns false if the producer must be made anew, which the caller must do
 * before the batch's memory goes, since reports may still be owed.  Sets
 * *all_settled if every message was delivered or dead-lettered, so that no
 * key is held back.
 */
static bool
settle_batch(OutboxProducer *producer, Batch *batch, bool *all_settled)
{
	HTAB	   *held;
	bool		healthy;

	healthy = producer_await_deliveries(producer);
	healthy = produce_alone_refused_for_size(producer, batch, healthy);

	held = make_key_set(batch->count);
	*all_settled = true;
	for (int i = 0; i < batch->count; i++)
	{
		OutboxMessage *m = &batch->messages[i];

		if (m->outcome == DELIVERY_PENDING)
			m->outcome = DELIVERY_NOT_SENT;

		/*
		 * A message not delivered holds its key; so does one produced alone,
		 * which Kafka got after the later messages of its key.
		 */
		if ((m->outcome == DELIVERY_OK || m->outcome == DELIVERY_RETRY) &&
			lookup_held_key(held, m, HASH_FIND))
			m->outcome = DELIVERY_NOT_SENT; /* its turn comes after the held one */
		else if (m->outcome == DELIVERY_RETRY || m->outcome == DELIVERY_NOT_SENT ||
				 (m->outcome == DELIVERY_OK && m->produced_alone))
			(void) lookup_held_key(held, m, HASH_ENTER);
		if (m->outcome == DELIVERY_RETRY || m->outcome == DELIVERY_NOT_SENT)
			*all_settled = false;
	}
	hash_destroy(held);
	return healthy && !producer_failed_fatally(producer);
}

/* Can this producer take a new batch now? */
static bool
producer_ready(OutboxProducer *producer)
{
	return producer != NULL &&
		!producer_settings_changed(producer) &&
		!producer_failed_fatally(producer) &&
		brokers_known_reachable();
}

/*
 * Produce the claimed batch, if there is one, if the batch before it went
 * through whole, and if the producer can take it.  Returns whether it did.
 */
static bool
start_publishing(OutboxProducer *producer, Batch *claimed, bool all_settled)
{
	if (claimed->count == 0 || !all_settled || !producer_ready(producer))
		return false;
	outbox_report_state(OUTBOX_WORKER_PUBLISHING);
	produce_batch(producer, claimed);
	return true;
}

/*
 * Wait for Kafka's reports on a produced batch and record them.  Destroys
 * *producer (and sets it to NULL) if it must be made anew.
 */
static void
settle_and_record(OutboxProducer **producer, Batch *batch, Oid extension,
				  bool *all_settled)
{
	pgstat_report_activity(STATE_RUNNING, "outbox: waiting for Kafka");
	if (!settle_batch(*producer, batch, all_settled))
	{
		producer_destroy(*producer);
		*producer = NULL;
	}
	/* after DROP EXTENSION, the ids may now be another table's */
	if (batch->extension == extension)
		store_record_outcomes(batch->messages, batch->count);
}

/*
 * One turn of the pipeline.  In one transaction: purge old sent rows, claim
 * the next batch (unless the worker is stopping), then wait for Kafka's
 * reports on the batch in flight, which it has been working on meanwhile,
 * and record them.  After the commit, produce the claimed batch: it is in
 * flight until the next turn.  So the claim and Kafka work at the same time,
 * and still at most one batch is acknowledged and not yet recorded, the most
 * a crash can publish twice.  With nothing in flight, the claimed batch is
 * produced at once instead (see below).
 *
 * The claimed batch is produced only if the one in flight went through
 * whole: a message to retry holds back the later messages of its key, which
 * the claim knows only once the retry is recorded; and a failing Kafka is
 * better not given more.  Otherwise its rows stay as they were, to be
 * claimed again.
 *
 * *producer is destroyed (and set to NULL) if it must be made anew.
 * *next_retry_ms is set to the time until the next retry is due, or -1.
 */
static TurnResult
publish_turn(OutboxProducer **producer, Batch **in_flight, Batch *claimed,
			 bool claim, long *next_retry_ms)
{
	Batch	   *settled = *in_flight;
	bool		all_settled = true;
	bool		claimed_done = false;
	bool		claimed_waits = false;
	Oid			extension;
	TurnResult	result;

	*next_retry_ms = -1;
	claimed->count = 0;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "outbox: SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "outbox: claiming a batch");

	extension = store_find_extension();
	if (OidIsValid(extension) && claim)
	{
		MemoryContext caller;

		if (outbox_sent_retention > 0)
			store_purge_sent();

		caller = MemoryContextSwitchTo(claimed->context);
		claimed->extension = extension;
		claimed->count = store_claim_batch(&claimed->messages, outbox_batch_size,
										   settled ? settled->messages : NULL,
										   settled ? settled->count : 0);
		MemoryContextSwitchTo(caller);
	}

	if (settled)
		settle_and_record(producer, settled, extension, &all_settled);
	else if (start_publishing(*producer, claimed, true))
	{
		/*
		 * With nothing in flight, the claimed batch goes before the commit,
		 * which then overlaps with Kafka's work.  A full batch stays in
		 * flight while the next turn claims the next one.  A partial one is
		 * the last for now: it is settled in this transaction, which spares
		 * a second transaction per wake when messages come a few at a time.
		 */
		if (claimed->count == outbox_batch_size)
			*in_flight = claimed;
		else
		{
			settle_and_record(producer, claimed, extension, &all_settled);
			claimed_done = true;
		}
	}

	if (OidIsValid(extension) && (claimed->count == 0 || claimed_done))
		*next_retry_ms = store_ms_until_next_retry();

	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();

	if (settled)
	{
		MemoryContextReset(settled->context);
		*in_flight = NULL;
		if (start_publishing(*producer, claimed, all_settled))
			*in_flight = claimed;
	}
	if (*in_flight != claimed)
	{
		/* claimed and not produced: its rows wait for the next turn */
		claimed_waits = claimed->count > 0 && !claimed_done;
		MemoryContextReset(claimed->context);
	}

	if (!OidIsValid(extension))
		result = TURN_NO_EXTENSION;
	else if (*in_flight || claimed_waits)
		result = TURN_GO_ON;
	else
		result = TURN_DRAINED;

	/* Without the extension there is no outbox_worker view to say so. */
	pgstat_report_activity(STATE_IDLE,
						   result == TURN_NO_EXTENSION ? "outbox: waiting for CREATE EXTENSION outbox" : NULL);
	return result;
}

static void
wait_for_wake(long timeout_ms)
{
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 Max(timeout_ms, 1), PG_WAIT_EXTENSION);
}

/*
 * Wait, connected to no database, until outbox.database exists, then exit
 * so that the postmaster starts the worker again: a process connects to one
 * database only, once.
 */
static void
wait_for_database(void)
{
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("outbox worker");
	outbox_report_state(OUTBOX_WORKER_WAITING_FOR_DATABASE);
	pgstat_report_activity(STATE_IDLE, "outbox: waiting for outbox.database to be created");

	for (;;)
	{
		bool		exists;

		StartTransactionCommand();
		exists = OidIsValid(get_database_oid(outbox_database, true));
		CommitTransactionCommand();
		if (exists)
			break;

		wait_for_wake(outbox_poll_interval);
		ResetLatch(MyLatch);
		if (ShutdownRequestPending)
			proc_exit(0);
	}

	SpinLockAcquire(&outbox_shared->worker.mutex);
	outbox_shared->worker.connecting = false;
	SpinLockRelease(&outbox_shared->worker.mutex);
	ereport(LOG,
			(errmsg("outbox: database \"%s\" exists now, restarting the worker to connect to it",
					outbox_database)));
	proc_exit(1);
}

/*
 * Connect to outbox.database.  Connecting to a database that does not exist
 * ends the process; so a worker that finds its predecessor died while
 * connecting waits for the database instead of failing every few seconds.
 */
static void
connect_to_database(void)
{
	OutboxWorkerSlot *slot = &outbox_shared->worker;
	bool		predecessor_failed;

	SpinLockAcquire(&slot->mutex);
	predecessor_failed = slot->connecting;
	slot->connecting = true;
	SpinLockRelease(&slot->mutex);

	if (predecessor_failed)
		wait_for_database();

	BackgroundWorkerInitializeConnection(outbox_database, NULL, 0);
	pgstat_report_appname("outbox worker");

	SpinLockAcquire(&slot->mutex);
	slot->connecting = false;
	SpinLockRelease(&slot->mutex);
}

void
outbox_worker_main(Datum main_arg)
{
	OutboxProducer *producer = NULL;
	Batch		batches[2];
	Batch	   *in_flight = NULL;
	long		next_retry_ms;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	attach_to_slot();
	connect_to_database();

	/* one batch in flight, one being claimed */
	batches[0].context = AllocSetContextCreate(TopMemoryContext, "outbox batch",
											   ALLOCSET_DEFAULT_SIZES);
	batches[1].context = AllocSetContextCreate(TopMemoryContext, "outbox batch",
											   ALLOCSET_DEFAULT_SIZES);

	while (!ShutdownRequestPending)
	{
		long		timeout_ms = outbox_poll_interval;

		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		/* The producer of a batch in flight stays until its reports are in. */
		if (in_flight == NULL)
		{
			if (producer && (producer_settings_changed(producer) ||
							 producer_failed_fatally(producer)))
			{
				producer_destroy(producer);
				producer = NULL;
			}
			if (producer == NULL)
			{
				char		reason[512];

				outbox_report_brokers_reachable(false);
				producer = producer_create(reason, sizeof(reason));
				if (producer == NULL)
				{
					outbox_report_state(OUTBOX_WORKER_WAITING_FOR_BROKERS);
					outbox_report_error("cannot create the Kafka producer: %s", reason);
					wait_for_wake(outbox_poll_interval);
					continue;
				}
			}

			/* Claim nothing while Kafka cannot take it: no attempt is spent. */
			producer_serve_events(producer);
			if (!brokers_known_reachable())
			{
				bool		reachable = producer_brokers_reachable(producer, BROKER_PROBE_TIMEOUT_MS);

				outbox_report_brokers_reachable(reachable);
				if (!reachable)
				{
					outbox_report_state(OUTBOX_WORKER_WAITING_FOR_BROKERS);
					wait_for_wake(BROKER_PROBE_INTERVAL_MS);
					continue;
				}
			}
		}

		switch (publish_turn(&producer, &in_flight,
							 in_flight == &batches[0] ? &batches[1] : &batches[0],
							 true, &next_retry_ms))
		{
			case TURN_NO_EXTENSION:
				outbox_report_state(OUTBOX_WORKER_WAITING_FOR_EXTENSION);
				break;
			case TURN_GO_ON:
				continue;
			case TURN_DRAINED:
				outbox_report_state(OUTBOX_WORKER_IDLE);
				if (next_retry_ms >= 0)
					timeout_ms = Min(timeout_ms, next_retry_ms);
				break;
		}
		wait_for_wake(timeout_ms);
	}

	/* Record what Kafka says about the batch in flight, claiming no more. */
	if (in_flight)
		(void) publish_turn(&producer, &in_flight,
							in_flight == &batches[0] ? &batches[1] : &batches[0],
							false, &next_retry_ms);
	producer_destroy(producer);
	proc_exit(0);
}

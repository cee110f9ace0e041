/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The outbox worker: a background worker that publishes the committed
 *	  messages of outbox.database to Kafka.
 *
 * Each turn of the loop claims a batch in a transaction, produces it,
 * waits for Kafka's delivery reports, records what became of every message
 * and commits.  A full batch is followed at once by the next; otherwise the
 * worker sleeps on its latch, which every transaction that enqueues sets at
 * commit, until then or until the next retry is due.
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
	TURN_PARTIAL_BATCH,			/* the outbox is drained for now */
	TURN_FULL_BATCH				/* there may be more: go again at once */
} TurnResult;

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
 * it with HASH_ENTER; returns whether it was there.  Two keys that share a hash hold each other back, which costs a
 * message a turn of the loop and breaks no order.
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
 * Produce a claimed batch and wait for its delivery reports, keeping
 * per-key order: once a message of a key is not delivered, the later
 * messages of that key in the batch are not produced, or, if they were,
 * neither recorded as delivered ahead of it nor charged an attempt: they stay
 * as they were, and the claim holds them back until their turn.  Returns
 * false if the producer must be made anew.
 */
static bool
publish_batch(OutboxProducer *producer, OutboxMessage *messages, int count)
{
	HTAB	   *held = make_key_set(count);
	bool		healthy;

	for (int i = 0; i < count; i++)
	{
		OutboxMessage *m = &messages[i];

		if (lookup_held_key(held, m, HASH_FIND))
			continue;			/* outcome stays DELIVERY_NOT_SENT */
		producer_produce(producer, m);
		if (m->outcome == DELIVERY_RETRY || m->outcome == DELIVERY_NOT_SENT)
			(void) lookup_held_key(held, m, HASH_ENTER);
	}

	if (pg_atomic_exchange_u32(&outbox_shared->worker.simulate_fatal_error, 0))
		producer_simulate_fatal_error(producer);

	healthy = producer_await_deliveries(producer);

	hash_destroy(held);
	held = make_key_set(count);
	for (int i = 0; i < count; i++)
	{
		OutboxMessage *m = &messages[i];

		if (m->outcome == DELIVERY_PENDING)
			m->outcome = DELIVERY_NOT_SENT;
		if ((m->outcome == DELIVERY_OK || m->outcome == DELIVERY_RETRY) &&
			lookup_held_key(held, m, HASH_FIND))
			m->outcome = DELIVERY_NOT_SENT; /* its turn comes after the held one */
		else if (m->outcome == DELIVERY_RETRY || m->outcome == DELIVERY_NOT_SENT)
			(void) lookup_held_key(held, m, HASH_ENTER);
	}
	hash_destroy(held);
	return healthy && !producer_failed_fatally(producer);
}

/*
 * One turn: in one transaction, purge old sent rows, claim a batch, publish
 * it and record the outcome.  *producer is destroyed (and set to NULL) if
 * it must be made anew.  *next_retry_ms is set to the time until the next
 * retry is due, or -1.
 */
static TurnResult
publish_one_batch(OutboxProducer **producer, MemoryContext batch_context,
				  long *next_retry_ms)
{
	TurnResult	result = TURN_PARTIAL_BATCH;
	OutboxMessage *messages;
	int			count;

	*next_retry_ms = -1;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "outbox: SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "outbox: claiming a batch");

	if (!store_find_extension())
		result = TURN_NO_EXTENSION;
	else
	{
		MemoryContext caller;

		if (outbox_sent_retention > 0)
			store_purge_sent();

		caller = MemoryContextSwitchTo(batch_context);
		count = store_claim_batch(&messages, outbox_batch_size);
		if (count > 0)
		{
			outbox_report_state(OUTBOX_WORKER_PUBLISHING);
			pgstat_report_activity(STATE_RUNNING, "outbox: publishing a batch");
			if (!publish_batch(*producer, messages, count))
			{
				/* before the batch's memory goes: reports may still be owed */
				producer_destroy(*producer);
				*producer = NULL;
			}
			store_record_outcomes(messages, count);
		}
		MemoryContextSwitchTo(caller);

		if (count == outbox_batch_size)
			result = TURN_FULL_BATCH;
		else
			*next_retry_ms = store_ms_until_next_retry();
	}

	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	/* Without the extension there is no outbox_worker view to say so. */
	pgstat_report_activity(STATE_IDLE,
						   result == TURN_NO_EXTENSION ? "outbox: waiting for CREATE EXTENSION outbox" : NULL);
	MemoryContextReset(batch_context);
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
	MemoryContext batch_context;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	attach_to_slot();
	connect_to_database();

	batch_context = AllocSetContextCreate(TopMemoryContext, "outbox batch",
										  ALLOCSET_DEFAULT_SIZES);

	while (!ShutdownRequestPending)
	{
		long		timeout_ms = outbox_poll_interval;
		long		next_retry_ms;

		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

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

		switch (publish_one_batch(&producer, batch_context, &next_retry_ms))
		{
			case TURN_NO_EXTENSION:
				outbox_report_state(OUTBOX_WORKER_WAITING_FOR_EXTENSION);
				break;
			case TURN_FULL_BATCH:
				continue;
			case TURN_PARTIAL_BATCH:
				outbox_report_state(OUTBOX_WORKER_IDLE);
				if (next_retry_ms >= 0)
					timeout_ms = Min(timeout_ms, next_retry_ms);
				break;
		}
		wait_for_wake(timeout_ms);
	}

	producer_destroy(producer);
	proc_exit(0);
}

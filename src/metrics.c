/*-------------------------------------------------------------------------
 *
 * metrics.c
 *	  Per-topic delivery metrics: each publisher counts the messages Kafka
 *	  acknowledged, by topic, in a histogram of their commit-to-ack latency,
 *	  in shared memory; outbox_topic_metrics() (behind outbox_status) reads
 *	  the last minute of it: how many were sent, how many per second, and
 *	  the latency's 50th and 99th percentiles.  This file is the only one
 *	  that touches that memory.
 *
 * What the latency measures.  From the moment a message could first be
 * published to the moment its publisher has Kafka's acknowledgement in
 * hand (one clock reading per batch, once every delivery report of the
 * batch is in; for a batch in flight that is after the next claim, so the
 * figure is the true one or at most a claim's time above it):
 *
 * - a message at its first attempt: the commit of the transaction that
 *   inserted it (its xmin's commit timestamp) when track_commit_timestamp
 *   is on and knows that transaction; otherwise its created_at, the clock
 *   time of its INSERT, which is earlier by the rest of its transaction;
 * - a delayed message (deliver_after, deliver_at) at its first attempt:
 *   the later of that and the time it was due, so that the delay the
 *   application asked for is not counted;
 * - a message at its second or later attempt: its created_at, so that the
 *   failed attempts and their backoff are counted.
 *
 * Layout.  One DatabaseMetrics per publisher slot (outbox.max_workers of
 * them, numbered as worker_slot.c numbers its slots), for the database its
 * last publisher served.  It names up to METRICS_MAX_TOPICS topics, the
 * deliveries of any other counting in one more row (METRICS_OTHER_TOPICS);
 * a named topic's place goes to another once nothing of it has been counted
 * for a minute.  Time is cut into windows of METRICS_WINDOW_SECONDS, and a
 * ring of METRICS_WINDOWS of them holds, per topic, a count per latency
 * bucket; a window is emptied when the ring comes round to it.  The
 * buckets are log-scale, four per doubling (each at most 25% wide), from
 * LATENCY_FLOOR_EXP (128 us: bucket 0 holds all below) to
 * 2^(LATENCY_CEILING_EXP + 1) us (19 hours: the last bucket holds all
 * above).  "The last minute" is the window now running and the
 * METRICS_WINDOWS - 1 before it, 50 to 60 seconds; the rate is the count
 * over exactly that span.
 *
 * Locking rule.  Each DatabaseMetrics has an LWLock, taken with no other
 * lock held.  Its publisher, the only process that writes it, takes it
 * exclusively once per batch recorded, for as long as adding the batch's
 * deliveries takes (every topic row and bucket worked out before, the
 * names of topics new to it copied in); readers take it shared, for as
 * long as adding up a minute of one database's topics takes, into memory
 * allocated before.  Neither allocates, reports or calls out under it.
 * The publisher reads its own DatabaseMetrics without the lock (no one
 * else writes it), and keeps its topics' rows in a local hash table, so
 * that a delivery costs no string comparison in shared memory.  A reader
 * reads each part's database once without the lock, only to size its
 * memory, and again under it.  A publisher attaching to a slot last used
 * for another database empties it first (metrics_attach()).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/commit_ts.h"
#include "access/transam.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/pg_bitutils.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "metrics.h"
#include "settings.h"

PG_FUNCTION_INFO_V1(outbox_topic_metrics);

#define METRICS_WINDOWS 6
#define METRICS_WINDOW_SECONDS 10
#define METRICS_WINDOW_USECS ((int64) METRICS_WINDOW_SECONDS * USECS_PER_SEC)

/* Four buckets per doubling, from 2^LATENCY_FLOOR_EXP to 2^(LATENCY_CEILING_EXP + 1) us. */
#define LATENCY_SUB_BITS 2
#define LATENCY_SUB_BUCKETS (1 << LATENCY_SUB_BITS)
#define LATENCY_FLOOR_EXP 7
#define LATENCY_CEILING_EXP 35
#define LATENCY_BUCKETS (1 + (LATENCY_CEILING_EXP - LATENCY_FLOOR_EXP + 1) * LATENCY_SUB_BUCKETS)

/* The rows of a DatabaseMetrics: the named topics, then the others'. */
#define METRICS_ROWS (METRICS_MAX_TOPICS + 1)
#define OTHER_TOPICS_ROW METRICS_MAX_TOPICS

#define TOPIC_NAME_SIZE (KAFKA_MAX_TOPIC_LENGTH + 1)

/* No window: below every window's number. */
#define NO_WINDOW PG_INT64_MIN

typedef struct TopicRow
{
	char		name[TOPIC_NAME_SIZE];	/* "" while unused; unused for the others' */
	int64		last_window;	/* the number of the last window it was counted in */
} TopicRow;

typedef struct MetricsWindow
{
	int64		number;			/* which window of time: its start / METRICS_WINDOW_USECS */
	uint32		counts[METRICS_ROWS][LATENCY_BUCKETS];
} MetricsWindow;

typedef struct DatabaseMetrics
{
	LWLock	   *lock;
	Oid			database;		/* InvalidOid: never used */
	TopicRow	topics[METRICS_ROWS];
	MetricsWindow windows[METRICS_WINDOWS];
} DatabaseMetrics;

typedef struct MetricsShared
{
	int			count;
	DatabaseMetrics parts[FLEXIBLE_ARRAY_MEMBER];
} MetricsShared;

static MetricsShared *metrics = NULL;

/* In a publisher: its part, and the rows its topics have there. */
static DatabaseMetrics *my_metrics = NULL;
static HTAB *my_topic_rows = NULL;

typedef struct TopicRowEntry
{
	char		name[TOPIC_NAME_SIZE];	/* the hash key */
	int			row;
} TopicRowEntry;

/* The transaction whose commit timestamp was last looked up, and it. */
static TransactionId last_xid = InvalidTransactionId;
static TimestampTz last_commit_time = 0;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static Size
metrics_shared_size(void)
{
	return add_size(offsetof(MetricsShared, parts),
					mul_size(sizeof(DatabaseMetrics), outbox_max_workers));
}

static void
metrics_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(metrics_shared_size()));
	RequestNamedLWLockTranche("outbox metrics", outbox_max_workers);
}

static void
metrics_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	metrics = ShmemInitStruct("outbox metrics", metrics_shared_size(), &found);
	if (!found)
	{
		LWLockPadded *locks = GetNamedLWLockTranche("outbox metrics");

		memset(metrics, 0, metrics_shared_size());
		metrics->count = outbox_max_workers;
		for (int i = 0; i < metrics->count; i++)
		{
			DatabaseMetrics *part = &metrics->parts[i];

			part->lock = &locks[i].lock;
			for (int w = 0; w < METRICS_WINDOWS; w++)
				part->windows[w].number = NO_WINDOW;
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/* Ask for the shared memory; in _PG_init, once the settings are defined. */
void
metrics_init(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = metrics_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = metrics_shmem_startup;
}

/* The latency bucket of a latency in microseconds. */
static int
latency_bucket(int64 usecs)
{
	int			exponent;

	if (usecs < (INT64CONST(1) << LATENCY_FLOOR_EXP))
		return 0;
	exponent = pg_leftmost_one_pos64((uint64) usecs);
	if (exponent > LATENCY_CEILING_EXP)
		return LATENCY_BUCKETS - 1;
	return 1 + (exponent - LATENCY_FLOOR_EXP) * LATENCY_SUB_BUCKETS +
		(int) ((usecs >> (exponent - LATENCY_SUB_BITS)) & (LATENCY_SUB_BUCKETS - 1));
}

/* The latencies a bucket holds, in microseconds: from *lower to *upper. */
static void
bucket_bounds(int bucket, double *lower, double *upper)
{
	int			exponent = LATENCY_FLOOR_EXP + (bucket - 1) / LATENCY_SUB_BUCKETS;
	int			sub = (bucket - 1) % LATENCY_SUB_BUCKETS;

	if (bucket == 0)
	{
		*lower = 0;
		*upper = (double) (INT64CONST(1) << LATENCY_FLOOR_EXP);
		return;
	}
	*lower = (double) ((int64) (LATENCY_SUB_BUCKETS + sub) << (exponent - LATENCY_SUB_BITS));
	*upper = (double) ((int64) (LATENCY_SUB_BUCKETS + sub + 1) << (exponent - LATENCY_SUB_BITS));
}

/*
 * Take this publisher's part (the one of its slot) for database, emptied if
 * it last held another database's, and learn which rows its topics have.
 */
void
metrics_attach(int slot, Oid database)
{
	HASHCTL		ctl;

	if (slot < 0 || slot >= metrics->count)
		elog(FATAL, "outbox: metrics slot %d does not exist", slot);
	my_metrics = &metrics->parts[slot];

	LWLockAcquire(my_metrics->lock, LW_EXCLUSIVE);
	if (my_metrics->database != database)
	{
		memset(my_metrics->topics, 0, sizeof(my_metrics->topics));
		for (int w = 0; w < METRICS_WINDOWS; w++)
			my_metrics->windows[w].number = NO_WINDOW;
		my_metrics->database = database;
	}
	LWLockRelease(my_metrics->lock);

	ctl.keysize = TOPIC_NAME_SIZE;
	ctl.entrysize = sizeof(TopicRowEntry);
	ctl.hcxt = TopMemoryContext;
	my_topic_rows = hash_create("outbox metrics topics", METRICS_MAX_TOPICS, &ctl,
								HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	for (int row = 0; row < METRICS_MAX_TOPICS; row++)
	{
		TopicRowEntry *entry;

		if (my_metrics->topics[row].name[0] == '\0')
			continue;
		entry = hash_search(my_topic_rows, my_metrics->topics[row].name, HASH_ENTER, NULL);
		entry->row = row;
	}
}

/*
 * When a claimed message's latency starts (see the header comment): from
 * its inserting transaction's xmin, its created_at, the failed attempts
 * before this one, and the time it was due if it was delayed (else
 * DT_NOBEGIN).  A commit timestamp is looked up once per transaction in a
 * row.  A commit comes after its inserts, so an earlier one (the clock
 * set back) is not believed.
 */
TimestampTz
metrics_latency_start(TransactionId xmin, TimestampTz created_at, int attempts,
					  TimestampTz due_at)
{
	TimestampTz start = created_at;

	if (attempts > 0)
		return created_at;
	if (track_commit_timestamp && TransactionIdIsNormal(xmin))
	{
		if (!TransactionIdEquals(xmin, last_xid))
		{
			if (!TransactionIdGetCommitTsData(xmin, &last_commit_time, NULL))
				last_commit_time = 0;
			last_xid = xmin;
		}
		if (last_commit_time != 0)
			start = Max(start, last_commit_time);
	}
	return Max(start, due_at);
}

/*
 * The row of this topic in the publisher's part, taking one for it if it
 * has none: a free one, or one of a topic not counted in the last minute
 * (whose counts are all in windows no reader adds any longer), or else the
 * others' row.  The name of a row taken is written into shared memory by
 * the caller, under the lock, from named[row].
 */
static int
topic_row(const char *topic, int64 window, const char **named)
{
	TopicRowEntry *entry;
	bool		found;
	int			row;

	if (strlen(topic) >= TOPIC_NAME_SIZE)
		return OTHER_TOPICS_ROW;
	entry = hash_search(my_topic_rows, topic, HASH_FIND, &found);
	if (found)
		return entry->row;

	for (row = 0; row < METRICS_MAX_TOPICS; row++)
	{
		TopicRow   *t = &my_metrics->topics[row];

		if (named[row] != NULL)
			continue;			/* taken in this batch */
		if (t->name[0] == '\0' || t->last_window <= window - METRICS_WINDOWS)
			break;
	}
	if (row == METRICS_MAX_TOPICS)
		return OTHER_TOPICS_ROW;

	if (my_metrics->topics[row].name[0] != '\0')
		(void) hash_search(my_topic_rows, my_metrics->topics[row].name, HASH_REMOVE, NULL);
	entry = hash_search(my_topic_rows, topic, HASH_ENTER, NULL);
	entry->row = row;
	named[row] = topic;
	return row;
}

/*
 * Count the delivered messages of a batch recorded at settled_at (those
 * DELIVERY_OK), by topic and latency to their acknowledgement: the rows and
 * buckets are worked out first, then added in one short hold of the lock.
 */
void
metrics_count_deliveries(const OutboxMessage *messages, int count, TimestampTz settled_at)
{
	int64		window = settled_at / METRICS_WINDOW_USECS;
	MetricsWindow *w;
	const char *named[METRICS_MAX_TOPICS] = {0};
	int		   *rows;
	int		   *buckets;
	int			delivered = 0;
	const char *last_topic = NULL;

	if (my_metrics == NULL || count == 0)
		return;
	rows = palloc(sizeof(int) * count);
	buckets = palloc(sizeof(int) * count);
	for (int i = 0; i < count; i++)
	{
		const OutboxMessage *m = &messages[i];

		if (m->outcome != DELIVERY_OK)
			continue;
		/* a batch's messages mostly come in runs of one topic */
		if (last_topic != NULL && strcmp(m->topic, last_topic) == 0)
			rows[delivered] = rows[delivered - 1];
		else
			rows[delivered] = topic_row(m->topic, window, named);
		last_topic = m->topic;
		buckets[delivered] = latency_bucket(Max(m->acked_at - m->latency_from, 0));
		delivered++;
	}

	if (delivered > 0)
	{
		LWLockAcquire(my_metrics->lock, LW_EXCLUSIVE);
		w = &my_metrics->windows[window % METRICS_WINDOWS];
		if (w->number != window)
		{
			memset(w->counts, 0, sizeof(w->counts));
			w->number = window;
		}
		for (int row = 0; row < METRICS_MAX_TOPICS; row++)
			if (named[row] != NULL)
				strlcpy(my_metrics->topics[row].name, named[row], TOPIC_NAME_SIZE);
		for (int i = 0; i < delivered; i++)
		{
			w->counts[rows[i]][buckets[i]]++;
			my_metrics->topics[rows[i]].last_window = window;
		}
		LWLockRelease(my_metrics->lock);
	}
	pfree(rows);
	pfree(buckets);
}

/* One topic's last minute, as a reader adds it up. */
typedef struct TopicMinute
{
	char		name[TOPIC_NAME_SIZE];
	uint64		counts[LATENCY_BUCKETS];
} TopicMinute;

/*
 * Add up the windows from first_window on of a part's topics into minutes
 * (METRICS_ROWS of them at most); returns how many.  Called with the part's
 * lock held shared: it only adds and copies.
 */
static int
add_up_minute(const DatabaseMetrics *part, int64 first_window, TopicMinute *minutes)
{
	int			count = 0;

	Assert(LWLockHeldByMeInMode(part->lock, LW_SHARED));
	for (int row = 0; row < METRICS_ROWS; row++)
	{
		const TopicRow *t = &part->topics[row];
		TopicMinute *minute = &minutes[count];

		if (t->last_window < first_window ||
			(row != OTHER_TOPICS_ROW && t->name[0] == '\0'))
			continue;
		strlcpy(minute->name, row == OTHER_TOPICS_ROW ? METRICS_OTHER_TOPICS : t->name,
				TOPIC_NAME_SIZE);
		memset(minute->counts, 0, sizeof(minute->counts));
		for (int w = 0; w < METRICS_WINDOWS; w++)
		{
			const MetricsWindow *window = &part->windows[w];

			if (window->number < first_window)
				continue;
			for (int b = 0; b < LATENCY_BUCKETS; b++)
				minute->counts[b] += window->counts[row][b];
		}
		count++;
	}
	return count;
}

/*
 * Merge the minutes of a topic counted in more than one part (its
 * database's publisher moved to another slot within the minute) into the
 * first of them; returns how many are left.
 */
static int
merge_minutes(TopicMinute *minutes, int count)
{
	int			kept = 0;

	for (int i = 0; i < count; i++)
	{
		int			same = 0;

		while (same < kept && strcmp(minutes[same].name, minutes[i].name) != 0)
			same++;
		if (same == kept)
		{
			if (i != kept)
				minutes[kept] = minutes[i];
			kept++;
			continue;
		}
		for (int b = 0; b < LATENCY_BUCKETS; b++)
			minutes[same].counts[b] += minutes[i].counts[b];
	}
	return kept;
}

/*
 * The latency below which a share q of the counted messages fall, in
 * microseconds: linear within the bucket where that rank falls, as
 * Prometheus's histogram_quantile() reads a histogram.
 */
static double
latency_quantile(const uint64 *counts, uint64 total, double q)
{
	double		rank = q * (double) total;
	uint64		below = 0;
	double		lower;
	double		upper;

	for (int b = 0; b < LATENCY_BUCKETS; b++)
	{
		if (counts[b] == 0)
			continue;
		if ((double) (below + counts[b]) >= rank)
		{
			bucket_bounds(b, &lower, &upper);
			return lower + (upper - lower) * (rank - (double) below) / (double) counts[b];
		}
		below += counts[b];
	}
	bucket_bounds(LATENCY_BUCKETS - 1, &lower, &upper);
	return upper;
}

static Datum
interval_of_usecs(double usecs)
{
	Interval   *interval = palloc0(sizeof(Interval));

	interval->time = (TimeOffset) rint(usecs);
	return IntervalPGetDatum(interval);
}

/* The columns of outbox_topic_metrics(), as the install script declares them. */
typedef enum TopicMetricsColumn
{
	COL_TOPIC,
	COL_SENT_LAST_MINUTE,
	COL_SENT_PER_SECOND,
	COL_LATENCY_P50,
	COL_LATENCY_P99,
	NUM_TOPIC_METRICS_COLUMNS
} TopicMetricsColumn;

/*
 * One row per topic of this database that Kafka acknowledged messages of in
 * the last minute (see the header comment for what that is), the others'
 * row among them if any were counted there: how many, how many per second,
 * and their latency's 50th and 99th percentiles.
 */
Datum
outbox_topic_metrics(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TimestampTz now = GetCurrentTimestamp();
	int64		first_window = now / METRICS_WINDOW_USECS - (METRICS_WINDOWS - 1);
	double		span_seconds = (double) (now - first_window * METRICS_WINDOW_USECS) / USECS_PER_SEC;
	TopicMinute *minutes;
	int			count = 0;
	int			room = 0;
	int			parts = 0;

	InitMaterializedSRF(fcinfo, 0);

	/* room for each part that may be this database's, allocated before any lock */
	for (int i = 0; i < metrics->count; i++)
		room += metrics->parts[i].database == MyDatabaseId;
	minutes = palloc(sizeof(TopicMinute) * METRICS_ROWS * Max(room, 1));
	for (int i = 0; i < metrics->count && parts < room; i++)
	{
		DatabaseMetrics *part = &metrics->parts[i];

		LWLockAcquire(part->lock, LW_SHARED);
		if (part->database == MyDatabaseId)
		{
			count += add_up_minute(part, first_window, &minutes[count]);
			parts++;
		}
		LWLockRelease(part->lock);
	}
	if (parts > 1)
		count = merge_minutes(minutes, count);

	for (int i = 0; i < count; i++)
	{
		Datum		values[NUM_TOPIC_METRICS_COLUMNS];
		bool		nulls[NUM_TOPIC_METRICS_COLUMNS] = {0};
		uint64		sent = 0;

		for (int b = 0; b < LATENCY_BUCKETS; b++)
			sent += minutes[i].counts[b];
		if (sent == 0)
			continue;
		values[COL_TOPIC] = CStringGetTextDatum(minutes[i].name);
		values[COL_SENT_LAST_MINUTE] = Int64GetDatum((int64) sent);
		values[COL_SENT_PER_SECOND] = Float8GetDatum((double) sent / span_seconds);
		values[COL_LATENCY_P50] = interval_of_usecs(latency_quantile(minutes[i].counts, sent, 0.50));
		values[COL_LATENCY_P99] = interval_of_usecs(latency_quantile(minutes[i].counts, sent, 0.99));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

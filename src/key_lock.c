/*-------------------------------------------------------------------------
 *
 * key_lock.c
 *	  The locks that order concurrent enqueues of one (topic, key): a
 *	  bounded number per transaction, named by a keyed hash.
 *
 * A transaction that enqueues for a (topic, key) holds, until it ends, a lock
 * that every other transaction enqueueing for the same pair waits for, and
 * the message's id is drawn while it is held.  Ids of one key then follow
 * commit order, and the worker, which publishes in id order, never publishes
 * a message of a key while an earlier one is still uncommitted.
 *
 * One lock per pair would let one transaction of many keys fill PostgreSQL's
 * shared lock table, after which every new connection fails with "out of
 * shared memory".  So the locks come in two sizes, as in a lock hierarchy of
 * several granularities:
 *
 * - The first KEY_LOCKS_EXACT pairs a transaction enqueues get an exact lock
 *   each (ExclusiveLock, on the pair's hash), under an intention lock on
 *   the pair's bucket, one of KEY_LOCK_BUCKETS (RowExclusiveLock, which does
 *   not conflict with itself).  Two such transactions wait for each other
 *   only if they enqueue the same pair.
 * - Any further pair of that transaction takes its bucket in ExclusiveLock,
 *   which conflicts with both modes: it waits for, and then holds back,
 *   every transaction that enqueues any pair of that bucket.
 *
 * Either way no two transactions can hold the locks of one pair at once.
 *
 * The hash is SipHash-2-4 under a key drawn at random whenever shared memory
 * is made (server start, and restart after a crash, when no transaction
 * survives that could hold a lock).  So no role can compute which pairs
 * share a bucket or an exact lock with another role's pairs (it could only
 * try pairs and watch pg_locks, which every role may read), and the lock
 * tags in pg_locks say nothing about the pairs they stand for.  A fast hash
 * with a seed (PostgreSQL's hash_bytes_extended()) is not enough for this:
 * such hashes have collisions that hold for every seed.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"

#include "key_lock.h"

/*
 * How many pairs of one transaction get an exact lock, and how many buckets
 * the rest share.  A transaction holds at most KEY_LOCKS_EXACT +
 * KEY_LOCK_BUCKETS = 48 of these locks whatever it enqueues: fewer than the
 * 64 entries per backend (max_locks_per_transaction) that PostgreSQL sizes
 * its shared lock table for.  With the default settings the table has
 * 64 * (100 connections + 3 autovacuum workers + their launcher + 8 worker
 * processes + 10 WAL senders) = 7,808 entries; if every one of those 122
 * backends held its 48 at once, they would take 5,856 and leave the rest.
 *
 * 16 exact pairs cover business transactions (a registration enqueues two or
 * three), which then wait only for transactions that enqueue the same pair,
 * as with a lock per pair, and deadlock only as that would.  The cost of
 * buckets falls on larger transactions: each pair beyond the 16th waits for
 * every transaction holding a pair of its bucket, and a transaction of about
 * a hundred pairs holds nearly all 32 buckets, so that every other enqueue
 * of the database waits until it ends.  More buckets would spread a
 * transaction of a few hundred pairs thinner, but would let each
 * transaction take more of the lock table than its share.
 */
#define KEY_LOCKS_EXACT 16
#define KEY_LOCK_BUCKETS 32

/*
 * The extension's locks are told apart from the application's own advisory
 * locks (which use 1 and 2) by these values in the lock tag's last field.
 */
#define KEY_LOCK_TAG_EXACT 0x4f42
#define KEY_LOCK_TAG_BUCKET 0x4f43

/* SipHash's initialization constants ("somepseudorandomlygeneratedbytes"). */
#define SIPHASH_IV0 UINT64CONST(0x736f6d6570736575)
#define SIPHASH_IV1 UINT64CONST(0x646f72616e646f6d)
#define SIPHASH_IV2 UINT64CONST(0x6c7967656e657261)
#define SIPHASH_IV3 UINT64CONST(0x7465646279746573)
#define SIPHASH_WORD 8

/* The key of the hash, in shared memory so that every backend uses one. */
typedef struct KeyLockShared
{
	uint64		hash_key[2];
} KeyLockShared;

static KeyLockShared *key_lock_shared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/*
 * The exact locks this transaction has taken.  A subtransaction's abort
 * releases its locks and leaves this count as it was: it can only overcount,
 * so the bound holds.
 */
static int	exact_locks_taken = 0;

/* SipHash-2-4 (Aumasson and Bernstein, 2012), fed in pieces. */
typedef struct SipHash
{
	uint64		v0,
				v1,
				v2,
				v3;
	uint64		partial;		/* bytes of the word not yet complete */
	uint64		length;			/* bytes fed so far */
} SipHash;

#define ROTL64(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

static inline void
sip_round(SipHash *s)
{
	s->v0 += s->v1;
	s->v1 = ROTL64(s->v1, 13);
	s->v1 ^= s->v0;
	s->v0 = ROTL64(s->v0, 32);
	s->v2 += s->v3;
	s->v3 = ROTL64(s->v3, 16);
	s->v3 ^= s->v2;
	s->v0 += s->v3;
	s->v3 = ROTL64(s->v3, 21);
	s->v3 ^= s->v0;
	s->v2 += s->v1;
	s->v1 = ROTL64(s->v1, 17);
	s->v1 ^= s->v2;
	s->v2 = ROTL64(s->v2, 32);
}

static inline void
sip_compress(SipHash *s, uint64 word)
{
	s->v3 ^= word;
	sip_round(s);
	sip_round(s);
	s->v0 ^= word;
}

static void
siphash_init(SipHash *s, const uint64 key[2])
{
	s->v0 = key[0] ^ SIPHASH_IV0;
	s->v1 = key[1] ^ SIPHASH_IV1;
	s->v2 = key[0] ^ SIPHASH_IV2;
	s->v3 = key[1] ^ SIPHASH_IV3;
	s->partial = 0;
	s->length = 0;
}

/* Feed bytes; words are read little-endian, as SipHash defines them. */
static void
siphash_update(SipHash *s, const unsigned char *data, size_t len)
{
	const unsigned char *end = data + len;

	while (data < end)
	{
		if (s->length % SIPHASH_WORD == 0 && end - data >= SIPHASH_WORD)
		{
			uint64		word = 0;

			for (int i = SIPHASH_WORD - 1; i >= 0; i--)
				word = (word << 8) | data[i];
			sip_compress(s, word);
			data += SIPHASH_WORD;
			s->length += SIPHASH_WORD;
			continue;
		}
		s->partial |= (uint64) *data++ << (8 * (s->length % SIPHASH_WORD));
		if (++s->length % SIPHASH_WORD == 0)
		{
			sip_compress(s, s->partial);
			s->partial = 0;
		}
	}
}

static uint64
siphash_final(SipHash *s)
{
	sip_compress(s, s->partial | (s->length << 56));
	s->v2 ^= 0xff;
	for (int i = 0; i < 4; i++)
		sip_round(s);
	return s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

/* The hash of a (topic, key) pair under the key of this server's start. */
static uint64
pair_hash(text *topic, text *key)
{
	SipHash		s;
	uint32		topic_len = VARSIZE_ANY_EXHDR(topic);
	unsigned char topic_len_bytes[sizeof(uint32)];

	/* the topic's length first, so that no two pairs feed the same bytes */
	for (int i = 0; i < (int) sizeof(uint32); i++)
		topic_len_bytes[i] = (topic_len >> (8 * i)) & 0xff;

	siphash_init(&s, key_lock_shared->hash_key);
	siphash_update(&s, topic_len_bytes, sizeof(topic_len_bytes));
	siphash_update(&s, (const unsigned char *) VARDATA_ANY(topic), topic_len);
	siphash_update(&s, (const unsigned char *) VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key));
	return siphash_final(&s);
}

/*
 * Hold the locks that order enqueues of this (topic, key) until the end of
 * the transaction; see the header comment.  The caller draws the message's
 * id once they are held.
 */
void
key_lock_acquire(text *topic, text *key)
{
	uint64		h = pair_hash(topic, key);
	LOCKTAG		exact;
	LOCKTAG		bucket;

	SET_LOCKTAG_ADVISORY(exact, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 KEY_LOCK_TAG_EXACT);
	SET_LOCKTAG_ADVISORY(bucket, MyDatabaseId, 0, (uint32) (h % KEY_LOCK_BUCKETS),
						 KEY_LOCK_TAG_BUCKET);

	if (LockHeldByMe(&exact, ExclusiveLock))
		return;

	if (exact_locks_taken < KEY_LOCKS_EXACT)
	{
		/* the intention first, so that a bucket's holder sees it */
		(void) LockAcquire(&bucket, RowExclusiveLock, false, false);
		(void) LockAcquire(&exact, ExclusiveLock, false, false);
		exact_locks_taken++;
		return;
	}

	(void) LockAcquire(&bucket, ExclusiveLock, false, false);
}

/* The end of a transaction releases its locks: count afresh. */
static void
forget_locks_at_transaction_end(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			exact_locks_taken = 0;
			break;
		default:
			break;
	}
}

static void
key_lock_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(KeyLockShared)));
}

/*
 * Draw the hash's key when shared memory is made, in the postmaster: its
 * children inherit the pointer or, started with EXEC_BACKEND, find the
 * struct made.
 */
static void
key_lock_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	key_lock_shared = ShmemInitStruct("outbox key locks", sizeof(KeyLockShared), &found);
	if (!found && !pg_strong_random(key_lock_shared->hash_key, sizeof(key_lock_shared->hash_key)))
		ereport(FATAL,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("outbox: could not generate the key of its lock hash")));
	LWLockRelease(AddinShmemInitLock);
}

/* Ask for the shared memory and count locks per transaction; in _PG_init. */
void
key_lock_init(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = key_lock_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = key_lock_shmem_startup;
	RegisterXactCallback(forget_locks_at_transaction_end, NULL);
}

/*-------------------------------------------------------------------------
 *
 * key_lock.c
 *	  What orders concurrent enqueues of one (topic, key): a lock per pair
 *	  for a transaction's first pairs, a shared table of the pairs held for
 *	  its further ones, each named by a keyed hash.
 *
 * A transaction that enqueues for a (topic, key) holds the pair until it
 * ends: every other transaction enqueueing for the same pair waits for it,
 * and the message's id is drawn while it is held.  Ids of one key then
 * follow commit order, and the worker, which publishes in id order, never
 * publishes a message of a key while an earlier one is still uncommitted.
 *
 * One lock per pair would let one transaction of many keys fill PostgreSQL's
 * shared lock table, after which every new connection fails with "out of
 * shared memory".  So a transaction holds its pairs in one of three ways:
 *
 * - Its first KEY_LOCKS_EXACT pairs get an exact lock each (ExclusiveLock,
 *   on the pair's hash), under an intention lock on the pair's bucket, one
 *   of KEY_LOCK_BUCKETS (RowExclusiveLock, which does not conflict with
 *   itself).
 * - Its further pairs are entered, with its transaction id, in a table of
 *   held pairs in shared memory (room for KEY_LOCK_HELD_PAIRS in all), under
 *   the same intention lock on the pair's bucket.  Whoever finds there a
 *   pair held by a transaction still in progress waits for that transaction
 *   to end (on its transaction id, as a row lock's waiter does, so that the
 *   deadlock detector sees the wait).
 * - When that table is full, a further pair takes its bucket in
 *   ExclusiveLock, which conflicts with both other modes: it waits for, and
 *   then holds back, every transaction that holds any pair of that bucket.
 *
 * A transaction of a hundred thousand keys thus makes wait only the
 * transactions that enqueue one of its keys, as a lock per pair would.
 *
 * No two transactions hold one pair at once: an exact locker takes its lock
 * first and then looks the pair up in the table; an entrant enters the pair
 * first and then waits for its exact lock to be free (taking and releasing
 * it).  Whichever of the two comes second sees the first.  An exact locker
 * that finds the pair entered releases its exact lock before it waits (the
 * entrant may be waiting for that lock), and tries again once the entrant
 * has ended.  An entry is removed once its transaction has ended, which is
 * after its rows are visible; an entry whose transaction has ended counts
 * for nothing, and the next entrant of its pair takes it over; a transaction
 * that finds the table full removes such entries first (once).
 *
 * A prepared transaction keeps its entries (it is in progress until COMMIT
 * PREPARED), as it keeps its locks.  Neither holds its pairs across a
 * restart: the table is made anew, and the locks PostgreSQL restores for
 * it bear the hashes of the key drawn before, which no pair has any more.
 *
 * The hash is SipHash-2-4 under a key drawn at random whenever shared memory
 * is made (server start, and restart after a crash, when no transaction
 * survives that could hold a lock but a prepared one: see above).  So no role can compute which pairs
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
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "key_lock.h"
#include "pg_compat.h"

/*
 * How many pairs of one transaction get an exact lock, and how many buckets
 * share the rest.  A transaction holds at most KEY_LOCKS_EXACT +
 * KEY_LOCK_BUCKETS = 48 of these locks whatever it enqueues: fewer than the
 * 64 entries per backend (max_locks_per_transaction) that PostgreSQL sizes
 * its shared lock table for.  With the default settings the table has
 * 64 * (100 connections + 3 autovacuum workers + their launcher + 8 worker
 * processes + 10 WAL senders) = 7,808 entries; if every one of those 122
 * backends held its 48 at once, they would take 5,856 and leave the rest.
 *
 * 16 exact pairs cover business transactions (a registration enqueues two or
 * three), whose pairs then cost no entry of the table of held pairs.
 */
#define KEY_LOCKS_EXACT 16
#define KEY_LOCK_BUCKETS 32

/*
 * Room in the table of held pairs, for all transactions of the server
 * together: a transaction of a hundred thousand keys fits beside others, in
 * about 6 MB of shared memory (hash_estimate_size(): 40 bytes an entry with
 * dynahash's header, and a bucket pointer each).  Past it, pairs fall back
 * to buckets, as they all did before the table was there.  The table is
 * split in KEY_LOCK_PARTITIONS, each under a lock of its own, as
 * PostgreSQL's lock table is.
 */
#define KEY_LOCK_HELD_PAIRS (1 << 17)
#define KEY_LOCK_PARTITIONS 16

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

/*
 * An entry of the table of held pairs: the pair's hash in its database (the
 * table serves every database, as the lock table does), and its holder.
 */
typedef struct HeldPairTag
{
	uint64		pair;
	Oid			database;
	uint32		zero;			/* hashed with the rest: never left unset */
} HeldPairTag;

typedef struct HeldPair
{
	HeldPairTag tag;
	TransactionId holder;
} HeldPair;

static HTAB *held_pairs = NULL;
static LWLockPadded *held_pair_locks = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/*
 * The exact locks this transaction has taken.  A subtransaction's abort
 * releases its locks and leaves this count as it was: it can only overcount,
 * so the bound holds.
 */
static int	exact_locks_taken = 0;

/*
 * The pairs this transaction entered in the table of held pairs, to remove
 * at its end, and its transaction id, which they carry.
 */
static uint64 *pairs_entered = NULL;
static int	pairs_entered_count = 0;
static int	pairs_entered_space = 0;
static TransactionId pairs_entered_by = InvalidTransactionId;

/* Whether this transaction found the table full and swept it already. */
static bool swept_table = false;

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

/* The tag of a pair of this database in the table of held pairs. */
static HeldPairTag
held_pair_tag(uint64 pair)
{
	HeldPairTag tag;

	tag.pair = pair;
	tag.database = MyDatabaseId;
	tag.zero = 0;
	return tag;
}

/* The lock of the table's partition that holds a pair. */
static LWLock *
held_pair_lock(uint32 hashcode)
{
	return &held_pair_locks[hashcode % KEY_LOCK_PARTITIONS].lock;
}

/*
 * The transaction, other than this one and still in progress, that holds
 * the pair in the table of held pairs; InvalidTransactionId if none.
 */
static TransactionId
pair_holder(uint64 pair)
{
	HeldPairTag tag = held_pair_tag(pair);
	uint32		hashcode = get_hash_value(held_pairs, &tag);
	HeldPair   *entry;
	TransactionId holder = InvalidTransactionId;

	LWLockAcquire(held_pair_lock(hashcode), LW_SHARED);
	entry = hash_search_with_hash_value(held_pairs, &tag, hashcode, HASH_FIND, NULL);
	if (entry)
		holder = entry->holder;
	LWLockRelease(held_pair_lock(hashcode));

	if (!TransactionIdIsValid(holder) ||
		TransactionIdEquals(holder, GetTopTransactionIdIfAny()) ||
		!TransactionIdIsInProgress(holder))
		return InvalidTransactionId;
	return holder;
}

/*
 * Take the pair's exact lock, once no other transaction holds the pair in
 * the table of held pairs.  The lock is taken before the table is read (see
 * the header comment), and let go while this waits for the holder.
 */
static void
lock_pair_exactly(uint64 pair, const LOCKTAG *exact, const LOCKTAG *bucket)
{
	/* the intention first, so that a bucket's holder sees it */
	(void) LockAcquire(bucket, RowExclusiveLock, false, false);
	for (;;)
	{
		TransactionId holder;

		(void) LockAcquire(exact, ExclusiveLock, false, false);
		holder = pair_holder(pair);
		if (!TransactionIdIsValid(holder))
			break;
		LockRelease(exact, ExclusiveLock, false);
		XactLockTableWait(holder, NULL, NULL, XLTW_None);
	}
	exact_locks_taken++;
}

/* Make room to remember one more entered pair (before any entry is made). */
static void
make_room_for_entered_pair(void)
{
	if (pairs_entered_count < pairs_entered_space)
		return;
	if (pairs_entered == NULL)
	{
		pairs_entered_space = 1024;
		pairs_entered = MemoryContextAlloc(TopMemoryContext,
										   pairs_entered_space * sizeof(uint64));
		return;
	}
	pairs_entered_space *= 2;
	pairs_entered = repalloc(pairs_entered, pairs_entered_space * sizeof(uint64));
}

/*
 * Enter the pair in the table of held pairs for this transaction, once no
 * other transaction in progress holds it there; false if the table is full.
 * *holder is set to the transaction to wait for, if any.
 */
static bool
enter_pair(uint64 pair, TransactionId me, TransactionId *holder)
{
	HeldPairTag tag = held_pair_tag(pair);
	uint32		hashcode = get_hash_value(held_pairs, &tag);
	HeldPair   *entry;
	bool		found;

	*holder = InvalidTransactionId;
	make_room_for_entered_pair();
	LWLockAcquire(held_pair_lock(hashcode), LW_EXCLUSIVE);
	entry = hash_search_with_hash_value(held_pairs, &tag, hashcode, HASH_ENTER_NULL, &found);
	if (entry == NULL)
	{
		LWLockRelease(held_pair_lock(hashcode));
		return false;
	}
	if (found && TransactionIdEquals(entry->holder, me))
	{
		LWLockRelease(held_pair_lock(hashcode));
		return true;
	}
	if (found && TransactionIdIsInProgress(entry->holder))
		*holder = entry->holder;
	else
	{
		/* a new entry, or one whose transaction has ended: this one's now */
		entry->holder = me;
		pairs_entered[pairs_entered_count++] = pair;
		pairs_entered_by = me;
	}
	LWLockRelease(held_pair_lock(hashcode));
	return true;
}

/*
 * Remove the entries whose transaction has ended: a prepared transaction's,
 * committed or rolled back since, or one whose backend could not remove
 * them.  Run when the table is full, at most once per transaction, since it
 * reads the whole table under all its locks.
 */
static void
sweep_ended_holders(void)
{
	HASH_SEQ_STATUS scan;
	HeldPair   *entry;

	swept_table = true;
	for (int i = 0; i < KEY_LOCK_PARTITIONS; i++)
		LWLockAcquire(&held_pair_locks[i].lock, LW_EXCLUSIVE);
	hash_seq_init(&scan, held_pairs);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		if (!TransactionIdIsInProgress(entry->holder))
			(void) hash_search(held_pairs, &entry->tag, HASH_REMOVE, NULL);
	}
	for (int i = KEY_LOCK_PARTITIONS - 1; i >= 0; i--)
		LWLockRelease(&held_pair_locks[i].lock);
}

/*
 * Hold the pair in the table of held pairs until the end of the
 * transaction, after any transaction that holds it now; false, holding
 * nothing more, if the table is full.
 */
static bool
hold_pair_in_table(uint64 pair, const LOCKTAG *exact, const LOCKTAG *bucket)
{
	TransactionId me = GetTopTransactionId();
	TransactionId holder;

	/* the intention, so that a bucket's holder (the table full) sees it */
	(void) LockAcquire(bucket, RowExclusiveLock, false, false);
	for (;;)
	{
		if (!enter_pair(pair, me, &holder))
		{
			if (swept_table)
				return false;
			sweep_ended_holders();
			continue;
		}
		if (!TransactionIdIsValid(holder))
			break;
		XactLockTableWait(holder, NULL, NULL, XLTW_None);
	}

	/* entered: now wait for the transaction that holds the exact lock, if any */
	(void) LockAcquire(exact, ExclusiveLock, false, false);
	LockRelease(exact, ExclusiveLock, false);
	return true;
}

/*
 * Hold the (topic, key) pair until the end of the transaction; see the
 * header comment.  The caller draws the message's id once it is held.
 */
void
key_lock_acquire(text *topic, text *key)
{
	uint64		pair = pair_hash(topic, key);
	LOCKTAG		exact;
	LOCKTAG		bucket;

	SET_LOCKTAG_ADVISORY(exact, MyDatabaseId, (uint32) (pair >> 32), (uint32) pair,
						 KEY_LOCK_TAG_EXACT);
	SET_LOCKTAG_ADVISORY(bucket, MyDatabaseId, 0, (uint32) (pair % KEY_LOCK_BUCKETS),
						 KEY_LOCK_TAG_BUCKET);

	if (LockHeldByMe(&exact, ExclusiveLock, false))
		return;

	if (exact_locks_taken < KEY_LOCKS_EXACT)
	{
		lock_pair_exactly(pair, &exact, &bucket);
		return;
	}

	if (!hold_pair_in_table(pair, &exact, &bucket))
		(void) LockAcquire(&bucket, ExclusiveLock, false, false);
}

/* Remove this transaction's entries from the table of held pairs. */
static void
remove_entered_pairs(void)
{
	for (int i = 0; i < pairs_entered_count; i++)
	{
		HeldPairTag tag = held_pair_tag(pairs_entered[i]);
		uint32		hashcode = get_hash_value(held_pairs, &tag);
		HeldPair   *entry;

		LWLockAcquire(held_pair_lock(hashcode), LW_EXCLUSIVE);
		entry = hash_search_with_hash_value(held_pairs, &tag, hashcode, HASH_FIND, NULL);
		/* another may have taken it over once this one had ended */
		if (entry && TransactionIdEquals(entry->holder, pairs_entered_by))
			(void) hash_search_with_hash_value(held_pairs, &tag, hashcode, HASH_REMOVE, NULL);
		LWLockRelease(held_pair_lock(hashcode));
	}
}

/* Forget the pairs entered; their entries stay only for a prepared one. */
static void
forget_entered_pairs(void)
{
	pairs_entered_count = 0;
	pairs_entered_by = InvalidTransactionId;
	swept_table = false;
	if (pairs_entered_space > 1024)
	{
		pfree(pairs_entered);
		pairs_entered = NULL;
		pairs_entered_space = 0;
	}
}

/*
 * The end of a transaction releases its locks, and its entries go (which
 * happens once it is visible to new snapshots, or aborted): count afresh.
 */
static void
release_pairs_at_transaction_end(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			remove_entered_pairs();
			forget_entered_pairs();
			exact_locks_taken = 0;
			break;
		case XACT_EVENT_PREPARE:
			forget_entered_pairs();
			exact_locks_taken = 0;
			break;
		default:
			break;
	}
}

static Size
held_pairs_size(void)
{
	return hash_estimate_size(KEY_LOCK_HELD_PAIRS, sizeof(HeldPair));
}

static void
key_lock_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(add_size(MAXALIGN(sizeof(KeyLockShared)), held_pairs_size()));
	RequestNamedLWLockTranche("outbox held pairs", KEY_LOCK_PARTITIONS);
}

/* Make (or find made) the table of held pairs, all its entries at once. */
static void
make_held_pairs(void)
{
	HASHCTL		info;

	info.keysize = sizeof(HeldPairTag);
	info.entrysize = sizeof(HeldPair);
	info.num_partitions = KEY_LOCK_PARTITIONS;
	held_pairs = ShmemInitHash("outbox held pairs", KEY_LOCK_HELD_PAIRS, &info,
							   HASH_ELEM | HASH_BLOBS | HASH_PARTITION | HASH_FIXED_SIZE);
	held_pair_locks = GetNamedLWLockTranche("outbox held pairs");
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
	make_held_pairs();
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
	RegisterXactCallback(release_pairs_at_transaction_end, NULL);
}

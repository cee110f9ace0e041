/*-------------------------------------------------------------------------
 *
 * message.h
 *	  One outbox message as the publishing worker holds it: the columns of
 *	  outbox_message it reads, and what became of the message in Kafka.
 *	  Shared by the claim (store.c), the pipeline (pipeline.c) and the
 *	  producer (producer.c), and the limits of a Kafka record that the
 *	  enqueue side (enqueue.c) checks at the door.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_MESSAGE_H
#define OUTBOX_MESSAGE_H

#include "common/hashfn.h"
#include "datatype/timestamp.h"
#include "utils/jsonb.h"

#include "kafka_wire.h"

/*
 * A Kafka record's timestamp, milliseconds since the Unix epoch, from and to
 * a timestamptz.
 */
#define USECS_PER_MSEC 1000

static inline int64
unix_epoch_ms(TimestampTz t)
{
	return (t + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY) / USECS_PER_MSEC;
}

static inline TimestampTz
timestamptz_of_unix_epoch_ms(int64 ms)
{
	return ms * USECS_PER_MSEC - (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
}

/*
 * The header every record carries: the row's message_id, for consumers to
 * deduplicate.  Its value is a UUID in its text form.
 */
#define MESSAGE_ID_HEADER "outbox-message-id"
#define UUID_TEXT_LENGTH 36

/*
 * The columns the claim reads, in this order; Anum_claimed_* name their
 * positions in its result.  Keep the two lists together.
 */
#define CLAIMED_COLUMNS \
	"m.id, m.message_id::text, m.topic, m.key, m.payload, m.headers," \
	" m.created_at, m.attempts, " TARGET_PARTITION_VALUE ", m.state = 'retrying'," \
	CLAIMED_METRICS_COLUMNS

/*
 * What the metrics (metrics.c) need to tell when a message's latency
 * starts: the inserting transaction, and when it was due (which, for a
 * delayed message, retrying and never attempted, is its time).
 */
#define CLAIMED_METRICS_COLUMNS \
	" m.xmin, m.next_attempt_at"

typedef enum ClaimedColumn
{
	Anum_claimed_id = 1,
	Anum_claimed_message_id,
	Anum_claimed_topic,
	Anum_claimed_key,
	Anum_claimed_payload,
	Anum_claimed_headers,
	Anum_claimed_created_at,
	Anum_claimed_attempts,
	Anum_claimed_target_partition,
	Anum_claimed_waited,
	Anum_claimed_xmin,
	Anum_claimed_next_attempt_at
} ClaimedColumn;

/* A message's target partition when it names none: the partitioner's choice. */
#define ANY_PARTITION (-1)

/* What became of one message of a batch. */
typedef enum DeliveryOutcome
{
	DELIVERY_NOT_SENT = 0,		/* not produced, or withdrawn: leave the row as it is */
	DELIVERY_PENDING,			/* produced, no delivery report yet */
	DELIVERY_OK,				/* acknowledged by Kafka */
	DELIVERY_RETRY,				/* failed; may succeed later */
	DELIVERY_PERMANENT			/* failed; will never succeed: dead-letter it */
} DeliveryOutcome;

/* One claimed message, and what happened to it. */
typedef struct OutboxMessage
{
	int64		id;
	char	   *message_id;		/* uuid as text, sent as MESSAGE_ID_HEADER */
	char	   *topic;
	char	   *key;			/* NULL for no key */
	char	   *payload;		/* NULL for a tombstone (a record without a value) */
	size_t		payload_len;
	Jsonb	   *headers;		/* NULL for none */
	int64		timestamp_ms;	/* enqueue time, the record's timestamp */
	int			attempts;		/* failed attempts before this one */
	int32		target_partition;	/* the partition it must go to, or ANY_PARTITION */
	bool		waited;			/* claimed as 'retrying': a retry, or a delayed
								 * message, which may hold back its key */
	TimestampTz latency_from;	/* when its commit-to-ack latency starts (metrics.c) */

	DeliveryOutcome outcome;
	int			error_code;		/* rd_kafka_resp_err_t when not DELIVERY_OK */
	const char *error;			/* librdkafka's text for it, a static string */
	bool		possibly_persisted;
	bool		produced_alone; /* sent again on its own after a refusal
								 * that may have been another's */
	bool		in_transaction; /* produced in the open Kafka transaction */
	int32		partition;
	int64		offset;
	TimestampTz acked_at;		/* when its delivery report came */
} OutboxMessage;

/*
 * The hash of a (topic, key) pair: it names the keys the worker holds back
 * within a batch.  It never leaves the worker, so it needs no key; the locks
 * of enqueues, which every role sees in pg_locks, use a keyed hash
 * (key_lock.c).
 */
static inline uint64
message_key_hash(const char *topic, size_t topic_len, const char *key, size_t key_len)
{
	return hash_combine64(hash_bytes_extended((const unsigned char *) topic, topic_len, 0),
						  hash_bytes_extended((const unsigned char *) key, key_len, 0));
}

#endif							/* OUTBOX_MESSAGE_H */

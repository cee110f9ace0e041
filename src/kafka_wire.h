/*-------------------------------------------------------------------------
 *
 * kafka_wire.h
 *	  What a worker, publishing or consuming, and its Kafka process
 *	  (outbox_kafka, made from kafka_process.c and its modes) say to each
 *	  other over their socket.
 *
 * librdkafka runs in a process of its own, a child of the worker that is no
 * child of the postmaster: a crash, an abort or runaway memory there costs
 * the worker a new Kafka process, never a restart of PostgreSQL.  So this
 * header is plain C, included by the worker (producer.c) and by the Kafka
 * process, which links no PostgreSQL code.
 *
 * Each frame is a 4-byte body length, a 1-byte frame type and the body.
 * Integers are in the machine's byte order (both ends are one machine); a
 * string is a 4-byte length, -1 for NULL, and its bytes.
 *
 *	worker -> Kafka process
 *	  CONFIGURE   count, count x (name, value): the first frame, once
 *	  PRODUCE     count, count x (token, timestamp_ms, partition, topic, key,
 *	              value, header count, header count x (name, value)); a
 *	              partition of -1 leaves it to the partitioner, by key
 *	  METADATA    timeout_ms: do the brokers answer?
 *	  PURGE       withdraw every message not yet acknowledged
 *	  TEST_FATAL  raise a fatal producer error (outbox_simulate_fatal_error)
 *	  RECOVER     topic, from_offset, timeout_ms: for a transactional
 *	              producer, the first frame after READY (see "Transactions")
 *	  TRANSACTION_PROGRESS  progress record: the messages of the PRODUCE
 *	              frame that follows, produced into the open transaction
 *	              (begun first if none is), split into as many records as
 *	              message.max.bytes asks for
 *	  END_TRANSACTION  commit (u8): commit the open transaction, or
 *	              (commit 0) abort it
 *	  (end of file: destroy the producer and exit)
 *
 *	Kafka process -> worker
 *	  READY       the producer is made
 *	  FAILED      reason: it could not be made; the process exits
 *	  DELIVERY    token, error, status, partition, offset: one per message
 *	              produced, whatever became of it
 *	  LOG         level, facility, message
 *	  ERROR       error, reason (for RD_KAFKA_RESP_ERR__FATAL, the fatal one)
 *	  METADATA    error
 *	  TRANSACTION_RESULT  outcome (u8), error, reason, progress_offset:
 *	              how END_TRANSACTION went; the offset of its progress
 *	              record if committed, else -1
 *	  PROGRESS    error, reason, start_offset, gone, count, count x record:
 *	              RECOVER's answer
 *
 * Transactions (outbox.delivery = exactly_once).  A producer made with a
 * transactional.id is sent RECOVER first: it fences every earlier producer
 * of that id (init_transactions), makes the progress topic if it does not
 * exist, commits a start record there, and answers with the progress
 * records of that id from from_offset (none if -1) up to the start record,
 * as a read_committed consumer sees them, and the start record's offset,
 * from which the next RECOVER reads; gone counts the records retention
 * removed below from_offset.  Then each PRODUCE frame's messages go into
 * the open transaction, begun with the first of them, each frame after a
 * TRANSACTION_PROGRESS that lists them, until END_TRANSACTION, answered
 * once every message's DELIVERY is sent.  The worker commits only if each
 * message listed was delivered: a committed transaction holds every
 * message its progress records list.
 *
 * Within one PRODUCE frame the Kafka process keeps per-key order: once a
 * message of a (topic, key) cannot be handed to librdkafka, the later ones
 * of that key are not produced either, and reported DELIVERY_STATUS_HELD.
 *
 * A consuming worker (the inbox) starts one Kafka process per subscription,
 * whose first frame is CONFIGURE_CONSUMER instead: it makes a consumer, not
 * a producer.  The consumer joins no group and commits no offset to Kafka:
 * the worker keeps the offsets in its database, committed with the effects
 * of the messages, and says where to start.
 *
 *	worker -> Kafka process (consumer)
 *	  CONFIGURE_CONSUMER  count, count x (name, value): the first frame,
 *	              once.  The Kafka process sets group.id (a fixed one, which
 *	              assign needs; no group is joined) and auto.offset.reset=
 *	              earliest before these, and enable.auto.commit,
 *	              enable.auto.offset.store, enable.partition.eof=false and
 *	              log.queue=true after them
 *	  ASSIGN      start_ms, topic count, topic count x topic,
 *	              position count, position count x (topic, partition,
 *	              next_offset): read every partition of these topics, each
 *	              from its position if listed (a real offset; a negative
 *	              one counts as not listed), else from start_ms: -2 for
 *	              its first message (earliest), else the first message
 *	              stamped at or after start_ms (rd_kafka_offsets_for_times;
 *	              the end of the partition if there is none).  Partitions
 *	              the topics gain later are read from the same start.  Sent
 *	              once, after READY.
 *	  FETCH       max_messages, max_bytes: the worker is ready for the next
 *	              MESSAGES frame.  At most one FETCH is outstanding; a
 *	              max_messages of 0 counts as 1.
 *	  (end of file: close the consumer and exit)
 *
 *	Kafka process (consumer) -> worker
 *	  READY, FAILED, LOG, ERROR   as for a producer
 *	  ASSIGNED    count x (topic, partition, next_offset, high_watermark):
 *	              the partitions it reads and where it starts, a real
 *	              offset, with a high watermark no lower; once a topic's
 *	              partitions are known and again when it gains some (one
 *	              frame per topic each time)
 *	  MESSAGES    count x (topic, partition, offset, timestamp_ms, key,
 *	              value, header count, header count x (name, value)),
 *	              then watermark count x (topic, partition, high_watermark)
 *	              for the partitions of those messages: the answer to a
 *	              FETCH, sent once at least one message is there, at most
 *	              max_messages and, but for its first message, max_bytes of
 *	              keys and values; in each partition's order.  A key, value
 *	              or header value may be NULL; timestamp_ms is -1 if the
 *	              message has none, a high_watermark -1001 if librdkafka
 *	              has none yet
 *	  CONSUME_ERROR  topic, partition, error, reason: a partition (or, with
 *	              partition -1, a topic) cannot be read for now, such as a
 *	              topic that does not exist; it is tried again.  A topic's
 *	              is sent when its error changes, not at each try.  An
 *	              error librdkafka returns in place of a message comes as
 *	              one too (its topic NULL if it has none), read only while
 *	              a FETCH is outstanding, and after the messages before it
 *
 * In the consumer's frames, counts, max_messages and max_bytes are uint32;
 * partitions and errors int32; start_ms, offsets, watermarks and
 * timestamps int64.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_KAFKA_WIRE_H
#define OUTBOX_KAFKA_WIRE_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Kafka's limit on a topic name's length. */
#define KAFKA_MAX_TOPIC_LENGTH 249

/* Does Kafka allow c in a topic name: ASCII letters, digits, '.', '_', '-'? */
static inline bool
kafka_topic_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		(c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

/* The Kafka process's executable, in PostgreSQL's $libdir. */
#define KAFKA_PROCESS_NAME "outbox_kafka"

/* The descriptors the worker gives it: the socket, and its standard error. */
#define KAFKA_PROCESS_SOCKET_FD 0

#define WIRE_FRAME_HEADER_SIZE 5

/* No frame is larger: a batch's payloads are capped well below it. */
#define WIRE_MAX_FRAME_SIZE ((uint32_t) 1 << 30)

typedef enum WireFrameType
{
	WIRE_CONFIGURE = 1,
	WIRE_PRODUCE,
	WIRE_METADATA,
	WIRE_PURGE,
	WIRE_TEST_FATAL,
	WIRE_READY,
	WIRE_FAILED,
	WIRE_DELIVERY,
	WIRE_LOG,
	WIRE_ERROR,
	WIRE_METADATA_REPLY,
	WIRE_CONFIGURE_CONSUMER,
	WIRE_ASSIGN,
	WIRE_FETCH,
	WIRE_ASSIGNED,
	WIRE_MESSAGES,
	WIRE_CONSUME_ERROR,
	WIRE_RECOVER,
	WIRE_END_TRANSACTION,
	WIRE_TRANSACTION_RESULT,
	WIRE_PROGRESS,
	WIRE_TRANSACTION_PROGRESS
} WireFrameType;

/* How a transaction ended: TRANSACTION_RESULT's outcome. */
typedef enum WireTransactionOutcome
{
	TRANSACTION_NONE = 0,		/* none was open: nothing was produced */
	TRANSACTION_COMMITTED,
	TRANSACTION_ABORTED,
	TRANSACTION_UNKNOWN			/* a fatal error: RECOVER, in a new producer, says */
} WireTransactionOutcome;

/*
 * A progress record, produced with the messages it lists into their
 * transaction, in partition 0 of the progress topic, keyed by the transactional.id: "OBX1"
 * (its format's name and version), a kind, a count, and count x (message id, int64, and its
 * message_id, 16 bytes).  Its integers are little-endian: it outlives the
 * machine that wrote it.
 */
#define PROGRESS_MAGIC "OBX1"
#define PROGRESS_KIND_BATCH 1	/* lists the messages of its transaction */
#define PROGRESS_KIND_START 2	/* a producer's start: lists none */
#define PROGRESS_HEADER_SIZE 9	/* magic, kind, count */
#define PROGRESS_ENTRY_SIZE 24	/* id, message_id */
#define PROGRESS_UUID_SIZE 16

static inline void
progress_put_le(char *out, uint64_t v, int bytes)
{
	for (int i = 0; i < bytes; i++)
		out[i] = (char) (v >> (8 * i));
}

static inline uint64_t
progress_get_le(const char *in, int bytes)
{
	uint64_t	v = 0;

	for (int i = 0; i < bytes; i++)
		v |= (uint64_t) (unsigned char) in[i] << (8 * i);
	return v;
}

static inline void
progress_header(char *out, uint8_t kind, uint32_t count)
{
	memcpy(out, PROGRESS_MAGIC, 4);
	out[4] = (char) kind;
	progress_put_le(out + 5, count, 4);
}

/* The kind of a progress record, or 0 if it is not one whole. */
static inline uint8_t
progress_kind(const void *value, size_t len)
{
	const char *v = value;

	if (len < PROGRESS_HEADER_SIZE || memcmp(v, PROGRESS_MAGIC, 4) != 0 ||
		len != PROGRESS_HEADER_SIZE + progress_get_le(v + 5, 4) * PROGRESS_ENTRY_SIZE)
		return 0;
	return (uint8_t) v[4];
}

/* ASSIGN's start_ms for "each partition's first message". */
#define WIRE_START_EARLIEST ((int64_t) -2)

/* What became of a message in librdkafka's hands (rd_kafka_msg_status_t and more). */
typedef enum WireDeliveryStatus
{
	DELIVERY_STATUS_HELD = 0,	/* not produced: an earlier one of its key failed */
	DELIVERY_STATUS_NOT_PERSISTED,
	DELIVERY_STATUS_POSSIBLY_PERSISTED,
	DELIVERY_STATUS_PERSISTED
} WireDeliveryStatus;

/* Reads a frame's body; a read past its end sets failed and returns zeros. */
typedef struct WireReader
{
	const char *pos;
	const char *end;
	bool		failed;
} WireReader;

static inline void
wire_reader_init(WireReader *r, const char *body, size_t len)
{
	r->pos = body;
	r->end = body + len;
	r->failed = false;
}

static inline bool
wire_take(WireReader *r, void *out, size_t len)
{
	if (r->failed || (size_t) (r->end - r->pos) < len)
	{
		r->failed = true;
		memset(out, 0, len);
		return false;
	}
	memcpy(out, r->pos, len);
	r->pos += len;
	return true;
}

/* wire_u32(), wire_i32(), wire_i64(), wire_u8(): an integer of that size. */
#define WIRE_INTEGER_READER(name, type) \
static inline type \
name(WireReader *r) \
{ \
	type		v; \
 \
	wire_take(r, &v, sizeof(v)); \
	return v; \
}

WIRE_INTEGER_READER(wire_u32, uint32_t)
WIRE_INTEGER_READER(wire_i32, int32_t)
WIRE_INTEGER_READER(wire_i64, int64_t)
WIRE_INTEGER_READER(wire_u8, uint8_t)

/*
 * A string, in place (not NUL-terminated): *len is -1 and the result NULL
 * for a NULL string.
 */
static inline const char *
wire_string(WireReader *r, int32_t *len)
{
	const char *s;

	*len = wire_i32(r);
	if (*len < 0)
		return NULL;
	if ((size_t) (r->end - r->pos) < (size_t) *len)
	{
		r->failed = true;
		*len = -1;
		return NULL;
	}
	s = r->pos;
	r->pos += *len;
	return s;
}

#endif							/* OUTBOX_KAFKA_WIRE_H */

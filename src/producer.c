/*-------------------------------------------------------------------------
 *
 * producer.c
 *	  The worker's Kafka producer: librdkafka, run in a process of its own.
 *
 * librdkafka runs in outbox_kafka (kafka_process.c), a process of its own
 * that kafka_link.c starts, talks to and stops (its header says why).  When
 * that process ends, whatever ended it, the worker counts what was in
 * flight as not sent (its rows stay, to be claimed again: at most that
 * batch is published twice), and starts another.  So no librdkafka thread
 * runs in a PostgreSQL process; this file links librdkafka for
 * rd_kafka_err2str() alone, and says what the producer's frames mean.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "postmaster/interrupt.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "exactly_once.h"
#include "kafka_link.h"
#include "producer.h"
#include "settings.h"
#include "worker_slot.h"

/*
 * How long one wait for delivery reports may block: short, so that a
 * shutdown or a fatal error is seen at once.
 */
#define REPORT_WAIT_MS 50

/*
 * librdkafka reports every message within message.timeout.ms, if it is not
 * 0; past that and this slack, the worker withdraws what is left.
 */
#define REPORT_DEADLINE_SLACK_MS 5000

/* How long a batch Kafka has in hand may still be acknowledged at shutdown. */
#define SHUTDOWN_GRACE_MS 2000

/*
 * How long to wait for the reports of withdrawn messages, which a broker
 * that never answers a request may never send.
 */
#define WITHDRAWN_REPORT_WAIT_MS 10000

/* How much longer than its timeout a metadata request may take to be answered. */
#define METADATA_REPLY_SLACK_MS 1000

/*
 * What a message takes in a PRODUCE frame besides its payload, near enough:
 * token, timestamp, lengths, topic, key, a few headers, the message id.
 */
#define PRODUCE_FRAME_SLACK_PER_MESSAGE 512

/* librdkafka's default for message.timeout.ms, which the defaults below change. */
#define MESSAGE_TIMEOUT_PROPERTY "message.timeout.ms"
#define MESSAGE_TIMEOUT_ALIAS "delivery.timeout.ms"

/* librdkafka's default for transaction.timeout.ms. */
#define DEFAULT_TRANSACTION_TIMEOUT_MS 60000

struct OutboxProducer
{
	KafkaLink  *link;			/* to the Kafka process */
	OutboxMessage **by_token;	/* the messages produced, by their token */
	int			tokens_allocated;
	int			tokens_used;
	int			outstanding;	/* produced, no delivery report yet */

	/*
	 * Metadata requests sent and replies read: the Kafka process answers them
	 * in order, so a probe's answer is the reply that makes the two equal,
	 * and a reply that came after its probe gave up is not taken for the next
	 * probe's.
	 */
	uint64		metadata_requests;
	uint64		metadata_replies;
	int			metadata_error; /* of the last reply read */
	int			message_timeout_ms;
	bool		fatal;			/* a fatal error, or the process is gone */

	/* outbox.delivery = exactly_once: made with a transactional.id */
	bool		transactional;
	char	   *progress_topic; /* the one it was made for */
	bool		answered;		/* TRANSACTION_RESULT or PROGRESS came */
	WireTransactionOutcome outcome; /* TRANSACTION_RESULT's */
	int			answer_error;	/* either's error, and its reason */
	char		answer_reason[WORKER_LAST_ERROR_LEN];
	int64		progress_offset;	/* TRANSACTION_RESULT's; PROGRESS's start */
	ProducerRecovery *recovery; /* where PROGRESS's records go */
	bool		recovered;		/* producer_recover() succeeded */
};

/*
 * Defaults a user may override in outbox.kafka_properties.  A batch is
 * produced in one go, well under a millisecond, and Kafka works on it while
 * the worker claims the next: so librdkafka should send it after a
 * millisecond, not hold it for the default 5.  A message never times out
 * (message.timeout.ms=0): the idempotent producer sends it again, with its
 * sequence number, until a broker acknowledges it, and the broker
 * deduplicates.  A message that timed out while a broker held it, written
 * but not acknowledged (a broker killed mid-request), would be produced
 * anew when claimed again, and published twice.  The batch in flight then
 * waits out an outage of any length, as the worker would anyway: it claims
 * nothing while the brokers do not answer.  A key goes to the partition a
 * Java producer (Kafka Connect and so Debezium, Kafka Streams) sends it
 * to, murmur2 of the key, not librdkafka's default CRC32: so that a key
 * stays in its partition when an application moves from Debezium to the
 * outbox, and a topic the outbox writes is partitioned as the topics Java
 * clients write that consumers join it with.
 */
static const char *const default_properties[][2] = {
	{"client.id", "postgresql-outbox"},
	{"partitioner", "murmur2_random"},
	{MESSAGE_TIMEOUT_PROPERTY, "0"},
	{"reconnect.backoff.max.ms", "1000"},
	{"linger.ms", "1"},
};

/* librdkafka properties the promises depend on; applied last. */
static const char *const enforced_properties[][2] = {
	{"enable.idempotence", "true"},
	{"acks", "all"},
};

/*
 * A transactional producer's defaults: as above, but a message times out
 * with its transaction (librdkafka then sets message.timeout.ms to
 * transaction.timeout.ms), since a transaction cannot wait for ever; its
 * abort is what keeps a message that timed out from being published twice.
 */
static const char *const transactional_defaults[][2] = {
	{"client.id", "postgresql-outbox"},
	{"partitioner", "murmur2_random"},
	{"reconnect.backoff.max.ms", "1000"},
	{"linger.ms", "1"},
};

/*
 * How long each step of a transactional producer's start (fencing, making
 * the progress topic, its start record, reading the progress records) may
 * take in the Kafka process, and how much longer the answer may take.
 */
#define RECOVERY_STEP_TIMEOUT_MS 30000
#define RECOVERY_ANSWER_SLACK_MS 10000

/*
 * How long past transaction.timeout.ms a commit's answer may take: the
 * Kafka process tries a commit that timed out a few times.
 */
#define TRANSACTION_ANSWER_SLACK_MS 5000

/*
 * The Kafka process is gone, or has to go: every message it had in hand
 * stays to be claimed again (it may have reached Kafka: at most this batch
 * is published twice).
 */
static void
process_gone(void *arg)
{
	OutboxProducer *producer = arg;

	producer->fatal = true;
	producer->outcome = TRANSACTION_UNKNOWN;
	for (int i = 0; i < producer->tokens_used; i++)
	{
		OutboxMessage *m = producer->by_token[i];

		if (m && m->outcome == DELIVERY_PENDING)
		{
			m->outcome = DELIVERY_NOT_SENT;
			m->possibly_persisted = true;
		}
	}
	producer->outstanding = 0;
}

/* A short frame: a type and at most one integer. */
static void
send_request(OutboxProducer *producer, WireFrameType type, bool with_value, uint32 value)
{
	StringInfoData frame;

	initStringInfo(&frame);
	kafka_link_begin_frame(&frame, type);
	if (with_value)
		kafka_link_put_u32(&frame, value);
	kafka_link_send(producer->link, &frame);
	pfree(frame.data);
}

/*
 * librdkafka 2.5 and later (KIP-467) give this to the records of a produce
 * request that the broker refused for another record's fault: they were not
 * written, and are sent again without an attempt charged.  Named here, as
 * earlier headers lack it and a build against them may run with a later
 * library of the same soname.
 */
#define ERR_REFUSED_FOR_ANOTHER_RECORD ((rd_kafka_resp_err_t) -138)

/*
 * What a Kafka error means for the message.  librdkafka 2.0.2 has no
 * classifier for delivery errors, so these are the ones that no retry can
 * cure; everything else is retried with backoff.
 */
static DeliveryOutcome
classify_error(rd_kafka_resp_err_t err)
{
	if (err == ERR_REFUSED_FOR_ANOTHER_RECORD)
		return DELIVERY_NOT_SENT;	/* not in 2.0.2's enum */
	switch (err)
	{
		case RD_KAFKA_RESP_ERR_NO_ERROR:
			return DELIVERY_OK;
		case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_INVALID_RECORD:
		case RD_KAFKA_RESP_ERR_INVALID_MSG:
		case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
		case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
		case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:	/* a partition the topic has not */
			return DELIVERY_PERMANENT;
		case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
		case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
		case RD_KAFKA_RESP_ERR__FATAL:
			return DELIVERY_NOT_SENT;
		default:
			return DELIVERY_RETRY;
	}
}

static void
handle_delivery(OutboxProducer *producer, WireReader *r)
{
	uint32		token = wire_u32(r);
	rd_kafka_resp_err_t err = wire_i32(r);
	WireDeliveryStatus status = wire_u8(r);
	int32		partition = wire_i32(r);
	int64		offset = wire_i64(r);
	OutboxMessage *m;

	if (r->failed || token >= (uint32) producer->tokens_used ||
		(m = producer->by_token[token]) == NULL || m->outcome != DELIVERY_PENDING)
		return;					/* not one of this batch's: withdrawn already */
	producer->by_token[token] = NULL;
	producer->outstanding--;
	m->outcome = status == DELIVERY_STATUS_HELD ? DELIVERY_NOT_SENT : classify_error(err);

	/*
	 * A transactional producer's messages time out with their transaction
	 * (a broker away for longer): that is the transaction's limit, not the
	 * message's failure, and costs it no attempt.
	 */
	if (producer->transactional && err == RD_KAFKA_RESP_ERR__MSG_TIMED_OUT)
		m->outcome = DELIVERY_NOT_SENT;
	m->error_code = err;
	m->error = rd_kafka_err2str(err);
	m->partition = partition;
	m->offset = offset;
	m->acked_at = GetCurrentTimestamp();
	m->possibly_persisted = status != DELIVERY_STATUS_NOT_PERSISTED &&
		status != DELIVERY_STATUS_HELD;
	if (err == RD_KAFKA_RESP_ERR__FATAL)
		producer->fatal = true;
}

static void
handle_error(OutboxProducer *producer, KafkaLink *link, WireReader *r)
{
	int32		err = wire_i32(r);
	int32		reason_len;
	const char *reason = wire_string(r, &reason_len);
	char	   *text;

	if (r->failed)
		return;
	text = kafka_link_scrubbed(link, reason, reason_len);
	if (err == RD_KAFKA_RESP_ERR__FATAL)
	{
		producer->fatal = true;
		worker_report_error(LOG, "fatal producer error, rebuilding the producer: %s", text);
		return;
	}
	if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN)
	{
		/*
		 * Said again at each reconnection by librdkafka 2.14, after the
		 * cause, which it says only every 30 s: last_error keeps the cause.
		 */
		if (!worker_brokers_known_reachable())
			return;
		worker_report_brokers_reachable(false);
	}
	else if (err == RD_KAFKA_RESP_ERR__AUTHENTICATION ||
			 err == RD_KAFKA_RESP_ERR__SSL ||
			 err == RD_KAFKA_RESP_ERR__TRANSPORT ||
			 err == RD_KAFKA_RESP_ERR__RESOLVE)
		worker_report_brokers_reachable(false);
	/* librdkafka's log, which kafka_link.c's handle_log serves, says it already */
	worker_report_error(DEBUG1, "%s", text);
}

/* An answer's error and reason, scrubbed. */
static void
take_answer_error(OutboxProducer *producer, KafkaLink *link, WireReader *r)
{
	int32		reason_len;
	const char *reason;

	producer->answer_error = wire_i32(r);
	reason = wire_string(r, &reason_len);
	strlcpy(producer->answer_reason, kafka_link_scrubbed(link, reason, reason_len),
			sizeof(producer->answer_reason));
}

static void
handle_transaction_result(OutboxProducer *producer, KafkaLink *link, WireReader *r)
{
	producer->outcome = wire_u8(r);
	take_answer_error(producer, link, r);
	producer->progress_offset = wire_i64(r);
	producer->answered = !r->failed;
	if (producer->outcome == TRANSACTION_UNKNOWN)
		producer->fatal = true;
}

/* PROGRESS: RECOVER's answer; its records go to producer->recovery. */
static void
handle_progress(OutboxProducer *producer, KafkaLink *link, WireReader *r)
{
	ProducerRecovery *recovery = producer->recovery;
	uint32		count;

	if (recovery == NULL)
		return;					/* an answer that came after its wait gave up */
	take_answer_error(producer, link, r);
	producer->progress_offset = wire_i64(r);
	recovery->gone = wire_i64(r);
	count = wire_u32(r);
	for (uint32 i = 0; i < count && !r->failed; i++)
	{
		int32		len;
		const char *record = wire_string(r, &len);

		if (record && progress_kind(record, len) == PROGRESS_KIND_BATCH)
		{
			char	   *copy = MemoryContextAlloc(recovery->context, len);

			memcpy(copy, record, len);
			recovery->records = lappend(recovery->records, copy);
		}
	}
	producer->answered = !r->failed;
}

/* A frame from the Kafka process that kafka_link.c does not handle itself. */
static void
handle_frame(void *arg, KafkaLink *link, uint8 type, WireReader *r)
{
	OutboxProducer *producer = arg;

	switch (type)
	{
		case WIRE_DELIVERY:
			handle_delivery(producer, r);
			break;
		case WIRE_ERROR:
			handle_error(producer, link, r);
			break;
		case WIRE_METADATA_REPLY:
			producer->metadata_error = wire_i32(r);
			producer->metadata_replies++;
			break;
		case WIRE_TRANSACTION_RESULT:
			handle_transaction_result(producer, link, r);
			break;
		case WIRE_PROGRESS:
			handle_progress(producer, link, r);
			break;
		default:
			elog(LOG, "outbox: unknown frame type %d from the Kafka process", type);
			break;
	}
}

/* The value the producer gets of an integer property (or of its alias), or 0. */
static int
integer_property_of(List *properties, const char *name, const char *alias)
{
	int			value = 0;
	ListCell   *lc;

	foreach(lc, properties)
	{
		KafkaProperty *property = lfirst(lc);

		if (strcmp(property->name, name) == 0 ||
			(alias && strcmp(property->name, alias) == 0))
			value = atoi(property->value);
	}
	return value;
}

/* The value of message.timeout.ms the producer gets. */
static int
message_timeout_of(List *properties)
{
	return integer_property_of(properties, MESSAGE_TIMEOUT_PROPERTY, MESSAGE_TIMEOUT_ALIAS);
}

/* The value of transaction.timeout.ms the producer gets. */
static int
transaction_timeout_of(List *properties)
{
	int			timeout_ms = integer_property_of(properties, "transaction.timeout.ms", NULL);

	return timeout_ms > 0 ? timeout_ms : DEFAULT_TRANSACTION_TIMEOUT_MS;
}

/* Free what a producer holds; its Kafka process must be gone. */
static void
free_producer(OutboxProducer *producer)
{
	if (producer->by_token)
		pfree(producer->by_token);
	pfree(producer->progress_topic);
	pfree(producer);
}

/*
 * Make a producer from the current settings: start a Kafka process and
 * wait until it has made its producer; a transactional one, with this
 * transactional.id, if it is not NULL (producer_recover() must then come
 * first).  On failure returns NULL with the reason in errbuf.
 */
OutboxProducer *
producer_create(const char *transactional_id, char *errbuf, size_t errlen)
{
	bool		transactional = transactional_id != NULL;
	List	   *properties = transactional ?
		kafka_link_properties(transactional_defaults, lengthof(transactional_defaults),
							  enforced_properties, lengthof(enforced_properties)) :
		kafka_link_properties(default_properties, lengthof(default_properties),
							  enforced_properties, lengthof(enforced_properties));
	OutboxProducer *producer;

	/* outbox.kafka_properties' check refuses it, but for one set at server start */
	if (settings_kafka_property_set(properties, "transactional.id"))
	{
		snprintf(errbuf, errlen, "outbox.kafka_properties cannot set transactional.id (see outbox.delivery)");
		return NULL;
	}
	if (transactional)
		kafka_link_append_property(&properties, "transactional.id", transactional_id);

	/* it lives from turn to turn, until the worker destroys it */
	producer = MemoryContextAllocZero(TopMemoryContext, sizeof(OutboxProducer));
	producer->message_timeout_ms = message_timeout_of(properties);
	producer->transactional = transactional;
	producer->progress_topic = MemoryContextStrdup(TopMemoryContext, outbox_progress_topic);
	if (transactional && producer->message_timeout_ms == 0)
		producer->message_timeout_ms = transaction_timeout_of(properties);

	producer->link = kafka_link_start("the Kafka process", WIRE_CONFIGURE, properties,
									  handle_frame, process_gone, producer,
									  errbuf, errlen);
	if (producer->link)
		return producer;
	free_producer(producer);
	return NULL;
}

/* Stop the Kafka process, which withdraws what it still holds, and free the producer. */
void
producer_destroy(OutboxProducer *producer)
{
	if (producer == NULL)
		return;
	kafka_link_stop(producer->link);
	free_producer(producer);
}

/*
 * Do outbox.brokers, outbox.kafka_properties, outbox.delivery or (for a
 * transactional producer) outbox.progress_topic differ from the producer's?
 */
bool
producer_settings_changed(OutboxProducer *producer)
{
	return kafka_link_settings_changed(producer->link) ||
		producer->transactional != (outbox_delivery == OUTBOX_DELIVERY_EXACTLY_ONCE) ||
		(producer->transactional && strcmp(producer->progress_topic, outbox_progress_topic) != 0);
}

bool
producer_transactional(OutboxProducer *producer)
{
	return producer->transactional;
}

/* May the producer take messages: not a transactional one before its start. */
bool
producer_started(OutboxProducer *producer)
{
	return !producer->transactional || producer->recovered;
}

/*
 * Wait until the Kafka process answers (TRANSACTION_RESULT or PROGRESS),
 * reading the frames that come before it, or until it is gone or the
 * deadline passes, which a shutdown brings to SHUTDOWN_GRACE_MS.  Returns
 * whether it answered.
 */
static bool
await_answer(OutboxProducer *producer, long timeout_ms)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);

	while (!producer->answered && kafka_link_alive(producer->link))
	{
		long		left;

		if (ShutdownRequestPending)
			deadline = Min(deadline, TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
																 SHUTDOWN_GRACE_MS));
		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
		if (left <= 0)
			return false;
		if (kafka_link_wait(producer->link, WL_SOCKET_READABLE, left) & WL_SOCKET_READABLE)
			kafka_link_read_available(producer->link);
	}
	return producer->answered;
}

/*
 * A transactional producer's start (kafka_wire.h, "Transactions"): fence
 * the earlier producers of its transactional.id, and read the progress
 * records of the transactions they committed, from from_offset (-1 for
 * none), into recovery, with the offset the next start reads from.  On
 * failure returns false with the reason in errbuf; the producer is then to
 * be destroyed.
 */
bool
producer_recover(OutboxProducer *producer, int64 from_offset, ProducerRecovery *recovery,
				 char *errbuf, size_t errlen)
{
	StringInfoData frame;

	Assert(producer->transactional);
	initStringInfo(&frame);
	kafka_link_begin_frame(&frame, WIRE_RECOVER);
	kafka_link_put_string(&frame, producer->progress_topic);
	kafka_link_put_i64(&frame, from_offset);
	kafka_link_put_i32(&frame, RECOVERY_STEP_TIMEOUT_MS);
	producer->answered = false;
	producer->recovery = recovery;
	kafka_link_send(producer->link, &frame);
	pfree(frame.data);

	if (!await_answer(producer, 4 * RECOVERY_STEP_TIMEOUT_MS + RECOVERY_ANSWER_SLACK_MS))
		snprintf(errbuf, errlen, "the Kafka process did not answer");
	else if (producer->answer_error != RD_KAFKA_RESP_ERR_NO_ERROR)
		snprintf(errbuf, errlen, "%s", producer->answer_reason);
	producer->recovery = NULL;
	if (!producer->answered || producer->answer_error != RD_KAFKA_RESP_ERR_NO_ERROR)
		return false;
	recovery->start_offset = producer->progress_offset;
	producer->recovered = true;
	return true;
}

/*
 * End the open transaction: commit it, or abort it.  Delivery reports still
 * owed are read meanwhile.
 * Returns how it ended; TRANSACTION_UNKNOWN also when the Kafka process
 * died or did not answer, and the producer is then failed.  Sets
 * *progress_offset for a commit.
 */
WireTransactionOutcome
producer_end_transaction(OutboxProducer *producer, bool commit, int64 *progress_offset)
{
	StringInfoData frame;

	initStringInfo(&frame);
	kafka_link_begin_frame(&frame, WIRE_END_TRANSACTION);
	kafka_link_put_u8(&frame, commit);
	producer->answered = false;
	kafka_link_send(producer->link, &frame);
	pfree(frame.data);

	if (!await_answer(producer, producer->message_timeout_ms + TRANSACTION_ANSWER_SLACK_MS))
	{
		producer->fatal = true;
		producer->outcome = TRANSACTION_UNKNOWN;
		worker_report_error(LOG, "the Kafka process did not say how the transaction ended: the next producer's start will");
	}
	else if (commit && producer->outcome != TRANSACTION_COMMITTED)
		worker_report_error(LOG, "the Kafka transaction was %s: %s",
							producer->outcome == TRANSACTION_ABORTED ? "aborted" :
							"left in doubt", producer->answer_reason);
	*progress_offset = producer->progress_offset;
	return producer->outcome;
}

bool
producer_failed_fatally(OutboxProducer *producer)
{
	return producer->fatal;
}

/* Serve what the Kafka process has sent without waiting. */
void
producer_serve_events(OutboxProducer *producer)
{
	kafka_link_read_available(producer->link);
}

/* Read what the Kafka process says as it comes, for timeout_ms. */
void
producer_serve_events_for(OutboxProducer *producer, long timeout_ms)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
	long		left = timeout_ms;

	while (left > 0 && kafka_link_alive(producer->link))
	{
		if (kafka_link_wait(producer->link, WL_SOCKET_READABLE, left) & WL_SOCKET_READABLE)
			kafka_link_read_available(producer->link);
		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
	}
}

/*
 * Ask the cluster for its brokers.  An answer means the brokers are there
 * and accept this producer's credentials.
 */
bool
producer_brokers_reachable(OutboxProducer *producer, int timeout_ms)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   timeout_ms + METADATA_REPLY_SLACK_MS);

	producer->metadata_requests++;
	send_request(producer, WIRE_METADATA, true, timeout_ms);
	while (producer->metadata_replies < producer->metadata_requests &&
		   kafka_link_alive(producer->link))
	{
		long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);

		if (left <= 0)
			return false;
		if (kafka_link_wait(producer->link, WL_SOCKET_READABLE, left) & WL_SOCKET_READABLE)
			kafka_link_read_available(producer->link);
	}
	return producer->metadata_replies == producer->metadata_requests &&
		producer->metadata_error == RD_KAFKA_RESP_ERR_NO_ERROR;
}

/* Kafka record headers: the message's own, then outbox-message-id. */
static void
put_headers(StringInfo frame, OutboxMessage *message)
{
	uint32		count = 1;

	if (message->headers)
		count += JB_ROOT_COUNT(message->headers);
	kafka_link_put_u32(frame, count);

	if (message->headers)
	{
		JsonbIterator *it = JsonbIteratorInit(&message->headers->root);
		JsonbValue	v;
		JsonbIteratorToken token;

		while ((token = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
		{
			if (token == WJB_KEY)
				kafka_link_put_bytes(frame, v.val.string.val, v.val.string.len);
			else if (token == WJB_VALUE && v.type == jbvString)
				kafka_link_put_bytes(frame, v.val.string.val, v.val.string.len);
			else if (token == WJB_VALUE)
				kafka_link_put_bytes(frame, NULL, -1);
		}
	}
	kafka_link_put_string(frame, MESSAGE_ID_HEADER);
	kafka_link_put_string(frame, message->message_id);
}

/* Give the message a token, by which its delivery report finds it. */
static uint32
take_token(OutboxProducer *producer, OutboxMessage *message)
{
	if (producer->outstanding == 0)
		producer->tokens_used = 0;
	if (producer->tokens_used == producer->tokens_allocated)
	{
		producer->tokens_allocated = Max(producer->tokens_allocated * 2, 1024);
		producer->by_token = producer->by_token ?
			repalloc(producer->by_token, producer->tokens_allocated * sizeof(OutboxMessage *)) :
			MemoryContextAlloc(TopMemoryContext,
							   producer->tokens_allocated * sizeof(OutboxMessage *));
	}
	producer->by_token[producer->tokens_used] = message;
	return producer->tokens_used++;
}

/*
 * A transactional producer's messages go into its open transaction with
 * their progress record, which the Kafka process produces before them.
 */
static void
send_progress_record(OutboxProducer *producer, const OutboxMessage *messages, int count)
{
	StringInfoData frame;
	int			len;
	char	   *record = exactly_once_progress_record(messages, count, &len);

	initStringInfo(&frame);
	kafka_link_begin_frame(&frame, WIRE_TRANSACTION_PROGRESS);
	kafka_link_put_bytes(&frame, record, len);
	kafka_link_send(producer->link, &frame);
	pfree(frame.data);
	pfree(record);
}

/*
 * Hand messages to the Kafka process, in one frame, in their order.  Each
 * is DELIVERY_PENDING until its report; the Kafka process keeps their
 * per-key order when librdkafka refuses one at once.
 */
void
producer_produce(OutboxProducer *producer, OutboxMessage *messages, int count)
{
	StringInfoData frame;
	size_t		payload_bytes = 0;

	if (producer->transactional)
		send_progress_record(producer, messages, count);

	/* one allocation the size of the batch, not doublings up to twice it */
	for (int i = 0; i < count; i++)
		payload_bytes += messages[i].payload_len;
	initStringInfo(&frame);
	enlargeStringInfo(&frame, payload_bytes + count * PRODUCE_FRAME_SLACK_PER_MESSAGE);
	kafka_link_begin_frame(&frame, WIRE_PRODUCE);
	kafka_link_put_u32(&frame, count);
	for (int i = 0; i < count; i++)
	{
		OutboxMessage *m = &messages[i];

		kafka_link_put_u32(&frame, take_token(producer, m));
		kafka_link_put_i64(&frame, m->timestamp_ms);
		kafka_link_put_i32(&frame, m->target_partition);
		kafka_link_put_string(&frame, m->topic);
		kafka_link_put_string(&frame, m->key);
		kafka_link_put_bytes(&frame, m->payload, m->payload ? (int32) m->payload_len : -1);
		put_headers(&frame, m);
		m->outcome = DELIVERY_PENDING;
		m->in_transaction = producer->transactional;
		producer->outstanding++;
	}
	kafka_link_send(producer->link, &frame);
	pfree(frame.data);
}

/*
 * Serve delivery reports until every produced message has one, or, with
 * until_woken, until the latch is set first (AWAIT_WOKEN: the caller resets
 * it, and may produce more before it awaits again).  librdkafka reports each
 * message within message.timeout.ms (never, with 0, until a broker
 * acknowledges it); past that (and REPORT_DEADLINE_SLACK_MS), or
 * SHUTDOWN_GRACE_MS into a shutdown, or after a fatal error, the rest is
 * withdrawn (reported as not sent, so its rows stay to be claimed again):
 * AWAIT_WITHDRAWN, and the producer must then be destroyed, before the
 * messages' memory is freed, since a report may still be owed for them.
 */
AwaitResult
producer_await_deliveries(OutboxProducer *producer, bool until_woken)
{
	TimestampTz deadline = producer->message_timeout_ms == 0 ? DT_NOEND :
		TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
									producer->message_timeout_ms + REPORT_DEADLINE_SLACK_MS);
	TimestampTz withdrawn_at = 0;
	int			events = WL_SOCKET_READABLE | (until_woken ? WL_LATCH_SET : 0);

	while (producer->outstanding > 0)
	{
		TimestampTz now;
		int			rc = kafka_link_wait(producer->link, events, REPORT_WAIT_MS);

		if (rc & WL_SOCKET_READABLE)
			kafka_link_read_available(producer->link);
		if ((rc & WL_LATCH_SET) && withdrawn_at == 0 && producer->outstanding > 0)
			return AWAIT_WOKEN;
		now = GetCurrentTimestamp();

		/* at shutdown, a batch Kafka has in hand gets a moment to be acknowledged */
		if (ShutdownRequestPending)
			deadline = Min(deadline, TimestampTzPlusMilliseconds(now, SHUTDOWN_GRACE_MS));

		if (withdrawn_at == 0 && (producer->fatal || now >= deadline))
		{
			send_request(producer, WIRE_PURGE, false, 0);
			withdrawn_at = now;
			events &= ~WL_LATCH_SET;
		}
		else if (withdrawn_at != 0 &&
				 TimestampDifferenceExceeds(withdrawn_at, now, WITHDRAWN_REPORT_WAIT_MS))
			break;				/* a request the broker never answers */
	}
	return withdrawn_at == 0 ? AWAIT_ALL_REPORTED : AWAIT_WITHDRAWN;
}

/*
 * Was the message refused for good with a reason that may belong to the
 * messages sent with it?  The broker refuses a whole record batch when it is
 * larger than the topic allows, or when one of its records is invalid.
 * librdkafka 2.0.2 gives each record the batch's error; 2.5 and later tell
 * the invalid records from the others, but once two are invalid they give
 * each of them INVALID_RECORD, whatever the broker's own reason was (an
 * out-of-range timestamp, which is retried, among them).  Alone, a message's
 * refusal, and its reason, are its own.
 */
bool
producer_refused_with_others(const OutboxMessage *message)
{
	return message->outcome == DELIVERY_PERMANENT &&
		(message->error_code == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
		 message->error_code == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE ||
		 message->error_code == RD_KAFKA_RESP_ERR_INVALID_RECORD);
}

/* For outbox_simulate_fatal_error(): the error an idempotent producer can raise. */
void
producer_simulate_fatal_error(OutboxProducer *producer)
{
	send_request(producer, WIRE_TEST_FATAL, false, 0);
}

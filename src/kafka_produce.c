/*-------------------------------------------------------------------------
 *
 * kafka_produce.c
 *	  outbox_kafka's producer mode: the publishing worker's Kafka producer.
 *
 * Chosen by a first frame CONFIGURE (kafka_process.c).  If librdkafka dies
 * here, the worker starts another Kafka process and claims again what was
 * not acknowledged.  Logs, errors and delivery reports all arrive on
 * librdkafka's main queue, served on our one thread, so the callbacks below
 * run on it and only append to the buffer of what goes back to the worker.
 *
 *-------------------------------------------------------------------------
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>

#include "kafka_process.h"

/*
 * How long one rd_kafka_flush() may block while messages are outstanding:
 * flush, unlike poll, sends at once what linger.ms would hold back; short,
 * so that the worker's frames are read soon.
 */
#define FLUSH_SLICE_MS 10

/* How long to serve reports when librdkafka's queue is full, before trying again. */
#define QUEUE_FULL_WAIT_MS 100

/*
 * Asking the brokers about a topic (see probe_topic): how long one request
 * may take, how long a topic seen for the first time may take to appear
 * and how often it is asked about meanwhile, and how often a topic found
 * missing is asked about again.
 */
#define TOPIC_PROBE_TIMEOUT_MS 2000
#define NEW_TOPIC_WINDOW_MS 1000
#define NEW_TOPIC_PROBE_INTERVAL_MS 50
#define MISSING_TOPIC_RECHECK_MS 1000

/* The topics remembered, and their hash buckets. */
#define MAX_CACHED_TOPICS 10000
#define TOPIC_BUCKETS 1024

static rd_kafka_t *rk;
static int	outstanding;		/* produced, no delivery report yet */

static void
report_delivery(uint32_t token, rd_kafka_resp_err_t err, WireDeliveryStatus status,
				int32_t partition, int64_t offset)
{
	size_t		frame = begin_frame(WIRE_DELIVERY);
	uint8_t		s = status;

	put(&token, sizeof(token));
	put_i32(err);
	put(&s, sizeof(s));
	put_i32(partition);
	put(&offset, sizeof(offset));
	end_frame(frame);
}

/*
 * What this process knows of the topics it produces to.  A topic is asked
 * about once, when first seen; one the brokers say is missing is asked
 * about again at most every MISSING_TOPIC_RECHECK_MS, and its messages fail
 * at once in between, as retries.
 */
typedef enum TopicState
{
	TOPIC_UNSEEN,
	TOPIC_EXISTS,
	TOPIC_MISSING
} TopicState;

typedef struct TopicEntry
{
	struct TopicEntry *next;	/* in its hash bucket */
	char	   *name;
	TopicState	state;
	rd_kafka_resp_err_t error;	/* why it is missing */
	int64_t		checked_at_ms;
	uint64_t	partitions_asked_in_frame;	/* see partition_may_be_new() */
} TopicEntry;

static TopicEntry *topic_buckets[TOPIC_BUCKETS];

/* The PRODUCE frames served, this one included. */
static uint64_t produce_frames;
static int	topics_cached;

/* FNV-1a, enough to spread topic names over the buckets. */
static uint32_t
topic_hash(const char *name, int32_t len)
{
	uint32_t	h = 2166136261u;

	for (int32_t i = 0; i < len; i++)
		h = (h ^ (unsigned char) name[i]) * 16777619u;
	return h % TOPIC_BUCKETS;
}

/* Forget every topic: a bound on what a stream of new names can cost. */
static void
forget_topics(void)
{
	for (int b = 0; b < TOPIC_BUCKETS; b++)
		while (topic_buckets[b])
		{
			TopicEntry *e = topic_buckets[b];

			topic_buckets[b] = e->next;
			free(e->name);
			free(e);
		}
	topics_cached = 0;
}

static TopicEntry *
topic_entry(const char *name, int32_t len)
{
	uint32_t	b = topic_hash(name, len);
	TopicEntry *e;

	for (e = topic_buckets[b]; e; e = e->next)
		if ((int32_t) strlen(e->name) == len && memcmp(e->name, name, len) == 0)
			return e;
	if (topics_cached >= MAX_CACHED_TOPICS)
	{
		forget_topics();
		b = topic_hash(name, len);
	}
	if ((e = calloc(1, sizeof(TopicEntry))) == NULL || (e->name = strndup(name, len)) == NULL)
		die("out of memory");
	e->next = topic_buckets[b];
	topic_buckets[b] = e;
	topics_cached++;
	return e;
}

static bool
topic_needs_probe(const TopicEntry *e, int64_t now)
{
	return e->state == TOPIC_UNSEEN ||
		(e->state == TOPIC_MISSING && now - e->checked_at_ms >= MISSING_TOPIC_RECHECK_MS);
}

/* Do the brokers know the topic?  Returns false if they did not answer. */
static bool
ask_brokers_about(const char *name, rd_kafka_resp_err_t *topic_error)
{
	rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, name, NULL);
	const struct rd_kafka_metadata *metadata;
	rd_kafka_resp_err_t err;

	if (rkt == NULL)
	{
		*topic_error = rd_kafka_last_error();
		return true;
	}
	err = rd_kafka_metadata(rk, 0, rkt, &metadata, TOPIC_PROBE_TIMEOUT_MS);
	rd_kafka_topic_destroy(rkt);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		return false;
	*topic_error = metadata->topic_cnt == 1 ? metadata->topics[0].err : RD_KAFKA_RESP_ERR_NO_ERROR;
	rd_kafka_metadata_destroy(metadata);
	return true;
}

/* Errors that say the topic is not there for this producer. */
static bool
topic_is_missing(rd_kafka_resp_err_t err)
{
	return err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
		err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC ||
		err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
		err == RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION;
}

static void
mark_topic_missing(TopicEntry *e, rd_kafka_resp_err_t err)
{
	e->state = TOPIC_MISSING;
	e->error = err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC ?
		RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART : err;
	e->checked_at_ms = now_ms();
}

/* Does the cluster create topics on demand (auto.create.topics.enable)? */
typedef enum TopicCreation
{
	CREATION_UNASKED,
	CREATION_ON,				/* or we could not tell */
	CREATION_OFF
} TopicCreation;

static TopicCreation topic_creation = CREATION_UNASKED;

/* auto.create.topics.enable of a broker's configuration, or CREATION_ON if it is not there. */
static TopicCreation
topic_creation_of(rd_kafka_event_t *event)
{
	const rd_kafka_DescribeConfigs_result_t *result = rd_kafka_event_DescribeConfigs_result(event);
	const rd_kafka_ConfigResource_t **resources;
	const rd_kafka_ConfigEntry_t **entries;
	size_t		resource_count;
	size_t		entry_count;

	if (result == NULL)
		return CREATION_ON;
	resources = rd_kafka_DescribeConfigs_result_resources(result, &resource_count);
	if (resource_count != 1 || rd_kafka_ConfigResource_error(resources[0]))
		return CREATION_ON;
	entries = rd_kafka_ConfigResource_configs(resources[0], &entry_count);
	for (size_t i = 0; i < entry_count; i++)
		if (strcmp(rd_kafka_ConfigEntry_name(entries[i]), "auto.create.topics.enable") == 0)
			return rd_kafka_ConfigEntry_value(entries[i]) &&
				strcmp(rd_kafka_ConfigEntry_value(entries[i]), "true") == 0 ?
				CREATION_ON : CREATION_OFF;
	return CREATION_ON;
}

/*
 * Ask a broker whether it creates topics on demand.  Asked once, the first
 * time a topic is missing; a broker that does not say (an ACL may forbid
 * it) is taken to create them.
 */
static TopicCreation
ask_topic_creation(void)
{
	const struct rd_kafka_metadata *metadata;
	char		broker_id[16];
	rd_kafka_ConfigResource_t *broker;
	rd_kafka_queue_t *replies;
	rd_kafka_event_t *reply;
	TopicCreation creation = CREATION_ON;

	if (rd_kafka_metadata(rk, 0, NULL, &metadata, TOPIC_PROBE_TIMEOUT_MS) != RD_KAFKA_RESP_ERR_NO_ERROR)
		return CREATION_UNASKED;
	if (metadata->broker_cnt == 0)
	{
		rd_kafka_metadata_destroy(metadata);
		return CREATION_UNASKED;
	}
	snprintf(broker_id, sizeof(broker_id), "%d", metadata->brokers[0].id);
	rd_kafka_metadata_destroy(metadata);

	broker = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_BROKER, broker_id);
	replies = rd_kafka_queue_new(rk);
	rd_kafka_DescribeConfigs(rk, &broker, 1, NULL, replies);
	reply = rd_kafka_queue_poll(replies, TOPIC_PROBE_TIMEOUT_MS);
	if (reply)
	{
		if (rd_kafka_event_error(reply) == RD_KAFKA_RESP_ERR_NO_ERROR)
			creation = topic_creation_of(reply);
		rd_kafka_event_destroy(reply);
	}
	rd_kafka_queue_destroy(replies);
	rd_kafka_ConfigResource_destroy(broker);
	return creation;
}

/*
 * How long a topic the brokers do not know may take to appear: a broker that
 * creates topics on demand does so when first asked, and answers "unknown"
 * that once.
 */
static int
new_topic_window_ms(const TopicEntry *e)
{
	if (e->state != TOPIC_UNSEEN)
		return 0;
	if (topic_creation == CREATION_UNASKED)
		topic_creation = ask_topic_creation();
	return topic_creation == CREATION_OFF ? 0 : NEW_TOPIC_WINDOW_MS;
}

/*
 * Ask the brokers about a topic; see new_topic_window_ms().  Returns false
 * if they did not answer; the topic is then produced to as librdkafka sees
 * fit.
 */
static bool
probe_topic(TopicEntry *e)
{
	int64_t		started = now_ms();
	rd_kafka_resp_err_t err;

	for (;;)
	{
		if (!ask_brokers_about(e->name, &err))
			return false;
		if (!topic_is_missing(err))
		{
			e->state = TOPIC_EXISTS;
			return true;
		}
		if (now_ms() - started >= new_topic_window_ms(e))
		{
			mark_topic_missing(e, err);
			return true;
		}
		poll(NULL, 0, NEW_TOPIC_PROBE_INTERVAL_MS);
	}
}

static void
delivery_callback(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	rd_kafka_msg_status_t status = rd_kafka_message_status(m);

	outstanding--;
	if (transaction_note_delivery(m))
		return;
	if (topic_is_missing(m->err))
	{
		const char *name = rd_kafka_topic_name(m->rkt);

		mark_topic_missing(topic_entry(name, strlen(name)), m->err);
	}
	report_delivery((uint32_t) (uintptr_t) m->_private, m->err,
					status == RD_KAFKA_MSG_STATUS_NOT_PERSISTED ? DELIVERY_STATUS_NOT_PERSISTED :
					status == RD_KAFKA_MSG_STATUS_PERSISTED ? DELIVERY_STATUS_PERSISTED :
					DELIVERY_STATUS_POSSIBLY_PERSISTED,
					m->partition, m->offset);
}

/*
 * Make the producer from the CONFIGURE frame's properties, in their order,
 * the callbacks' last.
 */
bool
configure_producer(WireReader *r, char *reason, size_t reason_len)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();

	if (!set_properties(conf, r, "outbox.kafka_properties", reason, reason_len))
	{
		rd_kafka_conf_destroy(conf);
		return false;
	}
	set_callbacks(conf);
	rd_kafka_conf_set_dr_msg_cb(conf, delivery_callback);
	transaction_configure(conf);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, reason, reason_len);
	if (rk == NULL)
	{
		rd_kafka_conf_destroy(conf);
		return false;
	}
	/* logs on the main queue, served by rd_kafka_poll() on this thread */
	rd_kafka_set_log_queue(rk, NULL);
	return transaction_make_twin(reason, reason_len);
}

/*
 * The (topic, key) pairs of a PRODUCE frame that are held back.  A frame
 * holds a batch, a few thousand messages, so a list of the few that fail at
 * once is enough.  The strings point into the frame.
 */
typedef struct HeldKey
{
	const char *topic;
	const char *key;
	int32_t		topic_len;
	int32_t		key_len;
} HeldKey;

typedef struct HeldKeys
{
	HeldKey    *keys;
	int			count;
} HeldKeys;

static bool
key_held(const HeldKeys *held, const HeldKey *k)
{
	for (int i = 0; i < held->count; i++)
	{
		const HeldKey *h = &held->keys[i];

		if (h->topic_len == k->topic_len && h->key_len == k->key_len &&
			memcmp(h->topic, k->topic, k->topic_len) == 0 &&
			memcmp(h->key, k->key, k->key_len) == 0)
			return true;
	}
	return false;
}

static void
hold_key(HeldKeys *held, const HeldKey *k)
{
	held->keys = realloc(held->keys, (held->count + 1) * sizeof(HeldKey));
	if (held->keys == NULL)
		die("out of memory");
	held->keys[held->count++] = *k;
}

/* The headers of one message of a PRODUCE frame. */
static rd_kafka_headers_t *
read_headers(WireReader *r)
{
	uint32_t	count = wire_u32(r);
	rd_kafka_headers_t *headers = rd_kafka_headers_new(count);

	for (uint32_t i = 0; i < count && !r->failed; i++)
	{
		int32_t		name_len;
		int32_t		value_len;
		const char *name = wire_string(r, &name_len);
		const char *value = wire_string(r, &value_len);

		rd_kafka_header_add(headers, name, name_len, value, value ? value_len : 0);
	}
	return headers;
}

/* Hand one message to librdkafka, waiting while its queue is full. */
static rd_kafka_resp_err_t
produce_one(uint32_t token, int64_t timestamp_ms, int32_t partition,
			const char *topic, int32_t topic_len,
			const char *key, int32_t key_len, const char *value, int32_t value_len,
			rd_kafka_headers_t *headers)
{
	char		topic_name[KAFKA_MAX_TOPIC_LENGTH + 1];
	rd_kafka_resp_err_t err;

	if (topic_len > KAFKA_MAX_TOPIC_LENGTH)
		return RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION;
	memcpy(topic_name, topic, topic_len);
	topic_name[topic_len] = '\0';
	for (;;)
	{
		err = rd_kafka_producev(rk,
								RD_KAFKA_V_TOPIC(topic_name),
								RD_KAFKA_V_PARTITION(partition),
								RD_KAFKA_V_KEY(key, key ? key_len : 0),
								RD_KAFKA_V_VALUE((void *) value, value_len),
								RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
								RD_KAFKA_V_TIMESTAMP(timestamp_ms),
								RD_KAFKA_V_HEADERS(headers),
								RD_KAFKA_V_OPAQUE((void *) (uintptr_t) token),
								RD_KAFKA_V_END);
		if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
			return err;
		rd_kafka_poll(rk, QUEUE_FULL_WAIT_MS);
		write_to_worker();
	}
}

/* One message of a PRODUCE frame; its strings point into the frame. */
typedef struct FrameMessage
{
	uint32_t	token;
	int64_t		timestamp_ms;
	int32_t		partition;		/* RD_KAFKA_PARTITION_UA for the partitioner's */
	HeldKey		key;			/* its topic, and its key (NULL for none) */
	const char *value;
	int32_t		value_len;
	rd_kafka_headers_t *headers;
	TopicEntry *topic;
	bool		done;
} FrameMessage;

static FrameMessage *
read_messages(WireReader *r, uint32_t count)
{
	FrameMessage *messages = calloc(count ? count : 1, sizeof(FrameMessage));

	if (messages == NULL)
		die("out of memory");
	for (uint32_t i = 0; i < count; i++)
	{
		FrameMessage *m = &messages[i];

		m->token = wire_u32(r);
		m->timestamp_ms = wire_i64(r);
		m->partition = wire_i32(r);
		m->key.topic = wire_string(r, &m->key.topic_len);
		m->key.key = wire_string(r, &m->key.key_len);
		m->value = wire_string(r, &m->value_len);
		m->headers = read_headers(r);
		if (r->failed || m->key.topic == NULL)
			die("malformed PRODUCE frame");
		m->topic = topic_entry(m->key.topic, m->key.topic_len);
	}
	return messages;
}

/*
 * A message to a partition librdkafka does not know of may be to one the
 * topic gained since librdkafka last read its metadata (every
 * topic.metadata.refresh.interval.ms, 5 minutes): ask the brokers, which
 * refreshes it, once per frame for a topic, however many of its messages
 * name such a partition.  Returns whether they were asked, and so whether
 * producing again may now succeed.
 */
static bool
partition_may_be_new(FrameMessage *m)
{
	rd_kafka_resp_err_t err;

	if (m->partition == RD_KAFKA_PARTITION_UA ||
		m->topic->partitions_asked_in_frame == produce_frames)
		return false;
	m->topic->partitions_asked_in_frame = produce_frames;
	return ask_brokers_about(m->topic->name, &err);
}

/*
 * Report a message of a frame as not produced, for err; it holds back the
 * later messages of its key.  Its headers are still ours.
 */
static void
fail_message(FrameMessage *m, rd_kafka_resp_err_t err, HeldKeys *held)
{
	m->done = true;
	rd_kafka_headers_destroy(m->headers);
	report_delivery(m->token, err, DELIVERY_STATUS_NOT_PERSISTED, -1, -1);
	if (m->key.key != NULL)
		hold_key(held, &m->key);
}

/*
 * Produce one message of a frame, or report at once why not: an earlier
 * message of its key failed, its topic is missing, or librdkafka refuses
 * it.  A failure holds back the later messages of its key.
 */
static void
produce_message(FrameMessage *m, HeldKeys *held)
{
	rd_kafka_resp_err_t err;
	bool		keyed = m->key.key != NULL;

	m->done = true;
	if (keyed && key_held(held, &m->key))
	{
		rd_kafka_headers_destroy(m->headers);
		report_delivery(m->token, RD_KAFKA_RESP_ERR_NO_ERROR, DELIVERY_STATUS_HELD, -1, -1);
		return;
	}
	if (m->topic->state == TOPIC_MISSING)
		err = m->topic->error;
	else
	{
		err = produce_one(m->token, m->timestamp_ms, m->partition, m->key.topic, m->key.topic_len,
						  m->key.key, m->key.key_len, m->value, m->value_len, m->headers);
		if (err == RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION && partition_may_be_new(m))
			err = produce_one(m->token, m->timestamp_ms, m->partition, m->key.topic, m->key.topic_len,
							  m->key.key, m->key.key_len, m->value, m->value_len, m->headers);
	}
	if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		outstanding++;
		return;
	}
	fail_message(m, err, held);
}

/*
 * Produce every message of a PRODUCE frame, in order within each topic.
 * librdkafka holds a message to a topic it has no metadata for until the
 * topic is known, or for topic.metadata.propagation.max.ms (30 s) before it
 * fails it: one message to a missing topic would hold back the report on
 * the whole batch, and so every other topic.  So the messages of topics
 * known to exist (or known missing) go first, and then each new topic is
 * asked about, and its messages produced or failed at once.
 */
static void
produce(WireReader *r)
{
	uint32_t	count = wire_u32(r);
	FrameMessage *messages = read_messages(r, count);
	HeldKeys	held = {0};
	int64_t		now = now_ms();
	bool		brokers_answer = true;

	produce_frames++;

	/* no transaction, no message: the producer is unusable (reported) */
	if (!transaction_begin(rk))
		for (uint32_t i = 0; i < count; i++)
			fail_message(&messages[i], RD_KAFKA_RESP_ERR__FATAL, &held);
	for (uint32_t i = 0; i < count; i++)
		if (!messages[i].done && !topic_needs_probe(messages[i].topic, now))
			produce_message(&messages[i], &held);
	for (uint32_t i = 0; i < count; i++)
	{
		FrameMessage *m = &messages[i];

		if (m->done)
			continue;
		if (brokers_answer && topic_needs_probe(m->topic, now_ms()))
			brokers_answer = probe_topic(m->topic);
		produce_message(m, &held);
	}
	free(messages);
	free(held.keys);
}

static void
answer_metadata(WireReader *r)
{
	const struct rd_kafka_metadata *metadata;
	int32_t		timeout_ms = wire_i32(r);
	rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, NULL, &metadata, timeout_ms);
	size_t		frame;

	if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		rd_kafka_metadata_destroy(metadata);
	frame = begin_frame(WIRE_METADATA_REPLY);
	put_i32(err);
	end_frame(frame);
}

/* Withdraw every message not yet acknowledged: the worker's PURGE. */
static void
purge_all(WireReader *r)
{
	rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
}

/* Raise a fatal error, as outbox_simulate_fatal_error() asks: TEST_FATAL. */
static void
simulate_fatal_error(WireReader *r)
{
	rd_kafka_test_fatal_error(rk, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
							  "simulated by outbox_simulate_fatal_error()");
}

/* A message kafka_transaction.c produced, whose report is owed. */
void
producer_note_produced(void)
{
	outstanding++;
}

/* RECOVER, TRANSACTION_PROGRESS and END_TRANSACTION, for kafka_transaction.c. */
static void
recover(WireReader *r)
{
	transaction_recover(rk, r);
}

static void
transaction_progress_frame(WireReader *r)
{
	transaction_progress(rk, r);
}

static void
end_transaction(WireReader *r)
{
	transaction_end(&rk, r);
}

/* The frames the producer mode serves. */
static const ModeFrame producer_frames[] = {
	{WIRE_PRODUCE, produce},
	{WIRE_METADATA, answer_metadata},
	{WIRE_PURGE, purge_all},
	{WIRE_TEST_FATAL, simulate_fatal_error},
	{WIRE_RECOVER, recover},
	{WIRE_TRANSACTION_PROGRESS, transaction_progress_frame},
	{WIRE_END_TRANSACTION, end_transaction},
};

/* Wake the process when the handle's main queue has something (wake_fds). */
void
wake_on_queue(rd_kafka_t *handle)
{
	rd_kafka_queue_t *main_queue = rd_kafka_queue_get_main(handle);

	rd_kafka_queue_io_event_enable(main_queue, wake_fds[1], "!", 1);
	rd_kafka_queue_destroy(main_queue);
}

/*
 * Serve the worker's frames and librdkafka's queue until the worker closes
 * the socket: flushing while messages are outstanding, else waiting.
 */
int
serve_producer(void)
{
	Buffer		in = {0};

	wake_on_queue(rk);
	for (;;)
	{
		write_to_worker();
		wait_for_work(outstanding > 0 ? 0 : IDLE_WAIT_MS);
		if (!read_from_worker(&in, producer_frames, lengthof(producer_frames)))
			break;
		if (outstanding > 0)
			rd_kafka_flush(rk, FLUSH_SLICE_MS);
		else
			rd_kafka_poll(rk, 0);
		transaction_poll_twin();
	}

	/* the worker is gone: what is not acknowledged is its to claim again */
	transaction_close(rk);
	rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	rd_kafka_poll(rk, 0);
	rd_kafka_destroy(rk);
	forget_topics();
	free(in.data);
	return 0;
}

/*-------------------------------------------------------------------------
 *
 * kafka_consume.c
 *	  outbox_kafka's consumer mode: the consuming worker's (the inbox's)
 *	  Kafka consumer.
 *
 * Chosen by a first frame CONFIGURE_CONSUMER (kafka_process.c); kafka_wire.h
 * says what the frames mean.  The consumer joins no group and commits no
 * offset, since the worker keeps its offsets in its database: it assigns
 * itself every partition of the worker's topics (incremental assignments,
 * each partition once), from the offset the worker listed or from ASSIGN's
 * start, and asks the brokers again every PARTITION_RECHECK_MS for the
 * partitions the topics gained.  librdkafka's assign needs a group.id (it
 * makes no consumer group without one), so one is set, DEFAULT_GROUP_ID,
 * which the properties may replace: it is used to look up a coordinator
 * only, since without a subscription the consumer never joins, and with
 * auto commit and the offset store off it commits nothing.
 *
 * Messages are taken from librdkafka's consumer queue only while a FETCH is
 * outstanding: what the worker has not asked for waits in librdkafka's
 * prefetch queue, which queued.max.messages.kbytes bounds.  Logs and
 * errors arrive on the main queue, served every pass.  Both queues wake
 * the thread through the wake pipe.
 *
 * Asking the brokers about a topic's partitions and offsets blocks this
 * thread, each request for at most BROKER_REQUEST_TIMEOUT_MS: on ASSIGN
 * and at each recheck.  The worker never waits for it: what it writes
 * waits in the socket, and what is for it in the buffer.
 *
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>

#include "kafka_process.h"

/* The group.id that assign needs; see the header comment. */
#define DEFAULT_GROUP_ID "outbox_kafka-assign-only"

/* How long one request to the brokers may block the thread. */
#define BROKER_REQUEST_TIMEOUT_MS 2000

/*
 * How often the topics' partitions are asked about again: every topic
 * fully assigned, or some topic missing (or not fully resolved).
 */
#define PARTITION_RECHECK_MS 5000
#define MISSING_TOPIC_RECHECK_MS 1000

/* How many messages a MESSAGES frame's batch makes room for at first. */
#define INITIAL_BATCH_SIZE 256

/* A topic of ASSIGN, and which of its partitions are assigned. */
typedef struct ConsumedTopic
{
	char	   *name;
	bool	   *assigned;		/* by partition id, [0, known) */
	int32_t		known;
	rd_kafka_resp_err_t reported;	/* the last CONSUME_ERROR's, or none */
} ConsumedTopic;

/* The messages taken from librdkafka for the MESSAGES frame being made. */
typedef struct Batch
{
	rd_kafka_message_t **messages;
	uint32_t	count;
	uint32_t	cap;
	size_t		payload_bytes;	/* keys and values, for max_bytes */
	size_t		frame_bytes;	/* at most, for WIRE_MAX_FRAME_SIZE */
} Batch;

static rd_kafka_t *rk;
static rd_kafka_queue_t *main_queue;
static rd_kafka_queue_t *consumer_queue;

/* ASSIGN: the topics, the positions listed, the start of the others. */
static ConsumedTopic *topics;
static uint32_t topic_count;
static bool assign_received;
static rd_kafka_topic_partition_list_t *positions;
static int64_t start_ms;
static int64_t next_recheck_ms;

/* The FETCH outstanding, if any, and a message its batch had no room for. */
static bool fetching;
static uint32_t fetch_max_messages;
static uint32_t fetch_max_bytes;
static rd_kafka_message_t *held_over;

/*
 * Make the consumer: our defaults, then the CONFIGURE_CONSUMER frame's
 * properties in their order, then what this process depends on.
 */
bool
configure_consumer(WireReader *r, char *reason, size_t reason_len)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();

	set_property(conf, "group.id", DEFAULT_GROUP_ID);
	set_property(conf, "auto.offset.reset", "earliest");
	if (!set_properties(conf, r, "consumer properties", reason, reason_len) || r->failed)
	{
		if (r->failed)
			snprintf(reason, reason_len, "malformed CONFIGURE_CONSUMER frame");
		rd_kafka_conf_destroy(conf);
		return false;
	}
	/* the offsets are the worker's: nothing stored, nothing committed */
	set_property(conf, "enable.auto.commit", "false");
	set_property(conf, "enable.auto.offset.store", "false");
	set_property(conf, "enable.partition.eof", "false");
	set_callbacks(conf);
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, reason, reason_len);
	if (rk == NULL)
	{
		rd_kafka_conf_destroy(conf);
		return false;
	}
	/* logs on the main queue, served by rd_kafka_poll() on this thread */
	rd_kafka_set_log_queue(rk, NULL);
	if ((consumer_queue = rd_kafka_queue_get_consumer(rk)) == NULL)
	{
		snprintf(reason, reason_len, "consumer properties: group.id must not be empty");
		rd_kafka_destroy(rk);
		return false;
	}
	return true;
}

static void
report_consume_error(const char *topic, int32_t partition, rd_kafka_resp_err_t err,
					 const char *reason)
{
	size_t		frame = begin_frame(WIRE_CONSUME_ERROR);

	put_string(topic);
	put_i32(partition);
	put_i32(err);
	put_string(reason);
	end_frame(frame);
}

/* A topic's state, told to the worker when it changes to an error. */
static void
report_topic_state(ConsumedTopic *t, rd_kafka_resp_err_t err)
{
	if (err == t->reported)
		return;
	t->reported = err;
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		report_consume_error(t->name, -1, err, rd_kafka_err2str(err));
}

static bool
partition_assigned(const ConsumedTopic *t, int32_t partition)
{
	return partition < t->known && t->assigned[partition];
}

static void
mark_assigned(ConsumedTopic *t, int32_t partition)
{
	if (partition >= t->known)
	{
		if ((t->assigned = realloc(t->assigned, (partition + 1) * sizeof(bool))) == NULL)
			die("out of memory");
		memset(t->assigned + t->known, 0, (partition + 1 - t->known) * sizeof(bool));
		t->known = partition + 1;
	}
	t->assigned[partition] = true;
}

/*
 * The topic's partitions the brokers know and it has not assigned, in
 * *gained.  *answered is false if the brokers did not answer at all.
 */
static rd_kafka_resp_err_t
find_new_partitions(ConsumedTopic *t, rd_kafka_topic_partition_list_t **gained,
					bool *answered)
{
	rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, t->name, NULL);
	const struct rd_kafka_metadata *metadata;
	const struct rd_kafka_metadata_topic *about;
	rd_kafka_resp_err_t err;

	*answered = true;
	*gained = NULL;
	if (rkt == NULL)
		return rd_kafka_last_error();
	err = rd_kafka_metadata(rk, 0, rkt, &metadata, BROKER_REQUEST_TIMEOUT_MS);
	rd_kafka_topic_destroy(rkt);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		*answered = false;
		return err;
	}
	about = metadata->topic_cnt == 1 ? &metadata->topics[0] : NULL;
	err = about == NULL ? RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART : about->err;
	if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		*gained = rd_kafka_topic_partition_list_new(about->partition_cnt);
		for (int i = 0; i < about->partition_cnt; i++)
			if (!partition_assigned(t, about->partitions[i].id))
				rd_kafka_topic_partition_list_add(*gained, t->name, about->partitions[i].id);
	}
	rd_kafka_metadata_destroy(metadata);
	return err;
}

/*
 * Ask the leaders for an offset of each partition: the offset field holds
 * a timestamp, or RD_KAFKA_OFFSET_BEGINNING or _END, and comes back as the
 * offset.  Any partition not answered fails the whole.
 */
static rd_kafka_resp_err_t
list_offsets(rd_kafka_topic_partition_list_t *partitions)
{
	rd_kafka_resp_err_t err;

	for (int i = 0; i < partitions->cnt; i++)
		partitions->elems[i].err = RD_KAFKA_RESP_ERR__PARTIAL;
	if ((err = rd_kafka_offsets_for_times(rk, partitions, BROKER_REQUEST_TIMEOUT_MS)) != 0)
		return err;
	for (int i = 0; i < partitions->cnt; i++)
		if (partitions->elems[i].err != RD_KAFKA_RESP_ERR_NO_ERROR)
			return partitions->elems[i].err;
	return RD_KAFKA_RESP_ERR_NO_ERROR;
}

/* Where ASSIGN says to start a partition not listed: a timestamp, or -2. */
static int64_t
start_rule(void)
{
	return start_ms == WIRE_START_EARLIEST ? RD_KAFKA_OFFSET_BEGINNING : start_ms;
}

/*
 * Each partition's real first offset to read, in gained's offsets, and its
 * high watermark in highs' (the same partitions, in the same order).  The
 * watermarks are asked first: a partition with no message at or after
 * start_ms when asked next has none before that watermark either, so
 * starting there loses nothing.
 */
static rd_kafka_resp_err_t
resolve_starts(rd_kafka_topic_partition_list_t *gained,
			   rd_kafka_topic_partition_list_t *highs)
{
	rd_kafka_topic_partition_list_t *asked = rd_kafka_topic_partition_list_new(gained->cnt);
	rd_kafka_resp_err_t err;

	for (int i = 0; i < highs->cnt; i++)
		highs->elems[i].offset = RD_KAFKA_OFFSET_END;
	if ((err = list_offsets(highs)) != RD_KAFKA_RESP_ERR_NO_ERROR)
		goto done;
	for (int i = 0; i < gained->cnt; i++)
	{
		rd_kafka_topic_partition_t *p = &gained->elems[i];
		rd_kafka_topic_partition_t *listed =
			rd_kafka_topic_partition_list_find(positions, p->topic, p->partition);

		p->offset = listed && listed->offset >= 0 ? listed->offset : RD_KAFKA_OFFSET_INVALID;
		if (p->offset == RD_KAFKA_OFFSET_INVALID)
			rd_kafka_topic_partition_list_add(asked, p->topic, p->partition)->offset = start_rule();
	}
	if (asked->cnt > 0 && (err = list_offsets(asked)) != RD_KAFKA_RESP_ERR_NO_ERROR)
		goto done;
	for (int i = 0, j = 0; i < gained->cnt; i++)
	{
		rd_kafka_topic_partition_t *p = &gained->elems[i];

		if (p->offset == RD_KAFKA_OFFSET_INVALID)
		{
			int64_t		found = asked->elems[j++].offset;

			/* none stamped at or after start_ms: the partition's end */
			p->offset = found >= 0 ? found : highs->elems[i].offset;
		}
	}
done:
	rd_kafka_topic_partition_list_destroy(asked);
	return err;
}

/* ASSIGNED: where each partition newly assigned starts, and its watermark. */
static void
report_assigned(const rd_kafka_topic_partition_list_t *gained,
				const rd_kafka_topic_partition_list_t *highs)
{
	size_t		frame = begin_frame(WIRE_ASSIGNED);

	put_u32(gained->cnt);
	for (int i = 0; i < gained->cnt; i++)
	{
		int64_t		start = gained->elems[i].offset;
		int64_t		high = highs->elems[i].offset;

		put_string(gained->elems[i].topic);
		put_i32(gained->elems[i].partition);
		put_i64(start);
		/* messages may have come between the two questions */
		put_i64(high > start ? high : start);
	}
	end_frame(frame);
}

/* Start reading the partitions gained, each from its real offset. */
static rd_kafka_resp_err_t
assign(ConsumedTopic *t, rd_kafka_topic_partition_list_t *gained)
{
	rd_kafka_topic_partition_list_t *highs = rd_kafka_topic_partition_list_copy(gained);
	rd_kafka_resp_err_t err = resolve_starts(gained, highs);
	rd_kafka_error_t *error;

	if (err == RD_KAFKA_RESP_ERR_NO_ERROR &&
		(error = rd_kafka_incremental_assign(rk, gained)) != NULL)
	{
		err = rd_kafka_error_code(error);
		rd_kafka_error_destroy(error);
	}
	if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		for (int i = 0; i < gained->cnt; i++)
			mark_assigned(t, gained->elems[i].partition);
		report_assigned(gained, highs);
	}
	rd_kafka_topic_partition_list_destroy(highs);
	return err;
}

/*
 * Ask the brokers about each topic, and assign the partitions they gained;
 * a topic that cannot be read is told once, and asked about again sooner.
 * The pass ends at the first topic the brokers do not answer about.
 */
static void
recheck_topics(void)
{
	bool		all_read = true;

	for (uint32_t i = 0; i < topic_count; i++)
	{
		ConsumedTopic *t = &topics[i];
		rd_kafka_topic_partition_list_t *gained;
		bool		answered;
		rd_kafka_resp_err_t err = find_new_partitions(t, &gained, &answered);

		if (err == RD_KAFKA_RESP_ERR_NO_ERROR && gained->cnt > 0)
			err = assign(t, gained);
		if (gained)
			rd_kafka_topic_partition_list_destroy(gained);
		report_topic_state(t, err);
		all_read = all_read && err == RD_KAFKA_RESP_ERR_NO_ERROR;
		if (!answered)
			break;
	}
	next_recheck_ms = now_ms() + (all_read ? PARTITION_RECHECK_MS : MISSING_TOPIC_RECHECK_MS);
}

/* A count of a frame that cannot be larger than what is left of it. */
static uint32_t
wire_count(WireReader *r)
{
	uint32_t	count = wire_u32(r);

	if (count > (size_t) (r->end - r->pos) / sizeof(int32_t))
	{
		r->failed = true;
		return 0;
	}
	return count;
}

static bool
topic_listed(const char *name)
{
	for (uint32_t i = 0; i < topic_count; i++)
		if (strcmp(topics[i].name, name) == 0)
			return true;
	return false;
}

/* ASSIGN: what to read, then read it (the first recheck is due now). */
static void
take_assignment(WireReader *r)
{
	uint32_t	count;

	if (assign_received)
		die("a second ASSIGN frame");
	assign_received = true;
	start_ms = wire_i64(r);
	count = wire_count(r);
	if ((topics = calloc(count ? count : 1, sizeof(ConsumedTopic))) == NULL)
		die("out of memory");
	for (uint32_t i = 0; i < count && !r->failed; i++)
	{
		char	   *name = take_cstring(r);

		if (name == NULL || topic_listed(name))
			free(name);
		else
			topics[topic_count++].name = name;
	}
	count = wire_count(r);
	positions = rd_kafka_topic_partition_list_new(count);
	for (uint32_t i = 0; i < count && !r->failed; i++)
	{
		char	   *topic = take_cstring(r);
		int32_t		partition = wire_i32(r);
		int64_t		next_offset = wire_i64(r);

		if (topic != NULL && !r->failed)
			rd_kafka_topic_partition_list_add(positions, topic, partition)->offset = next_offset;
		free(topic);
	}
	next_recheck_ms = now_ms();
}

/* FETCH: the worker wants a MESSAGES frame of at most so many messages and bytes. */
static void
take_fetch(WireReader *r)
{
	if (fetching)
		die("a FETCH frame while another is outstanding");
	fetch_max_messages = wire_u32(r);
	fetch_max_bytes = wire_u32(r);
	/* a FETCH is answered with at least one message */
	if (fetch_max_messages == 0)
		fetch_max_messages = 1;
	fetching = true;
}

/* The frames the consumer mode serves. */
static const ModeFrame consumer_frames[] = {
	{WIRE_ASSIGN, take_assignment},
	{WIRE_FETCH, take_fetch},
};

/* The most a message can add to a MESSAGES frame, its watermark included. */
static size_t
message_frame_bytes(const rd_kafka_message_t *m)
{
	size_t		topic_len = strlen(rd_kafka_topic_name(m->rkt));
	size_t		bytes = 2 * (4 + topic_len + 4 + 8) + 8 + 4 + m->key_len + 4 + m->len + 4;
	rd_kafka_headers_t *headers;
	const char *name;
	const void *value;
	size_t		size;

	if (rd_kafka_message_headers(m, &headers) == RD_KAFKA_RESP_ERR_NO_ERROR)
		for (size_t i = 0; rd_kafka_header_get_all(headers, i, &name, &value, &size) == 0; i++)
			bytes += 4 + strlen(name) + 4 + size;
	return bytes;
}

/*
 * Add a message to the batch if the FETCH has room for it: the first
 * always, the others within max_messages and max_bytes (and the frame's
 * limit).
 */
static bool
batch_add(Batch *batch, rd_kafka_message_t *m)
{
	size_t		payload = m->key_len + m->len;
	size_t		frame = message_frame_bytes(m);

	if (batch->count > 0 &&
		(batch->count >= fetch_max_messages ||
		 batch->payload_bytes + payload > fetch_max_bytes ||
		 batch->frame_bytes + frame > WIRE_MAX_FRAME_SIZE - WIRE_FRAME_HEADER_SIZE - 8))
		return false;
	if (batch->count == batch->cap)
	{
		batch->cap = batch->cap ? batch->cap * 2 : INITIAL_BATCH_SIZE;
		batch->messages = realloc(batch->messages, batch->cap * sizeof(rd_kafka_message_t *));
		if (batch->messages == NULL)
			die("out of memory");
	}
	batch->messages[batch->count++] = m;
	batch->payload_bytes += payload;
	batch->frame_bytes += frame;
	return true;
}

static void
put_message(const rd_kafka_message_t *m)
{
	rd_kafka_timestamp_type_t timestamp_type;
	rd_kafka_headers_t *headers;
	const char *name;
	const void *value;
	size_t		size;
	uint32_t	header_count;

	put_string(rd_kafka_topic_name(m->rkt));
	put_i32(m->partition);
	put_i64(m->offset);
	put_i64(rd_kafka_message_timestamp(m, &timestamp_type));
	put_bytes(m->key, m->key_len);
	put_bytes(m->payload, m->len);
	if (rd_kafka_message_headers(m, &headers) != RD_KAFKA_RESP_ERR_NO_ERROR)
		headers = NULL;
	header_count = headers ? rd_kafka_header_cnt(headers) : 0;
	put_u32(header_count);
	for (uint32_t i = 0; i < header_count; i++)
	{
		rd_kafka_header_get_all(headers, i, &name, &value, &size);
		put_string(name);
		put_bytes(value, size);
	}
}

static bool
same_partition(const rd_kafka_message_t *a, const rd_kafka_message_t *b)
{
	return a->partition == b->partition &&
		strcmp(rd_kafka_topic_name(a->rkt), rd_kafka_topic_name(b->rkt)) == 0;
}

/*
 * The high watermark of each partition of the batch, as librdkafka last
 * heard it from a fetch: no request to the brokers.
 */
static void
put_watermarks(const Batch *batch)
{
	const rd_kafka_message_t **firsts = malloc(batch->count * sizeof(rd_kafka_message_t *));
	uint32_t	count = 0;

	if (firsts == NULL)
		die("out of memory");
	for (uint32_t i = 0; i < batch->count; i++)
	{
		uint32_t	seen = 0;

		while (seen < count && !same_partition(firsts[seen], batch->messages[i]))
			seen++;
		if (seen == count)
			firsts[count++] = batch->messages[i];
	}
	put_u32(count);
	for (uint32_t i = 0; i < count; i++)
	{
		const char *topic = rd_kafka_topic_name(firsts[i]->rkt);
		int64_t		low;
		int64_t		high;

		if (rd_kafka_get_watermark_offsets(rk, topic, firsts[i]->partition, &low, &high) != 0)
			high = RD_KAFKA_OFFSET_INVALID;
		put_string(topic);
		put_i32(firsts[i]->partition);
		put_i64(high);
	}
	free(firsts);
}

/* Answer the FETCH with the batch, and give the messages back. */
static void
send_messages(Batch *batch)
{
	size_t		frame = begin_frame(WIRE_MESSAGES);

	put_u32(batch->count);
	for (uint32_t i = 0; i < batch->count; i++)
		put_message(batch->messages[i]);
	put_watermarks(batch);
	end_frame(frame);
	for (uint32_t i = 0; i < batch->count; i++)
		rd_kafka_message_destroy(batch->messages[i]);
	batch->count = 0;
	fetching = false;
}

static void
report_message_error(rd_kafka_message_t *m)
{
	report_consume_error(m->rkt ? rd_kafka_topic_name(m->rkt) : NULL, m->partition,
						 m->err, rd_kafka_message_errstr(m));
	rd_kafka_message_destroy(m);
}

static rd_kafka_message_t *
next_message(void)
{
	rd_kafka_message_t *m = held_over;

	held_over = NULL;
	return m ? m : rd_kafka_consumer_poll(rk, 0);
}

/*
 * Answer the outstanding FETCH, if librdkafka has a message for it: what
 * its queue has now, up to the FETCH's limits; the message that does not
 * fit waits for the next.  An error in the queue ends the batch there, so
 * that it comes after the messages before it.
 */
static void
serve_fetch(void)
{
	Batch		batch = {0};
	rd_kafka_message_t *m;

	while (fetching && (m = next_message()) != NULL)
	{
		if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			if (batch.count > 0)
				send_messages(&batch);
			report_message_error(m);
			continue;
		}
		if (!batch_add(&batch, m))
		{
			held_over = m;
			break;
		}
	}
	if (batch.count > 0)
		send_messages(&batch);
	free(batch.messages);
}

/* How long the loop may wait: until the next recheck at the latest. */
static int
wait_ms(void)
{
	int64_t		until_recheck;

	if (!assign_received)
		return IDLE_WAIT_MS;
	until_recheck = next_recheck_ms - now_ms();
	if (until_recheck <= 0)
		return 0;
	return until_recheck < IDLE_WAIT_MS ? (int) until_recheck : IDLE_WAIT_MS;
}

/* The worker is gone: close the consumer, and free what is left. */
static void
close_consumer(void)
{
	if (held_over)
		rd_kafka_message_destroy(held_over);
	/* the consumer queue's handle goes first, as librdkafka requires */
	rd_kafka_queue_destroy(consumer_queue);
	rd_kafka_consumer_close(rk);
	rd_kafka_queue_destroy(main_queue);
	rd_kafka_destroy(rk);
	if (positions)
		rd_kafka_topic_partition_list_destroy(positions);
	for (uint32_t i = 0; i < topic_count; i++)
	{
		free(topics[i].name);
		free(topics[i].assigned);
	}
	free(topics);
}

/*
 * Serve the worker's frames and librdkafka's queues until the worker closes
 * the socket: logs and errors every pass, the topics when a recheck is due,
 * messages when a FETCH is outstanding.
 */
int
serve_consumer(void)
{
	Buffer		in = {0};

	main_queue = rd_kafka_queue_get_main(rk);
	rd_kafka_queue_io_event_enable(main_queue, wake_fds[1], "!", 1);
	rd_kafka_queue_io_event_enable(consumer_queue, wake_fds[1], "!", 1);
	for (;;)
	{
		write_to_worker();
		wait_for_work(wait_ms());
		if (!read_from_worker(&in, consumer_frames, lengthof(consumer_frames)))
			break;
		rd_kafka_poll(rk, 0);
		if (assign_received && now_ms() >= next_recheck_ms)
			recheck_topics();
		serve_fetch();
	}
	close_consumer();
	free(in.data);
	return 0;
}

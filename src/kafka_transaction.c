/*-------------------------------------------------------------------------
 *
 * kafka_transaction.c
 *	  outbox_kafka's transactions, for a producer made with a
 *	  transactional.id (outbox.delivery = exactly_once): each batch is one
 *	  Kafka transaction with a progress record that lists its messages; the
 *	  progress records are read back when a producer starts.
 *
 * A transaction begins with the worker's first TRANSACTION_PROGRESS frame
 * after the last one ended: the progress record the worker built for the
 * PRODUCE frame that follows is produced at once, in partition 0 of the
 * progress topic, keyed by the transactional.id, so that it travels with
 * the messages it lists (its partition is registered with theirs, and its
 * acknowledgement comes with theirs), not after them.  The transaction
 * ends with the worker's END_TRANSACTION frame: commit or abort.  A
 * progress record that could not be produced dooms its transaction to an
 * abort.  rd_kafka_commit_transaction() flushes first, so every delivery
 * report of the transaction is sent before its outcome.
 * What is said of a commit is certain but for a fatal error (the producer
 * fenced, or gone in an unknown state): the worker then makes a new
 * producer, whose RECOVER finds out.
 *
 * Two producers take turns, a transaction each: the worker's, of its
 * transactional.id, and its twin (see TWIN_SUFFIX).  Both key their
 * progress records by the worker's transactional.id.  The worker's frames
 * go to the producer whose turn it is; both queues are served.
 *
 * RECOVER, the first frame after READY: init_transactions() fences every
 * earlier producer of each transactional.id and completes its last
 * transaction, committed or aborted; a start record of each, in a
 * transaction of its own, then marks where their life begins.  The
 * progress records of the transactional.id from the worker's offset up to
 * the later mark are read with isolation.level=read_committed, so those of
 * the transactions that committed and only those, and sent to the worker,
 * which settles the messages they list that its database still holds.
 * Reading up to a record written after the fence, not up to the end the
 * brokers report, is what makes the read whole: the end a read_committed
 * consumer sees can stop short of our last records while another
 * producer's transaction is open below them.
 *
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>

#include "kafka_process.h"

/* The group.id that assign needs (the reader joins no group, commits nothing). */
#define READER_GROUP_ID "outbox_kafka-progress-reader"

/* How many times a commit that timed out is tried again before its outcome is left unknown. */
#define COMMIT_RETRIES 3

/* How long the abort of a transaction the worker left open may take. */
#define CLOSE_ABORT_TIMEOUT_MS 1500

/*
 * What a progress record takes besides its value and key: the record's and
 * its batch's framing, as librdkafka counts them against message.max.bytes.
 */
#define PROGRESS_RECORD_SLACK 128

/* How long one poll of the reader waits. */
#define READER_POLL_MS 100

/* The partition the progress records go to: one, so one read finds them all. */
#define PROGRESS_PARTITION 0

static char *transactional_id;	/* NULL: not a transactional producer */
static rd_kafka_conf_t *reader_conf;	/* the producer's, for the reader */

/*
 * The producer's twin, of transactional.id + TWIN_SUFFIX, made with the
 * same properties: the two take turns, a transaction each.  A transaction
 * that begins on the producer whose last one just ended would have its
 * partitions refused while the coordinator completes that one
 * (CONCURRENT_TRANSACTIONS), and librdkafka asks again only 20 ms later,
 * a fixed backoff; the twin's last transaction ended a whole batch ago.
 * The worker's producer and its twin swap after each transaction ends.
 */
#define TWIN_SUFFIX "-twin"
static rd_kafka_conf_t *twin_conf;
static rd_kafka_t *twin;
static char *progress_topic;
static bool transaction_open;
static bool transaction_doomed;	/* a progress record of it was not produced */

/*
 * How many messages one progress record lists at most, so that it stays
 * within message.max.bytes: a batch's list is split over as many records
 * as that takes, all in its transaction.
 */
static uint32_t max_entries_per_record;

/* The progress record's delivery report: its opaque, and its offset. */
static char progress_opaque;
static int64_t progress_offset;
static rd_kafka_resp_err_t progress_error;

/*
 * Before the producer is made from conf: note whether it is transactional,
 * and keep a copy of its properties (brokers, security) for the reader.
 */
void
transaction_configure(rd_kafka_conf_t *conf)
{
	char		value[512];
	size_t		len = sizeof(value);

	if (rd_kafka_conf_get(conf, "transactional.id", value, &len) != RD_KAFKA_CONF_OK ||
		value[0] == '\0')
		return;
	if ((transactional_id = strdup(value)) == NULL)
		die("out of memory");
	reader_conf = rd_kafka_conf_dup(conf);
	twin_conf = rd_kafka_conf_dup(conf);
	if (strlen(value) + strlen(TWIN_SUFFIX) >= sizeof(value))
		die("transactional.id too long");
	strcat(value, TWIN_SUFFIX);
	set_property(twin_conf, "transactional.id", value);

	len = sizeof(value);
	if (rd_kafka_conf_get(conf, "message.max.bytes", value, &len) != RD_KAFKA_CONF_OK)
		die("message.max.bytes has no value");
	max_entries_per_record = (uint32_t)
		((atol(value) - PROGRESS_HEADER_SIZE - PROGRESS_RECORD_SLACK - (long) strlen(transactional_id)) /
		 PROGRESS_ENTRY_SIZE);
	if (max_entries_per_record < 1)
		max_entries_per_record = 1;
}

/*
 * After the producer is made: make its twin.  Its logs and reports are on
 * its main queue, which wakes the process as the producer's does.  Returns
 * false, with the reason, if it could not be made.
 */
bool
transaction_make_twin(char *reason, size_t reason_len)
{
	if (twin_conf == NULL)
		return true;
	twin = rd_kafka_new(RD_KAFKA_PRODUCER, twin_conf, reason, reason_len);
	if (twin == NULL)
		rd_kafka_conf_destroy(twin_conf);
	twin_conf = NULL;			/* the twin's, if it was made */
	if (twin == NULL)
		return false;
	rd_kafka_set_log_queue(twin, NULL);
	wake_on_queue(twin);
	return true;
}

/* Serve the twin's queue: its reports and logs. */
void
transaction_poll_twin(void)
{
	if (twin)
		rd_kafka_poll(twin, 0);
}

/* Report an rd_kafka_error_t as an ERROR frame, and free it. */
static rd_kafka_resp_err_t
report_error(rd_kafka_error_t *error, const char *doing)
{
	char		text[1024];
	rd_kafka_resp_err_t code = rd_kafka_error_code(error);

	snprintf(text, sizeof(text), "%s: %s", doing, rd_kafka_error_string(error));
	report_text(WIRE_ERROR, rd_kafka_error_is_fatal(error) ? RD_KAFKA_RESP_ERR__FATAL : code,
				NULL, text);
	rd_kafka_error_destroy(error);
	return code;
}

/*
 * Before a PRODUCE frame's messages: begin a transaction if none is open.
 * Returns false if none could be begun (the error is reported): the
 * messages are then not produced.
 */
bool
transaction_begin(rd_kafka_t *rk)
{
	rd_kafka_error_t *error;

	if (!transactional_id || transaction_open)
		return true;
	if ((error = rd_kafka_begin_transaction(rk)) != NULL)
	{
		report_error(error, "cannot begin a Kafka transaction");
		return false;
	}
	transaction_open = true;
	transaction_doomed = false;
	progress_offset = -1;
	return true;
}

/* Is this delivery report the progress record's?  Notes its offset if so. */
bool
transaction_note_delivery(const rd_kafka_message_t *m)
{
	if (m->_private != &progress_opaque)
		return false;
	progress_error = m->err;
	progress_offset = m->err ? -1 : m->offset;
	return true;
}

/* Produce a progress record into the open transaction. */
static rd_kafka_resp_err_t
produce_progress(rd_kafka_t *rk, const void *value, size_t len)
{
	rd_kafka_resp_err_t err;

	progress_error = RD_KAFKA_RESP_ERR_NO_ERROR;
	err = rd_kafka_producev(rk,
							RD_KAFKA_V_TOPIC(progress_topic),
							RD_KAFKA_V_PARTITION(PROGRESS_PARTITION),
							RD_KAFKA_V_KEY(transactional_id, strlen(transactional_id)),
							RD_KAFKA_V_VALUE((void *) value, len),
							RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
							RD_KAFKA_V_OPAQUE(&progress_opaque),
							RD_KAFKA_V_END);
	if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		producer_note_produced();
	return err;
}

/*
 * Produce a batch's progress record, split into records of at most
 * max_entries_per_record messages each.
 */
static rd_kafka_resp_err_t
produce_progress_records(rd_kafka_t *rk, const char *value)
{
	uint32_t	count = (uint32_t) progress_get_le(value + 5, 4);
	uint32_t	most = count < max_entries_per_record ? count : max_entries_per_record;
	char	   *record = malloc(PROGRESS_HEADER_SIZE + (size_t) most * PROGRESS_ENTRY_SIZE);
	rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;

	if (record == NULL)
		die("out of memory");
	for (uint32_t done = 0; done < count && err == RD_KAFKA_RESP_ERR_NO_ERROR; done += most)
	{
		uint32_t	n = count - done < most ? count - done : most;

		progress_header(record, PROGRESS_KIND_BATCH, n);
		memcpy(record + PROGRESS_HEADER_SIZE,
			   value + PROGRESS_HEADER_SIZE + (size_t) done * PROGRESS_ENTRY_SIZE,
			   (size_t) n * PROGRESS_ENTRY_SIZE);
		err = produce_progress(rk, record, PROGRESS_HEADER_SIZE + (size_t) n * PROGRESS_ENTRY_SIZE);
	}
	free(record);
	return err;
}

/* Abort the open transaction; *code says if even that failed. */
static WireTransactionOutcome
abort_open(rd_kafka_t *rk, rd_kafka_resp_err_t *code)
{
	rd_kafka_error_t *error = rd_kafka_abort_transaction(rk, -1);

	if (error != NULL)
	{
		/* not committed: the next init_transactions() aborts it for good */
		report_error(error, "cannot abort the Kafka transaction");
		*code = RD_KAFKA_RESP_ERR__FATAL;
	}
	return TRANSACTION_ABORTED;
}

/*
 * TRANSACTION_PROGRESS: begin a transaction if none is open, and produce the
 * progress record of the PRODUCE frame that follows into it.  If it cannot
 * be, the transaction is doomed: committed, it would hold messages that no
 * progress record lists.
 */
void
transaction_progress(rd_kafka_t *rk, WireReader *r)
{
	int32_t		len;
	const char *value = wire_string(r, &len);
	rd_kafka_resp_err_t err;

	if (r->failed || value == NULL || progress_kind(value, len) != PROGRESS_KIND_BATCH)
		die("malformed TRANSACTION_PROGRESS frame");
	if (!transaction_begin(rk))
		return;					/* reported; the PRODUCE frame fails too */
	if ((err = produce_progress_records(rk, value)) != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		transaction_doomed = true;
		report_text(WIRE_ERROR, err, NULL, "cannot produce the progress record");
	}
}

/*
 * Commit the open transaction; a timeout is tried again, as librdkafka asks,
 * a few times, each within the transaction's own timeout (-1).  An error
 * that requires an abort aborts it; any other leaves the outcome unknown.
 */
static WireTransactionOutcome
commit(rd_kafka_t *rk, rd_kafka_resp_err_t *code, char *reason, size_t reason_len)
{
	rd_kafka_error_t *error;

	for (int tries = 0;
		 (error = rd_kafka_commit_transaction(rk, -1)) != NULL &&
		 rd_kafka_error_is_retriable(error) && tries < COMMIT_RETRIES; tries++)
		rd_kafka_error_destroy(error);
	if (error == NULL)
		return TRANSACTION_COMMITTED;

	*code = rd_kafka_error_code(error);
	snprintf(reason, reason_len, "%s", rd_kafka_error_string(error));
	if (rd_kafka_error_is_fatal(error) || !rd_kafka_error_txn_requires_abort(error))
	{
		rd_kafka_error_destroy(error);
		return TRANSACTION_UNKNOWN;
	}
	rd_kafka_error_destroy(error);
	return abort_open(rk, code);
}

/*
 * END_TRANSACTION: commit (unless doomed) or abort the open transaction, and
 * say how it ended: TRANSACTION_RESULT.
 */
void
transaction_end(rd_kafka_t **rkp, WireReader *r)
{
	rd_kafka_t *rk = *rkp;
	bool		to_commit = wire_u8(r) != 0;
	WireTransactionOutcome outcome = TRANSACTION_NONE;
	rd_kafka_resp_err_t code = RD_KAFKA_RESP_ERR_NO_ERROR;
	char		reason[512] = "";
	size_t		frame;

	if (r->failed)
		return;
	if (transaction_open && transaction_doomed && to_commit)
		snprintf(reason, sizeof(reason), "a progress record of it could not be produced");
	if (transaction_open && to_commit && !transaction_doomed)
		outcome = commit(rk, &code, reason, sizeof(reason));
	else if (transaction_open)
		outcome = abort_open(rk, &code);
	if (transaction_open && twin && outcome != TRANSACTION_UNKNOWN)
	{
		*rkp = twin;
		twin = rk;
	}
	transaction_open = false;

	frame = begin_frame(WIRE_TRANSACTION_RESULT);
	put(&(uint8_t) {outcome}, 1);
	put_i32(code);
	put_string(reason);
	put_i64(outcome == TRANSACTION_COMMITTED ? progress_offset : -1);
	end_frame(frame);
}

/* At the worker's end: a transaction it did not end is aborted. */
void
transaction_close(rd_kafka_t *rk)
{
	if (transaction_open)
	{
		rd_kafka_error_t *error = rd_kafka_abort_transaction(rk, CLOSE_ABORT_TIMEOUT_MS);

		if (error)
			rd_kafka_error_destroy(error);
	}
	if (twin)
	{
		rd_kafka_purge(twin, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
		rd_kafka_poll(twin, 0);
		rd_kafka_destroy(twin);
	}
	if (twin_conf)
		rd_kafka_conf_destroy(twin_conf);
	if (reader_conf)
		rd_kafka_conf_destroy(reader_conf);
	free(transactional_id);
	free(progress_topic);
}

/*
 * The reader's logs: librdkafka warns of each producer property it was
 * given (CONFWARN), which it was, being the producer's copy.
 */
static void
reader_log(const rd_kafka_t *rk, int level, const char *facility, const char *message)
{
	if (strcmp(facility, "CONFWARN") != 0)
		report_text(WIRE_LOG, level, facility, message);
}

static rd_kafka_t *
make_reader(char *reason, size_t reason_len)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_dup(reader_conf);
	rd_kafka_t *reader;

	set_property(conf, "group.id", READER_GROUP_ID);
	set_property(conf, "isolation.level", "read_committed");
	set_property(conf, "enable.auto.commit", "false");
	set_property(conf, "enable.auto.offset.store", "false");
	set_property(conf, "enable.partition.eof", "false");
	set_property(conf, "log.queue", "true");
	rd_kafka_conf_set_log_cb(conf, reader_log);
	reader = rd_kafka_new(RD_KAFKA_CONSUMER, conf, reason, reason_len);
	if (reader == NULL)
		rd_kafka_conf_destroy(conf);
	else
		rd_kafka_set_log_queue(reader, NULL);
	return reader;
}

/* What RECOVER found, for its PROGRESS answer. */
typedef struct Recovery
{
	rd_kafka_resp_err_t error;
	char		reason[512];
	int64_t		start_offset;	/* the first start record's: where the next RECOVER reads from */
	int64_t		read_to;		/* the last start record's: the read ends there */
	int64_t		gone;			/* records below the worker's offset that retention removed */
	Buffer		records;		/* count x (value) of the progress records found */
	uint32_t	count;
} Recovery;

static bool
failed(Recovery *rec, rd_kafka_resp_err_t err, const char *doing, const char *why)
{
	rec->error = err ? err : RD_KAFKA_RESP_ERR__FAIL;
	snprintf(rec->reason, sizeof(rec->reason), "%s: %s", doing, why ? why : rd_kafka_err2str(err));
	return false;
}

static bool
failed_with(Recovery *rec, rd_kafka_error_t *error, const char *doing)
{
	failed(rec, rd_kafka_error_code(error), doing, rd_kafka_error_string(error));
	rd_kafka_error_destroy(error);
	return false;
}

/*
 * Make sure the progress topic exists: made with one partition and the
 * brokers' default replication, if it does not.  Its retention must outlast
 * the longest time a publisher may stay down (operations documentation).
 */
static bool
create_progress_topic(rd_kafka_t *rk, int timeout_ms, Recovery *rec)
{
	char		errstr[512];
	rd_kafka_NewTopic_t *topic = rd_kafka_NewTopic_new(progress_topic, 1, -1,
													   errstr, sizeof(errstr));
	rd_kafka_queue_t *replies = rd_kafka_queue_new(rk);
	rd_kafka_event_t *reply;
	bool		ok = false;

	if (topic == NULL)
		return failed(rec, RD_KAFKA_RESP_ERR__INVALID_ARG, "cannot make the progress topic", errstr);
	rd_kafka_CreateTopics(rk, &topic, 1, NULL, replies);
	reply = rd_kafka_queue_poll(replies, timeout_ms);
	if (reply == NULL)
		failed(rec, RD_KAFKA_RESP_ERR__TIMED_OUT, "cannot make the progress topic", NULL);
	else
	{
		const rd_kafka_CreateTopics_result_t *result = rd_kafka_event_CreateTopics_result(reply);
		size_t		n = 0;
		const rd_kafka_topic_result_t **topics = result ?
			rd_kafka_CreateTopics_result_topics(result, &n) : NULL;
		rd_kafka_resp_err_t err = rd_kafka_event_error(reply);

		if (err == RD_KAFKA_RESP_ERR_NO_ERROR && n == 1)
			err = rd_kafka_topic_result_error(topics[0]);
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR || err == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
			ok = true;
		else
			failed(rec, err, "cannot make the progress topic",
				   n == 1 ? rd_kafka_topic_result_error_string(topics[0]) : NULL);
		rd_kafka_event_destroy(reply);
	}
	rd_kafka_queue_destroy(replies);
	rd_kafka_NewTopic_destroy(topic);
	return ok;
}

/* Does the progress topic exist?  Made if not; false if that failed. */
static bool
ensure_progress_topic(rd_kafka_t *rk, int timeout_ms, Recovery *rec)
{
	rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, progress_topic, NULL);
	const struct rd_kafka_metadata *metadata;
	rd_kafka_resp_err_t err;
	bool		exists;

	if (rkt == NULL)
		return failed(rec, rd_kafka_last_error(), "the progress topic", NULL);
	err = rd_kafka_metadata(rk, 0, rkt, &metadata, timeout_ms);
	rd_kafka_topic_destroy(rkt);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		return failed(rec, err, "cannot ask the brokers about the progress topic", NULL);
	exists = metadata->topic_cnt == 1 && metadata->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR &&
		metadata->topics[0].partition_cnt > 0;
	rd_kafka_metadata_destroy(metadata);
	return exists || create_progress_topic(rk, timeout_ms, rec);
}

/*
 * Commit a transaction holding only a start record: where this producer's
 * life begins.  Sets rec->start_offset.
 */
static bool
write_start_record(rd_kafka_t *rk, Recovery *rec)
{
	char		value[PROGRESS_HEADER_SIZE];
	rd_kafka_error_t *error;
	rd_kafka_resp_err_t err;

	progress_header(value, PROGRESS_KIND_START, 0);
	if ((error = rd_kafka_begin_transaction(rk)) != NULL)
		return failed_with(rec, error, "cannot begin a Kafka transaction");
	transaction_open = true;
	if ((err = produce_progress(rk, value, sizeof(value))) != RD_KAFKA_RESP_ERR_NO_ERROR)
		return failed(rec, err, "cannot produce the start record", NULL);
	if ((error = rd_kafka_commit_transaction(rk, -1)) != NULL)
		return failed_with(rec, error, "cannot commit the start record");
	transaction_open = false;
	if (progress_offset < 0)
		return failed(rec, progress_error, "the start record has no offset", NULL);
	if (rec->start_offset < 0)
		rec->start_offset = progress_offset;
	rec->read_to = progress_offset;
	return true;
}

/* Keep a progress record of ours that lists messages. */
static void
keep_record(Recovery *rec, const rd_kafka_message_t *m)
{
	int32_t		len;

	if (m->key_len != strlen(transactional_id) ||
		memcmp(m->key, transactional_id, m->key_len) != 0 ||
		progress_kind(m->payload, m->len) != PROGRESS_KIND_BATCH)
		return;
	len = (int32_t) m->len;
	buffer_append(&rec->records, &len, sizeof(len));
	buffer_append(&rec->records, m->payload, m->len);
	rec->count++;
}

/*
 * Read the committed progress records of partition 0 from `from` up to the
 * start record.  Below the log's start, retention has removed some: they
 * are counted as gone.
 */
static bool
read_progress(int64_t from, int timeout_ms, Recovery *rec)
{
	char		why[512];
	rd_kafka_t *reader = make_reader(why, sizeof(why));
	rd_kafka_topic_partition_list_t *assignment;
	int64_t		low;
	int64_t		high;
	int64_t		deadline = now_ms() + timeout_ms;
	rd_kafka_resp_err_t err;
	bool		done = false;

	if (reader == NULL)
		return failed(rec, RD_KAFKA_RESP_ERR__INVALID_ARG, "cannot make the progress reader", why);
	err = rd_kafka_query_watermark_offsets(reader, progress_topic, PROGRESS_PARTITION,
										   &low, &high, timeout_ms);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		rd_kafka_destroy(reader);
		return failed(rec, err, "cannot read the progress topic's offsets", NULL);
	}
	if (from < low)
	{
		rec->gone = low - from;
		from = low;
	}
	assignment = rd_kafka_topic_partition_list_new(1);
	rd_kafka_topic_partition_list_add(assignment, progress_topic, PROGRESS_PARTITION)->offset = from;
	err = rd_kafka_assign(reader, assignment);
	rd_kafka_topic_partition_list_destroy(assignment);

	while (err == RD_KAFKA_RESP_ERR_NO_ERROR && !done)
	{
		rd_kafka_message_t *m = rd_kafka_consumer_poll(reader, READER_POLL_MS);

		rd_kafka_poll(reader, 0);	/* its logs */
		if (m == NULL)
		{
			if (now_ms() >= deadline)
				err = RD_KAFKA_RESP_ERR__TIMED_OUT;
			continue;
		}
		if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR)
			err = m->err;
		else if (m->offset >= rec->read_to)
			done = true;
		else
			keep_record(rec, m);
		rd_kafka_message_destroy(m);
	}
	rd_kafka_consumer_close(reader);
	rd_kafka_destroy(reader);
	return done || failed(rec, err, "cannot read the progress topic", NULL);
}

static void
answer_recovery(Recovery *rec)
{
	size_t		frame = begin_frame(WIRE_PROGRESS);

	put_i32(rec->error);
	put_string(rec->reason);
	put_i64(rec->start_offset);
	put_i64(rec->gone);
	put_u32(rec->count);
	put(rec->records.data, rec->records.len);
	end_frame(frame);
	free(rec->records.data);
}

/*
 * Start one producer of the pair: fence its predecessors, and commit its
 * start record.  The progress topic is made before the first's.
 */
static bool
start_producer(rd_kafka_t *producer, int timeout_ms, Recovery *rec)
{
	rd_kafka_error_t *error = rd_kafka_init_transactions(producer, timeout_ms);

	if (error != NULL)
		return failed_with(rec, error, "cannot initialize Kafka transactions");
	return (rec->start_offset >= 0 || ensure_progress_topic(producer, timeout_ms, rec)) &&
		write_start_record(producer, rec);
}

/*
 * RECOVER: progress topic, the offset to read from (-1 the first time),
 * and how long each step may take.  Answers PROGRESS.
 */
void
transaction_recover(rd_kafka_t *rk, WireReader *r)
{
	char	   *topic = take_cstring(r);
	int64_t		from = wire_i64(r);
	int32_t		timeout_ms = wire_i32(r);
	Recovery	rec = {0};

	if (r->failed || topic == NULL || !transactional_id)
		die("malformed RECOVER frame");
	free(progress_topic);
	progress_topic = topic;
	rec.start_offset = -1;

	if (start_producer(rk, timeout_ms, &rec) && start_producer(twin, timeout_ms, &rec) &&
		from >= 0)
		read_progress(from, timeout_ms, &rec);
	answer_recovery(&rec);
}

/*-------------------------------------------------------------------------
 *
 * producer.c
 *	  The worker's Kafka producer, on librdkafka.
 *
 * librdkafka runs threads of its own; PostgreSQL's code is not thread-safe.
 * So the producer is made in the worker, never in the postmaster; its
 * threads start with every signal blocked, so PostgreSQL's signals reach the
 * worker's own thread only; and its logs, errors and delivery reports are
 * all queued and served on the worker's thread by rd_kafka_poll(), which is
 * the only place the callbacks below run.  So, on the worker's thread,
 * they may ereport below ERROR and report to the worker's slot; they never
 * raise an ERROR, which would unwind through librdkafka's frames.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <pthread.h>
#include <signal.h>
#include <librdkafka/rdkafka.h>

#include "miscadmin.h"
#include "postmaster/interrupt.h"
#include "utils/memutils.h"

#include "producer.h"
#include "settings.h"
#include "worker_slot.h"

/*
 * How long one rd_kafka_flush() in the wait for delivery reports may block:
 * short, so that a shutdown or a fatal error is seen at once.
 */
#define FLUSH_WAIT_MS 50

/* How long to serve reports when librdkafka's queue is full, before trying again. */
#define QUEUE_FULL_WAIT_MS 100

/*
 * librdkafka reports every message within message.timeout.ms; past that and
 * this slack, the worker withdraws what is left.
 */
#define REPORT_DEADLINE_SLACK_MS 5000

/* How long a batch Kafka has in hand may still be acknowledged at shutdown. */
#define SHUTDOWN_GRACE_MS 2000

/*
 * How long to wait for the reports of withdrawn messages, which a broker
 * that never answers a request may never send.
 */
#define WITHDRAWN_REPORT_WAIT_MS 10000

struct OutboxProducer
{
	rd_kafka_t *rk;
	char	   *brokers;		/* the settings it was made with */
	char	   *kafka_properties;
	int			message_timeout_ms;
	int			outstanding;	/* produced, no delivery report yet */
	bool		fatal;
};

/* librdkafka properties the promises depend on; applied last. */
static const char *const enforced_properties[][2] = {
	{"enable.idempotence", "true"},
	{"acks", "all"},
	{"log.queue", "true"},
};

/*
 * Defaults a user may override in outbox.kafka_properties.  A batch is
 * produced in one go, well under a millisecond, and Kafka works on it while
 * the worker claims the next: so librdkafka should send it after a
 * millisecond, not hold it for the default 5.  A message times out after
 * twice request.timeout.ms (30 s): a request that times out while the broker
 * stalls is first sent again by the idempotent producer, which the broker
 * deduplicates; a message that timed out would be produced anew, and
 * published twice if the stalled request was written after all.
 */
static const char *const default_properties[][2] = {
	{"client.id", "postgresql-outbox"},
	{"message.timeout.ms", "60000"},
	{"reconnect.backoff.max.ms", "1000"},
	{"linger.ms", "1"},
};

/*
 * Set one property.  librdkafka's message can repeat the value, which may be
 * a secret, so the error names the property only.
 */
static bool
set_property(rd_kafka_conf_t *conf, const char *name, const char *value,
			 char *errbuf, size_t errlen)
{
	char		ignored[256];

	if (rd_kafka_conf_set(conf, name, value, ignored, sizeof(ignored)) != RD_KAFKA_CONF_OK)
	{
		snprintf(errbuf, errlen,
				 "outbox.kafka_properties: librdkafka refuses property \"%s\" or its value", name);
		return false;
	}
	return true;
}

/*
 * Apply outbox.kafka_properties, split as its check split it when it was
 * set, so that the pairs are the ones the check accepted.
 */
static bool
set_user_properties(rd_kafka_conf_t *conf, char *errbuf, size_t errlen)
{
	List	   *properties;
	ListCell   *lc;

	if (!kafka_properties_split(outbox_kafka_properties, &properties))
		elog(ERROR, "outbox: outbox.kafka_properties passed its check but cannot be split");
	foreach(lc, properties)
	{
		KafkaProperty *property = lfirst(lc);

		if (!set_property(conf, property->name, property->value, errbuf, errlen))
			return false;
	}
	return true;
}

/* Called from rd_kafka_poll(), on the worker's thread. */
static void
log_callback(const rd_kafka_t *rk, int level, const char *facility, const char *message)
{
	/* syslog levels: 0 emergency .. 4 warning; the rest is chatter */
	if (level <= 4)
		ereport(LOG,
				(errmsg("outbox: librdkafka %s: %s", facility, message)));
}

/* Called from rd_kafka_poll(), on the worker's thread. */
static void
error_callback(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	OutboxProducer *producer = opaque;

	if (err == RD_KAFKA_RESP_ERR__FATAL)
	{
		char		fatal_reason[256];

		rd_kafka_fatal_error(rk, fatal_reason, sizeof(fatal_reason));
		producer->fatal = true;
		worker_report_error(LOG, "fatal producer error, rebuilding the producer: %s",
							fatal_reason);
		return;
	}
	if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN ||
		err == RD_KAFKA_RESP_ERR__AUTHENTICATION ||
		err == RD_KAFKA_RESP_ERR__TRANSPORT ||
		err == RD_KAFKA_RESP_ERR__RESOLVE)
		worker_report_brokers_reachable(false);
	/* librdkafka's log, served by log_callback, says it already */
	worker_report_error(DEBUG1, "%s", reason);
}

/*
 * What a Kafka error means for the message.  librdkafka 2.0.2 has no
 * classifier for delivery errors, so these are the ones that no retry can
 * cure; everything else is retried with backoff.
 */
static DeliveryOutcome
classify_error(rd_kafka_resp_err_t err)
{
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
			return DELIVERY_PERMANENT;
		case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
		case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
		case RD_KAFKA_RESP_ERR__FATAL:
			return DELIVERY_NOT_SENT;
		default:
			return DELIVERY_RETRY;
	}
}

/* Called from rd_kafka_poll(), on the worker's thread. */
static void
delivery_callback(rd_kafka_t *rk, const rd_kafka_message_t *rkmessage, void *opaque)
{
	OutboxProducer *producer = opaque;
	OutboxMessage *message = rkmessage->_private;

	producer->outstanding--;
	message->outcome = classify_error(rkmessage->err);
	message->error_code = rkmessage->err;
	message->error = rd_kafka_err2str(rkmessage->err);
	message->partition = rkmessage->partition;
	message->offset = rkmessage->offset;
	message->possibly_persisted =
		rd_kafka_message_status(rkmessage) != RD_KAFKA_MSG_STATUS_NOT_PERSISTED;
}

/*
 * librdkafka's configuration: the defaults, then outbox.kafka_properties,
 * then the brokers and the enforced properties.  NULL, with the reason in
 * errbuf, if librdkafka refuses one.
 */
static rd_kafka_conf_t *
make_conf(char *errbuf, size_t errlen)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	bool		ok = true;

	for (int i = 0; ok && i < (int) lengthof(default_properties); i++)
		ok = set_property(conf, default_properties[i][0], default_properties[i][1],
						  errbuf, errlen);
	ok = ok && set_user_properties(conf, errbuf, errlen);
	ok = ok && set_property(conf, "bootstrap.servers", outbox_brokers, errbuf, errlen);
	for (int i = 0; ok && i < (int) lengthof(enforced_properties); i++)
		ok = set_property(conf, enforced_properties[i][0], enforced_properties[i][1],
						  errbuf, errlen);
	if (ok)
		return conf;
	rd_kafka_conf_destroy(conf);
	return NULL;
}

/*
 * Make a producer from the current settings.  On failure returns NULL with
 * the reason in errbuf.
 */
OutboxProducer *
producer_create(char *errbuf, size_t errlen)
{
	rd_kafka_conf_t *conf = make_conf(errbuf, errlen);
	OutboxProducer *producer;
	sigset_t	all_signals;
	sigset_t	saved_signals;
	char		value[64];
	size_t		value_len = sizeof(value);

	if (conf == NULL)
		return NULL;

	/* it lives from turn to turn, until the worker destroys it */
	producer = MemoryContextAllocZero(TopMemoryContext, sizeof(OutboxProducer));
	producer->brokers = MemoryContextStrdup(TopMemoryContext, outbox_brokers);
	producer->kafka_properties = MemoryContextStrdup(TopMemoryContext, outbox_kafka_properties);
	if (rd_kafka_conf_get(conf, "message.timeout.ms", value, &value_len) == RD_KAFKA_CONF_OK)
		producer->message_timeout_ms = atoi(value);

	rd_kafka_conf_set_opaque(conf, producer);
	rd_kafka_conf_set_log_cb(conf, log_callback);
	rd_kafka_conf_set_error_cb(conf, error_callback);
	rd_kafka_conf_set_dr_msg_cb(conf, delivery_callback);

	/* librdkafka's threads inherit this mask: keep PostgreSQL's signals off them */
	sigfillset(&all_signals);
	pthread_sigmask(SIG_BLOCK, &all_signals, &saved_signals);
	producer->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errbuf, errlen);
	pthread_sigmask(SIG_SETMASK, &saved_signals, NULL);

	if (producer->rk == NULL)
	{
		/* rd_kafka_new() took no ownership of conf on failure */
		rd_kafka_conf_destroy(conf);
		pfree(producer->brokers);
		pfree(producer->kafka_properties);
		pfree(producer);
		return NULL;
	}

	/* Serve librdkafka's log lines from the main queue, on this thread. */
	rd_kafka_set_log_queue(producer->rk, NULL);
	return producer;
}

void
producer_destroy(OutboxProducer *producer)
{
	if (producer == NULL)
		return;
	/* Withdraw whatever is still queued so that destroy does not wait for it. */
	rd_kafka_purge(producer->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	rd_kafka_poll(producer->rk, 0);
	rd_kafka_destroy(producer->rk);
	pfree(producer->brokers);
	pfree(producer->kafka_properties);
	pfree(producer);
}

/* Do outbox.brokers or outbox.kafka_properties differ from the producer's? */
bool
producer_settings_changed(OutboxProducer *producer)
{
	return strcmp(producer->brokers, outbox_brokers) != 0 ||
		strcmp(producer->kafka_properties, outbox_kafka_properties) != 0;
}

bool
producer_failed_fatally(OutboxProducer *producer)
{
	return producer->fatal;
}

/* Serve queued logs, errors and reports without waiting. */
void
producer_serve_events(OutboxProducer *producer)
{
	rd_kafka_poll(producer->rk, 0);
}

/*
 * Ask the cluster for its brokers.  An answer means the brokers are there
 * and accept this producer's credentials.
 */
bool
producer_brokers_reachable(OutboxProducer *producer, int timeout_ms)
{
	const struct rd_kafka_metadata *metadata;
	rd_kafka_resp_err_t err;

	err = rd_kafka_metadata(producer->rk, 0, NULL, &metadata, timeout_ms);
	rd_kafka_poll(producer->rk, 0);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		return false;
	rd_kafka_metadata_destroy(metadata);
	return true;
}

/* Kafka record headers: the message's own, then outbox-message-id. */
static rd_kafka_headers_t *
make_headers(OutboxMessage *message)
{
	rd_kafka_headers_t *headers;
	size_t		count = 1;

	if (message->headers)
		count += JB_ROOT_COUNT(message->headers);
	headers = rd_kafka_headers_new(count);

	if (message->headers)
	{
		JsonbIterator *it = JsonbIteratorInit(&message->headers->root);
		JsonbValue	v;
		JsonbIteratorToken token;
		JsonbValue	name = {0};

		while ((token = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
		{
			if (token == WJB_KEY)
				name = v;
			else if (token == WJB_VALUE)
				rd_kafka_header_add(headers,
									name.val.string.val, name.val.string.len,
									v.type == jbvString ? v.val.string.val : NULL,
									v.type == jbvString ? v.val.string.len : 0);
		}
	}
	rd_kafka_header_add(headers, MESSAGE_ID_HEADER, -1, message->message_id, -1);
	return headers;
}

/*
 * Hand one message to librdkafka.  A message librdkafka refuses at once gets
 * its outcome now; the others are DELIVERY_PENDING until their report.
 */
void
producer_produce(OutboxProducer *producer, OutboxMessage *message)
{
	rd_kafka_headers_t *headers = make_headers(message);
	rd_kafka_resp_err_t err;

	for (;;)
	{
		err = rd_kafka_producev(producer->rk,
								RD_KAFKA_V_TOPIC(message->topic),
								RD_KAFKA_V_KEY(message->key,
											   message->key ? strlen(message->key) : 0),
								RD_KAFKA_V_VALUE(message->payload, message->payload_len),
								RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
								RD_KAFKA_V_TIMESTAMP(message->timestamp_ms),
								RD_KAFKA_V_HEADERS(headers),
								RD_KAFKA_V_OPAQUE(message),
								RD_KAFKA_V_END);
		if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
			break;
		/* librdkafka's queue is full: serve reports to make room */
		rd_kafka_poll(producer->rk, QUEUE_FULL_WAIT_MS);
	}

	if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		message->outcome = DELIVERY_PENDING;
		producer->outstanding++;
	}
	else
	{
		/* the headers are still ours when producev fails */
		rd_kafka_headers_destroy(headers);
		message->outcome = classify_error(err);
		message->error_code = err;
		message->error = rd_kafka_err2str(err);
		message->possibly_persisted = false;
		if (err == RD_KAFKA_RESP_ERR__FATAL)
			producer->fatal = true;
	}
}

/*
 * Serve delivery reports until every produced message has one.  librdkafka
 * reports each message within message.timeout.ms; past that (and
 * REPORT_DEADLINE_SLACK_MS), or SHUTDOWN_GRACE_MS into a shutdown, or after
 * a fatal error, the rest is withdrawn (reported as not sent, so its rows
 * stay to be claimed again).
 * Returns false if anything was withdrawn: the producer must then be
 * destroyed, before the messages' memory is freed, since a report may still
 * be owed for them.
 */
bool
producer_await_deliveries(OutboxProducer *producer)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   producer->message_timeout_ms +
													   REPORT_DEADLINE_SLACK_MS);
	TimestampTz withdrawn_at = 0;

	while (producer->outstanding > 0)
	{
		TimestampTz now;

		/* flush, unlike poll, sends at once what linger.ms would hold back */
		rd_kafka_flush(producer->rk, FLUSH_WAIT_MS);
		now = GetCurrentTimestamp();

		/* at shutdown, a batch Kafka has in hand gets a moment to be acknowledged */
		if (ShutdownRequestPending)
			deadline = Min(deadline, TimestampTzPlusMilliseconds(now, SHUTDOWN_GRACE_MS));

		if (withdrawn_at == 0 && (producer->fatal || now >= deadline))
		{
			rd_kafka_purge(producer->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
			withdrawn_at = now;
		}
		else if (withdrawn_at != 0 &&
				 TimestampDifferenceExceeds(withdrawn_at, now, WITHDRAWN_REPORT_WAIT_MS))
			break;				/* a request the broker never answers */
	}
	return withdrawn_at == 0;
}

/*
 * Did Kafka refuse the message as too large?  The broker refuses a whole
 * record batch when it is larger than the topic allows, so a message can be
 * refused for the size of the messages sent with it.
 */
bool
producer_refused_for_size(const OutboxMessage *message)
{
	return message->outcome == DELIVERY_PERMANENT &&
		(message->error_code == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
		 message->error_code == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE);
}

/* For outbox_simulate_fatal_error(): the error an idempotent producer can raise. */
void
producer_simulate_fatal_error(OutboxProducer *producer)
{
	rd_kafka_test_fatal_error(producer->rk, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
							  "simulated by outbox_simulate_fatal_error()");
}

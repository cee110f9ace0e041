/*-------------------------------------------------------------------------
 *
 * producer.c
 *	  The worker's Kafka producer: librdkafka, run in a process of its own.
 *
 * librdkafka runs in outbox_kafka (kafka_process.c), a child of the worker
 * that is started with exec and so shares nothing with PostgreSQL: no
 * shared memory, no descriptor but its socket and its standard error, and
 * it is no child of the postmaster.  A crash, an abort or a runaway there,
 * whether a setting, a broker or a bug caused it, ends that process only:
 * the worker sees the socket close, counts what was in flight as not sent
 * (its rows stay, to be claimed again: at most that batch is published
 * twice), and starts another.  So no librdkafka thread runs in a PostgreSQL
 * process; this file links librdkafka for rd_kafka_err2str() alone.
 *
 * Frames (kafka_wire.h) are read and written on the worker's thread, with
 * the socket non-blocking and every wait a WaitLatchOrSocket() that leaves
 * at once on postmaster death.  Every text that comes from the Kafka
 * process, which may quote a configured value, passes through
 * settings_scrub_secrets() before it reaches the log or outbox_worker.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <librdkafka/rdkafka.h>

#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/interrupt.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "kafka_wire.h"
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

/* How long a new Kafka process may take to make its producer. */
#define PROCESS_START_TIMEOUT_MS 10000

/*
 * How long the Kafka process may take no byte of a frame before it is
 * taken for hung and killed.  It reads whenever it is not inside librdkafka,
 * whose calls it makes return within a few seconds; not message.timeout.ms,
 * which may be 0 (no timeout).
 */
#define PROCESS_HUNG_MS 30000

/* How long a Kafka process told to stop may take before it is killed. */
#define PROCESS_STOP_TIMEOUT_MS 2000

/*
 * After a Kafka process died, the next one starts no sooner than this: a
 * setting that crashes librdkafka then costs a process a second, not a busy
 * loop.
 */
#define PROCESS_RESTART_PAUSE_MS 1000

/* How much longer than its timeout a metadata request may take to be answered. */
#define METADATA_REPLY_SLACK_MS 1000

/*
 * What a message takes in a PRODUCE frame besides its payload, near enough:
 * token, timestamp, lengths, topic, key, a few headers, the message id.
 */
#define PRODUCE_FRAME_SLACK_PER_MESSAGE 512

/* syslog levels: 0 emergency .. 4 warning; the rest is chatter */
#define LOGGED_LIBRDKAFKA_LEVEL 4

/* librdkafka's default for message.timeout.ms, which the defaults below change. */
#define MESSAGE_TIMEOUT_PROPERTY "message.timeout.ms"
#define MESSAGE_TIMEOUT_ALIAS "delivery.timeout.ms"

struct OutboxProducer
{
	pid_t		pid;			/* the Kafka process; 0 once reaped */
	int			socket;			/* to it, non-blocking; -1 once closed */
	int			stderr_pipe;	/* its standard error, read once it ended */
	StringInfoData received;	/* bytes read, not yet a whole frame */
	OutboxMessage **by_token;	/* the messages produced, by their token */
	int			tokens_allocated;
	int			tokens_used;
	int			outstanding;	/* produced, no delivery report yet */
	bool		ready;			/* READY came */
	char	   *failure;		/* FAILED's reason, scrubbed */
	bool		metadata_answered;
	int			metadata_error;
	char	   *brokers;		/* the settings it was made with */
	char	   *kafka_properties;
	int			message_timeout_ms;
	bool		fatal;			/* a fatal error, or the process is gone */
};

/* When the last Kafka process died unasked; 0 if none did. */
static TimestampTz last_unexpected_exit = 0;

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
 * nothing while the brokers do not answer.
 */
static const char *const default_properties[][2] = {
	{"client.id", "postgresql-outbox"},
	{MESSAGE_TIMEOUT_PROPERTY, "0"},
	{"reconnect.backoff.max.ms", "1000"},
	{"linger.ms", "1"},
};

/* librdkafka properties the promises depend on; applied last. */
static const char *const enforced_properties[][2] = {
	{"enable.idempotence", "true"},
	{"acks", "all"},
};

static void read_available(OutboxProducer *producer);

/* Frames: a length, a type and a body, built in a StringInfo. */
static void
begin_frame(StringInfo frame, WireFrameType type)
{
	uint32		len = 0;
	uint8		t = type;

	resetStringInfo(frame);
	appendBinaryStringInfo(frame, (char *) &len, sizeof(len));
	appendBinaryStringInfo(frame, (char *) &t, sizeof(t));
}

static void
end_frame(StringInfo frame)
{
	uint32		len = frame->len - WIRE_FRAME_HEADER_SIZE;

	memcpy(frame->data, &len, sizeof(len));
}

static void
put_u32(StringInfo frame, uint32 v)
{
	appendBinaryStringInfo(frame, (char *) &v, sizeof(v));
}

static void
put_i64(StringInfo frame, int64 v)
{
	appendBinaryStringInfo(frame, (char *) &v, sizeof(v));
}

static void
put_bytes(StringInfo frame, const char *s, int32 len)
{
	appendBinaryStringInfo(frame, (char *) &len, sizeof(len));
	if (len > 0)
		appendBinaryStringInfo(frame, s, len);
}

static void
put_string(StringInfo frame, const char *s)
{
	put_bytes(frame, s, s ? (int32) strlen(s) : -1);
}

/*
 * Wait for the socket, the postmaster's death or a timeout; events is
 * WL_SOCKET_READABLE and/or WL_SOCKET_WRITEABLE.
 */
static int
wait_for_socket(OutboxProducer *producer, int events, long timeout_ms)
{
	return WaitLatchOrSocket(NULL, events | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 producer->socket, Max(timeout_ms, 0), PG_WAIT_EXTENSION);
}

/* A text from the Kafka process, fit for the log and outbox_worker. */
static char *
scrubbed(OutboxProducer *producer, const char *text, int32 len)
{
	return settings_scrub_secrets(pnstrdup(text ? text : "", Max(len, 0)),
								  producer->kafka_properties);
}

/* Read what the Kafka process wrote to its standard error, and log it. */
static void
log_process_stderr(OutboxProducer *producer)
{
	char		text[4096];
	ssize_t		n;

	if (producer->stderr_pipe < 0)
		return;
	n = read(producer->stderr_pipe, text, sizeof(text));
	if (n > 0)
		ereport(LOG,
				(errmsg("outbox: the Kafka process wrote: %s", scrubbed(producer, text, n))));
}

/* What a wait status says of how a process ended. */
static char *
describe_exit(int status)
{
	if (WIFSIGNALED(status))
		return psprintf("was terminated by signal %d: %s",
						WTERMSIG(status), pg_strsignal(WTERMSIG(status)));
	return psprintf("exited with exit code %d", WEXITSTATUS(status));
}

/* Kill the Kafka process, if there is one: pid 0 would be this process's group. */
static void
kill_process(OutboxProducer *producer)
{
	if (producer->pid > 0)
		kill(producer->pid, SIGKILL);
}

/*
 * Reap the Kafka process, killing it if it does not end within timeout_ms.
 * Returns how it ended.
 */
static char *
reap_process(OutboxProducer *producer, long timeout_ms)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
	int			status = 0;

	while (waitpid(producer->pid, &status, WNOHANG) == 0)
	{
		if (GetCurrentTimestamp() >= deadline)
		{
			kill_process(producer);
			(void) waitpid(producer->pid, &status, 0);
			break;
		}
		(void) WaitLatch(NULL, WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 10, PG_WAIT_EXTENSION);
	}
	producer->pid = 0;
	log_process_stderr(producer);
	return describe_exit(status);
}

/*
 * The Kafka process is gone, or has to go: every message it had in hand
 * stays to be claimed again (it may have reached Kafka: at most this batch
 * is published twice).
 */
static void
process_gone(OutboxProducer *producer)
{
	if (producer->socket < 0)
		return;
	close(producer->socket);
	producer->socket = -1;
	producer->fatal = true;
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
	if (producer->pid == 0)
		return;
	if (producer->failure)
	{
		/* it said why it ends; the caller reports that */
		(void) reap_process(producer, PROCESS_STOP_TIMEOUT_MS);
		return;
	}
	last_unexpected_exit = GetCurrentTimestamp();
	worker_report_error(LOG, "the Kafka process %s; starting another",
						reap_process(producer, PROCESS_STOP_TIMEOUT_MS));
}

/*
 * Write a frame whole.  The Kafka process always reads; one that takes no
 * byte for PROCESS_HUNG_MS is hung, and is killed.
 */
static void
send_frame(OutboxProducer *producer, StringInfo frame)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   PROCESS_HUNG_MS);
	int			sent = 0;

	end_frame(frame);
	while (producer->socket >= 0 && sent < frame->len)
	{
		ssize_t		n = write(producer->socket, frame->data + sent, frame->len - sent);

		if (n > 0)
		{
			sent += n;
			deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), PROCESS_HUNG_MS);
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			process_gone(producer);
		else if (GetCurrentTimestamp() >= deadline)
		{
			kill_process(producer);
			process_gone(producer);
		}
		else if (wait_for_socket(producer, WL_SOCKET_WRITEABLE | WL_SOCKET_READABLE,
								 REPORT_WAIT_MS) & WL_SOCKET_READABLE)
			read_available(producer);
	}
}

/* A short frame: a type and at most one integer. */
static void
send_request(OutboxProducer *producer, WireFrameType type, bool with_value, uint32 value)
{
	StringInfoData frame;

	initStringInfo(&frame);
	begin_frame(&frame, type);
	if (with_value)
		put_u32(&frame, value);
	send_frame(producer, &frame);
	pfree(frame.data);
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
	m->error_code = err;
	m->error = rd_kafka_err2str(err);
	m->partition = partition;
	m->offset = offset;
	m->possibly_persisted = status != DELIVERY_STATUS_NOT_PERSISTED &&
		status != DELIVERY_STATUS_HELD;
	if (err == RD_KAFKA_RESP_ERR__FATAL)
		producer->fatal = true;
}

static void
handle_log(OutboxProducer *producer, WireReader *r)
{
	int32		level = wire_i32(r);
	int32		facility_len;
	int32		message_len;
	const char *facility = wire_string(r, &facility_len);
	const char *message = wire_string(r, &message_len);

	if (!r->failed && level <= LOGGED_LIBRDKAFKA_LEVEL)
		ereport(LOG,
				(errmsg("outbox: librdkafka %s: %s",
						scrubbed(producer, facility, facility_len),
						scrubbed(producer, message, message_len))));
}

static void
handle_error(OutboxProducer *producer, WireReader *r)
{
	int32		err = wire_i32(r);
	int32		reason_len;
	const char *reason = wire_string(r, &reason_len);
	char	   *text;

	if (r->failed)
		return;
	text = scrubbed(producer, reason, reason_len);
	if (err == RD_KAFKA_RESP_ERR__FATAL)
	{
		producer->fatal = true;
		worker_report_error(LOG, "fatal producer error, rebuilding the producer: %s", text);
		return;
	}
	if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN ||
		err == RD_KAFKA_RESP_ERR__AUTHENTICATION ||
		err == RD_KAFKA_RESP_ERR__TRANSPORT ||
		err == RD_KAFKA_RESP_ERR__RESOLVE)
		worker_report_brokers_reachable(false);
	/* librdkafka's log, which handle_log serves, says it already */
	worker_report_error(DEBUG1, "%s", text);
}

static void
handle_frame(OutboxProducer *producer, uint8 type, const char *body, uint32 len)
{
	WireReader	r;
	int32		text_len;
	const char *text;

	wire_reader_init(&r, body, len);
	switch (type)
	{
		case WIRE_READY:
			producer->ready = true;
			break;
		case WIRE_FAILED:
			text = wire_string(&r, &text_len);
			producer->failure = MemoryContextStrdup(TopMemoryContext,
													scrubbed(producer, text, text_len));
			break;
		case WIRE_DELIVERY:
			handle_delivery(producer, &r);
			break;
		case WIRE_LOG:
			handle_log(producer, &r);
			break;
		case WIRE_ERROR:
			handle_error(producer, &r);
			break;
		case WIRE_METADATA_REPLY:
			producer->metadata_error = wire_i32(&r);
			producer->metadata_answered = true;
			break;
		default:
			elog(LOG, "outbox: unknown frame type %d from the Kafka process", type);
			break;
	}
}

/* Handle each whole frame received; keep the rest for later. */
static void
handle_received_frames(OutboxProducer *producer)
{
	StringInfo	in = &producer->received;
	int			done = 0;

	while (in->len - done >= WIRE_FRAME_HEADER_SIZE)
	{
		uint32		len;

		memcpy(&len, in->data + done, sizeof(len));
		if (len > WIRE_MAX_FRAME_SIZE)
		{
			kill_process(producer);
			process_gone(producer);
			return;
		}
		if ((uint32) (in->len - done) < WIRE_FRAME_HEADER_SIZE + len)
			break;
		handle_frame(producer, (uint8) in->data[done + 4],
					 in->data + done + WIRE_FRAME_HEADER_SIZE, len);
		done += WIRE_FRAME_HEADER_SIZE + len;
	}
	memmove(in->data, in->data + done, in->len - done);
	in->len -= done;
}

/* Read whatever the Kafka process has sent, without waiting, and handle it. */
static void
read_available(OutboxProducer *producer)
{
	char		chunk[65536];

	while (producer->socket >= 0)
	{
		ssize_t		n = read(producer->socket, chunk, sizeof(chunk));

		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			break;
		if (n <= 0)
		{
			process_gone(producer);
			break;
		}
		appendBinaryStringInfo(&producer->received, chunk, n);
		handle_received_frames(producer);
	}
}

/* The value of message.timeout.ms the producer gets. */
static int
message_timeout_of(List *properties)
{
	int			timeout_ms = 0;
	ListCell   *lc;

	foreach(lc, properties)
	{
		KafkaProperty *property = lfirst(lc);

		if (strcmp(property->name, MESSAGE_TIMEOUT_PROPERTY) == 0 ||
			strcmp(property->name, MESSAGE_TIMEOUT_ALIAS) == 0)
			timeout_ms = atoi(property->value);
	}
	return timeout_ms;
}

static void
append_property(List **properties, const char *name, const char *value)
{
	KafkaProperty *property = palloc(sizeof(KafkaProperty));

	property->name = pstrdup(name);
	property->value = pstrdup(value);
	*properties = lappend(*properties, property);
}

/*
 * librdkafka's configuration, in the order it is applied: the defaults, then
 * outbox.kafka_properties, then the brokers and the enforced properties.
 */
static List *
producer_properties(void)
{
	List	   *properties = NIL;
	List	   *user;

	for (int i = 0; i < (int) lengthof(default_properties); i++)
		append_property(&properties, default_properties[i][0], default_properties[i][1]);
	if (!kafka_properties_split(outbox_kafka_properties, &user))
		elog(ERROR, "outbox: outbox.kafka_properties passed its check but cannot be split");
	properties = list_concat(properties, user);
	append_property(&properties, "bootstrap.servers", outbox_brokers);
	for (int i = 0; i < (int) lengthof(enforced_properties); i++)
		append_property(&properties, enforced_properties[i][0], enforced_properties[i][1]);
	return properties;
}

static void
send_configuration(OutboxProducer *producer, List *properties)
{
	StringInfoData frame;
	ListCell   *lc;

	initStringInfo(&frame);
	begin_frame(&frame, WIRE_CONFIGURE);
	put_u32(&frame, list_length(properties));
	foreach(lc, properties)
	{
		KafkaProperty *property = lfirst(lc);

		put_string(&frame, property->name);
		put_string(&frame, property->value);
	}
	send_frame(producer, &frame);
	pfree(frame.data);
}

/*
 * Start outbox_kafka with a socket as its standard input and a pipe as its
 * standard error, in a session of its own; nothing else of this process's
 * stays open in it.  Every signal is blocked from the fork to the exec, so
 * that no PostgreSQL handler runs in the child; the Kafka process sets its
 * own.
 */
static bool
spawn_process(OutboxProducer *producer, char *errbuf, size_t errlen)
{
	char		path[MAXPGPATH];
	int			sockets[2];
	int			stderr_pipe[2];
	sigset_t	all_signals;
	sigset_t	saved_signals;

	snprintf(path, sizeof(path), "%s/%s", pkglib_path, KAFKA_PROCESS_NAME);
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) != 0 ||
		pipe2(stderr_pipe, O_CLOEXEC) != 0)
	{
		snprintf(errbuf, errlen, "cannot make a socket for the Kafka process: %m");
		return false;
	}

	sigfillset(&all_signals);
	sigprocmask(SIG_BLOCK, &all_signals, &saved_signals);
	producer->pid = fork();
	if (producer->pid == 0)
	{
		int			devnull = open("/dev/null", O_WRONLY);

		/*
		 * Out of the worker's process group: the postmaster signals a
		 * child's whole group (SIGHUP at a reload, SIGTERM at a fast
		 * shutdown), and those are the worker's to act on, after it has
		 * recorded the batch in flight.
		 */
		if (setsid() < 0 ||
			dup2(sockets[1], KAFKA_PROCESS_SOCKET_FD) < 0 ||
			dup2(devnull, STDOUT_FILENO) < 0 ||
			dup2(stderr_pipe[1], STDERR_FILENO) < 0)
			_exit(127);
		close_range(STDERR_FILENO + 1, ~0U, 0);
		execl(path, KAFKA_PROCESS_NAME, (char *) NULL);
		_exit(127);
	}
	sigprocmask(SIG_SETMASK, &saved_signals, NULL);
	close(sockets[1]);
	close(stderr_pipe[1]);
	producer->socket = sockets[0];
	producer->stderr_pipe = stderr_pipe[0];
	if (producer->pid < 0)
	{
		snprintf(errbuf, errlen, "cannot start the Kafka process: %m");
		producer->pid = 0;
		return false;
	}
	if (fcntl(producer->socket, F_SETFL, O_NONBLOCK) != 0 ||
		fcntl(producer->stderr_pipe, F_SETFL, O_NONBLOCK) != 0)
		elog(ERROR, "outbox: cannot make the Kafka process's socket non-blocking: %m");
	return true;
}

/* Wait until the new Kafka process says whether it made its producer. */
static bool
await_ready(OutboxProducer *producer, char *errbuf, size_t errlen)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   PROCESS_START_TIMEOUT_MS);

	while (!producer->ready && producer->failure == NULL && producer->socket >= 0)
	{
		long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);

		if (left <= 0)
		{
			snprintf(errbuf, errlen, "the Kafka process did not start within %d ms",
					 PROCESS_START_TIMEOUT_MS);
			return false;
		}
		if (wait_for_socket(producer, WL_SOCKET_READABLE, left) & WL_SOCKET_READABLE)
			read_available(producer);
	}
	if (producer->ready)
		return true;
	snprintf(errbuf, errlen, "%s",
			 producer->failure ? producer->failure : "the Kafka process ended at start");
	return false;
}

/* Free what a producer holds; its process must be gone. */
static void
free_producer(OutboxProducer *producer)
{
	if (producer->stderr_pipe >= 0)
		close(producer->stderr_pipe);
	pfree(producer->received.data);
	if (producer->by_token)
		pfree(producer->by_token);
	if (producer->failure)
		pfree(producer->failure);
	pfree(producer->brokers);
	pfree(producer->kafka_properties);
	pfree(producer);
}

/* After an unasked exit, the next process waits its turn. */
static void
pause_after_unexpected_exit(void)
{
	long		since = TimestampDifferenceMilliseconds(last_unexpected_exit,
														GetCurrentTimestamp());

	if (last_unexpected_exit != 0 && since < PROCESS_RESTART_PAUSE_MS)
		(void) WaitLatch(NULL, WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 PROCESS_RESTART_PAUSE_MS - since, PG_WAIT_EXTENSION);
}

/*
 * Make a producer from the current settings: start a Kafka process and
 * wait until it has made its producer.  On failure returns NULL with the
 * reason in errbuf.
 */
OutboxProducer *
producer_create(char *errbuf, size_t errlen)
{
	List	   *properties = producer_properties();
	OutboxProducer *producer;
	MemoryContext caller = MemoryContextSwitchTo(TopMemoryContext);

	/* it lives from turn to turn, until the worker destroys it */
	producer = palloc0(sizeof(OutboxProducer));
	producer->socket = -1;
	producer->stderr_pipe = -1;
	initStringInfo(&producer->received);
	producer->brokers = pstrdup(outbox_brokers);
	producer->kafka_properties = pstrdup(outbox_kafka_properties);
	producer->message_timeout_ms = message_timeout_of(properties);
	MemoryContextSwitchTo(caller);

	pause_after_unexpected_exit();
	if (spawn_process(producer, errbuf, errlen))
	{
		send_configuration(producer, properties);
		if (await_ready(producer, errbuf, errlen))
			return producer;
	}
	producer_destroy(producer);
	return NULL;
}

/* Stop the Kafka process, which withdraws what it still holds, and free the producer. */
void
producer_destroy(OutboxProducer *producer)
{
	if (producer == NULL)
		return;
	if (producer->socket >= 0)
	{
		close(producer->socket);
		producer->socket = -1;
	}
	if (producer->pid != 0)
		(void) reap_process(producer, PROCESS_STOP_TIMEOUT_MS);
	free_producer(producer);
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

/* Serve what the Kafka process has sent without waiting. */
void
producer_serve_events(OutboxProducer *producer)
{
	read_available(producer);
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

	producer->metadata_answered = false;
	send_request(producer, WIRE_METADATA, true, timeout_ms);
	while (!producer->metadata_answered && producer->socket >= 0)
	{
		long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);

		if (left <= 0)
			return false;
		if (wait_for_socket(producer, WL_SOCKET_READABLE, left) & WL_SOCKET_READABLE)
			read_available(producer);
	}
	return producer->metadata_answered && producer->metadata_error == RD_KAFKA_RESP_ERR_NO_ERROR;
}

/* Kafka record headers: the message's own, then outbox-message-id. */
static void
put_headers(StringInfo frame, OutboxMessage *message)
{
	uint32		count = 1;

	if (message->headers)
		count += JB_ROOT_COUNT(message->headers);
	put_u32(frame, count);

	if (message->headers)
	{
		JsonbIterator *it = JsonbIteratorInit(&message->headers->root);
		JsonbValue	v;
		JsonbIteratorToken token;

		while ((token = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
		{
			if (token == WJB_KEY)
				put_bytes(frame, v.val.string.val, v.val.string.len);
			else if (token == WJB_VALUE && v.type == jbvString)
				put_bytes(frame, v.val.string.val, v.val.string.len);
			else if (token == WJB_VALUE)
				put_bytes(frame, NULL, -1);
		}
	}
	put_string(frame, MESSAGE_ID_HEADER);
	put_string(frame, message->message_id);
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
 * Hand messages to the Kafka process, in one frame, in their order.  Each
 * is DELIVERY_PENDING until its report; the Kafka process keeps their
 * per-key order when librdkafka refuses one at once.
 */
void
producer_produce(OutboxProducer *producer, OutboxMessage *messages, int count)
{
	StringInfoData frame;
	size_t		payload_bytes = 0;

	/* one allocation the size of the batch, not doublings up to twice it */
	for (int i = 0; i < count; i++)
		payload_bytes += messages[i].payload_len;
	initStringInfo(&frame);
	enlargeStringInfo(&frame, payload_bytes + count * PRODUCE_FRAME_SLACK_PER_MESSAGE);
	begin_frame(&frame, WIRE_PRODUCE);
	put_u32(&frame, count);
	for (int i = 0; i < count; i++)
	{
		OutboxMessage *m = &messages[i];

		put_u32(&frame, take_token(producer, m));
		put_i64(&frame, m->timestamp_ms);
		put_string(&frame, m->topic);
		put_string(&frame, m->key);
		put_bytes(&frame, m->payload, m->payload_len);
		put_headers(&frame, m);
		m->outcome = DELIVERY_PENDING;
		producer->outstanding++;
	}
	send_frame(producer, &frame);
	pfree(frame.data);
}

/*
 * Serve delivery reports until every produced message has one.  librdkafka
 * reports each message within message.timeout.ms (never, with 0, until a
 * broker acknowledges it); past that (and REPORT_DEADLINE_SLACK_MS), or
 * SHUTDOWN_GRACE_MS into a shutdown, or after
 * a fatal error, the rest is withdrawn (reported as not sent, so its rows
 * stay to be claimed again).
 * Returns false if anything was withdrawn: the producer must then be
 * destroyed, before the messages' memory is freed, since a report may still
 * be owed for them.
 */
bool
producer_await_deliveries(OutboxProducer *producer)
{
	TimestampTz deadline = producer->message_timeout_ms == 0 ? DT_NOEND :
		TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
									producer->message_timeout_ms + REPORT_DEADLINE_SLACK_MS);
	TimestampTz withdrawn_at = 0;

	while (producer->outstanding > 0)
	{
		TimestampTz now;

		if (wait_for_socket(producer, WL_SOCKET_READABLE, REPORT_WAIT_MS) & WL_SOCKET_READABLE)
			read_available(producer);
		now = GetCurrentTimestamp();

		/* at shutdown, a batch Kafka has in hand gets a moment to be acknowledged */
		if (ShutdownRequestPending)
			deadline = Min(deadline, TimestampTzPlusMilliseconds(now, SHUTDOWN_GRACE_MS));

		if (withdrawn_at == 0 && (producer->fatal || now >= deadline))
		{
			send_request(producer, WIRE_PURGE, false, 0);
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
	send_request(producer, WIRE_TEST_FATAL, false, 0);
}

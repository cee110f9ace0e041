/*-------------------------------------------------------------------------
 *
 * kafka_process.c
 *	  outbox_kafka: the process in which a worker's Kafka client runs, a
 *	  publishing worker's producer (kafka_produce.c) or a consuming worker's
 *	  consumer (kafka_consume.c); this file holds what both share.
 *
 * The worker starts it (producer.c) with a socket as its standard input, and
 * the pipe it reads as its standard error; kafka_wire.h says what they say.
 * It is the worker's child, not the postmaster's: if librdkafka crashes,
 * aborts or runs away with memory here, PostgreSQL sees nothing, and the
 * worker starts another one.  It exits when the worker closes the socket or
 * dies.  Its first frame says what it is: CONFIGURE makes a producer,
 * CONFIGURE_CONSUMER a consumer.
 *
 * One thread of ours: it reads the worker's frames, and serves librdkafka's
 * queues, on which logs and errors arrive (log.queue=true), so the callbacks
 * run on it and only append to the buffer of what goes back to the worker.
 * Writes to the worker never block: what the socket does not take now waits
 * in that buffer, so the worker may block writing a frame without either
 * side waiting for the other.  librdkafka wakes the thread through a pipe
 * (rd_kafka_queue_io_event_enable()), polled with the socket.
 *
 * These files link librdkafka and libc only, no PostgreSQL code.
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "kafka_process.h"

/* How large the read buffer grows at first. */
#define INITIAL_BUFFER_SIZE 65536

/*
 * One mode of the process: the first frame that chooses it, what makes its
 * client from that frame, and its loop, which returns the exit status.
 */
typedef struct KafkaMode
{
	WireFrameType first_frame;
	bool		(*configure) (WireReader *r, char *reason, size_t reason_len);
	int			(*serve) (void);
} KafkaMode;

static const KafkaMode modes[] = {
	{WIRE_CONFIGURE, configure_producer, serve_producer},
	{WIRE_CONFIGURE_CONSUMER, configure_consumer, serve_consumer},
};

Buffer		to_worker;
int			wake_fds[2];

void
die(const char *what)
{
	fprintf(stderr, "%s: %s\n", KAFKA_PROCESS_NAME, what);
	exit(1);
}

int64_t
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Room for more bytes: doubled, or exactly what a large frame needs. */
static void
reserve(Buffer *b, size_t more)
{
	if (b->len + more <= b->cap)
		return;
	b->cap = b->cap ? b->cap * 2 : INITIAL_BUFFER_SIZE;
	if (b->cap < b->len + more)
		b->cap = b->len + more;
	if ((b->data = realloc(b->data, b->cap)) == NULL)
		die("out of memory");
}

/*
 * Give back what a large frame made a buffer grow to, once it is empty:
 * librdkafka holds its own copies of the messages.
 */
static void
shrink(Buffer *b)
{
	if (b->len > 0 || b->cap <= INITIAL_BUFFER_SIZE)
		return;
	free(b->data);
	b->data = NULL;
	b->cap = 0;
}

void
buffer_append(Buffer *b, const void *bytes, size_t len)
{
	reserve(b, len);
	memcpy(b->data + b->len, bytes, len);
	b->len += len;
}

void
put(const void *bytes, size_t len)
{
	buffer_append(&to_worker, bytes, len);
}

void
put_u32(uint32_t v)
{
	put(&v, sizeof(v));
}

void
put_i32(int32_t v)
{
	put(&v, sizeof(v));
}

void
put_i64(int64_t v)
{
	put(&v, sizeof(v));
}

void
put_string(const char *s)
{
	int32_t		len = s ? (int32_t) strlen(s) : -1;

	put_i32(len);
	if (s)
		put(s, len);
}

/* Bytes as a string of the wire, NULL as length -1. */
void
put_bytes(const void *bytes, size_t len)
{
	put_i32(bytes ? (int32_t) len : -1);
	if (bytes)
		put(bytes, len);
}

/* Start a frame; end_frame() fills in its length once the body is put. */
size_t
begin_frame(WireFrameType type)
{
	size_t		start = to_worker.len;
	uint32_t	len = 0;
	uint8_t		t = type;

	put(&len, sizeof(len));
	put(&t, sizeof(t));
	return start;
}

void
end_frame(size_t start)
{
	uint32_t	len = to_worker.len - start - WIRE_FRAME_HEADER_SIZE;

	memcpy(to_worker.data + start, &len, sizeof(len));
}

/* Write what the socket takes now; the rest waits for the next pass. */
void
write_to_worker(void)
{
	while (to_worker.len > 0)
	{
		ssize_t		n = write(KAFKA_PROCESS_SOCKET_FD, to_worker.data, to_worker.len);

		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (n <= 0)
			exit(0);			/* the worker is gone */
		memmove(to_worker.data, to_worker.data + n, to_worker.len - n);
		to_worker.len -= n;
	}
}

void
report_text(WireFrameType type, int32_t code, const char *facility, const char *text)
{
	size_t		frame = begin_frame(type);

	if (type != WIRE_FAILED)
		put_i32(code);
	if (type == WIRE_LOG)
		put_string(facility);
	put_string(text);
	end_frame(frame);
}

static void
log_callback(const rd_kafka_t *rk, int level, const char *facility, const char *message)
{
	report_text(WIRE_LOG, level, facility, message);
}

static void
error_callback(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	char		fatal_reason[512];

	if (err == RD_KAFKA_RESP_ERR__FATAL)
	{
		rd_kafka_fatal_error(rk, fatal_reason, sizeof(fatal_reason));
		reason = fatal_reason;
	}
	report_text(WIRE_ERROR, err, NULL, reason);
}

/*
 * Logs and errors become LOG and ERROR frames; log.queue=true makes them
 * wait on a queue this thread serves, rather than run on librdkafka's.
 */
void
set_callbacks(rd_kafka_conf_t *conf)
{
	set_property(conf, "log.queue", "true");
	rd_kafka_conf_set_log_cb(conf, log_callback);
	rd_kafka_conf_set_error_cb(conf, error_callback);
}

/*
 * Read one whole frame from the socket, blocking: only the first, the
 * configuration, is read this way.
 */
static char *
read_frame_blocking(uint8_t *type, uint32_t *len)
{
	char		header[WIRE_FRAME_HEADER_SIZE];
	char	   *body;
	size_t		got = 0;

	while (got < sizeof(header))
	{
		ssize_t		n = read(KAFKA_PROCESS_SOCKET_FD, header + got, sizeof(header) - got);

		if (n <= 0)
			exit(0);
		got += n;
	}
	memcpy(len, header, sizeof(*len));
	*type = (uint8_t) header[4];
	if (*len > WIRE_MAX_FRAME_SIZE || (body = malloc(*len + 1)) == NULL)
		die("frame too large");
	for (got = 0; got < *len;)
	{
		ssize_t		n = read(KAFKA_PROCESS_SOCKET_FD, body + got, *len - got);

		if (n <= 0)
			exit(0);
		got += n;
	}
	return body;
}

/* A NUL-terminated copy of a string of a frame. */
char *
take_cstring(WireReader *r)
{
	int32_t		len;
	const char *s = wire_string(r, &len);
	char	   *copy;

	if (s == NULL)
		return NULL;
	if ((copy = malloc(len + 1)) == NULL)
		die("out of memory");
	memcpy(copy, s, len);
	copy[len] = '\0';
	return copy;
}

/*
 * Set the configuration frame's properties, in their order.  librdkafka's
 * message for a refused property can repeat its value, which may be a
 * secret: the reason names the property only, after what (where the
 * properties come from).
 */
bool
set_properties(rd_kafka_conf_t *conf, WireReader *r, const char *what,
			   char *reason, size_t reason_len)
{
	uint32_t	count = wire_u32(r);
	char		ignored[512];

	for (uint32_t i = 0; i < count && !r->failed; i++)
	{
		char	   *name = take_cstring(r);
		char	   *value = take_cstring(r);

		bool		refused = name == NULL || value == NULL ||
			rd_kafka_conf_set(conf, name, value, ignored, sizeof(ignored)) != RD_KAFKA_CONF_OK;

		if (refused)
			snprintf(reason, reason_len,
					 "%s: librdkafka refuses property \"%s\" or its value",
					 what, name ? name : "(none)");
		free(name);
		free(value);
		if (refused)
			return false;
	}
	return true;
}

/* A property this process needs: one librdkafka refuses is a bug here. */
void
set_property(rd_kafka_conf_t *conf, const char *name, const char *value)
{
	char		ignored[512];

	if (rd_kafka_conf_set(conf, name, value, ignored, sizeof(ignored)) != RD_KAFKA_CONF_OK)
	{
		fprintf(stderr, "%s: librdkafka refuses %s\n", KAFKA_PROCESS_NAME, name);
		exit(1);
	}
}

/*
 * Hand a frame to what takes its type among the mode's frames; a type the
 * mode does not serve is the worker's mistake, and ends the process.
 */
static void
take_frame(const ModeFrame *frames, size_t frame_count, uint8_t type, WireReader *r)
{
	for (size_t i = 0; i < frame_count; i++)
		if (frames[i].type == type)
		{
			frames[i].take(r);
			return;
		}
	die("unknown frame type");
}

/*
 * Read what the socket has, and hand each whole frame in it to what takes
 * its type among the mode's frames.  Returns false at end of file: the
 * worker closed the socket, or died.
 */
bool
read_from_worker(Buffer *in, const ModeFrame *frames, size_t frame_count)
{
	size_t		done = 0;
	ssize_t		n;

	reserve(in, INITIAL_BUFFER_SIZE);
	n = read(KAFKA_PROCESS_SOCKET_FD, in->data + in->len, in->cap - in->len);
	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
		return false;
	if (n > 0)
		in->len += n;

	while (in->len - done >= WIRE_FRAME_HEADER_SIZE)
	{
		uint32_t	len;
		WireReader	r;

		memcpy(&len, in->data + done, sizeof(len));
		if (len > WIRE_MAX_FRAME_SIZE)
			die("frame too large");
		if (in->len - done < WIRE_FRAME_HEADER_SIZE + len)
		{
			reserve(in, WIRE_FRAME_HEADER_SIZE + len);
			break;
		}
		wire_reader_init(&r, in->data + done + WIRE_FRAME_HEADER_SIZE, len);
		take_frame(frames, frame_count, (uint8_t) in->data[done + 4], &r);
		if (r.failed)
			die("malformed frame");
		done += WIRE_FRAME_HEADER_SIZE + len;
	}
	memmove(in->data, in->data + done, in->len - done);
	in->len -= done;
	shrink(in);
	return true;
}

/* Wait for the worker's frames, librdkafka's queues, or room in the socket. */
void
wait_for_work(int timeout_ms)
{
	struct pollfd fds[2] = {
		{.fd = KAFKA_PROCESS_SOCKET_FD, .events = POLLIN | (to_worker.len > 0 ? POLLOUT : 0)},
		{.fd = wake_fds[0], .events = POLLIN},
	};
	char		drained[64];

	if (poll(fds, 2, timeout_ms) > 0 && (fds[1].revents & POLLIN))
		while (read(wake_fds[0], drained, sizeof(drained)) > 0)
			;
}

/*
 * Signals: nothing of PostgreSQL's carries over, except what exec keeps;
 * the default actions, the socket's errors seen as errors, and death with
 * the worker, since a Kafka process without its worker has nobody to
 * report to.
 */
static void
set_up_process(void)
{
	sigset_t	none;

	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGPIPE, SIG_IGN);
	for (int signo = 1; signo < NSIG; signo++)
		if (signo != SIGPIPE && signo != SIGKILL && signo != SIGSTOP)
			signal(signo, SIG_DFL);
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() == 1)
		exit(0);
	if (pipe(wake_fds) != 0 ||
		fcntl(wake_fds[0], F_SETFL, O_NONBLOCK) != 0 ||
		fcntl(wake_fds[1], F_SETFL, O_NONBLOCK) != 0)
		die("cannot make a pipe");
}

static const KafkaMode *
mode_of(uint8_t first_frame)
{
	for (size_t i = 0; i < lengthof(modes); i++)
		if (modes[i].first_frame == first_frame)
			return &modes[i];
	return NULL;
}

/*
 * The first frame, read blocking, says the mode and configures its client;
 * then the mode serves the worker until it closes the socket.
 */
int
main(int argc, char **argv)
{
	uint8_t		type;
	uint32_t	len;
	char	   *body;
	char		reason[512];
	WireReader	r;
	const KafkaMode *mode;
	bool		configured;
	int			status;

	set_up_process();
	body = read_frame_blocking(&type, &len);
	wire_reader_init(&r, body, len);
	mode = mode_of(type);
	configured = mode != NULL && mode->configure(&r, reason, sizeof(reason));
	free(body);
	if (!configured)
	{
		report_text(WIRE_FAILED, 0, NULL, mode == NULL ? "no configuration" : reason);
		write_to_worker();
		free(to_worker.data);
		return 1;
	}
	fcntl(KAFKA_PROCESS_SOCKET_FD, F_SETFL, O_NONBLOCK);
	end_frame(begin_frame(WIRE_READY));
	status = mode->serve();
	free(to_worker.data);
	return status;
}

/*-------------------------------------------------------------------------
 *
 * kafka_link.c
 *	  A worker's link to a Kafka process of its own: starting it, its
 *	  frames, stopping it.
 *
 * librdkafka runs in outbox_kafka (kafka_process.c), a child of the worker
 * that is started with exec and so shares nothing with PostgreSQL: no
 * shared memory, no descriptor but its socket and its standard error, and
 * it is no child of the postmaster.  A crash, an abort or a runaway there,
 * whether a setting, a broker or a bug caused it, ends that process only:
 * the link sees the socket close, tells its user, which counts what the
 * process had in hand as lost, then reaps it and logs how it ended; its
 * user starts another.
 *
 * Frames (kafka_wire.h) are read and written on the worker's thread, with
 * the socket non-blocking and every wait a WaitLatchOrSocket() that leaves
 * at once on postmaster death.  Every text that comes from the Kafka
 * process, which may quote a configured value, passes through
 * settings_scrub_secrets() before it reaches the log or outbox_worker.
 *
 * The link handles READY, FAILED and LOG itself; every other frame goes to
 * its user's handler.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "kafka_link.h"
#include "settings.h"
#include "worker_slot.h"

/*
 * How long one wait to write a frame may block before the hung-process
 * deadline is looked at again.
 */
#define SEND_WAIT_MS 50

/* How long a new Kafka process may take to make its producer (or consumer). */
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

/* syslog levels: 0 emergency .. 4 warning; the rest is chatter */
#define LOGGED_LIBRDKAFKA_LEVEL 4

struct KafkaLink
{
	char	   *what;			/* "the Kafka process", for the log */
	pid_t		pid;			/* the Kafka process; 0 once reaped */
	int			socket;			/* to it, non-blocking; -1 once closed */
	int			stderr_pipe;	/* its standard error, read once it ended */
	StringInfoData received;	/* bytes read, not yet a whole frame */
	bool		ready;			/* READY came */
	char	   *failure;		/* FAILED's reason, scrubbed */
	char	   *brokers;		/* the settings it was made with */
	char	   *kafka_properties;
	KafkaLinkFrameHandler on_frame;
	KafkaLinkGoneHandler on_gone;
	void	   *arg;
};

/* When the last Kafka process died unasked; 0 if none did. */
static TimestampTz last_unexpected_exit = 0;

static void
end_frame(StringInfo frame)
{
	uint32		len = frame->len - WIRE_FRAME_HEADER_SIZE;

	memcpy(frame->data, &len, sizeof(len));
}

/*
 * Wait for the socket, the postmaster's death or a timeout, and for the
 * process's latch if asked; events is WL_SOCKET_READABLE and/or
 * WL_SOCKET_WRITEABLE, and maybe WL_LATCH_SET.
 */
int
kafka_link_wait(KafkaLink *link, int events, long timeout_ms)
{
	return WaitLatchOrSocket((events & WL_LATCH_SET) ? MyLatch : NULL,
							 events | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 link->socket, Max(timeout_ms, 0), PG_WAIT_EXTENSION);
}

/* A text from the Kafka process, fit for the log and outbox_worker. */
char *
kafka_link_scrubbed(KafkaLink *link, const char *text, int32 len)
{
	return settings_scrub_secrets(pnstrdup(text ? text : "", Max(len, 0)),
								  link->kafka_properties);
}

/* Read what the Kafka process wrote to its standard error, and log it. */
static void
log_process_stderr(KafkaLink *link)
{
	char		text[4096];
	ssize_t		n;

	if (link->stderr_pipe < 0)
		return;
	n = read(link->stderr_pipe, text, sizeof(text));
	if (n > 0)
		ereport(LOG,
				(errmsg("outbox: %s wrote: %s", link->what,
						kafka_link_scrubbed(link, text, n))));
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
kill_process(KafkaLink *link)
{
	if (link->pid > 0)
		kill(link->pid, SIGKILL);
}

/*
 * Reap the Kafka process, killing it if it does not end within timeout_ms.
 * Returns how it ended.
 */
static char *
reap_process(KafkaLink *link, long timeout_ms)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
	int			status = 0;

	while (waitpid(link->pid, &status, WNOHANG) == 0)
	{
		if (GetCurrentTimestamp() >= deadline)
		{
			kill_process(link);
			(void) waitpid(link->pid, &status, 0);
			break;
		}
		(void) WaitLatch(NULL, WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 10, PG_WAIT_EXTENSION);
	}
	link->pid = 0;
	log_process_stderr(link);
	return describe_exit(status);
}

/*
 * The Kafka process is gone, or has to go: its user learns that whatever
 * it had in hand is lost, then it is reaped.
 */
static void
process_gone(KafkaLink *link)
{
	if (link->socket < 0)
		return;
	close(link->socket);
	link->socket = -1;
	link->on_gone(link->arg);
	if (link->pid == 0)
		return;
	if (link->failure)
	{
		/* it said why it ends; the caller reports that */
		(void) reap_process(link, PROCESS_STOP_TIMEOUT_MS);
		return;
	}
	last_unexpected_exit = GetCurrentTimestamp();
	worker_report_error(LOG, "%s %s; starting another", link->what,
						reap_process(link, PROCESS_STOP_TIMEOUT_MS));
}

/*
 * Write a frame whole.  The Kafka process always reads; one that takes no
 * byte for PROCESS_HUNG_MS is hung, and is killed.
 */
void
kafka_link_send(KafkaLink *link, StringInfo frame)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   PROCESS_HUNG_MS);
	int			sent = 0;

	end_frame(frame);
	while (link->socket >= 0 && sent < frame->len)
	{
		ssize_t		n = write(link->socket, frame->data + sent, frame->len - sent);

		if (n > 0)
		{
			sent += n;
			deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), PROCESS_HUNG_MS);
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			process_gone(link);
		else if (GetCurrentTimestamp() >= deadline)
		{
			kill_process(link);
			process_gone(link);
		}
		else if (kafka_link_wait(link, WL_SOCKET_WRITEABLE | WL_SOCKET_READABLE,
								 SEND_WAIT_MS) & WL_SOCKET_READABLE)
			kafka_link_read_available(link);
	}
}

static void
handle_log(KafkaLink *link, WireReader *r)
{
	int32		level = wire_i32(r);
	int32		facility_len;
	int32		message_len;
	const char *facility = wire_string(r, &facility_len);
	const char *message = wire_string(r, &message_len);

	if (!r->failed && level <= LOGGED_LIBRDKAFKA_LEVEL)
		ereport(LOG,
				(errmsg("outbox: librdkafka %s: %s",
						kafka_link_scrubbed(link, facility, facility_len),
						kafka_link_scrubbed(link, message, message_len))));
}

static void
handle_frame(KafkaLink *link, uint8 type, const char *body, uint32 len)
{
	WireReader	r;
	int32		text_len;
	const char *text;

	wire_reader_init(&r, body, len);
	switch (type)
	{
		case WIRE_READY:
			link->ready = true;
			break;
		case WIRE_FAILED:
			text = wire_string(&r, &text_len);
			link->failure = MemoryContextStrdup(TopMemoryContext,
												kafka_link_scrubbed(link, text, text_len));
			break;
		case WIRE_LOG:
			handle_log(link, &r);
			break;
		default:
			link->on_frame(link->arg, link, type, &r);
			break;
	}
}

/* Handle each whole frame received; keep the rest for later. */
static void
handle_received_frames(KafkaLink *link)
{
	StringInfo	in = &link->received;
	int			done = 0;

	while (in->len - done >= WIRE_FRAME_HEADER_SIZE)
	{
		uint32		len;

		memcpy(&len, in->data + done, sizeof(len));
		if (len > WIRE_MAX_FRAME_SIZE)
		{
			kill_process(link);
			process_gone(link);
			return;
		}
		if ((uint32) (in->len - done) < WIRE_FRAME_HEADER_SIZE + len)
			break;
		handle_frame(link, (uint8) in->data[done + 4],
					 in->data + done + WIRE_FRAME_HEADER_SIZE, len);
		done += WIRE_FRAME_HEADER_SIZE + len;
	}
	memmove(in->data, in->data + done, in->len - done);
	in->len -= done;
}

/* Read whatever the Kafka process has sent, without waiting, and handle it. */
void
kafka_link_read_available(KafkaLink *link)
{
	char		chunk[65536];

	while (link->socket >= 0)
	{
		ssize_t		n = read(link->socket, chunk, sizeof(chunk));

		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			break;
		if (n <= 0)
		{
			process_gone(link);
			break;
		}
		appendBinaryStringInfo(&link->received, chunk, n);
		handle_received_frames(link);
	}
}

void
kafka_link_append_property(List **properties, const char *name, const char *value)
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
List *
kafka_link_properties(const char *const defaults[][2], int ndefaults,
					  const char *const enforced[][2], int nenforced)
{
	List	   *properties = NIL;
	List	   *user;

	for (int i = 0; i < ndefaults; i++)
		kafka_link_append_property(&properties, defaults[i][0], defaults[i][1]);
	if (!kafka_properties_split(outbox_kafka_properties, &user))
		elog(ERROR, "outbox: outbox.kafka_properties passed its check but cannot be split");
	properties = list_concat(properties, user);
	kafka_link_append_property(&properties, "bootstrap.servers", outbox_brokers);
	for (int i = 0; i < nenforced; i++)
		kafka_link_append_property(&properties, enforced[i][0], enforced[i][1]);
	return properties;
}

static void
send_configuration(KafkaLink *link, WireFrameType configure_type, List *properties)
{
	StringInfoData frame;
	ListCell   *lc;

	initStringInfo(&frame);
	kafka_link_begin_frame(&frame, configure_type);
	kafka_link_put_u32(&frame, list_length(properties));
	foreach(lc, properties)
	{
		KafkaProperty *property = lfirst(lc);

		kafka_link_put_string(&frame, property->name);
		kafka_link_put_string(&frame, property->value);
	}
	kafka_link_send(link, &frame);
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
spawn_process(KafkaLink *link, char *errbuf, size_t errlen)
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
		snprintf(errbuf, errlen, "cannot make a socket for %s: %m", link->what);
		return false;
	}

	sigfillset(&all_signals);
	sigprocmask(SIG_BLOCK, &all_signals, &saved_signals);
	link->pid = fork();
	if (link->pid == 0)
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
	link->socket = sockets[0];
	link->stderr_pipe = stderr_pipe[0];
	if (link->pid < 0)
	{
		snprintf(errbuf, errlen, "cannot start %s: %m", link->what);
		link->pid = 0;
		return false;
	}
	if (fcntl(link->socket, F_SETFL, O_NONBLOCK) != 0 ||
		fcntl(link->stderr_pipe, F_SETFL, O_NONBLOCK) != 0)
		elog(ERROR, "outbox: cannot make %s's socket non-blocking: %m", link->what);
	return true;
}

/* Wait until the new Kafka process says whether it made its producer (or consumer). */
static bool
await_ready(KafkaLink *link, char *errbuf, size_t errlen)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   PROCESS_START_TIMEOUT_MS);

	while (!link->ready && link->failure == NULL && link->socket >= 0)
	{
		long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);

		if (left <= 0)
		{
			snprintf(errbuf, errlen, "%s did not start within %d ms",
					 link->what, PROCESS_START_TIMEOUT_MS);
			return false;
		}
		if (kafka_link_wait(link, WL_SOCKET_READABLE, left) & WL_SOCKET_READABLE)
			kafka_link_read_available(link);
	}
	if (link->ready)
		return true;
	if (link->failure)
		snprintf(errbuf, errlen, "%s", link->failure);
	else
		snprintf(errbuf, errlen, "%s ended at start", link->what);
	return false;
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
 * Start a Kafka process, send it properties (from kafka_link_properties(),
 * just before) in a configure_type frame, and wait until it says READY.
 * what names the process in the log ("the Kafka process").  On failure
 * returns NULL with the reason in errbuf.
 */
KafkaLink *
kafka_link_start(const char *what, WireFrameType configure_type, List *properties,
				 KafkaLinkFrameHandler on_frame, KafkaLinkGoneHandler on_gone, void *arg,
				 char *errbuf, size_t errlen)
{
	KafkaLink  *link;
	MemoryContext caller = MemoryContextSwitchTo(TopMemoryContext);

	/* it lives from turn to turn, until the worker stops it */
	link = palloc0(sizeof(KafkaLink));
	link->what = pstrdup(what);
	link->socket = -1;
	link->stderr_pipe = -1;
	initStringInfo(&link->received);
	link->brokers = pstrdup(outbox_brokers);
	link->kafka_properties = pstrdup(outbox_kafka_properties);
	link->on_frame = on_frame;
	link->on_gone = on_gone;
	link->arg = arg;
	MemoryContextSwitchTo(caller);

	pause_after_unexpected_exit();
	if (spawn_process(link, errbuf, errlen))
	{
		send_configuration(link, configure_type, properties);
		if (await_ready(link, errbuf, errlen))
			return link;
	}
	kafka_link_stop(link);
	return NULL;
}

/*
 * Stop the Kafka process (its end of file tells it to), killing it if it
 * takes too long, and free the link.  Its user's gone handler is not called.
 */
void
kafka_link_stop(KafkaLink *link)
{
	if (link == NULL)
		return;
	if (link->socket >= 0)
	{
		close(link->socket);
		link->socket = -1;
	}
	if (link->pid != 0)
		(void) reap_process(link, PROCESS_STOP_TIMEOUT_MS);
	if (link->stderr_pipe >= 0)
		close(link->stderr_pipe);
	pfree(link->received.data);
	if (link->failure)
		pfree(link->failure);
	pfree(link->brokers);
	pfree(link->kafka_properties);
	pfree(link->what);
	pfree(link);
}

/* Is the socket to the Kafka process still open? */
bool
kafka_link_alive(KafkaLink *link)
{
	return link->socket >= 0;
}

/* For a WaitEventSet over several links; PGINVALID_SOCKET once it is gone. */
pgsocket
kafka_link_socket(KafkaLink *link)
{
	return link->socket;
}

/* Do outbox.brokers or outbox.kafka_properties differ from the link's? */
bool
kafka_link_settings_changed(KafkaLink *link)
{
	return strcmp(link->brokers, outbox_brokers) != 0 ||
		strcmp(link->kafka_properties, outbox_kafka_properties) != 0;
}

/*-------------------------------------------------------------------------
 *
 * settings.c
 *	  The outbox's settings (GUCs), and outbox.kafka_properties: its one
 *	  splitter, used alike by the check at SET or reload, by what SHOW tells,
 *	  and by the producer; and the secrecy of its values.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <ctype.h>
#include <limits.h>

#include <librdkafka/rdkafka.h>

#include "common/pg_prng.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "postmaster/interrupt.h"
#include "replication/slot.h"
#include "utils/builtins.h"
#include "utils/elog.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/varlena.h"

#include "kafka_wire.h"
#include "settings.h"
#include "trace_context.h"

char	   *outbox_brokers = NULL;
char	   *outbox_databases = NULL;
char	   *outbox_database = NULL;
char	   *outbox_kafka_properties = NULL;
char	   *outbox_synchronized_standby_slots = NULL;
/* The defaults of the numeric settings. */
#define DEFAULT_BATCH_SIZE 1000
#define DEFAULT_MAX_BATCH_KB (16 * 1024)
#define DEFAULT_RETRY_BACKOFF_BASE_MS 1000
#define DEFAULT_RETRY_BACKOFF_MAX_MS (5 * 60 * 1000)
#define DEFAULT_MAX_ATTEMPTS 10
#define DEFAULT_POLL_INTERVAL_MS (10 * 1000)
#define DEFAULT_MAX_WAKE_DELAY_MS 20
#define DEFAULT_MAX_RECORD_SIZE 1000000 /* librdkafka's message.max.bytes */
#define DEFAULT_SENT_RETENTION_S 0
#define DEFAULT_MAX_WORKERS 4
#define DEFAULT_INBOX_BATCH_SIZE 5000
#define DEFAULT_INBOX_DEDUP_RETENTION_S (7 * 24 * 3600)	/* Kafka's retention.ms */
#define DEFAULT_MAX_SUBSCRIPTIONS 100

/* Their bounds, where they have others than their type's. */
#define MAX_BATCH_SIZE 100000
#define MAX_MAX_BATCH_KB (1024 * 1024)	/* librdkafka's queue.buffering.max.kbytes */
#define MAX_MAX_ATTEMPTS 1000000
#define MIN_POLL_INTERVAL_MS 10
#define MAX_MAX_WAKE_DELAY_MS 1000
#define MAX_CLAIM_SNAPSHOT_DELAY_MS 1000
#define MAX_MAX_WORKERS 1024
#define MAX_MAX_SUBSCRIPTIONS 10000

int			outbox_delivery = OUTBOX_DELIVERY_AT_LEAST_ONCE;
char	   *outbox_progress_topic = NULL;

/*
 * The default progress topic: one topic for every database of every
 * cluster that publishes to the brokers; each record is keyed by its
 * publisher's transactional.id.
 */
#define DEFAULT_PROGRESS_TOPIC "outbox-progress"

static const struct config_enum_entry delivery_options[] = {
	{"at_least_once", OUTBOX_DELIVERY_AT_LEAST_ONCE, false},
	{"exactly_once", OUTBOX_DELIVERY_EXACTLY_ONCE, false},
	{NULL, 0, false}
};

int			outbox_batch_size = DEFAULT_BATCH_SIZE;
int			outbox_max_batch_kb = DEFAULT_MAX_BATCH_KB;
int			outbox_retry_backoff_base = DEFAULT_RETRY_BACKOFF_BASE_MS;
int			outbox_retry_backoff_max = DEFAULT_RETRY_BACKOFF_MAX_MS;
int			outbox_max_attempts = DEFAULT_MAX_ATTEMPTS;
int			outbox_poll_interval = DEFAULT_POLL_INTERVAL_MS;
int			outbox_claim_snapshot_delay = 0;
int			outbox_max_wake_delay = DEFAULT_MAX_WAKE_DELAY_MS;
int			outbox_max_record_size = DEFAULT_MAX_RECORD_SIZE;
int			outbox_sent_retention = DEFAULT_SENT_RETENTION_S;
int			outbox_max_workers = DEFAULT_MAX_WORKERS;
int			outbox_inbox_batch_size = DEFAULT_INBOX_BATCH_SIZE;
int			outbox_inbox_dedup_retention = DEFAULT_INBOX_DEDUP_RETENTION_S;
int			outbox_max_subscriptions = DEFAULT_MAX_SUBSCRIPTIONS;

/*
 * The longest delay a message may be given (deliver_after, deliver_at).  A
 * delayed message holds back every later message of its key, whoever
 * enqueues them, for as long as it waits, and keeps its segment from being
 * reclaimed: a week covers reminders, cooling-off periods and end-of-week
 * runs, and longer schedules belong in a table of the application's that
 * enqueues when they are due.
 */
#define DEFAULT_MAX_DELAY_S (7 * 24 * 3600)
int			outbox_max_delay = DEFAULT_MAX_DELAY_S;

/*
 * How long one handler call may run, and one subscription's turn at the
 * inbox worker (define_inbox_limit_settings()).
 */
#define DEFAULT_INBOX_HANDLER_TIMEOUT_MS (30 * 1000)
#define DEFAULT_INBOX_TURN_TIME_MS 100
int			outbox_inbox_handler_timeout = DEFAULT_INBOX_HANDLER_TIMEOUT_MS;
int			outbox_inbox_turn_time = DEFAULT_INBOX_TURN_TIME_MS;

/*
 * The mask SHOW puts on every value of outbox.kafka_properties, and that
 * settings_scrub_secrets() puts on them in librdkafka's texts.
 */
#define MASKED_VALUE "********"

/* What separates the words of a property's value. */
#define SECRET_WORD_SEPARATORS " \t\n,;="

static emit_log_hook_type prev_emit_log_hook = NULL;

static void define_settings(void);
static bool check_kafka_properties(char **newval, void **extra, GucSource source);
static bool check_database_list(char **newval, void **extra, GucSource source);
static bool check_standby_slot_list(char **newval, void **extra, GucSource source);
static bool check_progress_topic(char **newval, void **extra, GucSource source);
static const char *show_kafka_properties(void);
static void hide_kafka_properties_in_log(ErrorData *edata);

/* Define the settings, and keep outbox.kafka_properties out of the log. */
void
settings_init(void)
{
	define_settings();
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = hide_kafka_properties_in_log;
}

/*
 * Where the workers connect: the brokers, the databases served, how many
 * publishers, librdkafka's own properties.
 */
static void
define_connection_settings(void)
{
	DefineCustomStringVariable("outbox.brokers",
							   "Kafka bootstrap servers the worker publishes to.",
							   "A comma-separated list of host:port.",
							   &outbox_brokers,
							   "localhost:9092",
							   PGC_SIGHUP, 0,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("outbox.databases",
							   "Databases whose outbox is published; empty means every database that has the extension.",
							   "A comma-separated list of names; a name with upper-case letters, commas or spaces is double-quoted.",
							   &outbox_databases,
							   "",
							   PGC_SIGHUP, GUC_LIST_INPUT,
							   check_database_list, NULL, NULL);

	DefineCustomStringVariable("outbox.database",
							   "Deprecated: the one database whose outbox is published, used when outbox.databases is empty.",
							   NULL,
							   &outbox_database,
							   "",
							   PGC_SIGHUP, 0,
							   NULL, NULL, NULL);

	/*
	 * Shared memory holds a slot per worker, so this is fixed at start.
	 * Each worker is one of max_worker_processes, as the launcher is.
	 */
	DefineCustomIntVariable("outbox.max_workers",
							"Most publishing workers, one per database, that run at once.",
							"Each is a background worker, counted in max_worker_processes with the launcher.",
							&outbox_max_workers,
							DEFAULT_MAX_WORKERS, 1, MAX_MAX_WORKERS,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	/*
	 * Any librdkafka producer property, including secrets such as
	 * sasl.password, so only superusers may see it.  GUC_SUPERUSER_ONLY
	 * still lets members of pg_read_all_settings read it: for them
	 * show_kafka_properties() masks the values, and GUC_NO_SHOW_ALL keeps it
	 * out of pg_settings, whose reset_val would show it as written.
	 */
	DefineCustomStringVariable("outbox.kafka_properties",
							   "librdkafka producer properties, as name=value pairs separated by semicolons.",
							   "For example 'security.protocol=SASL_SSL; sasl.mechanisms=PLAIN; compression.type=lz4'. "
							   "enable.idempotence and acks cannot be changed.",
							   &outbox_kafka_properties,
							   "",
							   PGC_SIGHUP, GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL,
							   check_kafka_properties, NULL, show_kafka_properties);
}

/* How large a batch, and a message, may be. */
static void
define_size_settings(void)
{
	DefineCustomIntVariable("outbox.batch_size",
							"Most messages the worker claims and publishes in one transaction.",
							NULL,
							&outbox_batch_size,
							DEFAULT_BATCH_SIZE, 1, MAX_BATCH_SIZE,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	/*
	 * The batch claimed and the batch in flight are the worker's memory, so
	 * their bytes are capped, not only their count.  No more than
	 * librdkafka's default queue takes, so that a batch never waits for room
	 * in it.
	 */
	DefineCustomIntVariable("outbox.max_batch_bytes",
							"Most bytes of payloads, keys and headers the worker claims and publishes in one transaction.",
							"A batch holds at least one message, however large.",
							&outbox_max_batch_kb,
							DEFAULT_MAX_BATCH_KB, 1, MAX_MAX_BATCH_KB,
							PGC_SIGHUP, GUC_UNIT_KB,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.max_payload_size",
							"Largest Kafka record a new outbox message may make: payload, key and headers.",
							"Counted as librdkafka counts a record against its message.max.bytes, whose default this is.",
							&outbox_max_record_size,
							DEFAULT_MAX_RECORD_SIZE, 0, MaxAllocSize,
							PGC_SUSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);
}

/* When a failed message is tried again, and how often at most. */
static void
define_retry_settings(void)
{
	DefineCustomIntVariable("outbox.retry_backoff_base",
							"Delay before the first retry of a failed message; doubled at each further attempt.",
							"The delay actually used is drawn at random between half of it and all of it.",
							&outbox_retry_backoff_base,
							DEFAULT_RETRY_BACKOFF_BASE_MS, 1, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.retry_backoff_max",
							"Longest delay between two attempts of a failed message.",
							NULL,
							&outbox_retry_backoff_max,
							DEFAULT_RETRY_BACKOFF_MAX_MS, 1, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.max_attempts",
							"Failed attempts after which a message is moved to outbox_dead_letter.",
							NULL,
							&outbox_max_attempts,
							DEFAULT_MAX_ATTEMPTS, 1, MAX_MAX_ATTEMPTS,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);
}

/*
 * The publisher's pace, what it keeps of delivered messages, and the
 * standbys it waits for.
 */
static void
define_publisher_loop_settings(void)
{
	DefineCustomIntVariable("outbox.poll_interval",
							"Longest time the worker sleeps without being woken by a commit.",
							"A safety net: the worker is woken at the commit of every transaction that enqueues.",
							&outbox_poll_interval,
							DEFAULT_POLL_INTERVAL_MS, MIN_POLL_INTERVAL_MS, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.max_wake_delay",
							"How long the worker lets commits gather before a turn, when they come faster than 2,000 a second.",
							"Below that rate, and at 0, each turn starts at once. "
							"Fewer, larger turns leave more CPU to the application.",
							&outbox_max_wake_delay,
							DEFAULT_MAX_WAKE_DELAY_MS, 0, MAX_MAX_WAKE_DELAY_MS,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	/* a developer option: a test widens with it a window it must close */
	DefineCustomIntVariable("outbox.claim_snapshot_delay",
							"For tests: how long the worker waits before each claim takes its snapshot.",
							"Leave it at 0.",
							&outbox_claim_snapshot_delay,
							0, 0, MAX_CLAIM_SNAPSHOT_DELAY_MS,
							PGC_SIGHUP, GUC_UNIT_MS | GUC_NOT_IN_SAMPLE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.sent_retention",
							"How long delivered messages stay in outbox_message as 'sent'; 0 deletes them at once.",
							NULL,
							&outbox_sent_retention,
							DEFAULT_SENT_RETENTION_S, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	/*
	 * In the spirit of PostgreSQL 17's synchronized_standby_slots, for the
	 * publisher: see standby_slots.c.  The slots are not looked up here: the
	 * postmaster, which checks a reload, cannot, and a slot may be created
	 * after the setting; a missing one is the worker's to report.
	 */
	DefineCustomStringVariable("outbox.synchronized_standby_slots",
							   "Physical replication slots whose standbys must have flushed a batch's transactions before the worker publishes it.",
							   "A comma-separated list of slot names; empty publishes without waiting for any standby. "
							   "While a listed slot's standby is down, or the slot is missing, logical or invalidated, nothing is published.",
							   &outbox_synchronized_standby_slots,
							   "",
							   PGC_SIGHUP, GUC_LIST_INPUT,
							   check_standby_slot_list, NULL, NULL);

	/* docs/exactly-once.md, and exactly_once.c */
	DefineCustomEnumVariable("outbox.delivery",
							 "How often a committed message reaches a read_committed consumer: at_least_once, or exactly_once.",
							 "exactly_once publishes each batch as a Kafka transaction, whose outcome the worker learns after any crash. "
							 "Consumers must read with isolation.level=read_committed.",
							 &outbox_delivery,
							 OUTBOX_DELIVERY_AT_LEAST_ONCE, delivery_options,
							 PGC_SIGHUP, 0,
							 NULL, NULL, NULL);
	DefineCustomStringVariable("outbox.progress_topic",
							   "The Kafka topic where, with outbox.delivery = exactly_once, each transaction records the messages it holds.",
							   "Made with one partition if it does not exist. Shared by every database that publishes to the same brokers.",
							   &outbox_progress_topic,
							   DEFAULT_PROGRESS_TOPIC,
							   PGC_SIGHUP, 0,
							   check_progress_topic, NULL, NULL);
}

/*
 * What bounds one subscription's hold on the inbox worker, which applies
 * every subscription of its database in turn.  A handler call of half a
 * minute is far past any per-message work a handler should do in the
 * transaction of a batch, and short enough that a stuck handler costs its
 * subscription a retry, not the database its inbox.  A turn of 100 ms is
 * never reached by a batch of quick handlers (5000 messages at 75,000 a
 * second take 67 ms), and keeps every other subscription's wait for a slow
 * one near it.
 */
static void
define_inbox_limit_settings(void)
{
	DefineCustomIntVariable("outbox.inbox_handler_timeout",
							"Longest a handler may take over one message before the call is cancelled and the message failed.",
							"The cancel cannot be caught: every statement of the call raises it again. 0 turns the limit off.",
							&outbox_inbox_handler_timeout,
							DEFAULT_INBOX_HANDLER_TIMEOUT_MS, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.inbox_turn_time",
							"How long the inbox worker applies one subscription's messages before it turns to the next subscription, when its database has more than one.",
							"The rest of the batch is applied at the subscription's next turn. At least one message is applied per turn.",
							&outbox_inbox_turn_time,
							DEFAULT_INBOX_TURN_TIME_MS, 1, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/* The inbox worker's batches and how long it remembers the ids received. */
static void
define_inbox_settings(void)
{
	DefineCustomIntVariable("outbox.inbox_batch_size",
							"Most messages the inbox worker applies in one transaction.",
							NULL,
							&outbox_inbox_batch_size,
							DEFAULT_INBOX_BATCH_SIZE, 1, MAX_BATCH_SIZE,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	/*
	 * A producer sends a message twice only when it crashed after Kafka
	 * took it, and sends it again soon after; a consumer reads it again only
	 * while Kafka keeps it.  So the ids are kept as long as Kafka keeps
	 * messages by default.
	 */
	DefineCustomIntVariable("outbox.inbox_dedup_retention",
							"How long the inbox remembers the outbox-message-id of a message received, to apply it once if it comes again.",
							"A message that comes again later than this is applied again.",
							&outbox_inbox_dedup_retention,
							DEFAULT_INBOX_DEDUP_RETENTION_S, 1, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	/*
	 * Each subscription is a consumer, a Kafka process of the inbox worker
	 * with its connections and file descriptors: a ceiling per database,
	 * which a superuser may set per database (ALTER DATABASE ... SET).
	 */
	DefineCustomIntVariable("outbox.max_subscriptions",
							"Most inbox subscriptions a database may have.",
							"inbox_subscribe() refuses one more (SQLSTATE 53400); those made already stay.",
							&outbox_max_subscriptions,
							DEFAULT_MAX_SUBSCRIPTIONS, 0, MAX_MAX_SUBSCRIPTIONS,
							PGC_SUSET, 0,
							NULL, NULL, NULL);
}

/*
 * The trace context an enqueuing transaction gives its messages
 * (trace_context.c checks them).
 */
static void
define_trace_settings(void)
{
	/*
	 * The trace context of what this session enqueues (trace_context.c),
	 * set by the application's tracing for its transaction: SET LOCAL.
	 */
	DefineCustomStringVariable("outbox.traceparent",
							   "W3C traceparent sent as the traceparent header of each message enqueued.",
							   "Set it for the transaction (SET LOCAL); empty, the statement's sqlcommenter comment is read instead.",
							   &outbox_traceparent,
							   "",
							   PGC_USERSET, GUC_NOT_IN_SAMPLE,
							   check_traceparent, NULL, NULL);

	DefineCustomStringVariable("outbox.tracestate",
							   "W3C tracestate sent with outbox.traceparent as the tracestate header.",
							   NULL,
							   &outbox_tracestate,
							   "",
							   PGC_USERSET, GUC_NOT_IN_SAMPLE,
							   check_tracestate, NULL, NULL);
}

/*
 * The ceiling on delays.  Superuser-only, as outbox.max_payload_size: it
 * protects the other applications' keys from the one that enqueues, so the
 * one that enqueues may not raise it.
 */
static void
define_delay_settings(void)
{
	DefineCustomIntVariable("outbox.max_delay",
							"Longest delay (deliver_after, or deliver_at from now) a new outbox message may be given.",
							"A delayed message holds back the later messages of its key until it is sent; 0 refuses every delay.",
							&outbox_max_delay,
							DEFAULT_MAX_DELAY_S, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);
}

/* Define the settings, by concern; outbox.* is the extension's prefix. */
static void
define_settings(void)
{
	define_connection_settings();
	define_size_settings();
	define_retry_settings();
	define_publisher_loop_settings();
	define_inbox_settings();
	define_inbox_limit_settings();
	define_trace_settings();
	define_delay_settings();
	MarkGUCPrefixReserved("outbox");
}

/*
 * Exponential backoff with jitter, for the outbox's retries and the
 * inbox's: outbox.retry_backoff_base * 2^attempts, capped at
 * outbox.retry_backoff_max, then drawn at random from its upper half so
 * that retries of many messages spread out.
 */
int64
retry_backoff_ms(int attempts)
{
	double		delay = outbox_retry_backoff_base;

	for (int i = 0; i < attempts && delay < outbox_retry_backoff_max; i++)
		delay *= 2;
	delay = Min(delay, (double) outbox_retry_backoff_max);
	return (int64) pg_prng_uint64_range(&pg_global_prng_state,
										(uint64) (delay / 2), (uint64) delay);
}

/* outbox.databases must be a list of names. */
static bool
check_database_list(char **newval, void **extra, GucSource source)
{
	char	   *copy = pstrdup(*newval);
	List	   *names;
	bool		ok = SplitIdentifierString(copy, ',', &names);

	if (!ok)
		GUC_check_errdetail("List syntax is invalid.");
	list_free(names);
	pfree(copy);
	return ok;
}

/*
 * outbox.synchronized_standby_slots must be a list of replication slot
 * names.  ReplicationSlotValidateName() says why a name is not one only at
 * the level given, and an ERROR would escape a check hook: so it says it at
 * DEBUG1, and the detail here.
 */
static bool
check_standby_slot_list(char **newval, void **extra, GucSource source)
{
	char	   *copy = pstrdup(*newval);
	List	   *names;
	ListCell   *lc;
	bool		ok = SplitIdentifierString(copy, ',', &names);

	if (!ok)
		GUC_check_errdetail("List syntax is invalid.");
	else
		foreach(lc, names)
		{
			const char *name = lfirst(lc);

			if (ReplicationSlotValidateName(name, false, DEBUG1))
				continue;
			GUC_check_errdetail("\"%s\" is not a replication slot name: one is 1 to %d lower-case letters, digits and underscores.",
								name, NAMEDATALEN - 1);
			ok = false;
			break;
		}
	list_free(names);
	pfree(copy);
	return ok;
}

/*
 * The slots of outbox.synchronized_standby_slots, NIL when it is empty:
 * the names point into a copy of the setting, both in the current memory
 * context.
 */
List *
settings_standby_slot_names(void)
{
	List	   *names;

	if (!SplitIdentifierString(pstrdup(outbox_synchronized_standby_slots), ',', &names))
		elog(ERROR, "outbox.synchronized_standby_slots is not a list of names");	/* checked at SET */
	return names;
}

/*
 * Reload the configuration file if a SIGHUP asked for it, as the
 * extension's workers do between two waits; returns whether it did.
 */
bool
settings_reload_if_asked(void)
{
	if (!ConfigReloadPending)
		return false;
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	return true;
}

/*
 * Is the outbox of the database of this name to be published?  By
 * outbox.databases, or when it is empty by outbox.database, or when both
 * are, yes.
 */
bool
settings_database_allowed(const char *name)
{
	char	   *copy;
	List	   *names;
	bool		allowed = false;
	ListCell   *lc;

	if (outbox_databases[0] == '\0')
		return outbox_database[0] == '\0' || strcmp(outbox_database, name) == 0;

	copy = pstrdup(outbox_databases);
	if (!SplitIdentifierString(copy, ',', &names))
		elog(ERROR, "outbox.databases is not a list of names");	/* checked at SET */
	foreach(lc, names)
		allowed |= strcmp((char *) lfirst(lc), name) == 0;
	list_free(names);
	pfree(copy);
	return allowed;
}

/*
 * Is it the deprecated outbox.database that decides which databases are
 * published?  For what messages say.
 */
bool
settings_database_list_deprecated(void)
{
	return outbox_databases[0] == '\0' && outbox_database[0] != '\0';
}

/* Trim white space off both ends of s, in place. */
static char *
trim(char *s)
{
	char	   *end;

	while (isspace((unsigned char) *s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char) end[-1]))
		*--end = '\0';
	return s;
}

/*
 * Split outbox.kafka_properties, "name=value; name=value", into a List of
 * KafkaProperty: each name the text before an item's first '=', its value
 * all after it, both trimmed.  Blank items are skipped.  Returns false if an
 * item has no '=' or an empty name.  The check, SHOW and the producer all
 * read the setting through this, so the check accepts exactly the pairs the
 * producer will set.
 */
bool
kafka_properties_split(const char *setting, List **properties)
{
	char	   *item = pstrdup(setting ? setting : "");

	*properties = NIL;
	while (item != NULL)
	{
		char	   *next = strchr(item, ';');
		char	   *eq;
		KafkaProperty *property;

		if (next)
			*next++ = '\0';
		item = trim(item);
		if (*item != '\0')
		{
			eq = strchr(item, '=');
			if (eq == NULL)
				return false;
			*eq = '\0';
			property = palloc(sizeof(KafkaProperty));
			property->name = trim(item);
			property->value = trim(eq + 1);
			if (property->name[0] == '\0')
				return false;
			*properties = lappend(*properties, property);
		}
		item = next;
	}
	return true;
}

/*
 * Is name a row of the tables of properties that librdkafka prints (the
 * global ones, then the topic's, as in its CONFIGURATION.md)?  A row
 * follows its table's line of dashes, up to the blank line after the
 * table, and starts with the property's name.
 */
static bool
property_in_tables(const char *tables, const char *name)
{
	size_t		len = strlen(name);
	bool		in_table = false;

	for (const char *line = tables; *line != '\0';)
	{
		const char *end = strchrnul(line, '\n');

		if (line == end)
			in_table = false;
		else if (strncmp(line, "---", 3) == 0)
			in_table = true;
		else if (in_table && strncmp(line, name, len) == 0 &&
				 (line[len] == ' ' || line[len] == '|'))
			return true;
		line = *end ? end + 1 : end;
	}
	return false;
}

/*
 * The first property of the list whose name librdkafka does not know, as a
 * producer's or a topic's property, or NULL.  The names are looked up in
 * the tables rd_kafka_conf_properties_show() prints, which makes no
 * configuration and sets nothing (setting plugin.library.paths would load
 * a library, here perhaps in the postmaster).  rd_kafka_conf_get() cannot
 * tell: it says RD_KAFKA_CONF_UNKNOWN of a property it knows that has no
 * value, sasl.password say.  Whether librdkafka takes each value is the
 * worker's to find out, when it makes its producer.
 */
static const char *
unknown_kafka_property(List *properties)
{
	char	   *tables = NULL;
	size_t		tables_len = 0;
	FILE	   *out;
	const char *unknown = NULL;
	ListCell   *lc;

	if (properties == NIL || (out = open_memstream(&tables, &tables_len)) == NULL)
		return NULL;
	rd_kafka_conf_properties_show(out);
	if (fclose(out) != 0)
	{
		free(tables);
		return NULL;			/* out of memory: the worker will say */
	}
	foreach(lc, properties)
	{
		KafkaProperty *property = lfirst(lc);

		if (!property_in_tables(tables, property->name))
		{
			unknown = property->name;
			break;
		}
	}
	free(tables);
	return unknown;
}

/*
 * Refuse an outbox.kafka_properties that is not name=value pairs, or that
 * names a property librdkafka does not know.  The message never repeats a
 * value, which may be a secret; a name is none.
 */
static bool
check_kafka_properties(char **newval, void **extra, GucSource source)
{
	List	   *properties;
	const char *unknown;

	if (!kafka_properties_split(*newval, &properties))
	{
		/* PostgreSQL's own message would repeat the value */
		GUC_check_errmsg("invalid value for parameter \"%s\"", "outbox.kafka_properties");
		GUC_check_errdetail("Each property must be written name=value; properties are separated by semicolons.");
		return false;
	}

	/*
	 * At server start the value comes from postgresql.conf as the library is
	 * loaded, where a refusal is only a WARNING and the workers would run
	 * without any of the properties (without the SASL ones, say).  Let an
	 * unknown name through there: the worker then refuses to publish and says
	 * why in outbox_worker, as for a value librdkafka refuses.
	 */
	if (process_shared_preload_libraries_in_progress)
		return true;
	if (settings_kafka_property_set(properties, "transactional.id"))
	{
		GUC_check_errcode(ERRCODE_INVALID_PARAMETER_VALUE);
		GUC_check_errmsg("invalid value for parameter \"%s\": transactional.id cannot be set",
						 "outbox.kafka_properties");
		GUC_check_errhint("Set outbox.delivery = 'exactly_once' instead: the worker then gives each database's producer a transactional.id of its own.");
		return false;
	}
	if ((unknown = unknown_kafka_property(properties)) == NULL)
		return true;

	GUC_check_errcode(ERRCODE_INVALID_PARAMETER_VALUE);
	GUC_check_errmsg("invalid value for parameter \"%s\": librdkafka has no property \"%s\"",
					 "outbox.kafka_properties", unknown);
	GUC_check_errhint("The names are those of librdkafka's CONFIGURATION.md, for a producer or a topic, such as linger.ms or compression.codec.");
	return false;
}

/* Does the list of properties set this one? */
bool
settings_kafka_property_set(List *properties, const char *name)
{
	ListCell   *lc;

	foreach(lc, properties)
		if (strcmp(((KafkaProperty *) lfirst(lc))->name, name) == 0)
			return true;
	return false;
}

/* outbox.progress_topic must be a name Kafka accepts for a topic. */
static bool
check_progress_topic(char **newval, void **extra, GucSource source)
{
	const char *name = *newval;
	size_t		len = strlen(name);
	bool		valid = len > 0 && len <= KAFKA_MAX_TOPIC_LENGTH &&
		strcmp(name, ".") != 0 && strcmp(name, "..") != 0;

	for (size_t i = 0; valid && i < len; i++)
		valid = kafka_topic_char(name[i]);
	if (valid)
		return true;
	GUC_check_errcode(ERRCODE_INVALID_PARAMETER_VALUE);
	GUC_check_errdetail("A Kafka topic name is 1 to %d characters of [a-zA-Z0-9._-], and not \".\" or \"..\".",
						KAFKA_MAX_TOPIC_LENGTH);
	return false;
}

/*
 * What SHOW and current_setting() tell of outbox.kafka_properties: the
 * setting to superusers, the property names alone to the members of
 * pg_read_all_settings.  Any value may be a secret, and which properties
 * hold secrets changes with librdkafka's releases, so all are masked.
 */
static const char *
show_kafka_properties(void)
{
	StringInfoData shown;
	List	   *properties;
	ListCell   *lc;

	if (superuser())
		return outbox_kafka_properties;

	initStringInfo(&shown);
	(void) kafka_properties_split(outbox_kafka_properties, &properties);
	foreach(lc, properties)
	{
		KafkaProperty *property = lfirst(lc);

		appendStringInfo(&shown, "%s%s=" MASKED_VALUE,
						 shown.len > 0 ? "; " : "", property->name);
	}
	return shown.data;
}

/* Does the text have a word character at pos?  Secrets are matched as whole words. */
static bool
word_char_at(const char *text, size_t len, size_t pos)
{
	return pos < len && isalnum((unsigned char) text[pos]);
}

/* Longer secrets first, so that a value goes whole before its words do. */
static int
compare_length_descending(const ListCell *a, const ListCell *b)
{
	return (int) strlen(lfirst(b)) - (int) strlen(lfirst(a));
}

/*
 * Everything of these outbox.kafka_properties that may be a secret: each
 * value, and each word of it (a value such as sasl.oauthbearer.config holds
 * several, which librdkafka quotes one by one).
 */
static List *
secrets_of(const char *kafka_properties)
{
	List	   *properties;
	List	   *secrets = NIL;
	ListCell   *lc;

	if (!kafka_properties_split(kafka_properties, &properties))
		return NIL;
	foreach(lc, properties)
	{
		KafkaProperty *property = lfirst(lc);
		char	   *words = pstrdup(property->value);
		char	   *saveptr;

		if (property->value[0] != '\0')
			secrets = lappend(secrets, property->value);
		for (char *word = strtok_r(words, SECRET_WORD_SEPARATORS, &saveptr); word;
			 word = strtok_r(NULL, SECRET_WORD_SEPARATORS, &saveptr))
			secrets = lappend(secrets, word);
	}
	list_sort(secrets, compare_length_descending);
	return secrets;
}

/*
 * A copy of text in which every value of kafka_properties, and every word
 * of one, is replaced by MASKED_VALUE wherever it stands as a whole word.
 * librdkafka may quote a configured value in an error or a log line, and
 * which properties hold secrets changes with its releases, so every text
 * from librdkafka goes through this before the log or outbox_worker.
 */
char *
settings_scrub_secrets(const char *text, const char *kafka_properties)
{
	List	   *secrets = secrets_of(kafka_properties);
	size_t		len = strlen(text);
	StringInfoData scrubbed;

	initStringInfo(&scrubbed);
	for (size_t pos = 0; pos < len;)
	{
		ListCell   *lc;
		size_t		matched = 0;

		if (pos == 0 || !word_char_at(text, len, pos - 1))
			foreach(lc, secrets)
			{
				size_t		secret_len = strlen(lfirst(lc));

				if (strncmp(text + pos, lfirst(lc), secret_len) == 0 &&
					!word_char_at(text, len, pos + secret_len))
				{
					matched = secret_len;
					break;
				}
			}
		if (matched > 0)
		{
			appendStringInfoString(&scrubbed, MASKED_VALUE);
			pos += matched;
		}
		else
			appendStringInfoChar(&scrubbed, text[pos++]);
	}
	return scrubbed.data;
}

/*
 * At a reload the postmaster logs the new value of every setting that
 * changed; that of outbox.kafka_properties may hold secrets, and server logs
 * travel further than the settings do.  Log that it changed, not to what.
 * The message is recognized by its untranslated text; the setting's name
 * stays as it is in every translation.
 */
static void
hide_kafka_properties_in_log(ErrorData *edata)
{
	if (edata->message_id &&
		strcmp(edata->message_id, "parameter \"%s\" changed to \"%s\"") == 0 &&
		strstr(edata->message, "outbox.kafka_properties") != NULL)
	{
		pfree(edata->message);
		edata->message = psprintf("parameter \"%s\" changed", "outbox.kafka_properties");
	}

	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
}

/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  Loading the outbox library: its settings, its shared memory, the
 *	  commit-time wake, and the background worker that publishes to Kafka.
 *
 * The library must be in shared_preload_libraries: the worker is a static
 * background worker and the worker's slot lives in shared memory.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "outbox.h"

PG_MODULE_MAGIC;

char	   *outbox_brokers = NULL;
char	   *outbox_database = NULL;
char	   *outbox_kafka_properties = NULL;
int			outbox_batch_size = 1000;
int			outbox_retry_backoff_base = 1000;
int			outbox_retry_backoff_max = 300000;
int			outbox_max_attempts = 10;
int			outbox_poll_interval = 10000;
int			outbox_max_payload_size = 1000000;
int			outbox_sent_retention = 0;

OutboxShared *outbox_shared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static emit_log_hook_type prev_emit_log_hook = NULL;

void		_PG_init(void);
static void outbox_shmem_request(void);
static void outbox_shmem_startup(void);
static void define_settings(void);
static void register_worker(void);
static bool check_kafka_properties(char **newval, void **extra, GucSource source);
static const char *show_kafka_properties(void);
static void hide_kafka_properties_in_log(ErrorData *edata);

void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox must be loaded via shared_preload_libraries"),
				 errhint("Add outbox to shared_preload_libraries in postgresql.conf and restart the server.")));

	define_settings();

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = outbox_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = outbox_shmem_startup;
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = hide_kafka_properties_in_log;

	outbox_register_commit_wake();
	register_worker();
}

static void
define_settings(void)
{
	DefineCustomStringVariable("outbox.brokers",
							   "Kafka bootstrap servers the worker publishes to.",
							   "A comma-separated list of host:port.",
							   &outbox_brokers,
							   "localhost:9092",
							   PGC_SIGHUP, 0,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("outbox.database",
							   "Database whose outbox the worker serves.",
							   NULL,
							   &outbox_database,
							   "postgres",
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

	DefineCustomIntVariable("outbox.batch_size",
							"Most messages the worker claims and publishes in one transaction.",
							NULL,
							&outbox_batch_size,
							1000, 1, 100000,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.retry_backoff_base",
							"Delay before the first retry of a failed message; doubled at each further attempt.",
							"The delay actually used is drawn at random between half of it and all of it.",
							&outbox_retry_backoff_base,
							1000, 1, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.retry_backoff_max",
							"Longest delay between two attempts of a failed message.",
							NULL,
							&outbox_retry_backoff_max,
							300000, 1, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.max_attempts",
							"Failed attempts after which a message is moved to outbox_dead_letter.",
							NULL,
							&outbox_max_attempts,
							10, 1, 1000000,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.poll_interval",
							"Longest time the worker sleeps without being woken by a commit.",
							"A safety net: the worker is woken at the commit of every transaction that enqueues.",
							&outbox_poll_interval,
							10000, 10, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.max_payload_size",
							"Largest Kafka record a new outbox message may make: payload, key and headers.",
							"Counted as librdkafka counts a record against its message.max.bytes, whose default this is.",
							&outbox_max_payload_size,
							1000000, 0, MaxAllocSize,
							PGC_SUSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.sent_retention",
							"How long delivered messages stay in outbox_message as 'sent'; 0 deletes them at once.",
							NULL,
							&outbox_sent_retention,
							0, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	MarkGUCPrefixReserved("outbox");
}

/*
 * Check the shape of outbox.kafka_properties: name=value pairs.  Whether
 * librdkafka knows each name is checked by the worker, which reports it in
 * outbox_worker; the message never repeats a value, which may be a secret.
 */
static bool
check_kafka_properties(char **newval, void **extra, GucSource source)
{
	const char *p = *newval;

	while (p && *p)
	{
		const char *end = strchr(p, ';');
		size_t		len = end ? (size_t) (end - p) : strlen(p);
		const char *eq = memchr(p, '=', len);
		bool		blank = true;

		for (size_t i = 0; i < len; i++)
			if (!isspace((unsigned char) p[i]))
				blank = false;

		if (!blank && (eq == NULL || eq == p))
		{
			/* PostgreSQL's own message would repeat the value */
			GUC_check_errmsg("invalid value for parameter \"%s\"", "outbox.kafka_properties");
			GUC_check_errdetail("Each property must be written name=value; properties are separated by semicolons.");
			return false;
		}
		p = end ? end + 1 : NULL;
	}
	return true;
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
	const char *p = outbox_kafka_properties;

	if (superuser())
		return outbox_kafka_properties;

	initStringInfo(&shown);
	while (p && *p)
	{
		const char *end = strchr(p, ';');
		size_t		len = end ? (size_t) (end - p) : strlen(p);
		const char *eq = memchr(p, '=', len);

		if (eq)
		{
			const char *name = p;
			const char *name_end = eq;

			while (name < name_end && isspace((unsigned char) *name))
				name++;
			while (name_end > name && isspace((unsigned char) name_end[-1]))
				name_end--;
			appendStringInfo(&shown, "%s%.*s=********", shown.len > 0 ? "; " : "",
							 (int) (name_end - name), name);
		}
		p = end ? end + 1 : NULL;
	}
	return shown.data;
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

/*
 * The hash of a (topic, key) pair: it names the lock that orders enqueues of
 * one key, and the keys the worker holds back within a batch.
 */
uint64
outbox_key_hash(const char *topic, size_t topic_len, const char *key, size_t key_len)
{
	return hash_combine64(hash_bytes_extended((const unsigned char *) topic, topic_len, 0),
						  hash_bytes_extended((const unsigned char *) key, key_len, 0));
}

static void
outbox_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(OutboxShared)));
}

static void
outbox_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	outbox_shared = ShmemInitStruct("outbox", sizeof(OutboxShared), &found);
	if (!found)
	{
		OutboxWorkerSlot *slot = &outbox_shared->worker;

		memset(outbox_shared, 0, sizeof(OutboxShared));
		SpinLockInit(&slot->mutex);
		pg_atomic_init_u64(&slot->published, 0);
		pg_atomic_init_u64(&slot->failed, 0);
		pg_atomic_init_u64(&slot->dead_lettered, 0);
		pg_atomic_init_u32(&slot->simulate_fatal_error, 0);
	}
	LWLockRelease(AddinShmemInitLock);
}

static void
register_worker(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "outbox");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "outbox_worker_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "outbox worker");
	snprintf(worker.bgw_type, BGW_MAXLEN, "outbox worker");
	RegisterBackgroundWorker(&worker);
}

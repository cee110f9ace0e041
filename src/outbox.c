/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  Loading the outbox library: its settings, its shared memory, the
 *	  commit-time wake, and the background workers it runs.
 *
 * The library must be in shared_preload_libraries: its workers are
 * background workers and their slots live in shared memory.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"

#include "enqueue.h"
#include "key_lock.h"
#include "settings.h"
#include "worker_slot.h"

PG_MODULE_MAGIC;

/* How long the postmaster waits before it starts a worker that died again. */
#define WORKER_RESTART_SECONDS 5

/*
 * The kinds of worker, their entry points, and what pg_stat_activity calls
 * them.  Each starts with the server, in a slot of its own.  A new kind is
 * a file with its main function and a row here.
 */
typedef struct WorkerKindDef
{
	OutboxWorkerKind kind;
	const char *function_name;
	const char *type;
} WorkerKindDef;

static const WorkerKindDef worker_kinds[] = {
	{WORKER_KIND_PUBLISHER, "outbox_publisher_main", "outbox worker"},
};

void		_PG_init(void);
static void register_static_workers(void);

void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox must be loaded via shared_preload_libraries"),
				 errhint("Add outbox to shared_preload_libraries in postgresql.conf and restart the server.")));

	settings_init();
	worker_slots_init();
	enqueue_init();
	key_lock_init();
	register_static_workers();
}

/* Register each worker, with the number of the slot it will take. */
static void
register_static_workers(void)
{
	for (int i = 0; i < (int) lengthof(worker_kinds); i++)
	{
		const WorkerKindDef *def = &worker_kinds[i];
		BackgroundWorker worker;

		memset(&worker, 0, sizeof(worker));
		worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
		worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
		worker.bgw_restart_time = WORKER_RESTART_SECONDS;
		worker.bgw_main_arg = Int32GetDatum(worker_slot_reserve(def->kind));
		snprintf(worker.bgw_library_name, BGW_MAXLEN, "outbox");
		snprintf(worker.bgw_function_name, BGW_MAXLEN, "%s", def->function_name);
		snprintf(worker.bgw_name, BGW_MAXLEN, "%s", def->type);
		snprintf(worker.bgw_type, BGW_MAXLEN, "%s", def->type);
		RegisterBackgroundWorker(&worker);
	}
}

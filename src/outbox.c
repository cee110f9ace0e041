/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  Loading the outbox library: its settings, its shared memory (the
 *	  workers' slots, the metrics), the commit-time wake, the hooks on
 *	  statements about databases, and the launcher, which starts the other
 *	  background workers.
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

#include "serving.h"
#include "enqueue.h"
#include "key_lock.h"
#include "metrics.h"
#include "settings.h"
#include "shared_memory.h"

PG_MODULE_MAGIC;

/* How long the postmaster waits before it starts the launcher again. */
#define LAUNCHER_RESTART_SECONDS 5

void		_PG_init(void);
static void register_launcher(void);

void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox must be loaded via shared_preload_libraries"),
				 errhint("Add outbox to shared_preload_libraries in postgresql.conf and restart the server.")));

	settings_init();
	shared_memory_init();
	metrics_init();
	enqueue_init();
	key_lock_init();
	serving_init();
	register_launcher();
}

/*
 * The launcher is the one static worker: it starts the others
 * (launcher.c).  It needs no database, and none is written to before
 * recovery has finished.
 *
 * Not while pg_upgrade runs the server (binary-upgrade mode, -b): the old
 * cluster is started only to be read, and a worker there would publish,
 * consume and write what pg_upgrade has decided to copy as it was; the new
 * one is being filled, by pg_upgrade alone, object by object at the oids
 * it chooses.  The cluster pg_upgrade makes starts the workers when it is
 * started as usual.
 */
static void
register_launcher(void)
{
	BackgroundWorker worker;

	if (IsBinaryUpgrade)
	{
		ereport(LOG,
				(errmsg("outbox: no worker is started: the server runs in binary-upgrade mode, for pg_upgrade")));
		return;
	}
	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = LAUNCHER_RESTART_SECONDS;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "outbox");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "outbox_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "outbox launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "outbox launcher");
	RegisterBackgroundWorker(&worker);
}

/*-------------------------------------------------------------------------
 *
 * shared_memory.c
 *	  The outbox's shared memory, one piece for its four owners
 *	  (slot_internal.h): asked for as the postmaster starts, sized for
 *	  outbox.max_workers slots and MaxBackends commit reports, and made (or
 *	  found made) as each process starts.  What is in it, and its locking
 *	  rules, are worker_slot.c's (the publishers' slots), inbox_slot.c's
 *	  (each slot's inbox part), launcher_slot.c's (the launcher's part) and
 *	  commit_report.c's (the backends' commit reports).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"

#include "settings.h"
#include "shared_memory.h"
#include "slot_internal.h"

OutboxShared *outbox_shared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Where the commit reports begin, after outbox.max_workers slots. */
static Size
commit_reports_offset(void)
{
	return MAXALIGN(add_size(offsetof(OutboxShared, slots),
							 mul_size(sizeof(OutboxWorkerSlot), outbox_max_workers)));
}

/* The size of the outbox's shared memory, with a commit report per backend. */
static Size
shared_size(void)
{
	return add_size(commit_reports_offset(), mul_size(sizeof(CommitReport), MaxBackends));
}

/* Ask for the shared memory and launcher_lock, as the postmaster starts. */
static void
outbox_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(shared_size()));
	RequestNamedLWLockTranche("outbox", 1);
}

/* Make the shared memory, or find it made, as each process starts. */
static void
outbox_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	outbox_shared = ShmemInitStruct("outbox", shared_size(), &found);
	if (!found)
	{
		memset(outbox_shared, 0, shared_size());
		outbox_shared->launcher_lock = &(GetNamedLWLockTranche("outbox"))->lock;
		outbox_shared->slot_count = outbox_max_workers;
		for (int i = 0; i < outbox_shared->slot_count; i++)
		{
			OutboxWorkerSlot *slot = &outbox_shared->slots[i];

			SpinLockInit(&slot->mutex);
			pg_atomic_init_u64(&slot->published, 0);
			pg_atomic_init_u64(&slot->retries_scheduled, 0);
			pg_atomic_init_u64(&slot->dead_lettered, 0);
			pg_atomic_init_u32(&slot->fatal_error_drill, 0);
			pg_atomic_init_u32(&slot->pause_drill, 0);
			pg_atomic_init_u64(&slot->committed_below, NO_ID);
			pg_atomic_init_u64(&slot->prepared_below, NO_ID);
			pg_atomic_init_u64(&slot->commits_woken, 0);
			pg_atomic_init_u64(&slot->delayed_due, NO_ID);
			pg_atomic_init_u64(&slot->inbox.applied, 0);
			pg_atomic_init_u64(&slot->inbox.duplicates, 0);
			pg_atomic_init_u64(&slot->inbox.failed, 0);
			pg_atomic_init_u64(&slot->inbox.dead_lettered, 0);
		}
		outbox_shared->commit_reports =
			(CommitReport *) ((char *) outbox_shared + commit_reports_offset());
		outbox_shared->commit_report_count = MaxBackends;
		for (int i = 0; i < MaxBackends; i++)
			SpinLockInit(&outbox_shared->commit_reports[i].mutex);
	}
	LWLockRelease(AddinShmemInitLock);
}

/* Ask for the shared memory; in _PG_init, once the settings are defined. */
void
shared_memory_init(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = outbox_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = outbox_shmem_startup;
}

/*-------------------------------------------------------------------------
 *
 * launcher_slot.c
 *	  The launcher's part of the outbox's shared memory (slot_internal.h's
 *	  LauncherShared): the launcher attaches to it, backends announce
 *	  databases and hold the launcher off them through it, a probe leaves
 *	  its result in it, and outbox_launcher reads it.  shared_memory.c
 *	  allocates it, with the slots.
 *
 * Locking rule.  The launcher's part is read and written under
 * launcher_lock (an LWLock), never held with a slot's spinlock nor across
 * anything but copying (no ereport, no allocation, no system call inside):
 * the backends append the databases they announce and the holds they
 * take, the probe its result, the launcher the rest.  Its latch is set
 * with launcher_lock held (shared is enough), so that it is not set after
 * the launcher has left.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/procarray.h"

#include "launcher_slot.h"
#include "slot_internal.h"

/* Set the launcher's latch, if it runs; call it with launcher_lock held. */
static void
wake_launcher_locked(void)
{
	Assert(LWLockHeldByMe(outbox_shared->launcher_lock));
	if (outbox_shared->launcher.latch)
		SetLatch(outbox_shared->launcher.latch);
}

/*
 * Wake the launcher, to look at the slots again (a worker left one, a
 * database wants an inbox worker).
 */
void
launcher_wake(void)
{
	LWLockAcquire(outbox_shared->launcher_lock, LW_SHARED);
	wake_launcher_locked();
	LWLockRelease(outbox_shared->launcher_lock);
}

/* Copy the launcher's part, for outbox_launcher. */
void
launcher_read(LauncherStatus *status)
{
	LauncherShared *l = &outbox_shared->launcher;

	LWLockAcquire(outbox_shared->launcher_lock, LW_SHARED);
	status->pid = l->pid;
	status->started_at = l->started_at;
	status->databases_waiting = l->databases_waiting;
	status->listed_waiting = l->listed_waiting;
	memcpy(status->waiting, l->waiting, sizeof(status->waiting));
	status->last_error_at = l->last_error_at;
	memcpy(status->last_error, l->last_error, WORKER_LAST_ERROR_LEN);
	LWLockRelease(outbox_shared->launcher_lock);
}

/*
 * Tell the launcher that this database has the extension (it was created,
 * or a transaction there enqueued while no publisher serves it).  Call it
 * once that is committed.
 */
void
launcher_announce_database(Oid database)
{
	LauncherShared *l = &outbox_shared->launcher;
	bool		known = false;

	LWLockAcquire(outbox_shared->launcher_lock, LW_EXCLUSIVE);
	for (int i = 0; i < l->announced_count; i++)
		known |= l->announced[i] == database;
	if (known)
		;
	else if (l->announced_count < LAUNCHER_MAX_ANNOUNCED)
		l->announced[l->announced_count++] = database;
	else
		l->announcements_lost = true;
	wake_launcher_locked();
	LWLockRelease(outbox_shared->launcher_lock);
}

/* Ask the launcher to look at every database again (one was created). */
void
launcher_request_rescan(void)
{
	LWLockAcquire(outbox_shared->launcher_lock, LW_EXCLUSIVE);
	outbox_shared->launcher.rescan_requested = true;
	wake_launcher_locked();
	LWLockRelease(outbox_shared->launcher_lock);
}

/*
 * Is this database, which no slot serves, waiting for one?  Past the
 * databases listed, any may be.
 */
bool
launcher_database_waiting(Oid database)
{
	LauncherShared *l = &outbox_shared->launcher;
	bool		waiting;

	LWLockAcquire(outbox_shared->launcher_lock, LW_SHARED);
	waiting = l->databases_waiting > l->listed_waiting;
	for (int i = 0; i < l->listed_waiting; i++)
		waiting |= l->waiting[i] == database;
	LWLockRelease(outbox_shared->launcher_lock);
	return waiting;
}

/*
 * Hold the launcher off this database: it stops its publisher and starts
 * none until this backend releases it or exits.  Returns false if there
 * is no room for one more hold.
 */
bool
launcher_hold_database(Oid database)
{
	LauncherShared *l = &outbox_shared->launcher;
	bool		held = false;

	LWLockAcquire(outbox_shared->launcher_lock, LW_EXCLUSIVE);
	for (int i = 0; i < LAUNCHER_MAX_HOLDS && !held; i++)
	{
		if (l->holds[i].pid != 0)
			continue;
		l->holds[i].database = database;
		l->holds[i].pid = MyProcPid;
		held = true;
	}
	wake_launcher_locked();
	LWLockRelease(outbox_shared->launcher_lock);
	return held;
}

/* Release this backend's hold on the database. */
void
launcher_release_database(Oid database)
{
	LauncherShared *l = &outbox_shared->launcher;

	LWLockAcquire(outbox_shared->launcher_lock, LW_EXCLUSIVE);
	for (int i = 0; i < LAUNCHER_MAX_HOLDS; i++)
		if (l->holds[i].pid == MyProcPid && l->holds[i].database == database)
			l->holds[i].pid = 0;
	l->rescan_requested = true;
	wake_launcher_locked();
	LWLockRelease(outbox_shared->launcher_lock);
}

/* The launcher leaves its part, as it exits. */
static void
launcher_detach(int code, Datum arg)
{
	LWLockAcquire(outbox_shared->launcher_lock, LW_EXCLUSIVE);
	outbox_shared->launcher.pid = 0;
	outbox_shared->launcher.latch = NULL;
	LWLockRelease(outbox_shared->launcher_lock);
}

/* Take the launcher's part for this process, until it exits. */
void
launcher_attach(void)
{
	TimestampTz now = GetCurrentTimestamp();

	LWLockAcquire(outbox_shared->launcher_lock, LW_EXCLUSIVE);
	outbox_shared->launcher.pid = MyProcPid;
	outbox_shared->launcher.latch = MyLatch;
	outbox_shared->launcher.started_at = now;
	outbox_shared->launcher.rescan_requested = true;
	LWLockRelease(outbox_shared->launcher_lock);
	on_shmem_exit(launcher_detach, 0);
}

/*
 * Take the databases announced since the last call, into databases
 * (LAUNCHER_MAX_ANNOUNCED of them at most), and returns how many.  *rescan
 * says whether pg_database is to be read again; *lost, whether some
 * announcements found no room, so that any database may have been
 * announced.
 */
int
launcher_take_announced(Oid *databases, bool *rescan, bool *lost)
{
	LauncherShared *l = &outbox_shared->launcher;
	int			count;

	LWLockAcquire(outbox_shared->launcher_lock, LW_EXCLUSIVE);
	count = l->announced_count;
	memcpy(databases, l->announced, count * sizeof(Oid));
	l->announced_count = 0;
	*rescan = l->rescan_requested;
	*lost = l->announcements_lost;
	l->rescan_requested = false;
	l->announcements_lost = false;
	LWLockRelease(outbox_shared->launcher_lock);
	return count;
}

/*
 * The databases that live backends hold the launcher off, into databases
 * (LAUNCHER_MAX_HOLDS of them at most); returns how many.  Holds of
 * backends that exited without releasing them go.
 */
int
launcher_read_holds(Oid *databases)
{
	LauncherShared *l = &outbox_shared->launcher;
	int			count = 0;

	LWLockAcquire(outbox_shared->launcher_lock, LW_EXCLUSIVE);
	for (int i = 0; i < LAUNCHER_MAX_HOLDS; i++)
	{
		DatabaseHold *hold = &l->holds[i];

		if (hold->pid == 0)
			continue;
		if (BackendPidGetProc(hold->pid) == NULL)
			hold->pid = 0;
		else
			databases[count++] = hold->database;
	}
	LWLockRelease(outbox_shared->launcher_lock);
	return count;
}

/* Say which databases wait for a slot (all of them counted, some listed). */
void
launcher_publish_waiting(const Oid *databases, int count)
{
	LauncherShared *l = &outbox_shared->launcher;

	LWLockAcquire(outbox_shared->launcher_lock, LW_EXCLUSIVE);
	l->databases_waiting = count;
	l->listed_waiting = Min(count, LAUNCHER_MAX_LISTED_WAITING);
	memcpy(l->waiting, databases, l->listed_waiting * sizeof(Oid));
	LWLockRelease(outbox_shared->launcher_lock);
}

/*
 * Report an error the launcher lives through: into the server log and
 * into outbox_launcher's last_error.
 */
void
launcher_report_error(const char *fmt,...)
{
	char		message[WORKER_LAST_ERROR_LEN];
	TimestampTz now = GetCurrentTimestamp();
	va_list		args;

	va_start(args, fmt);
	vsnprintf(message, sizeof(message), fmt, args);
	va_end(args);

	ereport(LOG, (errmsg("outbox launcher: %s", message)));

	LWLockAcquire(outbox_shared->launcher_lock, LW_EXCLUSIVE);
	memcpy(outbox_shared->launcher.last_error, message, sizeof(message));
	outbox_shared->launcher.last_error_at = now;
	LWLockRelease(outbox_shared->launcher_lock);
}

/* A probe of this database is about to start; it has no result yet. */
void
launcher_begin_probe(Oid database)
{
	LWLockAcquire(outbox_shared->launcher_lock, LW_EXCLUSIVE);
	outbox_shared->launcher.probe_database = database;
	outbox_shared->launcher.probe_result = PROBE_NONE;
	LWLockRelease(outbox_shared->launcher_lock);
}

/* What the probe that has ended found. */
ProbeResult
launcher_end_probe(void)
{
	ProbeResult result;

	LWLockAcquire(outbox_shared->launcher_lock, LW_EXCLUSIVE);
	result = outbox_shared->launcher.probe_result;
	outbox_shared->launcher.probe_database = InvalidOid;
	LWLockRelease(outbox_shared->launcher_lock);
	return result;
}

/* In a probe: what it found in its database. */
void
probe_report(Oid database, ProbeResult result)
{
	LWLockAcquire(outbox_shared->launcher_lock, LW_EXCLUSIVE);
	if (outbox_shared->launcher.probe_database == database)
		outbox_shared->launcher.probe_result = result;
	LWLockRelease(outbox_shared->launcher_lock);
}

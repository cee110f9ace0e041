/*-------------------------------------------------------------------------
 *
 * commit_report.c
 *	  What a committing transaction tells the publisher of its database:
 *	  the lowest id it wrote, which the claim floor (store.c) may have
 *	  passed while it was in progress.
 *
 * The report must reach the first claim whose snapshot shows the
 * transaction's rows: a claim that saw them with its floor above their
 * lowest id would publish their later rows, and of their keys, before the
 * earlier ones.  A report made once the rows are visible can come after
 * that snapshot, so each backend reports before: as its transaction is
 * about to commit, with its xid, in its own entry.  The worker reads every
 * entry of its database once its claim has its snapshot, and takes the
 * lowest id of those whose transactions that snapshot shows ended
 * (committed, so visible, or aborted); one the snapshot shows still
 * committing stays for a later claim.
 *
 * A backend's entry holds one report.  Its next commit finds the last one
 * still there if no claim has seen that transaction end yet; that
 * transaction has ended, so its lowest id goes to the publisher's
 * committed_below (worker_lower_claim_floor()), and only then is the entry
 * written over: a claim that reads the entry after that finds the id handed
 * over.  The worker takes what was handed over after reading the entries,
 * and applies it to that claim and to the next one: the transaction had
 * ended before the hand-over, so the next claim's snapshot shows its rows.
 *
 * Locking rule.  An entry is read and written under its spinlock, held
 * only to copy its three fields.  The backend at MyProcNumber writes it;
 * the worker of its database clears it once taken, and only if it still
 * holds the report it took.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/xact.h"
#include "miscadmin.h"
#include "storage/spin.h"
#include "utils/snapmgr.h"

#include "commit_report.h"
#include "pg_compat.h"
#include "slot_internal.h"
#include "worker_slot.h"

/*
 * Report that this transaction, about to commit, wrote outbox rows from the
 * id lowest on.  Call it before the rows are visible (XACT_EVENT_PRE_COMMIT).
 * Every process that can write them, a backend or a background worker, has
 * an entry: its number is below MaxBackends.
 */
void
commit_report_write(int64 lowest)
{
	CommitReport *report = &outbox_shared->commit_reports[MyProcNumber];
	CommitReport last;

	Assert(MyProcNumber >= 0 && MyProcNumber < outbox_shared->commit_report_count);
	SpinLockAcquire(&report->mutex);
	last = *report;
	SpinLockRelease(&report->mutex);
	if (OidIsValid(last.database))
		worker_lower_claim_floor(last.database, last.lowest, false);	/* ended */

	SpinLockAcquire(&report->mutex);
	report->database = MyDatabaseId;
	report->xid = GetTopTransactionId();
	report->lowest = lowest;
	SpinLockRelease(&report->mutex);
}

/*
 * The lowest id of the reports of this database whose transactions the
 * snapshot shows ended, or PG_INT64_MAX if none; those are taken.  Call it
 * with the claim's snapshot, once taken.
 */
int64
commit_report_take_ended(Snapshot snapshot)
{
	int64		lowest = PG_INT64_MAX;

	for (int i = 0; i < outbox_shared->commit_report_count; i++)
	{
		CommitReport *report = &outbox_shared->commit_reports[i];
		CommitReport seen;

		SpinLockAcquire(&report->mutex);
		seen = *report;
		SpinLockRelease(&report->mutex);
		if (seen.database != MyDatabaseId || XidInMVCCSnapshot(seen.xid, snapshot))
			continue;			/* another database's, or still committing */

		lowest = Min(lowest, seen.lowest);
		SpinLockAcquire(&report->mutex);
		if (report->database == seen.database && report->xid == seen.xid)
			report->database = InvalidOid;
		SpinLockRelease(&report->mutex);
	}
	return lowest;
}

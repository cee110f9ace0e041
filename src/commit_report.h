/*-------------------------------------------------------------------------
 *
 * commit_report.h
 *	  A committing transaction's report of its lowest id to the publisher
 *	  (commit_report.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_COMMIT_REPORT_H
#define OUTBOX_COMMIT_REPORT_H

#include "utils/snapshot.h"

extern void commit_report_write(int64 lowest);
extern int64 commit_report_take_ended(Snapshot snapshot);

#endif							/* OUTBOX_COMMIT_REPORT_H */

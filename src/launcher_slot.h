/*-------------------------------------------------------------------------
 *
 * launcher_slot.h
 *	  The launcher's part of the outbox's shared memory: what backends tell
 *	  the launcher (databases announced, databases held), the probe's
 *	  result, the databases waiting for a slot, and what outbox_launcher
 *	  shows.  launcher_slot.c owns it; its header comment states the locking
 *	  rule.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_LAUNCHER_SLOT_H
#define OUTBOX_LAUNCHER_SLOT_H

#include "slot_state.h"

/* In any backend. */
extern void launcher_read(LauncherStatus *status);
extern void launcher_announce_database(Oid database);
extern void launcher_request_rescan(void);
extern bool launcher_database_waiting(Oid database);
extern bool launcher_hold_database(Oid database);
extern void launcher_release_database(Oid database);

/* In the launcher, about itself. */
extern void launcher_attach(void);
extern int	launcher_take_announced(Oid *databases, bool *rescan, bool *lost);
extern int	launcher_read_holds(Oid *databases);
extern void launcher_publish_waiting(const Oid *databases, int count);
extern void launcher_report_error(const char *fmt,...) pg_attribute_printf(1, 2);
extern void launcher_begin_probe(Oid database);
extern ProbeResult launcher_end_probe(void);

/* In a probe. */
extern void probe_report(Oid database, ProbeResult result);

#endif							/* OUTBOX_LAUNCHER_SLOT_H */

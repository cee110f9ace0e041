/*-------------------------------------------------------------------------
 *
 * inbox_slot.h
 *	  The inbox part of each publisher's slot in shared memory: whether
 *	  the database wants an inbox worker, and what the one that runs tells
 *	  about itself (inbox_worker shows it).  inbox_slot.c owns it; its
 *	  header comment states the locking rule.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_INBOX_SLOT_H
#define OUTBOX_INBOX_SLOT_H

#include "slot_state.h"

/* In any backend. */
extern void inbox_want_worker(Oid database);
extern bool inbox_read(Oid database, InboxStatus *status);
extern const char *inbox_state_name(InboxWorkerState state);

/*
 * In an inbox worker, about itself, once attached to its database's slot
 * (its errors it reports with worker_report_error()).
 */
extern Oid	inbox_attach(Datum main_arg);
extern bool inbox_slot_still_mine(void);
extern void inbox_forget_wanted(void);
extern void inbox_report_state(InboxWorkerState state);
extern void inbox_count_outcomes(uint64 applied, uint64 duplicates, uint64 failed,
								 uint64 dead_lettered);

#endif							/* OUTBOX_INBOX_SLOT_H */

/*-------------------------------------------------------------------------
 *
 * launcher.h
 *	  The launcher (launcher.c): what its probe asks, which a publisher
 *	  asks too, and how it starts a background worker, as a publisher
 *	  starts its reclaimer.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_LAUNCHER_H
#define OUTBOX_LAUNCHER_H

#include "postmaster/bgworker.h"

extern bool extension_installed_here(void);
extern BackgroundWorkerHandle *start_worker(const char *function_name, const char *type,
											const char *name, Datum main_arg, uint32 extra);
extern bool worker_gone(BackgroundWorkerHandle *handle);

#endif							/* OUTBOX_LAUNCHER_H */

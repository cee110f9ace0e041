/*-------------------------------------------------------------------------
 *
 * launcher.h
 *	  The launcher (launcher.c): what its probe asks, which a publisher
 *	  asks too.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_LAUNCHER_H
#define OUTBOX_LAUNCHER_H

extern bool extension_installed_here(void);

#endif							/* OUTBOX_LAUNCHER_H */

/*-------------------------------------------------------------------------
 *
 * worker_session.h
 *	  The settings of a worker's session that no database or role setting
 *	  may change (worker_session.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_WORKER_SESSION_H
#define OUTBOX_WORKER_SESSION_H

extern void worker_pin_session_settings(void);

#endif							/* OUTBOX_WORKER_SESSION_H */

/*-------------------------------------------------------------------------
 *
 * enqueue.h
 *	  The application's side of the outbox: enqueue, checks, commit wake.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_ENQUEUE_H
#define OUTBOX_ENQUEUE_H

extern void enqueue_init(void);

#endif							/* OUTBOX_ENQUEUE_H */

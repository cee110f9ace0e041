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
extern void check_kafka_topic(const char *what, text *topic);

#endif							/* OUTBOX_ENQUEUE_H */

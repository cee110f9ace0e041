/*-------------------------------------------------------------------------
 *
 * enqueue.h
 *	  The application's side of the outbox: enqueue, checks, commit wake.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_ENQUEUE_H
#define OUTBOX_ENQUEUE_H

#include "row_writer.h"

extern void enqueue_init(void);
extern void check_kafka_topic(const char *what, text *topic);
extern int64 enqueue_message(Oid namespace, NewMessage *message);

#endif							/* OUTBOX_ENQUEUE_H */

/*-------------------------------------------------------------------------
 *
 * inbox_consumer.h
 *	  The inbox worker's side of a subscription's consumer: a Kafka process
 *	  (outbox_kafka, as a consumer) that reads the subscription's topics
 *	  from the offsets the worker gives it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_INBOX_CONSUMER_H
#define OUTBOX_INBOX_CONSUMER_H

#include "inbox.h"

typedef struct InboxConsumer InboxConsumer;

extern InboxConsumer *consumer_start(const InboxSubscription *s, List *positions,
									 char *errbuf, size_t errlen);
extern void consumer_stop(InboxConsumer *c);
extern bool consumer_alive(InboxConsumer *c);
extern bool consumer_settings_changed(InboxConsumer *c);
extern int	consumer_socket(InboxConsumer *c);
extern void consumer_fetch(InboxConsumer *c, int max_messages, int max_bytes);
extern void consumer_serve(InboxConsumer *c);
extern InboxBatch *consumer_take_batch(InboxConsumer *c);
extern List *consumer_take_assigned(InboxConsumer *c);
extern void consumer_convert_batch(InboxBatch *b);

#endif							/* OUTBOX_INBOX_CONSUMER_H */

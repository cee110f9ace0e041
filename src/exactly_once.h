/*-------------------------------------------------------------------------
 *
 * exactly_once.h
 *	  outbox.delivery = exactly_once, the publisher's side (exactly_once.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_EXACTLY_ONCE_H
#define OUTBOX_EXACTLY_ONCE_H

#include "message.h"
#include "producer.h"

extern bool exactly_once_wanted(void);
extern char *exactly_once_transactional_id(void);
extern bool exactly_once_start(OutboxProducer *producer, const char *transactional_id,
							   char *errbuf, size_t errlen);
extern char *exactly_once_progress_record(const OutboxMessage *messages, int count, int *len);
extern void exactly_once_note_recorded(int64 progress_offset);

#endif							/* OUTBOX_EXACTLY_ONCE_H */

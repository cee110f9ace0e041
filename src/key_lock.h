/*-------------------------------------------------------------------------
 *
 * key_lock.h
 *	  The locks that order concurrent enqueues of one (topic, key).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_KEY_LOCK_H
#define OUTBOX_KEY_LOCK_H

extern void key_lock_init(void);
extern void key_lock_acquire(text *topic, text *key);

#endif							/* OUTBOX_KEY_LOCK_H */

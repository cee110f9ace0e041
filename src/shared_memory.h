/*-------------------------------------------------------------------------
 *
 * shared_memory.h
 *	  Asking for the outbox's shared memory, from _PG_init
 *	  (shared_memory.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_SHARED_MEMORY_H
#define OUTBOX_SHARED_MEMORY_H

extern void shared_memory_init(void);

#endif							/* OUTBOX_SHARED_MEMORY_H */

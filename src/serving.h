/*-------------------------------------------------------------------------
 *
 * serving.h
 *	  Which databases are served: the backends' side of the launcher.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_SERVING_H
#define OUTBOX_SERVING_H

extern void serving_init(void);
extern void serving_announce_unserved(void);
extern void serving_warn_if_unserved(void);

#endif							/* OUTBOX_SERVING_H */

/*-------------------------------------------------------------------------
 *
 * standby_slots.h
 *	  outbox.synchronized_standby_slots: the publisher's wait for its
 *	  standbys before it publishes a batch.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_STANDBY_SLOTS_H
#define OUTBOX_STANDBY_SLOTS_H

#include "access/xlogdefs.h"

extern bool standby_wait_required(void);
extern bool standby_wait_for_flush(XLogRecPtr lsn);

#endif							/* OUTBOX_STANDBY_SLOTS_H */

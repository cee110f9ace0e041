/*-------------------------------------------------------------------------
 *
 * topic_grant.h
 *	  Topic grants: which roles may publish to, and subscribe to, which
 *	  topics (the table outbox_topic_grant), and the checks made of them.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_TOPIC_GRANT_H
#define OUTBOX_TOPIC_GRANT_H

#include "inbox.h"
#include "utils/array.h"

typedef enum TopicPrivilege
{
	TOPIC_PUBLISH,
	TOPIC_SUBSCRIBE
} TopicPrivilege;

extern bool topic_grant_allows(Oid role, const char *topic, TopicPrivilege privilege);
extern void topic_grant_check_publish(const text *topic);
extern void topic_grant_check_subscribe(Oid role, ArrayType *topics);
extern void topic_grant_check_subscription(const InboxSubscription *s);

#endif							/* OUTBOX_TOPIC_GRANT_H */

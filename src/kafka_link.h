/*-------------------------------------------------------------------------
 *
 * kafka_link.h
 *	  A worker's link to a Kafka process (outbox_kafka) of its own:
 *	  starting it with its configuration, framing, reading and dispatching
 *	  its frames, stopping and reaping it.  What the frames mean beyond
 *	  READY, FAILED and LOG is the user's (producer.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_KAFKA_LINK_H
#define OUTBOX_KAFKA_LINK_H

#include "lib/stringinfo.h"
#include "nodes/pg_list.h"

#include "kafka_wire.h"

typedef struct KafkaLink KafkaLink;

/*
 * Called for each frame the link does not handle itself (it handles READY,
 * FAILED and LOG), r reading its body.  May be called inside
 * kafka_link_start(), before it has returned the link.
 */
typedef void (*KafkaLinkFrameHandler) (void *arg, KafkaLink *link, uint8 type, WireReader *r);

/*
 * Called once when the process is gone or has to go, after its socket is
 * closed and before it is reaped: whatever it had in hand is lost.
 */
typedef void (*KafkaLinkGoneHandler) (void *arg);

extern List *kafka_link_properties(const char *const defaults[][2], int ndefaults,
								   const char *const enforced[][2], int nenforced);
extern void kafka_link_append_property(List **properties, const char *name, const char *value);
extern KafkaLink *kafka_link_start(const char *what, WireFrameType configure_type,
								   List *properties,
								   KafkaLinkFrameHandler on_frame,
								   KafkaLinkGoneHandler on_gone, void *arg,
								   char *errbuf, size_t errlen);
extern void kafka_link_stop(KafkaLink *link);
extern bool kafka_link_alive(KafkaLink *link);
extern pgsocket kafka_link_socket(KafkaLink *link);
extern bool kafka_link_settings_changed(KafkaLink *link);
extern char *kafka_link_scrubbed(KafkaLink *link, const char *text, int32 len);
extern void kafka_link_send(KafkaLink *link, StringInfo frame);
extern void kafka_link_read_available(KafkaLink *link);
extern int	kafka_link_wait(KafkaLink *link, int events, long timeout_ms);

/*
 * Frames: a length, a type and a body, built in a StringInfo from
 * kafka_link_begin_frame() on; kafka_link_send() fills in the length.
 */
static inline void
kafka_link_begin_frame(StringInfo frame, WireFrameType type)
{
	uint32		len = 0;
	uint8		t = type;

	resetStringInfo(frame);
	appendBinaryStringInfo(frame, (char *) &len, sizeof(len));
	appendBinaryStringInfo(frame, (char *) &t, sizeof(t));
}

static inline void
kafka_link_put_u8(StringInfo frame, uint8 v)
{
	appendBinaryStringInfo(frame, (char *) &v, sizeof(v));
}

static inline void
kafka_link_put_u32(StringInfo frame, uint32 v)
{
	appendBinaryStringInfo(frame, (char *) &v, sizeof(v));
}

static inline void
kafka_link_put_i32(StringInfo frame, int32 v)
{
	appendBinaryStringInfo(frame, (char *) &v, sizeof(v));
}

static inline void
kafka_link_put_i64(StringInfo frame, int64 v)
{
	appendBinaryStringInfo(frame, (char *) &v, sizeof(v));
}

static inline void
kafka_link_put_bytes(StringInfo frame, const char *s, int32 len)
{
	appendBinaryStringInfo(frame, (char *) &len, sizeof(len));
	if (len > 0)
		appendBinaryStringInfo(frame, s, len);
}

static inline void
kafka_link_put_string(StringInfo frame, const char *s)
{
	kafka_link_put_bytes(frame, s, s ? (int32) strlen(s) : -1);
}

#endif							/* OUTBOX_KAFKA_LINK_H */

/*-------------------------------------------------------------------------
 *
 * inbox_consumer.c
 *	  The inbox worker's side of a subscription's consumer: a Kafka process
 *	  of its own (outbox_kafka, its first frame CONFIGURE_CONSUMER, see
 *	  kafka_wire.h), over the link kafka_link.c keeps.
 *
 * It is told to read the subscription's topics from the offsets recorded
 * in inbox_offset (from its start rule where none is), once, after it
 * started.  It joins no consumer group and commits nothing to Kafka: the
 * offsets are the database's, committed with the messages' effects.  The
 * worker then asks for one batch at a time (FETCH); the process answers
 * once it has a message, and librdkafka fetches ahead meanwhile, so the next
 * batch is there while this one is applied.
 *
 * A message's key, header names and header values are text for the
 * handler: bytes that are not UTF-8 are given as their hex, "\x...".  In
 * a database of another encoding, they are converted to it in the batch's
 * transaction (consumer_convert_batch()); text it cannot hold is given as
 * the hex of its UTF-8 bytes, the same way.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "common/string.h"
#include "mb/pg_wchar.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "inbox_consumer.h"
#include "message.h"
#include "kafka_link.h"
#include "worker_slot.h"

/*
 * Librdkafka's defaults that the consumers change.  A broker answers a
 * fetch as soon as a message comes, whatever fetch.wait.max.ms says; but a
 * partition assigned while a fetch waits is read only from the next one,
 * 500 ms later by default.
 */
static const char *const default_properties[][2] = {
	{"client.id", "postgresql-outbox-inbox"},
	{"reconnect.backoff.max.ms", "1000"},
	{"fetch.wait.max.ms", "100"},
};

struct InboxConsumer
{
	KafkaLink  *link;
	const InboxSubscription *subscription;
	MemoryContext context;		/* the consumer, its batch and its list */
	bool		fetch_outstanding;
	InboxBatch *batch;			/* the answer to the last FETCH, not yet taken */
	List	   *assigned;		/* PartitionPositions ASSIGNED, not yet taken */
	bool		gone;

	/*
	 * The worker_error_mark() of the last error shown about reading, 0 for
	 * none, and the topic it was about (NULL: any).  Cleared once the topic
	 * (or, for an error about none, any topic) is assigned partitions, or
	 * a message of it is read: what kept it from being read is mended.
	 */
	uint64		read_error_mark;
	char	   *read_error_topic;
};

/* The consumer reads the topic: clear the error about it, or about none. */
static void
reading_mended(InboxConsumer *c, const char *topic)
{
	if (c->read_error_mark == 0 ||
		(c->read_error_topic && strcmp(c->read_error_topic, topic) != 0))
		return;
	worker_clear_error(c->read_error_mark);
	c->read_error_mark = 0;
}

/* Note the error just shown about reading the topic (NULL: about none). */
static void
reading_failed(InboxConsumer *c, const char *topic)
{
	c->read_error_mark = worker_error_mark();
	c->read_error_topic = topic ? MemoryContextStrdup(c->context, topic) : NULL;
}

/* Bytes as their hex: "\\x" and two digits a byte. */
static char *
hex_text(const char *bytes, int32 len)
{
	StringInfoData hex;

	initStringInfo(&hex);
	appendStringInfoString(&hex, "\\x");
	for (int i = 0; i < len; i++)
		appendStringInfo(&hex, "%02x", (unsigned char) bytes[i]);
	return hex.data;
}

/*
 * Bytes from Kafka as text: as they are if they are UTF-8 (converted later,
 * in a transaction, if the database has another encoding), else their hex;
 * see the header comment.
 */
static char *
kafka_text(const char *bytes, int32 len)
{
	if (pg_verify_mbstr(PG_UTF8, bytes, len, true))
		return pnstrdup(bytes, len);
	return hex_text(bytes, len);
}

/*
 * UTF-8 text in the database's encoding, by the conversion proc; the hex of
 * its bytes if there is no conversion, or the encoding cannot hold it.
 */
static char *
server_text(Oid proc, char *utf8)
{
	int			len;
	int			size;
	char	   *converted;

	if (utf8 == NULL || pg_is_ascii(utf8))
		return utf8;			/* every server encoding holds ASCII as it is */
	len = strlen(utf8);
	if (!OidIsValid(proc))
		return hex_text(utf8, len);
	size = len * MAX_CONVERSION_GROWTH + 1;
	converted = palloc(size);
	if (pg_do_encoding_conversion_buf(proc, PG_UTF8, GetDatabaseEncoding(),
									  (unsigned char *) utf8, len,
									  (unsigned char *) converted, size, true) < len)
		return hex_text(utf8, len);
	return converted;
}

/*
 * Convert the keys, header names and header values of a batch, UTF-8 as
 * they came, to the database's encoding, once.  In a transaction: the
 * conversion is looked up in the catalog.  A database of encoding SQL_ASCII
 * takes them as they are, as it takes a client's text.
 */
void
consumer_convert_batch(InboxBatch *b)
{
	MemoryContext caller;
	Oid			proc;

	if (!b->texts_in_utf8)
		return;
	caller = MemoryContextSwitchTo(b->context);
	proc = FindDefaultConversionProc(PG_UTF8, GetDatabaseEncoding());
	for (int i = 0; i < b->count; i++)
	{
		InboxMessage *m = &b->messages[i];

		m->key = server_text(proc, m->key);
		for (int h = 0; h < m->header_count; h++)
		{
			m->header_names[h] = server_text(proc, m->header_names[h]);
			m->header_values[h] = server_text(proc, m->header_values[h]);
		}
	}
	b->texts_in_utf8 = false;
	MemoryContextSwitchTo(caller);
}

/* A canonical UUID (8-4-4-4-12 hex digits), as the outbox writes one; false if not. */
static bool
parse_message_id(const char *s, pg_uuid_t *uuid)
{
	int			digit = 0;

	if (strlen(s) != 36)
		return false;
	for (int i = 0; i < 36; i++)
	{
		int			v;

		if (i == 8 || i == 13 || i == 18 || i == 23)
		{
			if (s[i] != '-')
				return false;
			continue;
		}
		if (s[i] >= '0' && s[i] <= '9')
			v = s[i] - '0';
		else if (s[i] >= 'a' && s[i] <= 'f')
			v = s[i] - 'a' + 10;
		else if (s[i] >= 'A' && s[i] <= 'F')
			v = s[i] - 'A' + 10;
		else
			return false;
		if (digit % 2 == 0)
			uuid->data[digit / 2] = v << 4;
		else
			uuid->data[digit / 2] |= v;
		digit++;
	}
	return true;
}

static char *
read_topic(WireReader *r)
{
	int32		len;
	const char *s = wire_string(r, &len);

	return s ? pnstrdup(s, len) : pstrdup("");
}

static void
read_headers(WireReader *r, InboxMessage *m)
{
	m->header_count = wire_u32(r);
	if (r->failed)
		m->header_count = 0;
	m->header_names = palloc(sizeof(char *) * Max(m->header_count, 1));
	m->header_values = palloc(sizeof(char *) * Max(m->header_count, 1));
	for (int i = 0; i < m->header_count; i++)
	{
		int32		len;
		const char *name = wire_string(r, &len);
		const char *value;

		m->header_names[i] = name ? kafka_text(name, len) : pstrdup("");
		value = wire_string(r, &len);
		m->header_values[i] = value ? kafka_text(value, len) : NULL;
		if (m->header_values[i] && strcmp(m->header_names[i], MESSAGE_ID_HEADER) == 0)
			m->has_message_id = parse_message_id(m->header_values[i], &m->message_id);
	}
}

/*
 * A message's topic: the previous message's, if it is the same (a batch
 * holds a few topics, most often one), so that the batch keeps one copy of
 * each and the worker can tell them apart by pointer.
 */
static char *
read_message_topic(WireReader *r, const InboxMessage *previous)
{
	int32		len;
	const char *s = wire_string(r, &len);

	if (s == NULL)
		return pstrdup("");
	if (previous && strlen(previous->topic) == (size_t) len && memcmp(previous->topic, s, len) == 0)
		return previous->topic;
	return pnstrdup(s, len);
}

static void
read_message(WireReader *r, InboxMessage *m, const InboxMessage *previous)
{
	int32		len;
	const char *bytes;

	memset(m, 0, sizeof(*m));
	m->topic = read_message_topic(r, previous);
	m->partition = wire_i32(r);
	m->offset = wire_i64(r);
	m->timestamp_ms = wire_i64(r);
	bytes = wire_string(r, &len);
	m->key = bytes ? kafka_text(bytes, len) : NULL;
	bytes = wire_string(r, &m->value_len);
	m->value = bytes ? pnstrdup(bytes, m->value_len) : NULL;
	if (bytes == NULL)
		m->value_len = -1;
	read_headers(r, m);
}

/* A MESSAGES frame, into a batch of its own memory context. */
static void
handle_messages(InboxConsumer *c, WireReader *r)
{
	MemoryContext context = AllocSetContextCreate(c->context, "inbox batch",
												  ALLOCSET_DEFAULT_SIZES);
	MemoryContext caller = MemoryContextSwitchTo(context);
	InboxBatch *b = palloc0(sizeof(InboxBatch));

	b->context = context;
	b->texts_in_utf8 = GetDatabaseEncoding() != PG_UTF8 && GetDatabaseEncoding() != PG_SQL_ASCII;
	b->count = wire_u32(r);
	b->messages = palloc(sizeof(InboxMessage) * Max(b->count, 1));
	for (int i = 0; i < b->count && !r->failed; i++)
		read_message(r, &b->messages[i], i > 0 ? &b->messages[i - 1] : NULL);
	b->watermark_count = wire_u32(r);
	b->watermarks = palloc(sizeof(PartitionWatermark) * Max(b->watermark_count, 1));
	for (int i = 0; i < b->watermark_count && !r->failed; i++)
	{
		b->watermarks[i].topic = read_topic(r);
		b->watermarks[i].partition = wire_i32(r);
		b->watermarks[i].high_watermark = wire_i64(r);
	}
	MemoryContextSwitchTo(caller);
	c->fetch_outstanding = false;
	if (r->failed)
	{
		worker_report_error(LOG, "subscription \"%s\": a malformed batch from its Kafka process",
						   c->subscription->name);
		MemoryContextDelete(context);
		c->gone = true;
		return;
	}
	c->batch = b;
	for (int i = 0; i < b->count; i++)
		reading_mended(c, b->messages[i].topic);
}

static void
handle_assigned(InboxConsumer *c, WireReader *r)
{
	MemoryContext caller = MemoryContextSwitchTo(c->context);
	uint32		count = wire_u32(r);

	for (uint32 i = 0; i < count && !r->failed; i++)
	{
		PartitionPosition *p = palloc(sizeof(PartitionPosition));

		p->topic = read_topic(r);
		p->partition = wire_i32(r);
		p->next_offset = wire_i64(r);
		p->high_watermark = wire_i64(r);
		c->assigned = lappend(c->assigned, p);
		if (!r->failed)
			reading_mended(c, p->topic);
	}
	MemoryContextSwitchTo(caller);
}

static void
handle_consume_error(InboxConsumer *c, WireReader *r)
{
	char	   *topic = read_topic(r);
	int32		partition = wire_i32(r);
	int32		error = wire_i32(r);
	int32		len;
	const char *reason = wire_string(r, &len);

	if (partition < 0)
		worker_report_error(LOG, "subscription \"%s\" cannot read topic \"%s\" for now: %s (%d)",
						   c->subscription->name, topic,
						   kafka_link_scrubbed(c->link, reason, len), error);
	else
		worker_report_error(LOG, "subscription \"%s\" cannot read topic \"%s\" partition %d for now: %s (%d)",
						   c->subscription->name, topic, partition,
						   kafka_link_scrubbed(c->link, reason, len), error);
	reading_failed(c, topic);
}

static void
handle_frame(void *arg, KafkaLink *link, uint8 type, WireReader *r)
{
	InboxConsumer *c = arg;
	int32		len;
	int32		error;
	const char *reason;

	switch (type)
	{
		case WIRE_MESSAGES:
			handle_messages(c, r);
			break;
		case WIRE_ASSIGNED:
			handle_assigned(c, r);
			break;
		case WIRE_CONSUME_ERROR:
			handle_consume_error(c, r);
			break;
		case WIRE_ERROR:
			error = wire_i32(r);
			reason = wire_string(r, &len);
			worker_report_error(LOG, "subscription \"%s\": Kafka: %s (%d)", c->subscription->name,
							   kafka_link_scrubbed(link, reason, len), error);
			reading_failed(c, NULL);
			break;
		default:
			elog(LOG, "outbox inbox: unknown frame type %d from a Kafka process", type);
			break;
	}
}

static void
handle_gone(void *arg)
{
	InboxConsumer *c = arg;

	c->gone = true;
}

/* Read the subscription's topics: each partition from its position, else from the start rule. */
static void
send_assign(InboxConsumer *c, List *positions)
{
	const InboxSubscription *s = c->subscription;
	StringInfoData frame;
	ListCell   *lc;

	initStringInfo(&frame);
	kafka_link_begin_frame(&frame, WIRE_ASSIGN);
	kafka_link_put_i64(&frame, s->from_earliest ? WIRE_START_EARLIEST : unix_epoch_ms(s->created_at));
	kafka_link_put_u32(&frame, s->topic_count);
	for (int i = 0; i < s->topic_count; i++)
		kafka_link_put_string(&frame, s->topics[i]);
	kafka_link_put_u32(&frame, list_length(positions));
	foreach(lc, positions)
	{
		PartitionPosition *p = lfirst(lc);

		kafka_link_put_string(&frame, p->topic);
		kafka_link_put_i32(&frame, p->partition);
		kafka_link_put_i64(&frame, p->next_offset);
	}
	kafka_link_send(c->link, &frame);
	pfree(frame.data);
}

/*
 * Start a consumer for the subscription, reading from these positions.  On
 * failure returns NULL with the reason in errbuf.
 */
InboxConsumer *
consumer_start(const InboxSubscription *s, List *positions, char *errbuf, size_t errlen)
{
	MemoryContext context = AllocSetContextCreate(TopMemoryContext, "inbox consumer",
												  ALLOCSET_DEFAULT_SIZES);
	InboxConsumer *c = MemoryContextAllocZero(context, sizeof(InboxConsumer));
	List	   *properties = kafka_link_properties(default_properties, lengthof(default_properties),
												   NULL, 0);

	c->context = context;
	c->subscription = s;
	c->link = kafka_link_start("the Kafka process of an inbox subscription",
							   WIRE_CONFIGURE_CONSUMER, properties, handle_frame, handle_gone, c,
							   errbuf, errlen);
	if (c->link == NULL)
	{
		MemoryContextDelete(context);
		return NULL;
	}
	send_assign(c, positions);
	return c;
}

/* Stop the consumer's Kafka process; what it read past the recorded offsets is read again. */
void
consumer_stop(InboxConsumer *c)
{
	kafka_link_stop(c->link);
	MemoryContextDelete(c->context);
}

bool
consumer_alive(InboxConsumer *c)
{
	return !c->gone && kafka_link_alive(c->link);
}

bool
consumer_settings_changed(InboxConsumer *c)
{
	return kafka_link_settings_changed(c->link);
}

int
consumer_socket(InboxConsumer *c)
{
	return kafka_link_socket(c->link);
}

/* Ask for the next batch, unless one is asked for or not yet taken. */
void
consumer_fetch(InboxConsumer *c, int max_messages, int max_bytes)
{
	StringInfoData frame;

	if (c->fetch_outstanding || c->batch != NULL || !consumer_alive(c))
		return;
	initStringInfo(&frame);
	kafka_link_begin_frame(&frame, WIRE_FETCH);
	kafka_link_put_u32(&frame, max_messages);
	kafka_link_put_u32(&frame, max_bytes);
	kafka_link_send(c->link, &frame);
	pfree(frame.data);
	c->fetch_outstanding = true;
}

/* Read what the Kafka process sent, without waiting. */
void
consumer_serve(InboxConsumer *c)
{
	if (consumer_alive(c))
		kafka_link_read_available(c->link);
}

/* The batch that came, if one did; the caller deletes its context. */
InboxBatch *
consumer_take_batch(InboxConsumer *c)
{
	InboxBatch *b = c->batch;

	c->batch = NULL;
	if (b)
		MemoryContextSetParent(b->context, CurrentMemoryContext);
	return b;
}

/* The partitions assigned since the last call, in the caller's memory context. */
List *
consumer_take_assigned(InboxConsumer *c)
{
	List	   *assigned = NIL;
	ListCell   *lc;

	foreach(lc, c->assigned)
	{
		PartitionPosition *p = palloc(sizeof(PartitionPosition));

		*p = *(PartitionPosition *) lfirst(lc);
		p->topic = pstrdup(p->topic);
		assigned = lappend(assigned, p);
	}
	list_free_deep(c->assigned);
	c->assigned = NIL;
	return assigned;
}

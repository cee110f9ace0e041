/*-------------------------------------------------------------------------
 *
 * kafka_process.h
 *	  What the two modes of outbox_kafka (kafka_produce.c, kafka_consume.c)
 *	  share, from kafka_process.c: the buffer of frames to the worker, the
 *	  frames read from it, the wake pipe, librdkafka's logs and errors.
 *
 * Plain C: the Kafka process links librdkafka and libc only.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_KAFKA_PROCESS_H
#define OUTBOX_KAFKA_PROCESS_H

#include <librdkafka/rdkafka.h>

#include "kafka_wire.h"

/* The number of elements of an array (as PostgreSQL's c.h has it). */
#define lengthof(array) (sizeof(array) / sizeof((array)[0]))

/* How long to wait for the worker when nothing is outstanding. */
#define IDLE_WAIT_MS 1000

/* A growing byte buffer. */
typedef struct Buffer
{
	char	   *data;
	size_t		len;
	size_t		cap;
} Buffer;

/* Takes one whole frame of the worker's, after the first, r reading its body. */
typedef void (*FrameTaker) (WireReader *r);

/* A frame type a mode serves, and what takes it. */
typedef struct ModeFrame
{
	WireFrameType type;
	FrameTaker	take;
} ModeFrame;

extern Buffer to_worker;		/* frames not yet written to the socket */
extern int	wake_fds[2];		/* librdkafka writes to [1] when a queue fills */

extern void die(const char *what) __attribute__((noreturn));
extern int64_t now_ms(void);

extern void buffer_append(Buffer *b, const void *bytes, size_t len);
extern void put(const void *bytes, size_t len);
extern void put_u32(uint32_t v);
extern void put_i32(int32_t v);
extern void put_i64(int64_t v);
extern void put_string(const char *s);
extern void put_bytes(const void *bytes, size_t len);
extern size_t begin_frame(WireFrameType type);
extern void end_frame(size_t start);
extern void report_text(WireFrameType type, int32_t code, const char *facility,
						const char *text);

extern char *take_cstring(WireReader *r);
extern bool set_properties(rd_kafka_conf_t *conf, WireReader *r, const char *what,
						   char *reason, size_t reason_len);
extern void set_property(rd_kafka_conf_t *conf, const char *name, const char *value);
extern void set_callbacks(rd_kafka_conf_t *conf);

extern void write_to_worker(void);
extern bool read_from_worker(Buffer *in, const ModeFrame *frames, size_t frame_count);
extern void wait_for_work(int timeout_ms);

/*
 * The modes: configure_*() makes the client from the first frame's
 * properties, or says why not; serve_*() serves the worker until it closes
 * the socket, frees the client and returns the exit status.
 */
extern bool configure_producer(WireReader *r, char *reason, size_t reason_len);
extern int	serve_producer(void);
extern void producer_note_produced(void);
extern bool configure_consumer(WireReader *r, char *reason, size_t reason_len);
extern int	serve_consumer(void);

/*
 * The producer mode's transactions (kafka_transaction.c), for a producer
 * made with a transactional.id.
 */
extern void transaction_configure(rd_kafka_conf_t *conf);
extern bool transaction_begin(rd_kafka_t *rk);
extern bool transaction_note_delivery(const rd_kafka_message_t *m);
extern void transaction_recover(rd_kafka_t *rk, WireReader *r);
extern void transaction_progress(rd_kafka_t *rk, WireReader *r);
extern void transaction_end(rd_kafka_t **rkp, WireReader *r);
extern bool transaction_make_twin(char *reason, size_t reason_len);
extern void transaction_poll_twin(void);
extern void wake_on_queue(rd_kafka_t *handle);
extern void transaction_close(rd_kafka_t *rk);

#endif							/* OUTBOX_KAFKA_PROCESS_H */

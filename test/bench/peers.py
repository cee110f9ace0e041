#!/usr/bin/python3
# The hand-written peers the outbox extension is measured against: two
# pollers, each publishing from a table of its own (test/bench/schema.sql) to
# Kafka, and a consumer that applies Kafka's messages to a database, the
# inbox's peer (B8, B9):
#
#   peers.py seed  --dsn DSN --brokers B     # seed_message, as seed article 000 writes it
#   peers.py tuned --dsn DSN --brokers B     # tuned_message, as a good engineer would
#   peers.py consume --dsn DSN --brokers B --topic T --table APPLIED --processed IDS --group G
#                                            # the seeds' consumer, written well
#
# Prints "ready" once connected (the consumer: once its group has assigned
# it the topics' partitions), runs until SIGTERM, finishes the message or
# batch in hand, and prints one JSON line: {"sent": N, "failed": N} (the
# consumer: {"applied": N, "duplicates": N, "failed": N}, failed being the
# messages without a message id).
# /usr/bin/python3 on purpose: Debian's python3-psycopg2 and python3-confluent-kafka.
import argparse
import json
import signal
import time

import uuid

import psycopg2
import psycopg2.extras
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

stopping = False


def stop(signum, frame):
    global stopping
    stopping = True


def ready():
    """Tell bench.py that the connection and the producer are up."""
    print("ready", flush=True)


def sleep_unless_stopped(seconds):
    end = time.monotonic() + seconds
    while not stopping and time.monotonic() < end:
        time.sleep(min(0.1, end - time.monotonic()))


# The seed poller: LocalMessagePoller.pollAndSend() of seed article 000.
# @Scheduled(fixedDelay = 3000) runs it 3 s after the previous run ended; a
# run takes batches of 100 until none is left; each message is sent
# synchronously and flipped to SENT (or rescheduled with backoff 2^n x 10 s)
# by a statement of its own, as the article's mapper calls are.
SEED_INTERVAL = 3.0
SEED_BATCH = 100
SEED_SELECT = """
    SELECT id, topic, key, payload, retry_count FROM seed_message
     WHERE status = 'PENDING' AND (next_retry_time IS NULL OR next_retry_time <= now())
     ORDER BY id LIMIT %s"""
SEED_SENT = "UPDATE seed_message SET status = 'SENT', update_time = now() WHERE id = %s"
SEED_RETRY = """
    UPDATE seed_message
       SET retry_count = %(n)s, error_msg = %(error)s, update_time = now(),
           status = CASE WHEN %(n)s > max_retry THEN 'FAILED' ELSE status END,
           next_retry_time = now() + least(power(2, %(n)s) * 10, 3600) * interval '1 second'
     WHERE id = %(id)s"""


def seed(args, counts):
    conn = psycopg2.connect(args.dsn, application_name="peers.py " + args.kind)
    conn.autocommit = True
    cur = conn.cursor()
    # syncSend() of the payload: one message in flight, nothing held back to batch.
    producer = Producer({"bootstrap.servers": args.brokers, "acks": "all", "linger.ms": 0})
    ready()
    while not stopping:
        while not stopping:
            cur.execute(SEED_SELECT, (SEED_BATCH,))
            rows = cur.fetchall()
            if not rows:
                break
            for id_, topic, key, payload, retry_count in rows:
                if stopping:
                    break
                outcome = []
                producer.produce(topic, payload, key, on_delivery=lambda err, msg: outcome.append(err))
                producer.flush()
                if outcome == [None]:
                    cur.execute(SEED_SENT, (id_,))
                    counts["sent"] += 1
                else:
                    cur.execute(SEED_RETRY, {"n": retry_count + 1, "error": str(outcome), "id": id_})
                    counts["failed"] += 1
        sleep_unless_stopped(SEED_INTERVAL)


# The tuned poller: claim 1,000 rows in id order with SKIP LOCKED (so two
# pollers could share the table), produce them all asynchronously through an
# idempotent producer that batches, wait for every ack, and delete the acked
# rows in the claiming transaction.  Failed rows stay and are claimed again.
# While a claim finds rows it claims again at once; when idle it sleeps 5 ms,
# not LISTEN/NOTIFY: NOTIFY takes a database-wide lock at commit that
# serializes every committing transaction that notifies, which would cap the
# rate at which the application can enqueue.
TUNED_BATCH = 1000
TUNED_IDLE_SLEEP = 0.005
TUNED_CLAIM = """
    SELECT id, message_id::text, topic, key, payload FROM tuned_message
     ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"""
TUNED_DELETE = "DELETE FROM tuned_message WHERE id = ANY(%s)"


def tuned(args, counts):
    conn = psycopg2.connect(args.dsn, application_name="peers.py " + args.kind)
    cur = conn.cursor()
    producer = Producer({"bootstrap.servers": args.brokers, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5})
    ready()
    while not stopping:
        cur.execute(TUNED_CLAIM, (TUNED_BATCH,))
        rows = cur.fetchall()
        if not rows:
            conn.commit()
            time.sleep(TUNED_IDLE_SLEEP)
            continue
        acked = []
        for id_, message_id, topic, key, payload in rows:
            producer.produce(topic, payload, key, headers=[("message-id", message_id)],
                             on_delivery=lambda err, msg, id_=id_: err is None and acked.append(id_))
        producer.flush()
        cur.execute(TUNED_DELETE, (acked,))
        conn.commit()
        counts["sent"] += len(acked)
        counts["failed"] += len(rows) - len(acked)


# The consumer: the consuming side of the seed articles' local message table
# (000's CrmSyncConsumer, 002's step 6, 004's InventoryConsumer), written
# well.  The articles check a processed-id record before applying each
# message, apply it and record its id in the service's own transaction, and
# let the broker's offset move on once that committed.  Here the same steps,
# a batch at a time: wait for one message, take what else librdkafka holds
# already, up to CONSUME_BATCH (consume(num_messages=N) with no wait, so a
# slow trickle is not held back to fill a batch); look the batch's ids up in
# the processed-id table in one query; insert the new messages' rows
# (execute_values) and their ids; commit; then commit the batch's offsets to
# Kafka synchronously.  A crash between the two commits redelivers the batch,
# and the id check skips it.  Its own consumer group, auto commit off, from
# the topics' earliest offsets when the group has none.  The message id is a
# record header (the outbox's worker writes outbox-message-id; the tuned
# poller message-id).
CONSUME_BATCH = 10_000
CONSUME_WAIT = 0.1            # seconds a consume() waits for a first message (and for SIGTERM)
CONSUME_CHECK = "SELECT message_id::text FROM {processed} WHERE message_id = ANY(%s::uuid[])"
CONSUME_APPLY = "INSERT INTO {table} (message_id, key, payload) VALUES %s"
CONSUME_RECORD = "INSERT INTO {processed} (message_id) VALUES %s"


def consume(args, counts):
    conn = psycopg2.connect(args.dsn, application_name="peers.py " + args.kind)
    cur = conn.cursor()
    consumer = Consumer({"bootstrap.servers": args.brokers, "group.id": args.group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    assigned = []
    consumer.subscribe(args.topic, on_assign=lambda c, partitions: assigned.append(partitions))
    pending = []
    while not assigned and not stopping:
        pending += consumer.consume(args.batch, CONSUME_WAIT)
    ready()
    check = CONSUME_CHECK.format(processed=args.processed)
    apply = CONSUME_APPLY.format(table=args.table)
    record = CONSUME_RECORD.format(processed=args.processed)
    while not stopping or pending:
        batch, pending = pending or consumer.consume(1, CONSUME_WAIT), []
        if not batch:
            continue
        if len(batch) < args.batch:
            batch += consumer.consume(args.batch - len(batch), 0)
        rows, ends = {}, {}
        for msg in batch:
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(msg.error())
            ends[(msg.topic(), msg.partition())] = msg.offset() + 1
            message_id = next((value for name, value in msg.headers() or () if name == args.id_header), None)
            try:
                message_id = str(uuid.UUID(message_id.decode()))
            except (AttributeError, ValueError):
                counts["failed"] += 1
                continue
            if message_id in rows:
                counts["duplicates"] += 1
                continue
            rows[message_id] = (msg.key().decode() if msg.key() is not None else None, msg.value().decode())
        if rows:
            cur.execute(check, (list(rows),))
            for done, in cur.fetchall():
                del rows[done]
                counts["duplicates"] += 1
        if rows:
            psycopg2.extras.execute_values(cur, apply, [(m, k, v) for m, (k, v) in rows.items()],
                                           template="(%s::uuid, %s, %s::jsonb)", page_size=len(rows))
            psycopg2.extras.execute_values(cur, record, [(m,) for m in rows], template="(%s::uuid)",
                                           page_size=len(rows))
        conn.commit()
        if ends:
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in ends.items()],
                            asynchronous=False)
        counts["applied"] += len(rows)
    consumer.close()


def main():
    parser = argparse.ArgumentParser(description="hand-written outbox pollers and consumer")
    parser.add_argument("kind", choices=["seed", "tuned", "consume"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--brokers", required=True)
    consuming = parser.add_argument_group("consume")
    consuming.add_argument("--topic", action="append", help="a topic to read (repeat for more)")
    consuming.add_argument("--table", help="where each new message's row goes: (message_id, key, payload)")
    consuming.add_argument("--processed", help="the processed-id table: (message_id uuid primary key)")
    consuming.add_argument("--group", help="the Kafka consumer group")
    consuming.add_argument("--id-header", default="outbox-message-id",
                           help="the record header that holds the message id (a UUID)")
    consuming.add_argument("--batch", type=int, default=CONSUME_BATCH, help="messages per transaction, at most")
    args = parser.parse_args()
    if args.kind == "consume" and not (args.topic and args.table and args.processed and args.group):
        parser.error("consume needs --topic, --table, --processed and --group")
    signal.signal(signal.SIGTERM, stop)
    counts = {"applied": 0, "duplicates": 0, "failed": 0} if args.kind == "consume" else {"sent": 0, "failed": 0}
    {"seed": seed, "tuned": tuned, "consume": consume}[args.kind](args, counts)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()

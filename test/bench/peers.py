#!/usr/bin/python3
# The two hand-written pollers the outbox extension is measured against, each
# publishing from a table of its own (test/bench/schema.sql) to Kafka:
#
#   peers.py seed  --dsn DSN --brokers B     # seed_message, as seed article 000 writes it
#   peers.py tuned --dsn DSN --brokers B     # tuned_message, as a good engineer would
#
# Prints "ready" once connected, runs until SIGTERM, finishes the message or
# batch in hand, and prints one JSON line: {"sent": N, "failed": N}.
# /usr/bin/python3 on purpose: Debian's python3-psycopg2 and python3-confluent-kafka.
import argparse
import json
import signal
import time

import psycopg2
from confluent_kafka import Producer

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


def main():
    parser = argparse.ArgumentParser(description="hand-written outbox pollers")
    parser.add_argument("kind", choices=["seed", "tuned"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--brokers", required=True)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, stop)
    counts = {"sent": 0, "failed": 0}
    {"seed": seed, "tuned": tuned}[args.kind](args, counts)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()

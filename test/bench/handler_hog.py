#!/usr/bin/python3
# B11: what one subscription's slow handler costs another subscription of
# the same database, whose inbox worker applies both in turn.
#
# Subscription "peer" gets 20 messages a second, each enqueued in a
# transaction of its own; its handler records when it ran.  Its
# commit-to-applied latency (the enqueuing transaction's clock_timestamp()
# just before COMMIT, to the handler's) is measured twice in one run: with
# no other load, then while subscription "hog" gets 20 messages a second
# whose handler takes 200 ms each (four times what it can apply: its
# backlog only grows).  Printed: p50, p99, max of each phase, and the hog
# phase's p99 against the quiet one's, as a ratio and as the difference,
# which two of the hog's turns bound (each outbox.inbox_turn_time plus one
# 200 ms call: a message that comes during one turn is fetched after it).
#
#   handler_hog.py --dsn DSN --brokers B [--seconds 20]
#
# DSN's database gets the extension, both topics and subscriptions, and
# enqueues to itself; any cluster with outbox preloaded and a broker
# serves.  Exits non-zero when a message is missing, never because of
# speed.
import argparse
import sys
import threading
import time
import uuid

import psycopg2
from confluent_kafka.admin import AdminClient, NewTopic

RATE = 20            # messages a second, for each subscription
HOG_CALL_S = 0.2     # the hog's handler, per message
GRACE_S = 60         # for the last peer messages to be applied

SETUP = """
CREATE EXTENSION IF NOT EXISTS outbox;
DROP TABLE IF EXISTS hog_applied, peer_applied;
CREATE TABLE peer_applied (run text, committed_at timestamptz, applied_at timestamptz);
CREATE TABLE hog_applied (n bigint);
DO $$ BEGIN CREATE ROLE hog_bench; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
GRANT INSERT ON peer_applied, hog_applied TO hog_bench;
CREATE OR REPLACE FUNCTION bench_peer(m inbox_message) RETURNS void LANGUAGE sql AS $f$
    INSERT INTO peer_applied VALUES ((m).payload_jsonb ->> 'run',
                                     ((m).payload_jsonb ->> 'at')::timestamptz, clock_timestamp())
$f$;
CREATE OR REPLACE FUNCTION bench_hog(m inbox_message) RETURNS void LANGUAGE sql AS $f$
    SELECT pg_sleep(%(hog)s); INSERT INTO hog_applied VALUES (1)
$f$;
GRANT EXECUTE ON FUNCTION bench_peer(inbox_message), bench_hog(inbox_message) TO hog_bench;
"""


def progress(text):
    print(text, file=sys.stderr, flush=True)


def enqueue_loop(dsn, topic, run, seconds, stop_at=None):
    """RATE messages a second to topic for seconds, each in its own transaction."""
    conn = psycopg2.connect(dsn)
    cur = conn.cursor()
    began = time.monotonic()
    sent = 0
    while time.monotonic() - began < seconds and not (stop_at and stop_at.is_set()):
        cur.execute("SELECT outbox_enqueue(%s, jsonb_build_object('run', %s::text, 'at', clock_timestamp()),"
                    " 'k' || %s::text)", (topic, run, sent % 8))
        conn.commit()
        sent += 1
        time.sleep(max(0.0, began + sent / RATE - time.monotonic()))
    conn.close()
    return sent


def peer_phase(dsn, topic, run, seconds):
    sent = enqueue_loop(dsn, topic, run, seconds)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    deadline = time.monotonic() + GRACE_S
    while True:
        cur.execute("SELECT extract(epoch FROM applied_at - committed_at) * 1000 FROM peer_applied"
                    " WHERE run = %s ORDER BY 1", (run,))
        rows = [r[0] for r in cur.fetchall()]
        if len(rows) >= sent or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    conn.close()
    if len(rows) < sent:
        sys.exit(f"B11 {run}: {len(rows)} of {sent} peer messages applied within {GRACE_S} s")
    return {"n": len(rows), "p50": rows[len(rows) // 2], "p99": rows[int(len(rows) * 0.99)],
            "max": rows[-1]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--seconds", type=int, default=20)
    args = ap.parse_args()

    suffix = uuid.uuid4().hex[:8]
    peer_topic, hog_topic = f"bench.b11.peer.{suffix}", f"bench.b11.hog.{suffix}"
    admin = AdminClient({"bootstrap.servers": args.brokers})
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in (peer_topic, hog_topic)]).values():
        f.result()
    conn = psycopg2.connect(args.dsn)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute(SETUP % {"hog": HOG_CALL_S})
    cur.execute("SELECT current_setting('outbox.inbox_turn_time'), current_setting('outbox.inbox_handler_timeout'),"
                " (SELECT setting::int FROM pg_settings WHERE name = 'outbox.inbox_turn_time')")
    turn, timeout, turn_ms = cur.fetchone()
    bound_ms = 2 * (turn_ms + HOG_CALL_S * 1000)
    for name, topic, handler in (("b11_peer", peer_topic, "bench_peer"), ("b11_hog", hog_topic, "bench_hog")):
        cur.execute("SELECT inbox_unsubscribe(name, true) FROM inbox_subscription WHERE name = %s", (name,))
        cur.execute("SELECT outbox_grant_topic('hog_bench', %s, 'subscribe')", (topic,))
        cur.execute("SELECT inbox_subscribe(%s, ARRAY[%s], %s::regprocedure, run_as => 'hog_bench')",
                    (name, topic, f"{handler}(inbox_message)"))

    progress(f"B11: warming up ({peer_topic})")
    peer_phase(args.dsn, peer_topic, "warmup", 3)
    progress(f"B11: the peer alone, {args.seconds} s at {RATE} msg/s")
    quiet = peer_phase(args.dsn, peer_topic, "quiet", args.seconds)
    progress(f"B11: the peer while the hog's handler takes {HOG_CALL_S * 1000:.0f} ms a message")
    stop = threading.Event()
    hog = threading.Thread(target=enqueue_loop, args=(args.dsn, hog_topic, "hog", args.seconds + GRACE_S, stop))
    hog.start()
    time.sleep(2)        # the hog's backlog has begun
    try:
        hogged = peer_phase(args.dsn, peer_topic, "hogged", args.seconds)
    finally:
        stop.set()
        hog.join()
    cur.execute("SELECT count(*) FROM hog_applied")
    hog_applied = cur.fetchone()[0]
    for name in ("b11_hog", "b11_peer"):
        cur.execute("SELECT inbox_unsubscribe(%s, true)", (name,))
    conn.close()

    print(f"\nB11: another subscription's commit-to-applied latency while one handler hogs"
          f" (outbox.inbox_turn_time = {turn}, outbox.inbox_handler_timeout = {timeout})")
    print(f"{'phase':<28} {'messages':>9} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    for label, r in (("peer alone", quiet), (f"peer beside a {HOG_CALL_S * 1000:.0f} ms handler", hogged)):
        print(f"{label:<28} {r['n']:>9} {r['p50']:>9.1f} {r['p99']:>9.1f} {r['max']:>9.1f}")
    print(f"p99 hogged / alone: {hogged['p99'] / quiet['p99']:.2f}x;"
          f" hogged - alone: {hogged['p99'] - quiet['p99']:.0f} ms"
          f" (the bound: two of the hog's turns, each outbox.inbox_turn_time plus one call,"
          f" {bound_ms:.0f} ms here);"
          f" the hog applied {hog_applied} messages meanwhile")


if __name__ == "__main__":
    main()

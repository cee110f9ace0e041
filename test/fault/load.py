#!/usr/bin/python3
# Steady enqueue load for the fault tests: N sessions, each running small
# transactions at an even pace, one in ten rolled back.  A session that loses
# its connection (the server crashed or restarts) reconnects and goes on, so
# the load spans the fault.
#
#   load.py --dsn DSN --topic T [--topic T2 ...] [--clients 8] [--rate 200]
#           [--duration 30] [--keys 50] [--rollback 0.1] [--acknowledged FILE]
#
# Each transaction enqueues one message and, in the same transaction, copies
# its id, message_id and key into fault_log (which must exist).  So fault_log
# holds exactly the committed messages, whatever happened to the connection
# during COMMIT; the checker compares Kafka with it.  A server that fails
# over loses fault_log with the rest of what it lost: with --acknowledged,
# each message whose COMMIT returned to the application is also appended to
# FILE, as the line "message_id<TAB>topic<TAB>key", as soon as it returns.
# A DSN that lists several hosts, with target_session_attrs=read-write,
# follows a failover to the promoted standby.
#
# Prints one line at the end: "transactions N committed N rolled_back N errors N".
# /usr/bin/python3 on purpose: psycopg2 comes from Debian's python3-psycopg2.
import argparse
import json
import random
import threading
import time

import psycopg2

ENQUEUE = "SELECT outbox_enqueue(%s, %s::jsonb, %s)"
LOG = """
    INSERT INTO fault_log (id, message_id, topic, key)
    SELECT id, message_id, topic, key FROM outbox_message WHERE id = %s
    RETURNING message_id, topic, key
"""


def session(args, number, end, totals, lock, acknowledged):
    rng = random.Random(number)
    interval = args.clients / args.rate
    next_at = time.monotonic() + rng.random() * interval
    conn = None
    counts = {"transactions": 0, "committed": 0, "rolled_back": 0, "errors": 0}
    while time.monotonic() < end:
        time.sleep(max(0.0, next_at - time.monotonic()))
        next_at += interval
        try:
            if conn is None:
                conn = psycopg2.connect(args.dsn)
            topic = rng.choice(args.topic)
            key = "key-%d" % rng.randint(1, args.keys)
            payload = json.dumps({"session": number, "n": counts["transactions"]})
            with conn.cursor() as cur:
                cur.execute(ENQUEUE, (topic, payload, key))
                cur.execute(LOG, cur.fetchone())
                logged = cur.fetchone()
            counts["transactions"] += 1
            if rng.random() < args.rollback:
                conn.rollback()
                counts["rolled_back"] += 1
            else:
                conn.commit()
                counts["committed"] += 1
                if acknowledged is not None:
                    with lock:
                        acknowledged.write("%s\t%s\t%s\n" % logged)
                        acknowledged.flush()
        except psycopg2.Error:
            # the server went away, or the extension did: start afresh
            counts["errors"] += 1
            if conn is not None:
                try:
                    conn.close()
                except psycopg2.Error:
                    pass
            conn = None
            time.sleep(0.2)
            next_at = time.monotonic()
    if conn is not None:
        conn.close()
    with lock:
        for name, value in counts.items():
            totals[name] += value


def main():
    parser = argparse.ArgumentParser(description="steady outbox_enqueue load")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--topic", action="append", required=True)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rate", type=float, default=200, help="transactions per second, all sessions")
    parser.add_argument("--duration", type=float, default=30)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--rollback", type=float, default=0.1)
    parser.add_argument("--acknowledged", help="file to append each acknowledged message to")
    args = parser.parse_args()
    acknowledged = open(args.acknowledged, "a") if args.acknowledged else None

    end = time.monotonic() + args.duration
    totals = {"transactions": 0, "committed": 0, "rolled_back": 0, "errors": 0}
    lock = threading.Lock()
    threads = [threading.Thread(target=session, args=(args, i, end, totals, lock, acknowledged))
               for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(" ".join("%s %d" % item for item in totals.items()), flush=True)


if __name__ == "__main__":
    main()

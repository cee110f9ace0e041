#!/usr/bin/python3
# The outbox extension's benchmarks, beside two hand-written pollers
# (peers.py: the seed articles' poller and a tuned one) on the same PostgreSQL
# and the same Kafka broker, in the same run:
#
#   B1  enqueue cost: the registration transaction under pgbench
#   B1R the same transaction at 1,000 and 7,000 messages per second: the CPU
#       of what publishes, per message
#   B1B bulk enqueue: a million rows in transactions of 100,000, three ways
#   B1D (only when named) B1's transaction published by our worker, by
#       outbox_capture() and by Debezium (test/bench/debezium.sh): the
#       application's TPS, the CPU of what publishes, the WAL per transaction
#   B2  drain: a backlog committed while nothing could publish, then published
#   B3  commit-to-consumer latency at 1,000 and 10,000 messages per second,
#       and at 1,000 right after a burst of 500,000
#   B3BG B3 while other updates, autovacuum and checkpoints run
#   B4  (--soak) ten minutes at 1,000 messages per second: does anything grow?
#   B5  1,000 messages per second while a transaction holds the xmin horizon
#   B6  three databases at 1,000 messages per second each, beside one at 3,000
#   B7  B3's rates with an asynchronous standby, outbox.synchronized_standby_slots
#       off and then on
#   B8  end to end: 1,000 msg/s enqueued in one database, applied in another by
#       the inbox; beside the tuned poller and a hand-written consumer
#   B9  consume: a million messages in Kafka applied by the inbox's handler,
#       beside a hand-written consumer (peers.py consume)
#   B10 small keyed enqueues while a transaction of 100,000 keys is open,
#       beside the same with none open
#
# Every figure is printed beside the peers' measured in the same run, as a
# ratio: absolute times on a shared machine drift.  Progress goes to stderr,
# the tables to stdout.  Exits non-zero when a run is broken (messages
# missing in Kafka, a pgbench failure), never because of speed.
#
#   bench.py --dsn DSN --brokers B --pg-bin DIR [--more-databases D2,D3] [--quick] [--soak]
#            [--only B5,...] [--command TEXT]
#
# test/bench/run prepares the cluster (outbox preloaded, the extension
# created in the DSN's database and in B6's other two, schema.sql not yet
# run) and the broker, and calls this.
# /usr/bin/python3 on purpose: Debian's python3-psycopg2 and python3-confluent-kafka.
import argparse
import contextlib
import datetime
import hashlib
import json
import math
import os
import platform
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import confluent_kafka
import psycopg2
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from peers import CONSUME_BATCH

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = "/usr/bin/python3"

SIZES = {
    "default": {"b1b_rows": 1_000_000, "b1b_chunk": 100_000, "b1_rounds": 3, "b1d_rounds": 5, "b1_seconds": 10, "backlog": 1_000_000, "segment": 100_000,
                "b3_burst": 500_000, "seed_window": 60, "b3_seconds": 25, "grace": 10, "b5_hold": 300, "b6_seconds": 25,
                "b6_warmup": 20, "b9_messages": 1_000_000, "b8_seconds": 30},
    "quick": {"b1b_rows": 100_000, "b1b_chunk": 10_000, "b1_rounds": 1, "b1d_rounds": 1, "b1_seconds": 5, "backlog": 100_000, "segment": 10_000,
              "b3_burst": 100_000, "seed_window": 15, "b3_seconds": 8, "grace": 5, "b5_hold": 60, "b6_seconds": 8,
              "b6_warmup": 5, "b9_messages": 100_000, "b8_seconds": 8},
}
SOAK = {"seconds": 600, "rate": 1000, "every": 30}
# B5: B3's 1,000 msg/s; a baseline without the hold, then the hold (its size's
# "b5_hold" seconds, 30 minutes with --soak) in windows of 30 s, then the load
# goes on after the hold ends while the footprint is watched: is it back within
# 1.25 times the baseline's?  Its warm-up is longer than WARMUP: the first
# messages to a new topic wait up to a second (metadata, the consumer's first
# fetches), and the next seconds' messages wait behind them, which B3's 25 s
# dilute but would make the p99 of a 15 s baseline.
B5 = {"rate": 1000, "warmup": 5, "baseline": 15, "every": 30, "soak_hold": 1800, "after": 60,
      "after_every": 10, "back_within": 1.25}
# The seed poller falls seconds behind at 1,000 msg/s already (B3): B5 skips it.
B5_PEERS = ("ours", "tuned")
# B6: B3's 1,000 msg/s into each of three databases, each database's load to
# a topic of its own, each published by its database's worker; beside it the
# same three loads into one database, so 3,000 msg/s published by one
# worker.  The two differ only in how many databases, and so workers, share
# the load.  Each runs once unmeasured first (its size's "b6_warmup"
# seconds): measured cold (a fresh broker, new topics, outboxes never
# analyzed), the first to run had a p50 several times the second's (three
# databases first: 72 to 230 ms against 10 to 40), falling over its 30 s.
B6 = {"rate": 1000}
# B7: B3's rates published by our worker while an asynchronous streaming
# standby (on a physical slot, in the bench's directory, the next port) replays
# the primary's WAL: first with outbox.synchronized_standby_slots empty, then
# naming the standby's slot, so that the worker produces a batch only once the
# standby has flushed the WAL up to its claim.  The ratio is what that costs.
B7 = {"slot": "bench_standby", "variants": ("off", "on")}
# B1B: a batch job's or a migration's enqueue, with the worker paused (the
# messages wait; publishing is B2's): its size's "b1b_rows" over 1,000 keys,
# "b1b_chunk" per transaction, each chunk one statement over
# generate_series, ~30-byte JSON payloads; each way in turn, two rounds.
# The outbox's rows are truncated after each way, the plain table's too.
B1B_ROUNDS = 2
B1B_PAYLOAD = "jsonb_build_object('n', i, 'kind', 'bulk')"
B1B_WAYS = {
    "outbox_enqueue()":
        "SELECT count(outbox_enqueue('bench.b1b', {payload}, 'key-' || i % 1000)) FROM {rows}",
    "INSERT INTO outbox_message (trigger included)":
        "INSERT INTO outbox_message (topic, key, payload)"
        " SELECT 'bench.b1b', 'key-' || i % 1000, convert_to(({payload})::text, 'UTF8') FROM {rows}",
    "INSERT INTO plain_message (no trigger)":
        "INSERT INTO plain_message (topic, key, payload)"
        " SELECT 'bench.b1b', 'key-' || i % 1000, convert_to(({payload})::text, 'UTF8') FROM {rows}",
}
B1B_PLAIN = "INSERT INTO plain_message (no trigger)"
# B12: what exactly-once publication costs: B2's drain (ours) and B3's loads
# (pgbench -R) at 1,000 and 10,000 msg/s, quiet and under B3BG's
# background, with outbox.delivery at_least_once, then exactly_once, in the
# same run.  Targets: the drain at least 0.7 of at_least_once's, the p99 at
# 1,000 msg/s at most 10 ms above it.
B12 = {"variants": ("at_least_once", "exactly_once"), "wheres": ("quiet", "background"),
       "drain_ratio": 0.7, "p99_over_ms": 10}
# The parts, in the order they run.
PARTS = ("B2", "B1", "B1R", "B1B", "B1D", "B3", "B3BG", "B4", "B5", "B6", "B7", "B8", "B8BG", "B9", "B10", "B11",
         "B12")
# B10: small business transactions, each one keyed outbox_enqueue() of a key
# of its own, one after another (a pause of "pause" seconds between them)
# for "seconds"; first with nothing else open, then while a bulk transaction
# enqueues "bulk_keys" distinct keys (none of theirs) in "bulk_chunks"
# statements spread over the same seconds and commits at their end.  The
# figure: the p99 of the small transactions' enqueue call in each run, and
# the ratio.  A bulk transaction's pairs once took every key-lock bucket, and
# each small enqueue then waited for its commit.
B10 = {"topic": "bench.b10", "seconds": 10, "bulk_keys": 100_000, "bulk_chunks": 100, "pause": 0.002}
# B8 and B9 measure the inbox (schema 0.5.0): inbox_subscribe() makes a
# worker in the database read Kafka topics and call a handler for each
# message in the transaction that records it as consumed.  Its handlers here
# insert one row into a table of APPLIED_TABLE's shape; they run as a role
# that is no superuser (INBOX["role"]), granted what they need.  The peer is
# peers.py consume, into a table of the same shape and a processed-id table
# of its own.  Where inbox_subscribe() does not exist, our half is skipped
# and the peer's still measured.
INBOX = {"role": "bench_inbox", "missing": "the inbox is not installed: inbox_subscribe() does not exist"}
APPLIED_TABLE = """
    DROP TABLE IF EXISTS {table};
    CREATE TABLE {table} (
        id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        message_id uuid,
        key        text,
        payload    jsonb NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
    )"""
PROCESSED_TABLE = """
    DROP TABLE IF EXISTS {table};
    CREATE TABLE {table} (message_id uuid PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())"""
INBOX_HANDLER = """
    CREATE OR REPLACE FUNCTION {table}_handler(m inbox_message) RETURNS void
    LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO {table} (message_id, key, payload) VALUES (m.message_id, m.key, payload_jsonb(m));
    END
    $$;
    GRANT INSERT ON {table} TO {role};
    GRANT EXECUTE ON FUNCTION {table}_handler(inbox_message) TO {role}"""
# B9: its size's "b9_messages" produced to bench.b9 before anything consumes
# (~75-byte JSON, "keys" keys, a fresh UUID in the outbox-message-id header
# of each, as the outbox's worker writes them), then consumed from the
# earliest offset by our inbox and by the peer in turn, each into its own
# table; msg/s from the subscription (the peer's start) until the table
# holds them all, the wait for the first row reported apart as start-up.
# "deadline": seconds, at least, before a consumer is reported unfinished.
B9 = {"topic": "bench.b9", "keys": 10_000, "deadline": 300, "min_rate": 2_000,
      "target_rate": 50_000, "target_ratio": 2.0}
# B8: B3's load of 1,000 msg/s (one message per transaction) into the
# bench database A, published by our worker (or the tuned poller from
# tuned_message), applied in B (the first of --more-databases) by our inbox
# (or peers.py consume) with a handler that inserts a row stamped
# clock_timestamp(); its size's "b8_seconds" measured after "warmup"
# seconds.  Latency: from the payload's enqueue time in A to the row's
# being visible in B, read by a thread that polls B's table every "poll"
# seconds (an upper bound of B's commit, by at most the poll and its
# query), and to the handler's clock_timestamp() (a lower bound, before
# B's commit).  "grace": seconds after the load for the last to arrive.
B8 = {"rate": 1000, "warmup": 5, "poll": 0.002, "grace": 30, "target_p99": 20}
B8_PEERS = ("ours", "tuned")
# B3: messages per second offered, and per transaction.  This 2-core machine
# cannot commit 10,000 transactions a second while publishing them (about
# 4,000 to 5,000 here), so 10,000 msg/s come as 1,000 transactions of 10.
B3_RATES = {1000: 1, 10000: 10}
# B3 after a burst: the size's "b3_burst" messages enqueued at once, and as
# soon as Kafka holds them all, B3's 1,000 msg/s load, whose latencies are
# counted from its first message for B3_AFTER_BURST seconds (the drained
# segments truncated, the outbox's autovacuum, meanwhile).  B3_BURST_ROUNDS
# rounds, ours and Kafka's floor in turn, compared by their median p99:
# after a burst this machine (its disk or the broker) stalls now and then,
# for up to half a second, ours and the floor alike (both 0.4 s in the
# first half second in one run, neither in the next), which one round each
# would count against whichever it fell on.
B3_AFTER_BURST = 10
B3_BURST_ROUNDS = 3
# B3BG: B3's rates, ours, the tuned poller's and the floor's, while the
# database does other work.  A second pgbench updates random rows of
# bg_account (schema.sql; "rows" of them, filled at the part's start) at
# "tps", from "lead" seconds before each measured load to "lag" seconds
# after it.  bg_account's own autovacuum thresholds (10,000 rows) and a
# naptime of "autovacuum_naptime" seconds (the default minute would visit
# the database once in two loads, or not at all) make autovacuum vacuum and
# analyze it meanwhile.  checkpoint_timeout is set to its minimum,
# "checkpoint_timeout" seconds, and each load starts so that a timed
# checkpoint begins in its middle (after a CHECKPOINT of the bench's, which
# restarts the timer): its writes, and the full-page images of the first
# change to each page after it.  Both settings are restored at the end.
# The p99 is also cut in two: the messages enqueued in the "after_checkpoint"
# seconds after the checkpoint began, when most changes write a full page,
# and the others.
B3BG = {"rows": 1_000_000, "tps": 2000, "lead": 2, "lag": 2, "checkpoint_timeout": 30,
        "autovacuum_naptime": 5, "after_checkpoint": 5}
B3BG_PEERS = ("ours", "tuned")
B3BG_UPDATE = "\\set id random(1, {rows})\nUPDATE bg_account SET balance = balance + 1 WHERE id = :id;\n"
# What ran during a B3BG load, in the order BACKGROUND_ACTIVITY reads it.
BACKGROUND_COUNTS = ("checkpoints", "checkpoint buffers", "autovacuums", "autoanalyzes")
# And how much of the load's time some task of the machine (the bench's or
# another's) waited for a CPU, or for I/O: /proc/pressure's "some".
PRESSURE = {"cpu": "CPU pressure %", "io": "I/O pressure %"}
BACKGROUND_ACTIVITY = """
    SELECT checkpoints_timed + checkpoints_req, buffers_checkpoint, autovacuum_count, autoanalyze_count
      FROM pg_stat_bgwriter, pg_stat_user_tables WHERE relid = 'bg_account'::regclass"""
# The latency targets under that background, per rate: ours p99 at
# most the floor's plus "over_floor" ms, or at most "p99" ms.
B3BG_TARGETS = {1000: {"over_floor": 5}, 10000: {"p99": 20}}
PEERS = ("ours", "seed", "tuned")
PARTITIONS = 4
CLIENTS, JOBS = 4, 2           # pgbench: 2 cores
WARMUP = 1.0                   # B3/B4: seconds of load not counted (new connections, metadata)
FILL_CHUNK = 100_000           # B2: rows per enqueueing transaction

# What each peer's table holds that is not yet in Kafka.
TABLE = {"ours": "outbox_message", "seed": "seed_message", "tuned": "tuned_message"}
BACKLOG = {
    "ours": "SELECT count(*) FROM outbox_message",
    "seed": "SELECT count(*) FROM seed_message WHERE status = 'PENDING'",
    "tuned": "SELECT count(*) FROM tuned_message",
}
# B5: a table's size on disk (heap, indexes, TOAST) and its dead tuples, over
# its partition tree and itself (pg_partition_tree() has no row for a plain
# table): the same query holds whatever outbox_message's layout.
FOOTPRINT = """
    WITH tree AS (SELECT relid FROM pg_partition_tree(%(table)s::regclass)
                  UNION SELECT %(table)s::regclass)
    SELECT (SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint FROM tree),
           (SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables
             WHERE relid IN (SELECT relid FROM tree))"""


def enqueue_sql(peer, topic, payload, key, rows):
    """One message for each row of a FROM clause: ours through
    outbox_enqueue(), the peers by INSERT into their tables."""
    if peer == "ours":
        return f"SELECT count(outbox_enqueue('{topic}', {payload}, {key})) FROM {rows}"
    return (f"INSERT INTO {TABLE[peer]} (topic, key, payload)"
            f" SELECT '{topic}', {key}, ({payload})::text FROM {rows}")


# B2: a backlog of ~200-byte JSON payloads over 1,000 keys, numbered so that
# what Kafka got can be checked one by one.
B2_PAYLOAD = "jsonb_build_object('seq', i, 'key', 'key-' || mod(i, 1000), 'pad', repeat('x', 156))"

# B3, B4 and B5: ~200-byte payloads that carry their enqueue time, epoch ms.
B3_PAYLOAD = ("jsonb_build_object('t', round(extract(epoch FROM clock_timestamp()) * 1000, 3),"
              " 'pad', repeat('x', 170))")


def latency_script(peer, topic, per_transaction):
    """pgbench: a transaction of per_transaction messages, keys drawn at random."""
    statement = enqueue_sql(peer, topic, B3_PAYLOAD, "'key-' || mod(:k + g, 1000)",
                            f"generate_series(1, {per_transaction}) g")
    return f"\\set k random(1, 1000)\n{statement};\n"


# B1: the registration of seed article 000 (a user row, then crm.sync and
# coupon.welcome, keyed by the user), ~200-byte payloads.
B1_USER = ("INSERT INTO app_user (email, name) VALUES (gen_random_uuid() || '@example.com',"
           " 'User ' || :client_id) RETURNING id, email \\gset")
B1_MESSAGES = [
    ("crm.sync",
     "jsonb_build_object('user_id', :id::bigint, 'email', :email::text, 'name', 'User ' || :client_id,"
     " 'phone', '+86 138 0013 8000', 'source', 'registration', 'registered_at', now())",
     "'{\"event\": \"user.registered\"}'"),
    ("coupon.welcome",
     "jsonb_build_object('user_id', :id::bigint, 'coupon_template_id', 'NEW_USER_WELCOME',"
     " 'expire_days', 7, 'channel', 'registration', 'campaign', 'spring-welcome',"
     " 'issued_at', now())",
     "NULL"),
]
# Seconds of B1's transaction published by the worker, unmeasured, before
# the rounds.  Run first (BENCH_ONLY=B1), on a broker that had served no
# produce request yet, the worker's variant of the first round had 0.66 to
# 0.71 of the plain INSERT's TPS, against 0.86 to 0.88 in the next rounds:
# the broker's CPU, sampled every second, was 0.5 cores during it and 0.24
# during the next round's (its JVM still compiling, we think; the full run
# warms it with B2 first).
B1_WARMUP = 15
B1_PLAIN = "2 x plain INSERT, outbox-like table"
B1_PUBLISHING = "2 x outbox_enqueue, worker publishing"
B1_PAUSED = "2 x outbox_enqueue, worker paused"
B1_TUNED = "2 x INSERT, tuned poller publishing"
B1_VARIANTS = {
    "business transaction alone": [],
    B1_PLAIN: [
        "INSERT INTO plain_message (topic, key, payload, headers)"
        f" VALUES ('{t}', 'user-' || :id, convert_to(({p})::text, 'UTF8'), {h});"
        for t, p, h in B1_MESSAGES],
    B1_PUBLISHING: [
        f"SELECT outbox_enqueue('{t}', {p}, 'user-' || :id, {h});" for t, p, h in B1_MESSAGES],
    B1_TUNED: [
        f"INSERT INTO tuned_message (topic, key, payload) VALUES ('{t}', 'user-' || :id, ({p})::text);"
        for t, p, h in B1_MESSAGES],
}
# B1D: B1's transaction with its two messages written into a table shaped
# as Debezium's outbox table (aggregatetype routes to outbox.event.<topic>),
# published by outbox_capture() (captured_outbox) or by Debezium
# (dbz_outbox, test/bench/debezium.sh: Kafka Connect 4.3, the PostgreSQL
# connector 3.6.1 and EventRouter, as shipped), inserted alone or inserted
# and deleted in the transaction (the Quarkus outbox extension's way);
# beside the transaction alone, with two plain INSERTs and with
# outbox_enqueue().  Debezium runs for its own variants only (it decodes all
# of the WAL), started before each and its slot dropped after.  Named with
# BENCH_ONLY only: test/bench/run then makes the cluster logical and
# listening on 127.0.0.1, as Debezium needs.  Each start of Debezium is
# followed by B1_WARMUP seconds of its load, unmeasured (its JVM compiles
# meanwhile, as ours is warmed before the rounds), then the clean every
# variant's load starts from (a checkpoint: the same full-page writes).
# Five rounds ("b1d_rounds"), not B1's three: with three, the medians'
# ratios moved by 0.1 from one run to the next on the same code.
B1D_TABLES = {"capture": "captured_outbox", "debezium": "dbz_outbox"}


def outbox_table_rows(table, delete):
    """B1's messages as rows of a Debezium outbox table, deleted again at
    once with delete, each by its id, as the Quarkus outbox extension's
    Hibernate session deletes the event it has just saved."""
    rows = [f"INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload)"
            f" VALUES (gen_random_uuid(), '{t}', 'user-' || :id, 'UserRegistered', {p})"
            + (f" RETURNING id AS event{n} \\gset" if delete else ";")
            for n, (t, p, _) in enumerate(B1_MESSAGES)]
    return rows + ([f"DELETE FROM {table} WHERE id = :event{n};" for n in range(len(B1_MESSAGES))]
                   if delete else [])


B1D_VARIANTS = {
    "business transaction alone": ("none", []),
    B1_PLAIN: ("none", B1_VARIANTS[B1_PLAIN]),
    B1_PUBLISHING: ("ours", B1_VARIANTS[B1_PUBLISHING]),
    "2 x INSERT, outbox_capture()": ("ours", outbox_table_rows(B1D_TABLES["capture"], False)),
    "2 x INSERT + DELETE, outbox_capture()": ("ours", outbox_table_rows(B1D_TABLES["capture"], True)),
    "2 x INSERT, Debezium publishing": ("debezium", outbox_table_rows(B1D_TABLES["debezium"], False)),
    "2 x INSERT + DELETE, Debezium publishing": ("debezium", outbox_table_rows(B1D_TABLES["debezium"], True)),
}
B1D_TOPICS = [f"outbox.event.{t}" for t, _, _ in B1_MESSAGES]

# B1R: B1's transaction offered at fixed rates by pgbench -R, published by
# our worker and by the tuned poller in turn, in B1's rounds of B1's
# seconds: what publishing costs per message at a rate it keeps up with, not
# flat out.  7,000 msg/s is about what B1 commits flat out with the worker
# publishing; a rate committed at less than "reached" of the offered is
# reported as not reached.
# Our worker also runs with outbox.max_wake_delay at 0, so that every turn
# starts at once: what coalescing the wakes saves.
B1R = {"rates": (1000, 7000), "reached": 0.95}
B1R_VARIANTS = {"ours": (B1_PUBLISHING, {}),
                "ours, wakes not coalesced": (B1_PUBLISHING, {"outbox.max_wake_delay": "0"}),
                "tuned": (B1_TUNED, {})}
# What publishes, in two: the PostgreSQL backend that claims and deletes,
# and the process that produces to Kafka.
PUBLISHER_SIDES = ("backend", "producer")


def b1_script(statements):
    """pgbench: the registration transaction, with a variant's statements."""
    return "\n".join(["BEGIN;", B1_USER] + statements + ["COMMIT;", ""])


START = time.monotonic()


def uuid_v7():
    """A UUID of version 7, as outbox_uuid_v7() makes one: the milliseconds
    since the Unix epoch, then random bits."""
    data = bytearray(int(time.time() * 1000).to_bytes(6, "big") + os.urandom(10))
    data[6] = (data[6] & 0x0F) | 0x70
    data[8] = (data[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(data)))


def progress(message):
    print(f"[{time.monotonic() - START:6.0f}s] {message}", file=sys.stderr, flush=True)


class Broken(Exception):
    """The run measured nothing valid: the bench fails."""


def wait_until(what, condition, timeout, interval=0.1):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise Broken(f"{what}: not after {timeout:.0f} s")
        time.sleep(interval)


class Database:
    def __init__(self, dsn):
        self.dsn = dsn
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True    # VACUUM, ALTER SYSTEM; each statement commits
        self.name = self.conn.info.dbname

    def run(self, sql, params=None):
        with self.conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else None

    def value(self, sql, params=None):
        return self.run(sql, params)[0][0]


class Kafka:
    def __init__(self, brokers):
        self.brokers = brokers
        self.admin = AdminClient({"bootstrap.servers": brokers})
        self.offsets = self.consumer()

    def consumer(self):
        # Partitions are assigned explicitly: the group id only satisfies librdkafka.
        return Consumer({"bootstrap.servers": self.brokers, "group.id": f"bench-{uuid.uuid4()}",
                         "enable.auto.commit": False})

    def create_topics(self, names):
        futures = self.admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names])
        for future in futures.values():
            future.result()
        # The controller answers before the broker serves the topics.
        def ready():
            try:
                return all(self.ends(t) for t in names)
            except KafkaException:
                return False
        wait_until("topics ready", ready, 30)

    def ends(self, topic):
        """The high watermark of each partition: with an idempotent producer and
        no transactions, the number of records each holds."""
        return [self.offsets.get_watermark_offsets(TopicPartition(topic, p), timeout=10,
                                                   cached=False)[1] for p in range(PARTITIONS)]

    def count(self, topic):
        return sum(self.ends(topic))

    def distinct_seqs(self, topic):
        """Read the whole topic, read_committed, up to each partition's high
        watermark as it is now: (records, distinct "seq" values of their
        payloads).  A partition is read whole once its end of partition comes
        at or past its watermark: under exactly-once publication commit
        markers take offsets too, and are no records."""
        ends = self.ends(topic)
        consumer = Consumer({"bootstrap.servers": self.brokers, "group.id": f"bench-{uuid.uuid4()}",
                             "enable.auto.commit": False, "enable.partition.eof": True})
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        seqs, records, whole = set(), 0, set()
        deadline = time.monotonic() + 300
        while len(whole) < PARTITIONS:
            if time.monotonic() > deadline:
                raise Broken(f"{topic}: read {records:,} records, {len(whole)} of {PARTITIONS}"
                             " partitions to their end")
            for msg in consumer.consume(10000, 1.0):
                if msg.error() is None:
                    records += 1
                    seqs.add(json.loads(msg.value())["seq"])
                elif msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[msg.partition()]:
                    whole.add(msg.partition())
        consumer.close()
        return records, len(seqs)


class LatencyConsumer(threading.Thread):
    """Reads a topic from its current end, from before the load starts, and
    keeps (receive time, enqueue time) of every message, both epoch ms: the
    payload's "t" is clock_timestamp() in the enqueueing statement."""

    def __init__(self, kafka, topic):
        super().__init__(daemon=True)
        self.consumer = kafka.consumer()
        # Explicit offsets, known now: OFFSET_END would be looked up later,
        # after the first messages may have arrived.
        self.consumer.assign([TopicPartition(topic, p, end) for p, end in enumerate(kafka.ends(topic))])
        self.samples = []
        self.stopping = threading.Event()

    def run(self):
        # poll(), not consume(n): consume waits to fill its batch, which
        # would delay the receive time of every message but the last.
        while not self.stopping.is_set():
            msg = self.consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                self.samples.append((time.time() * 1000, json.loads(msg.value())["t"]))
        self.consumer.close()

    def stop(self):
        self.stopping.set()
        self.join()

    def latencies(self, enqueued_after=0.0, received_after=0.0, enqueued_before=math.inf):
        return sorted(received - enqueued for received, enqueued in list(self.samples)
                      if enqueued_after <= enqueued < enqueued_before and received > received_after)


def segment_rates(observed, segment):
    """B2: {n: msg/s} over the segment of `segment` records that ends with
    the nth in Kafka, from (time, records in Kafka) observations of a drain.
    The moment each boundary was passed is interpolated between the two
    observations around it, as an observation may come many records after
    one.  The first segment starts at the first observation, the last ends
    at the last."""
    marks = [observed[0]]
    boundary = (observed[0][1] // segment + 1) * segment
    for (ta, ca), (tb, cb) in zip(observed, observed[1:]):
        while ca < boundary <= cb:
            marks.append((ta + (tb - ta) * (boundary - ca) / (cb - ca), boundary))
            boundary += segment
    if marks[-1][1] < observed[-1][1]:
        marks.append(observed[-1])
    return {c1: (c1 - c0) / (t1 - t0) for (t0, c0), (t1, c1) in zip(marks, marks[1:])}


def latency_summary(result):
    """A line of progress on a result of Bench.latency_loads()."""
    return (f"{result['committed']:,.0f} msg/s committed, "
            + ("kept up" if result["kept_up"]
               else f"behind: backlog {result['backlog']:,} at the end of the load")
            + ("; p50 %(p50).1f ms, p99 %(p99).1f ms, max %(max).1f ms" % result if "p50" in result else ""))


def percentiles(latencies):
    if not latencies:
        return None
    return {"p50": latencies[len(latencies) // 2], "p99": latencies[int(len(latencies) * 0.99)],
            "max": latencies[-1]}


def read_status(pid, field):
    """A field of /proc/PID/status, in kB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pids):
    """User and system CPU time of the processes, all their threads (librdkafka's
    too), and of their children that ended (a worker's Kafka processes)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        # utime, stime, cutime, cstime: fields 14 to 17
        total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return total / os.sysconf("SC_CLK_TCK")


def stalled_microseconds(resource):
    """Microseconds in which some task of the machine waited for the
    resource ("cpu", "io"), since boot, by the kernel's pressure stall
    information; None without it."""
    try:
        with open(f"/proc/pressure/{resource}") as pressure:
            return int(pressure.readline().split("total=")[1])      # the first line: "some"
    except FileNotFoundError:
        return None


def children(pid):
    """The processes whose parent is pid."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except OSError:
                pass                # it ended meanwhile
    return found


def process_cpu(pid):
    """cpu_seconds() of one process, 0 if it has ended."""
    try:
        return cpu_seconds([pid])
    except (FileNotFoundError, ProcessLookupError):
        return 0.0


def descendants(pid):
    """pid and every process below it (a worker's Kafka process too), from one scan of /proc."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += [child for child, ppid in parent.items() if ppid == p]
    return found


class CpuMeter:
    """CPU seconds used by some processes since the meter started.  pids()
    is asked at the start and at each read: a process found later counts
    from its beginning; one that ended counts no more (the postmaster's
    children, reaped, count on in its cutime, which cpu_seconds() adds)."""

    def __init__(self, pids):
        self.pids = pids
        self.start = {pid: process_cpu(pid) for pid in pids()}

    def seconds(self):
        return sum(process_cpu(pid) - self.start.get(pid, 0.0) for pid in self.pids())


class Pressure:
    """The share of the time since it was made in which some task of the
    machine waited for a CPU (/proc/pressure/cpu's "some"), in percent;
    None without the kernel's pressure stall information."""

    def __init__(self):
        self.began, self.since = time.monotonic(), stalled_microseconds("cpu")

    def percent(self):
        now = stalled_microseconds("cpu")
        if self.since is None or now is None:
            return None
        return (now - self.since) * 100 / ((time.monotonic() - self.began) * 1e6)


def postmaster_pid(db):
    with open(f"/proc/{db.value('SELECT pg_backend_pid()')}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


class VisibleRows(threading.Thread):
    """B8: polls a table of APPLIED_TABLE's shape every B8["poll"] seconds
    for rows of higher ids than it has seen, and keeps when each was first
    seen (epoch ms): an upper bound of its transaction's commit.  A row
    committed after a higher id was seen is never seen (one consumer,
    applying in one transaction at a time, commits its ids in order);
    missed() counts them."""

    def __init__(self, dsn, table):
        super().__init__(daemon=True)
        self.conn = psycopg2.connect(dsn, application_name="bench.py visible rows")
        self.conn.autocommit = True
        self.query = f"SELECT id FROM {table} WHERE id > %s ORDER BY id"
        self.seen = {}
        self.stopping = threading.Event()

    def run(self):
        last = 0
        with self.conn.cursor() as cur:
            while not self.stopping.is_set():
                cur.execute(self.query, (last,))
                rows = cur.fetchall()
                now = time.time() * 1000
                for id_, in rows:
                    self.seen[id_] = now
                if rows:
                    last = rows[-1][0]
                self.stopping.wait(B8["poll"])
        self.conn.close()

    def stop(self):
        self.stopping.set()
        self.join()


class Inbox:
    """The inbox of a database (schema 0.5.0), through its SQL API; our half
    of B8 and B9.  present() is false where inbox_subscribe() does not exist."""

    def __init__(self, db):
        self.db = db

    def present(self):
        return self.db.value("SELECT EXISTS (SELECT FROM pg_proc WHERE proname = 'inbox_subscribe')")

    def prepare(self, table):
        """APPLIED_TABLE and its handler, run as INBOX["role"], which may insert into it."""
        self.db.run(f"""DO $$ BEGIN
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{INBOX["role"]}') THEN
                CREATE ROLE {INBOX["role"]} NOLOGIN;
            END IF; END $$""")
        self.db.run(APPLIED_TABLE.format(table=table))
        self.db.run(INBOX_HANDLER.format(table=table, role=INBOX["role"]))

    def subscribe(self, name, topics, table):
        # its topics granted, where the extension has topic grants (0.8.0 on)
        if self.db.value("SELECT EXISTS (SELECT FROM pg_proc WHERE proname = 'outbox_grant_topic')"):
            self.db.run("SELECT outbox_grant_topic(%s::regrole, topic, 'subscribe') FROM unnest(%s::text[]) topic",
                        (INBOX["role"], topics))
        self.db.run("SELECT inbox_subscribe(%s, %s::text[], %s::regprocedure, start_from => 'earliest',"
                    " run_as => %s::regrole)",
                    (name, topics, f"{table}_handler(inbox_message)", INBOX["role"]))

    def unsubscribe(self, name, discard_pending=False):
        self.db.run("SELECT inbox_unsubscribe(%s, discard_pending => %s)", (name, discard_pending))

    def status(self, name):
        return self.db.run("SELECT topic, partition, next_offset, lag, retrying, dead_letters, worker_state,"
                           " worker_last_error FROM inbox_status WHERE subscription = %s", (name,))

    def pids(self):
        """The database's inbox workers (by their backend_type) and their Kafka processes."""
        workers = [pid for pid, in self.db.run(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type ILIKE '%inbox%'")]
        return workers + [child for pid in workers for child in children(pid)]


class Worker:
    """The outbox worker of the DSN's database, through the outbox_worker
    view and a setting.  The view shows every database's worker: B6's other
    databases have theirs, which B1 to B5 leave out of what they count."""

    def __init__(self, db):
        self.db = db

    def rows(self):
        return self.db.run("SELECT pid, state, published FROM outbox_worker"
                           " WHERE database = current_database()")

    def pids(self):
        """The worker and its Kafka process (outbox_kafka), which runs librdkafka."""
        return self.backend_pids() + self.kafka_pids()

    def backend_pids(self):
        return [pid for pid, _, _ in self.rows() if pid]

    def kafka_pids(self):
        return [child for pid in self.backend_pids() for child in children(pid)]

    def published(self):
        return sum(published for _, _, published in self.rows())

    def pause(self):
        # An address where no broker listens: the worker claims nothing.
        self.db.run("ALTER SYSTEM SET outbox.brokers = '127.0.0.1:1'")
        self.db.run("SELECT pg_reload_conf()")
        wait_until("worker waiting for brokers", lambda: all(
            state == "waiting for brokers" for _, state, _ in self.rows()), 30)

    def resume(self):
        self.db.run("ALTER SYSTEM RESET outbox.brokers")
        self.db.run("SELECT pg_reload_conf()")

    def wait_reachable(self):
        """After resume(), until the worker has its producer and reaches the
        brokers, so that the part that follows does not measure the wait."""
        wait_until("worker reaching the brokers", lambda: all(
            state != "waiting for brokers" for _, state, _ in self.rows()), 30)

    def wait_drained(self, timeout):
        wait_until("outbox drained", lambda: self.db.value(BACKLOG["ours"]) == 0, timeout, 0.2)


class Peer:
    """A poller of peers.py, in a process of its own."""
    running = set()      # killed if the bench ends early

    def __init__(self, kind, args, dsn=None, extra=()):
        self.kind = kind
        self.process = subprocess.Popen(
            [PYTHON, os.path.join(HERE, "peers.py"), kind, "--dsn", dsn or args.dsn, "--brokers", args.brokers,
             *extra], stdout=subprocess.PIPE, text=True)
        Peer.running.add(self.process)
        if self.process.stdout.readline().strip() != "ready":
            raise Broken(f"{kind} poller did not start")

    def peak_rss_kb(self):
        return read_status(self.process.pid, "VmHWM")

    def pids(self, db):
        """The poller's process and its backend."""
        return [self.process.pid] + self.backend_pids(db)

    def backend_pids(self, db):
        return [pid for pid, in db.run(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (f"peers.py {self.kind}",))]

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=120)
        Peer.running.discard(self.process)
        if self.process.returncode != 0:
            raise Broken(f"{self.kind} poller exited with {self.process.returncode}")
        self.counts = json.loads(out.splitlines()[-1])
        failed = self.counts["failed"]
        if failed:
            raise Broken(f"{self.kind} {'consumer' if self.kind == 'consume' else 'poller'}: {failed} messages"
                         f" failed to {'apply (no message id)' if self.kind == 'consume' else 'publish'}")


class HeldSnapshot:
    """B5's hold: a REPEATABLE READ transaction, left open once it has taken
    its snapshot, holds back the xmin horizon, so that neither VACUUM nor
    pruning may remove a row deleted after it began.  It reads a table that
    has nothing to do with publishing, so it holds no lock that the worker or
    a poller could wait for."""

    def __init__(self, dsn):
        self.conn = psycopg2.connect(dsn, application_name="bench.py hold")
        self.conn.autocommit = True    # the transaction is begun and ended by hand
        with self.conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SELECT 1 FROM app_user LIMIT 1")
        self.began = time.monotonic()

    def seconds(self):
        return time.monotonic() - self.began

    def xmin_age(self, db):
        """Transaction ids assigned since the snapshot's xmin: how far behind the horizon is held."""
        age = db.value("SELECT age(backend_xmin) FROM pg_stat_activity WHERE pid = %s",
                       (self.conn.get_backend_pid(),))
        if age is None:
            raise Broken("B5: the held transaction holds no xmin")
        return age

    def end(self):
        with self.conn.cursor() as cur:
            cur.execute("COMMIT")
        self.conn.close()


class Standby:
    """An asynchronous streaming standby of the DSN's cluster (which must
    connect through a unix socket directory), on a physical slot made by its
    base backup, run by the postgres user beside the primary's directory."""

    def __init__(self, args, primary, slot):
        params = psycopg2.extensions.parse_dsn(args.dsn)
        self.pg_bin, self.primary, self.slot = args.pg_bin, primary, slot
        self.dir = os.path.join(params["host"], "standby")
        shutil.rmtree(self.dir, ignore_errors=True)
        # A fast checkpoint: a spread one would take most of the bench's 30 minute checkpoint_timeout.
        self.postgres("pg_basebackup", "-h", params["host"], "-p", params["port"], "-U", "postgres",
                      "-D", self.dir, "-X", "stream", "-C", "-S", slot, "-R", "--checkpoint=fast")
        conf = os.path.join(self.dir, "postgresql.conf")
        with open(conf, "a") as f:
            f.write(f"port = {int(params['port']) + 1}\n")
        self.postgres("pg_ctl", "-D", self.dir, "-l", os.path.join(self.dir, "server.log"), "-w", "-s",
                      "start")
        wait_until("B7: the standby streams", lambda: primary.value(
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'") == 1, 60)

    def postgres(self, program, *args):
        user = pwd.getpwnam("postgres")
        subprocess.run([os.path.join(self.pg_bin, program), *args], check=True,
                       preexec_fn=lambda: (os.setgid(user.pw_gid), os.setuid(user.pw_uid)))

    def stop(self):
        self.postgres("pg_ctl", "-D", self.dir, "-m", "fast", "-w", "-s", "stop")
        self.primary.run("SELECT pg_drop_replication_slot(%s)", (self.slot,))
        shutil.rmtree(self.dir, ignore_errors=True)


class Debezium:
    """B1D's Debezium: test/bench/debezium.sh against the bench's database
    (over TCP on 127.0.0.1) and broker."""
    script = os.path.join(HERE, "debezium.sh")

    def __init__(self, args, db):
        self.db = db
        dsn = dict(item.split("=", 1) for item in args.dsn.split())
        self.env = dict(os.environ, PGHOST=dsn["host"], PGPORT=dsn["port"], PGDATABASE=dsn["dbname"],
                        PGUSER=dsn.get("user", "postgres"), KAFKA_BOOTSTRAP=args.brokers,
                        DEBEZIUM_TABLES=f"public.{B1D_TABLES['debezium']}")

    def run(self, command):
        done = subprocess.run(["bash", self.script, command], env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise Broken(f"debezium.sh {command} failed:\n{done.stderr}")
        return done.stdout.strip()

    def pids(self):
        """Connect's JVM, and the walsender that decodes the WAL for it."""
        walsenders = [pid for (pid,) in self.db.run(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walsender'")]
        return [int(self.run("pid"))] + walsenders


class Bench:
    def __init__(self, args):
        self.args = args
        self.size = SIZES["quick" if args.quick else "default"]
        self.db = Database(args.dsn)
        self.kafka = Kafka(args.brokers)
        self.worker = Worker(self.db)
        self.results = {}
        self.timings = []
        # Which build: read now, just after the server loaded it, in case
        # another is installed while the bench runs.
        so = os.path.join(subprocess.check_output(
            [os.path.join(args.pg_bin, "pg_config"), "--pkglibdir"], text=True).strip(), "outbox.so")
        with open(so, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:12]
        built = datetime.datetime.fromtimestamp(os.path.getmtime(so))
        self.measured = f"{so} (built {built:%Y-%m-%d %H:%M}, sha256 {digest})"

    def pgbench(self, script, seconds, rate=None, background=False, dsn=None):
        """pgbench over the script (text), in the DSN's database or dsn's; with
        background, the Popen (see finish_pgbench)."""
        file = tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False)
        file.write(script)
        file.close()
        cmd = [os.path.join(self.args.pg_bin, "pgbench"), "-n", "-M", "prepared",
               "-c", str(CLIENTS), "-j", str(JOBS), "-T", str(int(seconds)), "-f", file.name]
        if rate:
            cmd += ["-R", str(rate)]
        load = subprocess.Popen(cmd + [dsn or self.args.dsn], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        load.script = file.name
        return load if background else self.finish_pgbench(load)

    @staticmethod
    def finish_pgbench(load):
        out, _ = load.communicate()
        os.unlink(load.script)
        if load.returncode != 0:
            raise Broken(f"pgbench failed:\n{out}")
        figures = {}
        for line in out.splitlines():
            if line.startswith("number of transactions actually processed:"):
                figures["processed"] = int(line.split(":")[1].split("/")[0])
            elif line.startswith("tps = "):
                figures["tps"] = float(line.split()[2])
            elif line.startswith("number of failed transactions:") and not line.endswith(" 0 (0.000%)"):
                raise Broken(f"pgbench: {line}")
        return figures

    def part(self, name, run):
        begin = time.monotonic()
        progress(f"{name}: start")
        run()
        self.timings.append((name, time.monotonic() - begin))
        progress(f"{name}: done in {self.timings[-1][1]:.0f} s")

    def clean(self):
        """Peers' tables emptied, every table vacuumed, dirty pages written:
        each measurement starts from the same state.  The machine's dirty
        pages too (sync(2)), the broker's log among them, which Kafka never
        syncs: the kernel writes them back about 30 s after they were
        written, into the next part's load, and a commit's WAL flush waits
        behind that writeback (on a scratch cluster, p99 at 1,000 msg/s
        22 ms while 3 GB were written back, 4 to 6 ms after a sync).  It
        fell on B3's first load after B2's drains: p99 10.8 ms, the tuned
        poller's 11.7."""
        self.db.run("TRUNCATE seed_message, tuned_message")
        self.db.run("VACUUM ANALYZE outbox_message, plain_message, app_user")
        self.db.run("CHECKPOINT")
        os.sync()

    # B2 ----------------------------------------------------------------------

    def enqueue_numbered(self, peer, topic, n):
        """B2's n numbered messages over 1,000 keys, in transactions of FILL_CHUNK."""
        for lo in range(1, n + 1, FILL_CHUNK):
            rows = f"generate_series({lo}, {min(lo + FILL_CHUNK - 1, n)}) i"
            self.db.run(enqueue_sql(peer, topic, B2_PAYLOAD, "'key-' || mod(i, 1000)", rows))

    def fill_backlog(self, peer, topic):
        n = self.size["backlog"]
        begin = time.monotonic()
        self.enqueue_numbered(peer, topic, n)
        rate = n / (time.monotonic() - begin)
        progress(f"B2 {peer}: {n:,} messages committed ({rate:,.0f}/s); vacuum, checkpoint")
        # As autovacuum would have, in an outage long enough to pile up this
        # much.  (B1's drain after a short pause shows a table not analyzed.)
        self.db.run(f"VACUUM ANALYZE {TABLE[peer]}")
        self.db.run("CHECKPOINT")

    def watch_drain(self, peer, topic, target, window=None):
        """Msg/s into Kafka, from the first record of the topic to the
        target's (or to the end of the window), read from its offsets; and the
        msg/s of each segment of the drain (see segment_rates())."""
        wait_until(f"B2 {peer}: first record in Kafka", lambda: self.kafka.count(topic) > 0, 120, 0.02)
        t0, c0 = time.monotonic(), self.kafka.count(topic)
        t, c, shown = t0, c0, t0
        observed = [(t0, c0)]
        while c < target and not (window and t - t0 >= window):
            if t - t0 > 1800:
                raise Broken(f"B2 {peer}: {c:,} of {target:,} in Kafka after 30 minutes")
            time.sleep(0.05)
            t, c = time.monotonic(), self.kafka.count(topic)
            observed.append((t, c))
            if t - shown >= 5:
                shown = t
                progress(f"B2 {peer}: {c:,} in Kafka ({(c - c0) / (t - t0):,.0f} msg/s)")
        return (c - c0) / (t - t0), segment_rates(observed, self.size["segment"])

    def check_topic(self, peer, topic, expected):
        records, distinct = self.kafka.distinct_seqs(topic)
        if records != expected or distinct != expected:
            raise Broken(f"B2 {peer}: Kafka holds {records:,} records, {distinct:,} distinct,"
                         f" of {expected:,} messages published")
        progress(f"B2 {peer}: Kafka holds the {expected:,} messages, each once")

    def b2(self):
        result = {"rate": {}, "segments": {}, "rss": {}, "cpu": {}}
        self.b2_ours(result)
        self.b2_tuned(result)
        self.b2_seed(result)
        self.results["b2"] = result
        self.clean()

    def b2_ours(self, result):
        n = self.size["backlog"]
        self.worker.pause()
        self.fill_backlog("ours", "bench.b2.ours")
        pids = self.worker.pids()
        for pid in pids:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")         # VmHWM from now on: B2's peak, not an earlier one
        result["private"] = 0
        sampling = threading.Event()

        def sample_private_memory():
            # VmHWM counts the shared buffers the worker touched; RssAnon is its own.
            # The resume starts a new Kafka process: the pids are read again each time.
            while not sampling.wait(0.2):
                result["private"] = max(result["private"],
                                        sum(read_status(p, "RssAnon") for p in self.worker.pids()))
        sampler = threading.Thread(target=sample_private_memory)
        sampler.start()
        begin, cpu = time.monotonic(), cpu_seconds(pids)
        self.worker.resume()
        result["rate"]["ours"], result["segments"]["ours"] = self.watch_drain("ours", "bench.b2.ours", n)
        self.worker.wait_drained(60)
        # The Kafka process of the pause ended at the resume: its CPU moved
        # into the worker's cutime, and the new one's is counted whole.
        result["cpu"]["ours"] = cpu_seconds(self.worker.pids()) - cpu
        sampling.set()
        sampler.join()
        result["rss"]["ours"] = sum(read_status(p, "VmHWM") for p in self.worker.pids())
        progress(f"B2 ours: {result['rate']['ours']:,.0f} msg/s; outbox empty"
                 f" {time.monotonic() - begin:.1f} s after the reload")
        dead = self.db.value("SELECT count(*) FROM outbox_dead_letter")
        if dead:
            raise Broken(f"B2 ours: {dead} dead letters")
        self.check_topic("ours", "bench.b2.ours", n)

    def b2_tuned(self, result):
        n = self.size["backlog"]
        self.fill_backlog("tuned", "bench.b2.tuned")
        poller = Peer("tuned", self.args)
        pids = poller.pids(self.db)
        cpu = cpu_seconds(pids)
        result["rate"]["tuned"], result["segments"]["tuned"] = self.watch_drain("tuned", "bench.b2.tuned", n)
        wait_until("B2 tuned: table empty", lambda: self.db.value(BACKLOG["tuned"]) == 0, 60, 0.2)
        result["cpu"]["tuned"] = cpu_seconds(pids) - cpu
        result["rss"]["tuned"] = poller.peak_rss_kb()
        poller.stop()
        progress(f"B2 tuned: {result['rate']['tuned']:,.0f} msg/s")
        self.check_topic("tuned", "bench.b2.tuned", n)

    def b2_seed(self, result):
        """The seed poller would take long: its rate over a window."""
        n, window = self.size["backlog"], self.size["seed_window"]
        self.fill_backlog("seed", "bench.b2.seed")
        poller = Peer("seed", self.args)
        result["rate"]["seed"], _ = self.watch_drain("seed", "bench.b2.seed", n, window=window)
        result["rss"]["seed"] = poller.peak_rss_kb()
        poller.stop()
        sent = self.db.value("SELECT count(*) FROM seed_message WHERE status = 'SENT'")
        progress(f"B2 seed: {result['rate']['seed']:,.0f} msg/s over {window} s;"
                 f" {n:,} would take it {hours(n / result['rate']['seed'])}")
        self.check_topic("seed", "bench.b2.seed", sent)

    # B1 ----------------------------------------------------------------------

    def b1(self):
        """Rounds of every variant in turn, so that drift hits them alike,
        after an unmeasured run of the worker publishing (B1_WARMUP)."""
        scripts = {name: b1_script(statements) for name, statements in B1_VARIANTS.items()}
        scripts[B1_PAUSED] = scripts[B1_PUBLISHING]
        tps = {name: [] for name in scripts}
        cpu = {name: 0.0 for name in scripts}      # seconds used by what publishes meanwhile
        drains = []
        self.pgbench(scripts[B1_PUBLISHING], B1_WARMUP)
        self.worker.wait_drained(60)
        self.clean()
        for round_ in range(self.size["b1_rounds"]):
            for name, script in scripts.items():
                if name == B1_PAUSED:
                    self.worker.pause()
                poller, sides = self.start_publisher(name)
                publisher = [pid for side in PUBLISHER_SIDES for pid in sides[side]]
                before = cpu_seconds(publisher)
                tps[name].append(self.pgbench(script, self.size["b1_seconds"])["tps"])
                cpu[name] += cpu_seconds(publisher) - before
                progress(f"B1 round {round_ + 1}: {name}: {tps[name][-1]:,.0f} TPS")
                if poller:
                    self.wait_table_drained("tuned", "B1")
                    poller.stop()
                if name == B1_PAUSED:
                    drains.append(self.drain_after_pause())
        seconds = self.size["b1_seconds"] * self.size["b1_rounds"]
        self.results["b1"] = {name: (sum(values) / len(values), cpu[name] / seconds)
                              for name, values in tps.items()}
        self.results["b1_drains"] = drains
        self.clean()

    def b1d(self):
        """Rounds of every B1D variant in turn, as B1's.  What publishes a
        variant's messages is counted from the start of its load to the
        moment they are all in Kafka, CPU and WAL alike."""
        debezium = Debezium(self.args, self.db)
        self.db.run("SELECT outbox_capture(%s)", (B1D_TABLES["capture"],))
        tps, cpu, wal, server = ({name: [] for name in B1D_VARIANTS} for _ in range(4))
        self.pgbench(b1_script(B1_VARIANTS[B1_PUBLISHING]), B1_WARMUP)
        self.worker.wait_drained(60)
        self.b1d_clean()
        for round_ in range(self.size["b1d_rounds"]):
            for name, (publisher, statements) in B1D_VARIANTS.items():
                if publisher == "debezium":
                    base = self.b1d_records()
                    debezium.run("start")
                    warmup = self.pgbench(b1_script(statements), B1_WARMUP)
                    self.b1d_wait_debezium(base + 2 * warmup["processed"])
                    self.b1d_clean()    # every variant's load starts after a checkpoint
                pids = {"ours": self.worker.pids, "debezium": debezium.pids}.get(publisher, list)()
                before = (cpu_seconds(pids), self.db.value("SELECT pg_current_wal_lsn()"), self.b1d_records(),
                          self.server_cpu())
                figures = self.pgbench(b1_script(statements), self.size["b1_seconds"])
                if publisher == "ours":
                    self.worker.wait_drained(120)
                elif publisher == "debezium":
                    self.b1d_wait_debezium(before[2] + 2 * figures["processed"])
                tps[name].append(figures["tps"])
                cpu[name].append(cpu_seconds(pids) - before[0])
                wal[name].append(self.db.value("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)",
                                               (before[1],)) / figures["processed"])
                server[name].append((self.server_cpu() - before[3]) / figures["processed"])
                if publisher == "debezium":
                    debezium.run("drop")
                progress(f"B1D round {round_ + 1}: {name}: {tps[name][-1]:,.0f} TPS,"
                         f" {wal[name][-1]:,.0f} WAL bytes per transaction")
                self.b1d_clean()
        seconds = self.size["b1_seconds"] * self.size["b1d_rounds"]
        self.results["b1d"] = {name: {"tps": statistics.median(tps[name]), "cores": sum(cpu[name]) / seconds,
                                      "wal": statistics.median(wal[name]),
                                      "server": statistics.median(server[name])} for name in B1D_VARIANTS}

    def server_cpu(self):
        """CPU seconds of the database server: the postmaster and every
        process below it (backends, workers, their Kafka processes,
        walsenders), and of those that ended."""
        if not hasattr(self, "postmaster"):
            with open(os.path.join(self.db.value("SHOW data_directory"), "postmaster.pid")) as pidfile:
                self.postmaster = int(pidfile.readline())
        return sum(process_cpu(pid) for pid in descendants(self.postmaster))

    def b1d_records(self):
        return sum(self.kafka.count(topic) for topic in B1D_TOPICS)

    def b1d_wait_debezium(self, n):
        """Until the B1D topics hold n records."""
        wait_until("Debezium's records in Kafka", lambda: self.b1d_records() >= n, 300, 0.2)

    def b1d_clean(self):
        self.db.run(f"TRUNCATE {', '.join(B1D_TABLES.values())}, plain_message")
        self.clean()

    def b1d_report(self, b1d):
        alone = b1d["business transaction alone"]
        rows = [("B1D variant", "TPS (median)", "of the transaction alone", "publisher cores",
                 "server CPU added / message, us", "WAL bytes / transaction", "WAL added / message")]
        for name, r in b1d.items():
            added = r is not alone
            rows.append((name, f"{r['tps']:,.0f}", f"{r['tps'] / alone['tps']:.2f}", f"{r['cores']:.2f}",
                         f"{(r['server'] - alone['server']) / 2 * 1e6:,.1f}" if added else "",
                         f"{r['wal']:,.0f}", f"{(r['wal'] - alone['wal']) / 2:,.0f}" if added else ""))
        notes = ["  publisher cores: CPU seconds of what publishes (our worker and its Kafka process;"
                 " Debezium's JVM and its walsender) from each load's start until its messages are in"
                 " Kafka, over the loads' seconds; WAL from the same start to the same end",
                 "  server CPU added per message: the database server's CPU (backends, our worker and"
                 " its Kafka process, Debezium's walsender; not Debezium's JVM) over the same span,"
                 " per transaction, less the transaction alone's, over its 2 messages"]
        return table(rows) + notes

    def start_publisher(self, variant):
        """B1 and B1R: what publishes a variant's messages while its load
        runs, and whose CPU is counted: (the tuned poller, started for it, or
        None; {side: pids}, the sides of PUBLISHER_SIDES: our worker, a
        backend, and its Kafka process, or the tuned poller's backend and the
        poller's own process; none for the other variants)."""
        if variant == B1_TUNED:
            poller = Peer("tuned", self.args)
            return poller, {"backend": poller.backend_pids(self.db), "producer": [poller.process.pid]}
        if variant == B1_PUBLISHING:
            # After a pause the worker starts its Kafka process anew: count it from the start.
            wait_until("the worker and its Kafka process", lambda: self.worker.kafka_pids(), 30)
            return None, {"backend": self.worker.backend_pids(), "producer": self.worker.kafka_pids()}
        return None, {side: [] for side in PUBLISHER_SIDES}

    def wait_table_drained(self, peer, what, timeout=300):
        wait_until(f"{what}: {TABLE[peer]} drained", lambda: self.db.value(BACKLOG[peer]) == 0, timeout, 0.2)

    def b1r(self):
        """B1's transaction at fixed rates, ours and the tuned poller in turn
        at each rate, in rounds.  Per rate and publisher: messages committed,
        msg/s committed (the mean of the rounds), and the CPU of what
        publishes, by side (PUBLISHER_SIDES), from the load's start until its
        table is empty again, so that the messages left at the load's end are
        counted with theirs."""
        per_transaction = len(B1_MESSAGES)
        result = {rate: {peer: {"messages": 0, "cpu": dict.fromkeys(PUBLISHER_SIDES, 0.0), "seconds": 0.0,
                                "committed": []}
                         for peer in B1R_VARIANTS} for rate in B1R["rates"]}
        for rate in B1R["rates"]:
            for round_ in range(self.size["b1_rounds"]):
                for peer, (variant, settings) in B1R_VARIANTS.items():
                    table_of = "tuned" if variant == B1_TUNED else "ours"
                    configured = {name: self.db.value("SELECT current_setting(%s)", (name,))
                                  for name in settings}
                    for name, value in settings.items():
                        self.reload_setting(name, value)
                    poller, sides = self.start_publisher(variant)
                    before = {side: cpu_seconds(pids) for side, pids in sides.items()}
                    began = time.monotonic()
                    figures = self.pgbench(b1_script(B1_VARIANTS[variant]), self.size["b1_seconds"],
                                           rate=rate // per_transaction)
                    self.wait_table_drained(table_of, f"B1R {peer} at {rate}/s")
                    for name in settings:
                        self.reload_setting(name, None, configured[name])
                    run = result[rate][peer]
                    cpu = 0.0
                    for side, pids in sides.items():
                        used = cpu_seconds(pids) - before[side]
                        run["cpu"][side] += used
                        cpu += used
                    run["seconds"] += time.monotonic() - began
                    run["messages"] += figures["processed"] * per_transaction
                    run["committed"].append(figures["tps"] * per_transaction)
                    if poller:
                        poller.stop()
                    progress(f"B1R round {round_ + 1} at {rate:,} msg/s: {peer}:"
                             f" {run['committed'][-1]:,.0f} msg/s committed,"
                             f" {cpu * 1e6 / (figures['processed'] * per_transaction):,.1f} us of CPU per message")
                    self.clean()
        self.results["b1r"] = result

    def b1r_report(self, b1r):
        out = ["", f"B1R the registration transaction at fixed rates: pgbench -R -c {CLIENTS} -j {JOBS},"
                   f" {self.size['b1_rounds']} round(s) of {self.size['b1_seconds']} s per publisher and rate,"
                   " in turn"]
        rows = [("offered", "committed msg/s", "reached", "messages", "publisher CPU, cores",
                 "CPU per message, us", "of which backend", "of which producer", "ours/tuned")]
        short = False
        for rate, by_peer in b1r.items():
            per_message = {peer: {side: cpu * 1e6 / run["messages"] for side, cpu in run["cpu"].items()}
                           for peer, run in by_peer.items()}
            total = {peer: sum(sides.values()) for peer, sides in per_message.items()}
            for peer, run in by_peer.items():
                committed = sum(run["committed"]) / len(run["committed"])
                reached = committed >= B1R["reached"] * rate
                short = short or not reached
                rows.append((f"{rate:,} msg/s: {peer}", f"{committed:,.0f}",
                             "yes" if reached else f"no ({committed / rate:.3f})", f"{run['messages']:,}",
                             f"{sum(run['cpu'].values()) / run['seconds']:.2f}", f"{total[peer]:,.1f}",
                             *(f"{per_message[peer][side]:,.1f}" for side in PUBLISHER_SIDES),
                             f"{total[peer] / total['tuned']:.2f}" if peer != "tuned" else ""))
        out += table(rows)
        out.append("  ours: 2 x outbox_enqueue, the worker publishing (wakes not coalesced:"
                   " outbox.max_wake_delay = 0); tuned: 2 x INSERT, the tuned poller publishing")
        out.append("  publisher CPU: our worker's and its Kafka process's, or the tuned poller's and its"
                   " backend's, from the load's start until its table is empty; per message: over the"
                   " messages committed; backend: our worker (its SQL, its wakes), or the tuned poller's"
                   " backend; producer: our Kafka process (librdkafka), or the tuned poller's own (Python,"
                   " psycopg2 and librdkafka); ours/tuned: CPU per message")
        if short:
            out.append(f"  reached: committed at least {B1R['reached']} of the offered rate; where not (the"
                       " fraction committed), pgbench fell behind its schedule: the machine could not commit"
                       " the rate while publishing it, and the CPU per message is that of the rate committed")
        return out

    def b1b(self):
        """Each way of enqueueing in bulk, in turn, with the worker paused;
        rows/s per way, the mean of the rounds."""
        n, chunk = self.size["b1b_rows"], self.size["b1b_chunk"]
        rates = {way: [] for way in B1B_WAYS}
        self.worker.pause()
        try:
            for round_ in range(B1B_ROUNDS):
                for way, statement in B1B_WAYS.items():
                    self.clean()
                    begin = time.monotonic()
                    for lo in range(1, n + 1, chunk):
                        rows = f"generate_series({lo}, {min(lo + chunk - 1, n)}) i"
                        self.db.run(statement.format(payload=B1B_PAYLOAD, rows=rows))
                    rates[way].append(n / (time.monotonic() - begin))
                    progress(f"B1B round {round_ + 1}: {way}: {rates[way][-1]:,.0f} rows/s")
                    self.db.run("TRUNCATE outbox_message, plain_message")
        finally:
            self.worker.resume()
        self.worker.wait_reachable()
        self.results["b1b"] = {way: sum(values) / len(values) for way, values in rates.items()}
        self.clean()

    def b1b_report(self, b1b):
        plain = b1b[B1B_PLAIN]
        out = ["", f"B1B bulk enqueue: {self.size['b1b_rows']:,} rows over 1,000 keys, in transactions of"
                   f" {self.size['b1b_chunk']:,} (one statement each), the worker paused;"
                   f" the mean of {B1B_ROUNDS} rounds, each way in turn"]
        out += table([("way", "rows/s", "vs plain INSERT", "target")] + [
            (way, f"{rate:,.0f}", f"{rate / plain:.2f}", ">= 0.8" if way == "outbox_enqueue()" else "")
            for way, rate in b1b.items()])
        return out

    def drain_after_pause(self):
        """Let the worker publish what waited while it was paused, as after a
        short broker outage; (messages, msg/s from its first publish to the
        last).  Unlike B2's backlog, nothing has analyzed the table since it
        filled."""
        backlog, published = self.db.value(BACKLOG["ours"]), self.worker.published()
        self.worker.resume()
        wait_until("worker publishing again", lambda: self.worker.published() > published, 60, 0.02)
        begin = time.monotonic()
        self.worker.wait_drained(600)
        rate = backlog / (time.monotonic() - begin)
        progress(f"B1: the worker published the {backlog:,} messages that waited at {rate:,.0f} msg/s")
        return backlog, rate

    # B3 ----------------------------------------------------------------------

    def latency_loads(self, what, loads, seconds, warmup=WARMUP, consumers=None):
        """Loads offered together by pgbench -R for warmup + seconds, each a
        (Database, peer, topic, msg/s, messages per transaction) enqueueing
        latency_script() into its database, read from its topic's end by a
        consumer of its own (or, given, started earlier, one per load, so
        that with no warm-up the consumer's own start is not counted); then
        up to the grace for their messages.  Per
        load: msg/s committed and delivered, whether its database kept up,
        and the latencies of the messages enqueued after the warm-up
        ("latencies", and their percentiles); "consumer", whose latencies()
        cuts them by other windows, and "from", the warm-up's end, epoch ms."""
        if consumers is None:
            consumers = [LatencyConsumer(self.kafka, topic) for _, _, topic, _, _ in loads]
            for consumer in consumers:
                consumer.start()
        begin, began = time.time() * 1000, time.monotonic()
        running = [self.pgbench(latency_script(peer, topic, per_transaction), seconds + warmup,
                                rate=rate // per_transaction, background=True, dsn=db.dsn)
                   for db, peer, topic, rate, per_transaction in loads]
        figures = [self.finish_pgbench(load) for load in running]
        committed = [load["processed"] * per_transaction
                     for load, (_, _, _, _, per_transaction) in zip(figures, loads)]
        # Behind: more than a second's worth of messages still unpublished in
        # the load's database when the loads ended.  Its latencies then only
        # say how long the load ran.
        backlog = {(db.name, peer): db.value(BACKLOG[peer]) for db, peer, _, _, _ in loads}
        offered = {key: sum(rate for db, peer, _, rate, _ in loads if (db.name, peer) == key)
                   for key in backlog}
        deadline = time.monotonic() + self.size["grace"]
        while (any(len(c.samples) < n for c, n in zip(consumers, committed))
               and time.monotonic() < deadline):
            time.sleep(0.1)
        for consumer, n, (db, peer, topic, _, _) in zip(consumers, committed, loads):
            # Everything published, but not yet all consumed: a little longer.
            if len(consumer.samples) < n and db.value(BACKLOG[peer]) == 0:
                wait_until(f"{what}: {n:,} committed to {topic}, consumed",
                           lambda: len(consumer.samples) >= n, 10)
        for consumer in consumers:
            consumer.stop()
        elapsed = time.monotonic() - began
        results = []
        for consumer, n, load, (db, peer, topic, _, per_transaction) in zip(consumers, committed, figures,
                                                                            loads):
            received = len(consumer.samples)
            if received > n:
                raise Broken(f"{what}: {n:,} committed to {topic}, {received:,} in Kafka")
            key = (db.name, peer)
            latencies = consumer.latencies(enqueued_after=begin + warmup * 1000)
            results.append({"messages": n, "committed": load["tps"] * per_transaction,
                            "delivered": received / elapsed,
                            "kept_up": backlog[key] <= offered[key], "backlog": backlog[key],
                            "latencies": latencies, **(percentiles(latencies) or {}),
                            "consumer": consumer, "from": begin + warmup * 1000})
        return results

    def latency_run(self, peer, rate, part="B3", background=contextlib.nullcontext):
        """B3's load at a rate, published by a peer, into the part's topic;
        around the load, the context manager that background() makes (B3BG),
        whose figures go into the result's "background"."""
        poller = Peer(peer, self.args) if peer != "ours" else None
        with background() as activity:
            result, = self.latency_loads(f"{part} {peer} at {rate}/s",
                                         [(self.db, peer, f"bench.{part.lower()}.{peer}.{rate}", rate,
                                           B3_RATES[rate])],
                                         self.size["b3_seconds"])
        result["background"] = activity
        if poller:
            poller.stop()
        progress(f"{part} {peer} at {rate}/s: " + latency_summary(result))
        self.clean()
        return result

    def floor_run(self, rate, part="B3", background=contextlib.nullcontext, burst=0, burst_round=0):
        """The same consumer on messages produced straight to Kafka (floor.py);
        background as latency_run's.  With a burst, B3's after a burst (its
        round burst_round): that many messages produced first, and the
        load's first B3_AFTER_BURST seconds counted."""
        topic = f"bench.{part.lower()}.floor.{rate}" + (f".burst.{burst_round}" if burst else "")
        seconds = B3_AFTER_BURST if burst else self.size["b3_seconds"] + WARMUP
        consumer = LatencyConsumer(self.kafka, topic)
        consumer.start()
        with background() as activity:
            begin = time.time() * 1000
            subprocess.run([PYTHON, os.path.join(HERE, "floor.py"), "--brokers", self.args.brokers,
                            "--topic", topic, "--rate", str(rate), "--seconds", str(seconds),
                            "--per-transaction", str(B3_RATES[rate]),
                            "--burst", str(burst), "--burst-topic", f"bench.b3.floor.burst.{burst_round}"],
                           check=True)
            wait_until(f"{part} floor at {rate}/s: every message consumed",
                       lambda: len(consumer.samples) >= int(rate * seconds), 30)
        consumer.stop()
        counted_from = begin + (0 if burst else WARMUP * 1000)
        stats = percentiles(consumer.latencies(enqueued_after=counted_from))
        progress("%s floor at %d/s: p50 %.1f ms, p99 %.1f ms, max %.1f ms"
                 % (part, rate, stats["p50"], stats["p99"], stats["max"]))
        return {**stats, "background": activity, "consumer": consumer, "from": counted_from}

    def b3(self):
        # The broker's JVM compiles its produce and fetch paths under the
        # first load it serves: without this, B3 run alone (BENCH_ONLY=B3)
        # had ours, the first peer, pay for it.
        self.latency_loads("B3 warm-up", [(self.db, "ours", "bench.b3.warmup", 10000, B3_RATES[10000])],
                           B1_WARMUP)
        self.clean()
        self.results["b3"] = {rate: {peer: self.latency_run(peer, rate) for peer in PEERS}
                              for rate in B3_RATES}
        self.results["floor"] = {rate: self.floor_run(rate) for rate in B3_RATES}
        self.results["b3_burst"] = self.b3_after_bursts()

    def b3_after_bursts(self):
        """B3_BURST_ROUNDS rounds of B3 after a burst, ours then the floor's:
        the round of median p99 of each, with every round's p99."""
        n = self.size["b3_burst"]
        ours, floors = [], []
        for r in range(B3_BURST_ROUNDS):
            ours.append(self.b3_after_burst(r))
            floors.append(self.floor_run(1000, burst=n, burst_round=r))
        median = lambda runs: sorted(runs, key=lambda run: run["p99"])[len(runs) // 2]
        return {**median(ours), "p99s": [run["p99"] for run in ours],
                "floor": {**median(floors), "p99s": [run["p99"] for run in floors]}}

    def b3_after_burst(self, burst_round):
        """B3's load at 1,000 msg/s, ours, started once a burst is in Kafka.
        The load's topic has had a message first, before the burst: an
        application's topics are ones the worker publishes to, and the first
        message to a topic waits for the producer to look up its partitions
        (0.2 s here), which is not what this part measures.  floor.py does
        the same for its own topic.  And the consumer starts before the
        burst, as the floor's does: a consumer's first fetches, in the
        load's first second, would count against ours alone."""
        n = self.size["b3_burst"]
        topic, load_topic = f"bench.b3.burst.{burst_round}", f"bench.b3.burst.1000.{burst_round}"
        self.db.run(enqueue_sql("ours", load_topic, B3_PAYLOAD, "'first'", "generate_series(1, 1)"))
        wait_until(f"B3 burst: a first message in {load_topic}", lambda: self.kafka.count(load_topic) > 0, 30, 0.02)
        consumer = LatencyConsumer(self.kafka, load_topic)
        consumer.start()
        begin = time.monotonic()
        self.enqueue_numbered("ours", topic, n)
        wait_until(f"B3 burst: {n:,} messages in Kafka", lambda: self.kafka.count(topic) >= n, 300, 0.02)
        progress(f"B3 burst: {n:,} messages enqueued and in Kafka in {time.monotonic() - begin:.1f} s")
        result, = self.latency_loads("B3 ours at 1000/s after a burst",
                                     [(self.db, "ours", load_topic, 1000, 1)],
                                     B3_AFTER_BURST, warmup=0, consumers=[consumer])
        progress("B3 ours at 1000/s after a burst: " + latency_summary(result))
        self.clean()
        return result

    # B3BG --------------------------------------------------------------------

    @contextlib.contextmanager
    def background_prepared(self):
        """What background() needs: bg_account filled, and the settings of
        B3BG applied, until the end of the with block."""
        self.db.run("TRUNCATE bg_account")
        self.db.run("INSERT INTO bg_account SELECT i, 0, repeat('x', 100)"
                    f" FROM generate_series(1, {B3BG['rows']}) i")
        self.db.run("VACUUM ANALYZE bg_account")
        # Its autovacuum settings, from schema.sql, for the report.
        self.results["b3bg_reloptions"] = self.db.value(
            "SELECT array_to_string(reloptions, ', ') FROM pg_class WHERE oid = 'bg_account'::regclass")
        settings = {"checkpoint_timeout": f"{B3BG['checkpoint_timeout']}s",
                    "autovacuum_naptime": f"{B3BG['autovacuum_naptime']}s"}
        configured = {name: self.db.value("SELECT current_setting(%s)", (name,)) for name in settings}
        try:
            for name, value in settings.items():
                self.reload_setting(name, value)
            yield
        finally:
            for name in settings:
                self.reload_setting(name, None, configured[name])

    def b3bg(self):
        """B3's loads, ours, the tuned poller's and the floor's, each inside
        background()."""
        result = {rate: {} for rate in B3_RATES}
        with self.background_prepared():
            self.clean()
            for rate in B3_RATES:
                for peer in B3BG_PEERS:
                    result[rate][peer] = self.latency_run(peer, rate, "B3BG", self.background)
                result[rate]["floor"] = self.floor_run(rate, "B3BG", self.background)
                for peer, run in result[rate].items():
                    run.update(self.around_checkpoint(run))
                    progress(f"B3BG {peer} at {rate}/s: p99 %(checkpoint_p99).1f ms in the"
                             f" {B3BG['after_checkpoint']} s after the checkpoint began,"
                             " %(other_p99).1f ms otherwise" % run)
        self.results["b3bg"] = result

    @staticmethod
    def around_checkpoint(run):
        """The p99 of a B3BG run's messages enqueued in the B3BG["after_checkpoint"]
        seconds after the timed checkpoint began, and of the others."""
        began = run["background"]["checkpoint_began"]
        ended = began + B3BG["after_checkpoint"] * 1000
        consumer = run["consumer"]
        after = consumer.latencies(enqueued_after=began, enqueued_before=ended)
        other = sorted(consumer.latencies(enqueued_after=run["from"], enqueued_before=began)
                       + consumer.latencies(enqueued_after=ended))
        return {"checkpoint_p99": (percentiles(after) or {}).get("p99", math.nan),
                "other_p99": (percentiles(other) or {}).get("p99", math.nan)}

    @contextlib.contextmanager
    def background(self, load_seconds=None):
        """B3BG: around one measured load (WARMUP + b3_seconds, or load_seconds), the updates of
        bg_account, begun B3BG["lead"] s before it and ended B3BG["lag"] s
        after, and a timed checkpoint that begins in its middle: a CHECKPOINT
        restarts checkpoint_timeout's timer, then the load waits.  Yields a
        dict, filled once the updates ended: their TPS, what the
        BACKGROUND_ACTIVITY counters counted from the load's start to its end,
        and when the timed checkpoint was due to begin, epoch ms (the
        checkpointer counts in whole seconds: within a second of it)."""
        load_seconds = load_seconds or WARMUP + self.size["b3_seconds"]
        self.db.run("CHECKPOINT")
        timer = time.monotonic()
        checkpoint_began = (time.time() + B3BG["checkpoint_timeout"]) * 1000
        time.sleep(max(0.0, timer + B3BG["checkpoint_timeout"] - load_seconds / 2 - B3BG["lead"]
                       - time.monotonic()))
        updates = self.pgbench(B3BG_UPDATE.format(rows=B3BG["rows"]),
                               B3BG["lead"] + load_seconds + B3BG["lag"], rate=B3BG["tps"], background=True)
        time.sleep(B3BG["lead"])
        before = self.db.run(BACKGROUND_ACTIVITY)[0]
        stalled = {resource: stalled_microseconds(resource) for resource in PRESSURE}
        began = time.monotonic()
        activity = {}
        try:
            yield activity
            after = self.db.run(BACKGROUND_ACTIVITY)[0]
            elapsed = time.monotonic() - began
            for resource, name in PRESSURE.items():
                since = stalled[resource]
                activity[name] = (None if since is None
                                  else (stalled_microseconds(resource) - since) * 100 / (elapsed * 1e6))
        finally:
            tps = self.finish_pgbench(updates)["tps"]
        activity.update(zip(BACKGROUND_COUNTS, (a - b for a, b in zip(after, before))), tps=tps,
                        checkpoint_began=checkpoint_began)
        progress(f"B3BG background: {tps:,.0f} TPS of updates; during the load "
                 + ", ".join(f"{activity[count]:,} {count}" for count in BACKGROUND_COUNTS)
                 + "".join(f", {name} {activity[name]:.0f}" for name in PRESSURE.values()
                           if activity[name] is not None))

    def b3bg_report(self, b3bg, reloptions):
        seconds = self.size["b3_seconds"]
        out = ["", f"B3BG latency under background activity: B3's loads (pgbench -R, {seconds} s after"
                   f" {WARMUP:.0f} s of warm-up) while a second pgbench updates random rows of bg_account"
                   f" ({B3BG['rows']:,} rows) at {B3BG['tps']:,} TPS, from {B3BG['lead']} s before each load to"
                   f" {B3BG['lag']} s after; checkpoint_timeout {B3BG['checkpoint_timeout']} s, a timed"
                   " checkpoint begun in the load's middle; autovacuum_naptime"
                   f" {B3BG['autovacuum_naptime']} s, bg_account's own {reloptions}"]
        rows = [("load", "p50 ms", "p99 ms", "max ms", f"p99 ms, {B3BG['after_checkpoint']} s after checkpoint",
                 "p99 ms, other", "committed / delivered msg/s", "background TPS", *BACKGROUND_COUNTS,
                 *PRESSURE.values())]
        for rate, by_peer in b3bg.items():
            for peer in (*B3BG_PEERS, "floor"):
                result, activity = by_peer[peer], by_peer[peer]["background"]
                behind = not result.get("kept_up", True)
                rows.append((f"{rate:,} msg/s: {peer}",
                             *("behind" if behind else f"{result[stat]:,.1f}"
                               for stat in ("p50", "p99", "max", "checkpoint_p99", "other_p99")),
                             f"{result['committed']:,.0f} / {result['delivered']:,.0f}" if peer != "floor" else "",
                             f"{activity['tps']:,.0f}", *(f"{activity[count]:,}" for count in BACKGROUND_COUNTS),
                             *("-" if activity[name] is None else f"{activity[name]:.0f}"
                               for name in PRESSURE.values())))
        out += table(rows)
        out.append("  floor: floor.py produces straight to Kafka, no database, the same consumer; p99 after"
                   " checkpoint: of the messages enqueued in the %d s after the timed checkpoint began (due"
                   " checkpoint_timeout after a CHECKPOINT), other: of the rest; background TPS: the updates'"
                   " (offered: %s); checkpoints (timed and requested), the buffers they wrote, autovacuums and"
                   " autoanalyzes of bg_account: counted from the load's start to its end; CPU and I/O"
                   " pressure: the share of the load's time in which some task of the machine, the bench's or"
                   " another's, waited for a CPU or for I/O (/proc/pressure)"
                   % (B3BG["after_checkpoint"], f"{B3BG['tps']:,}"))

        def target(rate):
            if "over_floor" in B3BG_TARGETS[rate]:
                return f"ours p99 <= floor p99 + {B3BG_TARGETS[rate]['over_floor']} ms"
            return f"ours p99 <= {B3BG_TARGETS[rate]['p99']} ms"

        def met(rate):
            ours, floor = b3bg[rate]["ours"], b3bg[rate]["floor"]
            if not ours["kept_up"]:
                return "no (behind)"
            limit = B3BG_TARGETS[rate].get("p99") or floor["p99"] + B3BG_TARGETS[rate]["over_floor"]
            return "yes" if ours["p99"] <= limit else "no"

        out += ["", "B3BG targets (evaluated, not asserted)"]
        rows = [("load", "ours p99 ms", "tuned p99 ms", "floor p99 ms", "ours - floor p99 ms", "target", "met")]
        for rate, by_peer in b3bg.items():
            ours, tuned, floor = (by_peer[peer] for peer in ("ours", "tuned", "floor"))
            rows.append((f"{rate:,} msg/s", *(f"{r['p99']:,.1f}" if r.get("kept_up", True) else "behind"
                                              for r in (ours, tuned, floor)),
                         f"{ours['p99'] - floor['p99']:+,.1f}" if ours["kept_up"] else "", target(rate), met(rate)))
        return out + table(rows)

    # B4 ----------------------------------------------------------------------

    def b4(self):
        topic = "bench.b4.ours"
        # The outbox is empty, but B2's million rows left its files large:
        # start from nothing, so that the series shows any growth.
        self.db.run("VACUUM FULL outbox_message")
        consumer = LatencyConsumer(self.kafka, topic)
        consumer.start()
        load = self.pgbench(latency_script("ours", topic, 1), SOAK["seconds"], rate=SOAK["rate"],
                            background=True)
        begin, series, last = time.monotonic(), [], time.time() * 1000
        for i in range(1, SOAK["seconds"] // SOAK["every"] + 1):
            time.sleep(max(0.0, begin + i * SOAK["every"] - time.monotonic()))
            now = time.time() * 1000
            stats = percentiles(consumer.latencies(received_after=last))
            last = now
            size, dead = self.db.run(
                "SELECT pg_total_relation_size('outbox_message'), n_dead_tup"
                "  FROM pg_stat_user_tables WHERE relname = 'outbox_message'")[0]
            series.append((i * SOAK["every"], size, dead, stats["p99"] if stats else None))
            progress(f"B4 {series[-1][0]:4d} s: outbox_message {size / 1024:,.0f} kB,"
                     f" {dead:,} dead tuples, p99 {series[-1][3] or 0:.1f} ms")
        processed = self.finish_pgbench(load)["processed"]
        self.worker.wait_drained(60)
        wait_until("B4: every message consumed", lambda: len(consumer.samples) >= processed, 30)
        consumer.stop()
        if len(consumer.samples) != processed:
            raise Broken(f"B4: {processed:,} committed, {len(consumer.samples):,} in Kafka")
        self.results["b4"] = series

    # B5 ----------------------------------------------------------------------

    def b5(self):
        hold = B5["soak_hold"] if self.args.soak else self.size["b5_hold"]
        self.results["b5"] = {"hold": hold, **{peer: self.held_horizon_run(peer, hold) for peer in B5_PEERS}}

    def footprint(self, peer):
        size, dead = self.db.run(FOOTPRINT, {"table": TABLE[peer]})[0]
        return {"size": size, "dead": dead}

    def held_horizon_run(self, peer, hold):
        """The load, a baseline, the hold in windows, then the load without the
        hold; each window's latencies are those of the messages enqueued in it."""
        topic = f"bench.b5.{peer}"
        # Start from empty files, as B4: what earlier parts left would hide any growth.
        self.db.run(f"VACUUM FULL {TABLE[peer]}")
        self.clean()
        poller = Peer(peer, self.args) if peer != "ours" else None
        consumer = LatencyConsumer(self.kafka, topic)
        consumer.start()
        # The load outlasts the watch by a second, so that the watch ends under load.
        seconds = B5["warmup"] + B5["baseline"] + hold + B5["after"] + 1
        begin, began = time.time() * 1000, time.monotonic()
        load = self.pgbench(latency_script(peer, topic, 1), seconds, rate=B5["rate"], background=True)

        def sleep_until(moment):
            time.sleep(max(0.0, moment - time.monotonic()))

        sleep_until(began + B5["warmup"] + B5["baseline"])
        baseline = {"held": None, "from": begin + B5["warmup"] * 1000, **self.footprint(peer)}
        held = HeldSnapshot(self.args.dsn)
        baseline["to"] = held_from = time.time() * 1000
        windows = [baseline]
        progress(f"B5 {peer}: baseline {baseline['size'] / 2**20:,.1f} MiB, {baseline['dead']:,} dead tuples;"
                 f" holding the xmin horizon for {hold} s")
        for i in range(1, hold // B5["every"] + 1):
            sleep_until(held.began + i * B5["every"])
            window = {"held": i * B5["every"], "from": held_from + (i - 1) * B5["every"] * 1000,
                      "to": held_from + i * B5["every"] * 1000, "xmin_age": held.xmin_age(self.db),
                      **self.footprint(peer)}
            windows.append(window)
            so_far = consumer.latencies(enqueued_after=window["from"], enqueued_before=window["to"])
            stats = percentiles(so_far)
            progress(f"B5 {peer}: held {held.seconds():.0f} s, xmin age {window['xmin_age']:,}:"
                     f" {window['size'] / 2**20:,.1f} MiB, {window['dead']:,} dead tuples;"
                     f" {len(so_far):,} messages of the window received so far"
                     + (", p50 %(p50).1f ms, p99 %(p99).1f ms" % stats if stats else ""))
        # The size is read every second after the hold ends, shown every 10 s.
        ended, ended_at = time.time() * 1000, time.monotonic()
        held.end()
        after = []
        back = 0 if windows[-1]["size"] <= B5["back_within"] * baseline["size"] else None
        for second in range(1, B5["after"] + 1):
            sleep_until(ended_at + second)
            footprint = self.footprint(peer)
            if back is None and footprint["size"] <= B5["back_within"] * baseline["size"]:
                back = second
            if second % B5["after_every"] == 0:
                after.append((second, footprint["size"]))
                progress(f"B5 {peer}: {second} s after the hold, {footprint['size'] / 2**20:,.1f} MiB,"
                         f" {footprint['dead']:,} dead tuples")
        processed = self.finish_pgbench(load)["processed"]
        if poller:
            wait_until(f"B5 {peer}: table empty", lambda: self.db.value(BACKLOG[peer]) == 0, 60, 0.2)
            poller.stop()
        else:
            self.worker.wait_drained(60)
        wait_until(f"B5 {peer}: every message consumed", lambda: len(consumer.samples) >= processed, 30)
        consumer.stop()
        if len(consumer.samples) != processed:
            raise Broken(f"B5 {peer}: {processed:,} committed, {len(consumer.samples):,} in Kafka")
        for window in windows:
            window.update(percentiles(consumer.latencies(enqueued_after=window["from"],
                                                         enqueued_before=window["to"])) or {})
        after_stats = percentiles(consumer.latencies(enqueued_after=ended)) or {}
        progress(f"B5 {peer}: p99 {baseline.get('p99', 0):.1f} ms before the hold,"
                 f" {windows[-1].get('p99', 0):.1f} ms in its last window;"
                 f" size back within {B5['back_within']}x of the baseline: "
                 + (f"after {back} s" if back is not None else f"not within {B5['after']} s"))
        self.clean()
        return {"windows": windows, "after": after, "after_stats": after_stats, "back": back}

    # B6 ----------------------------------------------------------------------

    def b6(self):
        """A load into each database, published by the database's own worker;
        then as many loads into the DSN's database, published by its worker
        alone; both warmed up first, unmeasured."""
        dbs = [self.db] + [Database(psycopg2.extensions.make_dsn(self.args.dsn, dbname=name))
                           for name in self.args.more_databases]
        if len(dbs) < 2:
            raise Broken("B6: no other database (--more-databases)")
        wait_until("B6: a worker per database", lambda: set(self.published_by_database())
                   >= {db.name for db in dbs}, 30)
        seconds = self.size["b6_seconds"]
        variants = {"apart": [(db, f"bench.b6.{db.name}") for db in dbs],
                    "together": [(self.db, f"bench.b6.one.{n}") for n in range(1, len(dbs) + 1)]}

        def clean():
            for db in dbs[1:]:
                db.run("VACUUM ANALYZE outbox_message")
            self.clean()

        clean()
        for variant, loads in variants.items():
            self.latency_loads(f"B6 {variant} warm-up",
                               [(db, "ours", topic, B6["rate"], 1) for db, topic in loads],
                               self.size["b6_warmup"], 0)
            progress(f"B6 {variant}: warmed up")
            clean()
        self.results["b6"] = {"seconds": seconds, "warmup": self.size["b6_warmup"]}
        for variant, loads in variants.items():
            published = self.published_by_database()
            # The workers of every database and their Kafka processes.
            pids = [pid for db in dbs for pid in Worker(db).pids()]
            cpu, began = cpu_seconds(pids), time.monotonic()
            results = self.latency_loads(f"B6 {variant}",
                                         [(db, "ours", topic, B6["rate"], 1) for db, topic in loads],
                                         seconds)
            cores = (cpu_seconds(pids) - cpu) / (time.monotonic() - began)
            for db in dbs:
                wait_until(f"B6 {variant}: {db.name} drained",
                           lambda: db.value(BACKLOG["ours"]) == 0, 60, 0.2)
            # What each database's worker published meanwhile.
            published = {name: count - published.get(name, 0)
                         for name, count in self.published_by_database().items()}
            for (db, topic), result in zip(loads, results):
                progress(f"B6 {variant}: {db.name} to {topic}: " + latency_summary(result))
            self.results["b6"][variant] = {
                "loads": [(db.name, result) for (db, _), result in zip(loads, results)],
                "all": percentiles(sorted(x for result in results for x in result["latencies"])) or {},
                "published": published, "cores": cores}
            clean()

    def published_by_database(self):
        """{database: messages its worker published}, for every database
        that a running worker serves."""
        return dict(self.db.run("SELECT database, published FROM outbox_worker WHERE pid IS NOT NULL"))

    # the report ----------------------------------------------------------------

    # B7 ----------------------------------------------------------------------

    def reload_setting(self, name, value, shown=None):
        """ALTER SYSTEM SET a setting to value (RESET it if value is None),
        reload, and wait until a new session shows it as shown (the value, by
        default; current_setting()'s text): the postmaster has read the file
        and signalled its children (the worker, the checkpointer, the
        autovacuum launcher), which read it at once."""
        if value is None:
            self.db.run(f"ALTER SYSTEM RESET {name}")
        else:
            self.db.run(f"ALTER SYSTEM SET {name} = %s", (value,))
        self.db.run("SELECT pg_reload_conf()")
        shown = value if shown is None else shown
        wait_until(f"{name} = '{shown}'", lambda: Database(self.args.dsn).value(
            "SELECT current_setting(%s)", (name,)) == shown, 10)

    def standby_slots(self, value):
        """Set outbox.synchronized_standby_slots for the server; the load's
        warm-up, not counted, follows."""
        self.reload_setting("outbox.synchronized_standby_slots", value)

    def b7(self):
        standby = Standby(self.args, self.db, B7["slot"])
        result = {rate: {} for rate in B3_RATES}
        try:
            self.clean()
            for variant in B7["variants"]:
                self.standby_slots(B7["slot"] if variant == "on" else "")
                for rate in B3_RATES:
                    what = f"B7 slots {variant} at {rate}/s"
                    result[rate][variant], = self.latency_loads(
                        what, [(self.db, "ours", f"bench.b7.{variant}.{rate}", rate, B3_RATES[rate])],
                        self.size["b3_seconds"])
                    progress(f"{what}: " + latency_summary(result[rate][variant]))
                    self.clean()
        finally:
            self.standby_slots("")
            standby.stop()
        self.results["b7"] = result

    @staticmethod
    def b7_report(b7, seconds):
        out = ["", "B7 outbox.synchronized_standby_slots: B3's loads (pgbench -R, %d s after %.0f s of"
                   " warm-up) with an asynchronous streaming standby on a physical slot; the worker"
                   " publishes without waiting for it (off), then only what it has flushed (on)"
                   % (seconds, WARMUP)]
        rows = [("load", "slots off p50", "p99", "slots on p50", "p99", "p99 on/off")]
        for rate, by_variant in b7.items():
            off, on = by_variant["off"], by_variant["on"]
            if not (off["kept_up"] and on["kept_up"]):
                rows.append((f"{rate:,} msg/s", *(["behind"] * 4), ""))
                continue
            rows.append((f"{rate:,} msg/s", f"{off['p50']:,.1f}", f"{off['p99']:,.1f}",
                         f"{on['p50']:,.1f}", f"{on['p99']:,.1f}", f"{on['p99'] / off['p99']:.2f}"))
        return out + table(rows)

    # B12 ---------------------------------------------------------------------

    def b12(self):
        """B2's drain and B3's loads, quiet and under background(), with each
        of B12's outbox.delivery variants in turn."""
        result = {"drain": {}, "latency": {}}
        try:
            with self.background_prepared():
                # as B3: the broker's JIT warmed before the first load measured
                self.latency_loads("B12 warm-up", [(self.db, "ours", "bench.b3.warmup", 10000,
                                                     B3_RATES[10000])], B1_WARMUP)
                self.clean()
                for variant in B12["variants"]:
                    self.reload_setting("outbox.delivery", variant)
                    result["drain"][variant] = self.b12_drain(variant)
                    for where in B12["wheres"]:
                        for rate in B3_RATES:
                            result["latency"][(variant, where, rate)] = self.b12_load(variant, where, rate)
        finally:
            self.reload_setting("outbox.delivery", None, "at_least_once")
        self.results["b12"] = result

    def b12_drain(self, variant):
        """B2's drain, timed from the first record in Kafka to the outbox
        empty: a topic's offsets count commit markers too."""
        n = self.size["backlog"]
        topic = f"bench.b12.{variant}.drain"
        self.worker.pause()
        self.fill_backlog("ours", topic)
        self.worker.resume()
        wait_until(f"B12 {variant}: first record in Kafka", lambda: self.kafka.count(topic) > 0, 120, 0.02)
        begin = time.monotonic()
        wait_until(f"B12 {variant}: outbox drained", lambda: self.db.value(BACKLOG["ours"]) == 0, 1800, 0.05)
        rate = n / (time.monotonic() - begin)
        self.check_topic("ours", topic, n)
        progress(f"B12 {variant}: drain {rate:,.0f} msg/s")
        self.clean()
        return rate

    def b12_load(self, variant, where, rate):
        what = f"B12 {variant}, {where}, at {rate}/s"
        background = self.background if where == "background" else contextlib.nullcontext
        with background():
            run, = self.latency_loads(what, [(self.db, "ours", f"bench.b12.{variant}.{where}.{rate}",
                                              rate, B3_RATES[rate])],
                                      self.size["b3_seconds"])
        progress(f"{what}: " + latency_summary(run))
        self.clean()
        return run

    @staticmethod
    def b12_report(b12, seconds):
        out = ["", "B12 exactly-once publication: B2's drain (ours), and B3's loads (pgbench -R, %d s"
                   " after %.0f s of warm-up) quiet and under B3BG's background, with outbox.delivery ="
                   " at_least_once, then exactly_once" % (seconds, WARMUP)]
        least, once = B12["variants"]
        drain = b12["drain"]
        rows = [("measure", least, once, "exactly_once vs at_least_once", "target", "met")]
        ratio = drain[once] / drain[least]
        rows.append(("B2 drain, msg/s", f"{drain[least]:,.0f}", f"{drain[once]:,.0f}", f"{ratio:.2f}",
                     f">= {B12['drain_ratio']}", "yes" if ratio >= B12["drain_ratio"] else "no"))
        for where in B12["wheres"]:
            for rate in B3_RATES:
                a, e = (b12["latency"][(v, where, rate)] for v in B12["variants"])
                if not (a["kept_up"] and e["kept_up"]):
                    rows.append((f"B3 {rate:,} msg/s {where}", "behind" if not a["kept_up"] else "",
                                 "behind" if not e["kept_up"] else "", "", "", ""))
                    continue
                for p in ("p50", "p99"):
                    target = p == "p99" and rate == 1000
                    over = e[p] - a[p]
                    rows.append((f"B3 {rate:,} msg/s {where}, {p} ms", f"{a[p]:,.1f}", f"{e[p]:,.1f}",
                                 f"{over:+.1f}", f"<= +{B12['p99_over_ms']}" if target else "",
                                 ("yes" if over <= B12["p99_over_ms"] else "no") if target else ""))
        return out + table(rows)

    # B9 ----------------------------------------------------------------------

    def b9(self):
        """B9's messages produced to its topic, then consumed from the
        earliest offset by our inbox (if installed) and by the peer in turn."""
        n = self.size["b9_messages"]
        self.produce_b9(B9["topic"], n)
        result = {"messages": n, "ours": None, "peer": None}
        inbox = Inbox(self.db)
        if inbox.present():
            self.clean()
            result["ours"] = self.b9_ours(inbox, n)
        else:
            progress(f"B9 ours: skipped: {INBOX['missing']}")
        self.clean()
        result["peer"] = self.b9_peer(n)
        self.results["b9"] = result
        self.clean()

    def produce_b9(self, topic, n):
        """n messages straight to Kafka, as fast as a Python producer goes, each
        with a fresh outbox-message-id of version 7, as the outbox makes them
        (outbox_uuid_v7()); waits until the topic holds them."""
        producer = confluent_kafka.Producer({
            "bootstrap.servers": self.args.brokers, "enable.idempotence": True, "acks": "all",
            "linger.ms": 50, "batch.num.messages": 10_000, "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576})
        begin = time.monotonic()
        for i in range(n):
            key = f"key-{i % B9['keys']}"
            value = json.dumps({"seq": i, "account": key, "amount": i % 997, "kind": "b9.transfer"})
            while True:
                try:
                    producer.produce(topic, value, key, headers=[("outbox-message-id", uuid_v7())])
                    break
                except BufferError:
                    producer.poll(0.1)
            if i % 10_000 == 0:
                producer.poll(0)
        if producer.flush(300):
            raise Broken(f"B9: {n:,} messages not all produced to {topic}")
        wait_until(f"B9: {n:,} messages in {topic}", lambda: self.kafka.count(topic) >= n, 60)
        if self.kafka.count(topic) != n:
            raise Broken(f"B9: {self.kafka.count(topic):,} records in {topic}, {n:,} produced")
        progress(f"B9: {n:,} messages in {topic} ({n / (time.monotonic() - begin):,.0f}/s produced)")

    def b9_wait(self, what, table, n, began):
        """Until the table holds n rows, or the deadline: {"startup": seconds
        from began to its first row, "seconds": to its nth (to the deadline
        if not reached), "finished", "rows", "first_rows": rows at the first
        look that found any}.  Polls max(id), which its index answers at
        once, and counts only once that reached n."""
        deadline = began + max(B9["deadline"], n / B9["min_rate"])
        found = {"startup": None, "first_rows": 0, "finished": False}
        shown = began
        while True:
            top = self.db.value(f"SELECT max(id) FROM {table}")
            now = time.monotonic()
            if top is not None and found["startup"] is None:
                found["startup"], found["first_rows"] = now - began, top
                progress(f"{what}: first row after {found['startup']:.2f} s")
            if top is not None and top >= n:
                rows = self.db.value(f"SELECT count(*) FROM {table}")
                if rows >= n:
                    return {**found, "seconds": time.monotonic() - began, "finished": True, "rows": rows}
            if now > deadline:
                rows = self.db.value(f"SELECT count(*) FROM {table}")
                progress(f"{what}: {rows:,} of {n:,} rows after {now - began:.0f} s: unfinished")
                return {**found, "seconds": now - began, "rows": rows}
            if now - shown >= 5:
                shown = now
                progress(f"{what}: {top or 0:,} rows after {now - began:.0f} s")
            time.sleep(0.05)

    def b9_check(self, what, table, n):
        """Each of the n messages applied once: as many rows, and distinct
        message ids and payload seqs."""
        rows, ids, seqs = self.db.run(f"SELECT count(*), count(DISTINCT message_id),"
                                      f" count(DISTINCT payload->>'seq') FROM {table}")[0]
        if rows > n or ids != rows or seqs != rows:
            raise Broken(f"{what}: {rows:,} rows in {table}, {ids:,} distinct message ids,"
                         f" {seqs:,} distinct seqs, of {n:,} messages")

    @staticmethod
    def b9_rates(found, n):
        found["rate"] = found["rows"] / found["seconds"]
        # Not when the first look found (nearly) every row: nothing to time after it.
        if found["startup"] is not None and found["rows"] - found["first_rows"] >= 0.5 * found["rows"]:
            found["rate_after_startup"] = (found["rows"] - found["first_rows"]) / (found["seconds"]
                                                                                   - found["startup"])
        return found

    def b9_ours(self, inbox, n):
        table, name = "b9_ours", "b9"
        inbox.prepare(table)
        self.db.run("CHECKPOINT")
        postmaster = postmaster_pid(self.db)
        cluster, own = CpuMeter(lambda: descendants(postmaster)), CpuMeter(inbox.pids)
        pressure, began = Pressure(), time.monotonic()
        inbox.subscribe(name, [B9["topic"]], table)
        finished = False
        try:
            found = self.b9_wait("B9 ours", table, n, began)
            found["cpu"] = {"cluster": cluster.seconds(), "own": own.seconds() if inbox.pids() else None}
            found["pressure"] = pressure.percent()
            found["status"] = inbox.status(name)
            finished = found["finished"]
        finally:
            inbox.unsubscribe(name, discard_pending=not finished)
        self.b9_check("B9 ours", table, n)
        self.b9_rates(found, n)
        progress(f"B9 ours: {found['rows']:,} rows at {found['rate']:,.0f} msg/s"
                 f" (start-up {found['startup'] or 0:.2f} s); inbox_status: {found['status']}")
        return found

    def b9_peer(self, n):
        table, processed = "b9_peer", "b9_peer_processed"
        self.db.run(APPLIED_TABLE.format(table=table))
        self.db.run(PROCESSED_TABLE.format(table=processed))
        self.db.run("CHECKPOINT")
        postmaster = postmaster_pid(self.db)
        cluster = CpuMeter(lambda: descendants(postmaster))
        pressure, began = Pressure(), time.monotonic()
        peer = Peer("consume", self.args, extra=["--topic", B9["topic"], "--table", table, "--processed",
                                                 processed, "--group", f"bench-b9-{uuid.uuid4()}"])
        found = self.b9_wait("B9 peer", table, n, began)
        found["cpu"] = {"cluster": cluster.seconds(), "own": process_cpu(peer.process.pid)}
        found["pressure"] = pressure.percent()
        peer.stop()
        found["counts"] = peer.counts
        self.b9_check("B9 peer", table, n)
        self.b9_rates(found, n)
        progress(f"B9 peer: {found['rows']:,} rows at {found['rate']:,.0f} msg/s"
                 f" (start-up {found['startup'] or 0:.2f} s); {peer.counts}")
        return found

    # B10 ---------------------------------------------------------------------

    def b10_bulk(self, started, errors, bulk):
        """The bulk transaction: B10's bulk_keys keys in bulk_chunks statements
        spread over its seconds, then COMMIT; in bulk, its keys and seconds."""
        try:
            conn = psycopg2.connect(self.args.dsn)
            chunk = B10["bulk_keys"] // B10["bulk_chunks"]
            begin = time.monotonic()
            with conn.cursor() as cur:
                started.set()
                for n in range(B10["bulk_chunks"]):
                    cur.execute("SELECT count(outbox_enqueue(%s, '{\"kind\": \"bulk\"}'::jsonb, 'bulk-' || i))"
                                "  FROM generate_series(%s, %s) i",
                                (B10["topic"], n * chunk + 1, (n + 1) * chunk))
                    time.sleep(max(0.0, begin + (n + 1) * B10["seconds"] / B10["bulk_chunks"] - time.monotonic()))
            conn.commit()
            conn.close()
            bulk.update(keys=B10["bulk_keys"], seconds=time.monotonic() - begin)
        except Exception as e:    # reported by the measuring thread
            errors.append(e)
            started.set()

    def b10_run(self, run, bulk):
        """The small transactions' enqueue latencies (ms, sorted) for B10's
        seconds, beside the bulk transaction if bulk (a dict it fills)."""
        conn = psycopg2.connect(self.args.dsn)
        started, errors, latencies = threading.Event(), [], []
        if bulk is not None:
            thread = threading.Thread(target=self.b10_bulk, args=(started, errors, bulk))
            thread.start()
            started.wait()
        end = time.monotonic() + B10["seconds"]
        with conn.cursor() as cur:
            while time.monotonic() < end:
                t0 = time.monotonic()
                cur.execute("SELECT outbox_enqueue(%s, '{\"kind\": \"small\"}'::jsonb, %s)",
                            (B10["topic"], f"small-{run}-{len(latencies)}"))
                latencies.append((time.monotonic() - t0) * 1000)
                conn.commit()
                time.sleep(B10["pause"])
        conn.close()
        if bulk is not None:
            thread.join()
        if errors:
            raise Broken(f"B10: the bulk transaction failed: {errors[0]}")
        return sorted(latencies)

    def b10(self):
        self.clean()
        result, bulk = {}, {}
        for run, beside in (("alone", None), ("beside the bulk transaction", bulk)):
            latencies = self.b10_run(run.split()[0], beside)
            result[run] = {"count": len(latencies), **percentiles(latencies)}
            progress(f"B10 {run}: {len(latencies):,} enqueues, p99 {result[run]['p99']:.2f} ms")
            wait_until("B10: the worker publishes what was enqueued", lambda: self.db.value(
                "SELECT count(*) FROM outbox_message WHERE topic = %s AND state <> 'sent'",
                (B10["topic"],)) == 0, 300)
        self.results["b10"] = {"runs": result, "bulk": bulk}

    # B11 ---------------------------------------------------------------------

    def b11(self):
        """handler_hog.py, on this database and broker: its report, as printed."""
        self.clean()
        hog = subprocess.run([sys.executable, os.path.join(HERE, "handler_hog.py"), "--dsn", self.db.dsn,
                              "--brokers", self.kafka.brokers], capture_output=True, text=True)
        if hog.returncode != 0:
            raise Broken(f"B11: handler_hog.py failed: {hog.stderr.strip() or hog.stdout.strip()}")
        self.results["b11"] = hog.stdout.strip().splitlines()

    def b10_report(self, b10):
        runs, bulk = b10["runs"], b10["bulk"]
        alone, beside = runs["alone"], runs["beside the bulk transaction"]
        out = ["", f"B10 enqueue beside a bulk transaction: small transactions of one keyed"
                   f" outbox_enqueue() each, one after another for {B10['seconds']} s, alone and then while"
                   f" a transaction enqueues {B10['bulk_keys']:,} other keys over those seconds;"
                   " the enqueue call's latency, ms"]
        out += table([("run", "enqueues", "p50", "p99", "max")] + [
            (run, f"{r['count']:,}", f"{r['p50']:.2f}", f"{r['p99']:.2f}", f"{r['max']:.2f}")
            for run, r in runs.items()])
        out.append(f"  the bulk transaction: {bulk['keys']:,} keys, committed after {bulk['seconds']:.1f} s")
        out.append(f"  p99 beside the bulk transaction / p99 alone: {beside['p99'] / alone['p99']:.2f}")
        return out

    def b9_report(self, b9):
        n = b9["messages"]
        out = ["", f"B9 consume: {n:,} messages already in {B9['topic']} ({PARTITIONS} partitions, {B9['keys']:,}"
                   " keys, ~75-byte JSON, a fresh outbox-message-id header each, a UUID of version 7 as the outbox makes them), read from the earliest"
                   " offset and applied by a handler that inserts one row per message; each consumer in turn"]
        rows = [("consumer", "rows", "start-up s", "msg/s", "msg/s after start-up", "PostgreSQL CPU, cores",
                 "consumer's own CPU, cores", "CPU per message, us", "CPU pressure %", "target")]
        cells = {}
        for peer, label in (("ours", "ours: inbox, PL/pgSQL handler"),
                            ("peer", f"peer: peers.py consume, batches of {CONSUME_BATCH:,}")):
            found = b9[peer]
            if found is None:
                rows.append((label, "skipped", "", "", "", "", "", "", "", ""))
                continue
            secs = found["seconds"]
            cluster, own = found["cpu"]["cluster"], found["cpu"]["own"]
            # The peer's process is outside PostgreSQL; our inbox's Kafka process is inside it.
            total = cluster + (own if peer == "peer" else 0)
            cells[peer] = found
            rows.append((label, f"{found['rows']:,}" + ("" if found["finished"] else " (unfinished)"),
                         f"{found['startup']:.2f}" if found["startup"] is not None else "-",
                         f"{found['rate']:,.0f}",
                         f"{found['rate_after_startup']:,.0f}" if "rate_after_startup" in found else "-",
                         f"{cluster / secs:.2f}", f"{own / secs:.2f}" if own is not None else "-",
                         f"{total * 1e6 / max(found['rows'], 1):,.1f}",
                         f"{found['pressure']:.0f}" if found["pressure"] is not None else "-",
                         f">= {B9['target_rate']:,} msg/s, >= {B9['target_ratio']:.0f}x peer"
                         if peer == "ours" else ""))
        if "ours" in cells and "peer" in cells:
            ours, peer = cells["ours"], cells["peer"]
            after = (f"{ours['rate_after_startup'] / peer['rate_after_startup']:.2f}"
                     if "rate_after_startup" in ours and "rate_after_startup" in peer else "")
            met = (ours["finished"] and ours["rate"] >= B9["target_rate"]
                   and ours["rate"] >= B9["target_ratio"] * peer["rate"])
            rows.append(("ours/peer", "", "", f"{ours['rate'] / peer['rate']:.2f}", after, "", "", "", "",
                         "met" if met else "not met"))
        out += table(rows)
        if b9["ours"] is None:
            out.append(f"  ours skipped: {INBOX['missing']}")
        out.append("  start-up: from inbox_subscribe() (the peer: its process's start) to the first row in the"
                   " table; msg/s: rows over the time from then to the last row (after start-up: from the"
                   " first row)")
        out.append("  PostgreSQL CPU: every process of the cluster (backends, workers, the inbox's Kafka"
                   " process, WAL writer, checkpointer, autovacuum); consumer's own: the inbox's workers"
                   " (pg_stat_activity.backend_type like '%inbox%') and their Kafka processes, or the peer's"
                   " Python process (librdkafka's threads too); per message: PostgreSQL's, plus the peer's"
                   " process for the peer; CPU pressure: the share of the time in which some task of the"
                   " machine, the bench's or another's, waited for a CPU (/proc/pressure)")
        out.append("  peer: confluent-kafka and psycopg2, a consumer group of its own, auto commit off; per batch"
                   " one query for the processed ids, the new rows and their ids inserted (execute_values), the"
                   " transaction committed, then the offsets committed synchronously")
        return out

    # B8 ----------------------------------------------------------------------

    def b8(self, part="B8"):
        """B8, or with part "B8BG" each path's load inside B3BG's background()."""
        if not self.args.more_databases:
            raise Broken(f"{part}: no other database (--more-databases)")
        b = Database(psycopg2.extensions.make_dsn(self.args.dsn, dbname=self.args.more_databases[0]))
        result = {"a": self.db.name, "b": b.name, "seconds": self.size["b8_seconds"], "part": part}
        prepared = self.background_prepared() if part == "B8BG" else contextlib.nullcontext()
        with prepared:
            for peer in B8_PEERS:
                if peer == "ours" and not Inbox(b).present():
                    progress(f"{part} ours: skipped: {INBOX['missing']} (in {b.name})")
                    result[peer] = None
                    continue
                self.clean()
                b.run("VACUUM ANALYZE outbox_message")
                around = (self.background(B8["warmup"] + self.size["b8_seconds"]) if part == "B8BG"
                          else contextlib.nullcontext({}))
                with around as activity:
                    result[peer] = self.b8_run(peer, b, part)
                result[peer]["background"] = activity
        self.results[part.lower()] = result
        self.clean()

    def b8bg(self):
        self.b8("B8BG")

    def b8_run(self, peer, b, part="B8"):
        """B3's load at B8["rate"] into A, published by our worker or the
        tuned poller, applied into B by our inbox or peers.py consume; a
        topic of each part's own, as the subscription reads from its start."""
        topic, table, name = f"bench.{part.lower()}.{peer}", f"b8_{peer}", "b8"
        seconds, warmup = self.size["b8_seconds"], B8["warmup"]
        inbox, running = Inbox(b), []
        if peer == "ours":
            inbox.prepare(table)
            inbox.subscribe(name, [topic], table)
            try:
                wait_until(f"B8 ours: inbox_status shows {topic}'s {PARTITIONS} partitions",
                           lambda: len(inbox.status(name)) >= PARTITIONS, 30)
            except Broken as e:
                progress(f"B8 ours: {e}; measuring anyway (inbox_status: {inbox.status(name)})")
        else:
            b.run(APPLIED_TABLE.format(table=table))
            b.run(PROCESSED_TABLE.format(table=table + "_processed"))
            running.append(Peer("consume", self.args, dsn=b.dsn, extra=[
                "--topic", topic, "--table", table, "--processed", table + "_processed",
                "--group", f"bench-b8-{uuid.uuid4()}", "--id-header", "message-id"]))
            running.append(Peer("tuned", self.args))
        postmaster = postmaster_pid(self.db)
        outside = [p.process.pid for p in running]
        cpu = CpuMeter(lambda: descendants(postmaster) + outside)
        to_kafka = LatencyConsumer(self.kafka, topic)
        to_kafka.start()
        visible = VisibleRows(b.dsn, table)
        visible.start()
        begin, began, pressure = time.time() * 1000, time.monotonic(), Pressure()
        try:
            figures = self.pgbench(latency_script(peer, topic, 1), warmup + seconds, rate=B8["rate"])
            committed = figures["processed"]
            deadline = time.monotonic() + B8["grace"]
            while b.value(f"SELECT count(*) FROM {table}") < committed and time.monotonic() < deadline:
                time.sleep(0.1)
            elapsed = time.monotonic() - began
            cores, stalled = cpu.seconds() / elapsed, pressure.percent()
        finally:
            visible.stop()
            to_kafka.stop()
            if peer == "ours":
                status = inbox.status(name)
                inbox.unsubscribe(name, discard_pending=True)
            else:
                status = None
                for p in running:
                    p.stop()
        rows = b.run(f"SELECT id, message_id, (payload->>'t')::float8, extract(epoch FROM applied_at)::float8 * 1000"
                     f" FROM {table}")
        if len(rows) > committed or len({r[1] for r in rows}) != len(rows):
            raise Broken(f"B8 {peer}: {committed:,} committed in {self.db.name}, {len(rows):,} rows in"
                         f" {b.name}.{table}, {len({r[1] for r in rows}):,} distinct message ids")
        since = begin + warmup * 1000
        counted = [r for r in rows if r[2] >= since]
        seen = [visible.seen[id_] - t for id_, _, t, _ in counted if id_ in visible.seen]
        result = {"committed": figures["tps"], "messages": committed, "applied": len(rows),
                  "applied_rate": len(rows) / elapsed, "cores": cores, "pressure": stalled, "status": status,
                  "missed": len(counted) - len(seen),
                  "visible": percentiles(sorted(seen)) or {},
                  "handler": percentiles(sorted(applied - t for _, _, t, applied in counted)) or {},
                  "kafka": percentiles(to_kafka.latencies(enqueued_after=since)) or {}}
        progress(f"B8 {peer}: {figures['tps']:,.0f} msg/s committed, {len(rows):,} of {committed:,} applied;"
                 " visible in %s: p50 %.1f ms, p99 %.1f ms, max %.1f ms" % (
                     b.name, *(result["visible"].get(k, math.nan) for k in ("p50", "p99", "max"))))
        return result

    def b8_report(self, b8):
        part = b8.get("part", "B8")
        under = (" under B3BG's background activity (updates of bg_account, autovacuum, a timed checkpoint"
                 " in the middle of each path's load)" if part == "B8BG" else "")
        out = ["", f"{part} end to end: pgbench -R {B8['rate']:,} msg/s (B3's script, one message per transaction)"
                   f" into {b8['a']}, published to Kafka, applied in {b8['b']} by a handler inserting a row;"
                   f" {b8['seconds']} s after {B8['warmup']} s of warm-up{under}"]
        rows = [("path", "committed msg/s", "applied", "visible p50 ms", "p99", "max", "handler p50 ms", "p99",
                 "max", "to Kafka p50 ms", "p99", "CPU, cores", "CPU pressure %", "target")]
        for peer, label in (("ours", "ours: outbox worker, inbox"),
                            ("tuned", "peer: tuned poller, peers.py consume")):
            r = b8.get(peer)
            if r is None:
                rows.append((label, "skipped", *[""] * 12))
                continue
            behind = r["applied"] < r["messages"]
            stats = [("-" if k not in r[where] else f"{r[where][k]:,.1f}")
                     for where in ("visible", "handler", "kafka") for k in ("p50", "p99", "max")
                     if not (where == "kafka" and k == "max")]
            rows.append((label, f"{r['committed']:,.0f}",
                         f"{r['applied']:,} of {r['messages']:,}" if behind else f"{r['applied']:,}",
                         *stats, f"{r['cores']:.2f}", f"{r['pressure']:.0f}" if r["pressure"] is not None else "-",
                         f"p99 <= {B8['target_p99']} ms: "
                         + ("met" if not behind and r["visible"].get("p99", math.inf) <= B8["target_p99"]
                            else "not met") if peer == "ours" else ""))
        ours, tuned = b8.get("ours"), b8.get("tuned")
        if ours and tuned and "p99" in ours["visible"] and "p99" in tuned["visible"]:
            rows.append(("ours/peer", "", "", *(f"{ours['visible'][k] / tuned['visible'][k]:.2f}"
                                                for k in ("p50", "p99", "max")), *[""] * 8))
        out += table(rows)
        if ours is None:
            out.append(f"  ours skipped: {INBOX['missing']} (in {b8['b']})")
        out.append(f"  visible: from the enqueue in {b8['a']} (the payload's clock_timestamp(), as B3) to the row's"
                   f" being seen in {b8['b']} by a query every {B8['poll'] * 1000:.0f} ms (after B's commit);"
                   " handler: to the row's clock_timestamp() (before B's commit); to Kafka: to a consumer of"
                   " the topic, as B3; CPU: the cluster's processes (both databases) and the peer's two"
                   " Python processes; CPU pressure: as B9's")
        for peer in B8_PEERS:
            r = b8.get(peer)
            if r and r["missed"]:
                out.append(f"  {peer}: {r['missed']:,} rows committed after a higher id was seen, not in"
                           " the visible figures")
        return out

    def report(self):
        out = [
            "",
            f"outbox benchmarks, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
            f"machine:   {os.cpu_count()} CPUs ({cpu_model()}), {read_meminfo_gib():.1f} GiB memory,"
            f" {platform.platform()}",
            f"command:   {self.args.command}",
            f"measured:  {self.measured}, PostgreSQL {self.db.value('SHOW server_version')},"
            f" librdkafka {confluent_kafka.libversion()[0]},"
            f" one local Kafka broker, {PARTITIONS} partitions per topic",
            "",
        ]
        b2, b3 = self.results.get("b2"), self.results.get("b3")
        rows = [("benchmark", "ours", "seed poller", "tuned poller", "ours/tuned", "target")]
        if b2:
            r = b2["rate"]
            rows.append((f"B2 drain {self.size['backlog']:,} backlog, msg/s",
                         f"{r['ours']:,.0f}", f"{r['seed']:,.0f}", f"{r['tuned']:,.0f}",
                         f"{r['ours'] / r['tuned']:.2f}", ">= 100,000 and >= 2x tuned"))
            rows.append(("B2 peak RSS (VmHWM), MiB", *(f"{b2['rss'][p] / 1024:,.0f}" for p in PEERS),
                         "", ""))
            rows.append(("B2 worker peak private RSS (RssAnon), MiB", f"{b2['private'] / 1024:,.0f}",
                         "", "", "", ""))
            per_message = {p: b2["cpu"][p] * 1e6 / self.size["backlog"] for p in ("ours", "tuned")}
            rows.append(("B2 CPU per message, us", f"{per_message['ours']:.1f}", "",
                         f"{per_message['tuned']:.1f}", f"{per_message['ours'] / per_message['tuned']:.2f}", ""))
        if b3:
            for rate, target in zip(B3_RATES, (10, 50)):
                by_peer = b3[rate]
                for stat in ("p50", "p99", "max"):
                    cells = [f"{by_peer[p][stat]:,.1f}" if by_peer[p]["kept_up"] and stat in by_peer[p]
                             else "behind" for p in PEERS]
                    both = by_peer["ours"]["kept_up"] and by_peer["tuned"]["kept_up"]
                    rows.append((f"B3 {rate // 1000}k msg/s offered, {stat} ms", *cells,
                                 f"{by_peer['ours'][stat] / by_peer['tuned'][stat]:.2f}" if both else "",
                                 f"<= {target} and below tuned" if stat == "p99" else ""))
                rows.append((f"B3 {rate // 1000}k msg/s: committed / delivered msg/s",
                             *(f"{by_peer[p]['committed']:,.0f} / {by_peer[p]['delivered']:,.0f}"
                               for p in PEERS),
                             "", ""))
        floor = self.results.get("floor", {}).get(1000)
        burst = self.results.get("b3_burst")
        if b3 and floor:
            over = b3[1000]["ours"]["p99"] - floor["p99"]
            rows.append(("B3 1k msg/s, p99 over Kafka's floor, ms", f"{over:+.1f}", "", "", "", "<= 5"))
        if burst:
            rounds = lambda run: ", ".join(f"{p99:.1f}" for p99 in run["p99s"])
            rows.append((f"B3 1k msg/s, first {B3_AFTER_BURST} s after a burst of {self.size['b3_burst']:,},"
                         " p50 / p99 / max ms (round of median p99)",
                         "%(p50).1f / %(p99).1f / %(max).1f" % burst, "", "", "", ""))
            rows.append(("B3 the same, Kafka's floor after its own burst, p50 / p99 / max ms",
                         "%(p50).1f / %(p99).1f / %(max).1f" % burst["floor"], "", "", "", ""))
            rows.append((f"B3 the same, p99 of each of {B3_BURST_ROUNDS} rounds, ours; floor",
                         f"{rounds(burst)}; {rounds(burst['floor'])}", "", "", "", ""))
            rows.append(("B3 the same, p99 over Kafka's floor, ms", f"{burst['p99'] - burst['floor']['p99']:+.1f}",
                         "", "", "", "<= 5"))
        if len(rows) > 1:
            out += table(rows)
        for rate, floor in self.results.get("floor", {}).items():
            out.append(f"  floor at {rate:,} msg/s: Kafka alone (floor.py produces straight to the broker,"
                       f" no database, transactions of {B3_RATES[rate]} at random times as pgbench -R offers"
                       " them), the same consumer: p50 %(p50).1f ms, p99 %(p99).1f ms,"
                       " max %(max).1f ms" % floor)
        for rate in B3_RATES if b3 else ():
            for peer in PEERS:
                if not b3[rate][peer]["kept_up"]:
                    out.append(f"  behind: {peer} at {rate:,}/s left {b3[rate][peer]['backlog']:,}"
                               f" messages unpublished when the {self.size['b3_seconds']} s load ended")
        if b2:
            n = self.size["backlog"]
            out.append(f"  B2 seed poller: measured over {self.size['seed_window']} s of its drain;"
                       f" {n:,} messages would take it {hours(n / b2['rate']['seed'])}")
            out += self.b2_segments_report(b2["segments"])
        b1 = self.results.get("b1")
        if b1:
            plain = b1[B1_PLAIN][0]
            out += ["", f"B1 enqueue: the registration transaction (1 user, 2 messages), pgbench -c {CLIENTS}"
                        f" -j {JOBS}, {self.size['b1_rounds']} round(s) of {self.size['b1_seconds']} s"
                        " per variant, in turn"]
            out += table([("variant", "TPS", "vs plain INSERT", "publisher CPU, cores", "target")] + [
                (name, f"{tps:,.0f}", f"{tps / plain:.2f}", f"{cores:.2f}" if cores else "",
                 ">= 0.85, above tuned" if name == B1_PUBLISHING else "")
                for name, (tps, cores) in b1.items()])
            out.append("  worker publishing: the worker sends what the load enqueues, on the same 2 cores;"
                       " worker paused: the messages wait (outbox.brokers points nowhere);"
                       " publisher CPU: the worker's, or the tuned poller's and its backend's")
            drains = ", ".join(f"{n:,} at {rate:,.0f} msg/s" for n, rate in self.results["b1_drains"])
            out.append(f"  after each paused run, the worker published the messages that waited: {drains}"
                       + (f" (B2: {b2['rate']['ours']:,.0f} msg/s)" if b2 else ""))
        b1r = self.results.get("b1r")
        if b1r:
            out += self.b1r_report(b1r)
        b1b = self.results.get("b1b")
        if b1b:
            out += self.b1b_report(b1b)
        b1d = self.results.get("b1d")
        if b1d:
            out += ["", f"B1D: B1's transaction published by our worker, by outbox_capture() and by Debezium"
                        f" 3.6.1 (Kafka Connect 4.3, as shipped), pgbench -c {CLIENTS} -j {JOBS},"
                        f" {self.size['b1d_rounds']} round(s) of {self.size['b1_seconds']} s per variant, in turn"]
            out += self.b1d_report(b1d)
        b3bg = self.results.get("b3bg")
        if b3bg:
            out += self.b3bg_report(b3bg, self.results["b3bg_reloptions"])
        b4 = self.results.get("b4")
        if b4:
            out += ["", f"B4 soak: {SOAK['seconds'] // 60} minutes at {SOAK['rate']:,} msg/s, outbox_enqueue"]
            out += table([("s", "outbox_message kB", "dead tuples", "p99 ms")] + [
                (str(s), f"{size / 1024:,.0f}", f"{dead:,}", f"{p99:.1f}" if p99 is not None else "-")
                for s, size, dead, p99 in b4])
        b5 = self.results.get("b5")
        if b5:
            out += self.b5_report(b5)
        b6 = self.results.get("b6")
        if b6 and "together" in b6:
            out += self.b6_report(b6)
        b7 = self.results.get("b7")
        if b7:
            out += self.b7_report(b7, self.size["b3_seconds"])
        for part in ("b8", "b8bg"):
            if self.results.get(part):
                out += self.b8_report(self.results[part])
        b9 = self.results.get("b9")
        if b9 and b9["peer"]:
            out += self.b9_report(b9)
        b10 = self.results.get("b10")
        if b10:
            out += self.b10_report(b10)
        if self.results.get("b11"):
            out += [""] + self.results["b11"]
        if self.results.get("b12"):
            out += self.b12_report(self.results["b12"], self.size["b3_seconds"])
        out += ["", "time: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in self.timings)]
        print("\n".join(out), flush=True)

    def b2_segments_report(self, segments):
        segment = self.size["segment"]
        out = ["", f"B2 drain per {segment:,} messages delivered (from the topic's offsets, as the"
                   " whole drain), msg/s"]
        rows = [("messages delivered", "ours", "tuned", "ours/tuned", "target")]
        for end in sorted(set(segments["ours"]) | set(segments["tuned"])):
            ours, tuned = segments["ours"].get(end), segments["tuned"].get(end)
            rows.append((f"{(end - 1) // segment * segment + 1:,} to {end:,}",
                         f"{ours:,.0f}" if ours else "-", f"{tuned:,.0f}" if tuned else "-",
                         f"{ours / tuned:.2f}" if ours and tuned else "", ""))

        def last_over_first(rates):
            return f"{rates[max(rates)] / rates[min(rates)]:.2f}" if rates else "-"
        rows.append(("last segment / first segment", last_over_first(segments["ours"]),
                     last_over_first(segments["tuned"]), "", ">= 1.0 for ours"))
        out += table(rows)
        out.append("  the first segment starts at the first record seen in Kafka")
        return out

    @staticmethod
    def b5_report(b5):
        hold, every = b5["hold"], B5["every"]
        out = ["", f"B5 held horizon: {B5['rate']:,} msg/s (pgbench -R, one message per transaction, as B3);"
                   f" after {B5['warmup']} s of warm-up and a {B5['baseline']} s baseline, a REPEATABLE READ"
                   " transaction holds its snapshot"
                   f" {hold // 60} min, then {B5['after']} s more load; the seed poller is skipped"
                   " (it falls behind at 1,000 msg/s, B3)"]

        def latency_cells(stats):
            return [f"{stats[stat]:,.1f}" if stat in stats else "-" for stat in ("p50", "p99")]

        def p99_ratio(ours, tuned):
            return f"{ours['p99'] / tuned['p99']:.2f}" if "p99" in ours and "p99" in tuned else ""

        rows = [("window", "held s", "ours p50 ms", "ours p99 ms", "ours MiB", "ours dead tuples",
                 "tuned p50 ms", "tuned p99 ms", "tuned MiB", "tuned dead tuples", "p99 ours/tuned")]
        for ours, tuned in zip(b5["ours"]["windows"], b5["tuned"]["windows"]):
            name = (f"baseline ({B5['baseline']} s)" if ours["held"] is None
                    else f"hold {ours['held'] - every}-{ours['held']} s")
            rows.append((name, str(ours["held"] or "-"),
                         *latency_cells(ours), f"{ours['size'] / 2**20:,.1f}", f"{ours['dead']:,}",
                         *latency_cells(tuned), f"{tuned['size'] / 2**20:,.1f}", f"{tuned['dead']:,}",
                         p99_ratio(ours, tuned)))
        ours, tuned = b5["ours"], b5["tuned"]
        rows.append((f"after the hold ({B5['after']} s)", "",
                     *latency_cells(ours["after_stats"]), f"{ours['after'][-1][1] / 2**20:,.1f}", "",
                     *latency_cells(tuned["after_stats"]), f"{tuned['after'][-1][1] / 2**20:,.1f}", "",
                     p99_ratio(ours["after_stats"], tuned["after_stats"])))
        out += table(rows)
        out.append("  held s: the snapshot's age at the window's end; MiB: every relation of the table"
                   " (heap, indexes, TOAST) summed over its partitions, and its dead tuples likewise,"
                   " read at the window's end (after the hold: at the end of the load); p50/p99: the"
                   " messages enqueued in the window")

        out += ["", f"B5 size after the hold ends, MiB (read every second, shown every {B5['after_every']} s)"]
        out += table([("s after the hold", "ours MiB", "tuned MiB")] + [
            (str(second), f"{ours / 2**20:,.1f}", f"{tuned / 2**20:,.1f}")
            for (second, ours), (_, tuned) in zip(b5["ours"]["after"], b5["tuned"]["after"])])

        def last_over_baseline(peer):
            windows = b5[peer]["windows"]
            if "p99" not in windows[0] or "p99" not in windows[-1]:
                return "-"
            return f"{windows[-1]['p99'] / windows[0]['p99']:.2f}"

        def slope(peer):
            """Least squares of p99 against the hold's age at each window's middle, ms per minute."""
            points = [((w["held"] - every / 2) / 60, w["p99"]) for w in b5[peer]["windows"][1:] if "p99" in w]
            if len(points) < 2:
                return "-"
            mx = sum(x for x, _ in points) / len(points)
            my = sum(y for _, y in points) / len(points)
            return "%+.2f" % (sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points))

        def back(peer):
            seconds = b5[peer]["back"]
            return f"yes ({seconds} s)" if seconds is not None else f"no (not within {B5['after']} s)"

        out += ["", "B5 targets (evaluated, not asserted)"]
        out += table([("", "ours", "tuned", "target"),
                      ("last window p99 / baseline p99", last_over_baseline("ours"), last_over_baseline("tuned"),
                       "<= 1.5"),
                      ("p99 slope across the hold windows, ms per minute", slope("ours"), slope("tuned"),
                       "flat"),
                      (f"size back to baseline ({B5['back_within']}x) within {B5['after']} s", back("ours"),
                       back("tuned"), "yes")])
        return out

    @staticmethod
    def b6_report(b6):
        apart, together = b6["apart"], b6["together"]
        n = len(apart["loads"])
        total = n * B6["rate"]
        one = together["loads"][0][0]
        out = ["", f"B6 {n} databases at {B6['rate']:,} msg/s each, beside one database at {total:,} msg/s:"
                   f" pgbench -R offers {n} loads of {B6['rate']:,} msg/s (B3's script, one message per"
                   f" transaction), each to a topic of its own, into a database each, then all into {one};"
                   f" {b6['seconds']} s after {WARMUP:.0f} s of warm-up, each variant having run"
                   f" {b6['warmup']} s unmeasured before"]
        kept_up = all(result["kept_up"] for v in (apart, together) for _, result in v["loads"])

        def cells(stats, behind):
            return ["behind" if behind else f"{stats[stat]:,.1f}" if stat in stats else "-"
                    for stat in ("p50", "p99", "max")]

        def over_one(stats):
            return (f"{stats['p99'] / together['all']['p99']:.2f}"
                    if kept_up and "p99" in stats and "p99" in together["all"] else "")

        def rates(results):
            return (f"{sum(r['committed'] for r in results):,.0f}"
                    f" / {sum(r['delivered'] for r in results):,.0f}")

        rows = [("B6", "p50 ms", "p99 ms", "max ms", "committed / delivered msg/s", "workers' CPU, cores",
                 "p99 / one database's")]
        for name, result in apart["loads"]:
            rows.append((f"{n} databases: {name}", *cells(result, not result["kept_up"]), rates([result]), "",
                         over_one(result)))
        rows.append((f"{n} databases: all {n} loads", *cells(apart["all"], not kept_up),
                     rates([r for _, r in apart["loads"]]), f"{apart['cores']:.2f}", over_one(apart["all"])))
        for i, (_, result) in enumerate(together["loads"], 1):
            rows.append((f"one database ({one}): load {i}", *cells(result, not result["kept_up"]),
                         rates([result]), "", ""))
        rows.append((f"one database ({one}): all {n} loads", *cells(together["all"], not kept_up),
                     rates([r for _, r in together["loads"]]), f"{together['cores']:.2f}", ""))
        out += table(rows)
        if kept_up and "p99" in together["all"] and all("p99" in r for _, r in apart["loads"]):
            worst, result = max(apart["loads"], key=lambda load: load[1]["p99"])
            out.append(f"  worst p99 of the {n} databases ({worst}, {result['p99']:,.1f} ms) over one database's"
                       f" p99 at {total:,} msg/s ({together['all']['p99']:,.1f} ms): "
                       f"{result['p99'] / together['all']['p99']:.2f}")
        for variant in (apart, together):
            for name, result in variant["loads"]:
                if not result["kept_up"]:
                    out.append(f"  behind: {name} left {result['backlog']:,} messages unpublished"
                               f" when the {b6['seconds']} s load ended")
        out.append("  p50/p99/max: the messages enqueued after the warm-up, receive time minus enqueue"
                   " time; workers' CPU: every database's worker and its Kafka process, over the loads and"
                   " their grace; published by each database's worker meanwhile: "
                   + "; ".join(f"{label}: " + ", ".join(f"{name} {count:,}"
                                                        for name, count in sorted(v["published"].items()))
                               for v, label in ((apart, f"{n} databases"), (together, "one database"))))
        return out


def hours(seconds):
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def table(rows):
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def read_meminfo_gib():
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) / 1024 / 1024


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def part_names(text):
    """--only's argument: parts, separated by commas."""
    names = [name.strip().upper() for name in text.split(",") if name.strip()]
    if not names or set(names) - set(PARTS):
        raise argparse.ArgumentTypeError(f"not a list of parts among {', '.join(PARTS)}: {text!r}")
    return names


def main():
    parser = argparse.ArgumentParser(description="outbox benchmarks against two pollers")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--pg-bin", required=True)
    parser.add_argument("--more-databases", type=lambda text: [n for n in text.split(",") if n],
                        default=[], metavar="NAMES",
                        help="B6: the other databases with the extension, e.g. bench2,bench3")
    parser.add_argument("--quick", action="store_true", help="smaller sizes: a smoke run")
    parser.add_argument("--soak", action="store_true",
                        help="add B4, 10 minutes; B5 holds the horizon 30 minutes, not 5")
    parser.add_argument("--only", type=part_names, metavar="PARTS",
                        help="run only these parts, e.g. B5 or B2,B5 (B4 without --soak too)")
    parser.add_argument("--command", default=" ".join(sys.argv))
    args = parser.parse_args()

    bench = Bench(args)
    with open(os.path.join(HERE, "schema.sql")) as schema:
        bench.db.run(schema.read())
    bench.kafka.create_topics(["crm.sync", "coupon.welcome"] + B1D_TOPICS
                              + [f"bench.b2.{p}" for p in PEERS]
                              + [f"bench.b3.{p}.{r}" for p in PEERS + ("floor",) for r in B3_RATES]
                              + ["bench.b3.warmup"]
                              + [f"bench.b3.{t}.{r}" for t in ("burst", "burst.1000", "floor.burst", "floor.1000.burst")
                                 for r in range(B3_BURST_ROUNDS)]
                              + [f"bench.b3bg.{p}.{r}" for p in B3BG_PEERS + ("floor",) for r in B3_RATES]
                              + ["bench.b4.ours"] + [f"bench.b5.{p}" for p in B5_PEERS]
                              + [f"bench.b6.{d}" for d in [bench.db.name] + args.more_databases]
                              + [f"bench.b6.one.{n}" for n in range(1, len(args.more_databases) + 2)]
                              + [f"bench.b7.{v}.{r}" for v in B7["variants"] for r in B3_RATES]
                              + [f"bench.{b}.{p}" for b in ("b8", "b8bg") for p in B8_PEERS] + [B9["topic"], B10["topic"]]
                              + [f"bench.b12.{v}.drain" for v in B12["variants"]]
                              + [f"bench.b12.{v}.{w}.{r}" for v in B12["variants"] for w in B12["wheres"]
                                 for r in B3_RATES])
    runs = {"B2": ("B2 drain", bench.b2), "B1": ("B1 enqueue", bench.b1),
            "B1R": ("B1R enqueue at fixed rates", bench.b1r),
            "B1B": ("B1B bulk enqueue", bench.b1b),
            "B1D": ("B1D publishing beside Debezium", bench.b1d), "B3": ("B3 latency", bench.b3),
            "B3BG": ("B3BG latency under background activity", bench.b3bg),
            "B4": ("B4 soak", bench.b4), "B5": ("B5 held horizon", bench.b5),
            "B6": ("B6 databases", bench.b6), "B7": ("B7 standby slots", bench.b7),
            "B8": ("B8 end to end", bench.b8), "B8BG": ("B8BG end to end under background activity", bench.b8bg),
            "B9": ("B9 consume", bench.b9),
            "B10": ("B10 enqueue beside a bulk transaction", bench.b10),
            "B11": ("B11 a slow handler beside another subscription", bench.b11),
            "B12": ("B12 exactly-once publication", bench.b12)}
    # B4 only with --soak, B1D only when named
    chosen = args.only or [part for part in PARTS if part not in ("B4", "B1D") or (part == "B4" and args.soak)]
    try:
        for part in PARTS:
            if part in chosen:
                bench.part(*runs[part])
    except Broken as e:
        bench.report()
        sys.exit(f"bench.py: broken run: {e}")
    finally:
        for process in Peer.running:
            process.kill()
    bench.report()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
# Checks outbox_kafka's consumer mode (src/kafka_consume.c) against a real
# broker, speaking its frames (src/kafka_wire.h) as the inbox worker would:
#   consumer_process_check.py --exe PATH/outbox_kafka [--brokers B] [--verbose]
# Each scenario starts the executable with a socketpair on fd 0.  Prints a
# "PASS: ..." line per check; on the first failure prints "FAIL: ..." and
# exits 1.  Test data is produced with confluent_kafka.
# /usr/bin/python3 on purpose: confluent_kafka comes from Debian's
# python3-confluent-kafka, which other interpreters (pyenv) do not see.
import argparse
import os
import select
import socket
import struct
import subprocess
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

# Frame types, in kafka_wire.h's order.
(CONFIGURE, PRODUCE, METADATA, PURGE, TEST_FATAL, READY, FAILED, DELIVERY, LOG,
 ERROR, METADATA_REPLY, CONFIGURE_CONSUMER, ASSIGN, FETCH, ASSIGNED, MESSAGES,
 CONSUME_ERROR) = range(1, 18)
START_EARLIEST = -2
UNKNOWN_TOPIC_OR_PART = 3
AUTO_OFFSET_RESET = -140
# The group.id the Kafka process sets (kafka_consume.c's DEFAULT_GROUP_ID).
DEFAULT_GROUP_ID = "outbox_kafka-assign-only"
TIMEOUT = 30

args = None
admin = None


class CheckFailed(Exception):
    pass


def check(condition, what):
    if not condition:
        raise CheckFailed(what)
    print(f"PASS: {what}", flush=True)


def unique(prefix):
    unique.counter += 1
    return f"consumer_check.{prefix}.{os.getpid()}.{int(time.time())}.{unique.counter}"


unique.counter = 0


# --- the wire --------------------------------------------------------------

def wstr(value):
    """A string of the wire: length, -1 for None, and the bytes."""
    if value is None:
        return struct.pack("=i", -1)
    if isinstance(value, str):
        value = value.encode()
    return struct.pack("=i", len(value)) + value


class Reader:
    def __init__(self, body):
        self.body, self.pos = body, 0

    def take(self, fmt):
        values = struct.unpack_from("=" + fmt, self.body, self.pos)
        self.pos += struct.calcsize("=" + fmt)
        return values[0] if len(values) == 1 else values

    def bytes(self):
        n = self.take("i")
        if n < 0:
            return None
        value = self.body[self.pos:self.pos + n]
        self.pos += n
        return value

    def str(self):
        value = self.bytes()
        return None if value is None else value.decode()

    def done(self):
        return self.pos == len(self.body)


def parse_assigned(r):
    return [(r.str(), r.take("i"), r.take("q"), r.take("q")) for _ in range(r.take("I"))]


def parse_messages(r):
    messages = []
    for _ in range(r.take("I")):
        m = {"topic": r.str(), "partition": r.take("i"), "offset": r.take("q"),
             "timestamp": r.take("q"), "key": r.bytes(), "value": r.bytes()}
        m["headers"] = [(r.str(), r.bytes()) for _ in range(r.take("I"))]
        messages.append(m)
    watermarks = {(r.str(), r.take("i")): r.take("q") for _ in range(r.take("I"))}
    return messages, watermarks


class KafkaProcess:
    """outbox_kafka in consumer mode, with the frames it sent kept by kind."""

    def __init__(self, properties=None, first_frame=CONFIGURE_CONSUMER):
        ours, theirs = socket.socketpair()
        self.sock = ours
        self.proc = subprocess.Popen([args.exe], stdin=theirs, stdout=subprocess.DEVNULL,
                                     close_fds=True)
        theirs.close()
        self.buf = b""
        self.eof = False
        self.assigned = []          # every ASSIGNED entry, in order
        self.consume_errors = []    # every CONSUME_ERROR, as (topic, partition, error, reason)
        self.errors = []
        self.replies = []           # frames waited for: READY, FAILED, MESSAGES
        props = [("bootstrap.servers", args.brokers)] + list(properties or [])
        self.send(first_frame, struct.pack("=I", len(props))
                  + b"".join(wstr(k) + wstr(v) for k, v in props))

    def send(self, frame_type, body):
        self.sock.sendall(struct.pack("=IB", len(body), frame_type) + body)

    def assign(self, topics, start_ms=START_EARLIEST, positions=()):
        body = struct.pack("=qI", start_ms, len(topics)) + b"".join(wstr(t) for t in topics)
        body += struct.pack("=I", len(positions))
        body += b"".join(wstr(t) + struct.pack("=iq", p, o) for t, p, o in positions)
        self.send(ASSIGN, body)

    def handle(self, frame_type, body):
        r = Reader(body)
        if frame_type == LOG:
            level, facility, text = r.take("i"), r.str(), r.str()
            if args.verbose:
                print(f"  LOG {level} {facility}: {text}", flush=True)
        elif frame_type == ERROR:
            self.errors.append((r.take("i"), r.str()))
            if args.verbose:
                print(f"  ERROR {self.errors[-1]}", flush=True)
        elif frame_type == ASSIGNED:
            self.assigned.extend(parse_assigned(r))
        elif frame_type == CONSUME_ERROR:
            self.consume_errors.append((r.str(), r.take("i"), r.take("i"), r.str()))
            if args.verbose:
                print(f"  CONSUME_ERROR {self.consume_errors[-1]}", flush=True)
        elif frame_type == READY:
            self.replies.append((READY, None))
        elif frame_type == FAILED:
            self.replies.append((FAILED, r.str()))
        elif frame_type == MESSAGES:
            self.replies.append((MESSAGES, parse_messages(r)))
        else:
            raise CheckFailed(f"unexpected frame type {frame_type}")
        if not r.done():
            raise CheckFailed(f"frame type {frame_type} has {len(body) - r.pos} bytes too many")

    def pump(self, timeout):
        """Read and handle what comes within timeout seconds (at least one read)."""
        if self.eof:
            time.sleep(timeout)
            return
        ready, _, _ = select.select([self.sock], [], [], max(timeout, 0))
        if not ready:
            return
        data = self.sock.recv(1 << 20)
        if not data:
            self.eof = True
            return
        self.buf += data
        while len(self.buf) >= 5:
            length, frame_type = struct.unpack_from("=IB", self.buf)
            if len(self.buf) < 5 + length:
                break
            body, self.buf = self.buf[5:5 + length], self.buf[5 + length:]
            self.handle(frame_type, body)

    def wait_for(self, condition, timeout, what):
        deadline = time.monotonic() + timeout
        while not condition():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CheckFailed(f"{what}: not within {timeout} s")
            if self.eof and self.proc.poll() is not None:
                raise CheckFailed(f"{what}: the process exited ({self.proc.returncode})")
            self.pump(min(remaining, 0.2))

    def reply(self, timeout=TIMEOUT, what="a reply"):
        self.wait_for(lambda: self.replies, timeout, what)
        return self.replies.pop(0)

    def ready(self):
        kind, reason = self.reply(what="READY")
        if kind != READY:
            raise CheckFailed(f"FAILED instead of READY: {reason}")

    def fetch(self, max_messages=1000, max_bytes=1 << 20, timeout=TIMEOUT):
        self.send(FETCH, struct.pack("=II", max_messages, max_bytes))
        kind, answer = self.reply(timeout, "MESSAGES for a FETCH")
        if kind != MESSAGES:
            raise CheckFailed(f"frame {kind} instead of MESSAGES")
        return answer

    def no_reply_within(self, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.replies:
            self.pump(deadline - time.monotonic())
        return not self.replies

    def assigned_for(self, topic):
        return {p: (start, high) for t, p, start, high in self.assigned if t == topic}

    def close(self):
        """End of file on the socket: the process must exit 0, promptly."""
        started = time.monotonic()
        self.sock.shutdown(socket.SHUT_WR)
        try:
            status = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise CheckFailed("the process did not exit within 10 s of end of file")
        self.sock.close()
        return status, time.monotonic() - started


# --- test data ---------------------------------------------------------------

def create_topic(name, partitions):
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                        request_timeout=TIMEOUT)[name].result()
    wait_for_partitions(name, partitions)


def wait_for_partitions(name, partitions):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        topic = admin.list_topics(topic=name, timeout=TIMEOUT).topics.get(name)
        if (topic is not None and topic.error is None and len(topic.partitions) == partitions
                and all(p.leader >= 0 for p in topic.partitions.values())):
            return
        time.sleep(0.1)
    raise CheckFailed(f"topic {name} has no {partitions} partitions with leaders")


def produce(records):
    """Produce each record (a dict of Producer.produce's arguments); returns them
    with the partition and offset each got, in the order given."""
    producer = Producer({"bootstrap.servers": args.brokers, "enable.idempotence": True,
                         "log_level": 3})
    delivered = {}

    def report(i):
        def on_delivery(err, msg):
            if err is not None:
                raise CheckFailed(f"producing test data: {err}")
            delivered[i] = (msg.partition(), msg.offset())
        return on_delivery

    for i, record in enumerate(records):
        producer.produce(on_delivery=report(i), **record)
        producer.poll(0)
    if producer.flush(TIMEOUT) != 0 or len(delivered) != len(records):
        raise CheckFailed("producing test data: not every record was delivered")
    return [dict(record, partition=delivered[i][0], offset=delivered[i][1])
            for i, record in enumerate(records)]


def read_all(kp, expected, max_messages=1000, max_bytes=1 << 20):
    """FETCH until expected messages came; returns them and the last watermarks."""
    messages, watermarks = [], {}
    while len(messages) < expected:
        batch, marks = kp.fetch(max_messages, max_bytes)
        check_watermarks_cover(batch, marks)
        messages.extend(batch)
        watermarks.update(marks)
    return messages, watermarks


def check_watermarks_cover(batch, marks):
    present = {(m["topic"], m["partition"]) for m in batch}
    if set(marks) != present:
        raise CheckFailed(f"MESSAGES' watermarks are for {sorted(marks)}, its messages for {sorted(present)}")
    for m in batch:
        if marks[(m["topic"], m["partition"])] <= m["offset"]:
            raise CheckFailed(f"watermark {marks[(m['topic'], m['partition'])]} not past offset {m['offset']}")


def check_in_order(messages, what):
    last = {}
    for m in messages:
        key = (m["topic"], m["partition"])
        if key in last and m["offset"] != last[key] + 1:
            raise CheckFailed(f"{what}: partition {key} went from offset {last[key]} to {m['offset']}")
        last[key] = m["offset"]


def highs_of(produced):
    highs = {}
    for record in produced:
        highs[record["partition"]] = max(highs.get(record["partition"], 0), record["offset"] + 1)
    return highs


# --- scenarios -----------------------------------------------------------------

def earliest_reads_everything_once():
    topic = unique("earliest")
    create_topic(topic, 3)
    base_ms = int(time.time() * 1000) - 60000
    binary = bytes(range(256))
    records = [{"topic": topic, "key": f"key-{i % 7}".encode(), "value": f"value-{i}".encode(),
                "timestamp": base_ms + i, "headers": [("seq", str(i).encode())]}
               for i in range(300)]
    records += [
        {"topic": topic, "partition": 0, "key": None, "value": b"null key", "timestamp": base_ms + 1000},
        {"topic": topic, "partition": 1, "key": b"null value", "value": None, "timestamp": base_ms + 1001},
        {"topic": topic, "partition": 2, "key": b"null header", "value": b"v", "timestamp": base_ms + 1002,
         "headers": [("empty", None), ("dup", b"1"), ("dup", b"2")]},
        {"topic": topic, "partition": 0, "key": binary, "value": binary * 3, "timestamp": base_ms + 1003,
         "headers": [("bin", binary)]},
        {"topic": topic, "partition": 1, "key": b"", "value": b"", "timestamp": base_ms + 1004},
    ]
    produced = produce(records)
    highs = highs_of(produced)

    kp = KafkaProcess()
    kp.ready()
    kp.assign([topic])
    kp.wait_for(lambda: len(kp.assigned_for(topic)) == 3, TIMEOUT, "ASSIGNED for 3 partitions")
    assigned = kp.assigned_for(topic)
    check(assigned == {p: (0, highs[p]) for p in range(3)},
          f"earliest: ASSIGNED lists every partition from offset 0 with its high watermark ({assigned})")
    check(kp.no_reply_within(1.0), "no MESSAGES frame comes before a FETCH")

    messages, watermarks = read_all(kp, len(produced), max_messages=64)
    by_position = {(r["partition"], r["offset"]): r for r in produced}
    got = [(m["partition"], m["offset"]) for m in messages]
    check(len(got) == len(set(got)) == len(produced) and set(got) == set(by_position),
          f"earliest: every one of the {len(produced)} messages of 3 partitions read exactly once")
    check_in_order(messages, "earliest")
    check(True, "earliest: each partition's messages in its order")
    check(all(watermarks[(topic, p)] == highs[p] for p in range(3)),
          f"MESSAGES' watermarks are the partitions' high watermarks ({watermarks})")

    def headers_of(record):
        return [(k, v) for k, v in record.get("headers") or []]

    mismatched = [m for m in messages
                  if (m["key"], m["value"], m["timestamp"], m["headers"])
                  != (by_position[(m["partition"], m["offset"])]["key"],
                      by_position[(m["partition"], m["offset"])]["value"],
                      by_position[(m["partition"], m["offset"])]["timestamp"],
                      headers_of(by_position[(m["partition"], m["offset"])]))]
    check(not mismatched, "keys, values, headers and timestamps intact, NULL key, NULL value, "
          "NULL header value, empty and binary bytes included"
          + (f" (first mismatch {mismatched[0]})" if mismatched else ""))
    special = {m["key"]: m for m in messages if m["key"] is None or not m["key"].startswith(b"key-")}
    check(special[None]["value"] == b"null key" and special[b"null value"]["value"] is None
          and special[b"null header"]["headers"][0] == ("empty", None)
          and special[b""]["value"] == b"" and special[bytes(range(256))]["value"] == binary * 3,
          "NULL key and value come as length -1, distinct from empty ones")

    # A FETCH waits for a message, and is answered once one is produced.
    kp.send(FETCH, struct.pack("=II", 10, 1 << 20))
    check(kp.no_reply_within(1.0), "a FETCH with nothing to read waits")
    late = produce([{"topic": topic, "partition": 2, "key": b"late", "value": b"late"}])[0]
    kind, (batch, marks) = kp.reply(what="MESSAGES for a waiting FETCH")
    check(kind == MESSAGES and [(m["partition"], m["offset"], m["value"]) for m in batch]
          == [(2, late["offset"], b"late")] and marks == {(topic, 2): late["offset"] + 1},
          "the waiting FETCH is answered when a message comes, with its watermark")
    status, seconds = kp.close()
    check(status == 0 and seconds < 5, f"end of file: exit status 0 after {seconds:.2f} s")

    # Nothing was committed under the group.id the process uses.
    consumer = Consumer({"bootstrap.servers": args.brokers, "group.id": DEFAULT_GROUP_ID,
                         "enable.auto.commit": False})
    committed = consumer.committed([TopicPartition(topic, p) for p in range(3)], timeout=TIMEOUT)
    consumer.close()
    check(all(tp.offset < 0 for tp in committed),
          f"no offset committed to Kafka ({[tp.offset for tp in committed]})")


def fetch_limits():
    topic = unique("limits")
    create_topic(topic, 1)
    produce([{"topic": topic, "key": b"k%08d" % i, "value": bytes([i]) * 1000} for i in range(20)])
    kp = KafkaProcess()
    kp.ready()
    kp.assign([topic])
    kp.wait_for(lambda: kp.assigned_for(topic), TIMEOUT, "ASSIGNED")
    time.sleep(1.0)     # let librdkafka prefetch all 20

    batch, _ = kp.fetch(max_messages=5)
    check([m["offset"] for m in batch] == [0, 1, 2, 3, 4], "FETCH returns at most max_messages")
    batch, _ = kp.fetch(max_messages=100, max_bytes=2500)     # 1,009 bytes a message
    check([m["offset"] for m in batch] == [5, 6], "FETCH returns at most max_bytes of keys and values")
    batch, _ = kp.fetch(max_messages=100, max_bytes=10)
    check([m["offset"] for m in batch] == [7], "FETCH returns its first message even over max_bytes")
    rest, _ = read_all(kp, 12, max_messages=100, max_bytes=3 * 1009)
    check([m["offset"] for m in rest] == list(range(8, 20)), "the rest follow, none lost or repeated")
    status, _ = kp.close()
    check(status == 0, "end of file: exit status 0")


def listed_positions():
    topic = unique("positions")
    create_topic(topic, 3)
    produce([{"topic": topic, "partition": p, "value": b"%d-%d" % (p, i)}
             for p in range(3) for i in range(10)])
    kp = KafkaProcess()
    kp.ready()
    kp.assign([topic], positions=[(topic, 0, 4), (topic, 1, 10)])
    kp.wait_for(lambda: len(kp.assigned_for(topic)) == 3, TIMEOUT, "ASSIGNED for 3 partitions")
    check(kp.assigned_for(topic) == {0: (4, 10), 1: (10, 10), 2: (0, 10)},
          f"listed positions: ASSIGNED starts there, the others at the earliest ({kp.assigned_for(topic)})")
    messages, _ = read_all(kp, 16)
    got = sorted((m["partition"], m["offset"]) for m in messages)
    check(got == [(0, o) for o in range(4, 10)] + [(2, o) for o in range(10)],
          "listed positions are honoured")
    kp.send(FETCH, struct.pack("=II", 10, 1 << 20))
    check(kp.no_reply_within(1.0), "nothing before the positions is read")
    status, _ = kp.close()
    check(status == 0, "end of file with a FETCH outstanding: exit status 0")


def start_time():
    topic = unique("start_ms")
    create_topic(topic, 2)
    base_ms = int(time.time() * 1000) - 60000
    produce([{"topic": topic, "partition": 0, "value": b"%d" % i, "timestamp": base_ms + 1000 * i}
             for i in range(10)]
            + [{"topic": topic, "partition": 1, "value": b"old %d" % i, "timestamp": base_ms + i}
               for i in range(5)])
    kp = KafkaProcess()
    kp.ready()
    kp.assign([topic], start_ms=base_ms + 5000)
    kp.wait_for(lambda: len(kp.assigned_for(topic)) == 2, TIMEOUT, "ASSIGNED for 2 partitions")
    check(kp.assigned_for(topic) == {0: (5, 10), 1: (5, 5)},
          f"start_ms: ASSIGNED starts at the first message stamped at or after it, "
          f"else at the end ({kp.assigned_for(topic)})")
    messages, _ = read_all(kp, 5)
    check([(m["partition"], m["offset"]) for m in messages] == [(0, o) for o in range(5, 10)],
          "start_ms is honoured")
    produce([{"topic": topic, "partition": 1, "value": b"new"}])
    batch, _ = kp.fetch()
    check([(m["partition"], m["offset"], m["value"]) for m in batch] == [(1, 5, b"new")],
          "a partition started at its end reads what comes next")
    status, _ = kp.close()
    check(status == 0, "end of file: exit status 0")


def missing_topic_and_new_partitions():
    missing, growing = unique("missing"), unique("growing")
    create_topic(growing, 1)
    produce([{"topic": growing, "value": b"first %d" % i} for i in range(3)])
    kp = KafkaProcess()
    kp.ready()
    kp.assign([missing, growing])
    kp.wait_for(lambda: kp.assigned_for(growing) and kp.consume_errors, TIMEOUT,
                "ASSIGNED for the topic there and CONSUME_ERROR for the missing one")
    time.sleep(2.5)     # a few rechecks
    kp.pump(0.1)
    errors = [e for e in kp.consume_errors if e[0] == missing]
    check(len(errors) == 1 and errors[0][1] == -1 and errors[0][2] == UNKNOWN_TOPIC_OR_PART,
          f"a missing topic gives one CONSUME_ERROR (partition -1), not one per recheck ({kp.consume_errors})")
    messages, _ = read_all(kp, 3)
    check([m["value"] for m in messages] == [b"first 0", b"first 1", b"first 2"],
          "the missing topic holds back no other")
    topics = admin.list_topics(timeout=TIMEOUT).topics
    check(missing not in topics, "asking about the missing topic did not create it")

    create_topic(missing, 2)
    produce([{"topic": missing, "partition": p, "value": b"created %d" % p} for p in range(2)])
    messages, _ = read_all(kp, 2)
    assigned = kp.assigned_for(missing)
    check(sorted(m["value"] for m in messages) == [b"created 0", b"created 1"]
          and set(assigned) == {0, 1} and all(assigned[p][0] == 0 and assigned[p][1] in (0, 1) for p in (0, 1)),
          f"the topic, once created, is assigned and read ({kp.assigned_for(missing)})")

    started = time.monotonic()
    admin.create_partitions([NewPartitions(growing, 3)], request_timeout=TIMEOUT)[growing].result()
    wait_for_partitions(growing, 3)
    produce([{"topic": growing, "partition": p, "value": b"gained %d" % p} for p in (1, 2)])
    messages, _ = read_all(kp, 2)
    check(sorted((m["partition"], m["value"]) for m in messages) == [(1, b"gained 1"), (2, b"gained 2")]
          and set(kp.assigned_for(growing)) == {0, 1, 2}
          and all(kp.assigned_for(growing)[p][0] == 0 for p in (1, 2)),
          f"partitions added later are assigned from the start rule and read, "
          f"after {time.monotonic() - started:.1f} s")
    status, _ = kp.close()
    check(status == 0, "end of file: exit status 0")


def out_of_range():
    topic = unique("out_of_range")
    create_topic(topic, 1)
    produce([{"topic": topic, "value": b"%d" % i} for i in range(3)])
    kp = KafkaProcess()
    kp.ready()
    kp.assign([topic], positions=[(topic, 0, 1000)])
    messages, _ = read_all(kp, 3)
    check([m["offset"] for m in messages] == [0, 1, 2],
          "a listed position out of range: read from the earliest, the default auto.offset.reset")
    kp.close()

    kp = KafkaProcess(properties=[("auto.offset.reset", "error")])
    kp.ready()
    kp.assign([topic], positions=[(topic, 0, 1000)])
    kp.send(FETCH, struct.pack("=II", 10, 1 << 20))
    kp.wait_for(lambda: kp.consume_errors, TIMEOUT, "CONSUME_ERROR for an offset out of range")
    topic_of, partition, error, reason = kp.consume_errors[0]
    check((topic_of, partition, error) == (topic, 0, AUTO_OFFSET_RESET) and not kp.replies,
          f"a message error (auto.offset.reset=error, the worker's property) comes as CONSUME_ERROR "
          f"of its partition, not MESSAGES: {reason}")
    status, _ = kp.close()
    check(status == 0, "end of file: exit status 0")


def no_broker():
    kp = KafkaProcess(properties=[("bootstrap.servers", "127.0.0.1:1")])
    kp.ready()
    kp.assign([unique("no_broker")])
    kp.send(FETCH, struct.pack("=II", 10, 1 << 20))
    kp.wait_for(lambda: kp.consume_errors, TIMEOUT, "CONSUME_ERROR with no broker")
    check(kp.consume_errors[0][1] == -1 and kp.consume_errors[0][2] < 0,
          f"no broker: the topic cannot be read, a local error ({kp.consume_errors[0]})")
    status, seconds = kp.close()
    check(status == 0 and seconds < 5, f"no broker, end of file: exit status 0 after {seconds:.2f} s")


def bad_property():
    for name, value in (("no.such.property", "1"), ("auto.offset.reset", "sideways")):
        kp = KafkaProcess(properties=[(name, value)])
        kind, reason = kp.reply(what="FAILED")
        check(kind == FAILED and name in reason and value not in reason,
              f"a bad property ({name}) gives FAILED naming it, not its value: {reason}")
        try:
            status = kp.proc.wait(10)
        except subprocess.TimeoutExpired:
            kp.proc.kill()
            raise CheckFailed("the process did not exit after FAILED")
        check(status != 0, f"and the process exits ({status})")
        kp.sock.close()


def main():
    global args, admin
    parser = argparse.ArgumentParser()
    parser.add_argument("--exe", required=True)
    parser.add_argument("--brokers", default=os.environ.get(
        "OUTBOX_KAFKA_BROKERS", "127.0.0.1:" + os.environ.get("KAFKA_PORT", "19092")))
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("scenarios", nargs="*")
    args = parser.parse_args()
    admin = AdminClient({"bootstrap.servers": args.brokers})
    scenarios = [bad_property, earliest_reads_everything_once, fetch_limits, listed_positions,
                 start_time, out_of_range, missing_topic_and_new_partitions, no_broker]
    started = time.monotonic()
    try:
        for scenario in scenarios:
            if not args.scenarios or scenario.__name__ in args.scenarios:
                print(f"# {scenario.__name__}", flush=True)
                scenario()
    except CheckFailed as failure:
        print(f"FAIL: {failure}", flush=True)
        return 1
    print(f"# all checks passed in {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

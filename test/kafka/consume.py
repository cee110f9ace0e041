#!/usr/bin/python3
# Read Kafka topics from the beginning and print one JSON object per message:
#   consume.py --brokers B --topic T [--topic T2 ...] [--expect N] [--timeout S] [--idle S] [--digest]
#              [--read-uncommitted]
# {"topic", "partition", "offset", "key" | "key_b64", "value" | "value_b64",
#  "headers": [[name, value], ...], "timestamp" (ms), "timestamp_type"}
# Keys and values that are not UTF-8 come base64-encoded under *_b64; such a
# header value becomes {"b64": "..."}.  With --digest a value is shown as
# "value_md5" and "value_length" instead, for payloads too large to pass
# around as JSON.
#
# Stops at --expect N messages, or when every partition has been read to its
# end and nothing arrived for --idle seconds (default 3 without --expect; with
# --expect only when given), or at --timeout (default 60). A topic that does not
# exist counts as empty; it is picked up if it appears while we wait.
# Only committed transactional messages are shown (librdkafka's read_committed),
# unless --read-uncommitted: then those of aborted transactions too.
#
# /usr/bin/python3 on purpose: confluent_kafka comes from Debian's
# python3-confluent-kafka, which other interpreters (pyenv) do not see.
import argparse
import base64
import ctypes
import hashlib
import json
import sys
import time
import uuid

from confluent_kafka import (OFFSET_BEGINNING, TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME,
                             Consumer, KafkaError, KafkaException, TopicPartition)

TIMESTAMP_TYPES = {TIMESTAMP_CREATE_TIME: "CreateTime", TIMESTAMP_LOG_APPEND_TIME: "LogAppendTime"}


def take_missing_reference(obj):
    """confluent-kafka-python 1.7.0 (Debian 12) hands out a null header value
    as None without taking a reference to it (its issue #1191): after a few
    thousand, None's count reaches zero and Python aborts.  Take the
    reference it should have taken, for good."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def decode(data):
    """(text, None) for UTF-8 or absent data, (None, base64) otherwise."""
    if data is None:
        return None, None
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, base64.b64encode(data).decode("ascii")


def record(msg, digest):
    out = {"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset()}
    fields = [("key", msg.key())]
    if digest:
        value = msg.value() or b""
        out["value_md5"] = hashlib.md5(value).hexdigest()
        out["value_length"] = len(value)
    else:
        fields.append(("value", msg.value()))
    for name, data in fields:
        text, b64 = decode(data)
        if b64 is None:
            out[name] = text
        else:
            out[name + "_b64"] = b64
    out["headers"] = []
    for name, data in msg.headers() or []:
        if data is None:
            take_missing_reference(data)
        text, b64 = decode(data)
        out["headers"].append([name, text if b64 is None else {"b64": b64}])
    ts_type, ts = msg.timestamp()
    out["timestamp"] = ts if ts_type in TIMESTAMP_TYPES else None
    out["timestamp_type"] = TIMESTAMP_TYPES.get(ts_type)
    return out


def partitions(consumer, topics):
    """{(topic, partition)} of the topics that exist now."""
    meta = consumer.list_topics(timeout=10).topics
    return {(t, p) for t in topics if t in meta and meta[t].error is None
            for p in meta[t].partitions}


def main():
    parser = argparse.ArgumentParser(description="print Kafka messages as JSON lines")
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--topic", action="append", required=True)
    parser.add_argument("--expect", type=int)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--idle", type=float)
    parser.add_argument("--digest", action="store_true", help="values as md5 and length")
    parser.add_argument("--read-uncommitted", action="store_true",
                        help="isolation.level=read_uncommitted")
    args = parser.parse_args()
    idle = args.idle if args.idle is not None or args.expect is not None else 3

    # Partitions are assigned explicitly, so the group id only satisfies
    # librdkafka: no group join, no rebalance delay, nothing committed.
    consumer = Consumer({"bootstrap.servers": args.brokers,
                         "group.id": f"consume-py-{uuid.uuid4()}",
                         "enable.auto.commit": False,
                         "enable.partition.eof": True,
                         "isolation.level": "read_uncommitted" if args.read_uncommitted
                         else "read_committed"})
    try:
        known = partitions(consumer, args.topic)
    except KafkaException as e:
        sys.exit(f"consume.py: no metadata from {args.brokers}: {e.args[0]}")
    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in known])

    at_end = set()
    count = 0
    start = last_event = time.monotonic()
    next_refresh = start + 1
    while args.expect is None or count < args.expect:
        now = time.monotonic()
        if now - start >= args.timeout:
            print(f"consume.py: timeout after {args.timeout}s with {count} messages",
                  file=sys.stderr)
            break
        if idle is not None and at_end == known and now - last_event >= idle:
            break
        if now >= next_refresh:
            next_refresh = now + 1
            try:  # topics created (or partitions added) since we started
                new = partitions(consumer, args.topic) - known
            except KafkaException:
                new = set()  # broker briefly away: keep reading what we have
            if new:
                consumer.incremental_assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in new])
                known |= new
                last_event = now
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        last_event = time.monotonic()
        err = msg.error()
        if err is None:
            at_end.discard((msg.topic(), msg.partition()))
            print(json.dumps(record(msg, args.digest)), flush=True)
            count += 1
        elif err.code() == KafkaError._PARTITION_EOF:
            at_end.add((msg.topic(), msg.partition()))
        elif err.fatal():
            sys.exit(f"consume.py: {err}")
        else:
            print(f"consume.py: {err}", file=sys.stderr)
    consumer.close()


if __name__ == "__main__":
    main()

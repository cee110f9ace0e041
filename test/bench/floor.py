#!/usr/bin/python3
# B3's floor: messages produced straight to Kafka, with no database in the
# way, carrying their send time as B3's payloads carry their enqueue time.
# What bench.py's consumer measures on them is what the broker and the
# consumer alone cost on this machine: no peer can do better.  They come as
# B3's load comes from pgbench -R: transactions of --per-transaction
# messages, at random times (a Poisson process, as pgbench's schedule; its 4
# clients together make one), not one message every 1/rate s, whose even
# pace would spare the broker the small bursts the peers meet.
#
#   floor.py --brokers B --topic T --rate MSG_PER_S --seconds S [--per-transaction N]
#            [--burst N --burst-topic T2]
#
# With --burst, N messages are first produced to T2 as fast as the producer
# goes, and flushed: the load then meets the broker as B3's after a burst
# meets it.
#
# /usr/bin/python3 on purpose: Debian's python3-confluent-kafka.
import argparse
import json
import random
import time

from confluent_kafka import Producer


def burst(producer, topic, n):
    """n messages of about 200 bytes, as fast as the producer takes them."""
    for i in range(n):
        while True:
            try:
                producer.produce(topic, json.dumps({"seq": i, "pad": "x" * 180}), "key-%d" % (i % 1000))
                break
            except BufferError:     # its queue is full: let it send
                producer.poll(0.01)
        producer.poll(0)
    producer.flush()


def main():
    parser = argparse.ArgumentParser(description="produce timestamped messages at a steady rate")
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--per-transaction", type=int, default=1)
    parser.add_argument("--burst", type=int, default=0)
    parser.add_argument("--burst-topic")
    args = parser.parse_args()

    # As the peers' producers, but holding messages back 1 ms at most: 0
    # would make one request per message, which at 10,000/s costs the broker
    # more than it saves.
    producer = Producer({"bootstrap.servers": args.brokers, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 1})
    # Its partitions looked up first, as a producer in service knows the
    # topics it writes to: else the first messages wait for the look-up
    # (up to a second here, after a burst).
    producer.list_topics(args.topic, timeout=10)
    burst(producer, args.burst_topic, args.burst)
    transactions_per_s = args.rate / args.per_transaction
    due = time.monotonic()
    for _ in range(int(transactions_per_s * args.seconds)):
        due += random.expovariate(transactions_per_s)
        time.sleep(max(0.0, due - time.monotonic()))
        first_key = random.randrange(1000)
        for g in range(args.per_transaction):
            payload = {"t": round(time.time() * 1000, 3), "pad": "x" * 170}
            producer.produce(args.topic, json.dumps(payload), "key-%d" % ((first_key + g) % 1000))
        producer.poll(0)
    producer.flush()


if __name__ == "__main__":
    main()

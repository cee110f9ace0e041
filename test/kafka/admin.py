#!/usr/bin/python3
# Topic administration for the tests.
#   admin.py --brokers B create-topic NAME [--partitions N] [--replication-factor N]
#                                          [--config k=v ...] [--if-not-exists]
#   admin.py --brokers B alter-config NAME k=v ...
#   admin.py --brokers B delete-topic NAME
#   admin.py --brokers B add-partitions NAME TOTAL   (the topic then has TOTAL)
#   admin.py --brokers B list-topics
#   admin.py --brokers B produce NAME [--partition N] [--key K] [--value-hex HEX]
#                                     [--header name=value ...] [--null-value]
#       one record, as a producer other than the outbox would send it (keys and
#       header values are text; --value-hex gives the value's bytes); waits for
#       its acknowledgement and prints "partition offset"
#   admin.py --brokers B leaders NAME ...
#       one line per partition: topic, partition, leader (-1 if none), and the
#       in-sync replicas, comma-separated, as the broker answering knows them
# /usr/bin/python3 on purpose: confluent_kafka comes from Debian's
# python3-confluent-kafka, which other interpreters (pyenv) do not see.
import argparse
import sys
import time

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewPartitions, NewTopic

TIMEOUT = 30


def key_values(pairs):
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            sys.exit(f"admin.py: expected k=v, got {pair!r}")
        out[key] = value
    return out


def wait_metadata(admin, name, present):
    """Wait until the broker's metadata shows the topic (with a leader for every
    partition) or no longer shows it: the controller acknowledges before the
    broker has applied the change, and a test producing right after would race."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        topic = admin.list_topics(timeout=TIMEOUT).topics.get(name)
        ready = (topic is not None and topic.error is None and topic.partitions
                 and all(p.leader >= 0 for p in topic.partitions.values()))
        if bool(ready) == present:
            return
        time.sleep(0.1)
    sys.exit(f"admin.py: topic {name} still {'missing' if present else 'present'} after {TIMEOUT}s")


def create_topic(admin, args):
    topic = NewTopic(args.name, num_partitions=args.partitions,
                     replication_factor=args.replication_factor,
                     config=key_values(args.config))
    try:
        admin.create_topics([topic], request_timeout=TIMEOUT)[args.name].result()
    except KafkaException as e:
        if not (args.if_not_exists and e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise
    wait_metadata(admin, args.name, True)


def alter_config(admin, args):
    # librdkafka 2.0.2 has no IncrementalAlterConfigs, and AlterConfigs replaces
    # all of a topic's dynamic configs: carry the existing ones over.
    resource = ConfigResource(ConfigResource.Type.TOPIC, args.name)
    current = admin.describe_configs([resource], request_timeout=TIMEOUT)[resource].result()
    configs = {k: c.value for k, c in current.items()
               if ConfigSource(c.source) == ConfigSource.DYNAMIC_TOPIC_CONFIG}
    configs.update(key_values(args.pairs))
    resource = ConfigResource(ConfigResource.Type.TOPIC, args.name, set_config=configs)
    admin.alter_configs([resource], request_timeout=TIMEOUT)[resource].result()


def add_partitions(admin, args):
    admin.create_partitions([NewPartitions(args.name, args.total)],
                            request_timeout=TIMEOUT)[args.name].result()
    deadline = time.time() + TIMEOUT
    while time.time() < deadline:
        topic = admin.list_topics(args.name, timeout=TIMEOUT).topics.get(args.name)
        if topic is not None and len(topic.partitions) == args.total and \
                all(p.leader >= 0 for p in topic.partitions.values()):
            return
        time.sleep(0.1)
    sys.exit(f"admin.py: topic {args.name} has not {args.total} partitions after {TIMEOUT}s")


def delete_topic(admin, args):
    admin.delete_topics([args.name], request_timeout=TIMEOUT)[args.name].result()
    wait_metadata(admin, args.name, False)


def list_topics(admin, args):
    for name in sorted(admin.list_topics(timeout=TIMEOUT).topics):
        print(name)


def leaders(admin, args):
    topics = admin.list_topics(timeout=TIMEOUT).topics
    for name in args.names:
        topic = topics.get(name)
        if topic is None or topic.error is not None:
            sys.exit(f"admin.py: no topic {name}: {topic.error if topic else 'not in metadata'}")
        for p in sorted(topic.partitions.values(), key=lambda p: p.id):
            print(name, p.id, p.leader, ",".join(str(r) for r in sorted(p.isrs)))


def produce(admin, args):
    producer = Producer({"bootstrap.servers": args.brokers, "enable.idempotence": True})
    done = {}

    def report(err, msg):
        done["err"], done["msg"] = err, msg

    value = None if args.null_value else bytes.fromhex(args.value_hex)
    headers = [tuple(key_values([h]).items())[0] for h in args.header]
    extra = {} if args.partition is None else {"partition": args.partition}
    producer.produce(args.name, value=value, key=args.key, headers=headers,
                     on_delivery=report, **extra)
    producer.flush(TIMEOUT)
    if done.get("err") is not None or "msg" not in done:
        sys.exit(f"admin.py produce: {done.get('err', 'not acknowledged')}")
    print(done["msg"].partition(), done["msg"].offset())


def main():
    parser = argparse.ArgumentParser(description="Kafka topic administration for tests")
    parser.add_argument("--brokers", required=True)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("create-topic")
    p.add_argument("name")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--replication-factor", type=int, default=1)
    p.add_argument("--config", action="append", default=[], metavar="K=V")
    p.add_argument("--if-not-exists", action="store_true")
    p.set_defaults(run=create_topic)
    p = sub.add_parser("alter-config")
    p.add_argument("name")
    p.add_argument("pairs", nargs="+", metavar="K=V")
    p.set_defaults(run=alter_config)
    p = sub.add_parser("delete-topic")
    p.add_argument("name")
    p.set_defaults(run=delete_topic)
    p = sub.add_parser("add-partitions")
    p.add_argument("name")
    p.add_argument("total", type=int)
    p.set_defaults(run=add_partitions)
    p = sub.add_parser("list-topics")
    p.set_defaults(run=list_topics)
    p = sub.add_parser("produce")
    p.add_argument("name")
    p.add_argument("--partition", type=int)
    p.add_argument("--key")
    p.add_argument("--value-hex", default="")
    p.add_argument("--null-value", action="store_true")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    p.set_defaults(run=produce)
    p = sub.add_parser("leaders")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.set_defaults(run=leaders)
    args = parser.parse_args()

    admin = AdminClient({"bootstrap.servers": args.brokers})
    try:
        args.run(admin, args)
    except KafkaException as e:
        sys.exit(f"admin.py {args.command}: {e.args[0]}")


if __name__ == "__main__":
    main()

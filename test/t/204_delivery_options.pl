# outbox_enqueue()'s partition, deliver_after and deliver_at, and the trace
# context, as a consumer sees them in Kafka:
#
# - a key goes to the partition a Java producer sends it to (murmur2);
# - partition => n puts the record in partition n, whatever its key; a
#   partition the topic has not is dead-lettered at once with librdkafka's
#   reason, holds up no later message of its key, and once the topic has the
#   partition a requeue delivers it there;
# - a delayed message is published once its time has come, not before, and
#   not a poll interval later (the worker learns of it at commit); it holds
#   back the later messages of its key, and only those;
# - the W3C trace context of the enqueuing transaction (outbox.traceparent
#   and outbox.tracestate, or a sqlcommenter comment) arrives as the
#   traceparent and tracestate headers.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;

# A poll interval longer than every deadline below: a delayed message
# published on time was not found by a poll.
my $node = outbox_node('delivery_options', conf => join("\n",
		"outbox.poll_interval = '5min'",
		"outbox.sent_retention = '1h'"));

# The partition of each key for a Java producer's default partitioner:
# toPositive(murmur2(key)) % partitions, as Kafka's Utils computes it.
sub java_partitions
{
	my ($partitions, @keys) = @_;
	my $murmur2 = <<'PY';
import sys
def murmur2(data):
    m, r = 0x5bd1e995, 24
    h = (0x9747b28c ^ len(data)) & 0xffffffff
    whole = len(data) // 4 * 4
    for i in range(0, whole, 4):
        k = (int.from_bytes(data[i:i + 4], 'little') * m) & 0xffffffff
        k = ((k ^ (k >> r)) * m) & 0xffffffff
        h = ((h * m) & 0xffffffff) ^ k
    tail = data[whole:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if len(tail) >= 1:
        h = ((h ^ tail[0]) * m) & 0xffffffff
    h = ((h ^ (h >> 13)) * m) & 0xffffffff
    return h ^ (h >> 15)
for key in sys.argv[2:]:
    print(key, (murmur2(key.encode()) & 0x7fffffff) % int(sys.argv[1]))
PY
	my ($out, $err);
	IPC::Run::run([ '/usr/bin/python3', '-c', $murmur2, $partitions, @keys ], '>', \$out, '2>', \$err)
	  or die "murmur2: $err";
	return map { split / / } split /\n/, $out;
}

sub headers_of
{
	my ($record) = @_;
	return { map { ($_->[0] => $_->[1]) } @{ $record->{headers} } };
}

# Partitions.
my $partitioned = unique_topic('options.partition');
kafka_admin('create-topic', $partitioned, '--partitions', 3);
$node->safe_psql('postgres', qq{
	SELECT count(outbox_enqueue('$partitioned', 'to 2, ' || i, 'key-' || i, partition => 2)) FROM generate_series(1, 6) i;
	SELECT count(outbox_enqueue('$partitioned', 'by key, ' || i, 'key-' || i)) FROM generate_series(1, 6) i;
	SELECT outbox_enqueue('$partitioned', 'to 7'::text, 'key-bad', partition => 7);
	SELECT outbox_enqueue('$partitioned', 'after the one to 7'::text, 'key-bad');
});
my $records = consume_topics(topics => [$partitioned], expect => 13, timeout => 60);
is(scalar(@$records), 13, 'every message but the one to a partition the topic has not is delivered');
is(join(',', sort map { $_->{value} } grep { $_->{partition} == 2 && $_->{value} =~ /^to 2/ } @$records),
	join(',', map { "to 2, $_" } 1 .. 6), 'each message sent to partition 2 is in partition 2, whatever its key');
my %key_partitions;
$key_partitions{ $_->{key} }{ $_->{partition} } = 1 for grep { $_->{value} =~ /^by key/ } @$records;
ok(scalar(grep { keys %{ $key_partitions{$_} } == 1 } keys %key_partitions) == 6
	  && scalar(keys %{ { map { (keys %{ $key_partitions{$_} }) => 1 } keys %key_partitions } }) > 1,
	'the others go by key: one partition per key, and not all in one');
my %java = java_partitions(3, keys %key_partitions);
is(join(',', map { "$_:" . join('', keys %{ $key_partitions{$_} }) } sort keys %key_partitions),
	join(',', map { "$_:$java{$_}" } sort keys %java),
	'each key in the partition a Java producer (Kafka Connect, Debezium) sends it to: murmur2');
ok(wait_for_query($node, "SELECT count(*) FROM outbox_dead_letter WHERE topic = '$partitioned'", '1', 30),
	'the message to partition 7 is dead-lettered');
is($node->safe_psql('postgres', qq{
	SELECT convert_from(payload, 'UTF8'), key, target_partition, attempts, error
	  FROM outbox_dead_letter WHERE topic = '$partitioned'}),
	'to 7|key-bad|7|1|Local: Unknown partition',
	'at its first attempt, with the reason, its partition kept');
is(join(',', map { $_->{value} } grep { ($_->{key} // '') eq 'key-bad' } @$records), 'after the one to 7',
	'the later message of its key is delivered');

kafka_admin('add-partitions', $partitioned, 8);
$node->safe_psql('postgres', "SELECT outbox_requeue(id) FROM outbox_dead_letter WHERE topic = '$partitioned'");
$records = consume_topics(topics => [$partitioned], expect => 14, timeout => 60);
is(join(',', map { "$_->{value}\@$_->{partition}" } grep { $_->{value} eq 'to 7' } @$records), 'to 7@7',
	'requeued once the topic has 8 partitions, it is delivered to partition 7');

# Delays.  A waits 10 seconds; B, of the same key, waits behind it; C, of
# another key, goes at once.
my $delayed = unique_topic('options.delay');
kafka_admin('create-topic', $delayed);
my ($a_id, $b_id, $c_id) = split /\n/, $node->safe_psql('postgres', qq{
	BEGIN;
	SELECT outbox_enqueue('$delayed', 'A'::text, 'k', deliver_after => '10 seconds');
	SELECT outbox_enqueue('$delayed', 'B'::text, 'k');
	SELECT outbox_enqueue('$delayed', 'C'::text, 'other');
	COMMIT;
});
ok(wait_for_query($node, "SELECT state FROM outbox_message WHERE id = $c_id", 'sent', 30),
	'a message of another key goes at once');
is($node->safe_psql('postgres', qq{
	SELECT string_agg(state || ':' || attempts, ',' ORDER BY id) FROM outbox_message WHERE id IN ($a_id, $b_id)
	   AND clock_timestamp() < (SELECT next_attempt_at FROM outbox_message WHERE id = $a_id)}),
	'retrying:0,pending:0', 'before its time the delayed message waits, unattempted, and the next of its key behind it');
is($node->safe_psql('postgres', "SELECT waiting, retrying, delayed FROM outbox_status WHERE topic = '$delayed'"),
	'1|0|1', 'outbox_status counts it as delayed, not retrying');
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE id IN ($a_id, $b_id) AND state = 'sent'", '2', 40),
	'once its time has come it is published, then the next of its key, without waiting for a poll');
is($node->safe_psql('postgres', qq{
	SELECT a.sent_at >= a.next_attempt_at, b.sent_at >= a.sent_at
	  FROM outbox_message a, outbox_message b WHERE a.id = $a_id AND b.id = $b_id}),
	't|t', 'not before its time, and the next of its key after it');
$records = consume_topics(topics => [$delayed], expect => 3, timeout => 30);
is(join(',', map { $_->{value} } @$records), 'C,A,B', 'in Kafka: the other key first, then the delayed message, then its key\'s next');

# Trace context.
my $traced = unique_topic('options.trace');
kafka_admin('create-topic', $traced);
my $parent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
my $commented = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
$node->safe_psql('postgres', qq{
	BEGIN;
	SET LOCAL outbox.traceparent = '$parent';
	SET LOCAL outbox.tracestate = 'congo=t61rcWkgMzE';
	SELECT outbox_enqueue('$traced', 'set'::text, 'k');
	COMMIT;
});
$node->safe_psql('postgres',
	"SELECT outbox_enqueue('$traced', 'commented'::text, 'k') /*traceparent='$commented',tracestate='rojo%3D00f067aa0ba902b7'*/");
$node->safe_psql('postgres', "SELECT outbox_enqueue('$traced', 'untraced'::text, 'k')");
$records = consume_topics(topics => [$traced], expect => 3, timeout => 30);
my %headers = map { ($_->{value} => headers_of($_)) } @$records;
is_deeply([ @{ $headers{set} }{qw(traceparent tracestate)} ], [ $parent, 'congo=t61rcWkgMzE' ],
	'the traceparent and tracestate set for the transaction arrive as headers');
is_deeply([ @{ $headers{commented} }{qw(traceparent tracestate)} ], [ $commented, 'rojo=00f067aa0ba902b7' ],
	'so do those of a sqlcommenter comment, decoded');
ok(!exists $headers{untraced}{traceparent} && defined message_id_header($records->[2]),
	'a message enqueued without a trace context has no traceparent, and its message id as always');

$node->stop('fast');
is(worker_exits($node), 0, 'the worker never exited');

done_testing();

# Fault suite: poison messages under load, against a broker of this test's
# own that does not create topics on demand.  A message larger than its
# topic's max.message.bytes and one to a topic the broker refuses are
# dead-lettered at once with the broker's reason; one to a topic that does
# not exist is retried, holds back the later message of its key, and is
# delivered in order once the topic is created (or dead-lettered after
# outbox.max_attempts).  No other key is held up, and no other topic: a
# healthy message beside a new missing topic keeps its latency.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

# This test's broker: another port, no auto-created topics.
$ENV{KAFKA_PORT} = ($ENV{KAFKA_PORT} // 19092) + 100;
$ENV{KAFKA_DIR} = PostgreSQL::Test::Utils::tempdir() . '/kafka';
$ENV{KAFKA_EXTRA_PROPS} = 'auto.create.topics.enable=false';
$ENV{OUTBOX_KAFKA_BROKERS} = "127.0.0.1:$ENV{KAFKA_PORT}";
broker_ctl('start');
END { broker_ctl('stop') if $ENV{KAFKA_DIR} && -e "$ENV{KAFKA_DIR}/broker.pid"; }

my $node = outbox_node('poison', conf => join("\n",
		"outbox.max_attempts = 4",
		"outbox.retry_backoff_base = '2s'",
		"outbox.retry_backoff_max = '4s'"));

my @topics = (unique_topic('fault.poison'), unique_topic('fault.poison'));
my $small = unique_topic('fault.small');
my $missing = unique_topic('fault.missing');
my $never = unique_topic('fault.never');
kafka_admin('create-topic', $_, '--partitions', 3) for @topics;
kafka_admin('create-topic', $small, '--config', 'max.message.bytes=500');
# A consumer's coordinator lookup makes the broker create its internal topic
# __consumer_offsets, which then refuses records from producers.
consume_topics(topics => [ $topics[0] ], idle => 1, timeout => 10);

my $load = start_load($node, topics => \@topics, duration => 40);
sleep(2);
my $big = 'x' x 1000;
$node->safe_psql('postgres', qq{
	CREATE TABLE poison (name text, id bigint);
	INSERT INTO poison VALUES
	  ('too large',     outbox_enqueue('$small', '$big'::text, 'p-1')),
	  ('internal topic', outbox_enqueue('__consumer_offsets', 'x'::text, 'p-2')),
	  ('missing first',  outbox_enqueue('$missing', 'first'::text, 'p-3')),
	  ('missing second', outbox_enqueue('$missing', 'second'::text, 'p-3')),
	  ('never created',  outbox_enqueue('$never', 'lost cause'::text, 'p-4'));
});
my %id = map { split /\|/ } split /\n/, $node->safe_psql('postgres', 'SELECT name, id FROM poison');

ok(wait_for_query($node, "SELECT attempts, error FROM outbox_dead_letter WHERE id = $id{'too large'}",
		'1|Broker: Message size too large', 30),
	'too large for its topic: dead-lettered at once with the broker\'s reason');
ok(wait_for_query($node, "SELECT attempts, error FROM outbox_dead_letter WHERE id = $id{'internal topic'}",
		'1|Broker: Invalid topic', 30),
	'a topic the broker refuses: dead-lettered at once with the broker\'s reason');

ok(wait_for_query($node, "SELECT state FROM outbox_message WHERE id = $id{'missing first'}", 'retrying', 30),
	'a message to a missing topic waits to retry');
like($node->safe_psql('postgres', "SELECT last_error FROM outbox_message WHERE id = $id{'missing first'}"),
	qr/Unknown topic/i, 'with the reason');
is($node->safe_psql('postgres', "SELECT state, attempts FROM outbox_message WHERE id = $id{'missing second'}"),
	'pending|0', 'the later message of its key waits behind it, untried');

kafka_admin('create-topic', $missing);
ok(wait_for_query($node,
		"SELECT count(*) FROM outbox_message WHERE id IN ($id{'missing first'}, $id{'missing second'})", '0', 60),
	'once the topic exists both are delivered');
is_deeply([ map { $_->{value} } @{ consume_topics(topics => [$missing], expect => 2, timeout => 30) } ],
	[ 'first', 'second' ], 'in their order');

ok(wait_for_query($node, "SELECT attempts FROM outbox_dead_letter WHERE id = $id{'never created'}", '4', 90),
	'a topic that never comes: dead-lettered after outbox.max_attempts');
like($node->safe_psql('postgres', "SELECT error FROM outbox_dead_letter WHERE id = $id{'never created'}"),
	qr/after 4 attempts/, 'saying how many attempts it had');

finish_load($load);
fault_check($node, scenario => 'poison messages', topics => \@topics);

# librdkafka holds a message to a topic it has no metadata for up to
# topic.metadata.propagation.max.ms (30 s) before it fails it; the worker
# must not make the batch beside it wait that long.  Each round a new
# missing name, beside a healthy message in the same transaction.
my @latencies_ms;
for my $round (1 .. 5)
{
	my $gone = unique_topic('fault.gone');
	my $t0 = time();
	my (undef, $healthy) = split /\|/, $node->safe_psql('postgres',
		"SELECT outbox_enqueue('$gone', 'nowhere'::text, 'g'), outbox_enqueue('$topics[0]', 'healthy'::text, 'h')");
	ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE id = $healthy", '0', 20),
		"round $round: the healthy message is delivered beside a new missing topic");
	push @latencies_ms, (time() - $t0) * 1000;
	is($node->safe_psql('postgres',
			"SELECT state, last_error FROM outbox_message WHERE topic = '$gone'"),
		'retrying|Broker: Unknown topic or partition',
		"round $round: the missing topic's message waits to retry, with the reason");
}
diag(sprintf('healthy message beside a new missing topic, commit to recorded delivery: %s ms',
		join(', ', map { sprintf('%.0f', $_) } @latencies_ms)));
$node->stop('fast');
done_testing();

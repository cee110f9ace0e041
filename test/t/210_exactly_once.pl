# Exactly-once publication (outbox.delivery = exactly_once), what a user
# sees without a crash (test/t/023_fault_exactly_once.pl crashes it):
#
# - messages are published, each once, in per-key order, in Kafka
#   transactions: the progress topic is made (one partition) and holds,
#   keyed by the producer's transactional.id, outbox-<system
#   identifier>-<database oid>, a start record and records listing the
#   messages; outbox_exactly_once says where the next start reads from;
# - the setting is reloadable, both ways, with nothing lost or doubled;
# - a batch's progress record larger than message.max.bytes is split over
#   several records of its transaction;
# - a message Kafka refuses with the messages sent with it (too large for
#   its topic) aborts their transaction: it is dead-lettered alone, the
#   others are published once for a read_committed consumer, while a
#   read_uncommitted one sees the aborted copies too;
# - a message librdkafka refuses before it reaches Kafka (over its
#   message.max.bytes) aborts its transaction too, which a crash right after
#   the next commit shows: it is dead-lettered, not taken for delivered;
# - a transactional.id in outbox.kafka_properties and a progress topic
#   Kafka would refuse are refused with 22023 and a hint;
#   outbox_simulate_pause() is for superusers, and refuses an unknown point;
# - on the schema of 0.9.0, before ALTER EXTENSION UPDATE, the worker
#   publishes nothing and says why; after the update it publishes.
use strict;
use warnings;

use JSON::PP;
use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $progress = unique_topic('eos.progress');
my $node = outbox_node('exactly_once_features',
	conf => "outbox.delivery = 'exactly_once'\noutbox.progress_topic = '$progress'");

my $transactional_id = $node->safe_psql('postgres',
	"SELECT 'outbox-' || system_identifier || '-' || (SELECT oid FROM pg_database WHERE datname = 'postgres')"
	  . ' FROM pg_control_system()');

# Enqueue messages $first to $last to $topic over 10 keys, numbered.
sub enqueue
{
	my ($topic, $first, $last) = @_;
	$node->safe_psql('postgres',
		"SELECT count(outbox_enqueue('$topic', jsonb_build_object('n', i), 'k' || (i % 10)))"
		  . " FROM generate_series($first, $last) i");
}

# Once the outbox has no message of $topic left: every message of $topic
# in Kafka, read_committed, once each and in per-key order.
sub published_once
{
	my ($topic, $count, $what) = @_;
	ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE topic = '$topic'", '0', 60),
		"$what: the outbox drains");
	my $records = consume_topics(topics => [$topic], idle => 3, timeout => 60);
	my %seen;
	$seen{ message_id_header($_) }++ for @$records;
	is(scalar(@$records), $count, "$what: $count records");
	is(scalar(grep { $_ > 1 } values %seen), 0, "$what: none twice");
	my %last;
	my $order_faults = 0;
	for my $r (@$records)
	{
		my $n = decode_json($r->{value})->{n};
		$order_faults++ if defined $last{ $r->{key} } && $last{ $r->{key} } > $n;
		$last{ $r->{key} } = $n;
	}
	is($order_faults, 0, "$what: per-key order");
}

my $topic = unique_topic('eos.basic');
enqueue($topic, 1, 500);
published_once($topic, 500, 'exactly-once');

my @progress = @{ consume_topics(topics => [$progress], idle => 3, timeout => 60) };
is(scalar(grep { $_->{partition} != 0 } @progress), 0, 'the progress records are in partition 0');
ok(scalar(grep { ($_->{key} // '') eq $transactional_id } @progress) >= 2,
	"progress records keyed by $transactional_id: a start and at least one batch");
is($node->safe_psql('postgres', 'SELECT transactional_id, progress_topic FROM outbox_exactly_once'),
	"$transactional_id|$progress", 'outbox_exactly_once names the producer and its progress topic');

# Reloadable, both ways.
my $switched = unique_topic('eos.switch');
my $first = 1;
for my $delivery ('at_least_once', 'exactly_once')
{
	$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.delivery = '$delivery'; SELECT pg_reload_conf();");
	enqueue($switched, $first, $first + 99);
	$first += 100;
}
published_once($switched, 200, 'switched to at_least_once and back');

# A message too large for its topic, among others: the transaction aborts.
my $small = unique_topic('eos.small');
kafka_admin('create-topic', $small, '--partitions', 3, '--config', 'max.message.bytes=300');
$node->safe_psql('postgres', qq{
	BEGIN;
	SELECT outbox_enqueue('$small', jsonb_build_object('n', i), 'k' || (i % 10)) FROM generate_series(1, 5) i;
	SELECT outbox_enqueue('$small', jsonb_build_object('n', 6, 'pad', repeat('x', 1000)), 'big');
	SELECT outbox_enqueue('$small', jsonb_build_object('n', i), 'k' || (i % 10)) FROM generate_series(7, 10) i;
	COMMIT;});
ok(wait_for_query($node,
		"SELECT count(*) FROM outbox_dead_letter WHERE topic = '$small' AND error ~* 'too large'",
		'1', 60),
	'the message too large for its topic is dead-lettered');
published_once($small, 9, 'beside a refused message');
my $uncommitted = consume_topics(topics => [$small], idle => 3, timeout => 60, read_uncommitted => 1);
cmp_ok(scalar(@$uncommitted), '>', 9,
	'a read_uncommitted consumer also sees the copies of the aborted transaction');

# A batch's progress record larger than message.max.bytes is split over
# several records of its transaction (500 messages list 12,009 bytes).
my $split = unique_topic('eos.split');
$node->safe_psql('postgres',
	"ALTER SYSTEM SET outbox.kafka_properties = 'message.max.bytes=3000'; SELECT pg_reload_conf();");
enqueue($split, 1, 500);
published_once($split, 500, 'progress records split by message.max.bytes');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET outbox.kafka_properties; SELECT pg_reload_conf();');

# A message librdkafka refuses before it reaches Kafka (larger than its
# message.max.bytes), among others: their transaction lists it, so it
# aborts.  Committed, a crash before the worker recorded it would have the
# next start take the refused message for delivered.  So the server
# crashes at the first Kafka commit that follows: the message is
# dead-lettered all the same, and the others are published once.
my $beside = unique_topic('eos.beside');
kafka_admin('create-topic', $beside, '--partitions', 3);
# (a restart, not a reload: no producer made before it takes the batch)
$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.kafka_properties = 'message.max.bytes=3000'");
$node->restart;
$node->safe_psql('postgres', "SELECT outbox_simulate_pause('after_kafka_commit')");
$node->safe_psql('postgres', qq{
	BEGIN;
	SELECT outbox_enqueue('$beside', jsonb_build_object('n', i), 'k' || (i % 10)) FROM generate_series(1, 5) i;
	SELECT outbox_enqueue('$beside', jsonb_build_object('n', 6, 'pad', repeat('x', 5000)), 'big');
	COMMIT;});
ok(wait_for_query($node,
		"SELECT count(*) FROM pg_stat_activity WHERE query = 'outbox: paused after_kafka_commit'",
		'1', 60),
	'beside a message librdkafka refuses: the publisher pauses after a Kafka commit');
$node->stop('immediate');
$node->start;
is($node->safe_psql('postgres', 'SHOW outbox.kafka_properties'), 'message.max.bytes=3000',
	'the server restarted with message.max.bytes=3000');
ok(wait_for_query($node,
		"SELECT count(*) FROM outbox_dead_letter WHERE topic = '$beside' AND key = 'big'",
		'1', 60),
	'after the crash, the refused message is dead-lettered, not taken for delivered');
published_once($beside, 5, 'the messages beside a refused one');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET outbox.kafka_properties; SELECT pg_reload_conf();');

# Refused settings and calls.
my ($ret, $out, $err) = $node->psql('postgres',
	"ALTER SYSTEM SET outbox.kafka_properties = 'transactional.id=mine'");
like($err, qr/transactional\.id cannot be set/, 'a transactional.id in outbox.kafka_properties is refused');
like($err, qr/HINT:.*outbox\.delivery/, 'with a hint');
($ret, $out, $err) = $node->psql('postgres', "ALTER SYSTEM SET outbox.progress_topic = 'no spaces'");
like($err, qr/invalid value for parameter "outbox.progress_topic"/, 'a progress topic Kafka would refuse is refused');
($ret, $out, $err) = $node->psql('postgres', "SELECT outbox_simulate_pause('somewhere')",
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($err, qr/22023.*unknown pause point "somewhere"/s, 'an unknown pause point is refused');
$node->safe_psql('postgres', 'CREATE ROLE plain LOGIN');
($ret, $out, $err) = $node->psql('postgres', "SELECT outbox_simulate_pause('none')",
	extra_params => [ '-U', 'plain' ]);
like($err, qr/permission denied for function outbox_simulate_pause/, 'the pause is for superusers');

# The schema of 0.9.0, then the update.
$node->safe_psql('postgres', 'CREATE DATABASE old');
$node->safe_psql('old', "CREATE EXTENSION outbox VERSION '0.9.0'");
my $old_topic = unique_topic('eos.old');
$node->safe_psql('old', "SELECT outbox_enqueue('$old_topic', '{}'::jsonb)");
ok(wait_for_query($node,
		"SELECT last_error ~ 'ALTER EXTENSION outbox UPDATE' FROM outbox_worker WHERE database = 'old'",
		't', 60),
	'on the schema of 0.9.0 the worker says the extension must be updated');
is($node->safe_psql('old', 'SELECT count(*) FROM outbox_message'), '1', 'and publishes nothing');
$node->safe_psql('old', 'ALTER EXTENSION outbox UPDATE');
ok(wait_for_query($node, 'SELECT count(*) FROM outbox_message', '0', 60, 'old'),
	'after the update it publishes');
is(scalar(@{ consume_topics(topics => [$old_topic], expect => 1, timeout => 30) }), 1,
	'the message is in Kafka once');

$node->stop('fast');
done_testing();

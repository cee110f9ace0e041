# Poison messages: one the broker refuses for good is dead-lettered at once
# with the broker's reason, holds up no other key, and is skipped by later
# messages of its key; one that keeps failing is retried with backoff, holds
# back the later messages of its key, and is dead-lettered after
# outbox.max_attempts.  Requeued after the cause is fixed, both are delivered.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = outbox_node('dead_letter', conf => join("\n",
		"outbox.max_attempts = 3",
		"outbox.retry_backoff_base = '2s'",
		"outbox.retry_backoff_max = '4s'",
		# Four records at most to a request, and none sent before the Kafka
		# process has produced the whole batch and flushes it, so that the
		# last cases below make the requests they mean to.
		"outbox.kafka_properties = 'message.timeout.ms=2000; linger.ms=500; batch.num.messages=4'"));

my $small = unique_topic('poison.small');    # refuses records over 200 bytes
my $norep = unique_topic('poison.stale');    # refuses every record older than the broker's clock
my $fine = unique_topic('poison.fine');
kafka_admin('create-topic', $small, '--config', 'max.message.bytes=200');
kafka_admin('create-topic', $norep, '--config', 'message.timestamp.before.max.ms=0');

my $big = 'x' x 1000;
$node->safe_psql('postgres', committed_late(qq{
	SELECT outbox_enqueue('$small', '$big'::text, 'k-small');
	SELECT outbox_enqueue('$norep', 'first'::text, 'k-norep');
	SELECT outbox_enqueue('$small', 'after the big one'::text, 'k-small');
	SELECT outbox_enqueue('$norep', 'second'::text, 'k-norep');
	SELECT outbox_enqueue('$fine', 'fine ' || i, 'k-fine-' || i) FROM generate_series(1, 5) i;
}));

ok(wait_for_query($node, "SELECT count(*) FROM outbox_dead_letter WHERE topic = '$small'", '1', 30),
	'the oversized message is dead-lettered');
is($node->safe_psql('postgres', "SELECT attempts, error, length(payload) FROM outbox_dead_letter WHERE topic = '$small'"),
	'1|Broker: Message size too large|1000', 'at once, with the broker\'s reason, payload kept');

# The message that keeps failing holds back the later one of its key.
ok(wait_for_query($node,
		"SELECT state FROM outbox_message WHERE topic = '$norep' AND payload = convert_to('first', 'UTF8') AND attempts >= 1",
		'retrying', 30),
	'a failing message waits to retry');
is($node->safe_psql('postgres',
		"SELECT state, attempts FROM outbox_message WHERE topic = '$norep' AND payload = convert_to('second', 'UTF8')"),
	'pending|0', 'the later message of its key is not tried while it waits');
like($node->safe_psql('postgres', "SELECT last_error FROM outbox_message WHERE topic = '$norep' ORDER BY id LIMIT 1"),
	qr/./, 'the retrying row shows its last error');

my $fine_records = consume_topics(topics => [$fine], expect => 5, timeout => 30);
is(scalar(@$fine_records), 5, 'other keys are delivered meanwhile')
  or diag($node->safe_psql('postgres',
	"SELECT id, state, attempts, last_error FROM outbox_message WHERE topic = '$fine' ORDER BY id"));
my $small_records = consume_topics(topics => [$small], expect => 1, timeout => 30);
is_deeply([ map { $_->{value} } @$small_records ], ['after the big one'],
	'the next message of the dead-lettered key is delivered');

ok(wait_for_query($node,
		"SELECT attempts FROM outbox_dead_letter WHERE topic = '$norep' AND payload = convert_to('first', 'UTF8')",
		'3', 60),
	'after outbox.max_attempts it is dead-lettered');
like($node->safe_psql('postgres', "SELECT error FROM outbox_dead_letter WHERE topic = '$norep' ORDER BY id LIMIT 1"),
	qr/after 3 attempts/, 'the error says how many attempts were made');
ok(wait_for_query($node, "SELECT count(*) FROM outbox_dead_letter WHERE topic = '$norep'", '2', 90),
	'the second message of the key, tried only then, is dead-lettered too');
is(scalar(@{ consume_topics(topics => [$norep], idle => 2, timeout => 10) }), 0,
	'nothing reached the refusing topic');

my $worker = $node->safe_psql('postgres', 'SELECT failed > 0, dead_lettered, last_error IS NOT NULL FROM outbox_worker');
is($worker, 't|3|t', 'outbox_worker counts the failures and dead letters');

# Fix the causes, requeue, and everything arrives, in order within the key.
kafka_admin('alter-config', $small, 'max.message.bytes=10000');
kafka_admin('alter-config', $norep, 'message.timestamp.before.max.ms=9223372036854775807');
$node->safe_psql('postgres', 'SELECT outbox_requeue(id) FROM outbox_dead_letter ORDER BY id');
ok(wait_for_query($node,
		'SELECT (SELECT count(*) FROM outbox_message) + (SELECT count(*) FROM outbox_dead_letter)', '0', 60),
	'requeued messages are delivered and leave the outbox');
is_deeply([ map { $_->{value} } @{ consume_topics(topics => [$norep], expect => 2, timeout => 30) } ],
	[ 'first', 'second' ], 'the requeued messages arrive in their order');
is(length(consume_topics(topics => [$small], expect => 2, timeout => 30)->[1]{value}), 1000,
	'the oversized message arrives once the topic takes it');

# A record the broker refuses makes it refuse the records sent with it: a
# compacted topic takes no record without a key.  Each message so refused is
# sent again alone: the one without a key is dead-lettered at once, the others
# are delivered, in order, once, and on their first attempt.
my $counts_before = $node->safe_psql('postgres', 'SELECT failed, dead_lettered FROM outbox_worker');
my ($failed, $dead_lettered) = split /\|/, $counts_before;

# refused_with_keyless(NAME, KEYED BEFORE, KEYED AFTER): the keyed messages
# of one key around one without a key, in one transaction, to a compacted
# topic of one partition; returns the values Kafka holds once the outbox is
# empty.
sub refused_with_keyless
{
	my ($name, $before, $after) = @_;
	my $topic = unique_topic("poison.$name");
	kafka_admin('create-topic', $topic, '--partitions', 1, '--config', 'cleanup.policy=compact');
	$node->safe_psql('postgres', qq{
		BEGIN;
		SELECT outbox_enqueue('$topic', 'keyed ' || i, 'k-compacted') FROM generate_series(1, $before) i;
		SELECT outbox_enqueue('$topic', 'without a key'::text);
		SELECT outbox_enqueue('$topic', 'keyed ' || i, 'k-compacted')
		  FROM generate_series($before + 1, $before + $after) i;
		COMMIT;
	});
	ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE topic = '$topic'", '0', 30),
		"$name: the messages sent with a refused one leave the outbox");
	is($node->safe_psql('postgres',
			"SELECT attempts, convert_from(payload, 'UTF8'), error FROM outbox_dead_letter WHERE topic = '$topic'"),
		'1|without a key|Broker: Broker failed to validate record',
		"$name: only the refused one is dead-lettered, at once, with the broker's reason");
	return [ map { $_->{value} } @{ consume_topics(topics => [$topic], idle => 3, timeout => 30) } ];
}

# One request of four records.
is_deeply(refused_with_keyless('one_request', 2, 1), [ map { "keyed $_" } 1 .. 3 ],
	'one request: the others arrive once each, in order');

# Two requests: the first, three keyed records and the one without a key, is
# refused; the second, the three later keyed ones, is taken first.  Those are
# sent again after the first three, so that their second copies are in order.
is_deeply(refused_with_keyless('two_requests', 3, 3), [ map { "keyed $_" } 4 .. 6, 1 .. 6 ],
	'two requests: the later ones Kafka took first arrive again after the earlier ones');

is($node->safe_psql('postgres', 'SELECT failed, dead_lettered FROM outbox_worker'),
	"$failed|" . ($dead_lettered + 2), 'outbox_worker counts the dead letters and no failed attempt');

$node->stop('fast');
done_testing();

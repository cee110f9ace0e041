# 10,000 messages over 100 keys, enqueued by concurrent sessions with some
# transactions rolled back, arrive exactly once and, per key, in id order;
# so do those of a trickle from 8 sessions, each published as it commits.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

# Rows stay as 'sent' so the test can map each record back to its id.
my $node = outbox_node('order', conf => "outbox.sent_retention = '1h'");
my $topic = unique_topic('order');

# 4 clients, 2,500 transactions each: each commits one message for a random
# key of 100; one in ten is followed by a transaction that rolls back.
my $script = <<"SQL";
\\set k random(1, 100)
\\set rollback random(1, 10)
BEGIN;
SELECT outbox_enqueue('$topic', json_build_object('client', :client_id, 'k', :k)::jsonb, 'key-' || :k);
COMMIT;
\\if :rollback = 1
BEGIN;
SELECT outbox_enqueue('$topic', '"rolled back"'::jsonb, 'key-' || :k);
ROLLBACK;
\\endif
SQL
my $t0 = time();
run_pgbench($node, $script, '-c', 4, '-j', 2, '-t', 2500);
my $enqueue_s = time() - $t0;

my $committed_count = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox_message');
is($committed_count, 10000, '10,000 messages committed');

ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE state <> 'sent'", '0', 120),
	'every committed message is acknowledged');
my $drain_s = time() - $t0;
diag(sprintf('%d messages: enqueued by 4 clients in %.2f s, all acknowledged %.2f s after the start',
		$committed_count, $enqueue_s, $drain_s));

my %committed = map { my ($mid, $key, $id) = split /\|/; ($mid => [ $key, $id ]) }
  split /\n/, $node->safe_psql('postgres', 'SELECT message_id, key, id FROM outbox_message');
my $records = consume_topics(topics => [$topic], expect => $committed_count, idle => 5, timeout => 120);
my $result = check_delivery($records, \%committed);
diag(sprintf('records %d; lost %d, phantom %d, duplicates %d, order faults %d',
		scalar(@$records), @$result{qw(lost phantom duplicates order_faults)}));

is($result->{lost}, 0, 'no committed message is lost');
is($result->{phantom}, 0, 'no rolled-back message is published');
is($result->{duplicates}, 0, 'no message is published twice');
is($result->{order_faults}, 0, 'per key, messages arrive in id order');
is(scalar(keys %{ { map { $_->{key} => 1 } @$records } }), 100, 'all 100 keys are there');

# A pending row is claimed whatever its next_attempt_at says: that is the
# start of the transaction that wrote it, which can be later than the
# worker's own transaction start although the row is committed; skipping it
# let the next message of its key overtake it (seen here once in 10,000).
my $overtake_topic = unique_topic('overtake');
$node->safe_psql('postgres', qq{
	INSERT INTO outbox_message (topic, key, payload, next_attempt_at)
	VALUES ('$overtake_topic', 'k', 'first', now() + interval '1 hour');
	SELECT outbox_enqueue('$overtake_topic', 'second'::text, 'k');
});
is_deeply([ map { $_->{value} } @{ consume_topics(topics => [$overtake_topic], expect => 2, timeout => 30) } ],
	[ 'first', 'second' ], 'a pending message is never passed over by the next one of its key');

# A backlog committed at once: how long the worker takes to drain it.
$node->safe_psql('postgres', 'TRUNCATE outbox_message');
my $backlog_topic = unique_topic('backlog');
$t0 = time();
$node->safe_psql('postgres', qq{
	SELECT outbox_enqueue('$backlog_topic', json_build_object('n', i, 'pad', repeat('x', 150))::jsonb,
	                      'key-' || (i % 1000))
	  FROM generate_series(1, 10000) i});
my $committed_at = time();
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE state <> 'sent'", '0', 120),
	'a backlog of 10,000 messages drains');
my $backlog_s = time() - $committed_at;
diag(sprintf('backlog of 10,000 messages (1,000 keys): enqueued in %.2f s, drained to Kafka in %.2f s (%.0f msg/s)',
		$committed_at - $t0, $backlog_s, 10000 / $backlog_s));
is(scalar(@{ consume_topics(topics => [$backlog_topic], expect => 10000, timeout => 120) }), 10000,
	'all of it is in Kafka');

# A trickle from 8 sessions, each commit published at once: a turn that
# waits for Kafka's acknowledgement claims what commits meanwhile into its
# batch and produces it behind the rest.  Without outbox.sent_retention the
# delivered rows are deleted, one run of ids at a time, whatever order a
# batch's messages were produced in.
$node->append_conf('postgresql.conf', 'outbox.sent_retention = 0');
$node->reload;
my $trickle_topic = unique_topic('trickle');
kafka_admin('create-topic', $trickle_topic, '--partitions', 3);
finish_load(start_load($node, topics => [$trickle_topic], rate => 400, duration => 5));
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE topic = '$trickle_topic'", '0', 60),
	'a trickle: every row delivered and deleted');
%committed = map { my ($mid, $key, $id) = split /\|/; ($mid => [ $key, $id ]) }
  split /\n/, $node->safe_psql('postgres',
	"SELECT message_id, key, id FROM fault_log WHERE topic = '$trickle_topic'");
$result = check_delivery(consume_topics(topics => [$trickle_topic], idle => 3, timeout => 60), \%committed);
diag(sprintf('a trickle: %d committed; lost %d, phantom %d, duplicates %d, order faults %d',
		scalar(keys %committed), @$result{qw(lost phantom duplicates order_faults)}));
cmp_ok(scalar(keys %committed), '>', 1000, 'a trickle: its messages were committed');
is($result->{lost}, 0, 'a trickle: nothing lost');
is($result->{phantom}, 0, 'a trickle: nothing rolled back is published');
is($result->{duplicates}, 0, 'a trickle: nothing published twice');
is($result->{order_faults}, 0, 'a trickle: per key, in id order');

$node->stop('fast');
done_testing();

# outbox_status's figures of the last minute, per topic, from the
# publisher's shared memory (src/metrics.c): sent_last_minute,
# sent_per_second, latency_p50 and latency_p99.
#
# - A topic whose messages are all delivered and deleted keeps its row,
#   with what was sent and a rate over the minute's span.
# - What the latency measures: with track_commit_timestamp on, from the
#   commit (a transaction that waits 4 s before its COMMIT is not counted
#   as slow), and without it from the INSERT (it is); a delayed message
#   from the time it was due; a retried message from its enqueue, its
#   failed attempts included.
# - The bounds: a database's metrics tell 64 topics apart, the deliveries
#   of further topics count under "(other topics)"; a topic not counted for
#   a minute gives its place to a new one.  Each database has its own.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = outbox_node('metrics', conf => join("\n",
		'track_commit_timestamp = on',
		'outbox.max_attempts = 1000',
		"outbox.retry_backoff_base = '200ms'",
		"outbox.retry_backoff_max = '500ms'"));
ok(wait_for_query($node, "SELECT brokers_reachable FROM outbox_worker WHERE database = 'postgres'", 't', 60), 'the worker reaches the brokers');

# A second database, whose worker has metrics of its own: more topics in a
# minute than they tell apart.  Its topics are created by their first
# message; each is delivered at the first or a later attempt.
$node->safe_psql('postgres', 'CREATE DATABASE many');
$node->safe_psql('many', 'CREATE EXTENSION outbox');
my $prefix = unique_topic('metrics.many');
$node->safe_psql('many', qq{
	SELECT count(outbox_enqueue('$prefix.' || i, 'one'::text)) FROM generate_series(1, 70) i});
my $many_started = time();
ok(wait_for_query($node, 'SELECT count(*) FROM outbox_message', '0', 120, 'many'),
	'70 messages to 70 new topics are delivered');
is($node->safe_psql('many', qq{
	SELECT count(*), sum(sent_last_minute) FROM outbox_status WHERE topic LIKE '$prefix.%'}),
	'64|64', 'a database\'s metrics name 64 topics, one message each');
is($node->safe_psql('many', q{
	SELECT sent_last_minute, waiting, latency_p50 IS NOT NULL FROM outbox_status WHERE topic = '(other topics)'}),
	'6|0|t', 'the 6 further topics count under "(other topics)"');
is($node->safe_psql('postgres', qq{SELECT count(*) FROM outbox_status WHERE topic LIKE '$prefix.%'
	OR topic = '(other topics)'}), '0', 'and the other database shows none of them');

# A topic fully delivered: its rows are deleted, its figures stay.
my $fast = unique_topic('metrics.fast');
kafka_admin('create-topic', $fast);
$node->safe_psql('postgres', qq{SELECT count(outbox_enqueue('$fast', 'm' || i, 'k-' || i % 4)) FROM generate_series(1, 20) i});
ok(wait_for_query($node, "SELECT sent_last_minute FROM outbox_status WHERE topic = '$fast'", '20', 60),
	'a topic whose 20 messages were delivered shows 20 sent in the last minute');
is($node->safe_psql('postgres', qq{
	SELECT waiting, retrying, dead_letters, oldest_waiting_age IS NULL,
	       (SELECT count(*) FROM outbox_message WHERE topic = '$fast'),
	       sent_per_second BETWEEN 20 / 60.0 AND 20 / 50.0,
	       latency_p50 > '0' AND latency_p50 < '2 s', latency_p99 >= latency_p50 AND latency_p99 < '2 s'
	  FROM outbox_status WHERE topic = '$fast'}),
	'0|0|0|t|0|t|t|t',
	'with no row left: nothing waits, 20 per minute\'s span a second, p50 and p99 under 2 s');
is($node->safe_psql('postgres', qq{SELECT published >= 20 FROM outbox_worker WHERE database = 'postgres'}), 't',
	'outbox_worker counted them too');

# The latency starts at the commit: a transaction that waits 4 s between its
# enqueue and its COMMIT.
my $slow_commit = unique_topic('metrics.slow-commit');
kafka_admin('create-topic', $slow_commit);
$node->safe_psql('postgres', qq{
	BEGIN;
	SELECT outbox_enqueue('$slow_commit', 'late commit'::text);
	SELECT pg_sleep(4);
	COMMIT;});
ok(wait_for_query($node, "SELECT sent_last_minute FROM outbox_status WHERE topic = '$slow_commit'", '1', 60),
	'the message of a slow transaction is delivered');
my $commit_latency = $node->safe_psql('postgres',
	"SELECT latency_p50 FROM outbox_status WHERE topic = '$slow_commit'");
is($node->safe_psql('postgres', "SELECT '$commit_latency'::interval < '2 s'"), 't',
	"with track_commit_timestamp on, its latency counts from the commit ($commit_latency), not from its INSERT 4 s before");

# A delayed message counts from the time it was due.
my $delayed = unique_topic('metrics.delayed');
kafka_admin('create-topic', $delayed);
$node->safe_psql('postgres', qq{SELECT outbox_enqueue('$delayed', 'later'::text, deliver_after => '4 s')});
is($node->safe_psql('postgres', "SELECT delayed, sent_last_minute FROM outbox_status WHERE topic = '$delayed'"), '1|0',
	'a delayed message waits, not yet sent');
ok(wait_for_query($node, "SELECT sent_last_minute FROM outbox_status WHERE topic = '$delayed'", '1', 60),
	'and is delivered when due');
my $due_latency = $node->safe_psql('postgres', "SELECT latency_p50 FROM outbox_status WHERE topic = '$delayed'");
is($node->safe_psql('postgres', "SELECT '$due_latency'::interval < '2 s'"), 't',
	"its latency counts from the time it was due ($due_latency), not from its enqueue 4 s before");

# A retried message counts from its enqueue: its failed attempts are the
# outbox's latency.
my (undef, $stale) = refusing_topics('metrics');
$node->safe_psql('postgres', committed_late("SELECT outbox_enqueue('$stale', 'refused a while'::text)"));
ok(wait_for_query($node, qq{SELECT retrying > 0 FROM outbox_status WHERE topic = '$stale'}, 't', 60),
	'a message the topic refuses waits to retry');
ok(wait_for_query($node, qq{SELECT now() - min(created_at) > '4 s' FROM outbox_message WHERE topic = '$stale'}, 't', 60),
	'for 4 s');
kafka_admin('alter-config', $stale, 'message.timestamp.before.max.ms=9223372036854775807');
ok(wait_for_query($node, "SELECT sent_last_minute FROM outbox_status WHERE topic = '$stale'", '1', 60),
	'it is delivered once the topic takes it');
my $retry_latency = $node->safe_psql('postgres', "SELECT latency_p50 FROM outbox_status WHERE topic = '$stale'");
is($node->safe_psql('postgres', "SELECT '$retry_latency'::interval >= '3 s'"), 't',
	"its latency counts from its enqueue, failed attempts included ($retry_latency)");

# A minute after the 70 topics, none of them shows, and a new topic of that
# database takes the place of one.
ok(wait_for_query($node, qq{SELECT count(*) FROM outbox_status WHERE topic LIKE '$prefix.%'
	OR topic = '(other topics)'}, '0', 90, 'many'),
	'a minute on, the 70 topics have left outbox_status');
cmp_ok(time() - $many_started, '>=', 50, 'not before their minute (50 to 60 s) was over');
my $newcomer = unique_topic('metrics.newcomer');
$node->safe_psql('many', "SELECT outbox_enqueue('$newcomer', 'new'::text)");
ok(wait_for_query($node, "SELECT sent_last_minute FROM outbox_status WHERE topic = '$newcomer'", '1', 60, 'many'),
	'a new topic then has a row of its own');

# Without track_commit_timestamp the latency counts from the INSERT.
$node->append_conf('postgresql.conf', 'track_commit_timestamp = off');
$node->restart;
ok(wait_for_query($node, "SELECT brokers_reachable FROM outbox_worker WHERE database = 'postgres'", 't', 60), 'restarted without track_commit_timestamp');
my $slow_insert = unique_topic('metrics.slow-insert');
kafka_admin('create-topic', $slow_insert);
$node->safe_psql('postgres', qq{
	BEGIN;
	SELECT outbox_enqueue('$slow_insert', 'late commit'::text);
	SELECT pg_sleep(4);
	COMMIT;});
ok(wait_for_query($node, "SELECT sent_last_minute FROM outbox_status WHERE topic = '$slow_insert'", '1', 60),
	'the message of a slow transaction is delivered');
my $insert_latency = $node->safe_psql('postgres',
	"SELECT latency_p50 FROM outbox_status WHERE topic = '$slow_insert'");
is($node->safe_psql('postgres', "SELECT '$insert_latency'::interval >= '3 s'"), 't',
	"with track_commit_timestamp off, its latency counts from its INSERT ($insert_latency)");

$node->stop('fast');
is(worker_exits($node), 0, 'no worker crashed or exited with an error');
done_testing();

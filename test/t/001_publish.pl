# A committed message reaches Kafka with its key, payload bytes, headers,
# outbox-message-id and enqueue time; a rolled-back one never does; a plain
# INSERT is published like an enqueue; the worker is woken at commit.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

# The safety-net poll is set far beyond the deadlines below, so a message
# that arrives in time was sent because the commit woke the worker.
my $node = outbox_node('publish', no_extension => 1,
	conf => "outbox.poll_interval = '10min'\noutbox.sent_retention = '1h'");

# Before CREATE EXTENSION only the launcher runs, quietly; once it commits,
# a worker serves the database.
ok($node->poll_query_until('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox launcher'", '1'),
	'before the extension exists the launcher runs');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox worker'"), '0',
	'and no worker, in a database without the extension');
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
ok($node->poll_query_until('postgres', "SELECT database FROM outbox_worker", 'postgres'),
	'after CREATE EXTENSION a worker serves the database');

my $topic = unique_topic('publish');
my $other = unique_topic('publish.insert');

# Warm up: the first message of a topic waits for Kafka to create it.
$node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'warm-up'::text)");
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE state <> 'sent'", '0', 60),
	'the warm-up message is delivered');

# The latency of one message, commit to Kafka's acknowledgement.
my $t0 = time();
my $latency_id = $node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'timed'::text, 'timed-key')");
ok(wait_for_query($node, "SELECT state FROM outbox_message WHERE id = $latency_id", 'sent', 5),
	'a message is acknowledged within 5 s of its commit, long before the 10 min poll');
my $elapsed_ms = (time() - $t0) * 1000;
my $acked_ms = $node->safe_psql('postgres',
	"SELECT round(extract(epoch FROM sent_at - created_at) * 1000, 1) FROM outbox_message WHERE id = $latency_id");
diag(sprintf('first message latency: enqueue to Kafka ack %s ms (seen by the test: %.1f ms)',
		$acked_ms, $elapsed_ms));

# One message of each payload type, a rolled-back one, and a plain INSERT.
$node->safe_psql('postgres', qq{
	BEGIN;
	CREATE TABLE app_user (id int PRIMARY KEY, name text);
	INSERT INTO app_user VALUES (42, 'Li');
	SELECT outbox_enqueue('$topic', '{"user_id": 42, "name": "Li"}'::jsonb, 'user-42',
	                      '{"trace-id": "t-1", "empty": null}');
	SELECT outbox_enqueue('$topic', 'Welcome, Li!'::text, 'user-42');
	SELECT outbox_enqueue('$topic', '\\x00ff10'::bytea, 'user-42');
	COMMIT;
});
$node->safe_psql('postgres', qq{
	BEGIN;
	SELECT outbox_enqueue('$topic', 'rolled back'::text, 'user-42');
	ROLLBACK;
});
$node->safe_psql('postgres', qq{
	INSERT INTO outbox_message (topic, key, payload, headers)
	VALUES ('$other', 'crm-1', convert_to('inserted', 'UTF8'), '{"via": "insert"}');
});

my $records = consume_topics(topics => [ $topic, $other ], expect => 6, idle => 3);
my %by_topic;
push @{ $by_topic{ $_->{topic} } }, $_ for @$records;
my @main = @{ $by_topic{$topic} // [] };
my @inserted = @{ $by_topic{$other} // [] };

is(scalar(@main), 5, 'five committed messages on the topic, the rolled-back one absent');
is_deeply([ map { $_->{value} // $_->{value_b64} } @main ],
	[ 'warm-up', 'timed', '{"name": "Li", "user_id": 42}', 'Welcome, Li!', 'AP8Q' ],
	'payloads arrive byte for byte, in order');
ok(!grep({ ($_->{value} // '') eq 'rolled back' } @main), 'the rolled-back message is never published');
is($main[2]{key}, 'user-42', 'the key is the record key');
is_deeply([ grep { $_->[0] ne 'outbox-message-id' } @{ $main[2]{headers} } ],
	[ [ 'empty', undef ], [ 'trace-id', 't-1' ] ],
	'user headers arrive, a null header as a null value');

# Every record names its row by outbox-message-id, and carries the enqueue
# time as its timestamp; the row kept as sent shows where it went.
my $rows = $node->safe_psql('postgres', qq{
	SELECT message_id, kafka_partition, kafka_offset,
	       (extract(epoch FROM created_at) * 1000)::bigint
	  FROM outbox_message WHERE topic = '$topic' ORDER BY id});
my @rows = map { [ split /\|/ ] } split /\n/, $rows;
is(scalar(@rows), 5, 'five rows kept as sent');
is_deeply([ map { message_id_header($_) } @main ], [ map { $_->[0] } @rows ],
	'each record carries its row\'s message_id as outbox-message-id');
is_deeply([ map { "$_->{partition}/$_->{offset}" } @main ], [ map { "$_->[1]/$_->[2]" } @rows ],
	'each sent row records the partition and offset Kafka gave it');
ok(!grep({ abs($main[$_]{timestamp} - $rows[$_][3]) > 1 } 0 .. $#main),
	'the record timestamp is the enqueue time');
is($main[2]{timestamp_type}, 'CreateTime', 'timestamps are the producer\'s');

is(scalar(@inserted), 1, 'a plain INSERT is published');
is($inserted[0]{value}, 'inserted', 'with its payload');
is_deeply($inserted[0]{headers}[0], [ 'via', 'insert' ], 'and its headers');
ok(message_id_header($inserted[0]), 'and its outbox-message-id');

my $status = $node->safe_psql('postgres',
	"SELECT state, brokers_reachable, published, failed, dead_lettered, last_publish_at IS NOT NULL FROM outbox_worker");
is($status, 'idle|t|6|0|0|t', 'outbox_worker counts what was published');
is($node->safe_psql('postgres', "SELECT waiting, retrying, sent_retained FROM outbox_status WHERE topic = '$topic'"),
	'0|0|5', 'outbox_status shows nothing waiting');

# With the default settings delivered rows are deleted.
$node->append_conf('postgresql.conf', "outbox.sent_retention = 0");
$node->reload;
$node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'deleted once sent'::text)");
ok(wait_for_query($node,
		"SELECT count(*) FROM outbox_message WHERE payload = convert_to('deleted once sent', 'UTF8')", '0', 30),
	'without retention the delivered row is deleted');
is(scalar(@{ consume_topics(topics => [$topic], expect => 6, idle => 3) }), 6,
	'and its message was published');

# SIGTERM: the worker exits cleanly with the server.
$node->stop('fast');
my $log = slurp_file($node->logfile);
is(worker_exits($node), 0, 'the worker never crashed or exited with an error');
unlike($log, qr/database "postgres" does not exist|ERROR:/, 'no errors in the server log');

done_testing();

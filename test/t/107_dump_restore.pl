# pg_dump and pg_restore keep every message, its id and its order, in each
# path users take (a restore once handed ids out again after one of them):
#
#   A. pg_dump -Fc of the database, pg_restore into a new one;
#   B. the same dump restored schema first (--schema-only), data after
#      (--data-only);
#   C. pg_dumpall, run by psql in a fresh cluster.
#
# The dumps are taken while enqueues run (test/fault/load.py), with messages
# pending (the worker cannot reach Kafka meanwhile), one retrying and three
# dead-lettered.  Each restore goes to a cluster of its own whose worker
# serves the restored database, first kept from Kafka: the restored outbox
# holds exactly the messages the dump's fault_log says were committed (with
# their ids and states), the dead letters are the source's, and
# outbox_enqueue() works, with ids above every restored message and dead
# letter.  Then Kafka is let in, and every message is delivered once, in id
# order per key.
#
# Messages of every other kind go along too, column by column, on topics
# of their own: delayed, keyed, with headers of any Unicode, a bytea
# payload of every byte value, a trace context from a sqlcommenter comment
# whose traceparent is of a later version followed by CR, LF and 0xFF, a
# row captured by outbox_capture() with a span context of the same, and
# the dead letters; each path restores them all.
#
# The inbox's state goes along: before the dumps the source's inbox has a
# subscription whose handler (failing for one key, max_attempts 2) applied
# some messages, dead-lettered one and holds one for a retry (an hour
# away).  Each restore has the source's rows in inbox_subscription,
# inbox_offset, inbox_received, inbox_retry and inbox_dead_letter, column
# by column (the oid of the function a subscription is bound to, and the
# cluster where it was bound, aside), the handler still resolves and the
# subscription is bound to the restored function, in the restored cluster,
# and new inbox_retry ids are above
# the restored ones.  Once Kafka is let in, the restored subscription is
# served: a message enqueued after the restore is applied, the restored
# ones are not applied again.  (pg_dump -Fc dumps one database, not its
# roles: in paths A and B the subscription's role is created first, as
# pg_dumpall --globals-only would.)
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $unreachable = '127.0.0.1:1';
my $conf = join("\n",
	"outbox.database = 'shop'",
	"outbox.max_attempts = 1000",
	"outbox.retry_backoff_base = '1s'",
	"outbox.retry_backoff_max = '2s'");

my $load_topic = unique_topic('restore.load');
kafka_admin('create-topic', $load_topic);
my ($small, $stale) = refusing_topics('restore');

my $source = outbox_node('source', no_extension => 1, conf => $conf);
$source->safe_psql('postgres', 'CREATE DATABASE shop');
$source->safe_psql('shop', 'CREATE EXTENSION outbox');

# Three dead letters and a retrying message, then Kafka out of reach.
my $big = 'x' x 1000;
$source->safe_psql('shop', committed_late(qq{
	SELECT count(outbox_enqueue('$small', '$big'::text, 'k-small-' || i)) FROM generate_series(1, 3) i;
	SELECT outbox_enqueue('$stale', 'retrying'::text, 'k-stale');
}));
ok(wait_for_query($source,
		"SELECT (SELECT count(*) FROM outbox_dead_letter) || '/' || (SELECT string_agg(state, ',') FROM outbox_message)",
		'3/retrying', 60, 'shop'),
	'source: three dead letters, one message retrying');

# The inbox: a subscription whose handler fails for key k-fail.  Ten
# messages applied, the first of k-fail dead-lettered after its two
# attempts; then, retries put an hour away, the second of k-fail fails
# once and waits in inbox_retry.
my $inbox_topic = unique_topic('restore.inbox');
kafka_admin('create-topic', $inbox_topic);
$source->safe_psql('shop', qq{
	CREATE ROLE coupon_svc LOGIN;
	CREATE TABLE coupon (seq bigserial PRIMARY KEY, message_id uuid, key text, payload text);
	GRANT INSERT ON coupon TO coupon_svc;
	GRANT USAGE ON SEQUENCE coupon_seq_seq TO coupon_svc;
	CREATE FUNCTION apply_coupon(m inbox_message) RETURNS void
	LANGUAGE plpgsql AS \$\$
	BEGIN
	    IF m.key = 'k-fail' THEN
	        RAISE EXCEPTION 'no coupon for %', m.key USING ERRCODE = 'P0001';
	    END IF;
	    INSERT INTO coupon (message_id, key, payload) VALUES (m.message_id, m.key, (m).payload_text);
	END \$\$;
	REVOKE EXECUTE ON FUNCTION apply_coupon(inbox_message) FROM PUBLIC;
	GRANT EXECUTE ON FUNCTION apply_coupon(inbox_message) TO coupon_svc;
	GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure, integer, text, regrole) TO coupon_svc;
	SELECT outbox_grant_topic('coupon_svc', '$inbox_topic', 'subscribe');
	SET ROLE coupon_svc;
	SELECT inbox_subscribe('coupons', ARRAY['$inbox_topic'], 'apply_coupon(inbox_message)', max_attempts => 2);
	RESET ROLE;
	SELECT count(outbox_enqueue('$inbox_topic', 'coupon ' || i, 'k-' || i % 5)) FROM generate_series(1, 10) i;
	SELECT outbox_enqueue('$inbox_topic', 'dead'::text, 'k-fail');
});
ok(wait_for_query($source, q{SELECT (SELECT count(*) FROM coupon) || '/' || (SELECT string_agg(key, ',') FROM inbox_dead_letter)},
		'10/k-fail', 60, 'shop'),
	'source: the inbox applied ten messages and dead-lettered one');
$source->safe_psql('shop', qq{
	ALTER SYSTEM SET outbox.retry_backoff_base = '1h';
	ALTER SYSTEM SET outbox.retry_backoff_max = '1h';
	SELECT pg_reload_conf();
});
# after the reload, at most a second
ok(wait_for_query($source, 'SHOW outbox.retry_backoff_base', '1h', 10, 'shop'), 'source: retries an hour away');
sleep(1);
$source->safe_psql('shop', "SELECT outbox_enqueue('$inbox_topic', 'retrying'::text, 'k-fail')");
ok(wait_for_query($source, q{SELECT string_agg(key || ' ' || attempts || ' ' || sqlstate || ' ' || (next_attempt_at > now() + interval '20 min'), ',') FROM inbox_retry},
		'k-fail 1 P0001 true', 60, 'shop'),
	'source: one message waits in inbox_retry, an hour away');
ok(wait_for_query($source, q{SELECT next_offset FROM inbox_offset}, '12', 30, 'shop'),
	'source: the inbox has read every message');
# The inbox worker's transactions start when they start, not when it
# connected: the retrying message was received after the dead letter failed.
is($source->safe_psql('shop', q{
	SELECT (SELECT received_at FROM inbox_retry) > (SELECT failed_at FROM inbox_dead_letter),
	       (SELECT max(received_at) FROM inbox_received) > (SELECT failed_at FROM inbox_dead_letter)}),
	't|t', 'source: the inbox records when it received and gave up on each message');

$source->safe_psql('shop', "ALTER SYSTEM SET outbox.brokers = '$unreachable'; SELECT pg_reload_conf()");
ok(wait_for_query($source, 'SELECT state FROM outbox_worker', 'waiting for brokers', 30, 'shop'),
	'source: the worker waits for brokers');

# Messages of every kind, on topics of their own, as the worker waits.
my $kinds_topic = unique_topic('restore.kinds');
my $captured_topic = unique_topic('restore.captured');
kafka_admin('create-topic', $_) for ($kinds_topic, "outbox.event.$captured_topic");
my $traceparent = '0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
$source->safe_psql('shop', qq{
	SELECT outbox_enqueue('$kinds_topic', 'delayed'::text, 'k-delayed', deliver_after => '1 day');
	SELECT outbox_enqueue('$kinds_topic', '{"kind": "headers"}'::jsonb, 'k-headers',
	                      '{"source": "web", "note": "ünïcödé ✓", "empty": null}');
	SELECT outbox_enqueue('$kinds_topic', (SELECT string_agg(set_byte('\\x00'::bytea, 0, b), ''::bytea ORDER BY b)
	                                         FROM generate_series(0, 255) b), 'k-bytes');
	INSERT INTO outbox_message (topic, key, payload, headers) VALUES ('$kinds_topic', 'k-insert', '\\x00ff', '{"via": "insert"}');
	CREATE TABLE orderevent (
	    id uuid NOT NULL, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
	    type varchar(255) NOT NULL, payload jsonb, tracingspancontext varchar(256));
	SELECT outbox_capture('orderevent');
});
$source->safe_psql('shop', "SELECT outbox_enqueue('$kinds_topic', 'traced'::text, 'k-traced') "
	  . "/*traceparent='01-$traceparent-%0D%0A%FF',tracestate='rojo=1'*/");
# The captured row is deleted after its insert, as the Quarkus outbox
# extension does (remove-after-insert).
$source->safe_psql('shop', qq{
	BEGIN;
	INSERT INTO orderevent VALUES ('00000000-0000-4000-8000-000000000001', '$captured_topic', '1', 'Made', '{"n": 1}',
	    \$\$traceparent=01-$traceparent-\\r\\n\\u00ff\ntracestate=rojo\\=1\n\$\$);
	DELETE FROM orderevent;
	COMMIT;
});
my $kinds_query = "SELECT id, message_id, topic, key, state, attempts, md5(payload), headers::text, created_at, next_attempt_at
	FROM outbox_message WHERE topic IN ('$kinds_topic', 'outbox.event.$captured_topic') ORDER BY id";
my $source_kinds = $source->safe_psql('shop', $kinds_query);
is($source->safe_psql('shop', "SELECT string_agg(key || ':' || coalesce(headers->>'traceparent', '-'), ',' ORDER BY id)
	FROM outbox_message WHERE topic IN ('$kinds_topic', 'outbox.event.$captured_topic')"),
	"k-delayed:-,k-headers:-,k-bytes:-,k-insert:-,k-traced:00-$traceparent,1:00-$traceparent",
	'source: messages of every kind, each trace context sent as version 00');

# The dumps, while enqueues run.
my $dir = PostgreSQL::Test::Utils::tempdir();
my $load = start_load($source, db => 'shop', topics => [$load_topic], clients => 4, rate => 100,
	duration => 12);
ok(wait_for_query($source, 'SELECT count(*) > 200 FROM fault_log', 't', 30, 'shop'),
	'source: enqueues are running');
command_ok([ 'pg_dump', '-Fc', '-f', "$dir/shop.dump", '-d', $source->connstr('shop') ],
	'pg_dump -Fc under load');
command_ok([ 'pg_dumpall', '-f', "$dir/all.sql", '-d', $source->connstr('postgres') ],
	'pg_dumpall under load');
finish_load($load);
my $dead_letters_query =
  'SELECT id, message_id, topic, key, md5(payload), attempts, created_at, failed_at, error FROM outbox_dead_letter ORDER BY id';
my $source_dead_letters = $source->safe_psql('shop', $dead_letters_query);
# The inbox's tables, every column of every row; but handler_oid, the oid
# of the function a subscription is bound to, which a restore gives anew,
# and handler_bound_in, the cluster where it was bound.
my %inbox_query = map { ($_ => "SELECT string_agg((to_jsonb(t) - 'handler_oid' - 'handler_bound_in')::text, E'\\n' ORDER BY t::text) FROM $_ t") }
  qw(inbox_subscription inbox_offset inbox_received inbox_retry inbox_dead_letter);
my %source_inbox = map { ($_ => $source->safe_psql('shop', $inbox_query{$_})) } keys %inbox_query;
is($source->safe_psql('shop', q{
	SELECT (SELECT count(*) FROM inbox_subscription), (SELECT count(*) FROM inbox_received),
	       (SELECT count(*) FROM inbox_retry), (SELECT count(*) FROM inbox_dead_letter)}),
	'1|12|1|1', 'source: the inbox holds a subscription, 12 received ids, a retry and a dead letter');
$source->stop('fast');

my %restore = (
	'A. pg_restore' => sub {
		my ($node) = @_;
		$node->safe_psql('postgres', 'CREATE ROLE coupon_svc LOGIN; CREATE DATABASE shop');
		command_ok([ 'pg_restore', '-d', $node->connstr('shop'), "$dir/shop.dump" ],
			'A. pg_restore: restored');
	},
	'B. schema, then data' => sub {
		my ($node) = @_;
		$node->safe_psql('postgres', 'CREATE ROLE coupon_svc LOGIN; CREATE DATABASE shop');
		command_ok([ 'pg_restore', '--schema-only', '-d', $node->connstr('shop'), "$dir/shop.dump" ],
			'B. schema, then data: schema restored');
		command_ok([ 'pg_restore', '--data-only', '-d', $node->connstr('shop'), "$dir/shop.dump" ],
			'B. schema, then data: data restored');
	},
	'C. pg_dumpall' => sub {
		my ($node) = @_;
		# The one error allowed: the bootstrap role exists already.
		my ($stdout, $stderr);
		IPC::Run::run([ 'psql', '-X', '-f', "$dir/all.sql", '-d', $node->connstr('postgres') ],
			'>', \$stdout, '2>', \$stderr);
		my @errors = grep { !/role "\w+" already exists/ } grep { /ERROR/ } split /\n/, $stderr;
		is_deeply(\@errors, [], 'C. pg_dumpall: restored by psql without an error');
	});

my $kafka_records = 0;
for my $path (sort keys %restore)
{
	my $node = outbox_node(lc(substr($path, 0, 1)) . '_restored', no_extension => 1,
		conf => "$conf\noutbox.brokers = '$unreachable'");
	$restore{$path}->($node);

	# What the dump says was committed, each message with its key and id.
	my %committed = map { my ($mid, $key, $id) = split /\|/; ($mid => [ $key, $id ]) }
	  split /\n/, $node->safe_psql('shop', 'SELECT message_id, key, id FROM fault_log');
	cmp_ok(scalar(keys %committed), '>', 200, "$path: the dump holds the enqueues that had committed");
	is($node->safe_psql('shop', qq{
			SELECT count(*)
			  FROM (SELECT message_id, id, key FROM outbox_message
			         WHERE topic = '$load_topic' AND state = 'pending') m
			       FULL JOIN fault_log f USING (message_id, id, key)
			 WHERE m.id IS NULL OR f.id IS NULL}),
		'0', "$path: every committed message is restored pending, with its id and key");
	is($node->safe_psql('shop', 'SELECT topic, key, state, attempts > 0 FROM outbox_message WHERE key = \'k-stale\''),
		"$stale|k-stale|retrying|t", "$path: the retrying message is restored retrying");
	is($node->safe_psql('shop', $dead_letters_query), $source_dead_letters, "$path: the dead letters are kept");
	is($node->safe_psql('shop', $kinds_query), $source_kinds,
		"$path: the messages of every kind are restored, column by column");
	is($node->safe_psql('shop', $inbox_query{$_}), $source_inbox{$_}, "$path: $_ holds the source's rows")
	  for sort keys %inbox_query;
	is($node->safe_psql('shop', q{
			SELECT handler, handler::regprocedure = 'apply_coupon(inbox_message)'::regprocedure,
			       handler_oid = 'apply_coupon(inbox_message)'::regprocedure,
			       handler_bound_in = (SELECT system_identifier FROM pg_control_system())
			FROM inbox_subscription}),
		'public.apply_coupon(public.inbox_message)|t|t|t',
		"$path: the subscription's handler resolves, and the subscription is bound to the restored function, in the restored cluster");
	# A new retry id (rolled back) is above every restored retry and dead letter.
	is($node->safe_psql('shop', q{
			BEGIN;
			WITH r AS (INSERT INTO inbox_retry (subscription, run_as, topic, "partition", "offset")
			           VALUES ('coupons', 'coupon_svc', 'x', 0, 0) RETURNING id)
			SELECT r.id > (SELECT max(id) FROM (SELECT id FROM inbox_retry WHERE topic <> 'x'
			                                    UNION ALL SELECT id FROM inbox_dead_letter) i) FROM r;
			ROLLBACK;}),
		't', "$path: inbox_retry's new ids are above the restored ones");

	my $highest = $node->safe_psql('shop',
		'SELECT greatest((SELECT max(id) FROM outbox_message), (SELECT max(id) FROM outbox_dead_letter))');
	$node->safe_psql('shop', "SELECT outbox_enqueue('$inbox_topic', '$path'::text, 'k-restored')");
	my ($ret, $new_ids, $stderr) = $node->psql('shop', qq{
		SELECT outbox_enqueue('$load_topic', 'after the restore'::text, 'k-new');
		INSERT INTO outbox_message (topic, key, payload) VALUES ('$load_topic', 'k-new', 'inserted after the restore')
		RETURNING id;});
	is($stderr, '', "$path: outbox_enqueue() and INSERT work after the restore");
	my @new_ids = split /\n/, $new_ids;
	ok(@new_ids == 2 && $new_ids[0] > $highest && $new_ids[1] > $new_ids[0],
		"$path: new ids (@new_ids) are above every restored message and dead letter ($highest)");
	%committed = (%committed, map { my ($mid, $key, $id) = split /\|/; ($mid => [ $key, $id ]) }
		  split /\n/, $node->safe_psql('shop', "SELECT message_id, key, id FROM outbox_message WHERE key = 'k-new'"));

	# Kafka let in: everything is delivered, once, in order.  Each path
	# publishes the same messages again, so only its own records count: the
	# topic has one partition, and the earlier paths' records come first.
	# The worker came back to connect once the database was created.
	ok(wait_for_query($node, 'SELECT database, state FROM outbox_worker', 'shop|waiting for brokers', 30, 'shop'),
		"$path: the worker serves the restored database");
	my $exits = worker_exits($node);
	$node->safe_psql('shop', "ALTER SYSTEM SET outbox.brokers = '" . brokers() . "'; SELECT pg_reload_conf()");
	ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE topic = '$load_topic'", '0', 120, 'shop'),
		"$path: the restored outbox drains");
	my $records = consume_topics(topics => [$load_topic], expect => $kafka_records + keys %committed,
		timeout => 60);
	my @mine = grep { $_->{offset} >= $kafka_records } @$records;
	$kafka_records = @$records;
	is_deeply(check_delivery(\@mine, \%committed),
		{ lost => 0, phantom => 0, duplicates => 0, order_faults => 0 },
		"$path: " . scalar(keys %committed) . ' messages delivered once each, in id order per key');
	is($node->safe_psql('shop', 'SELECT count(*) FROM outbox_dead_letter'), '3',
		"$path: the dead letters stay");
	# The inbox reads on from the restored offset: the message enqueued
	# after the restore is applied (and those the earlier paths enqueued),
	# none of the ten the source applied again.
	ok(wait_for_query($node, qq{SELECT count(*) FROM coupon WHERE payload = '$path'}, '1', 60, 'shop'),
		"$path: the restored subscription is served, a message enqueued after the restore applied");
	is($node->safe_psql('shop', q{SELECT count(*), count(DISTINCT message_id) FROM coupon WHERE key <> 'k-restored'}),
		'10|10', "$path: no message the source applied is applied again");
	$node->stop('fast');
	is(worker_exits($node), $exits, "$path: the worker never exited after the restore");
}

done_testing();

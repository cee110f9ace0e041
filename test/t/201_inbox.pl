# The inbox: database "shop" enqueues with outbox_enqueue(), database
# "coupons" subscribes with a handler that inserts into a table.  Each
# message committed in shop is applied once in coupons, with its key,
# payload, headers, message_id, partition, offset and timestamp; in each
# key's order; as the subscribing role, never a superuser; a message sent
# twice with one outbox-message-id is applied once; a handler failing for
# some keys retries them and then dead-letters them while every other key
# flows; inbox_requeue() and inbox_discard() work on the dead letters;
# only granted roles subscribe, and each sees its own dead letters only.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = outbox_node('inbox', conf => join("\n",
	"outbox.retry_backoff_base = '100ms'",
	"outbox.retry_backoff_max = '400ms'",
	"outbox.max_attempts = 3"));
$node->safe_psql('postgres', 'CREATE DATABASE coupons');
# as a database's setting, for every session of it and the inbox worker too
$node->safe_psql('postgres', "ALTER DATABASE coupons SET statement_timeout = '1s'");
$node->safe_psql('coupons', 'CREATE EXTENSION outbox');

my $topic = unique_topic('inbox.users');
kafka_admin('create-topic', $topic, '--partitions', '3');

# The consuming service: a role of its own, its table, its handler.
$node->safe_psql('coupons', q{
	CREATE ROLE coupon_svc LOGIN;
	CREATE ROLE intruder LOGIN;
	CREATE TABLE coupon (
	    seq bigserial PRIMARY KEY, message_id uuid, topic text, part int, off bigint,
	    key text, user_id int, headers jsonb, ts timestamptz, applied_by text,
	    applied_now timestamptz DEFAULT now());
	GRANT INSERT, SELECT ON coupon TO coupon_svc;
	GRANT USAGE ON SEQUENCE coupon_seq_seq TO coupon_svc;
	CREATE TABLE fail_rule (key text PRIMARY KEY);
	GRANT SELECT ON fail_rule TO coupon_svc;
	-- counts attempts across rollbacks: a sequence is not transactional
	CREATE SEQUENCE transient_failures;
	GRANT USAGE ON SEQUENCE transient_failures TO coupon_svc;
	CREATE FUNCTION apply_coupon(m inbox_message) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN
	    IF EXISTS (SELECT FROM fail_rule f WHERE f.key = m.key)
	       OR (m.key = 'user-3' AND ((m).payload_jsonb ->> 'user_id')::int >= 2000
	           AND nextval('transient_failures') <= 2) THEN
	        RAISE EXCEPTION 'no coupon for %', m.key USING ERRCODE = 'P0001';
	    END IF;
	    IF m.key = 'slow' THEN
	        PERFORM pg_sleep(3);
	    END IF;
	    IF m.key = 'escalate' THEN
	        CREATE TEMP TABLE escalate (x int);
	    END IF;
	    IF m.key = 'untimed' THEN
	        PERFORM set_config('statement_timeout', '0', false);
	    END IF;
	    IF m.key = 'setter' THEN
	        PERFORM set_config('application_name', 'set by a handler', false);
	    END IF;
	    INSERT INTO coupon (message_id, topic, part, off, key, user_id, headers, ts, applied_by)
	    VALUES (m.message_id, m.topic, m.partition, m.offset, m.key,
	            ((m).payload_jsonb ->> 'user_id')::int, m.headers, m.timestamp, current_user);
	END $$;
	REVOKE EXECUTE ON FUNCTION apply_coupon(inbox_message) FROM PUBLIC;
	GRANT EXECUTE ON FUNCTION apply_coupon(inbox_message) TO coupon_svc;
});

# Who may subscribe.
my ($ret, $out, $err) = $node->psql('coupons', qq{
	SET ROLE coupon_svc;
	SELECT inbox_subscribe('coupons', ARRAY['$topic'], 'apply_coupon(inbox_message)');
});
like($err, qr/permission denied for function inbox_subscribe/,
	'a role not granted EXECUTE on inbox_subscribe() cannot subscribe');
($ret, $out, $err) = $node->psql('coupons',
	"SELECT inbox_subscribe('coupons', ARRAY['$topic'], 'apply_coupon(inbox_message)')");
like($err, qr/an inbox handler may not run as superuser/, 'a handler never runs as a superuser');
($ret, $out, $err) = $node->psql('coupons', qq{
	GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure, integer, text, regrole) TO intruder;
	SET ROLE intruder;
	SELECT inbox_subscribe('coupons', ARRAY['$topic'], 'apply_coupon(inbox_message)', run_as => 'coupon_svc');
});
like($err, qr/permission denied to subscribe as role "coupon_svc"/,
	'a role cannot make a subscription run as a role it is not a member of');
($ret, $out, $err) = $node->psql('coupons', qq{
	SET ROLE intruder;
	SELECT inbox_subscribe('mine', ARRAY['$topic'], 'apply_coupon(inbox_message)');
});
like($err, qr/role "intruder" may not execute inbox handler/,
	'nor with a handler its role may not execute');
($ret, $out, $err) = $node->psql('coupons',
	"SELECT inbox_subscribe('x', ARRAY['bad topic'], 'apply_coupon(inbox_message)', run_as => 'coupon_svc')");
like($err, qr/inbox topic "bad topic" is not a valid Kafka topic name/, 'a bad topic name is refused');
($ret, $out, $err) = $node->psql('coupons',
	"SELECT inbox_subscribe('x', ARRAY['$topic'], 'pg_catalog.now()', run_as => 'coupon_svc')");
like($err, qr/does not take one inbox_message/, 'a function of no inbox_message is refused');

$node->safe_psql('coupons', qq{
	GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure, integer, text, regrole) TO coupon_svc;
	SELECT outbox_grant_topic('coupon_svc', 'inbox.*', 'subscribe');
	SET ROLE coupon_svc;
	SELECT inbox_subscribe('coupons', ARRAY['$topic'], 'apply_coupon(inbox_message)');
});
ok($node->poll_query_until('coupons',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox inbox' AND datname = 'coupons'", '1'),
	'an inbox worker (backend_type "outbox inbox") serves the database once it has a subscription');
ok($node->poll_query_until('coupons', "SELECT count(*) FROM inbox_status WHERE topic = '$topic'", '3'),
	'inbox_status lists the topic\'s three partitions');

# Messages of 20 keys, in transactions of 10, one rolled back.
my $keys = 20;
for my $t (0 .. 9)
{
	my $end = $t == 4 ? 'ROLLBACK' : 'COMMIT';
	$node->safe_psql('postgres', qq{
		BEGIN;
		SELECT outbox_enqueue('$topic', json_build_object('user_id', $t * 10 + i)::jsonb,
		                      'user-' || (($t * 10 + i) % $keys), '{"trace": "t-$t"}')
		  FROM generate_series(0, 9) i;
		$end;
	});
}
ok(wait_for_query($node, 'SELECT count(*) FROM coupon', '90', 60, 'coupons'),
	'every committed message is applied, the rolled-back ones never');
is($node->safe_psql('coupons', 'SELECT count(DISTINCT message_id) FROM coupon'), '90', 'each once');
is($node->safe_psql('coupons', q{SELECT count(*) FROM coupon WHERE user_id / 10 = 4}), '0',
	'no message of the rolled-back transaction');
is($node->safe_psql('coupons', q{SELECT string_agg(DISTINCT applied_by, ',') FROM coupon}), 'coupon_svc',
	'the handler runs as the role that subscribed');
is($node->safe_psql('coupons', q{
	SELECT count(*) FROM coupon c1 JOIN coupon c2 ON c1.key = c2.key AND c1.seq < c2.seq
	 WHERE c1.user_id > c2.user_id}), '0', 'each key\'s messages are applied in their order');
is($node->safe_psql('coupons', qq{
	SELECT count(*) FROM coupon WHERE topic = '$topic' AND part BETWEEN 0 AND 2 AND off >= 0
	   AND headers ->> 'trace' = 't-' || (user_id / 10) AND headers ? 'outbox-message-id'
	   AND ts BETWEEN now() - interval '5 min' AND now()}), '90',
	'the handler gets topic, partition, offset, headers, the Kafka timestamp');
is($node->safe_psql('coupons', q{SELECT count(*) FROM coupon WHERE message_id::text = headers ->> 'outbox-message-id'}),
	'90', 'message_id is the outbox-message-id header');
ok(wait_for_query($node, qq{SELECT sum(next_offset) = 90 AND sum(lag) = 0 AND bool_and(last_applied_at IS NOT NULL OR next_offset = 0)
	   FROM inbox_status WHERE topic = '$topic'}, 't', 30, 'coupons'),
	'inbox_status: the next offsets add up to the messages, no lag');

# A record sent twice with one outbox-message-id (a producer that crashed
# after Kafka took it), and records without the header.
my $dup_id = '6f1c2d3e-0000-4000-8000-00000000d0b1';
for (1 .. 2)
{
	kafka_admin('produce', $topic, '--partition', '0', '--key', 'dup', '--value-hex',
		unpack('H*', '{"user_id": 1000}'), '--header', "outbox-message-id=$dup_id");
}
kafka_admin('produce', $topic, '--partition', '1', '--key', 'plain', '--value-hex',
	unpack('H*', '{"user_id": 1001}')) for 1 .. 2;
ok(wait_for_query($node, 'SELECT count(*) FROM coupon WHERE user_id >= 1000', '3', 30, 'coupons'),
	'a record sent twice under one outbox-message-id is applied once; two without it, each once');
is($node->safe_psql('coupons', "SELECT count(*) FROM coupon WHERE message_id = '$dup_id'"), '1',
	'the duplicate is not applied');
is($node->safe_psql('coupons', 'SELECT duplicates >= 1 FROM inbox_worker'), 't',
	'inbox_worker counts it');

# Each batch's transaction has its own now(), for the handler and for the
# ids' received_at, which outbox.inbox_dedup_retention goes by.
my $round_starts = $node->safe_psql('coupons', 'SELECT clock_timestamp()');

# A handler that fails for chosen keys: user-3 twice (its first two
# attempts in this round, fewer than outbox.max_attempts), user-7 always.
$node->safe_psql('coupons', q{INSERT INTO fail_rule VALUES ('user-7')});
$node->safe_psql('postgres', qq{
	SELECT outbox_enqueue('$topic', json_build_object('user_id', 2000 + i)::jsonb, 'user-' || (i % $keys))
	  FROM generate_series(0, 99) i});
ok(wait_for_query($node, 'SELECT count(*) FROM coupon WHERE user_id >= 2000', '95', 60, 'coupons'),
	'the messages of every other key flow, and user-3\'s once its handler succeeds');
is($node->safe_psql('coupons', qq{
	SELECT bool_and(applied_now >= '$round_starts') FROM coupon WHERE user_id >= 2000}), 't',
	'a handler\'s now() is its batch\'s transaction\'s, not the worker\'s start');
is($node->safe_psql('coupons', qq{
	SELECT count(*) FROM inbox_received WHERE received_at >= '$round_starts'}), '100',
	'and so is the received_at of the ids, which their retention goes by');
is($node->safe_psql('coupons', q{SELECT count(*) FROM coupon WHERE user_id >= 2000 AND key = 'user-3'}), '5',
	'user-3, failing for a while, is retried and applied');
is($node->safe_psql('coupons', q{
	SELECT count(*) FROM coupon c1 JOIN coupon c2 ON c1.key = c2.key AND c1.seq < c2.seq
	 WHERE c1.user_id > c2.user_id}), '0', 'per-key order kept through the retries');
ok(wait_for_query($node, q{SELECT count(*) FROM inbox_dead_letter WHERE key = 'user-7'}, '5', 60, 'coupons'),
	'user-7, always failing, is dead-lettered: each of its messages after max_attempts');
is($node->safe_psql('coupons', q{
	SELECT string_agg(DISTINCT format('%s %s %s %s', attempts, sqlstate, error, error_context LIKE '%apply_coupon%'), ';')
	  FROM inbox_dead_letter}), '3 P0001 no coupon for user-7 t',
	'a dead letter keeps its attempts and the last error\'s SQLSTATE, message and context');
is($node->safe_psql('coupons', q{SELECT count(*) FROM coupon WHERE key = 'user-7' AND user_id >= 2000}), '0',
	'nothing of user-7 is applied');
ok(wait_for_query($node, qq{SELECT sum(retrying), sum(dead_letters) FROM inbox_status WHERE topic = '$topic'},
		'0|5', 30, 'coupons'), 'inbox_status: 0 retrying, 5 dead letters');

# Dead letters: requeue one once the handler works, discard another.
$node->safe_psql('coupons', q{DELETE FROM fail_rule});
my @dead = split /\n/, $node->safe_psql('coupons', 'SELECT id FROM inbox_dead_letter ORDER BY id');
($ret, $out, $err) = $node->psql('coupons', "SET ROLE intruder; SELECT inbox_requeue($dead[0])");
like($err, qr/permission denied to requeue as role "coupon_svc"|permission denied for function inbox_requeue/,
	'a role that is not the subscription\'s cannot requeue its dead letters');
$node->safe_psql('coupons', q{
	GRANT EXECUTE ON FUNCTION inbox_requeue(bigint), inbox_discard(bigint) TO coupon_svc});
is($node->safe_psql('coupons', "SET ROLE coupon_svc; SELECT inbox_requeue($dead[0]) IS NOT NULL"), 't',
	'inbox_requeue() puts a dead letter back');
ok(wait_for_query($node, q{SELECT count(*) FROM coupon WHERE key = 'user-7' AND user_id >= 2000}, '1', 30, 'coupons'),
	'and it is applied');
is($node->safe_psql('coupons', "SET ROLE coupon_svc; SELECT inbox_discard($dead[1])"), 't',
	'inbox_discard() deletes one');
is($node->safe_psql('coupons', 'SELECT count(*) FROM inbox_dead_letter'), '3', 'three dead letters left');

# statement_timeout cancels a handler call that runs longer, as it would a
# client's statement: the message fails, is retried, and dead-lettered.
$node->safe_psql('postgres', qq{SELECT outbox_enqueue('$topic', '{"user_id": 3000}'::jsonb, 'slow')});
ok(wait_for_query($node, q{SELECT sqlstate || ' ' || attempts FROM inbox_dead_letter WHERE key = 'slow'},
		'57014 3', 60, 'coupons'),
	'a handler that runs longer than statement_timeout is cancelled (57014) at each attempt');
my $slow = $node->safe_psql('coupons', q{SELECT id FROM inbox_dead_letter WHERE key = 'slow'});
$node->safe_psql('coupons', "SET ROLE coupon_svc; SELECT inbox_discard($slow)");

# A handler that turns statement_timeout off: the timer armed for its call
# is disarmed all the same, not left to cancel the worker's own work a
# second later (statement_timeout is 1 s: by 2 s it would have).
my $inbox_pid = $node->safe_psql('coupons', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox inbox'");
$node->safe_psql('postgres', qq{SELECT outbox_enqueue('$topic', '{"user_id": 6000}'::jsonb, 'untimed')});
ok(wait_for_query($node, 'SELECT count(*) FROM coupon WHERE user_id = 6000', '1', 30, 'coupons'),
	'a handler that turns statement_timeout off is applied');
sleep(2);
$node->safe_psql('postgres', qq{SELECT outbox_enqueue('$topic', '{"user_id": 6001}'::jsonb, 'after-untimed')});
ok(wait_for_query($node, 'SELECT count(*) FROM coupon WHERE user_id = 6001', '1', 30, 'coupons'),
	'and the next message is applied');
is($node->safe_psql('coupons', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox inbox'"),
	$inbox_pid, 'by the same inbox worker: no timer left armed cancelled it');

# The handler runs in a security-restricted operation (no temporary
# objects, which would outlive it in the worker's session, no SET ROLE),
# and what it sets, even for the session, is put back.
$node->safe_psql('postgres', qq{
	SELECT outbox_enqueue('$topic', '{"user_id": 5000}'::jsonb, 'escalate'),
	       outbox_enqueue('$topic', '{"user_id": 5001}'::jsonb, 'setter')});
ok(wait_for_query($node, q{SELECT count(*) FROM inbox_dead_letter WHERE key = 'escalate'}, '1', 60, 'coupons'),
	'a handler that creates a temporary table fails');
like($node->safe_psql('coupons', q{SELECT sqlstate || ' ' || error FROM inbox_dead_letter WHERE key = 'escalate'}),
	qr/^42501 cannot create temporary table within security-restricted operation/,
	'because it runs in a security-restricted operation');
ok(wait_for_query($node, 'SELECT count(*) FROM coupon WHERE user_id = 5001', '1', 30, 'coupons'),
	'a handler that sets a setting for the session is applied');
is($node->safe_psql('coupons',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox inbox' AND application_name = 'set by a handler'"),
	'0', 'and the setting does not outlive the handler in the inbox worker');
my $escalate = $node->safe_psql('coupons', q{SELECT id FROM inbox_dead_letter WHERE key = 'escalate'});
$node->safe_psql('coupons', "SET ROLE coupon_svc; SELECT inbox_discard($escalate)");

# Each subscription's role sees its own dead letters only.
$node->safe_psql('coupons', q{
	GRANT SELECT ON inbox_dead_letter, inbox_retry TO coupon_svc, intruder});
is($node->safe_psql('coupons', 'SET ROLE coupon_svc; SELECT count(*) FROM inbox_dead_letter'), '3',
	'the subscription\'s role sees its dead letters');
is($node->safe_psql('coupons', 'SET ROLE intruder; SELECT count(*) FROM inbox_dead_letter'), '0',
	'another role sees none of them');
($ret, $out, $err) = $node->psql('coupons', 'SET ROLE coupon_svc; SELECT count(*) FROM inbox_received');
like($err, qr/permission denied for table inbox_received/, 'nor the received ids, granted to no one');

# A subscription whose role lost EXECUTE on its handler is not applied
# (the worker calls it directly, where no one else would check): it waits,
# saying why, and goes on once the grant is back.
$node->safe_psql('coupons', 'REVOKE EXECUTE ON FUNCTION apply_coupon(inbox_message) FROM coupon_svc');
$node->safe_psql('postgres', qq{SELECT outbox_enqueue('$topic', '{"user_id": 4000}'::jsonb, 'grant')});
ok(wait_for_query($node, q{SELECT last_error LIKE '%role "coupon_svc" may not execute inbox handler%' FROM inbox_worker},
		't', 30, 'coupons'),
	'a handler its role may no longer execute is not called, and inbox_worker says why');
is($node->safe_psql('coupons', 'SELECT count(*) FROM coupon WHERE user_id = 4000'), '0', 'its message waits');
$node->safe_psql('coupons', 'GRANT EXECUTE ON FUNCTION apply_coupon(inbox_message) TO coupon_svc');
ok(wait_for_query($node, 'SELECT count(*) FROM coupon WHERE user_id = 4000', '1', 30, 'coupons'),
	'and is applied once the grant is back');

# outbox.inbox_dedup_retention: the ids received longer ago are forgotten,
# and a message that comes again after that is applied again.
$node->safe_psql('coupons', q{ALTER SYSTEM SET outbox.inbox_dedup_retention = '2s'; SELECT pg_reload_conf()});
ok(wait_for_query($node, q{SELECT count(*) FROM inbox_received}, '0', 30, 'coupons'),
	'the ids received longer ago than outbox.inbox_dedup_retention are forgotten');
kafka_admin('produce', $topic, '--partition', '0', '--key', 'dup', '--value-hex',
	unpack('H*', '{"user_id": 1000}'), '--header', "outbox-message-id=$dup_id");
ok(wait_for_query($node, "SELECT count(*) FROM coupon WHERE message_id = '$dup_id'", '2', 30, 'coupons'),
	'a message that comes again after its id was forgotten is applied again, as documented');
$node->safe_psql('coupons', q{ALTER SYSTEM RESET outbox.inbox_dedup_retention; SELECT pg_reload_conf()});

# A subscription to a topic that does not exist yet shows in inbox_status,
# its partition NULL, the worker's last error saying why.  Once the topic
# is there that error goes; a handler's failure, to be retried, shows as
# the latest error, and goes once the message is applied.
my $late = unique_topic('inbox.late');
$node->safe_psql('coupons', qq{
	SET ROLE coupon_svc;
	SELECT inbox_subscribe('late', ARRAY['$late'], 'apply_coupon(inbox_message)', max_attempts => 1000);
});
ok(wait_for_query($node, qq{SELECT topic, "partition" IS NULL, next_offset IS NULL AND lag IS NULL,
		worker_last_error LIKE '%cannot read topic "$late"%' FROM inbox_status WHERE subscription = 'late'},
		"$late|t|t|t", 60, 'coupons'),
	'inbox_status shows a subscription whose topic is missing, partition NULL, and the error why')
  or diag($node->safe_psql('coupons', q{SELECT * FROM inbox_status WHERE subscription = 'late'}));
kafka_admin('create-topic', $late, '--partitions', '1');
$node->safe_psql('postgres', qq{SELECT outbox_enqueue('$late', '{"user_id": 7000}'::jsonb, 'late-ok')});
ok(wait_for_query($node, 'SELECT count(*) FROM coupon WHERE user_id = 7000', '1', 60, 'coupons'),
	'once the topic exists, its message is applied');
is($node->safe_psql('coupons', qq{SELECT "partition", next_offset FROM inbox_status WHERE subscription = 'late'}),
	'0|1', 'inbox_status shows the partition found instead');
is($node->safe_psql('coupons', q{SELECT coalesce(last_error, '') NOT LIKE '%cannot read topic%' FROM inbox_worker}), 't',
	'inbox_worker.last_error no longer says the topic cannot be read');
$node->safe_psql('coupons', q{INSERT INTO fail_rule VALUES ('late-fail')});
$node->safe_psql('postgres', qq{SELECT outbox_enqueue('$late', '{"user_id": 7001}'::jsonb, 'late-fail')});
ok(wait_for_query($node, qq{SELECT last_error LIKE 'subscription "late": the handler failed on topic "$late" partition 0 offset 1 (to be retried): no coupon for late-fail',
		last_error_at > now() - interval '1 minute' FROM inbox_worker}, 't|t', 60, 'coupons'),
	'a handler\'s failure that is retried is inbox_worker\'s last error')
  or diag($node->safe_psql('coupons', 'SELECT last_error, last_error_at FROM inbox_worker'));
$node->safe_psql('coupons', q{DELETE FROM fail_rule});
ok(wait_for_query($node, 'SELECT count(*) FROM coupon WHERE user_id = 7001', '1', 60, 'coupons'),
	'the message is applied once the handler takes it');
ok(wait_for_query($node, q{SELECT last_error IS NULL AND last_error_at IS NULL FROM inbox_worker}, 't', 30, 'coupons'),
	'and the handler\'s error goes from inbox_worker once no message waits to retry')
  or diag($node->safe_psql('coupons', 'SELECT last_error, last_error_at FROM inbox_worker'));
$node->safe_psql('coupons', q{SELECT inbox_unsubscribe('late')});

# Unsubscribing.
($ret, $out, $err) = $node->psql('coupons', q{SELECT inbox_unsubscribe('coupons')});
like($err, qr/has 3 messages waiting to retry or dead-lettered/, 'unsubscribing with dead letters left is refused');
$node->safe_psql('coupons', q{SELECT inbox_unsubscribe('coupons', discard_pending => true)});
ok($node->poll_query_until('coupons',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox inbox'", '0'),
	'with no subscription left, the inbox worker leaves');
is($node->safe_psql('coupons', q{
	SELECT (SELECT count(*) FROM inbox_offset) + (SELECT count(*) FROM inbox_received)
	     + (SELECT count(*) FROM inbox_dead_letter)}), '0', 'and nothing of the subscription is left');

is(worker_exits($node), 0, 'no outbox process crashed or exited with an error');
done_testing();

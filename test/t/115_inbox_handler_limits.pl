# What a handler can do to the inbox worker and to other subscriptions.
# Nothing a handler takes outlives its call (session advisory locks,
# prepared statements, sequences' last values), it sees its own role as
# session_user and no superuser; a handler that catches query_canceled
# is still ended by outbox.inbox_handler_timeout, its message failed,
# retried and dead-lettered while the worker lives on; one subscription's
# slow handler does not keep another's messages waiting for its batch;
# pg_terminate_backend() of the worker, DROP DATABASE ... WITH (FORCE) and
# a fast shutdown end a handler whatever it catches, and lose nothing.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = outbox_node('handler_limits', conf => join("\n",
	"outbox.retry_backoff_base = '100ms'",
	"outbox.retry_backoff_max = '200ms'",
	"outbox.max_attempts = 2",
	"outbox.inbox_handler_timeout = '2s'"));
$node->safe_psql('postgres', 'CREATE DATABASE app');
$node->safe_psql('app', 'CREATE EXTENSION outbox');

my $topic_a = unique_topic('limits.a');
my $topic_b = unique_topic('limits.b');
kafka_admin('create-topic', $_, '--partitions', '1') for $topic_a, $topic_b;

# Two services, each a role with its handler; the handlers record what they
# see in "seen", and behave as the key of the message says.
$node->safe_psql('app', q{
	CREATE ROLE svc_a LOGIN;
	CREATE ROLE svc_b LOGIN;
	CREATE TABLE seen (seq bigserial PRIMARY KEY, sub text, key text, info jsonb);
	GRANT INSERT, SELECT ON seen TO svc_a, svc_b;
	GRANT USAGE ON SEQUENCE seen_seq_seq TO svc_a, svc_b;
	CREATE SEQUENCE shared_seq;
	GRANT USAGE, SELECT ON SEQUENCE shared_seq TO svc_a, svc_b;
	CREATE TABLE mode (catching boolean);
	INSERT INTO mode VALUES (true);
	GRANT SELECT ON mode TO svc_a;

	CREATE FUNCTION handle_a(m inbox_message) RETURNS void LANGUAGE plpgsql AS $$
	DECLARE
	    listen_error text;
	    prepare_error text;
	BEGIN
	    IF m.key = 'leave-state' THEN
	        PERFORM pg_advisory_lock(4242);
	        PERFORM nextval('shared_seq');
	        BEGIN
	            EXECUTE 'PREPARE leaked AS SELECT 1';
	        EXCEPTION WHEN OTHERS THEN
	            prepare_error := SQLERRM;
	        END;
	        BEGIN
	            EXECUTE 'LISTEN leaked';
	        EXCEPTION WHEN OTHERS THEN
	            listen_error := SQLERRM;
	        END;
	        INSERT INTO seen (sub, key, info) VALUES ('a', m.key, jsonb_build_object(
	            'session_user', session_user, 'current_user', current_user,
	            'is_superuser', current_setting('is_superuser'), 'listen', listen_error,
	            'prepare', prepare_error));
	    ELSIF m.key = 'catch' THEN
	        -- whatever cancels it, carry on; until mode says otherwise
	        WHILE (SELECT catching FROM mode) LOOP
	            BEGIN
	                PERFORM pg_sleep(0.2);
	            EXCEPTION WHEN query_canceled THEN
	                NULL;
	            END;
	        END LOOP;
	        INSERT INTO seen (sub, key) VALUES ('a', m.key);
	    ELSIF m.key = 'slow' THEN
	        PERFORM pg_sleep(0.2);
	        INSERT INTO seen (sub, key) VALUES ('a', m.key);
	    ELSE
	        INSERT INTO seen (sub, key) VALUES ('a', m.key);
	    END IF;
	END $$;

	CREATE FUNCTION handle_b(m inbox_message) RETURNS void LANGUAGE plpgsql AS $$
	DECLARE
	    last_value text;
	BEGIN
	    BEGIN
	        last_value := currval('shared_seq')::text;
	    EXCEPTION WHEN OTHERS THEN
	        last_value := NULL;
	    END;
	    INSERT INTO seen (sub, key, info) VALUES ('b', m.key, jsonb_build_object(
	        'lock_held_before', EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory'
	                                     AND objid = 4242 AND pid = pg_backend_pid()),
	        'prepared', (SELECT count(*) FROM pg_prepared_statements),
	        'currval', last_value,
	        'slow_applied', (SELECT count(*) FROM seen WHERE key = 'slow')));
	END $$;
	REVOKE EXECUTE ON FUNCTION handle_a(inbox_message), handle_b(inbox_message) FROM PUBLIC;
	GRANT EXECUTE ON FUNCTION handle_a(inbox_message) TO svc_a;
	GRANT EXECUTE ON FUNCTION handle_b(inbox_message) TO svc_b;
});
$node->safe_psql('app', qq{
	SELECT outbox_grant_topic('svc_a', '$topic_a', 'subscribe');
	SELECT inbox_subscribe('a', ARRAY['$topic_a'], 'handle_a(inbox_message)', run_as => 'svc_a');
	SELECT outbox_grant_topic('svc_b', '$topic_b', 'subscribe');
	SELECT inbox_subscribe('b', ARRAY['$topic_b'], 'handle_b(inbox_message)', run_as => 'svc_b');
});

my $worker_pid_query =
  "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox inbox' AND datname = 'app'";
ok($node->poll_query_until('app', "SELECT count(*) = 1 FROM ($worker_pid_query) w"),
	'an inbox worker serves the database');
my $worker_pid = $node->safe_psql('app', $worker_pid_query);

sub enqueue
{
	my ($topic, @keys) = @_;
	$node->safe_psql('postgres', join('', map {
		"SELECT outbox_enqueue('$topic', '{}'::jsonb, '$_');\n" } @keys));
}

# What a handler took does not outlive its call.
enqueue($topic_a, 'leave-state');
ok(wait_for_query($node, "SELECT count(*) FROM seen WHERE key = 'leave-state'", '1', 60, 'app'),
	'a handler that takes an advisory lock and a sequence value is applied')
  or diag($node->safe_psql('app', 'SELECT last_error FROM inbox_worker'));
my $a_saw = $node->safe_psql('app', q{
	SELECT format('%s %s %s', info ->> 'session_user', info ->> 'current_user', info ->> 'is_superuser')
	  FROM seen WHERE key = 'leave-state'});
is($a_saw, 'svc_a svc_a off', 'the handler sees its role as session_user and current_user, is_superuser off');
like($node->safe_psql('app', q{SELECT info ->> 'listen' FROM seen WHERE key = 'leave-state'}),
	qr/cannot execute LISTEN within security-restricted operation/, 'LISTEN is refused to a handler');
like($node->safe_psql('app', q{SELECT info ->> 'prepare' FROM seen WHERE key = 'leave-state'}),
	qr/cannot execute PREPARE within security-restricted operation/, 'and so is PREPARE');
is($node->safe_psql('app', qq{
	SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND pid = $worker_pid}), '0',
	'the inbox worker does not hold the advisory lock the handler took after its call');
enqueue($topic_b, 'probe');
ok(wait_for_query($node, "SELECT count(*) FROM seen WHERE key = 'probe'", '1', 60, 'app'),
	'another subscription\'s handler runs');
is($node->safe_psql('app', q{
	SELECT format('%s %s %s', info ->> 'lock_held_before', info ->> 'prepared', coalesce(info ->> 'currval', 'none'))
	  FROM seen WHERE key = 'probe'}), 'false 0 none',
	'it holds no advisory lock of the other\'s, sees no prepared statement of it, no currval of its sequence');

# A handler that catches the cancel of its timeout.
enqueue($topic_a, 'catch');
ok(wait_for_query($node, "SELECT count(*) FROM inbox_dead_letter WHERE key = 'catch'", '1', 60, 'app'),
	'a handler that catches query_canceled is failed by outbox.inbox_handler_timeout, retried, dead-lettered');
is($node->safe_psql('app', q{SELECT format('%s %s %s', attempts, sqlstate, error) FROM inbox_dead_letter WHERE key = 'catch'}),
	'2 57014 the handler ran longer than outbox.inbox_handler_timeout (2000 ms)',
	'its dead letter says why, after outbox.max_attempts');
is($node->safe_psql('app', $worker_pid_query), $worker_pid, 'the inbox worker lives on (same pid)');
enqueue($topic_a, 'after-catch');
ok(wait_for_query($node, "SELECT count(*) FROM seen WHERE key = 'after-catch'", '1', 60, 'app'),
	'and applies the next messages');

# One subscription's slow handler, another's message meanwhile: it is
# applied before the slow batch is, not after it.
my $slow = 40;
enqueue($topic_a, ('slow') x $slow);
ok($node->poll_query_until('app', "SELECT count(*) > 0 FROM seen WHERE key = 'slow'"),
	'the slow handler runs');
enqueue($topic_b, 'meanwhile');
ok(wait_for_query($node, "SELECT count(*) FROM seen WHERE key = 'meanwhile'", '1', 60, 'app'),
	'the other subscription\'s message is applied');
cmp_ok($node->safe_psql('app', q{SELECT (info ->> 'slow_applied')::int FROM seen WHERE key = 'meanwhile'}),
	'<', $slow, 'while the slow subscription still had messages of its batch to apply');
ok(wait_for_query($node, "SELECT count(*) FROM seen WHERE key = 'slow'", $slow, 60, 'app'),
	'every slow message is applied in the end');
is($node->safe_psql('app', "SELECT count(DISTINCT seq) FROM seen WHERE key = 'slow'"), $slow, 'each once');

# With no handler timeout, only the worker's end stops a handler that
# catches every cancel.
$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.inbox_handler_timeout = 0; SELECT pg_reload_conf()");

# The Kafka processes the worker started.
sub kafka_children
{
	my ($parent) = @_;
	my @children;
	for my $stat (glob '/proc/[0-9]*/stat')
	{
		open my $fh, '<', $stat or next;
		my $line = <$fh> // next;
		push @children, $1 if $line =~ /^(\d+) \(outbox_kafka\) \S (\d+) / && $2 == $parent;
	}
	return @children;
}

sub running
{
	my ($pid) = @_;
	open my $fh, '<', "/proc/$pid/stat" or return 0;
	my $line = <$fh> // return 0;
	return $line !~ /^\d+ \(.*\) Z /;
}

# Poll, with a deadline of 20 s, until none of the processes runs.
sub wait_until_gone
{
	my (@pids) = @_;
	for (1 .. 200)
	{
		return 1 unless grep { running($_) } @pids;
		usleep(100_000);
	}
	return 0;
}

sub in_catching_call
{
	return $node->poll_query_until('app', qq{
		SELECT count(*) = 1 FROM pg_stat_activity
		 WHERE backend_type = 'outbox inbox' AND datname = 'app' AND wait_event = 'PgSleep'});
}

enqueue($topic_a, 'catch');
ok(in_catching_call(), 'a handler catching every cancel runs');
my @consumers = kafka_children($worker_pid);
is(scalar(@consumers), 2, 'the worker runs a Kafka process per subscription');
$node->safe_psql('app', "SELECT pg_terminate_backend($worker_pid)");
ok(wait_until_gone($worker_pid), 'pg_terminate_backend() ends the inbox worker');
ok(wait_until_gone(@consumers), 'and its Kafka processes');
$node->safe_psql('app', 'UPDATE mode SET catching = false');
ok(wait_for_query($node, "SELECT count(*) FROM seen WHERE key = 'catch'", '1', 60, 'app'),
	'a new inbox worker applies the message the terminated one was applying, once');
isnt($node->safe_psql('app', $worker_pid_query), $worker_pid, 'a new worker');
$node->safe_psql('app', 'UPDATE mode SET catching = true');

# DROP DATABASE ... WITH (FORCE) while a handler sleeps.
$node->safe_psql('postgres', 'CREATE DATABASE doomed');
my $topic_d = unique_topic('limits.doomed');
kafka_admin('create-topic', $topic_d, '--partitions', '1');
$node->safe_psql('doomed', qq{
	CREATE EXTENSION outbox;
	CREATE ROLE svc_d;
	CREATE FUNCTION sleepy(m inbox_message) RETURNS void LANGUAGE sql AS 'SELECT pg_sleep(40)';
	GRANT EXECUTE ON FUNCTION sleepy(inbox_message) TO svc_d;
	SELECT outbox_grant_topic('svc_d', '$topic_d', 'subscribe');
	SELECT inbox_subscribe('d', ARRAY['$topic_d'], 'sleepy(inbox_message)', run_as => 'svc_d');
});
enqueue($topic_d, 'sleep');
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM pg_stat_activity
	 WHERE backend_type = 'outbox inbox' AND datname = 'doomed' AND wait_event = 'PgSleep'}),
	'a handler sleeps for 40 s');
my ($ret, $out, $err) = $node->psql('postgres', 'DROP DATABASE doomed WITH (FORCE)');
is($ret, 0, 'DROP DATABASE ... WITH (FORCE) ends its inbox worker and succeeds') or diag($err);

# A fast shutdown while a handler catches every cancel.
my $app_pid = $node->safe_psql('app', $worker_pid_query);
enqueue($topic_a, 'catch');
ok(in_catching_call(), 'a handler catching every cancel runs again');
my $stopped = run_log(['pg_ctl', '-D', $node->data_dir, '-m', 'fast', '-t', '30', 'stop']);
ok($stopped, 'pg_ctl stop -m fast ends it and the server stops');
$node->_update_pid(0) if $stopped;
$node->start;
$node->safe_psql('app', 'UPDATE mode SET catching = false');
ok(wait_for_query($node, "SELECT count(*) FROM seen WHERE key = 'catch'", '2', 60, 'app'),
	'after the restart, the message is applied, once');

done_testing();

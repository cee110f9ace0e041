# The workers' own sessions hold against what a database's owner and the
# disk do to them:
#
# 1. The owner of database app sets, for app, role = 'dbowner',
#    default_transaction_read_only = on and default_transaction_isolation
#    = serializable, and a superuser session_replication_role = replica for
#    every role in app.  The publisher and the inbox worker, started again,
#    ignore them as they ignore search_path: a message enqueued in app is
#    published, and applied by app's subscription, and no worker exits
#    with an error.
# 2. A segment's file cannot grow (the postmaster's children get a file
#    size limit at its size: "could not extend file", the error a full disk
#    gives, with EFBIG for ENOSPC), and the publisher must write a row
#    version into a new page of it to mark a message sent
#    (outbox.sent_retention).  The
#    publisher fails at each start: outbox_worker.last_error says why, and
#    the launcher starts the next after 1, 2, 4, 8 s, not once a second.
#    Once the file may grow again, the message is marked sent.
# 3. template1 has the extension, outbox.max_workers is 2, and three idle
#    databases made from template1 take the workers before a real one:
#    the two left unserved are listed by name in outbox_launcher.waiting,
#    the launcher's log names them, and an enqueue in one is warned of.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

# 1. Database and role settings.
my $node = outbox_node('session', no_extension => 1);
my $topic = unique_topic('session.app');
kafka_admin('create-topic', $topic);
$node->safe_psql('postgres', q{
	CREATE ROLE dbowner LOGIN;
	CREATE ROLE svc;
	CREATE DATABASE app OWNER dbowner;
});
$node->safe_psql('app', qq{
	CREATE EXTENSION outbox;
	CREATE TABLE applied (message_id uuid, payload text);
	GRANT INSERT ON applied TO svc;
	CREATE FUNCTION apply(m inbox_message) RETURNS void LANGUAGE sql
	    AS \$\$ INSERT INTO applied VALUES (m.message_id, (m).payload_text) \$\$;
	GRANT EXECUTE ON FUNCTION apply(inbox_message) TO svc;
	SELECT outbox_grant_topic('svc', '$topic', 'subscribe');
	SELECT inbox_subscribe('app', ARRAY['$topic'], 'apply(inbox_message)', run_as => 'svc');
});
ok(wait_for_query($node, "SELECT count(*) FROM pg_stat_activity WHERE datname = 'app' AND backend_type IN ('outbox worker', 'outbox inbox')",
		'2', 30),
	'app has its publisher and its inbox worker');

$node->safe_psql('app', q{
	SET ROLE dbowner;
	ALTER DATABASE app SET role = 'dbowner';
	ALTER DATABASE app SET default_transaction_read_only = on;
	ALTER DATABASE app SET default_transaction_isolation = 'serializable';
});
$node->safe_psql('postgres', 'ALTER ROLE ALL IN DATABASE app SET session_replication_role = replica');
$node->safe_psql('postgres', q{
	SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	 WHERE datname = 'app' AND backend_type IN ('outbox worker', 'outbox inbox')});
ok(wait_for_query($node, "SELECT count(*) FROM pg_stat_activity WHERE datname = 'app' AND backend_type IN ('outbox worker', 'outbox inbox')",
		'2', 30),
	'both start again, under the database\'s and the role\'s settings');

# This session undoes them for itself.
my $undo = 'SET ROLE NONE; SET default_transaction_read_only = off; SET session_replication_role = origin;';
$node->safe_psql('app', "$undo SELECT outbox_enqueue('$topic', 'after the settings'::text)");
ok(wait_for_query($node, "$undo SELECT count(*) FROM outbox_message", '0', 30, 'app'),
	'a message enqueued in app is published');
ok(wait_for_query($node, "$undo SELECT payload FROM applied", 'after the settings', 30, 'app'),
	'and applied by app\'s inbox');
is($node->safe_psql('postgres', q{
	SELECT string_agg(DISTINCT usename, ',') FROM pg_stat_activity
	 WHERE datname = 'app' AND backend_type IN ('outbox worker', 'outbox inbox')}),
	$node->safe_psql('postgres', 'SELECT rolname FROM pg_roles WHERE oid = 10'),
	'the workers are still the bootstrap superuser');
is(worker_exits($node), 0, 'no worker exited with an error');
$node->stop;

# 2. A segment that cannot grow.  A message is published; with
# outbox.sent_retention the publisher marks it sent, an UPDATE whose row
# version needs a page of its own: its payload is stored plain, 4,500
# bytes, and the segments keep half of each page free (fillfactor 50).
my $sent_topic = unique_topic('session.full');
kafka_admin('create-topic', $sent_topic);
my $full = outbox_node('diskfull', conf => "outbox.sent_retention = '1h'");
$full->safe_psql('postgres', q{
	ALTER TABLE outbox_message ALTER COLUMN payload SET STORAGE PLAIN;
	DO $$
	DECLARE
	    segment regclass;
	BEGIN
	    FOR segment IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'outbox_message'::regclass LOOP
	        EXECUTE format('ALTER TABLE %s SET (fillfactor = 50)', segment);
	    END LOOP;
	END $$;
});
$full->safe_psql('postgres', qq{
	BEGIN;
	SELECT count(outbox_enqueue('filler', 'f'::text, deliver_after => '1 day')) FROM generate_series(1, 90000);
	SELECT outbox_enqueue('$sent_topic', repeat('m', 4500)::text, deliver_after => '10 s');
	COMMIT;
});
my $segment = $full->safe_psql('postgres', "SELECT tableoid::regclass FROM outbox_message WHERE topic = '$sent_topic'");
# Larger than a WAL segment, which a worker may create whole.
my $file_size = $full->safe_psql('postgres', "SELECT pg_relation_size('$segment')");
cmp_ok($file_size, '>', 17 * 1024 * 1024, 'the segment\'s file is larger than a WAL segment');
my ($postmaster) = split /\n/, slurp_file($full->data_dir . '/postmaster.pid');
system('prlimit', '--pid', $postmaster, "--fsize=$file_size:unlimited") == 0
  or die 'prlimit failed';
my $offset = -s $full->logfile;
$full->safe_psql('postgres', "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'outbox worker'");

ok(wait_for_query($full, "SELECT last_error LIKE 'could not extend file%' FROM outbox_worker", 't', 60),
	'the publisher cannot mark the message sent, and outbox_worker.last_error says why')
  or diag($full->safe_psql('postgres', 'SELECT * FROM outbox_worker'));
ok(defined(eval {
			$full->wait_for_log(qr/the worker of database "postgres" ended with an error \(4 in a row\); the next starts in 8 s/, $offset) }),
	'after the fourth error in a row the next publisher starts in 8 s');
my @pauses = slurp_file($full->logfile, $offset) =~ /ended with an error \(\d+ in a row\); the next starts in (\d+) s/g;
is(join(',', @pauses[0 .. 3]), '1,2,4,8', 'the pauses double: 1, 2, 4, 8 s');

system('prlimit', '--pid', $postmaster, '--fsize=unlimited') == 0 or die 'prlimit failed';
ok(wait_for_query($full, "SELECT state FROM outbox_message WHERE topic = '$sent_topic'", 'sent', 90),
	'once the file may grow, the next publisher marks the message sent');
$full->stop;

# 3. More databases than workers.
my $many = outbox_node('many', no_extension => 1, conf => 'outbox.max_workers = 2');
$many->safe_psql('template1', 'CREATE EXTENSION outbox');
$many->safe_psql('postgres', "CREATE DATABASE idle_$_") for 1 .. 3;
ok(wait_for_query($many, 'SELECT workers, databases_waiting FROM outbox_launcher', '2|1', 30, 'idle_1'),
	'three databases from template1: two served, one waiting');
$many->safe_psql('postgres', 'CREATE DATABASE shop');
ok(wait_for_query($many, 'SELECT databases_waiting FROM outbox_launcher', '2', 30, 'idle_1'),
	'a real database made after them waits too');
my @unserved = split /\n/, $many->safe_psql('idle_1',
	'SELECT d FROM outbox_launcher, unnest(waiting) d ORDER BY d');
my @served = split /\n/, $many->safe_psql('idle_1', 'SELECT database FROM outbox_worker ORDER BY database');
is(join(',', sort(@unserved, @served)), 'idle_1,idle_2,idle_3,shop', 'each database is either served or listed by name as waiting');
ok((grep { $_ eq 'shop' } @unserved), 'shop is listed as waiting');
like(slurp_file($many->logfile), qr/database "shop" waits for a worker: the 2 of outbox.max_workers serve other databases/,
	'the launcher\'s log names it');
my ($ret, $out, $err) = $many->psql('shop', "SELECT outbox_enqueue('shop.orders', 'x'::text)");
like($err, qr/WARNING:  outbox: no worker publishes the messages of database "shop"/, 'an enqueue in it is warned of');
$many->stop;

done_testing();

# Fault suite: DROP EXTENSION and CREATE EXTENSION while the worker runs
# under load; the deprecated outbox.database naming a database that is
# created later.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $node = outbox_node('extension', conf => "outbox.poll_interval = '1s'");

# The first topic's backlog is what DROP EXTENSION throws away, by the
# user's choice; the load on the second spans the drop and the re-creation,
# and every message it commits after the re-creation must arrive.
my $scenario = 'DROP/CREATE EXTENSION while publishing';
my ($dropped_topic, $topic) = (unique_topic('fault.drop'), unique_topic('fault.recreate'));
$node->safe_psql('postgres',
	"SELECT count(outbox_enqueue('$dropped_topic', 'x'::text, 'k' || i % 10)) FROM generate_series(1, 20000) i");
my $load = start_load($node, topics => [$topic], duration => 20);
ok(wait_for_query($node, "SELECT state FROM outbox_worker", 'publishing', 30),
	"$scenario: the worker is publishing");
$node->safe_psql('postgres', 'DROP EXTENSION outbox');
ok(publishers_gone($node),
	"$scenario: the worker leaves once the extension is gone");
# Messages committed before the drop may or may not have been published
# before their table went: they are excused from the check, neither lost nor
# phantom.  No session can commit a message between these statements: the
# function does not exist for them until this transaction commits.
my $excused;
my $drain_s = backlog_drain_time($node, sub {
	$excused = $node->safe_psql('postgres', qq{
		BEGIN;
		CREATE EXTENSION outbox;
		DELETE FROM fault_log RETURNING message_id;
		COMMIT;
	});
});
finish_load($load);
fault_check($node, scenario => $scenario, topics => [$topic], drain_s => $drain_s,
	excused => { map { ($_ => 1) } split /\n/, $excused });

# While Kafka is out of reach no turn runs, but DROP EXTENSION still ends
# the worker.
$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.brokers = '127.0.0.1:1'; SELECT pg_reload_conf()");
ok(wait_for_query($node, 'SELECT state FROM outbox_worker', 'waiting for brokers', 30),
	"$scenario: the worker waits for brokers it cannot reach");
$node->safe_psql('postgres', 'DROP EXTENSION outbox');
ok(publishers_gone($node),
	"$scenario: DROP EXTENSION ends the worker all the same");
$node->stop('fast');
is(worker_exits($node), 0, "$scenario: the worker never crashed");

# The deprecated outbox.database, which still works as an allow-list of
# one, names a database that does not exist when the server starts.
$scenario = 'outbox.database created after start';
my $late = outbox_node('late_database',
	conf => "outbox.database = 'shop'\noutbox.poll_interval = '1s'");
my ($ret, $out, $err) = $late->psql('postgres', "SELECT outbox_enqueue('unserved', 'x'::text)");
like($err, qr/WARNING:  outbox: no worker publishes the messages of database "postgres"\nDETAIL:  outbox.database does not list it.\nHINT:  outbox.database is deprecated: set outbox.databases to the databases to publish, "postgres" among them, or leave both empty to publish every database, and reload the configuration./,
	"$scenario: an enqueue where outbox.database does not point says so");
$late->safe_psql('postgres', 'CREATE DATABASE shop');
$late->safe_psql('shop', 'CREATE EXTENSION outbox');
ok($late->poll_query_until('shop', 'SELECT database, state FROM outbox_worker', 'shop|idle'),
	"$scenario: a worker serves it once it exists, and no other database");
my @topics = (unique_topic('fault.latedb'), unique_topic('fault.latedb'));
$load = start_load($late, db => 'shop', topics => \@topics, duration => 10);
finish_load($load);
fault_check($late, db => 'shop', scenario => $scenario, topics => \@topics);
$late->stop('fast');
is(worker_exits($late), 0, "$scenario: no worker failed while waiting");
done_testing();

# Fault suite: the brokers are unreachable when the server starts; a SIGHUP
# points the worker at a wrong address and back, under load.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

# Brokers unreachable at server start.
my $scenario = 'brokers unreachable at server start';
my @topics = (unique_topic('fault.start'), unique_topic('fault.start'));
broker_ctl('stop');
my $node = outbox_node('config');
my $load = start_load($node, topics => \@topics, duration => 25);
ok(wait_for_query($node, 'SELECT state, brokers_reachable FROM outbox_worker', "waiting for brokers|f", 30),
	"$scenario: the worker says it waits for brokers");
sleep(10);
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox_message WHERE attempts > 0 OR state <> \'pending\''),
	'0', "$scenario: no attempt is spent while waiting");
my $drain_s = backlog_drain_time($node, sub { broker_ctl('start') });
finish_load($load);
fault_check($node, scenario => $scenario, topics => \@topics, drain_s => $drain_s);

# SIGHUP to a wrong address and back, under load.
$scenario = 'SIGHUP: brokers wrong, then right';
@topics = (unique_topic('fault.hup'), unique_topic('fault.hup'));
kafka_admin('create-topic', $_, '--partitions', 3) for @topics;
$load = start_load($node, topics => \@topics, duration => 25);
sleep(3);
$node->append_conf('postgresql.conf', "outbox.brokers = '127.0.0.1:1'");
$node->reload;
ok(wait_for_query($node, 'SELECT state, brokers FROM outbox_worker', 'waiting for brokers|127.0.0.1:1', 30),
	"$scenario: the worker follows the wrong address and waits");
sleep(10);
$drain_s = backlog_drain_time($node, sub {
	$node->append_conf('postgresql.conf', "outbox.brokers = '" . brokers() . "'");
	$node->reload;
});
finish_load($load);
fault_check($node, scenario => $scenario, topics => \@topics, drain_s => $drain_s);

$node->stop('fast');
is(worker_exits($node), 0, 'the worker never crashed');
done_testing();

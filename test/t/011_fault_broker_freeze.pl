# Fault suite: the broker freezes (SIGSTOP) for 30 s under load, so requests
# time out mid-batch, some possibly persisted; then it resumes (SIGCONT).
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $node = outbox_node('broker_freeze');
my $scenario = 'broker frozen (SIGSTOP) 30 s';
my @topics = (unique_topic('fault.freeze'), unique_topic('fault.freeze'));
kafka_admin('create-topic', $_, '--partitions', 3) for @topics;

my $broker_pid = slurp_file("$ENV{KAFKA_DIR}/broker.pid");
chomp $broker_pid;

my $load = start_load($node, topics => \@topics, duration => 45);
sleep(5);
kill 'STOP', $broker_pid or die "cannot stop the broker: $!";
sleep(30);
my $drain_s = backlog_drain_time($node,
	sub { kill 'CONT', $broker_pid or die "cannot resume the broker: $!" });
finish_load($load);
fault_check($node, scenario => $scenario, topics => \@topics, drain_s => $drain_s);

$node->stop('fast');
is(worker_exits($node), 0, 'the worker never crashed');
done_testing();

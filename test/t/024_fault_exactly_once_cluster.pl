# Fault suite, exactly-once (outbox.delivery = exactly_once) on the
# three-node cluster (test/kafka/cluster.sh), topics of 3 partitions with 3
# replicas and min.insync.replicas=2, the transaction state log and the
# progress topic replicated on all three: the publisher is paused at each
# point of a batch (outbox_simulate_pause(), as in 023) and there the node
# that coordinates its transactions (the leader of __transaction_state's
# one partition) is killed with SIGKILL; the publisher goes on at once, and
# commits transactions with the other two, one of which takes the
# coordinator's partition over; the node comes back 20 s later.  A
# read_committed consumer then finds every committed message once:
# duplicates 0, lost 0, phantom 0, order faults 0.  With OUTBOX_SLOW_TESTS=1, 023's rows are repeated on the
# cluster too (the worker's, its Kafka process's and PostgreSQL's crashes
# at each point).  The test starts the cluster itself, as 020 does.
use strict;
use warnings;

use List::Util qw(max);
use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $test_started = time();
my $test_pid = $$;

# How long the coordinator's node stays down.
my $down_s = 20;

$ENV{KAFKA_CLUSTER_DIR} = "$PostgreSQL::Test::Utils::tmp_check/kafka_cluster_eos";
END
{
	local $?;
	eval { cluster_ctl('stop') } if $$ == $test_pid;
}
cluster_ctl('start');
$OutboxTest::brokers = cluster_ctl('brokers');
my $node = outbox_node('exactly_once_cluster',
	conf => "restart_after_crash = on\noutbox.delivery = 'exactly_once'");

# The node leading __transaction_state's partition: every transaction's
# coordinator, the transaction state log having one partition here.
sub coordinator
{
	my ($line) = grep { /^__transaction_state 0 / }
	  split /\n/, kafka_admin('leaders', '__transaction_state');
	my ($leader) = (split / /, $line // '')[2];
	die 'the transaction state log has no leader' unless defined $leader && $leader > 0;
	return $leader;
}

# The coordinator's node killed, the publisher let go at once: another
# node takes the transaction state log over, and the publisher commits
# transactions with it before the node comes back.
my $crashes = exactly_once_crashes($node, kill_broker => sub {
	my ($resume) = @_;
	my $coordinator = coordinator();
	my $published = $node->safe_psql('postgres', 'SELECT published FROM outbox_worker');
	my $killed_at = time();
	cluster_ctl('kill', $coordinator);
	$resume->();
	my $now = $coordinator;
	while (time() - $killed_at < $down_s && $now == $coordinator)
	{
		sleep(0.5);
		$now = eval { coordinator() } // $coordinator;	# none while one is elected
	}
	isnt($now, $coordinator, "coordinator SIGKILL: node $now coordinates the transactions instead");
	ok(wait_for_query($node, "SELECT published > $published + 100 FROM outbox_worker", 't',
			max(1, $down_s - (time() - $killed_at))),
		"coordinator SIGKILL: the publisher commits transactions while node $coordinator is down");
	sleep($down_s - (time() - $killed_at)) if time() - $killed_at < $down_s;
	cluster_ctl('start', $coordinator);
});

my @topic_options = ('--partitions', 3, '--replication-factor', 3,
	'--config', 'min.insync.replicas=2');
my @crashes = ('broker SIGKILL');
push @crashes, 'worker SIGKILL', 'Kafka process SIGKILL', 'pg_ctl stop -m immediate'
  if slow_tests("023's crashes on the cluster");
my $workers_killed = 0;
for my $point ('before_kafka_commit', 'after_kafka_commit', 'after_recorded')
{
	for my $crash (@crashes)
	{
		$workers_killed++ if $crash eq 'worker SIGKILL';
		my $name = $crash eq 'broker SIGKILL' ? 'coordinator SIGKILL' : $crash;
		exactly_once_row($node, scenario => "exactly-once cluster: $name, $point",
			point => $point, crash => $crash, crashes => $crashes,
			topic_options => \@topic_options);
	}
}

$node->stop('fast');
is(worker_exits($node), $workers_killed, 'the worker exited only where it was killed');
diag(sprintf('wall time of the test: %.1f s', time() - $test_started));
done_testing();

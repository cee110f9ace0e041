# Fault suite on a production topology: a cluster of three Kafka nodes
# (test/kafka/cluster.sh, each broker and controller), topics of 3
# partitions with 3 replicas and min.insync.replicas=2, under the steady load
# of 8 sessions.  Four scenarios, each on topics of its own:
#
#   1. SIGKILL of the node leading most of the topics' partitions, back
#      after 30 s; the other two take over its partitions meanwhile.
#   2. A rolling restart: each node in turn stopped (controlled shutdown)
#      and started again, the next only once every partition has its three
#      replicas in sync again (with OUTBOX_SLOW_TESTS=1 only: a minute).
#   3. SIGSTOP of the leading node for 20 s (alive, its connections open,
#      but silent), then SIGCONT.
#   4. Two nodes stopped for 20 s (longer, until the one left has refused a
#      write): one replica left, below
#      min.insync.replicas, so Kafka refuses the writes (NOT_ENOUGH_REPLICAS)
#      and the quorum of controllers is gone too.  Messages wait: no attempt
#      is counted, none is dead-lettered, and all are delivered once the
#      nodes are back.
#
# Besides nothing lost, nothing phantom and per-key order, nothing may be
# published twice: no scenario crashes anything, and the idempotent producer
# (acks=all) must absorb the leader changes.  The test starts the cluster
# itself, on KAFKA_PORT + 400 to + 405, in tmp_check/kafka_cluster, and stops
# it at the end.
use strict;
use warnings;

use List::Util qw(max);
use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $test_started = time();
my $test_pid = $$;

# A cluster of this run's own, its data and logs kept with the test's.
$ENV{KAFKA_CLUSTER_DIR} = "$PostgreSQL::Test::Utils::tmp_check/kafka_cluster";

# Stopped however the test ends (but not by a process IPC::Run forked).
END
{
	local $?;
	eval { cluster_ctl('stop') } if $$ == $test_pid;
}
cluster_ctl('start');
$OutboxTest::brokers = cluster_ctl('brokers');
my $node = outbox_node('kafka_cluster');
note(sprintf('cluster and server up after %.1f s', time() - $test_started));

# Every partition of the topics: [topic, partition, leader, [in-sync replicas]].
sub partitions
{
	my (@topics) = @_;
	return [
		map {
			my ($topic, $partition, $leader, $isr) = split / /;
			[ $topic, $partition, $leader, [ split /,/, $isr // '' ] ]
		} split /\n/, kafka_admin('leaders', @topics) ];
}

# The node leading most of the topics' partitions.
sub busiest_leader
{
	my (@topics) = @_;
	my %led;
	$led{ $_->[2] }++ for @{ partitions(@topics) };
	my ($leader) = sort { $led{$b} <=> $led{$a} || $a <=> $b } grep { $_ > 0 } keys %led;
	die 'no partition has a leader' unless defined $leader;
	return $leader;
}

# Wait until every partition of the topics has a leader and all three
# replicas in sync; true if they did within $timeout seconds.
sub wait_in_sync
{
	my ($timeout, @topics) = @_;
	my $deadline = time() + $timeout;
	while (time() < $deadline)
	{
		# the node answering may be the one just restarted, not yet caught up
		my $partitions = eval { partitions(@topics) } // [];
		return 1 if @$partitions && !grep { $_->[2] < 0 || @{ $_->[3] } < 3 } @$partitions;
		sleep(0.2);
	}
	return 0;
}

sub new_topics
{
	my ($prefix) = @_;
	my @topics = (unique_topic($prefix), unique_topic($prefix));
	kafka_admin('create-topic', $_, '--partitions', 3, '--replication-factor', 3,
		'--config', 'min.insync.replicas=2')
	  for @topics;
	return @topics;
}

# How many produce requests a node has refused for want of in-sync
# replicas, as its log says.
sub refusals
{
	my ($n) = @_;
	my $log = slurp_file("$ENV{KAFKA_CLUSTER_DIR}/node$n/logs/server.log");
	return scalar(() = $log =~ /NotEnoughReplicasException/g);
}

sub topic_list { return join(',', map { "'$_'" } @_); }

my @wall_times;

# Run a scenario: $fault gets its topics, runs the fault under the load and
# returns the drain time; then the checker, and the wall time noted.
sub scenario
{
	my ($scenario, $load_s, $fault) = @_;
	my $t0 = time();
	my @topics = new_topics('fault.cluster');
	my $load = start_load($node, topics => \@topics, duration => $load_s);
	sleep(5);
	my $drain_s = $fault->(@topics);
	finish_load($load);
	ok(wait_in_sync(60, @topics), "$scenario: every partition's replicas in sync again");
	fault_check($node, scenario => $scenario, topics => \@topics, drain_s => $drain_s,
		crashes => 0);
	push @wall_times, sprintf('%-44s %6.1f s', $scenario, time() - $t0);
}

scenario('cluster: leader SIGKILL, back after 30 s', 45, sub {
	my (@topics) = @_;
	my $leader = busiest_leader(@topics);
	my $killed_at = time();
	cluster_ctl('kill', $leader);
	sleep(25);
	ok(wait_for_query($node,
			"SELECT count(*) FROM outbox_message WHERE state <> 'sent' AND topic IN (" . topic_list(@topics)
			  . ") AND created_at < now() - interval '5 s'",
			'0', max(1, 30 - (time() - $killed_at))),
		"leader SIGKILL: the other nodes take over while node $leader is down");
	sleep(30 - (time() - $killed_at)) if time() - $killed_at < 30;
	return backlog_drain_time($node, sub { cluster_ctl('start', $leader) });
});

scenario('cluster: rolling restart', 50, sub {
	my (@topics) = @_;
	for my $n (1 .. 3)
	{
		cluster_ctl('stop', $n);
		cluster_ctl('start', $n);
		ok(wait_in_sync(60, @topics), "rolling restart: node $n back in sync");
	}
	return backlog_drain_time($node);
}) if slow_tests('the rolling restart');

scenario('cluster: leader frozen (SIGSTOP) 20 s', 35, sub {
	my (@topics) = @_;
	my $leader = busiest_leader(@topics);
	cluster_ctl('freeze', $leader);
	sleep(20);
	return backlog_drain_time($node, sub { cluster_ctl('thaw', $leader) });
});

scenario('cluster: two of three nodes down 20 s', 40, sub {
	my (@topics) = @_;
	my $survivor = busiest_leader(@topics);
	my @down = grep { $_ != $survivor } 1 .. 3;
	my $topics = topic_list(@topics);

	# Stopped one after the other, so that the controllers take each out
	# of the partitions' in-sync replicas: the survivor is left alone in
	# them and refuses writes, rather than waiting for followers that
	# never come.
	my $refusals_before = refusals($survivor);
	my $refusal_deadline_s = 60;
	cluster_ctl('stop', $_) for @down;
	my $down_at = time();
	# Sampled every second of the outage: an attempt counted and then
	# delivered would leave no trace once the nodes are back.  The outage
	# lasts 20 s, and longer until the survivor has refused a write: a
	# produce request that waited in its purgatory for the followers as they
	# left is answered only at its timeout (librdkafka's request.timeout.ms,
	# 30 s), and only then sent again, to be refused.
	my ($waiting, $max_attempts) = (0, 0);
	while (time() - $down_at < 20
		|| (refusals($survivor) == $refusals_before && time() - $down_at < $refusal_deadline_s))
	{
		sleep(1);
		my $attempts;
		($waiting, $attempts) = split /\|/, $node->safe_psql('postgres',
			"SELECT count(*) FILTER (WHERE state <> 'sent'), coalesce(max(attempts), 0) FROM outbox_message WHERE topic IN ($topics)");
		$max_attempts = $attempts if $attempts > $max_attempts;
	}
	diag(sprintf('two nodes down: the outage lasted %.0f s, %d writes refused',
			time() - $down_at, refusals($survivor) - $refusals_before));
	cmp_ok(refusals($survivor), '>', $refusals_before,
		"two nodes down: node $survivor refuses writes (NOT_ENOUGH_REPLICAS)");
	cmp_ok($waiting, '>', 0, 'two nodes down: messages wait at the end of the outage');
	is($max_attempts, 0, 'two nodes down: no attempt is counted while writes are refused');
	my $drain_s = backlog_drain_time($node, sub { cluster_ctl('start', @down) });
	is($node->safe_psql('postgres', "SELECT count(*) FROM outbox_dead_letter WHERE topic IN ($topics)"),
		'0', 'two nodes down: nothing dead-lettered');
	return $drain_s;
});

$node->stop('fast');
is(worker_exits($node), 0, 'the worker never crashed');
diag("wall time: $_") for @wall_times;
diag(sprintf('wall time of the test: %.1f s', time() - $test_started));
done_testing();

# Fault suite, exactly-once (outbox.delivery = exactly_once), one broker:
# under load, the publisher is paused at each point of a batch where a
# crash would publish it twice without transactions (outbox_simulate_pause():
# its messages acknowledged before the Kafka commit; Kafka committed before
# the database recorded it; recorded before the next batch), and there the
# worker is killed with SIGKILL, or its Kafka process is, or PostgreSQL
# stops with "pg_ctl stop -m immediate", or the broker is killed.  A
# read_committed consumer then finds every committed message once, in
# per-key order: lost 0, phantom 0, order faults 0, duplicates 0; what a
# read_uncommitted one sees twice (aborted transactions) is reported.  A
# crash after the Kafka commit leaves a transaction the database did not
# record: the next producer's start finds it in the progress topic and
# records its messages as delivered, which the server's log says.  After
# the worker's SIGKILL there, Apache Kafka's own console consumer
# (read_committed) reads as many records as the checker, none twice.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $node = outbox_node('exactly_once',
	conf => "restart_after_crash = on\noutbox.delivery = 'exactly_once'");

sub worker_pid
{
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox worker'");
}

# Pause the publisher at $point of its next batch; returns once it is there.
sub pause_at
{
	my ($point) = @_;
	$node->safe_psql('postgres', "SELECT outbox_simulate_pause('$point')");
	ok(wait_for_query($node,
			"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox worker'"
			  . " AND query = 'outbox: paused $point'",
			'1', 60),
		"the publisher pauses at $point");
}

sub wait_for_new_worker
{
	my ($old) = @_;
	ok(wait_for_query($node,
			"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox worker' AND pid <> $old",
			'1', 120),
		'a new publisher starts');
}

my %fault = (
	'worker SIGKILL' => sub {
		my $pid = worker_pid();
		kill 'KILL', $pid or die "cannot kill the worker: $!";
		wait_for_new_worker($pid);
	},
	'Kafka process SIGKILL' => sub {
		my $pid = worker_pid();
		my $kafka = `pgrep -P $pid -x outbox_kafka`;
		chomp $kafka;
		ok($kafka =~ /^\d+$/, 'the publisher has a Kafka process') or return;
		kill 'KILL', $kafka or die "cannot kill the Kafka process: $!";
		$node->safe_psql('postgres', "SELECT outbox_simulate_pause('none')");
	},
	'pg_ctl stop -m immediate' => sub {
		$node->stop('immediate');
		$node->start;
	},
	'broker SIGKILL' => sub {
		broker_ctl('kill');
		sleep(2);
		broker_ctl('start');
		$node->safe_psql('postgres', "SELECT outbox_simulate_pause('none')");
	},
);

my $recovered = 0;
for my $point ('before_kafka_commit', 'after_kafka_commit', 'after_recorded')
{
	for my $fault ('worker SIGKILL', 'Kafka process SIGKILL', 'pg_ctl stop -m immediate',
		'broker SIGKILL')
	{
		next if $fault eq 'broker SIGKILL' && $point eq 'after_recorded';
		my $scenario = "exactly-once: $fault, $point";
		my @topics = (unique_topic('fault.eos'));
		kafka_admin('create-topic', $_, '--partitions', 3) for @topics;

		my $log_offset = -s $node->logfile;
		my $load = start_load($node, topics => \@topics, duration => 12);
		sleep(2);
		pause_at($point);
		my $drain_s = backlog_drain_time($node, $fault{$fault});
		finish_load($load);
		fault_check($node, scenario => $scenario, topics => \@topics, drain_s => $drain_s,
			crashes => 1, exactly_once => 1,
			console_consumer => $fault eq 'worker SIGKILL' && $point eq 'after_kafka_commit');
		$recovered++
		  if slurp_file($node->logfile, $log_offset) =~
		  /committed before the publisher restarted are recorded as delivered/;
	}
}

# A worker or Kafka process killed after the Kafka commit, or a server
# stopped then, leaves a transaction for the next start to settle.
cmp_ok($recovered, '>=', 2, 'the next start recorded what Kafka had committed');

$node->stop('fast');
done_testing();

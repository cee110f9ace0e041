# Fault suite: the worker is killed with SIGKILL in the middle of a batch
# (PostgreSQL restarts the cluster), and PostgreSQL stops with
# "pg_ctl stop -m immediate" in the middle of a batch, under load.  At most
# one batch is published twice per crash; nothing is lost.  A clean stop
# ("pg_ctl stop -m fast") mid-batch is no crash: the worker lets Kafka
# acknowledge the batch in flight and records it, so nothing is published
# twice.  The worker's commits do not wait for their WAL flush, but it
# produces no batch before its last commit is flushed: the immediate stop
# in the middle of a drain with nothing else committing (no application
# commit flushes the worker's, and the WAL writer only every 10 s) still
# publishes at most one batch twice.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

# The test framework turns crash restarts off; a production server has them on.
my $node = outbox_node('crash', conf => "restart_after_crash = on\nwal_writer_delay = '10s'");

sub wait_until_publishing
{
	my ($topic) = @_;
	ok(wait_for_query($node,
			"SELECT state = 'publishing' AND (SELECT count(*) FROM outbox_message WHERE topic = '$topic') < 20000 FROM outbox_worker",
			't', 60),
		'the worker is in the middle of the backlog');
}

for my $crash ('worker SIGKILL mid-batch', 'pg_ctl stop -m immediate mid-batch',
	'pg_ctl stop -m fast mid-batch', 'immediate stop mid-drain, no other commit')
{
	my @topics = (unique_topic('fault.crash'), unique_topic('fault.crash'));
	kafka_admin('create-topic', $_, '--partitions', 3) for @topics;

	my $load;
	$load = start_load($node, topics => [ @topics[0 .. 0] ], duration => 25)
	  unless $crash =~ /no other commit/;
	$node->safe_psql('postgres',
		'CREATE TABLE IF NOT EXISTS fault_log (id bigint, message_id uuid, topic text, key text)');
	sleep(3) if $load;
	enqueue_backlog($node, $topics[1], 20000);
	wait_until_publishing($topics[1]);

	my $drain_s = backlog_drain_time($node, sub {
		if ($crash =~ /SIGKILL/)
		{
			my $pid = $node->safe_psql('postgres', 'SELECT pid FROM outbox_worker');
			kill 'KILL', $pid or die "cannot kill the worker: $!";
			ok(wait_for_query($node,
					"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox worker' AND pid <> $pid",
					'1', 120),
				"$crash: the cluster restarts with a new worker");
		}
		else
		{
			$node->stop($crash =~ /fast/ ? 'fast' : 'immediate');
			$node->start;
		}
	});
	finish_load($load) if $load;
	fault_check($node, scenario => $crash, topics => \@topics, drain_s => $drain_s,
		crashes => $crash =~ /fast/ ? 0 : 1);
}

$node->stop('fast');
done_testing();

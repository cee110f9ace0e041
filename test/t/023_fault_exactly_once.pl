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

my $node = outbox_node('exactly_once',
	conf => "restart_after_crash = on\noutbox.delivery = 'exactly_once'");
my $crashes = exactly_once_crashes($node);

my $recovered = 0;
for my $point ('before_kafka_commit', 'after_kafka_commit', 'after_recorded')
{
	for my $crash ('worker SIGKILL', 'Kafka process SIGKILL', 'pg_ctl stop -m immediate',
		'broker SIGKILL')
	{
		next if $crash eq 'broker SIGKILL' && $point eq 'after_recorded';
		$recovered += exactly_once_row($node, scenario => "exactly-once: $crash, $point",
			point => $point, crash => $crash, crashes => $crashes,
			console_consumer => $crash eq 'worker SIGKILL' && $point eq 'after_kafka_commit');
	}
}

# A worker or Kafka process killed after the Kafka commit, or a server
# stopped then, leaves a transaction for the next start to settle.
cmp_ok($recovered, '>=', 2, 'the next start recorded what Kafka had committed');

$node->stop('fast');
done_testing();

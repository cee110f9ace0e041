# Fault suite: the producer fails fatally in the middle of a batch (as
# librdkafka 2.0.2 can after a timeout, with a false OUT_OF_ORDER_SEQUENCE);
# the worker destroys it, makes a new one, and nothing is lost.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $node = outbox_node('fatal');
my $scenario = 'fatal producer error, 3 times';
my @topics = (unique_topic('fault.fatal'), unique_topic('fault.fatal'));
kafka_admin('create-topic', $_, '--partitions', 3) for @topics;

my $load = start_load($node, topics => \@topics, duration => 20);
for my $round (1 .. 3)
{
	sleep(4);
	my $offset = -s $node->logfile;
	$node->safe_psql('postgres', 'SELECT outbox_simulate_fatal_error()');
	ok(defined(eval { $node->wait_for_log(qr/fatal producer error, rebuilding the producer/, $offset) }),
		"fatal error $round is seen by the worker");
	# The error shows until the new producer's brokers answer, then goes:
	# it is mended.
	ok(wait_for_query($node, "SELECT coalesce(last_error, 'none'), state <> 'waiting for brokers' FROM outbox_worker",
			'none|t', 30),
		"fatal error $round: once the producer is made again, outbox_worker shows no error")
	  or diag($node->safe_psql('postgres', 'SELECT * FROM outbox_worker'));
}
my $drain_s = backlog_drain_time($node);
finish_load($load);
fault_check($node, scenario => $scenario, topics => \@topics, drain_s => $drain_s, crashes => 3);
like(slurp_file($node->logfile), qr/simulated by outbox_simulate_fatal_error/,
	'the fatal error is in the server log');

$node->stop('fast');
is(worker_exits($node), 0, 'the worker rebuilt its producer without exiting');
done_testing();

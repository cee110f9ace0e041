# pg_terminate_backend() of the worker: it must come back, as autovacuum
# does, and publish what waited; a clean stop of the server still ends it
# for good, with exit code 0.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = outbox_node('terminated');
ok(wait_for_query($node, "SELECT state FROM outbox_worker", 'idle', 60), 'the worker is idle');
my $pid = $node->safe_psql('postgres', 'SELECT pid FROM outbox_worker');

my $topic = unique_topic('terminated');
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
$node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'after the termination'::text)");
ok(wait_for_query($node, "SELECT pid IS NOT NULL AND pid <> $pid FROM outbox_worker", 't', 30),
	'a new worker takes over after pg_terminate_backend');
my $records = consume_topics(topics => [$topic], expect => 1, timeout => 60);
is(join(',', map { $_->{value} } @$records), 'after the termination',
	'the message enqueued meanwhile is published');

$node->stop('fast');
is(worker_exits($node), 1,
	'the worker exited once to be started again, and ended with code 0 at the stop');
like(slurp_file($node->logfile), qr/"outbox worker" \(PID $pid\) exited with exit code 1/,
	'the exit to be started again was the terminated worker\'s');
done_testing();

# pg_terminate_backend() of the worker: the launcher must start another, as
# the postmaster does autovacuum, and it publishes what waited; so must a
# terminated launcher come back, and its workers keep publishing meanwhile.
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

# The launcher terminated: the postmaster starts it again, and the new one
# adopts the running worker instead of starting a second.
$pid = $node->safe_psql('postgres', 'SELECT pid FROM outbox_worker');
my $launcher = $node->safe_psql('postgres', 'SELECT pid FROM outbox_launcher');
$node->safe_psql('postgres', "SELECT pg_terminate_backend($launcher)");
ok(wait_for_query($node, "SELECT pid IS NOT NULL AND pid <> $launcher FROM outbox_launcher", 't', 30),
	'a new launcher takes over after pg_terminate_backend');
$node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'after the launcher''s'::text)");
$records = consume_topics(topics => [$topic], expect => 2, timeout => 60);
is(join(',', map { $_->{value} } @$records), "after the termination,after the launcher's",
	'the worker went on publishing');
is($node->safe_psql('postgres',
		"SELECT pid = $pid, (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox worker')
		   FROM outbox_worker"), 't|1',
	'the new launcher adopted the worker: one worker, the same');

$node->stop('fast');
is(worker_exits($node), 1, 'only the terminated launcher exited with an error, to be started again');
like(slurp_file($node->logfile), qr/"outbox launcher" \(PID $launcher\) exited with exit code 1/,
	'that exit was the terminated launcher\'s');
done_testing();

# Fault suite, with three databases under load at once:
#
# - The worker of one of them is killed with SIGKILL in the middle of a
#   batch.  The postmaster then restarts the whole cluster (PostgreSQL's
#   answer to a crashed background worker), so every database's worker dies
#   with it: all three resume, nothing is lost or phantom or out of order,
#   and each publishes at most one batch twice.
# - DROP DATABASE, without FORCE, of one of them while its worker publishes:
#   it succeeds, and the two others lose nothing and publish nothing twice.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

# The test framework turns crash restarts off; a production server has them on.
my $node = outbox_node('fault_databases', conf => 'restart_after_crash = on');

my $backlog = 20000;

# Wait until the database's worker is in the middle of the topic's backlog.
sub wait_until_mid_backlog
{
	my ($db, $topic, $count, $scenario) = @_;
	ok(wait_for_query($node, qq{
			SELECT state = 'publishing' AND (SELECT count(*) FROM outbox_message WHERE topic = '$topic') < $count
			  FROM outbox_worker WHERE database = current_database()}, 't', 60, $db),
		"$scenario: the worker of $db is in the middle of its backlog");
}

sub worker_pids
{
	return $node->safe_psql('postgres', 'SELECT database, pid FROM outbox_worker ORDER BY database');
}

# Three databases, each with two topics of three partitions, under load.
sub start_loads
{
	my ($scenario, $dbs, %durations) = @_;
	my (%topics, %load);
	for my $db (@$dbs)
	{
		$topics{$db} = [ map { unique_topic("fault.databases.$db") } 1 .. 2 ];
		kafka_admin('create-topic', $_, '--partitions', 3) for @{ $topics{$db} };
	}
	%load = map { ($_ => start_load($node, db => $_, topics => [ $topics{$_}[0] ],
				clients => 4, rate => 100, duration => $durations{$_} // 25)) } @$dbs;
	ok(wait_for_query($node, qq{
			SELECT count(*) FROM outbox_worker
			 WHERE database IN (@{[ join(',', map { "'$_'" } @$dbs) ]}) AND published > 0},
			scalar(@$dbs), 60),
		"$scenario: the worker of each database publishes its load");
	return (\%topics, \%load);
}

for my $db (qw(shop billing crm))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION outbox');
}

# 1. SIGKILL of billing's worker mid-batch.
my $scenario = 'worker SIGKILL in 1 of 3 databases';
my @dbs = qw(shop billing crm);
my ($topics, $load) = start_loads($scenario, \@dbs);
enqueue_backlog($node, $topics->{billing}[1], $backlog, 'billing');
wait_until_mid_backlog('billing', $topics->{billing}[1], $backlog, $scenario);
my $before = worker_pids();
my $pid = $node->safe_psql('postgres', "SELECT pid FROM outbox_worker WHERE database = 'billing'");
my $old_pids = join(',', map { (split /\|/)[1] } split /\n/, $before);
my $drain_s = backlog_drain_time($node, sub {
	kill 'KILL', $pid or die "cannot kill the worker: $!";
	ok(wait_for_query($node, qq{
			SELECT string_agg(database, ',' ORDER BY database) FROM outbox_worker
			 WHERE pid IS NOT NULL AND pid NOT IN ($old_pids)},
			'billing,crm,postgres,shop', 120),
		"$scenario: the cluster restarts, and every database has a new worker");
}, 'billing');
finish_load($load->{$_}) for @dbs;
like(slurp_file($node->logfile), qr/background worker "outbox worker" \(PID $pid\) was terminated by signal 9/,
	"$scenario: it was billing's worker that was killed");
for my $db (@dbs)
{
	fault_check($node, db => $db, scenario => "$scenario: $db", topics => $topics->{$db},
		$db eq 'billing' ? (drain_s => $drain_s) : (), crashes => 1);
}

# 2. DROP DATABASE, no FORCE, of crm while its worker publishes a backlog,
# the two others under load.  crm's own load ends first: its sessions
# would keep DROP DATABASE out, as any session in the database does.
# Small batches make the backlog last seconds, not the half second a
# fast machine takes to publish it, so that the DROP finds the worker in its
# middle.
$scenario = 'DROP DATABASE under load';
($topics, $load) = start_loads($scenario, \@dbs, crm => 5);
finish_load($load->{crm});
$node->safe_psql('postgres', 'ALTER SYSTEM SET outbox.batch_size = 10; SELECT pg_reload_conf()');
enqueue_backlog($node, $topics->{crm}[1], $backlog, 'crm');
wait_until_mid_backlog('crm', $topics->{crm}[1], $backlog, $scenario);
$before = $node->safe_psql('postgres',
	"SELECT database, pid FROM outbox_worker WHERE database IN ('shop', 'billing') ORDER BY database");
my ($ret, $out, $err) = $node->psql('postgres', 'DROP DATABASE crm');
is($ret, 0, "$scenario: DROP DATABASE succeeds without FORCE while the worker publishes");
unlike($err, qr/being accessed by other users/, "$scenario: no \"being accessed by other users\"");
ok(wait_for_query($node, 'SELECT string_agg(database, \',\' ORDER BY database) FROM outbox_worker',
		'billing,postgres,shop', 30),
	"$scenario: its worker is gone, the others stay");
is($node->safe_psql('postgres',
		"SELECT database, pid FROM outbox_worker WHERE database IN ('shop', 'billing') ORDER BY database"),
	$before, "$scenario: the workers of the other databases were not disturbed");
$node->safe_psql('postgres', 'ALTER SYSTEM RESET outbox.batch_size; SELECT pg_reload_conf()');
finish_load($load->{$_}) for qw(shop billing);
fault_check($node, db => $_, scenario => "$scenario: $_", topics => $topics->{$_}) for qw(shop billing);

$node->stop('fast');
is(worker_exits($node), 1, 'only the killed worker exited abnormally');
done_testing();

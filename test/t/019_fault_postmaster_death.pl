# Fault suite: the server is stopped, or its postmaster killed with SIGKILL,
# while the worker waits for Kafka's reports on a batch that a frozen broker
# (SIGSTOP) will not acknowledge.  No wait of the worker may ignore a
# shutdown or the postmaster's death:
# - pg_ctl stop -m fast returns within the shutdown grace the README
#   documents (2 s for the batch Kafka has in hand) and a little more;
# - after a SIGKILL of the postmaster, the worker and its Kafka process
#   must be gone within a second;
# and the cluster must start again cleanly and deliver every committed
# message once the broker resumes.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

# How soon the worker and its Kafka process must have gone.
my $exit_deadline_s = 1;
# The grace a batch in flight gets at shutdown (SHUTDOWN_GRACE_MS, README's
# "Running in production"), and what stopping the rest of the server may add.
my $shutdown_grace_s = 2;
my $stop_slack_s = 2;

my $node = outbox_node('postmaster_death');
my $topic = unique_topic('fault.pmdeath');
kafka_admin('create-topic', $topic);
$node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'warm-up'::text)");
ok(wait_for_query($node, 'SELECT count(*) FROM outbox_message', '0', 60),
	'the warm-up message is delivered');

my $broker_pid = slurp_file("$ENV{KAFKA_DIR}/broker.pid");
chomp $broker_pid;
my $frozen = 0;
END { kill 'CONT', $broker_pid if $broker_pid && $frozen; }

# Freeze the broker, commit $count messages numbered from $first, and wait
# until the worker waits for their reports.
sub freeze_and_enqueue
{
	my ($first, $count) = @_;
	kill 'STOP', $broker_pid or die "cannot stop the broker: $!";
	$frozen = 1;
	$node->safe_psql('postgres',
		"SELECT count(outbox_enqueue('$topic', 'message ' || i, 'key-' || i % 10)) FROM generate_series($first, $first + $count - 1) i");
	ok($node->poll_query_until('postgres',
			"SELECT query FROM pg_stat_activity WHERE backend_type = 'outbox worker'",
			'outbox: waiting for Kafka'),
		"messages $first to @{[$first + $count - 1]}: the worker waits for the frozen broker's reports");
}

sub thaw
{
	kill 'CONT', $broker_pid or die "cannot resume the broker: $!";
	$frozen = 0;
}

# A fast shutdown: the batch in flight gets its grace, then the worker leaves
# and the server stops; its rows stay, to be published after the restart.
freeze_and_enqueue(1, 100);
my $t_stop = time();
$node->stop('fast');
my $stop_s = time() - $t_stop;
diag(sprintf('pg_ctl stop -m fast while the broker is frozen: %.1f s (grace %d s)', $stop_s, $shutdown_grace_s));
cmp_ok($stop_s, '<', $shutdown_grace_s + $stop_slack_s,
	"the server stops within the shutdown grace ($shutdown_grace_s s) and ${stop_slack_s} s");
is(worker_exits($node), 0, 'the worker left without an error');
$node->start;
thaw();
ok(wait_for_query($node, 'SELECT count(*) FROM outbox_message', '0', 60),
	'after the restart, the messages of the stopped batch are delivered');

freeze_and_enqueue(101, 100);

# The worker and its child, the Kafka process.
my $worker = $node->safe_psql('postgres', 'SELECT pid FROM outbox_worker');
my ($kafka_process) = grep {
	my $stat = eval { slurp_file("/proc/$_/stat") } // '';
	$stat =~ /^\d+ \(outbox_kafka\) \S (\d+)/ && $1 == $worker
} map { m{/proc/(\d+)$} ? $1 : () } glob('/proc/[0-9]*');
ok($kafka_process, "the worker ($worker) has its Kafka process ($kafka_process)");

my ($postmaster) = slurp_file($node->data_dir . '/postmaster.pid') =~ /^(\d+)/;
# A process that has exited is gone, even while it waits to be reaped (a
# zombie: its parent is dead, and init reaps it when it gets to it).
sub running
{
	my ($pid) = @_;
	my $stat = eval { slurp_file("/proc/$pid/stat") } // '';
	return $stat =~ /^\d+ \(.*\) [^Z]/;
}

my $t0 = time();
kill 'KILL', $postmaster or die "cannot kill the postmaster: $!";
my $gone_s;
while (time() - $t0 < 30)
{
	if (!running($worker) && !running($kafka_process))
	{
		$gone_s = time() - $t0;
		last;
	}
	sleep(0.01);
}
ok(defined $gone_s, 'the worker and its Kafka process exit after the postmaster\'s death');
diag(sprintf('postmaster SIGKILL to the worker and its Kafka process gone: %.0f ms', ($gone_s // 30) * 1000));
cmp_ok($gone_s // 30, '<', $exit_deadline_s, "within $exit_deadline_s s");

# The other processes of the old cluster leave too; then it starts cleanly.
my $started = 0;
for (1 .. 300)
{
	$node->{_pid} = undef;		# the framework's record of the killed postmaster
	last if ($started = $node->start(fail_ok => 1));
	sleep(0.1);
}
ok($started, 'the cluster starts again');
thaw();
ok(wait_for_query($node, 'SELECT count(*) FROM outbox_message', '0', 60),
	'once the broker resumes, the outbox empties');
# A batch withdrawn at the stop, or lost with the killed worker, may have
# reached the frozen broker's socket: it is appended on resume, and sent
# again after the restart (at most one batch per fault).
my $records = consume_topics(topics => [$topic], idle => 3, timeout => 120);
my %copies;
$copies{ $_->{value} }++ for @$records;
is(scalar(grep { $copies{"message $_"} } 1 .. 200), 200,
	'every message committed before the stop and the death is delivered');
my $duplicates = @$records - keys %copies;
cmp_ok($duplicates, '<=', 200, "duplicates ($duplicates) within one batch per fault");
$node->stop('fast');
done_testing();

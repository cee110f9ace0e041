# Fault suite: the postmaster is killed with SIGKILL while the worker waits
# for Kafka's reports on a batch that a frozen broker (SIGSTOP) will not
# acknowledge.  No wait of the worker may ignore the postmaster's death:
# the worker and its Kafka process must be gone within a second, and the
# cluster must start again cleanly and deliver every committed message once
# the broker resumes.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

# How soon the worker and its Kafka process must have gone.
my $exit_deadline_s = 1;

my $node = outbox_node('postmaster_death');
my $topic = unique_topic('fault.pmdeath');
kafka_admin('create-topic', $topic);
$node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'warm-up'::text)");
ok(wait_for_query($node, 'SELECT count(*) FROM outbox_message', '0', 60),
	'the warm-up message is delivered');

# The worker and its child, the Kafka process.
my $worker = $node->safe_psql('postgres', 'SELECT pid FROM outbox_worker');
my ($kafka_process) = grep {
	my $stat = eval { slurp_file("/proc/$_/stat") } // '';
	$stat =~ /^\d+ \(outbox_kafka\) \S (\d+)/ && $1 == $worker
} map { m{/proc/(\d+)$} ? $1 : () } glob('/proc/[0-9]*');
ok($kafka_process, "the worker ($worker) has its Kafka process ($kafka_process)");

my $broker_pid = slurp_file("$ENV{KAFKA_DIR}/broker.pid");
chomp $broker_pid;
kill 'STOP', $broker_pid or die "cannot stop the broker: $!";
my $resumed = 0;
END { kill 'CONT', $broker_pid if $broker_pid && !$resumed; }

$node->safe_psql('postgres',
	"SELECT count(outbox_enqueue('$topic', 'message ' || i, 'key-' || i % 10)) FROM generate_series(1, 100) i");
ok($node->poll_query_until('postgres',
		"SELECT query FROM pg_stat_activity WHERE backend_type = 'outbox worker'",
		'outbox: waiting for Kafka'),
	'the worker waits for the frozen broker\'s reports');

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
kill 'CONT', $broker_pid or die "cannot resume the broker: $!";
$resumed = 1;
my $records = consume_topics(topics => [$topic], expect => 101, idle => 5, timeout => 120);
my %values = map { ($_->{value} => 1) } @$records;
is(scalar(grep { $values{"message $_"} } 1 .. 100), 100,
	'every message committed before the death is delivered once the broker resumes');
ok(wait_for_query($node, 'SELECT count(*) FROM outbox_message', '0', 60),
	'and the outbox is empty');
$node->stop('fast');
done_testing();

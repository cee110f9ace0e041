# Crash isolation: librdkafka runs in the worker's Kafka process
# (outbox_kafka), which is no child of the postmaster.  Whatever kills it (a
# segfault, an abort, a kill, a setting that crashes librdkafka 2.0.2) costs
# a new Kafka process, never a restart of PostgreSQL: the postmaster's start
# time and the worker stay, nothing is lost, at most one batch is published
# twice, and no secret of the crashing setting reaches the log or
# outbox_worker.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

# A production server restarts after a crash; had the Kafka process been
# a postmaster child, its crash would have restarted this one.
my $node = outbox_node('kafka_process', conf => 'restart_after_crash = on');
my $started = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');
my $worker = $node->safe_psql('postgres', 'SELECT pid FROM outbox_worker');

sub kafka_process
{
	my $pid = `pgrep -P $worker -x outbox_kafka`;
	chomp $pid;
	return $pid;
}

sub wait_for_kafka_process
{
	my ($other_than) = @_;
	my $deadline = time() + 60;
	while (time() < $deadline)
	{
		my $pid = kafka_process();
		return $pid if $pid ne '' && $pid ne ($other_than // '');
		sleep(0.1);
	}
	return '';
}

sub server_and_worker_stayed
{
	my ($what) = @_;
	is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'), $started,
		"$what: PostgreSQL did not restart");
	is($node->safe_psql('postgres', 'SELECT pid FROM outbox_worker'), $worker,
		"$what: the worker is the same process");
}

my $first = wait_for_kafka_process();
isnt($first, '', 'the worker runs librdkafka in a Kafka process of its own');
is(`ps -o ppid= -p $first` =~ s/\s//gr, $worker, 'whose parent is the worker, not the postmaster');

# A committed backlog keeps the Kafka process busy, so the crash comes mid-batch.
for my $signal ('SEGV', 'ABRT', 'KILL')
{
	my $scenario = "Kafka process SIG$signal mid-batch";
	my @topics = (unique_topic('fault.kafka_process'), unique_topic('fault.kafka_process'));
	kafka_admin('create-topic', $_, '--partitions', 3) for @topics;

	my $load = start_load($node, topics => [ $topics[0] ], duration => 20);
	sleep(2);
	enqueue_backlog($node, $topics[1], 20000);
	ok(wait_for_query($node,
			"SELECT (SELECT count(*) FROM outbox_message WHERE topic = '$topics[1]') < 20000",
			't', 60),
		"$scenario: the backlog is being published");

	my $victim = kafka_process();
	my $drain_s = backlog_drain_time($node, sub {
		kill $signal, $victim or die "cannot signal the Kafka process: $!";
		isnt(wait_for_kafka_process($victim), '', "$scenario: the worker starts another Kafka process");
	});
	finish_load($load);
	fault_check($node, scenario => $scenario, topics => \@topics, drain_s => $drain_s,
		crashes => 1);
	server_and_worker_stayed($scenario);
}
like(slurp_file($node->logfile),
	qr/the Kafka process was terminated by signal 11: Segmentation fault; starting another/,
	'the log says how the Kafka process ended');

# A setting that makes librdkafka 2.0.2 segfault about 10 s after its
# producer starts, and quote the secret in its error first (as later
# versions do too).
my $secret = 'S3cretLife' . int(rand(1e9));
my $crashing = 'security.protocol=SASL_PLAINTEXT; sasl.mechanisms=OAUTHBEARER; '
  . 'enable.sasl.oauthbearer.unsecure.jwt=true; '
  . "sasl.oauthbearer.config=principal=admin lifeSeconds=$secret";
my $log_offset = -s $node->logfile;
$node->append_conf('postgresql.conf', "outbox.kafka_properties = '$crashing'");
$node->reload;

my $topic = unique_topic('kafka_process.after');
kafka_admin('create-topic', $topic, '--partitions', 1);
ok(wait_for_query($node,
		"SELECT last_error LIKE '%Invalid sasl.oauthbearer.config%' FROM outbox_worker", 't', 60),
	"librdkafka's error, which quotes the setting, reaches outbox_worker");
my $last_error = $node->safe_psql('postgres', 'SELECT last_error FROM outbox_worker');
unlike($last_error, qr/\Q$secret\E/, 'without the secret it quoted') or diag($last_error);
like($last_error, qr/\*{8}/, 'which is masked there');

# librdkafka 2.0.2 crashes on it by itself, in each Kafka process the worker
# starts; later versions, which fixed that, get each of theirs crashed here,
# for the same crash loop.
my $crashes_by_itself = `pkg-config --modversion rdkafka` =~ /^2\.0\./;
my $deadline = time() + 90;
my ($crashes, $crashed) = (0, '');
while (time() < $deadline && $crashes < 2)
{
	$crashes = () = substr(slurp_file($node->logfile), $log_offset)
	  =~ /the Kafka process was terminated by signal/g;
	my $pid = kafka_process();
	if (!$crashes_by_itself && $pid ne '' && $pid ne $crashed)
	{
		kill 'SEGV', $pid;
		$crashed = $pid;
	}
	sleep(0.5);
}
cmp_ok($crashes, '>=', 2, 'with that setting, the Kafka process crashes again and again');
$node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'enqueued while librdkafka crashes'::text, 'k')");
server_and_worker_stayed('librdkafka crashing on a setting');
unlike(substr(slurp_file($node->logfile), $log_offset), qr/\Q$secret\E/,
	'the server log has no secret either');

# Mended, the message waiting is published.
$node->append_conf('postgresql.conf', "outbox.kafka_properties = ''");
$node->reload;
my $records = consume_topics(topics => [$topic], expect => 1, timeout => 60);
is(scalar(@$records), 1, 'once the setting is mended, the waiting message is published');
server_and_worker_stayed('after mending the setting');

$node->stop('fast');
is(worker_exits($node), 0, 'the worker never exited');
done_testing();

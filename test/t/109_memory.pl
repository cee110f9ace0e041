# Bounded memory: a burst of 300 payloads of about 1 MB each, which
# compress to a few KB on disk, all committed at once, and 60 more from an
# older transaction that commits while the burst is being published.  The
# worker claims them in batches cut at outbox.max_batch_bytes, so its
# private memory stays under the bound the README states however large the
# burst, and every message still arrives, byte for byte, once, in per-key
# order.
#
# What is measured: the worker's private memory, RssAnon in
# /proc/PID/status (its heap: claimed batches, librdkafka's copies and
# buffers), summed over the worker and every process descended from it
# (librdkafka may run in a child), sampled every 10 ms while the burst
# drains.  Not VmRSS or VmHWM, which count the pages of shared buffers the
# worker touched: those belong to the server, not to the worker.
use strict;
use warnings;

use Digest::MD5 qw(md5_hex);
use List::Util qw(max sum0);
use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use constant {
	MESSAGES => 300,
	PAYLOAD_BYTES => 999_000,    # under Kafka's and librdkafka's 1 MB defaults
	KEYS => 3,
	OLDER_MESSAGES => 60,
	OLDER_COMMITS_AFTER => 50,    # messages published
	# The README's bound for the default settings ("The worker's memory":
	# about 85 MB), with room for what malloc keeps of freed batches.
	BOUND_MB => 110,
	SAMPLE_INTERVAL_S => 0.01,
	DRAIN_CHECK_INTERVAL_S => 0.25,
};

my $node = outbox_node('memory');
my $topic = unique_topic('memory');
kafka_admin('create-topic', $topic, '--partitions', 3);

# Warm up: the producer connects and learns the topic.
$node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'warm-up'::text)");
ok(wait_for_query($node, 'SELECT count(*) FROM outbox_message', '0', 60),
	'the warm-up message is delivered');
my $worker = $node->safe_psql('postgres', 'SELECT pid FROM outbox_worker');

# The pids of a process and of all its descendants.
sub process_tree
{
	my ($root) = @_;
	my %children;
	for my $stat (glob('/proc/[0-9]*/stat'))
	{
		open(my $fh, '<', $stat) or next;    # the process may be gone
		my $line = <$fh> // next;
		# the command name, in parentheses, may hold spaces and parentheses
		my ($pid, $ppid) = $line =~ /^(\d+) .*\) \S+ (\d+) /s or next;
		push @{ $children{$ppid} }, $pid;
	}
	my @tree = ($root);
	for (my $i = 0; $i < @tree; $i++)
	{
		push @tree, @{ $children{ $tree[$i] } // [] };
	}
	return @tree;
}

# A field of /proc/PID/status, in kB; 0 once the process is gone.
sub status_kb
{
	my ($pid, $field) = @_;
	open(my $fh, '<', "/proc/$pid/status") or return 0;
	while (<$fh>)
	{
		return $1 if /^$field:\s+(\d+) kB/;
	}
	return 0;
}

sub private_kb
{
	return sum0(map { status_kb($_, 'RssAnon') } process_tree($worker));
}

my $before_kb = private_kb();

# Enqueue big messages in a transaction, logging what it commits.
sub enqueue_sql
{
	my ($count, $key_prefix) = @_;
	return qq{
	SELECT count(outbox_enqueue('$topic', lpad(i::text, 6, '0') || repeat('x', ${\(PAYLOAD_BYTES - 6)}),
	                            '$key_prefix' || i % ${\KEYS}))
	  FROM generate_series(1, $count) i;
	INSERT INTO burst_log SELECT id, message_id, key, md5(payload) FROM outbox_message
	 WHERE xmin = pg_current_xact_id()::xid;
	};
}
$node->safe_psql('postgres', 'CREATE TABLE burst_log (id bigint, message_id uuid, key text, md5 text)');

# An older transaction draws the lower ids, and commits only once the burst
# is being published: its rows, below the batch in flight, are claimed in
# batches the cap cuts too, and must still go in id order.  (Its keys are its
# own: a key's enqueues wait for each other.)
my $older = $node->background_psql('postgres');
$older->query_safe('BEGIN;' . enqueue_sql(OLDER_MESSAGES, 'older-'));
$node->safe_psql('postgres', 'BEGIN;' . enqueue_sql(MESSAGES, 'key-') . 'COMMIT;');

# Sample the worker's private memory until both have drained.
my ($peak_kb, $older_committed, $drained, $published_at_older_commit) = (0, 0, 0, 0);
my $deadline = time() + 300;
my $next_check = 0;
while (!$drained && time() < $deadline)
{
	$peak_kb = max($peak_kb, private_kb());
	if (time() >= $next_check)
	{
		my ($published, $waiting) = split /\|/, $node->safe_psql('postgres',
			'SELECT published, (SELECT count(*) FROM outbox_message) FROM outbox_worker');
		$drained = $older_committed && $waiting == 0;
		if (!$older_committed && $published > OLDER_COMMITS_AFTER)
		{
			$older->query_safe('COMMIT');
			$older_committed = 1;
			$published_at_older_commit = $published;
		}
		$next_check = time() + DRAIN_CHECK_INTERVAL_S;
	}
	sleep(SAMPLE_INTERVAL_S);
}
$older->quit;
cmp_ok($published_at_older_commit, '<', MESSAGES,
	'the older transaction committed while the burst was being published');
ok($drained, 'the burst and the older transaction drain');
diag(sprintf('worker private memory (RssAnon, worker and descendants): %.0f MB before the burst,'
		. ' %.0f MB at its peak; its VmHWM (with shared buffers) %.0f MB',
		$before_kb / 1024, $peak_kb / 1024, status_kb($worker, 'VmHWM') / 1024));
cmp_ok($peak_kb / 1024, '<', BOUND_MB,
	'the worker\'s private memory stays under the bound the README states');
is($node->safe_psql('postgres', 'SELECT pid FROM outbox_worker'), $worker,
	'the same worker did it all');

# Every message arrived once, byte for byte, in per-key order.
my %committed;
my %md5;
for my $row (split /\n/, $node->safe_psql('postgres', 'SELECT message_id, key, id, md5 FROM burst_log'))
{
	my ($message_id, $key, $id, $md5) = split /\|/, $row;
	$committed{$message_id} = [ $key, $id ];
	$md5{$message_id} = $md5;
}
is(scalar(keys %committed), MESSAGES + OLDER_MESSAGES, 'the burst and the older transaction are committed');
my $records = [ grep { (message_id_header($_) // '') ne '' && exists $md5{ message_id_header($_) } }
	  @{ consume_topics(topics => [$topic], expect => MESSAGES + OLDER_MESSAGES + 1, digest => 1, timeout => 120) } ];
my $result = check_delivery($records, \%committed);
is($result->{lost}, 0, 'nothing lost');
is($result->{duplicates}, 0, 'nothing published twice');
is($result->{order_faults}, 0, 'per-key order kept across the batches the cap cut');
is(scalar(grep { $_->{value_md5} ne $md5{ message_id_header($_) } } @$records), 0,
	'every payload arrives byte for byte');
is($node->safe_psql('postgres', 'SELECT published, dead_lettered FROM outbox_worker'),
	(MESSAGES + OLDER_MESSAGES + 1) . '|0', 'outbox_worker counts them all published, none dead-lettered');

$node->stop('fast');
is(worker_exits($node), 0, 'the worker never crashed or exited with an error');
done_testing();

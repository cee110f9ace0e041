# Who truncates the drained segments.
#
# A reclaimer, a short-lived process the publisher starts, looks into each
# segment and truncates it, so that the publisher goes on publishing while
# the segment's pages are read and its files removed.  Shown here:
# - a segment that held 40,000 delivered rows is truncated by a reclaimer,
#   not by the publisher, and a message enqueued meanwhile is delivered;
# - a segment that holds a message not yet due is not truncated, and the
#   reclaimers that find it so come further and further apart, not one a
#   second;
# - with no background worker slot free for a reclaimer (max_worker_processes
#   taken by the launchers, the publisher and pg_prewarm's worker), the
#   publisher truncates the segment itself, and says so once.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

# Who wrote each "truncated segment" line: a reclaimer (the postmaster logs
# each one's PID as it exits), the publisher (outbox_worker.pid), or another.
sub truncations_by
{
	my ($node, $offset) = @_;
	my $log = slurp_file($node->logfile, $offset);
	my %reclaimers = map { $_ => 1 } $log =~ /background worker "outbox reclaimer" \(PID (\d+)\) exited/g;
	my $publisher = $node->safe_psql('postgres', 'SELECT pid FROM outbox_worker');
	my %by;
	for my $pid ($log =~ /\[(\d+)\] DEBUG:  outbox: truncated segment/g)
	{
		$by{ $reclaimers{$pid} ? 'a reclaimer' : $pid eq $publisher ? 'the publisher' : "process $pid" }++;
	}
	return \%by;
}

# The same, once every such process is known: a reclaimer that has just
# truncated may not have exited yet.
sub truncations_known
{
	my ($node, $offset) = @_;
	my $deadline = time() + 30;
	my $by = truncations_by($node, $offset);
	while (grep({ /^process/ } keys %$by) && time() < $deadline)
	{
		sleep(0.1);
		$by = truncations_by($node, $offset);
	}
	return $by;
}

# Run an enqueueing SELECT ... count(...) statement; returns the segment its
# rows went to, named in the same statement (outbox_segment() names the
# segment of the statement's start), before the worker can deliver them.
sub enqueue_into_segment
{
	my ($node, $select) = @_;
	$select =~ s/^\s*SELECT /SELECT 'outbox_message_' || outbox_segment(), /;
	my ($segment, $count) = split /\|/, $node->safe_psql('postgres', $select);
	return $segment;
}

my $node = outbox_node('reclaimer', conf => "log_min_messages = debug1");
my $topic = unique_topic('reclaimer');
kafka_admin('create-topic', $topic);

my $offset = -s $node->logfile;
# the segment the rows go to is the one of their statement's start
my $big = enqueue_into_segment($node, qq{
	SELECT count(outbox_enqueue('$topic', jsonb_build_object('n', i, 'pad', repeat('x', 150)), 'k' || (i % 50)))
	  FROM generate_series(1, 40000) i});
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE topic = '$topic'", '0', 120),
	'40,000 messages delivered');
ok(wait_for_query($node, "SELECT pg_relation_size('$big') = 0", 't', 60),
	"$big, which held them, is truncated once its turn has ended");
my $by = truncations_known($node, $offset);
ok($by->{'a reclaimer'}, 'by a reclaimer: ' . join(', ', map { "$_ $by->{$_}" } sort keys %$by));
is(scalar(keys %$by), 1, 'by no other process');

my $records = consume_topics(topics => [$topic], expect => 40000);
is(scalar(@$records), 40000, 'Kafka holds the 40,000, once each');

# A message due in an hour keeps its segment from being truncated: the
# reclaimers find it so, less and less often.
my $waiting_topic = unique_topic('reclaimer.waiting');
kafka_admin('create-topic', $waiting_topic);
$node->safe_psql('postgres',
	"SELECT outbox_enqueue('$waiting_topic', '{\"due\": \"later\"}'::jsonb, 'w', deliver_after => interval '1 hour')");
my ($waiting) = $node->safe_psql('postgres',
	"SELECT 'outbox_message_' || segment FROM outbox_message WHERE topic = '$waiting_topic'");
# once its turn is over (10 s) and a reclaimer has looked
ok(wait_for_query($node,
		"SELECT (SELECT 'outbox_message_' || segment FROM outbox_message WHERE topic = '$waiting_topic') <> 'outbox_message_' || outbox_segment()",
		't', 30), "$waiting is no longer the current segment");
$offset = -s $node->logfile;
my $watch_s = 40;
sleep($watch_s);
my $started = () = slurp_file($node->logfile, $offset)
  =~ /starting background worker process "outbox reclaimer/g;
cmp_ok($started, '<=', $watch_s / 3,
	"in $watch_s s, $started reclaimers started (their pause doubles from 1 s to 10 s)");
cmp_ok($started, '>=', 2, 'and they go on looking');
isnt($node->safe_psql('postgres', "SELECT pg_relation_size('$waiting')"), '0',
	"$waiting, which holds the message not yet due, is not truncated");
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox_message WHERE topic = '$waiting_topic'"),
	'1', 'the message waits in it');
$node->stop;

# No slot free for a reclaimer: the launcher, the logical replication
# launcher, pg_prewarm's worker and the publisher take the four (the probe
# had the publisher's, before it).
my $full = outbox_node('reclaimer_no_slot', conf => join("\n",
		"shared_preload_libraries = 'outbox,pg_prewarm'",
		"max_worker_processes = 4",
		"outbox.max_workers = 1",
		"log_min_messages = debug1"));
ok(wait_for_query($full, 'SELECT state FROM outbox_worker', 'idle', 60), 'the publisher runs');
$offset = -s $full->logfile;
my $full_topic = unique_topic('reclaimer.full');
kafka_admin('create-topic', $full_topic);
my $full_segment = enqueue_into_segment($full, qq{
	SELECT count(outbox_enqueue('$full_topic', jsonb_build_object('n', i), 'k' || (i % 50)))
	  FROM generate_series(1, 5000) i});
ok(wait_for_query($full, "SELECT count(*) FROM outbox_message", '0', 60), '5,000 messages delivered');
ok(wait_for_query($full, "SELECT pg_relation_size('$full_segment') = 0", 't', 60),
	"$full_segment is truncated");
$by = truncations_known($full, $offset);
ok($by->{'the publisher'} && keys %$by == 1,
	'by the publisher itself: ' . join(', ', map { "$_ $by->{$_}" } sort keys %$by));
my @said = slurp_file($full->logfile, $offset) =~ /(no background worker slot is free for a reclaimer)/g;
is(scalar(@said), 1, 'which it says once');
$full->stop;

done_testing();

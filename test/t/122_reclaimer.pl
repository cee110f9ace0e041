# Who truncates the drained segments, and looks for the rows the claims
# passed.
#
# A reclaimer, a short-lived process the publisher starts, looks into each
# segment and truncates it, so that the publisher goes on publishing while
# the segment's pages are read and its files removed; and every
# outbox.poll_interval it looks for a row that the claims passed, locked by
# another session, which walks the index entries of every row deleted since
# VACUUM last ran.  Shown here:
# - a segment that held 40,000 delivered rows is truncated by a reclaimer,
#   not by the publisher, and a message enqueued meanwhile is delivered;
# - a message locked by another session while the claims passed it is found
#   by a reclaimer, and delivered once the lock is gone;
# - a segment that holds a message not yet due is not truncated, and the
#   reclaimers that find it so come further and further apart, not one a
#   second;
# - with no background worker slot free for a reclaimer (max_worker_processes
#   taken by the launchers, the publisher and pg_prewarm's worker), the
#   publisher truncates the segment and finds the locked message itself,
#   and says so once.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

# Who wrote each DEBUG line that starts with $said: a reclaimer (the
# postmaster logs each one's PID as it exits), the publisher
# (outbox_worker.pid), or another.
sub said_by
{
	my ($node, $offset, $said) = @_;
	my $log = slurp_file($node->logfile, $offset);
	my %reclaimers = map { $_ => 1 } $log =~ /background worker "outbox reclaimer" \(PID (\d+)\) exited/g;
	my $publisher = $node->safe_psql('postgres', 'SELECT pid FROM outbox_worker');
	my %by;
	for my $pid ($log =~ /\[(\d+)\] DEBUG:  \Q$said\E/g)
	{
		$by{ $reclaimers{$pid} ? 'a reclaimer' : $pid eq $publisher ? 'the publisher' : "process $pid" }++;
	}
	return \%by;
}

# The same, once every such process is known: a reclaimer that has just
# said it may not have exited yet.
sub said_by_known
{
	my ($node, $offset, $said) = @_;
	my $deadline = time() + 30;
	my $by = said_by($node, $offset, $said);
	while (grep({ /^process/ } keys %$by) && time() < $deadline)
	{
		sleep(0.1);
		$by = said_by($node, $offset, $said);
	}
	return $by;
}

sub truncations_known
{
	my ($node, $offset) = @_;
	return said_by_known($node, $offset, 'outbox: truncated segment');
}

sub describe
{
	my ($by) = @_;
	return join(', ', map { "$_ $by->{$_}" } sort keys %$by);
}

# A message that another session holds locked while the claims pass it:
# the worker, kept from Kafka meanwhile, claims the 3 enqueued after it
# once it can publish, and skips it; once the lock is gone, a look for
# the rows the claims passed finds it, every outbox.poll_interval (1 s
# here).  Returns its id, once it is delivered.
sub deliver_a_locked_message
{
	my ($node, $topic) = @_;
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET outbox.brokers = '127.0.0.1:1'; ALTER SYSTEM SET outbox.poll_interval = '1s'; SELECT pg_reload_conf()");
	ok(wait_for_query($node, 'SELECT state FROM outbox_worker', 'waiting for brokers', 30),
		'the worker is kept from the brokers');
	my $locked = $node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', '{\"locked\": true}'::jsonb, 'locked')");
	my $locker = $node->background_psql('postgres');
	$locker->query_safe('BEGIN');
	$locker->query_safe("SELECT FROM outbox_message WHERE id = $locked FOR UPDATE");
	$node->safe_psql('postgres',
		"SELECT outbox_enqueue('$topic', jsonb_build_object('n', i), 'beside') FROM generate_series(1, 3) i");
	$node->safe_psql('postgres', 'ALTER SYSTEM RESET outbox.brokers; SELECT pg_reload_conf()');
	ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE topic = '$topic' AND id <> $locked", '0', 30),
		'the messages enqueued after the locked one are delivered');
	$locker->query_safe('COMMIT');
	$locker->quit;
	ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE topic = '$topic'", '0', 30),
		'the locked one is delivered once its lock is gone');
	$node->safe_psql('postgres', 'ALTER SYSTEM RESET outbox.poll_interval; SELECT pg_reload_conf()');
	return $locked;
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
ok($by->{'a reclaimer'}, 'by a reclaimer: ' . describe($by));
is(scalar(keys %$by), 1, 'by no other process');

my $records = consume_topics(topics => [$topic], expect => 40000);
is(scalar(@$records), 40000, 'Kafka holds the 40,000, once each');

my $locked_topic = unique_topic('reclaimer.locked');
kafka_admin('create-topic', $locked_topic);
$offset = -s $node->logfile;
my $locked = deliver_a_locked_message($node, $locked_topic);
$by = said_by_known($node, $offset, "outbox: the lowest message a claim would take is $locked;");
ok($by->{'a reclaimer'} && keys %$by == 1, "a reclaimer found it, $locked: " . describe($by));
$records = consume_topics(topics => [$locked_topic], expect => 4);
is_deeply([ sort map { $_->{key} } @$records ], [ ('beside') x 3, 'locked' ], 'Kafka holds the 4, once each');

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
ok($by->{'the publisher'} && keys %$by == 1, 'by the publisher itself: ' . describe($by));
kafka_admin('create-topic', "$full_topic.locked");
deliver_a_locked_message($full, "$full_topic.locked");
my @said = slurp_file($full->logfile, $offset) =~ /(no background worker slot is free for a reclaimer)/g;
is(scalar(@said), 1, 'which it says once');
$full->stop;

done_testing();

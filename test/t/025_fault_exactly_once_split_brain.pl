# Fault suite, exactly-once: split brain.  A primary publishes under load
# with outbox.delivery = exactly_once; its publisher is paused with a Kafka
# transaction open, its messages acknowledged (before_kafka_commit); its
# streaming standby is promoted while the old primary lives on, and both
# take writes and publish.  Both have the same system identifier and
# database, so the same transactional.id: each one's producer start fences
# the other's, whose transaction aborts, and whose next start reads the
# other's progress records and records as delivered the messages it holds
# too (the same id and outbox-message-id).  So, once both outboxes are
# empty, a read_committed consumer finds every message either server
# committed exactly once, in per-key order on each server's history: lost
# 0, phantom 0, order faults 0, duplicates 0.  What a read_uncommitted one
# sees twice is reported.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $t_start = time();
my $scenario = 'exactly-once: split brain after a failover';
my $conf = "outbox.delivery = 'exactly_once'\nmax_connections = 40";

my $primary = outbox_node('split_a', init => { allows_streaming => 1 }, conf => $conf);
$primary->safe_psql('postgres',
	'CREATE TABLE fault_log (id bigint, message_id uuid, topic text, key text)');
$primary->safe_psql('postgres', "SELECT pg_create_physical_replication_slot('split_b', true)");
$primary->backup('backup_b');
my $standby = PostgreSQL::Test::Cluster->new('split_b');
$standby->init_from_backup($primary, 'backup_b', has_streaming => 1);
$standby->append_conf('postgresql.conf', "primary_slot_name = 'split_b'");
$standby->start;

my @topics = (unique_topic('fault.eos.split'), unique_topic('fault.eos.split'));
kafka_admin('create-topic', $_, '--partitions', 3) for @topics;
my $topic_list = join(',', map { "'$_'" } @topics);

my $load_a = start_load($primary, topics => \@topics, duration => 16);
ok(wait_for_query($primary, 'SELECT published > 100 FROM outbox_worker', 't', 30),
	'the primary publishes under load');
pause_publisher($primary, 'before_kafka_commit');
$primary->wait_for_catchup($standby);

# Both servers take writes from here on.
$standby->promote;
my $load_b = start_load($standby, topics => \@topics, duration => 8);
ok(wait_for_query($standby, 'SELECT published > 0 FROM outbox_worker', 't', 60),
	'the promoted standby publishes while the old primary lives');
$primary->safe_psql('postgres', "SELECT outbox_simulate_pause('none')");
finish_load($_) for $load_a, $load_b;

for my $node ($primary, $standby)
{
	ok(wait_for_query($node,
			"SELECT count(*) FROM outbox_message WHERE state <> 'sent' AND topic IN ($topic_list)",
			'0', 180),
		$node->name . ': the outbox drains');
}

# What each server committed: message_id => [key, id]; the messages
# committed before the promotion are in both, with the same id.
my (%committed, %expected);
for my $node ($primary, $standby)
{
	my %dead = map { ($_ => 1) }
	  split /\n/, $node->safe_psql('postgres', 'SELECT message_id FROM outbox_dead_letter');
	$committed{ $node->name } = {
		map { my ($mid, $key, $id) = split /\|/; $dead{$mid} ? () : ($mid => [ $key, $id ]) }
		  split /\n/, $node->safe_psql('postgres',
			"SELECT message_id, key, id FROM fault_log WHERE topic IN ($topic_list)") };
	%expected = (%expected, %{ $committed{ $node->name } });
}
my $shared = grep { exists $committed{split_b}{$_} } keys %{ $committed{split_a} };

my $records = consume_topics(topics => \@topics, idle => 5, timeout => 180);
my $all = check_delivery($records, \%expected);
my $uncommitted = check_delivery(
	consume_topics(topics => \@topics, idle => 5, timeout => 180, read_uncommitted => 1),
	\%expected);
diag(sprintf('%s: %d messages (%d committed before the promotion, in both); '
		  . 'lost %d, phantom %d, duplicates %d; read_uncommitted: %d twice',
		$scenario, scalar(keys %expected), $shared, $all->{lost}, $all->{phantom},
		$all->{duplicates}, $uncommitted->{duplicates}));
cmp_ok($shared, '>', 0, "$scenario: messages committed before the promotion");
cmp_ok(scalar(keys %expected) - $shared, '>', 0, "$scenario: and after it");
is($all->{lost}, 0, "$scenario: nothing lost");
is($all->{phantom}, 0, "$scenario: nothing phantom");
is($all->{duplicates}, 0, "$scenario: no duplicate for a read_committed consumer");

# Per-key order holds on each server's history (the two diverge after the
# promotion: their ids are not comparable with each other's).
for my $name ('split_a', 'split_b')
{
	my $mine = $committed{$name};
	my @records = grep { exists $mine->{ message_id_header($_) // '' } } @$records;
	is(check_delivery(\@records, $mine)->{order_faults}, 0,
		"$scenario: per-key order kept on $name\'s history");
}

# Each publisher found that the other had taken its transactional.id over.
for my $node ($primary, $standby)
{
	like(slurp_file($node->logfile), qr/fenced/i,
		$node->name . ': its log says another producer fenced its own');
	is(worker_exits($node), 0, $node->name . ': no worker of the extension crashed');
}
$_->stop('fast') for $primary, $standby;
diag(sprintf('025_fault_exactly_once_split_brain: %.1f s', time() - $t_start));
done_testing();

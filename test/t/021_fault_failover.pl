# Fault suite: a PostgreSQL primary with a streaming standby, whose
# postmaster is killed with SIGKILL under load; the standby is promoted and
# its publisher takes over.
#
# 1. Synchronous replication: every transaction acknowledged to the
#    application is on the standby, so nothing is lost and nothing phantom.
# 2. Asynchronous replication, the standby's WAL receiver frozen (SIGSTOP)
#    before the kill: the new primary lacks the last transactions, of which
#    the worker had published the messages: phantoms, which this measures.
# 3. The same, with outbox.synchronized_standby_slots naming the standby's
#    slot: the worker waits for the standby before it publishes, so the
#    failover loses transactions (PostgreSQL's asynchronous failover does)
#    but no message in Kafka lacks its transaction.
# 4. The setting naming a slot that does not exist: nothing is published,
#    outbox_worker and the log say why, and clearing it delivers all.
# 5. The setting naming a logical slot, which says nothing of a standby,
#    then an invalidated one: the worker waits, and says why; DROP EXTENSION
#    during that wait ends the worker.
#
# In scenario 1 a message delayed past the failover is published by the new
# primary.
#
# Before its promotion a standby runs nothing of the extension and logs
# nothing of it, and an enqueue there gets PostgreSQL's read-only error.
#
# Each promoted standby is the next scenario's primary, so that only the
# first node is initialized.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

# The physical slot each standby streams from.
my $slot = 'outbox_standby';

# How long the standby's WAL receiver is frozen before the primary dies.
my $freeze_s = 2.5;

# Enough WAL to fill the replication connection's socket buffers while the
# WAL receiver is frozen, so that what the primary commits next stays on
# it: 10,000 rows of 1 kB.
my $filler_rows = 10000;

# Most sessions: the load's 8, the checks, the walsenders.
my $node_conf = "max_connections = 40\nshared_buffers = 16MB";

my $t_start = time();
my @nodes;
my @frozen;
END { kill 'CONT', @frozen if @frozen; }

# A new standby of $primary, streaming from a new physical slot there,
# caught up.
sub start_standby
{
	my ($primary, $name) = @_;
	$primary->safe_psql('postgres', "SELECT pg_create_physical_replication_slot('$slot', true)");
	$primary->backup("backup_$name");
	my $standby = PostgreSQL::Test::Cluster->new($name);
	$standby->init_from_backup($primary, "backup_$name", has_streaming => 1);
	$standby->append_conf('postgresql.conf', "primary_slot_name = '$slot'");
	$standby->start;
	$primary->wait_for_catchup($standby);
	push @nodes, $standby;
	return $standby;
}

# Change the node's settings (after the standby's backup, so that the
# standby does not inherit them) and reload.
sub set_and_reload
{
	my ($node, $conf) = @_;
	$node->append_conf('postgresql.conf', $conf);
	$node->reload;
}

# A connection string that reaches whichever of the nodes takes writes.
sub failover_dsn
{
	my (@nodes) = @_;
	return sprintf('host=%s port=%s dbname=postgres target_session_attrs=read-write',
		join(',', map { $_->host } @nodes), join(',', map { $_->port } @nodes));
}

# The primary's machine lost: the postmaster and every process it started
# die at once.  Killing the postmaster alone would leave its walsender alive
# for a moment, free to stream the rest of the WAL to a standby that is
# thawed next, and its worker free to publish what that standby confirms.
# So the postmaster is stopped first (it forks nothing more), its children
# are stopped, and then all of them are killed.
sub kill_primary
{
	my ($node, $scenario) = @_;
	my ($pid) = slurp_file($node->data_dir . '/postmaster.pid') =~ /^(\d+)/;
	kill 'STOP', $pid or die "cannot stop the postmaster: $!";
	my @children = grep { (process_state($_))[1] == $pid }
	  map { m{^/proc/(\d+)$} ? $1 : () } glob('/proc/[0-9]*');
	kill 'STOP', @children;
	kill 'KILL', $pid, @children or die "cannot kill the postmaster: $!";
	$node->{_pid} = undef;		# the framework's record of the killed postmaster
	my $deadline = time() + 10;
	sleep(0.01) while grep({ process_alive($_) } $pid, @children) && time() < $deadline;
	ok(!grep({ process_alive($_) } $pid, @children),
		"$scenario: the primary and every process it started are gone");
}

# A process's state and parent, from /proc; (undef, 0) once it is gone.
sub process_state
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/stat") or return (undef, 0);
	# "pid (comm) state ppid ...": comm may hold spaces and parentheses
	my ($state, $ppid) = (<$fh> // '') =~ /^\d+ \(.*\) (\S+) (\d+)/s;
	return ($state, $ppid // 0);
}

# A process that exists and is not a zombie.
sub process_alive
{
	my ($state) = process_state(@_);
	return defined $state && $state ne 'Z';
}

sub walreceiver_pid
{
	my ($standby) = @_;
	return $standby->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'walreceiver'");
}

# Before its promotion, a standby is quiet: no process of the extension,
# nothing of it in its log, views that answer, and an enqueue that gets
# PostgreSQL's read-only error and nothing else.
sub check_standby_quiet
{
	my ($standby) = @_;
	is($standby->safe_psql('postgres',
			"SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'outbox%'"),
		'0', 'standby: no process of the extension runs');
	for my $enqueue ("SELECT outbox_enqueue('standby.topic', 'x'::text, 'k')",
		"INSERT INTO outbox_message (topic, payload) VALUES ('standby.topic', 'x')")
	{
		my ($ret, $stdout, $stderr) = $standby->psql('postgres', $enqueue,
			extra_params => [ '-v', 'VERBOSITY=verbose' ]);
		like($stderr, qr/^(?:psql:<stdin>:\d+: )?ERROR:  25006: cannot execute INSERT in a read-only transaction/m,
			"standby: \"$enqueue\" gets the read-only error");
		unlike($stderr, qr/WARNING/, 'and no WARNING');
	}
	is($standby->safe_psql('postgres', q{
			SELECT (SELECT count(*) FROM outbox_status) >= 0,
			       (SELECT count(*) FROM outbox_worker),
			       (SELECT count(*) FROM outbox_launcher WHERE pid IS NOT NULL)}),
		't|0|0', 'standby: the views answer, with no worker and no launcher');
	# the extension's own messages and its processes' names; the statements
	# above are in the log too (log_statement = all)
	unlike(slurp_file($standby->logfile),
		qr/\boutbox(?: launcher)?: |"outbox (?:launcher|worker|probe)/,
		'standby: nothing of the extension in its log');
}

# Promote the standby; returns the seconds from the promotion's start to
# the first message that its publisher had acknowledged by Kafka, and
# reports both steps.
sub promote_and_time
{
	my ($standby, $scenario) = @_;
	my $t0 = time();
	$standby->promote;
	my $promoted_s = time() - $t0;

	# polled in the server, at 5 ms, from the end of the promotion on (a
	# query held on the standby during recovery might hold back its replay)
	my $published_at = $standby->safe_psql('postgres', q{
		DO $$
		BEGIN
			WHILE coalesce((SELECT sum(published) FROM outbox_worker), 0) = 0
			  AND clock_timestamp() < now() + interval '60 s' LOOP
				PERFORM pg_sleep(0.005);
			END LOOP;
		END $$;
		SELECT extract(epoch FROM clock_timestamp()) FROM outbox_worker WHERE published > 0});
	ok($published_at, "$scenario: the new primary publishes");
	my $first_s = ($published_at || time()) - $t0;
	diag(sprintf('%s: promotion %.0f ms, promotion to the first message acknowledged %.0f ms',
			$scenario, $promoted_s * 1000, $first_s * 1000));
	return $first_s;
}

my @topic_sets;

sub new_topics
{
	my @topics = (unique_topic('fault.failover'), unique_topic('fault.failover'));
	kafka_admin('create-topic', $_, '--partitions', 3) for @topics;
	return @topics;
}

# The scenarios' steps: the load on $primary, following it to $standby.
sub start_failover_load
{
	my ($primary, $standby, $topics, $name, $duration) = @_;
	my $acknowledged = "$PostgreSQL::Test::Utils::tmp_check/acknowledged_$name";
	unlink $acknowledged;
	my $load = start_load($primary, topics => $topics, duration => $duration,
		dsn => failover_dsn($primary, $standby), acknowledged => $acknowledged);
	return ($load, $acknowledged);
}

# wal_level logical, for scenario 5's logical slot; the standbys inherit it
my $primary = outbox_node('failover_a', init => { allows_streaming => 'logical' }, conf => $node_conf);
push @nodes, $primary;
$primary->safe_psql('postgres',
	'CREATE TABLE fault_log (id bigint, message_id uuid, topic text, key text)');

# 1. synchronous replication
my $t_scenario = time();
my $scenario = 'failover, synchronous replication';
my $standby = start_standby($primary, 'failover_b');
# the standby's walreceiver goes by its cluster_name, its node's name
set_and_reload($primary, "synchronous_standby_names = '" . $standby->name . "'");
ok($primary->poll_query_until('postgres',
		"SELECT sync_state FROM pg_stat_replication WHERE application_name = '" . $standby->name . "'", 'sync'),
	"$scenario: the standby is synchronous");
my @topics = new_topics();
my ($load, $acknowledged) = start_failover_load($primary, $standby, \@topics, 'sync', 7);
ok(wait_for_query($primary, 'SELECT published > 100 FROM outbox_worker', 't', 30),
	"$scenario: the primary publishes under load");
# A message delayed past the failover: the promoted standby's publisher,
# which no commit told of it, publishes it when its time comes.
my $delayed_topic = unique_topic('fault.failover.delayed');
kafka_admin('create-topic', $delayed_topic);
$primary->safe_psql('postgres',
	"SELECT outbox_enqueue('$delayed_topic', 'after the failover'::text, 'delayed', deliver_after => '6 seconds')");
check_standby_quiet($standby);
kill_primary($primary, $scenario);
promote_and_time($standby, $scenario);
finish_load($load);
fault_check($standby, scenario => $scenario, topics => \@topics, crashes => 1,
	acknowledged => $acknowledged, idle => 3);
my $delayed_records = consume_topics(topics => [$delayed_topic], expect => 1, timeout => 60);
is(join(',', map { $_->{value} } @$delayed_records), 'after the failover',
	"$scenario: a message delayed past the failover is published by the new primary");
diag(sprintf('%s: %.1f s', $scenario, time() - $t_scenario));

# 2. and 3.: asynchronous replication, without and with
# outbox.synchronized_standby_slots; the walreceiver frozen, the primary
# killed, the walreceiver resumed, the standby promoted
my %phantoms;
for my $synchronized (0, 1)
{
	$t_scenario = time();
	$scenario = $synchronized
	  ? 'failover, async, synchronized_standby_slots'
	  : 'failover, asynchronous replication';
	$primary = $standby;
	$standby = start_standby($primary, $synchronized ? 'failover_d' : 'failover_c');
	if ($synchronized)
	{
		set_and_reload($primary, "outbox.synchronized_standby_slots = '$slot'");
		# From 17 the wait is also woken by the standby's reply when the slot
		# is in PostgreSQL's own synchronized_standby_slots: that path, there.
		if ($primary->safe_psql('postgres', 'SHOW server_version_num') >= 170000)
		{
			set_and_reload($primary, "synchronized_standby_slots = '$slot'");
			ok(wait_for_query($primary, 'SHOW synchronized_standby_slots', $slot, 10),
				"$scenario: PostgreSQL's own synchronized_standby_slots names the slot too");
		}
	}
	@topics = new_topics();
	($load, $acknowledged) = start_failover_load($primary, $standby, \@topics,
		$synchronized ? 'slots' : 'async', 8);
	ok(wait_for_query($primary, 'SELECT published > 100 FROM outbox_worker', 't', 30),
		"$scenario: the primary publishes under load");
	check_standby_quiet($standby);

	my $walreceiver = walreceiver_pid($standby);
	kill 'STOP', $walreceiver or die "cannot stop the walreceiver: $!";
	push @frozen, $walreceiver;
	my $thaw_at = time() + $freeze_s;
	$primary->safe_psql('postgres',
		"CREATE TABLE filler_$synchronized AS SELECT repeat('x', 1000) AS x FROM generate_series(1, $filler_rows)");
	if ($synchronized)
	{
		ok(wait_for_query($primary, 'SELECT state FROM outbox_worker', 'waiting for standby', $freeze_s),
			"$scenario: the worker waits for the frozen standby");
		my $published = $primary->safe_psql('postgres', 'SELECT published FROM outbox_worker');
		sleep($thaw_at - time()) if time() < $thaw_at;
		is($primary->safe_psql('postgres', 'SELECT state, published FROM outbox_worker'),
			"waiting for standby|$published", "$scenario: and publishes nothing meanwhile");
	}
	else
	{
		sleep($thaw_at - time()) if time() < $thaw_at;
	}
	kill_primary($primary, $scenario);
	kill 'CONT', $walreceiver;
	@frozen = ();
	promote_and_time($standby, $scenario);
	finish_load($load);
	my $result = fault_check($standby, scenario => $scenario, topics => \@topics, crashes => 1,
		acknowledged => $acknowledged, acknowledged_may_be_lost => 1,
		phantoms_expected => !$synchronized, idle => 3);
	$phantoms{$synchronized} = $result->{phantom};
	diag(sprintf('%s: %d acknowledged transactions lost by the failover, %d messages in Kafka that the new primary lacks (phantoms), %d duplicates; %.1f s',
			$scenario, $result->{acknowledged_lost}, $result->{phantom}, $result->{duplicates},
			time() - $t_scenario));
	cmp_ok($result->{acknowledged_lost}, '>', 0,
		"$scenario: the frozen standby lacks acknowledged transactions");
}
# The filler leaves the standby behind by more than the connection buffers,
# and the worker publishes within milliseconds of a commit: so without the
# setting some of what the standby lacks has been published.
cmp_ok($phantoms{0}, '>', 0, 'asynchronous failover: phantoms without the setting');

# 4. a slot that does not exist: nothing is published until the setting is cleared
$t_scenario = time();
$scenario = 'synchronized_standby_slots: missing slot';
$primary = $standby;
my ($topic) = new_topics();
set_and_reload($primary, "outbox.synchronized_standby_slots = 'no_such_slot'");
my $published = $primary->safe_psql('postgres', 'SELECT published FROM outbox_worker');
enqueue_backlog($primary, $topic, 100);
ok(wait_for_query($primary, q{SELECT state, last_error LIKE '%"no_such_slot"%does not exist%' FROM outbox_worker},
		'waiting for standby|t', 30),
	"$scenario: outbox_worker says the worker waits, and why");
is($primary->safe_psql('postgres',
		"SELECT (SELECT published FROM outbox_worker), count(*) FROM outbox_message WHERE topic = '$topic'"),
	"$published|100", "$scenario: nothing is published");
# by now the wait has looked at the slots many times: one WARNING still
my $log = slurp_file($primary->logfile);
my $warnings = () = $log =~ /WARNING:  outbox: replication slot "no_such_slot" of outbox.synchronized_standby_slots does not exist/g;
is($warnings, 1, "$scenario: one WARNING in the log");
like($log, qr/HINT:  Create it with pg_create_physical_replication_slot\('no_such_slot', true\)/,
	"$scenario: with a HINT");
set_and_reload($primary, "outbox.synchronized_standby_slots = ''");
fault_check($primary, scenario => $scenario, topics => [$topic], idle => 2);
diag(sprintf('%s: %.1f s', $scenario, time() - $t_scenario));

# 5. a logical slot; then DROP EXTENSION while the worker waits
$scenario = 'synchronized_standby_slots: logical slot';
$primary->safe_psql('postgres',
	"SELECT pg_create_logical_replication_slot('outbox_logical', 'test_decoding')");
set_and_reload($primary, "outbox.synchronized_standby_slots = 'outbox_logical'");
$primary->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'after the logical slot'::text)");
ok(wait_for_query($primary, q{SELECT state, last_error LIKE '%"outbox_logical"%is a logical slot%' FROM outbox_worker},
		'waiting for standby|t', 30),
	"$scenario: the worker waits, and outbox_worker says why");
like(slurp_file($primary->logfile),
	qr/WARNING:  outbox: replication slot "outbox_logical" of outbox.synchronized_standby_slots is a logical slot/,
	"$scenario: a WARNING in the log");

# a physical slot whose WAL a checkpoint gave up (max_slot_wal_keep_size)
set_and_reload($primary, "max_slot_wal_keep_size = '1MB'");
$primary->safe_psql('postgres', "SELECT pg_create_physical_replication_slot('outbox_lost', true)");
$primary->safe_psql('postgres',
	"CREATE TABLE IF NOT EXISTS filler_lost (x text); INSERT INTO filler_lost VALUES ('x'); SELECT pg_switch_wal()")
  for 1 .. 2;
$primary->safe_psql('postgres', 'CHECKPOINT');
is($primary->safe_psql('postgres', "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'outbox_lost'"),
	'lost', "$scenario: the checkpoint invalidated the slot outbox_lost");
set_and_reload($primary, "outbox.synchronized_standby_slots = 'outbox_lost'");
ok(wait_for_query($primary, q{SELECT state, last_error LIKE '%"outbox_lost"%has been invalidated%' FROM outbox_worker},
		'waiting for standby|t', 30),
	"$scenario: an invalidated slot: the worker waits, and outbox_worker says why");

my $t_drop = time();
$primary->safe_psql('postgres', 'DROP EXTENSION outbox');
ok(publishers_gone($primary),
	"$scenario: DROP EXTENSION during the wait ends the worker");
diag(sprintf('%s: DROP EXTENSION to the worker gone: %.1f s', $scenario, time() - $t_drop));
$primary->safe_psql('postgres', "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN ('outbox_logical', 'outbox_lost')");

for my $node (@nodes)
{
	is(worker_exits($node), 0, $node->name . ': no worker of the extension crashed or failed');
}
$primary->stop('fast');
diag(sprintf('021_fault_failover: %.1f s', time() - $t_start));
done_testing();

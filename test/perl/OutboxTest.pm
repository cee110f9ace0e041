# OutboxTest: what the TAP tests of the outbox worker share.
#
# The tests run against the real Apache Kafka broker that test/run-tests
# starts (test/kafka/broker.sh); they find it through OUTBOX_KAFKA_BROKERS
# and KAFKA_PORT.  A test that runs a cluster of its own (cluster_ctl) sets
# $OutboxTest::brokers to its bootstrap list, and every helper here then
# uses that instead.  Each test uses topics of its own, named uniquely, so a
# broker that already holds older runs' messages does not confuse it.
package OutboxTest;

use strict;
use warnings;

use Exporter 'import';
use File::Basename qw(dirname);
use File::Spec;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

our @EXPORT = qw(brokers outbox_node unique_topic consume_topics wait_for_query
  broker_ctl cluster_ctl kafka_admin message_id_header run_pgbench inbox_check
  start_pgbench finish_pgbench start_load finish_load fault_check worker_exits
  backlog_drain_time enqueue_backlog refusing_topics committed_late
  check_delivery slow_tests publishers_gone publisher_pid pause_publisher
  exactly_once_crashes exactly_once_row);

my $kafka_dir = File::Spec->rel2abs(dirname(__FILE__) . '/../kafka');
my $fault_dir = File::Spec->rel2abs(dirname(__FILE__) . '/../fault');

our $brokers;

# The slowest scenarios of the fault suite run only with OUTBOX_SLOW_TESTS=1
# (bash test/run-tests passes it on), so that the whole suite stays within
# CI's time: test/t/010's broker outage of 2 minutes, 020's rolling restart.
sub slow_tests
{
	my ($what) = @_;
	return 1 if $ENV{OUTBOX_SLOW_TESTS};
	diag("not run without OUTBOX_SLOW_TESTS=1: $what");
	return 0;
}

sub brokers
{
	return $brokers // $ENV{OUTBOX_KAFKA_BROKERS} // '127.0.0.1:' . ($ENV{KAFKA_PORT} // 19092);
}

# A started cluster with outbox preloaded, its workers pointed at the test
# broker, and (unless told otherwise) the extension created in postgres.
# init holds options for PostgreSQL::Test::Cluster's init (allows_streaming).
sub outbox_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);

	$node->init(%{ $opts{init} // {} });
	$node->append_conf('postgresql.conf', join("\n",
		"shared_preload_libraries = 'outbox'",
		"outbox.brokers = '" . brokers() . "'",
		$opts{conf} // ''));
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION outbox')
	  unless $opts{no_extension};
	return $node;
}

my $topic_counter = 0;

sub unique_topic
{
	my ($prefix) = @_;
	return sprintf('%s.%d.%d.%d', $prefix, $$, int(time()), ++$topic_counter);
}

# Two new topics that refuse records for good: the first any record over
# 200 bytes (dead-lettered at once), the second any record older than the
# broker's clock (retried until its message.timestamp.before.max.ms is
# raised).  Enqueue to the second with committed_late(): a record whose
# timestamp is the broker's own millisecond is not older than its clock.
sub refusing_topics
{
	my ($prefix) = @_;
	my ($small, $stale) = (unique_topic("$prefix.small"), unique_topic("$prefix.stale"));
	kafka_admin('create-topic', $small, '--config', 'max.message.bytes=200');
	kafka_admin('create-topic', $stale, '--config', 'message.timestamp.before.max.ms=0');
	return ($small, $stale);
}

# The SQL in one transaction that commits a few milliseconds after it ran:
# a record it enqueues is then older than the broker's clock when it
# arrives, however fast the worker publishes it.
sub committed_late
{
	my ($sql) = @_;
	return "BEGIN;\n$sql;\nDO 'BEGIN PERFORM pg_catalog.pg_sleep(0.005); END';\nCOMMIT;";
}

# Every record of the topics, read from the beginning, as hashes (see
# test/kafka/consume.py), once $expect have arrived or nothing more came.
# With digest => 1 each value comes as its md5 and length; with
# read_uncommitted => 1 the records of aborted transactions come too.
sub consume_topics
{
	my (%args) = @_;
	my @cmd = ('/usr/bin/python3', "$kafka_dir/consume.py", '--brokers', brokers(),
		'--timeout', $args{timeout} // 60);
	push @cmd, map { ('--topic', $_) } @{ $args{topics} };
	push @cmd, '--expect', $args{expect} if defined $args{expect};
	push @cmd, '--idle', $args{idle} if defined $args{idle};
	push @cmd, '--digest' if $args{digest};
	push @cmd, '--read-uncommitted' if $args{read_uncommitted};

	my ($stdout, $stderr);
	IPC::Run::run(\@cmd, '>', \$stdout, '2>', \$stderr)
	  or die "consume.py failed: $stderr";
	my @records = map { decode_json($_) } grep { /\S/ } split /\n/, $stdout;
	# What the consumer met while it waited (broker errors, its timeout)
	# tells a slow delivery from a lost one.
	diag("consume.py: $stderr")
	  if defined $args{expect} && @records < $args{expect} && $stderr ne '';
	return \@records;
}

# What Apache Kafka's own console consumer (kafka-console-consumer, a Java
# client no one here wrote) reads of a topic from its beginning, with this
# isolation level: the outbox-message-id of each record, in its order.
sub console_consume
{
	my ($topic, $isolation) = @_;
	my $out = kafka_script('broker.sh', 'console-consumer', '--bootstrap-server', brokers(),
		'--topic', $topic, '--from-beginning', '--isolation-level', $isolation,
		'--timeout-ms', 10000, '--property', 'print.headers=true',
		'--property', 'print.value=false');
	return [ $out =~ /outbox-message-id:([0-9a-f-]{36})/g ];
}

sub message_id_header
{
	my ($record) = @_;
	my @ids = map { $_->[1] } grep { $_->[0] eq 'outbox-message-id' } @{ $record->{headers} };
	return $ids[0];
}

# Poll a query until it returns $expected, with a deadline; true if it did.
# A query that fails (the server restarts, say) counts as not yet.
sub wait_for_query
{
	my ($node, $query, $expected, $timeout, $db) = @_;
	my $deadline = time() + ($timeout // $PostgreSQL::Test::Utils::timeout_default);
	while (time() < $deadline)
	{
		# psql may not even read its query while the server restarts
		my ($ret, $result) = eval { $node->psql($db // 'postgres', $query) };
		return 1 if defined $ret && $ret == 0 && $result eq $expected;
		sleep(0.1);
	}
	return 0;
}

# Run a pgbench script (text) against the node's postgres database; returns
# pgbench's output.  -n: no vacuum of pgbench's own tables, which do not exist.
sub run_pgbench
{
	my ($node, $script, @args) = @_;
	my $file = PostgreSQL::Test::Utils::tempdir() . '/script.sql';
	PostgreSQL::Test::Utils::append_to_file($file, $script);
	my ($stdout, $stderr);
	IPC::Run::run([ 'pgbench', '-n', '-f', $file, @args, '-d', $node->connstr('postgres') ],
		'>', \$stdout, '2>', \$stderr)
	  or die "pgbench failed: $stderr";
	return $stdout;
}

# The same, in the background, writing its output to a file that
# finish_pgbench() shows.
sub start_pgbench
{
	my ($node, $script, @args) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir();
	PostgreSQL::Test::Utils::append_to_file("$dir/script.sql", $script);
	my $handle = IPC::Run::start(
		[ 'pgbench', '-n', '-f', "$dir/script.sql", @args, '-d', $node->connstr('postgres') ],
		'<', \undef, '>', "$dir/out", '2>', "$dir/out");
	return { handle => $handle, out => "$dir/out" };
}

sub finish_pgbench
{
	my ($load) = @_;
	my $ok = $load->{handle}->finish;
	my $out = PostgreSQL::Test::Utils::slurp_file($load->{out});
	note($out);
	die "pgbench failed:\n$out" unless $ok;
	return $out;
}

# Compare what Kafka holds with what the database committed.  $committed
# maps each committed message_id to [key, id]; returns the numbers of lost,
# phantom (published, never committed), duplicate and out-of-order messages:
# per key, the first occurrences must come in id order.
sub check_delivery
{
	my ($records, $committed) = @_;
	my (%seen, %last_id_of_key);
	my ($phantom, $duplicates, $order_faults) = (0, 0, 0);

	for my $record (@$records)
	{
		my $message_id = message_id_header($record);
		if (!defined $message_id || !exists $committed->{$message_id})
		{
			$phantom++;
			next;
		}
		if ($seen{$message_id}++)
		{
			$duplicates++;
			next;
		}
		my ($key, $id) = @{ $committed->{$message_id} };
		next if !defined $key || $key eq '';
		$key = "$record->{topic}/$key";    # order is promised per (topic, key)
		$order_faults++ if exists $last_id_of_key{$key} && $last_id_of_key{$key} > $id;
		$last_id_of_key{$key} = $id;
	}
	my $lost = grep { !$seen{$_} } keys %$committed;
	return { lost => $lost, phantom => $phantom, duplicates => $duplicates,
		order_faults => $order_faults };
}

# Start the fault tests' steady load (test/fault/load.py) on the node: 8
# sessions by default, one transaction in ten rolled back; each committed
# message is also logged in fault_log, which this creates.  dsn replaces
# the node's own (to follow a failover); acknowledged names a file that
# receives each message whose COMMIT returned (see load.py).
sub start_load
{
	my ($node, %args) = @_;
	my $db = $args{db} // 'postgres';
	$node->safe_psql($db,
		'CREATE TABLE IF NOT EXISTS fault_log (id bigint, message_id uuid, topic text, key text)');
	my @cmd = ('/usr/bin/python3', "$fault_dir/load.py", '--dsn', $args{dsn} // $node->connstr($db),
		'--clients', $args{clients} // 8, '--rate', $args{rate} // 200,
		'--duration', $args{duration} // 30);
	push @cmd, map { ('--topic', $_) } @{ $args{topics} };
	push @cmd, '--acknowledged', $args{acknowledged} if $args{acknowledged};
	my $out = '';
	my $handle = IPC::Run::start(\@cmd, '<', \undef, '>', \$out, '2>', \$out);
	return { handle => $handle, out => \$out };
}

sub finish_load
{
	my ($load) = @_;
	$load->{handle}->finish or die "load.py failed: ${ $load->{out} }";
	note("load: ${ $load->{out} }");
	return ${ $load->{out} };
}

# Commit a backlog of $count messages to $topic in one transaction, over 100
# keys, and log them in fault_log (see start_load), in postgres or $db: it
# keeps the worker busy, so that a fault comes mid-batch.
sub enqueue_backlog
{
	my ($node, $topic, $count, $db) = @_;
	$node->safe_psql($db // 'postgres', qq{
		BEGIN;
		SELECT count(outbox_enqueue('$topic', json_build_object('n', i)::jsonb, 'bulk-' || (i % 100)))
		  FROM generate_series(1, $count) i;
		INSERT INTO fault_log SELECT id, message_id, topic, key FROM outbox_message WHERE topic = '$topic';
		COMMIT;
	});
}

# End a fault by running $end_fault (if given), and return the seconds from
# then until every message committed before then has left the outbox
# (delivered or dead-lettered), while the load goes on.
sub backlog_drain_time
{
	my ($node, $end_fault, $db) = @_;
	my $t0 = time();
	$end_fault->() if $end_fault;
	wait_for_query($node,
		"SELECT count(*) FROM outbox_message WHERE state <> 'sent' AND created_at <= to_timestamp($t0)",
		'0', 300, $db)
	  or die 'the backlog did not drain within 300 s';
	return time() - $t0;
}

# The messages load.py acknowledged to the application (its acknowledged
# file), as message_id => [topic, key].
sub acknowledged_messages
{
	my ($file) = @_;
	return {} unless -e $file;
	return { map { my ($mid, $topic, $key) = split /\t/; ($mid => [ $topic, $key ]) }
		  split /\n/, PostgreSQL::Test::Utils::slurp_file($file) };
}

# The fault suite's verdict on one scenario: wait until the outbox is empty,
# then compare all of Kafka's records on the topics (read until nothing more
# comes, since duplicates may make them more than committed) with fault_log (what the
# database committed) and outbox_dead_letter.  Checks lost = 0, phantom = 0
# and order faults = 0, reports duplicates, and appends a row to the
# suite's report (tmp_check/fault_report.txt).
#
# After a failover $node is the promoted standby, and its fault_log what it
# has of the old primary's commits.  acknowledged (a file of start_load's)
# is what the application was told had committed: the acknowledged messages
# $node lacks (lost by the failover, before any publishing) are counted,
# and must be none unless acknowledged_may_be_lost.  phantoms_expected says
# that $node lacks transactions whose messages were published (asynchronous
# replication without outbox.synchronized_standby_slots): their number is
# reported, not checked, and so are the duplicates of the messages published
# whose deletes $node lacks.
#
# With exactly_once (outbox.delivery = exactly_once) the duplicates that a
# read_committed consumer sees must be none; the topics are read again with
# read_uncommitted, and what that reader sees twice (the messages of aborted
# transactions) is reported in the row, not checked.
sub fault_check
{
	my ($node, %args) = @_;
	my $scenario = $args{scenario};
	my $db = $args{db} // 'postgres';
	my $topics = join(',', map { "'$_'" } @{ $args{topics} });
	my $t0 = time();
	ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE state <> 'sent' AND topic IN ($topics)",
			'0', 180, $db),
		"$scenario: the outbox drains");
	my $drain_s = $args{drain_s} // time() - $t0;

	my %committed = map { my ($mid, $key, $id) = split /\|/; ($mid => [ $key, $id ]) }
	  split /\n/, $node->safe_psql($db, "SELECT message_id, key, id FROM fault_log WHERE topic IN ($topics)");
	my %dead = map { ($_ => 1) }
	  split /\n/, $node->safe_psql($db, 'SELECT message_id FROM outbox_dead_letter');
	my %expected = map { ($_ => $committed{$_}) } grep { !$dead{$_} } keys %committed;

	my $excused = $args{excused} // {};
	my $records = [ grep { !$excused->{ message_id_header($_) // '' } }
		  @{ consume_topics(topics => $args{topics}, idle => $args{idle} // 5, timeout => 180) } ];
	my $result = check_delivery($records, \%expected);
	my $row = sprintf("%-44s %9d %5d %7d %12d %10d %8.1f",
		$scenario, scalar(keys %committed), $result->{lost}, $result->{phantom},
		$result->{order_faults}, $result->{duplicates}, $drain_s);
	if ($args{exactly_once})
	{
		my $uncommitted = check_delivery(
			consume_topics(topics => $args{topics}, idle => 5, timeout => 180, read_uncommitted => 1),
			\%expected);
		$result->{uncommitted_duplicates} = $uncommitted->{duplicates};
		$row .= sprintf("   read_uncommitted: %d twice", $uncommitted->{duplicates});
	}
	if ($args{console_consumer})
	{
		my @ids = map { @{ console_consume($_, 'read_committed') } } @{ $args{topics} };
		my %distinct = map { ($_ => 1) } @ids;
		$row .= sprintf("   kafka-console-consumer: %d records, %d distinct", scalar(@ids),
			scalar(keys %distinct));
		is(scalar(@ids), scalar(@$records),
			"$scenario: Kafka's console consumer reads as many records as the checker");
		is(scalar(keys %distinct), scalar(@ids), "$scenario: and none of them twice");
	}
	diag($row);
	PostgreSQL::Test::Utils::append_to_file("$PostgreSQL::Test::Utils::tmp_check/fault_report.txt", "$row\n");

	cmp_ok(scalar(keys %committed), '>', 0, "$scenario: messages were committed under load");
	is($result->{lost}, 0, "$scenario: nothing lost");
	is($result->{order_faults}, 0, "$scenario: per-key order kept");
	if ($args{acknowledged})
	{
		my %wanted = map { ($_ => 1) } @{ $args{topics} };
		my $acknowledged = acknowledged_messages($args{acknowledged});
		my @acknowledged = grep { $wanted{ $acknowledged->{$_}[0] } } keys %$acknowledged;
		$result->{acknowledged} = scalar(@acknowledged);
		$result->{acknowledged_lost} = grep { !exists $committed{$_} } @acknowledged;
		diag("$scenario: $result->{acknowledged} acknowledged to the application, "
			  . "$result->{acknowledged_lost} of them missing after the failover");
		cmp_ok($result->{acknowledged}, '>', 0, "$scenario: messages were acknowledged");
		is($result->{acknowledged_lost}, 0, "$scenario: every acknowledged message survives the failover")
		  unless $args{acknowledged_may_be_lost};
	}
	return $result if $args{phantoms_expected};
	is($result->{phantom}, 0, "$scenario: nothing phantom");
	if ($args{exactly_once})
	{
		is($result->{duplicates}, 0, "$scenario: no duplicate for a read_committed consumer");
	}
	else
	{
		cmp_ok($result->{duplicates}, '<=', ($args{crashes} // 0) * 1000,
			"$scenario: duplicates within one batch per crash");
	}
	return $result;
}

# The publisher's pid: the outbox worker of the node's postgres database.
sub publisher_pid
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox worker'");
}

# Pause the node's publisher at $point of its next batch
# (outbox_simulate_pause()); returns once it is there.
sub pause_publisher
{
	my ($node, $point) = @_;
	$node->safe_psql('postgres', "SELECT outbox_simulate_pause('$point')");
	ok(wait_for_query($node,
			"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox worker'"
			  . " AND query = 'outbox: paused $point'",
			'1', 60),
		"the publisher pauses at $point");
}

# The crashes of the exactly-once fault rows, by name, for a publisher
# paused on $node; each ends the pause, by the crash or after it.  A
# broker's crash is kill_broker's, given a sub that ends the pause (by
# default the test broker's SIGKILL, back 2 s later, and then the pause
# ended).
sub exactly_once_crashes
{
	my ($node, %args) = @_;
	my $resume = sub { $node->safe_psql('postgres', "SELECT outbox_simulate_pause('none')") };
	my $kill_broker = $args{kill_broker} // sub {
		my ($resume) = @_;
		broker_ctl('kill');
		sleep(2);
		broker_ctl('start');
		$resume->();
	};
	return {
		'worker SIGKILL' => sub {
			my $pid = publisher_pid($node);
			kill 'KILL', $pid or die "cannot kill the worker: $!";
			ok(wait_for_query($node,
					"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox worker' AND pid <> $pid",
					'1', 120),
				'a new publisher starts');
		},
		'Kafka process SIGKILL' => sub {
			my $pid = publisher_pid($node);
			my $kafka = `pgrep -P $pid -x outbox_kafka`;
			chomp $kafka;
			ok($kafka =~ /^\d+$/, 'the publisher has a Kafka process') or return;
			kill 'KILL', $kafka or die "cannot kill the Kafka process: $!";
			$resume->();
		},
		'pg_ctl stop -m immediate' => sub {
			$node->stop('immediate');
			$node->start;
		},
		'broker SIGKILL' => sub { $kill_broker->($resume) },
	};
}

# One row of the exactly-once fault suite, named $args{scenario}: under
# load on a new topic (made with topic_options), the publisher paused at
# $args{point}, the crash $args{crash} of $args{crashes}, and
# fault_check's verdict with duplicates counted under read_committed.  Returns whether the server's
# log says the next start recorded a transaction Kafka had committed.
sub exactly_once_row
{
	my ($node, %args) = @_;
	my $scenario = $args{scenario};
	my @topics = (unique_topic('fault.eos'));
	kafka_admin('create-topic', $_, @{ $args{topic_options} // [ '--partitions', 3 ] }) for @topics;

	my $log_offset = -s $node->logfile;
	my $load = start_load($node, topics => \@topics, duration => 12);
	sleep(2);
	pause_publisher($node, $args{point});
	my $drain_s = backlog_drain_time($node, $args{crashes}{ $args{crash} });
	finish_load($load);
	fault_check($node, scenario => $scenario, topics => \@topics, drain_s => $drain_s,
		crashes => 1, exactly_once => 1, console_consumer => $args{console_consumer});
	return slurp_file($node->logfile, $log_offset) =~
	  /committed before the publisher restarted are recorded as delivered/;
}

# The inbox's verdict on one scenario: what database $a_db of $a committed
# (fault_log, see start_load) against what the inbox applied in database
# $b_db of $b (the table inbox_applied, one row per handler call, in
# order: seq, message_id, key).  Waits until every committed message (but
# those in A's outbox_dead_letter) is applied; checks lost 0, applied twice
# 0, phantom 0 and per-key order; appends a row to the fault report.  The
# messages of the keys in dead_keys are to be in B's inbox_dead_letter
# instead, each once, and none applied.  skipped, if given, returns how
# many duplicates the inbox skipped, for the report.  Returns the counts.
sub inbox_check
{
	my ($a, $b, %args) = @_;
	my $scenario = $args{scenario};
	my ($a_db, $b_db) = ($args{a_db} // 'postgres', $args{b_db} // 'postgres');
	my $topics = join(',', map { "'$_'" } @{ $args{topics} });
	my %committed = map { my ($mid, $key, $id) = split /\|/; ($mid => [ $key, $id ]) }
	  split /\n/, $a->safe_psql($a_db, qq{
		SELECT message_id, key, id FROM fault_log WHERE topic IN ($topics)
		   AND message_id NOT IN (SELECT message_id FROM outbox_dead_letter)});
	my %dead_key = map { ($_ => 1) } @{ $args{dead_keys} // [] };
	my @to_be_dead = grep { $dead_key{ $committed{$_}[0] // '' } } keys %committed;
	delete @committed{@to_be_dead};
	my $count = scalar(keys %committed);
	ok(wait_for_query($b, "SELECT count(DISTINCT message_id) >= $count FROM inbox_applied", 't', 180, $b_db),
		"$scenario: the inbox applies every committed message");
	if (@to_be_dead)
	{
		my $ids = join(',', map { "'$_'" } @to_be_dead);
		ok(wait_for_query($b, "SELECT count(DISTINCT message_id) FROM inbox_dead_letter WHERE message_id IN ($ids)",
				scalar(@to_be_dead), 180, $b_db),
			"$scenario: each message of the failing keys is dead-lettered");
	}

	my (%applied, %last_id_of_key);
	my ($twice, $phantom, $order_faults) = (0, 0, 0);
	for my $row (split /\n/, $b->safe_psql($b_db, 'SELECT message_id, key FROM inbox_applied ORDER BY seq'))
	{
		my ($mid, $key) = split /\|/, $row;
		if (!exists $committed{$mid})
		{
			$phantom++;
			next;
		}
		if ($applied{$mid}++)
		{
			$twice++;
			next;
		}
		next if !defined $key || $key eq '';
		$order_faults++ if exists $last_id_of_key{$key} && $last_id_of_key{$key} > $committed{$mid}[1];
		$last_id_of_key{$key} = $committed{$mid}[1];
	}
	my $lost = grep { !$applied{$_} } keys %committed;
	my $row = sprintf("%-44s %9d %5d %7d %12d %10d", "inbox: $scenario", $count, $lost, $phantom,
		$order_faults, $twice);
	my $skipped = ref $args{skipped} ? $args{skipped}->() : $args{skipped};
	$row .= "   ($skipped received again and skipped)" if defined $skipped;
	diag($row);
	PostgreSQL::Test::Utils::append_to_file("$PostgreSQL::Test::Utils::tmp_check/fault_report.txt", "$row\n");
	cmp_ok($count, '>', 0, "$scenario: messages were committed under load");
	is($lost, 0, "$scenario: nothing lost");
	is($twice, 0, "$scenario: nothing applied twice");
	is($phantom, 0, "$scenario: nothing applied that was not committed");
	is($order_faults, 0, "$scenario: per-key order kept");
	return { committed => $count, lost => $lost, twice => $twice, phantom => $phantom,
		order_faults => $order_faults };
}

# Wait until no publisher (backend_type "outbox worker") runs on the node,
# in any database; true if none did within the default timeout.
sub publishers_gone
{
	my ($node) = @_;
	return $node->poll_query_until('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox worker'", '0');
}

# How often the node's log says one of the outbox's background workers (the
# launcher, a publisher, a probe) crashed or exited with an error.
sub worker_exits
{
	my ($node) = @_;
	my $log = PostgreSQL::Test::Utils::slurp_file($node->logfile);
	my $exits = () = $log =~ /"outbox (?:launcher|worker|probe)[^"]*" \(PID \d+\) (exited with exit code [1-9]|was terminated by signal)/g;
	# a probe stopped by a shutdown or a restart exits as PostgreSQL's own
	# short-lived workers do, with a FATAL and code 1: that is no failure.
	# Counted by pid: a second SIGTERM while it exits logs the FATAL again.
	my %stopped = map { $_ => 1 }
	  $log =~ /\[(\d+)\] FATAL:  terminating background worker "outbox probe[^"]*" due to administrator command/g;
	return $exits - scalar(keys %stopped);
}

# Run one of test/kafka's scripts; returns its output.  Its progress lines
# (standard error) go to the test's log.
sub kafka_script
{
	my ($script, @args) = @_;
	my $stdout;
	IPC::Run::run([ 'bash', "$kafka_dir/$script", @args ], '<', \undef, '>', \$stdout)
	  or die "$script @args failed";
	chomp $stdout;
	return $stdout;
}

# The test broker: broker.sh's commands.
sub broker_ctl
{
	my ($command) = @_;
	return kafka_script('broker.sh', $command);
}

# A three-node cluster of the test's own: cluster.sh's commands, for some
# nodes or all ("cluster_ctl('kill', 2)", "cluster_ctl('start')").
sub cluster_ctl
{
	my (@args) = @_;
	return kafka_script('cluster.sh', @args);
}

sub kafka_admin
{
	my (@args) = @_;
	my ($stdout, $stderr);
	IPC::Run::run([ '/usr/bin/python3', "$kafka_dir/admin.py", '--brokers', brokers(), @args ],
		'>', \$stdout, '2>', \$stderr)
	  or die "admin.py @args failed: $stderr";
	return $stdout;
}

1;

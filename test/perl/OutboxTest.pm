# OutboxTest: what the TAP tests of the outbox worker share.
#
# The tests run against the real Apache Kafka broker that test/run-tests
# starts (test/kafka/broker.sh); they find it through OUTBOX_KAFKA_BROKERS
# and KAFKA_PORT.  Each test uses topics of its own, named uniquely, so a
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
  broker_ctl kafka_admin message_id_header run_pgbench
  start_pgbench finish_pgbench
  check_delivery);

my $kafka_dir = File::Spec->rel2abs(dirname(__FILE__) . '/../kafka');

sub brokers
{
	return $ENV{OUTBOX_KAFKA_BROKERS} // '127.0.0.1:' . ($ENV{KAFKA_PORT} // 19092);
}

# A started cluster with outbox preloaded, the worker pointed at the test
# broker, and (unless told otherwise) the extension created in postgres.
sub outbox_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);

	$node->init;
	$node->append_conf('postgresql.conf', join("\n",
		"shared_preload_libraries = 'outbox'",
		"outbox.brokers = '" . brokers() . "'",
		"outbox.database = 'postgres'",
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

# Every record of the topics, read from the beginning, as hashes (see
# test/kafka/consume.py), once $expect have arrived or nothing more came.
sub consume_topics
{
	my (%args) = @_;
	my @cmd = ('/usr/bin/python3', "$kafka_dir/consume.py", '--brokers', brokers(),
		'--timeout', $args{timeout} // 60);
	push @cmd, map { ('--topic', $_) } @{ $args{topics} };
	push @cmd, '--expect', $args{expect} if defined $args{expect};
	push @cmd, '--idle', $args{idle} if defined $args{idle};

	my ($stdout, $stderr);
	IPC::Run::run(\@cmd, '>', \$stdout, '2>', \$stderr)
	  or die "consume.py failed: $stderr";
	return [ map { decode_json($_) } grep { /\S/ } split /\n/, $stdout ];
}

sub message_id_header
{
	my ($record) = @_;
	my @ids = map { $_->[1] } grep { $_->[0] eq 'outbox-message-id' } @{ $record->{headers} };
	return $ids[0];
}

# Poll a query until it returns $expected, with a deadline; true if it did.
sub wait_for_query
{
	my ($node, $query, $expected, $timeout) = @_;
	return $node->poll_query_until('postgres', $query, $expected)
	  if !defined $timeout;
	my $deadline = time() + $timeout;
	while (time() < $deadline)
	{
		my $result = $node->safe_psql('postgres', $query);
		return 1 if $result eq $expected;
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
		$order_faults++ if exists $last_id_of_key{$key} && $last_id_of_key{$key} > $id;
		$last_id_of_key{$key} = $id;
	}
	my $lost = grep { !$seen{$_} } keys %$committed;
	return { lost => $lost, phantom => $phantom, duplicates => $duplicates,
		order_faults => $order_faults };
}

sub broker_ctl
{
	my ($command) = @_;
	system("bash", "$kafka_dir/broker.sh", $command) == 0
	  or die "broker.sh $command failed";
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

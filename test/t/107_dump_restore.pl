# pg_dump and pg_restore keep every message, its id and its order, in each
# path users take (issue 9 found ids handed out again after one of them):
#
#   A. pg_dump -Fc of the database, pg_restore into a new one;
#   B. the same dump restored schema first (--schema-only), data after
#      (--data-only);
#   C. pg_dumpall, run by psql in a fresh cluster.
#
# The dumps are taken while enqueues run (test/fault/load.py), with messages
# pending (the worker cannot reach Kafka meanwhile), one retrying and three
# dead-lettered.  Each restore goes to a cluster of its own whose worker
# serves the restored database, first kept from Kafka: the restored outbox
# holds exactly the messages the dump's fault_log says were committed (with
# their ids and states), the dead letters are the source's, and
# outbox_enqueue() works, with ids above every restored message and dead
# letter.  Then Kafka is let in, and every message is delivered once, in id
# order per key.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $unreachable = '127.0.0.1:1';
my $conf = join("\n",
	"outbox.database = 'shop'",
	"outbox.max_attempts = 1000",
	"outbox.retry_backoff_base = '1s'",
	"outbox.retry_backoff_max = '2s'");

my $load_topic = unique_topic('restore.load');
kafka_admin('create-topic', $load_topic);
my ($small, $stale) = refusing_topics('restore');

my $source = outbox_node('source', no_extension => 1, conf => $conf);
$source->safe_psql('postgres', 'CREATE DATABASE shop');
$source->safe_psql('shop', 'CREATE EXTENSION outbox');

# Three dead letters and a retrying message, then Kafka out of reach.
my $big = 'x' x 1000;
$source->safe_psql('shop', qq{
	SELECT count(outbox_enqueue('$small', '$big'::text, 'k-small-' || i)) FROM generate_series(1, 3) i;
	SELECT outbox_enqueue('$stale', 'retrying'::text, 'k-stale');
});
ok(wait_for_query($source,
		"SELECT (SELECT count(*) FROM outbox_dead_letter) || '/' || (SELECT string_agg(state, ',') FROM outbox_message)",
		'3/retrying', 60, 'shop'),
	'source: three dead letters, one message retrying');
$source->safe_psql('shop', "ALTER SYSTEM SET outbox.brokers = '$unreachable'; SELECT pg_reload_conf()");
ok(wait_for_query($source, 'SELECT state FROM outbox_worker', 'waiting for brokers', 30, 'shop'),
	'source: the worker waits for brokers');

# The dumps, while enqueues run.
my $dir = PostgreSQL::Test::Utils::tempdir();
my $load = start_load($source, db => 'shop', topics => [$load_topic], clients => 4, rate => 100,
	duration => 12);
ok(wait_for_query($source, 'SELECT count(*) > 200 FROM fault_log', 't', 30, 'shop'),
	'source: enqueues are running');
command_ok([ 'pg_dump', '-Fc', '-f', "$dir/shop.dump", '-d', $source->connstr('shop') ],
	'pg_dump -Fc under load');
command_ok([ 'pg_dumpall', '-f', "$dir/all.sql", '-d', $source->connstr('postgres') ],
	'pg_dumpall under load');
finish_load($load);
my $dead_letters_query =
  'SELECT id, message_id, topic, key, md5(payload), attempts, created_at, failed_at, error FROM outbox_dead_letter ORDER BY id';
my $source_dead_letters = $source->safe_psql('shop', $dead_letters_query);
$source->stop('fast');

my %restore = (
	'A. pg_restore' => sub {
		my ($node) = @_;
		$node->safe_psql('postgres', 'CREATE DATABASE shop');
		command_ok([ 'pg_restore', '-d', $node->connstr('shop'), "$dir/shop.dump" ],
			'A. pg_restore: restored');
	},
	'B. schema, then data' => sub {
		my ($node) = @_;
		$node->safe_psql('postgres', 'CREATE DATABASE shop');
		command_ok([ 'pg_restore', '--schema-only', '-d', $node->connstr('shop'), "$dir/shop.dump" ],
			'B. schema, then data: schema restored');
		command_ok([ 'pg_restore', '--data-only', '-d', $node->connstr('shop'), "$dir/shop.dump" ],
			'B. schema, then data: data restored');
	},
	'C. pg_dumpall' => sub {
		my ($node) = @_;
		# The one error allowed: the bootstrap role exists already.
		my ($stdout, $stderr);
		IPC::Run::run([ 'psql', '-X', '-f', "$dir/all.sql", '-d', $node->connstr('postgres') ],
			'>', \$stdout, '2>', \$stderr);
		my @errors = grep { !/role "\w+" already exists/ } grep { /ERROR/ } split /\n/, $stderr;
		is_deeply(\@errors, [], 'C. pg_dumpall: restored by psql without an error');
	});

my $kafka_records = 0;
for my $path (sort keys %restore)
{
	my $node = outbox_node(lc(substr($path, 0, 1)) . '_restored', no_extension => 1,
		conf => "$conf\noutbox.brokers = '$unreachable'");
	$restore{$path}->($node);

	# What the dump says was committed, each message with its key and id.
	my %committed = map { my ($mid, $key, $id) = split /\|/; ($mid => [ $key, $id ]) }
	  split /\n/, $node->safe_psql('shop', 'SELECT message_id, key, id FROM fault_log');
	cmp_ok(scalar(keys %committed), '>', 200, "$path: the dump holds the enqueues that had committed");
	is($node->safe_psql('shop', qq{
			SELECT count(*)
			  FROM (SELECT message_id, id, key FROM outbox_message
			         WHERE topic = '$load_topic' AND state = 'pending') m
			       FULL JOIN fault_log f USING (message_id, id, key)
			 WHERE m.id IS NULL OR f.id IS NULL}),
		'0', "$path: every committed message is restored pending, with its id and key");
	is($node->safe_psql('shop', 'SELECT topic, key, state, attempts > 0 FROM outbox_message WHERE key = \'k-stale\''),
		"$stale|k-stale|retrying|t", "$path: the retrying message is restored retrying");
	is($node->safe_psql('shop', $dead_letters_query), $source_dead_letters, "$path: the dead letters are kept");

	my $highest = $node->safe_psql('shop',
		'SELECT greatest((SELECT max(id) FROM outbox_message), (SELECT max(id) FROM outbox_dead_letter))');
	my ($ret, $new_ids, $stderr) = $node->psql('shop', qq{
		SELECT outbox_enqueue('$load_topic', 'after the restore'::text, 'k-new');
		INSERT INTO outbox_message (topic, key, payload) VALUES ('$load_topic', 'k-new', 'inserted after the restore')
		RETURNING id;});
	is($stderr, '', "$path: outbox_enqueue() and INSERT work after the restore");
	my @new_ids = split /\n/, $new_ids;
	ok(@new_ids == 2 && $new_ids[0] > $highest && $new_ids[1] > $new_ids[0],
		"$path: new ids (@new_ids) are above every restored message and dead letter ($highest)");
	%committed = (%committed, map { my ($mid, $key, $id) = split /\|/; ($mid => [ $key, $id ]) }
		  split /\n/, $node->safe_psql('shop', "SELECT message_id, key, id FROM outbox_message WHERE key = 'k-new'"));

	# Kafka let in: everything is delivered, once, in order.  Each path
	# publishes the same messages again, so only its own records count: the
	# topic has one partition, and the earlier paths' records come first.
	# The worker came back to connect once the database was created.
	ok(wait_for_query($node, 'SELECT database, state FROM outbox_worker', 'shop|waiting for brokers', 30, 'shop'),
		"$path: the worker serves the restored database");
	my $exits = worker_exits($node);
	$node->safe_psql('shop', "ALTER SYSTEM SET outbox.brokers = '" . brokers() . "'; SELECT pg_reload_conf()");
	ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE topic = '$load_topic'", '0', 120, 'shop'),
		"$path: the restored outbox drains");
	my $records = consume_topics(topics => [$load_topic], expect => $kafka_records + keys %committed,
		timeout => 60);
	my @mine = grep { $_->{offset} >= $kafka_records } @$records;
	$kafka_records = @$records;
	is_deeply(check_delivery(\@mine, \%committed),
		{ lost => 0, phantom => 0, duplicates => 0, order_faults => 0 },
		"$path: " . scalar(keys %committed) . ' messages delivered once each, in id order per key');
	is($node->safe_psql('shop', 'SELECT count(*) FROM outbox_dead_letter'), '3',
		"$path: the dead letters stay");
	$node->stop('fast');
	is(worker_exits($node), $exits, "$path: the worker never exited after the restore");
}

done_testing();

# pg_upgrade between PostgreSQL majors with the extension installed: the
# installs named in OUTBOX_PG_INSTALLS (each a directory with bin/, the
# extension built and installed into each, in upgrade order: 15, 17, 18), a
# cluster of the first upgraded to the second, then that one to the third.
#
# Before each upgrade the database holds messages in every state: kept as
# sent (outbox.sent_retention), dead-lettered, retrying (a topic refusing
# them), pending and never tried (several keys, several messages each), one
# delayed past the upgrade; and an inbox subscription with its offsets and
# a message waiting to retry (its handler fails for it while a table says
# so), its handler recording every call in a table.  The publisher is kept
# from the brokers while the pending messages are enqueued, and given them
# back in the configuration on disk before the cluster stops, so that a
# worker started by pg_upgrade itself would publish them.
#
# After each upgrade: the extension is at the version it was; pg_upgrade's
# own starts of the servers (binary-upgrade mode) started no worker, and
# every waiting message is as it was (the same ids pending, the same
# attempts); then every waiting message (the retrying ones once their topic
# takes them, the delayed one once due) is in Kafka exactly once, in
# per-key order, and the sent ones are not sent again; the dead letter is
# still there and, requeued, delivered; the inbox subscription is bound to
# its handler's new oid (and the server's log says so), resumes at its
# offsets: every message is applied once, those applied before the upgrade
# not again, in per-key order, and the one waiting to retry is applied once
# its handler stops failing; the views answer.
use strict;
use warnings;

use File::Find;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my @installs = split ' ', ($ENV{OUTBOX_PG_INSTALLS} // '');
plan skip_all => 'OUTBOX_PG_INSTALLS names fewer than two PostgreSQL installs (directories with bin/, '
  . 'the extension installed into each, in upgrade order, e.g. "/usr/lib/postgresql/15 /opt/pg17"): '
  . 'there is nothing to upgrade between'
  if @installs < 2;
for my $install (@installs)
{
	plan skip_all => "OUTBOX_PG_INSTALLS: $install has no bin/pg_upgrade"
	  unless -x "$install/bin/pg_upgrade";
}

# Every message enqueued is logged in expected (message_id, topic, key, id),
# as the fault suite's fault_log is, so that Kafka can be checked against it.
my $unreachable = '127.0.0.1:1';
my $main = unique_topic('pgup.main');
my $inbox_topic = unique_topic('pgup.inbox');
kafka_admin('create-topic', $main, '--partitions', '3');
kafka_admin('create-topic', $inbox_topic, '--partitions', '2');
my @topics = ($main, $inbox_topic);

# A cluster of the install, its settings those of a user of the outbox.
sub new_node
{
	my ($name, $install) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name, install_path => $install);
	# 18's initdb turns data checksums on, which the older clusters lack
	$node->init(extra => $node->pg_version >= 18 ? ['--no-data-checksums'] : []);
	$node->append_conf('postgresql.conf', join("\n",
		"shared_preload_libraries = 'outbox'",
		"outbox.brokers = '" . brokers() . "'",
		"outbox.sent_retention = '1h'",
		"outbox.max_attempts = 1000",
		"outbox.retry_backoff_base = '1s'",
		"outbox.retry_backoff_max = '2s'"));
	return $node;
}

# The extension, the log of what was enqueued, and the inbox: a handler
# that records each call, failing for the keys the table failing names.
sub create_schema
{
	my ($node) = @_;
	$node->safe_psql('postgres', qq{
		CREATE EXTENSION outbox;
		CREATE TABLE expected (message_id uuid PRIMARY KEY, topic text, key text, id bigint);
		CREATE ROLE orders_svc;
		CREATE TABLE applied (seq bigserial PRIMARY KEY, message_id uuid, key text, payload text);
		CREATE TABLE failing (key text PRIMARY KEY);
		GRANT INSERT, SELECT ON applied TO orders_svc;
		GRANT SELECT ON failing TO orders_svc;
		GRANT USAGE ON SEQUENCE applied_seq_seq TO orders_svc;
		CREATE FUNCTION record_order(m inbox_message) RETURNS void LANGUAGE plpgsql AS \$\$
		BEGIN
		    IF EXISTS (SELECT FROM failing f WHERE f.key = m.key) THEN
		        RAISE EXCEPTION 'failing for key %', m.key;
		    END IF;
		    INSERT INTO applied (message_id, key, payload) VALUES (m.message_id, m.key, payload_text(m));
		END \$\$;
		REVOKE EXECUTE ON FUNCTION record_order(inbox_message) FROM PUBLIC;
		GRANT EXECUTE ON FUNCTION record_order(inbox_message) TO orders_svc;
		SELECT outbox_grant_topic('orders_svc', '$inbox_topic', 'subscribe');
		SELECT inbox_subscribe('orders', ARRAY['$inbox_topic'], 'record_order(inbox_message)',
		                       max_attempts => 100000, run_as => 'orders_svc');
	});
}

sub log_expected
{
	my ($node) = @_;
	$node->safe_psql('postgres', q{
		INSERT INTO expected
		SELECT message_id, topic, key, id FROM outbox_message
		UNION ALL
		SELECT message_id, topic, key, id FROM outbox_dead_letter
		ON CONFLICT (message_id) DO NOTHING});
}

# What pg_upgrade must leave as it was: each waiting message's id, state
# and attempts.
sub waiting_messages
{
	my ($node) = @_;
	return $node->safe_psql('postgres', q{
		SELECT string_agg(concat_ws(':', id, state, attempts), ',' ORDER BY id)
		FROM outbox_message WHERE state <> 'sent'});
}

# Hold the publisher back (the brokers unreachable), or let it go.
sub brokers_held
{
	my ($node, $held) = @_;
	$node->safe_psql('postgres', $held
		? "ALTER SYSTEM SET outbox.brokers = '$unreachable'"
		: 'ALTER SYSTEM RESET outbox.brokers');
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
}

# Messages in every state on the old cluster, before upgrade $step.
# Returns what it left waiting.
sub fill
{
	my ($node, $step) = @_;
	my ($small, $stale) = refusing_topics("pgup.$step");
	push @topics, $small, $stale;
	my $big = 'x' x 1000;

	# sent (kept), dead-lettered, retrying; the inbox applies, and fails for one key
	$node->safe_psql('postgres', committed_late(qq{
		INSERT INTO failing VALUES ('fail-$step');
		SELECT count(outbox_enqueue('$main', 'sent $step ' || i, 'sent-' || i % 2)) FROM generate_series(1, 6) i;
		SELECT outbox_enqueue('$small', '$big'::text, 'dead-$step');
		SELECT outbox_enqueue('$stale', 'retrying $step'::text, 'stale-$step');
		SELECT count(outbox_enqueue('$inbox_topic', 'before $step ' || i, 'in-' || i % 3)) FROM generate_series(1, 9) i;
		SELECT outbox_enqueue('$inbox_topic', 'fails $step'::text, 'fail-$step');
	}));
	log_expected($node);
	ok(wait_for_query($node, qq{
			SELECT (SELECT count(*) FROM outbox_message WHERE topic = '$main' AND state = 'sent'
			          AND convert_from(payload, 'UTF8') LIKE 'sent $step %'),
			       (SELECT count(*) FROM outbox_dead_letter WHERE topic = '$small'),
			       (SELECT count(*) FROM outbox_message WHERE topic = '$stale' AND state = 'retrying' AND attempts > 0),
			       (SELECT count(*) FROM outbox_message WHERE topic = '$inbox_topic' AND state <> 'sent')},
			'6|1|1|0', 60),
		"step $step: messages kept as sent, one dead-lettered, one retrying");
	ok(wait_for_query($node, qq{
			SELECT (SELECT count(*) FROM applied WHERE payload LIKE 'before $step %'),
			       (SELECT count(*) FROM inbox_retry WHERE key = 'fail-$step' AND attempts > 0)},
			'9|1', 60),
		"step $step: the inbox applied what came, and one message waits to retry");

	# pending, never tried: the publisher is kept from the brokers first
	brokers_held($node, 1);
	ok(wait_for_query($node, 'SELECT state FROM outbox_worker', 'waiting for brokers', 30),
		"step $step: the publisher waits for brokers it cannot reach");
	$node->safe_psql('postgres', committed_late(qq{
		SELECT outbox_enqueue('$stale', 'behind the retrying one $step'::text, 'stale-$step');
		SELECT count(outbox_enqueue('$main', 'pending $step ' || i, 'k-' || i % 4)) FROM generate_series(1, 20) i;
		SELECT outbox_enqueue('$main', 'delayed $step'::text, 'delayed-$step', deliver_after => '45 seconds');
		SELECT count(outbox_enqueue('$inbox_topic', 'after $step ' || i, 'in-' || i % 3)) FROM generate_series(1, 6) i;
	}));
	log_expected($node);
	# (a delayed message waits as a retry does, not yet attempted)
	is($node->safe_psql('postgres', q{
		SELECT count(*) FILTER (WHERE state = 'pending' AND attempts = 0),
		       count(*) FILTER (WHERE state = 'retrying' AND attempts = 0 AND next_attempt_at > now())
		FROM outbox_message}),
		'27|1', "step $step: 27 messages pending, never tried, and one delayed");
	my $waiting = waiting_messages($node);

	# The brokers back in the configuration on disk, not yet read: only a
	# worker started by pg_upgrade's start of the server would publish.
	$node->safe_psql('postgres', 'ALTER SYSTEM RESET outbox.brokers');
	forget_attribute_versions($node);
	$node->stop;
	return $waiting;
}

# PostgreSQL 15.20 (Debian 12's) records an attribute version in the
# attoptions of every column (pg_attver); the pg_dump of 17.11 and 18.6,
# which pg_upgrade runs, copies it into ALTER COLUMN ... SET, which their
# servers refuse: pg_upgrade fails for any table, with or without the
# extension.  A PostgreSQL matter, outside the extension's reach: the
# workaround docs/operations.md gives, done here as a user would, before
# the old cluster stops for good.
sub forget_attribute_versions
{
	my ($node) = @_;
	my $count = $node->safe_psql('postgres', q{
		SELECT count(*) FROM pg_attribute WHERE attoptions::text LIKE '%pg\_attver=%'});
	return if $count == 0;
	note("PostgreSQL " . $node->pg_version . ": $count columns with an attribute version, forgotten before pg_upgrade");
	$node->safe_psql($_, q{
		UPDATE pg_attribute
		   SET attoptions = nullif(array(SELECT o FROM unnest(attoptions) o WHERE o NOT LIKE 'pg\_attver=%'), '{}')
		 WHERE attoptions::text LIKE '%pg\_attver=%'}) for ('postgres', 'template1');
}

# pg_upgrade from $old to a new cluster of $install; returns the new one,
# not started, and pg_upgrade's servers' log.
sub upgrade
{
	my ($old, $install, $step) = @_;
	my $new = new_node("pgup_new_$step", $install);
	my $dir = PostgreSQL::Test::Utils::tempdir();
	my @cmd = ("$install/bin/pg_upgrade", '--no-sync', '--retain',
		'-b', $old->install_path . '/bin', '-B', "$install/bin",
		'-d', $old->data_dir, '-D', $new->data_dir,
		'-p', $old->port, '-P', $new->port, '-s', $new->host);
	for my $check ([ '--check' ], [])
	{
		my ($stdout, $stderr);
		my $ok = IPC::Run::run([ @cmd, @$check ], '>', \$stdout, '2>', \$stderr, init => sub { chdir $dir });
		note($stdout);
		ok($ok, "step $step: pg_upgrade " . ($check->[0] // '') . ' from ' . $old->pg_version
			  . ' to ' . $new->pg_version)
		  or diag("$stdout\n$stderr\n" . server_logs($new));
	}
	return ($new, server_logs($new));
}

# The servers' logs pg_upgrade kept (--retain) in the new cluster.
sub server_logs
{
	my ($new) = @_;
	my $logs = '';
	find(sub { $logs .= slurp_file($_) if $_ eq 'pg_upgrade_server.log' },
		$new->data_dir . '/pg_upgrade_output.d')
	  if -d $new->data_dir . '/pg_upgrade_output.d';
	return $logs;
}

# The checks after upgrade $step, on the new cluster, started.
sub check_after
{
	my ($new, $step, $waiting_before, $upgrade_log, $version) = @_;
	like($upgrade_log, qr/outbox: no worker is started: the server runs in binary-upgrade mode/,
		"step $step: pg_upgrade's servers, in binary-upgrade mode, started no outbox worker");

	# The brokers are held back until what waits is compared.
	$new->append_conf('postgresql.auto.conf', "outbox.brokers = '$unreachable'");
	$new->start;
	is($new->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'outbox'"),
		$version, "step $step: the extension is at $version on PostgreSQL " . $new->pg_version);
	$new->safe_psql('postgres', 'ALTER EXTENSION outbox UPDATE');
	is($new->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'outbox'"),
		$version, "step $step: ALTER EXTENSION outbox UPDATE has nothing to do");
	is(waiting_messages($new), $waiting_before,
		"step $step: every waiting message is as it was before pg_upgrade (same ids pending, same attempts)");

	brokers_held($new, 0);
	my ($small, $stale) = @topics[-2, -1];
	kafka_admin('alter-config', $stale, 'message.timestamp.before.max.ms=9223372036854775807');
	$new->safe_psql('postgres', "DELETE FROM failing WHERE key = 'fail-$step'");
	ok(wait_for_query($new, "SELECT count(*) FROM outbox_message WHERE state <> 'sent'", '0', 120),
		"step $step: every waiting message is published, the delayed one once due");

	# the dead letter is still there, and is delivered once requeued
	is($new->safe_psql('postgres', "SELECT key FROM outbox_dead_letter WHERE topic = '$small'"),
		"dead-$step", "step $step: the dead letter is still there");
	kafka_admin('alter-config', $small, 'max.message.bytes=10000');
	$new->safe_psql('postgres', "SELECT outbox_requeue(id) FROM outbox_dead_letter WHERE topic = '$small'");
	ok(wait_for_query($new, "SELECT count(*) FROM outbox_message WHERE state <> 'sent'", '0', 60),
		"step $step: the requeued dead letter is published");

	check_kafka($new, $step);
	check_inbox($new, $step);

	# the views answer on the new major
	is($new->safe_psql('postgres', qq{
		SELECT (SELECT count(*) FROM outbox_status WHERE topic = '$main'),
		       (SELECT bool_and(state IN ('idle', 'publishing')) FROM outbox_worker),
		       (SELECT count(*) > 0 FROM outbox_launcher),
		       (SELECT sum(retrying + dead_letters) FROM inbox_status WHERE subscription = 'orders'),
		       (SELECT state IS NOT NULL FROM inbox_worker),
		       (SELECT count(*) FROM outbox_topic_grants WHERE role = 'orders_svc'::regrole)}),
		'1|t|t|0|t|1', "step $step: the views answer");
}

# Kafka holds every message logged in expected exactly once, in per-key
# order: the sent ones of before the upgrade were not sent again.
sub check_kafka
{
	my ($node, $step) = @_;
	my %expected = map { my ($mid, $key, $id) = split /\|/; ($mid => [ $key, $id ]) }
	  split /\n/, $node->safe_psql('postgres', 'SELECT message_id, key, id FROM expected');
	my $records = consume_topics(topics => \@topics, expect => scalar(keys %expected), idle => 5,
		timeout => 120);
	my $result = check_delivery($records, \%expected);
	note("step $step: " . scalar(keys %expected) . ' messages expected, ' . scalar(@$records) . ' records');
	is(join(' ', map { "$_=$result->{$_}" } qw(lost phantom duplicates order_faults)),
		'lost=0 phantom=0 duplicates=0 order_faults=0',
		"step $step: Kafka has every message once, in per-key order, nothing sent twice");
}

# The inbox resumed at its offsets: every message of its topic applied
# once, in its key's order, the one that waited to retry included.
sub check_inbox
{
	my ($node, $step) = @_;
	my $count = $node->safe_psql('postgres', "SELECT count(*) FROM expected WHERE topic = '$inbox_topic'");
	ok(wait_for_query($node, 'SELECT count(DISTINCT message_id) FROM applied', $count, 60),
		"step $step: the inbox applies every message, the retried one once its handler stops failing");
	is($node->safe_psql('postgres', qq{
		SELECT (SELECT count(*) FROM applied),
		       (SELECT count(*) FROM expected e WHERE e.topic = '$inbox_topic'
		          AND NOT EXISTS (SELECT FROM applied a WHERE a.message_id = e.message_id)),
		       (SELECT count(*) FROM (SELECT e.id < lag(e.id) OVER (PARTITION BY a.key ORDER BY a.seq) AS back
		                              FROM applied a JOIN expected e USING (message_id)) o WHERE back),
		       (SELECT count(*) FROM inbox_retry) + (SELECT count(*) FROM inbox_dead_letter)}),
		"$count|0|0|0", "step $step: each message applied once, in its key's order, none left waiting");
	is($node->safe_psql('postgres', q{
		SELECT handler_oid = 'record_order(inbox_message)'::regprocedure
		FROM inbox_subscription WHERE name = 'orders'}),
		't', "step $step: the subscription is bound to its handler's oid in the new cluster");
	like(slurp_file($node->logfile),
		qr/inbox subscription "orders" was bound in another cluster \(system identifier -?\d+\): its handler public\.record_order\(public\.inbox_message\) is bound again/,
		"step $step: the server's log says the subscription was bound again");
}

my $old = new_node('pgup_old', $installs[0]);
$old->start;
create_schema($old);
my $version = $old->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'outbox'");

for my $step (1 .. $#installs)
{
	my $waiting = fill($old, $step);
	my ($new, $upgrade_log) = upgrade($old, $installs[$step], $step);
	check_after($new, $step, $waiting, $upgrade_log, $version);
	is(worker_exits($new), 0, "step $step: no outbox process exited with an error");
	$old = $new;
}
$old->stop;

done_testing();

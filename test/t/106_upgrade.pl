# ALTER EXTENSION outbox UPDATE from each earlier version (0.1.0, 0.2.0,
# 0.3.0) to the current one (0.4.0), with messages in every state: pending, retrying,
# sent (kept under outbox.sent_retention) and dead-lettered.  The library is
# the new one from the start, as after an upgrade's restart, so this also
# shows it serving the earlier schemas.
#
# After the update: the schema is the one a fresh install makes; every
# pending and retrying message is delivered, in id order per key; the sent
# rows and dead letters are intact and a dead letter can be requeued and is
# delivered; new ids are above every old one; an application role granted
# INSERT on the outbox may still insert; the trigger function is not
# executable by PUBLIC and pg_monitor is granted nothing.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $current = '0.4.0';

sub upgrade_from
{
my ($from) = @_;
(my $name = $from) =~ s/\./_/g;

my $node = outbox_node("upgrade_$name", no_extension => 1, conf => join("\n",
		"outbox.sent_retention = '1h'",
		"outbox.max_attempts = 1000",
		"outbox.retry_backoff_base = '1s'",
		"outbox.retry_backoff_max = '2s'"));
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox VERSION '$from';
	CREATE ROLE app LOGIN;
	GRANT INSERT (topic, key, payload, headers) ON outbox_message TO app;
	GRANT EXECUTE ON FUNCTION outbox_requeue(bigint) TO app;});

my $fine = unique_topic("upgrade.$name.fine");
kafka_admin('create-topic', $fine);
my ($small, $stale) = refusing_topics("upgrade.$name");

# Sent, kept as sent; dead-lettered; retrying.
my $big = 'x' x 1000;
$node->safe_psql('postgres', qq{
	SELECT count(outbox_enqueue('$fine', 'sent ' || i, 'k-' || i % 3)) FROM generate_series(1, 5) i;
	SELECT outbox_enqueue('$small', '$big'::text, 'k-small');
	SELECT outbox_enqueue('$stale', 'retrying'::text, 'k-stale');
});
ok(wait_for_query($node,
		"SELECT string_agg(topic || ':' || state, ',' ORDER BY id) FROM outbox_message WHERE state <> 'pending'",
		join(',', ("$fine:sent") x 5, "$stale:retrying"), 60),
	"$from: five messages kept as sent, one retrying");
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox_dead_letter WHERE topic = '$small'"), '1',
	"$from: one dead letter");

# Pending: the worker is kept from the brokers, so it claims nothing more.
# The later message of the retrying one's key waits behind it.
$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.brokers = '127.0.0.1:1'; SELECT pg_reload_conf()");
ok(wait_for_query($node, 'SELECT state FROM outbox_worker', 'waiting for brokers', 30),
	'the worker waits for brokers it cannot reach');
$node->safe_psql('postgres', qq{
	SELECT outbox_enqueue('$stale', 'after the retrying one'::text, 'k-stale');
	SELECT count(outbox_enqueue('$fine', 'pending ' || i, 'k-' || i % 7)) FROM generate_series(1, 50) i;
	INSERT INTO outbox_message (topic, key, payload) SELECT '$fine', 'k-insert', convert_to('inserted ' || i, 'UTF8') FROM generate_series(1, 5) i;
});
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox_message WHERE state = 'pending'"), '56',
	"$from: 56 messages pending");

# What must be delivered after the update: message_id => [key, id].
my %waiting = map { my ($mid, $key, $id) = split /\|/; ($mid => [ $key, $id ]) }
  split /\n/, $node->safe_psql('postgres', "SELECT message_id, key, id FROM outbox_message WHERE state <> 'sent'");
my $sent_before = $node->safe_psql('postgres',
	"SELECT string_agg(id || ':' || kafka_offset, ',' ORDER BY id) FROM outbox_message WHERE state = 'sent'");
my $dead_before = $node->safe_psql('postgres',
	'SELECT id, message_id, topic, key, md5(payload), attempts, created_at, failed_at, error FROM outbox_dead_letter');
my $highest_id = $node->safe_psql('postgres',
	'SELECT greatest((SELECT max(id) FROM outbox_message), (SELECT max(id) FROM outbox_dead_letter))');

$node->safe_psql('postgres', 'ALTER EXTENSION outbox UPDATE');
is($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'outbox'"), $current,
	"from $from, the extension is at $current");

# The upgraded schema is the fresh install's, object by object.
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', q{
	CREATE EXTENSION outbox;
	GRANT INSERT (topic, key, payload, headers) ON outbox_message TO app;
	GRANT EXECUTE ON FUNCTION outbox_requeue(bigint) TO app;});
# The outbox's tables: the outbox, its segments, the dead letters.
my $rels = q{(SELECT 'outbox_message'::regclass UNION ALL SELECT 'outbox_dead_letter'::regclass UNION ALL SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox_message'::regclass)};
my $schema_query = qq{
	SELECT pg_describe_object(classid, objid, objsubid) FROM pg_depend
	 WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
	   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox')
	UNION ALL
	SELECT format('%s.%s %s %s %s default %s grants %s', attrelid::regclass, attname,
	              format_type(atttypid, atttypmod), attnotnull, attidentity::text, pg_get_expr(adbin, adrelid),
	              attacl)
	  FROM pg_attribute LEFT JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum
	 WHERE attrelid IN $rels AND attnum > 0
	UNION ALL
	SELECT conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
	 WHERE conrelid IN $rels
	UNION ALL
	SELECT pg_get_indexdef(indexrelid) FROM pg_index
	 WHERE indrelid IN $rels
	UNION ALL
	SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid IN $rels
	UNION ALL
	SELECT c.relname || ' ' || c.relkind::text || ' ' || coalesce(c.relacl, acldefault('r', c.relowner))::text || ' '
	       || coalesce(pg_get_viewdef(c.oid), '')
	  FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relname LIKE 'outbox%'
	UNION ALL
	SELECT p.oid::regprocedure || ' ' || coalesce(p.proacl, acldefault('f', p.proowner))::text || ' ' || pg_get_functiondef(p.oid)
	  FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'outbox%'
	UNION ALL
	SELECT 'config ' || extconfig::regclass[]::text || ' ' || extcondition::text
	  FROM pg_extension WHERE extname = 'outbox'
	ORDER BY 1};
my $upgraded = $node->safe_psql('postgres', $schema_query);
my $fresh = $node->safe_psql('fresh', $schema_query);
# The order of extconfig is the order of the pg_extension_config_dump() calls.
s/^config \{([^}]*)\}/'config {' . join(',', sort split m{,}, $1) . '}'/me for ($upgraded, $fresh);
is($upgraded, $fresh, "the schema upgraded from $from is what a fresh install of $current makes");

is($node->safe_psql('postgres', q{
	SELECT has_function_privilege('public', 'outbox_message_check()', 'EXECUTE'),
	       has_table_privilege('pg_monitor', 'outbox_status', 'SELECT'),
	       has_table_privilege('pg_monitor', 'outbox_worker', 'SELECT'),
	       has_function_privilege('pg_monitor', 'outbox_worker_status()', 'EXECUTE')}),
	'f|f|f|f', 'PUBLIC may not execute the trigger function; pg_monitor is granted nothing');

is($node->safe_psql('postgres',
		"SELECT string_agg(id || ':' || kafka_offset, ',' ORDER BY id) FROM outbox_message WHERE state = 'sent'"),
	$sent_before, 'the rows kept as sent are intact');
is($node->safe_psql('postgres',
		'SELECT id, message_id, topic, key, md5(payload), attempts, created_at, failed_at, error FROM outbox_dead_letter'),
	$dead_before, 'the dead letters are intact');

# New messages get ids above every old one, both ways in.
my $new_ids = $node->safe_psql('postgres', qq{
	SELECT outbox_enqueue('$fine', 'new'::text, 'k-new');
	SET ROLE app;
	INSERT INTO outbox_message (topic, key, payload) VALUES ('$fine', 'k-new', 'new insert');
	RESET ROLE;
	SELECT max(id) FROM outbox_message;
});
my @new_ids = split /\n/, $new_ids;
ok($new_ids[0] > $highest_id && $new_ids[1] > $new_ids[0],
	"new ids ($new_ids[0], $new_ids[1]) are above every old one ($highest_id), in order");
%waiting = (%waiting, map { my ($mid, $key, $id) = split /\|/; ($mid => [ $key, $id ]) }
	  split /\n/, $node->safe_psql('postgres', "SELECT message_id, key, id FROM outbox_message WHERE id > $highest_id"));

# Let everything go: the brokers back, the stale topic fixed.
kafka_admin('alter-config', $stale, 'message.timestamp.before.max.ms=9223372036854775807');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET outbox.brokers; SELECT pg_reload_conf()');
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE state <> 'sent'", '0', 60),
	'every pending and retrying message leaves the outbox');
my $records = consume_topics(topics => [ $fine, $stale ], idle => 3, timeout => 60);
my $result = check_delivery([ grep { $_->{value} !~ /^sent / } @$records ], \%waiting);
is_deeply($result, { lost => 0, phantom => 0, duplicates => 0, order_faults => 0 },
	scalar(keys %waiting) . ' messages delivered, once each, in id order per key');
is(join(',', map { $_->{value} } grep { $_->{topic} eq $stale } @$records),
	'retrying,after the retrying one', 'the retrying message went before the later one of its key');

# The dead letter is requeued once its topic takes it, and delivered.
kafka_admin('alter-config', $small, 'max.message.bytes=10000');
my $dead_id = $node->safe_psql('postgres', 'SELECT id FROM outbox_dead_letter');
my $requeued = $node->safe_psql('postgres', "SET ROLE app; SELECT outbox_requeue($dead_id)");
ok($requeued > $new_ids[1], 'outbox_requeue gives the dead letter a new id, above the others');
my $small_records = consume_topics(topics => [$small], expect => 1, timeout => 30);
is(length($small_records->[0]{value} // ''), 1000, 'the requeued message is delivered');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox_dead_letter'), '0', 'no dead letter is left');

$node->stop('fast');
is(worker_exits($node), 0, 'the worker never exited');
}

upgrade_from($_) for ('0.1.0', '0.2.0', '0.3.0');
done_testing();

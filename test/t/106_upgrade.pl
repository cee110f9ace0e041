# ALTER EXTENSION outbox UPDATE from each earlier version (0.1.0, 0.2.0,
# 0.3.0, 0.4.0, 0.5.0, 0.6.0, 0.7.0, 0.8.0, 0.9.0) to the current one (0.10.0), with messages in
# every state: pending, retrying, sent (kept under outbox.sent_retention),
# dead-lettered and (from 0.6.0) delayed; and from 0.5.0, which has the
# inbox, inbox rows: offsets, a message waiting to retry and a dead letter,
# all applied after the update, in order; the update binds each
# subscription to its handler's function, and one whose handler was dropped
# is kept, bound to none, and waits, saying why.  The library is the new one from the start, as after an
# upgrade's restart, so this also shows it serving the earlier schemas.
#
# After the update: the schema is the one a fresh install makes, every
# object of the extension compared (the outbox's and the inbox's tables,
# columns, constraints, indexes, triggers, sequences, views, functions and
# types, their privileges, the row security policies and the tables and
# sequences pg_dump dumps the rows of); every pending and retrying message
# is delivered, in id order per key; the sent rows and dead letters are
# intact and a dead letter can be requeued and is delivered; new ids are
# above every old one; an application role granted INSERT on the outbox
# may still insert; the trigger function is not executable by PUBLIC and
# pg_monitor is granted nothing; a monitoring role granted SELECT on
# outbox_status still reads it, its rate and latency included, and pg_dump
# dumps its grant on the function behind them.  And the inbox works in the
# upgraded database: a plain role granted EXECUTE on inbox_subscribe()
# subscribes a handler of its own to a new topic, and the messages the
# database then enqueues are applied by the handler once each, as that
# role, with no lag left.  Topic grants: a role that could enqueue before
# the update (EXECUTE on outbox_enqueue(), INSERT on outbox_message) may
# publish to every topic after it, shown in outbox_topic_grants, and no
# other role is granted anything; a subscription of before the update
# whose role holds no subscribe grant waits, saying why, and applies
# everything, each message once, once its role is granted its topic.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;

my $current = '0.10.0';

sub upgrade_from
{
my ($from) = @_;
(my $name = $from) =~ s/\./_/g;

# outbox_enqueue()'s signature of before 0.6.0, and of 0.6.0 on
my $enqueue_text = $from ge '0.6.0'
  ? 'outbox_enqueue(text, text, text, jsonb, integer, interval, timestamptz)'
  : 'outbox_enqueue(text, text, text, jsonb)';
my $node = outbox_node("upgrade_$name", no_extension => 1, conf => join("\n",
		"outbox.sent_retention = '1h'",
		"outbox.max_attempts = 1000",
		"outbox.retry_backoff_base = '1s'",
		"outbox.retry_backoff_max = '2s'"));
$node->safe_psql('postgres', qq{
	CREATE EXTENSION outbox VERSION '$from';
	CREATE ROLE app LOGIN;
	GRANT INSERT (topic, key, payload, headers) ON outbox_message TO app;
	GRANT EXECUTE ON FUNCTION outbox_requeue(bigint) TO app;
	GRANT EXECUTE ON FUNCTION $enqueue_text TO app;
	CREATE ROLE monitor LOGIN;
	GRANT SELECT ON outbox_status TO monitor;});
# from 0.6.0 on, reading outbox_status takes outbox_topic_metrics() too
$node->safe_psql('postgres', 'GRANT EXECUTE ON FUNCTION outbox_topic_metrics() TO monitor')
  if $from ge '0.6.0';
# from 0.8.0 on, enqueueing takes a topic grant, which the update from
# 0.7.0 gives app; and subscribing one, taken back before the update so
# that the subscriptions wait for it as those of before 0.8.0 do
my $has_grants = $from ge '0.8.0';
$node->safe_psql('postgres', "SELECT outbox_grant_topic('app', '*', 'publish')") if $has_grants;

my $has_inbox = $from ge '0.5.0';
my $has_delay = $from ge '0.6.0';

# Inbox rows: offsets, a message waiting to retry, a dead letter.
my $kept = unique_topic("upgrade.$name.kept");
if ($has_inbox)
{
	kafka_admin('create-topic', $kept);
	$node->safe_psql('postgres', 'CREATE ROLE kept_svc');
	$node->safe_psql('postgres', "SELECT outbox_grant_topic('kept_svc', 'upgrade.$name.*', 'subscribe')")
	  if $has_grants;
	$node->safe_psql('postgres', qq{
		CREATE TABLE kept_applied (seq bigserial PRIMARY KEY, sub text, key text, payload text);
		CREATE TABLE kept_failing (sub text, key text, PRIMARY KEY (sub, key));
		INSERT INTO kept_failing VALUES ('kept_retrying', 'k-fail'), ('kept_dead', 'k-3');
		GRANT INSERT, SELECT ON kept_applied, kept_failing TO kept_svc;
		GRANT USAGE ON SEQUENCE kept_applied_seq_seq TO kept_svc;
		CREATE FUNCTION kept_apply(m inbox_message) RETURNS void LANGUAGE plpgsql AS \$\$
		BEGIN
		    IF EXISTS (SELECT FROM kept_failing f WHERE f.sub = m.subscription AND f.key = m.key) THEN
		        RAISE EXCEPTION 'failing %', m.key;
		    END IF;
		    INSERT INTO kept_applied (sub, key, payload) VALUES (m.subscription, m.key, payload_text(m));
		END \$\$;
		GRANT EXECUTE ON FUNCTION kept_apply(inbox_message) TO kept_svc;
		SELECT inbox_subscribe('kept_retrying', ARRAY['$kept'], 'kept_apply(inbox_message)',
		                       max_attempts => 100000, run_as => 'kept_svc');
		SELECT inbox_subscribe('kept_dead', ARRAY['$kept'], 'kept_apply(inbox_message)',
		                       max_attempts => 1, run_as => 'kept_svc');
		SELECT outbox_enqueue('$kept', 'kept ' || i, CASE WHEN i IN (2, 4) THEN 'k-fail' ELSE 'k-' || i END)
		  FROM generate_series(1, 5) i;
	});
	ok(wait_for_query($node, q{SELECT
			(SELECT count(*) FROM kept_applied),
			(SELECT count(*) FROM inbox_retry WHERE subscription = 'kept_retrying'),
			(SELECT count(*) FROM inbox_dead_letter WHERE subscription = 'kept_dead'),
			(SELECT sum(next_offset) FROM inbox_offset)}, '7|2|1|10', 60),
		"$from: inbox rows: offsets, two messages waiting to retry, a dead letter");
	# A subscription whose handler was dropped before the update.
	kafka_admin('create-topic', "$kept.orphan");
	$node->safe_psql('postgres', qq{
		CREATE FUNCTION orphan_apply(m inbox_message) RETURNS void LANGUAGE sql
		AS \$\$ INSERT INTO kept_applied (sub, key, payload) VALUES ('orphan', m.key, 'orphan') \$\$;
		GRANT EXECUTE ON FUNCTION orphan_apply(inbox_message) TO kept_svc;
		SELECT inbox_subscribe('kept_orphan', ARRAY['$kept.orphan'], 'orphan_apply(inbox_message)',
		                       run_as => 'kept_svc');
		DROP FUNCTION orphan_apply(inbox_message);
	});
}

my $fine = unique_topic("upgrade.$name.fine");
kafka_admin('create-topic', $fine);
my ($small, $stale) = refusing_topics("upgrade.$name");

# Sent, kept as sent; dead-lettered; retrying.
my $big = 'x' x 1000;
$node->safe_psql('postgres', committed_late(qq{
	SELECT count(outbox_enqueue('$fine', 'sent ' || i, 'k-' || i % 3)) FROM generate_series(1, 5) i;
	SELECT outbox_enqueue('$small', '$big'::text, 'k-small');
	SELECT outbox_enqueue('$stale', 'retrying'::text, 'k-stale');
}));
ok(wait_for_query($node,
		"SELECT string_agg(topic || ':' || state, ',' ORDER BY id) FROM outbox_message WHERE state <> 'pending' AND topic <> '$kept'",
		join(',', ("$fine:sent") x 5, "$stale:retrying"), 60),
	"$from: five messages kept as sent, one retrying");
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox_dead_letter WHERE topic = '$small'"), '1',
	"$from: one dead letter");

# Pending: the worker is kept from the brokers, so it claims nothing more.
# The later message of the retrying one's key waits behind it.
$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.brokers = '127.0.0.1:1'; SELECT pg_reload_conf()");
ok(wait_for_query($node, 'SELECT state FROM outbox_worker', 'waiting for brokers', 30),
	'the worker waits for brokers it cannot reach');
$node->safe_psql('postgres', committed_late(qq{
	SELECT outbox_enqueue('$stale', 'after the retrying one'::text, 'k-stale');
	SELECT count(outbox_enqueue('$fine', 'pending ' || i, 'k-' || i % 7)) FROM generate_series(1, 50) i;
	INSERT INTO outbox_message (topic, key, payload) SELECT '$fine', 'k-insert', convert_to('inserted ' || i, 'UTF8') FROM generate_series(1, 5) i;
}));
$node->safe_psql('postgres', qq{SELECT outbox_enqueue('$fine', 'delayed'::text, 'k-delayed', deliver_after => '2 seconds')})
  if $has_delay;
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

$node->safe_psql('postgres', "SELECT outbox_revoke_topic('kept_svc', 'upgrade.$name.*', 'subscribe')")
  if $has_grants && $has_inbox;
$node->safe_psql('postgres', 'ALTER EXTENSION outbox UPDATE');
is($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'outbox'"), $current,
	"from $from, the extension is at $current");
is($node->safe_psql('postgres', q{
	SELECT string_agg(concat_ws(' ', role, topic_pattern, pattern_type, privilege), ', ') FROM outbox_topic_grants}),
	'app * prefixed publish',
	"$from: the role that could enqueue may publish to every topic, as outbox_topic_grants shows; no one else is granted any");

# The upgraded schema is the fresh install's, object by object.
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', q{
	CREATE EXTENSION outbox;
	GRANT INSERT (topic, key, payload, headers) ON outbox_message TO app;
	GRANT EXECUTE ON FUNCTION outbox_requeue(bigint) TO app;
	GRANT EXECUTE ON FUNCTION outbox_enqueue(text, text, text, jsonb, integer, interval, timestamptz) TO app;
	GRANT SELECT ON outbox_status TO monitor;
	GRANT EXECUTE ON FUNCTION outbox_topic_metrics() TO monitor;});
# Every object of the extension, and what it is made of: the relations
# (tables, segments, sequences, views, and the composite types' own
# relations), their columns, constraints, indexes, triggers (but the
# foreign keys' own, named by oid) and row security policies; the sequences' parameters; the functions' and types'
# definitions; the privileges on all of them; the tables and sequences
# pg_dump dumps the rows of (in any order, which is the order of the
# pg_extension_config_dump() calls).
my $members = q{(SELECT classid, objid FROM pg_depend
	 WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
	   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox'))};
my $rels = qq{(SELECT objid FROM $members m WHERE classid = 'pg_class'::regclass
	UNION ALL SELECT typrelid FROM pg_type WHERE oid IN (SELECT objid FROM $members m WHERE classid = 'pg_type'::regclass)
	   AND typrelid <> 0)};
my $schema_query = qq{
	SELECT pg_describe_object(classid, objid, objsubid) FROM pg_depend
	 WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
	   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'outbox')
	UNION ALL
	SELECT format('%s.%s %s %s %s default %s grants %s', attrelid::regclass, attname,
	              format_type(atttypid, atttypmod), attnotnull, attidentity::text, pg_get_expr(adbin, adrelid),
	              attacl)
	  FROM pg_attribute LEFT JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum
	 WHERE attrelid IN $rels AND attnum > 0 AND NOT attisdropped
	UNION ALL
	-- (a NOT NULL is attnotnull above: the names PostgreSQL 18 gives them are its own)
	SELECT conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
	 WHERE conrelid IN $rels AND contype <> 'n'
	UNION ALL
	SELECT pg_get_indexdef(indexrelid) FROM pg_index
	 WHERE indrelid IN $rels
	UNION ALL
	SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid IN $rels AND NOT tgisinternal
	UNION ALL
	SELECT format('policy %s on %s %s %s to %s using %s check %s', polname, polrelid::regclass, polcmd::text,
	              polpermissive,
	              (SELECT array_agg(CASE WHEN r = 0 THEN 'public' ELSE r::regrole::text END) FROM unnest(polroles) r),
	              pg_get_expr(polqual, polrelid),
	              pg_get_expr(polwithcheck, polrelid))
	  FROM pg_policy WHERE polrelid IN $rels
	UNION ALL
	SELECT format('sequence %s %s start %s increment %s min %s max %s cache %s cycle %s', seqrelid::regclass,
	              format_type(seqtypid, NULL), seqstart, seqincrement, seqmin, seqmax, seqcache, seqcycle)
	  FROM pg_sequence WHERE seqrelid IN $rels
	UNION ALL
	SELECT c.relname || ' ' || c.relkind::text || ' ' || coalesce(c.relacl, acldefault('r', c.relowner))::text || ' '
	       || 'row security ' || c.relrowsecurity || ' forced ' || c.relforcerowsecurity || ' '
	       || coalesce(pg_get_viewdef(c.oid), '')
	  FROM pg_class c WHERE c.oid IN $rels
	UNION ALL
	SELECT p.oid::regprocedure || ' ' || coalesce(p.proacl, acldefault('f', p.proowner))::text || ' ' || pg_get_functiondef(p.oid)
	  FROM pg_proc p WHERE p.oid IN (SELECT objid FROM $members m WHERE classid = 'pg_proc'::regclass)
	UNION ALL
	SELECT format('type %s %s %s', t.oid::regtype, t.typtype::text, coalesce(t.typacl, acldefault('T', t.typowner)))
	  FROM pg_type t WHERE t.oid IN (SELECT objid FROM $members m WHERE classid = 'pg_type'::regclass)
	UNION ALL
	SELECT format('config %s %s', c.rel::regclass, c.cond)
	  FROM pg_extension, unnest(extconfig, extcondition) c(rel, cond) WHERE extname = 'outbox'
	ORDER BY 1};
my $upgraded = $node->safe_psql('postgres', $schema_query);
my $fresh = $node->safe_psql('fresh', $schema_query);
# What the comparison takes in, so that it cannot pass by missing it.
like($fresh, qr/^policy inbox_retry_own on inbox_retry \* t to \{public\} using pg_has_role\(\(run_as\)::oid, 'MEMBER'::text\)/m,
	'the schema compared holds the row security policies');
# (PostgreSQL 17 added MAINTAIN, m, to a table owner's privileges)
like($fresh, qr/^inbox_dead_letter r \{\w+=arwdDxtm?\/\w+\} row security true forced false/m,
	'and the inbox tables, their privileges and row security');
like($fresh, qr/^inbox_subscribe\(text,text\[\],regprocedure,integer,text,regrole\) \{\w+=X\/\w+\} /m,
	'and the inbox functions and their privileges');
is(join(',', $fresh =~ /^config (inbox_\w+) $/mg),
	'inbox_dead_letter,inbox_offset,inbox_received,inbox_retry,inbox_retry_id_seq,inbox_subscription',
	'and the inbox tables pg_dump dumps the rows of, and the position of inbox_retry\'s ids');
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

# What was granted on outbox_enqueue() is granted on the new one, and
# pg_dump dumps it: the upgrade leaves it out of the initial privileges.
like($node->safe_psql('postgres', q{
	SELECT string_agg(p.oid::regprocedure::text, ',') FROM pg_proc p
	 WHERE proname = 'outbox_enqueue' AND has_function_privilege('app', p.oid, 'EXECUTE')}),
	qr/^outbox_enqueue\(text,text,text,jsonb,integer,interval,timestamp with time zone\)$/,
	"$from: the role granted outbox_enqueue(text, ...) may execute its new signature, and no other");
my ($dump, $dump_err);
IPC::Run::run([ 'pg_dump', '--schema-only', '-d', $node->connstr('postgres') ], '>', \$dump, '2>', \$dump_err);
like($dump,
	qr/^GRANT ALL ON FUNCTION public\.outbox_enqueue\(topic text, payload text,.*\) TO app;$/m,
	"$from: pg_dump dumps that grant");

# A role that could read outbox_status still can: it is granted the
# function behind the view's rate and latency, and pg_dump dumps that.
is($node->safe_psql('postgres', 'SET ROLE monitor; SELECT count(*) > 0 FROM outbox_status'), 't',
	"$from: the role granted SELECT on outbox_status still reads it");
like($dump, qr/^GRANT ALL ON FUNCTION public\.outbox_topic_metrics\(.*\) TO monitor;$/m,
	"$from: pg_dump dumps its grant on outbox_topic_metrics()");

# New messages get ids above every old one, both ways in, and the
# application role enqueues to a partition of its choice.
my $new_ids = $node->safe_psql('postgres', qq{
	SELECT outbox_enqueue('$fine', 'new'::text, 'k-new');
	SET ROLE app;
	SELECT outbox_enqueue('$fine', 'new, to partition 0'::text, 'k-partition', partition => 0) > 0;
	INSERT INTO outbox_message (topic, key, payload) VALUES ('$fine', 'k-new', 'new insert');
	RESET ROLE;
	SELECT max(id) FROM outbox_message;
});
my @new_ids = grep { $_ ne 't' } split /\n/, $new_ids;
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

# The upgraded functions behave as the fresh install's: an id no dead
# letter has is an error, P0002, for the role granted outbox_requeue() too.
for my $call ("SET ROLE app; SELECT outbox_requeue($dead_id)", 'SELECT outbox_discard(999999)',
	'SELECT inbox_requeue(999999)', 'SELECT inbox_discard(999999)')
{
	my ($ret, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\n$call");
	like($err, qr/ERROR:  P0002: no dead letter has id \d+\nHINT:  (outbox|inbox)_dead_letter lists the messages/,
		"$from: '$call' raises P0002 for an id no dead letter has");
}

# The inbox rows of before the update: each subscription applies them, in
# order, once the handler takes them and the dead letters are requeued.
# Each subscription is bound to the function its handler named, and records
# its run_as role as who subscribed; the one whose handler was dropped is
# kept, bound to none, and waits, saying why.
if ($has_inbox)
{
	# (from 0.8.0, whose subscriptions are bound already and record who
	# subscribed, the worker finds the dropped handler and records the
	# subscription as bound to none)
	my $by = $has_grants ? $node->safe_psql('postgres', 'SELECT current_user') : 'kept_svc';
	ok(wait_for_query($node, q{
		SELECT string_agg(name || ' ' || CASE WHEN handler_oid = 0 THEN 'none'
		                                      WHEN handler_oid = to_regprocedure(handler) THEN 'bound' END
		                  || ' ' || subscribed_by, ',' ORDER BY name) FROM inbox_subscription},
		"kept_dead bound $by,kept_orphan none $by,kept_retrying bound $by", 60),
		"$from: each subscription is bound to its handler's function, or to none if it was dropped");
	$node->safe_psql('postgres', "SELECT outbox_enqueue('$kept.orphan', 'for the orphan'::text)");
	ok(wait_for_query($node, q{SELECT last_error LIKE '%"kept_orphan"%its handler public.orphan_apply(public.inbox_message) was dropped%'
			FROM inbox_worker}, 't', 60),
		"$from: the subscription whose handler was dropped waits, and inbox_worker says why");
	is($node->safe_psql('postgres', q{SELECT count(*) FROM inbox_dead_letter WHERE subscription = 'kept_orphan'}), '0',
		"$from: nothing of it is dead-lettered");
	$node->safe_psql('postgres', q{SELECT inbox_unsubscribe('kept_orphan')});
	$node->safe_psql('postgres', q{
		DELETE FROM kept_failing;
		SELECT count(inbox_requeue(id)) FROM inbox_dead_letter WHERE subscription = 'kept_dead';});
	# no subscribe grant was made for their role: they wait, and say why
	ok(wait_for_query($node, q{SELECT last_error LIKE '%its role "kept_svc" may not subscribe to topic%' FROM inbox_worker},
			't', 60),
		"$from: the subscriptions of before the update wait for their role's subscribe grant, and inbox_worker says why");
	is($node->safe_psql('postgres', q{SELECT count(*) FROM kept_applied}), '7',
		"$from: meanwhile none of their messages is applied");
	$node->safe_psql('postgres', "SELECT outbox_grant_topic('kept_svc', '$kept', 'subscribe')");
	ok(wait_for_query($node, q{SELECT sub || ':' || string_agg(payload, ',' ORDER BY seq) FROM kept_applied
			GROUP BY sub ORDER BY sub},
			"kept_dead:kept 1,kept 2,kept 4,kept 5,kept 3\nkept_retrying:kept 1,kept 3,kept 5,kept 2,kept 4", 60),
		"$from: the inbox's retrying messages and dead letters are applied after the update, in order");
	is($node->safe_psql('postgres', q{SELECT count(*) FROM kept_applied}), '10',
		"$from: each subscription applied each message once");
	$node->safe_psql('postgres', q{
		SELECT inbox_unsubscribe('kept_retrying'); SELECT inbox_unsubscribe('kept_dead');});
}

# The inbox in the upgraded database: a plain role, granted EXECUTE on
# inbox_subscribe(), subscribes a handler as itself to a new topic, which
# the same database then enqueues to.
my $inbox_topic = unique_topic("upgrade.$name.inbox");
kafka_admin('create-topic', $inbox_topic);
$node->safe_psql('postgres', qq{
	CREATE ROLE subscriber LOGIN;
	CREATE TABLE applied (seq bigserial PRIMARY KEY, message_id uuid, key text, payload text,
	                      applied_by text DEFAULT current_user);
	GRANT INSERT ON applied TO subscriber;
	GRANT USAGE ON SEQUENCE applied_seq_seq TO subscriber;
	CREATE FUNCTION apply(m inbox_message) RETURNS void
	LANGUAGE sql BEGIN ATOMIC
	    INSERT INTO applied (message_id, key, payload) VALUES (m.message_id, m.key, payload_text(m));
	END;
	REVOKE EXECUTE ON FUNCTION apply(inbox_message) FROM PUBLIC;
	GRANT EXECUTE ON FUNCTION apply(inbox_message) TO subscriber;
	GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure, integer, text, regrole) TO subscriber;
	SELECT outbox_grant_topic('subscriber', 'upgrade.$name.*', 'subscribe');
	SET ROLE subscriber;
	SELECT inbox_subscribe('upgraded', ARRAY['$inbox_topic'], 'apply(inbox_message)');
	RESET ROLE;
	SELECT count(outbox_enqueue('$inbox_topic', 'inbox ' || i, 'k-' || i % 4)) FROM generate_series(1, 20) i;
});
ok(wait_for_query($node, q{SELECT "partition", next_offset, lag FROM inbox_status WHERE subscription = 'upgraded'},
		'0|20|0', 60),
	"$from: inbox_status shows the subscription's partition read to its end, lag 0");
my $missing = unique_topic("upgrade.$name.missing");
$node->safe_psql('postgres', qq{
	SET ROLE subscriber;
	SELECT inbox_subscribe('waiting', ARRAY['$missing'], 'apply(inbox_message)');});
is($node->safe_psql('postgres', q{SELECT topic, "partition" IS NULL FROM inbox_status WHERE subscription = 'waiting'}),
	"$missing|t", "$from: inbox_status shows a subscription whose topic has no partition known yet");
$node->safe_psql('postgres', q{SELECT inbox_unsubscribe('waiting')});
is($node->safe_psql('postgres', qq{
	SELECT count(*), count(DISTINCT a.message_id), count(o.message_id), string_agg(DISTINCT applied_by, ',')
	  FROM applied a FULL JOIN (SELECT message_id, key, convert_from(payload, 'UTF8') AS payload
	                              FROM outbox_message WHERE topic = '$inbox_topic') o USING (message_id, key, payload)}),
	'20|20|20|subscriber',
	"$from: the handler applied each message enqueued once, as the role that subscribed");

$node->stop('fast');
is(worker_exits($node), 0, 'the worker never exited');
}

upgrade_from($_) for ('0.1.0', '0.2.0', '0.3.0', '0.4.0', '0.5.0', '0.6.0', '0.7.0', '0.8.0', '0.9.0');
done_testing();

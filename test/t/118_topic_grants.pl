# Topic grants: a role publishes to, and subscribes to, only the topics the
# extension's owner granted it.  In database "postgres" two tenants may
# enqueue (EXECUTE on outbox_enqueue(), INSERT on outbox_message, INSERT on
# a captured table); in database "tenants" they may subscribe (EXECUTE on
# inbox_subscribe()).  Without a grant each way in is refused with 42501,
# delayed messages included; a prefix grant allows exactly its prefix; a
# tenant cannot subscribe to another's topic and copy its payload (the
# attack reproduced: it needs no SELECT on outbox_message); a revoke stops a
# running subscription before its next batch, which says why, and a grant
# again applies everything that waited, each message once.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

# sent rows are kept, so that what was enqueued can be counted
my $node = outbox_node('grants', conf => "outbox.sent_retention = '1h'");
$node->safe_psql('postgres', 'CREATE DATABASE tenants');
$node->safe_psql('tenants', 'CREATE EXTENSION outbox');

# unique_topic('tenant_a') is 'tenant_a.<pid>.<time>.<n>': under the prefix 'tenant_a.*'
my $a_topic = unique_topic('tenant_a');
my $b_topic = unique_topic('tenant_b');
kafka_admin('create-topic', $_, '--partitions', '2') for $a_topic, $b_topic;

$node->safe_psql('postgres', q{
	CREATE ROLE tenant_a LOGIN;
	CREATE ROLE tenant_b LOGIN;
	GRANT EXECUTE ON FUNCTION outbox_enqueue(text, jsonb, text, jsonb, integer, interval, timestamptz),
	                          outbox_enqueue(text, text, text, jsonb, integer, interval, timestamptz),
	                          outbox_enqueue(text, bytea, text, jsonb, integer, interval, timestamptz)
	      TO tenant_a, tenant_b;
	GRANT INSERT (topic, key, payload, headers) ON outbox_message TO tenant_a, tenant_b;
	-- a Debezium outbox table of tenant_a's, captured: its rows go to outbox.event.<aggregatetype>
	CREATE TABLE a_events (id uuid, aggregatetype text, aggregateid text, type text, payload jsonb);
	GRANT INSERT ON a_events TO tenant_a;
	SELECT outbox_capture('a_events') IS NOT NULL;
});

# psql's stderr for statements as a role, SQLSTATEs shown.
sub stderr_as
{
	my ($db, $role, $sql) = @_;
	my ($ret, $stdout, $stderr) = $node->psql($db, "\\set VERBOSITY verbose\nSET ROLE $role;\n$sql");
	return $stderr;
}

# Every way of enqueueing, as tenant_a, to a topic (the capture routes to
# outbox.event.<aggregatetype>: given the topic's tail).
sub enqueue_ways
{
	my ($topic) = @_;
	return (
		'outbox_enqueue(jsonb)' => "SELECT outbox_enqueue('$topic', '{\"n\": 1}'::jsonb, 'k')",
		'outbox_enqueue(text)' => "SELECT outbox_enqueue('$topic', 'one'::text, 'k')",
		'outbox_enqueue(bytea)' => "SELECT outbox_enqueue('$topic', '\\x01'::bytea)",
		'INSERT INTO outbox_message' => "INSERT INTO outbox_message (topic, key, payload) VALUES ('$topic', 'k', 'one')",
		'a delayed message' => "SELECT outbox_enqueue('$topic', 'later'::text, 'later', deliver_after => '1 hour')",
		'a delayed message at a time' =>
		  "SELECT outbox_enqueue('$topic', 'later'::text, 'later', deliver_at => now() + interval '1 day')");
}

# 1. By default, after CREATE EXTENSION, no role but a superuser may
#    publish: each way in is refused, naming the role and the topic.
my %ways = enqueue_ways($b_topic);
for my $way (sort keys %ways)
{
	like(stderr_as('postgres', 'tenant_a', $ways{$way}),
		qr/ERROR:  42501: role "tenant_a" may not publish to topic "\Q$b_topic\E".*HINT:  The extension's owner grants it: SELECT outbox_grant_topic\('tenant_a', '\Q$b_topic\E', 'publish'\)/s,
		"no grant: $way is refused with 42501, a message naming role and topic, and a hint");
}
like(stderr_as('postgres', 'tenant_a',
		"INSERT INTO a_events VALUES (gen_random_uuid(), 'Order', '1', 'OrderCreated', '{}')"),
	qr/ERROR:  42501: role "tenant_a" may not publish to topic "outbox\.event\.Order"/,
	'no grant: an insert into a captured table is refused as the inserting role\'s');
like(stderr_as('postgres', 'tenant_a', "SELECT outbox_grant_topic('tenant_a', '*', 'publish')"),
	qr/ERROR:  42501: permission denied for function outbox_grant_topic/,
	'a tenant cannot grant itself a topic');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox_message'), '0', 'nothing was enqueued');
like($node->safe_psql('postgres', "SELECT outbox_enqueue('$b_topic', 'by the superuser'::text, 'k') > 0"),
	qr/^t$/, 'a superuser needs no grant');

# 2. A prefix grant allows exactly its prefix; a literal grant its topic.
$node->safe_psql('postgres', q{
	SELECT outbox_grant_topic('tenant_a', 'tenant_a.*', 'publish');
	SELECT outbox_grant_topic('tenant_a', 'outbox.event.Order', 'publish');
	SELECT outbox_grant_topic('tenant_b', 'tenant_b.*', 'publish');
});
is($node->safe_psql('postgres',
		q{SELECT string_agg(concat_ws(' ', role, topic_pattern, pattern_type, privilege, granted_by), ', ')
		    FROM outbox_topic_grants}),
	'tenant_a outbox.event.Order literal publish postgres, tenant_a tenant_a.* prefixed publish postgres, '
	  . 'tenant_b tenant_b.* prefixed publish postgres',
	'outbox_topic_grants lists each grant, its pattern\'s type and who granted it');
%ways = enqueue_ways($a_topic);
for my $way (sort keys %ways)
{
	is(stderr_as('postgres', 'tenant_a', $ways{$way}), '', "granted 'tenant_a.*': $way to $a_topic");
}
is(stderr_as('postgres', 'tenant_a',
		"INSERT INTO a_events VALUES (gen_random_uuid(), 'Order', '1', 'OrderCreated', '{}')"),
	'', 'granted outbox.event.Order: the captured table\'s insert');
like(stderr_as('postgres', 'tenant_a',
		"INSERT INTO a_events VALUES (gen_random_uuid(), 'Orders', '1', 'OrderCreated', '{}')"),
	qr/42501: role "tenant_a" may not publish to topic "outbox\.event\.Orders"/,
	'a literal grant is that topic only');
for my $outside ('tenant_a', 'tenant_aa.x', 'tenant_b.mine', "x.$a_topic")
{
	like(stderr_as('postgres', 'tenant_a', "SELECT outbox_enqueue('$outside', 'x'::text)"),
		qr/42501: role "tenant_a" may not publish to topic "\Q$outside\E"/,
		"'tenant_a.*' does not grant $outside");
}
%ways = enqueue_ways($b_topic);
like(stderr_as('postgres', 'tenant_a', $ways{$_}), qr/42501/,
	"granted its own prefix, tenant_a still cannot put $_ on tenant_b's topic")
  for ('a delayed message', 'a delayed message at a time', 'INSERT INTO outbox_message');
is($node->safe_psql('postgres', qq{SELECT count(*) FROM outbox_message WHERE topic <> '$a_topic'
                                      AND topic <> 'outbox.event.Order' AND topic <> 'team_b.news'}),
	'1', 'only the superuser\'s message is on another topic');

# A grant to a role counts for the roles that have its privileges, as any
# privilege does, and no longer once the membership is revoked.
$node->safe_psql('postgres', q{
	CREATE ROLE team_b NOLOGIN;
	GRANT team_b TO tenant_b;
	SELECT outbox_grant_topic('team_b', 'team_b.*', 'publish');
});
is(stderr_as('postgres', 'tenant_b', "SELECT outbox_enqueue('team_b.news', 'x'::text)"), '',
	'a member of the role granted publishes');
$node->safe_psql('postgres', 'REVOKE team_b FROM tenant_b');
like(stderr_as('postgres', 'tenant_b', "SELECT outbox_enqueue('team_b.news', 'x'::text)"),
	qr/42501: role "tenant_b" may not publish to topic "team_b\.news"/, 'and no longer once it is not one');

# 3. The attack: tenant_a, with no SELECT on outbox_message, subscribes to
#    tenant_b's topic with a handler that copies the payloads into its own
#    table.  Refused, whoever subscribes it to run as tenant_a.
$node->safe_psql('tenants', q{
	CREATE SCHEMA loot AUTHORIZATION tenant_a;
	GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure, integer, text, regrole) TO tenant_a;
	SET ROLE tenant_a;
	CREATE TABLE loot.copied (topic text, payload text, key text);
	CREATE FUNCTION loot.copy(m inbox_message) RETURNS void LANGUAGE sql
	    AS $$ INSERT INTO loot.copied VALUES (m.topic, payload_text(m), m.key) $$;
});
like(stderr_as('tenants', 'tenant_a', "SELECT inbox_subscribe('steal', ARRAY['$b_topic'], 'loot.copy(inbox_message)')"),
	qr/ERROR:  42501: role "tenant_a" may not subscribe to topic "\Q$b_topic\E"/,
	'the attack: a tenant cannot subscribe to another tenant\'s topic');
like(stderr_as('tenants', 'postgres',
		"SELECT inbox_subscribe('steal', ARRAY['$b_topic'], 'loot.copy(inbox_message)', run_as => 'tenant_a')"),
	qr/ERROR:  42501: role "tenant_a" may not subscribe to topic "\Q$b_topic\E"/,
	'nor be subscribed to it by a superuser: run_as needs the grant too');
$node->safe_psql('tenants', "SELECT outbox_grant_topic('tenant_a', 'tenant_a.*', 'subscribe')");
like(stderr_as('tenants', 'tenant_a',
		"SELECT inbox_subscribe('steal', ARRAY['$a_topic', '$b_topic'], 'loot.copy(inbox_message)')"),
	qr/42501: role "tenant_a" may not subscribe to topic "\Q$b_topic\E"/,
	'granted its own prefix, it still cannot add another\'s topic to its subscription');
is($node->safe_psql('tenants', 'SELECT count(*) FROM inbox_subscription'), '0', 'no subscription was made');

# 4. Its own topic it may subscribe to; a revoke stops it before its next
#    batch, which waits and says why; a grant again applies what waited.
is(stderr_as('tenants', 'tenant_a', "SELECT inbox_subscribe('own', ARRAY['$a_topic'], 'loot.copy(inbox_message)')"),
	'', 'granted its prefix, tenant_a subscribes to its own topic');
ok(wait_for_query($node, "SELECT count(*) FROM loot.copied", '4', 60, 'tenants'),
	'and its handler gets the four messages on it that are due (the delayed ones wait)');
is($node->safe_psql('tenants', "SELECT count(*) FROM loot.copied WHERE topic <> '$a_topic'"), '0',
	'none of another topic');

$node->safe_psql('tenants', "SELECT outbox_revoke_topic('tenant_a', 'tenant_a.*', 'subscribe')");
$node->safe_psql('postgres',
	"SET ROLE tenant_a; SELECT count(outbox_enqueue('$a_topic', 'after the revoke ' || i, 'r' || i)) FROM generate_series(1, 10) i");
ok(wait_for_query($node, q{SELECT count(*) FROM inbox_status
	WHERE subscription = 'own' AND worker_last_error LIKE '%subscription "own" waits: its role "tenant_a" may not subscribe to topic%'},
		'2', 60, 'tenants'),
	'revoked: the subscription waits, and inbox_status says why');
like($node->safe_psql('tenants', 'SELECT last_error FROM inbox_worker'),
	qr/may not subscribe to topic "\Q$a_topic\E"/, 'so does inbox_worker');
is($node->safe_psql('tenants', "SELECT count(*) FROM loot.copied WHERE payload LIKE 'after the revoke%'"), '0',
	'no message enqueued after the revoke was applied');

$node->safe_psql('tenants', "SELECT outbox_grant_topic('tenant_a', 'tenant_a.*', 'subscribe')");
ok(wait_for_query($node, "SELECT count(*) FROM loot.copied", '14', 60, 'tenants'),
	'granted again: every message that waited is applied');
is($node->safe_psql('tenants', "SELECT count(DISTINCT payload || key) FROM loot.copied WHERE payload LIKE 'after the revoke%'"),
	'10', 'each once: nothing lost, nothing twice');

done_testing();

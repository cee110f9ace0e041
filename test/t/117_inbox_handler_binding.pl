# An inbox subscription's rights, as a hostile or careless role would try
# them.  The handler is bound when subscribing to one function: once it is
# dropped, a function of the same name and signature that another role
# creates is never run, and the subscription waits, saying why in words,
# bound to no function for good (not bound again by name, even when marked
# as bound in another cluster).  A subscription bound in another cluster
# (pg_upgrade, a restore) whose old oid names another function here is
# bound again by its handler's signature and the other function never runs.
# Every right an ordinary call would need (EXECUTE, USAGE on the function's
# schema, being a member of the run_as role) is checked when subscribing,
# also for a handler given by its oid, and again before each batch: once one
# is revoked the subscription waits (its offsets stay, nothing is
# dead-lettered) and inbox_worker and inbox_status say why; given back, it
# resumes.  A handler's error is stored bounded, however long it is; and a
# database has at most outbox.max_subscriptions subscriptions.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = outbox_node('binding', conf => join("\n",
	"outbox.retry_backoff_base = '100ms'",
	"outbox.retry_backoff_max = '400ms'"));

$node->safe_psql('postgres', q{
	CREATE ROLE tenant_a LOGIN;
	CREATE ROLE attacker LOGIN;
	CREATE ROLE svc NOLOGIN;
	GRANT svc TO tenant_a;
	GRANT EXECUTE ON FUNCTION inbox_subscribe(text, text[], regprocedure, integer, text, regrole),
	      inbox_unsubscribe(text, boolean) TO tenant_a, attacker;
	-- every role may read the test's topics: what is refused here is
	-- refused for its handler's rights, not for a topic
	SELECT outbox_grant_topic(r, 'binding.*', 'subscribe')
	  FROM unnest(ARRAY['tenant_a', 'attacker', 'svc']::regrole[]) AS r;
	-- a schema where both tenant_a and attacker may create functions
	CREATE SCHEMA app;
	GRANT USAGE, CREATE ON SCHEMA app TO tenant_a, attacker;
	GRANT USAGE ON SCHEMA app TO svc;
	CREATE TABLE a_private (secret text);
	INSERT INTO a_private VALUES ('tenant_a''s secret');
	GRANT SELECT ON a_private TO tenant_a;
	CREATE TABLE stolen (secret text);
	GRANT INSERT ON stolen TO PUBLIC;
	CREATE TABLE applied (sub text, payload text, by_role text);
	GRANT INSERT ON applied TO tenant_a, svc;
});

# The last error of the inbox worker, once it came after $since and matches
# $pattern (a LIKE pattern); true if it did within the deadline.
sub wait_for_reason
{
	my ($since, $pattern) = @_;
	return wait_for_query($node, qq{
		SELECT last_error_at > '$since' AND last_error LIKE '$pattern' FROM inbox_worker},
		't', 60);
}

sub now { return $node->safe_psql('postgres', 'SELECT clock_timestamp()') }

sub applied
{
	my ($sub) = @_;
	return $node->safe_psql('postgres',
		"SELECT coalesce(string_agg(payload || ' by ' || by_role, ',' ORDER BY payload), '') FROM applied WHERE sub = '$sub'");
}

# Where the subscription reads from next, what waits to retry and what was
# given up on: a subscription that waits keeps all three as they were.
sub position
{
	my ($sub) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT coalesce(sum(next_offset), 0) || ' ' || sum(retrying) || ' ' || sum(dead_letters)
		FROM inbox_status WHERE subscription = '$sub'});
}

sub enqueue
{
	my ($topic, $payload) = @_;
	$node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', '$payload'::text)");
}

# 1. The handler is dropped, and a role that may create in its schema
# creates one of the same name and signature.
my $topic = unique_topic('binding.dropped');
kafka_admin('create-topic', $topic);
$node->safe_psql('postgres', qq{
	SET ROLE tenant_a;
	CREATE FUNCTION app.handle(m inbox_message) RETURNS void LANGUAGE sql
	AS \$\$ INSERT INTO public.applied VALUES ('bound', convert_from(m.payload, 'UTF8'), current_user) \$\$;
	SELECT inbox_subscribe('bound', ARRAY['$topic'], 'app.handle(inbox_message)');
});
enqueue($topic, 'one');
ok(wait_for_query($node, "SELECT count(*) FROM applied WHERE sub = 'bound'", '1', 60),
	'dropped: the handler applies the first message');
my $binding;
is(scalar $node->psql('postgres', q{
	SELECT handler || ' ' || (handler_oid = 'app.handle(inbox_message)'::regprocedure) || ' ' || subscribed_by
	FROM inbox_subscription WHERE name = 'bound'}, stdout => \$binding) == 0 && $binding,
	'app.handle(public.inbox_message) true tenant_a',
	'dropped: the subscription shows its handler, the function it is bound to, and who subscribed');

my $since = now();
$node->safe_psql('postgres', 'SET ROLE tenant_a; DROP FUNCTION app.handle(inbox_message)');
enqueue($topic, 'two');
ok(wait_for_reason($since, '%"bound"%handler app.handle(public.inbox_message)%was dropped%'),
	'dropped: inbox_worker.last_error says the handler was dropped');
my $last_error = $node->safe_psql('postgres', 'SELECT last_error FROM inbox_worker');
unlike($last_error, qr/0x[0-9a-f]{4,}/, 'dropped: the reason is words, not a pointer');

$node->safe_psql('postgres', q{
	SET ROLE attacker;
	CREATE FUNCTION app.handle(m inbox_message) RETURNS void LANGUAGE sql
	AS $$ INSERT INTO public.stolen SELECT secret FROM public.a_private $$;
});
$since = now();
enqueue($topic, 'three');
ok(wait_for_reason($since, '%"bound"%was dropped%'),
	'dropped: after the same name is created again, the subscription still waits, saying why');
is($node->safe_psql('postgres', 'SELECT count(*) FROM stolen'), '0',
	"dropped: the other role's function of the same name never ran as the subscriber");
is(applied('bound'), 'one by tenant_a', 'dropped: nothing more was applied');
is(position('bound'), '1 0 0', 'dropped: the offset stays, nothing retries or is dead-lettered');
like($node->safe_psql('postgres', "SELECT DISTINCT worker_last_error FROM inbox_status WHERE subscription = 'bound'"),
	qr/"bound".*was dropped/, 'dropped: inbox_status says why too');

# The worker stored that the subscription is bound to no function (oid 0),
# and 0 is never bound again by name: not even when the row says it was
# bound in another cluster, as after pg_upgrade or a restore.
ok(wait_for_query($node, "SELECT handler_oid FROM inbox_subscription WHERE name = 'bound'", '0', 30),
	'dropped: the worker records that the subscription is bound to no function');
$node->safe_psql('postgres', "UPDATE inbox_subscription SET handler_bound_in = 1 WHERE name = 'bound'");

# 1b. pg_upgrade (or a restore with its triggers off) leaves an oid bound in
# another cluster, which here names another function taking inbox_message:
# the attacker's.  The subscription is bound again by its handler's
# signature, before its first batch, and the other function is never called.
my $moved_topic = unique_topic('binding.moved');
kafka_admin('create-topic', $moved_topic);
my $decoy_oid = $node->safe_psql('postgres', "SELECT 'app.handle(inbox_message)'::regprocedure::oid");
$node->safe_psql('postgres', qq{
	SET ROLE tenant_a;
	CREATE FUNCTION app.handle_moved(m inbox_message) RETURNS void LANGUAGE sql
	AS \$\$ INSERT INTO public.applied VALUES ('moved', convert_from(m.payload, 'UTF8'), current_user) \$\$;
	BEGIN;
	SELECT inbox_subscribe('moved', ARRAY['$moved_topic'], 'app.handle_moved(inbox_message)');
	RESET ROLE;
	UPDATE inbox_subscription SET handler_oid = $decoy_oid, handler_bound_in = 1 WHERE name = 'moved';
	COMMIT;
});
enqueue($moved_topic, 'moved one');
ok(wait_for_query($node, "SELECT count(*) FROM applied WHERE sub = 'moved'", '1', 60),
	'moved: the subscription bound in another cluster applies its message');
is(applied('moved'), 'moved one by tenant_a', 'moved: by its own handler, as its role');
is($node->safe_psql('postgres', 'SELECT count(*) FROM stolen'), '0',
	'moved: the function its old oid names here never ran');
is($node->safe_psql('postgres', q{
	SELECT handler_oid = 'app.handle_moved(inbox_message)'::regprocedure,
	       handler_bound_in = (SELECT system_identifier FROM pg_control_system())
	FROM inbox_subscription WHERE name = 'moved'}),
	't|t', 'moved: bound again to its handler, in this cluster');
like(slurp_file($node->logfile),
	qr/LOG:  inbox subscription "moved" was bound in another cluster \(system identifier 1\): its handler app\.handle_moved\(public\.inbox_message\) is bound again, to oid \d+ \(was $decoy_oid\)/,
	'moved: the log says so');

# The read that bound "moved" read "bound" too: it stays bound to none.
is($node->safe_psql('postgres', "SELECT handler_oid FROM inbox_subscription WHERE name = 'bound'"), '0',
	'dropped: bound to no function still, though marked as bound in another cluster');
unlike(slurp_file($node->logfile), qr/inbox subscription "bound" was bound in another cluster/,
	'dropped: never bound again by name');
$since = now();
enqueue($topic, 'four');
ok(wait_for_reason($since, '%"bound"%was dropped%'), 'dropped: the subscription still waits, saying why');
is($node->safe_psql('postgres', 'SELECT count(*) FROM stolen'), '0',
	"dropped: the other role's function of the same name never ran");
$node->safe_psql('postgres', "SET ROLE tenant_a; SELECT inbox_unsubscribe('bound'); SELECT inbox_unsubscribe('moved')");

# 2. A SECURITY DEFINER handler in a schema the subscriber has no USAGE
# on, given by its oid (a name would not resolve).
$node->safe_psql('postgres', q{
	CREATE ROLE tb_owner;
	CREATE SCHEMA tb AUTHORIZATION tb_owner;
	CREATE TABLE tb.private (note text);
	ALTER TABLE tb.private OWNER TO tb_owner;
	CREATE FUNCTION tb.write_as_owner(m inbox_message) RETURNS void LANGUAGE sql SECURITY DEFINER
	AS $$ INSERT INTO tb.private VALUES (convert_from(m.payload, 'UTF8')) $$;
	ALTER FUNCTION tb.write_as_owner(inbox_message) OWNER TO tb_owner;
});
my $definer_oid = $node->safe_psql('postgres', "SELECT 'tb.write_as_owner(inbox_message)'::regprocedure::oid");
my $sneak_topic = unique_topic('binding.sneak');
my ($ret, $out, $err) = $node->psql('postgres', qq{
	SET ROLE attacker;
	\\set VERBOSITY verbose
	SELECT inbox_subscribe('sneak', ARRAY['$sneak_topic'], ${definer_oid}::regprocedure);
});
like($err, qr/42501: role "attacker" has no USAGE on schema "tb" of inbox handler tb.write_as_owner/,
	'usage: a handler given by its oid in a schema its role may not use is refused (42501)');
is($node->safe_psql('postgres', "SELECT count(*) FROM inbox_subscription WHERE name = 'sneak'"), '0',
	'usage: no subscription was made');

# 3. USAGE on the handler's schema revoked after subscribing.
$topic = unique_topic('binding.usage');
kafka_admin('create-topic', $topic);
$node->safe_psql('postgres', qq{
	CREATE SCHEMA tc;
	GRANT USAGE ON SCHEMA tc TO tenant_a;
	CREATE FUNCTION tc.handle(m inbox_message) RETURNS void LANGUAGE sql
	AS \$\$ INSERT INTO public.applied VALUES ('usage', convert_from(m.payload, 'UTF8'), current_user) \$\$;
	SET ROLE tenant_a;
	SELECT inbox_subscribe('usage', ARRAY['$topic'], 'tc.handle(inbox_message)');
});
enqueue($topic, 'u1');
ok(wait_for_query($node, "SELECT count(*) FROM applied WHERE sub = 'usage'", '1', 60),
	'usage: the handler applies the first message');
$since = now();
$node->safe_psql('postgres', 'REVOKE USAGE ON SCHEMA tc FROM tenant_a');
enqueue($topic, 'u2');
ok(wait_for_reason($since, '%"usage"%role "tenant_a" has no USAGE on schema "tc"%'),
	'usage: once USAGE on its schema is revoked, the subscription waits and says why');
is(applied('usage'), 'u1 by tenant_a', 'usage: nothing more was applied');
is(position('usage'), '1 0 0', 'usage: the offset stays, nothing retries or is dead-lettered');
$node->safe_psql('postgres', 'GRANT USAGE ON SCHEMA tc TO tenant_a');
ok(wait_for_query($node, "SELECT count(*) FROM applied WHERE sub = 'usage'", '2', 60),
	'usage: given USAGE back, the subscription resumes');
$node->safe_psql('postgres', "SET ROLE tenant_a; SELECT inbox_unsubscribe('usage')");

# 4. The subscriber loses the run_as role: REVOKE svc FROM tenant_a.
$topic = unique_topic('binding.member');
kafka_admin('create-topic', $topic);
$node->safe_psql('postgres', qq{
	SET ROLE tenant_a;
	CREATE FUNCTION app.as_svc(m inbox_message) RETURNS void LANGUAGE sql
	AS \$\$ INSERT INTO public.applied VALUES ('as_svc', convert_from(m.payload, 'UTF8'), current_user) \$\$;
	SELECT inbox_subscribe('as_svc', ARRAY['$topic'], 'app.as_svc(inbox_message)', run_as => 'svc');
});
enqueue($topic, 's1');
ok(wait_for_query($node, "SELECT count(*) FROM applied WHERE sub = 'as_svc'", '1', 60),
	'member: the handler applies the first message as svc');
$since = now();
$node->safe_psql('postgres', 'REVOKE svc FROM tenant_a');
enqueue($topic, 's2');
ok(wait_for_reason($since, '%"as_svc"%role "tenant_a", who subscribed, is no longer a member of role "svc"%'),
	'member: after REVOKE svc FROM tenant_a the subscription waits and inbox_worker says why');
like($node->safe_psql('postgres', "SELECT DISTINCT worker_last_error FROM inbox_status WHERE subscription = 'as_svc'"),
	qr/no longer a member of role "svc"/, 'member: inbox_status says why too');
is(applied('as_svc'), 's1 by svc', 'member: nothing more was applied');
is(position('as_svc'), '1 0 0', 'member: the offset stays, nothing retries or is dead-lettered');
$node->safe_psql('postgres', 'GRANT svc TO tenant_a');
ok(wait_for_query($node, "SELECT count(*) FROM applied WHERE sub = 'as_svc'", '2', 60),
	'member: given the role back, the subscription resumes');
is(applied('as_svc'), 's1 by svc,s2 by svc', 'member: the message that waited is applied, as svc');
$node->safe_psql('postgres', "SET ROLE tenant_a; SELECT inbox_unsubscribe('as_svc')");

# 4b. The same for a message waiting in inbox_retry: its retries wait too,
# no attempt counted, and it is applied once the role is given back.
$topic = unique_topic('binding.retry');
kafka_admin('create-topic', $topic);
$node->safe_psql('postgres', qq{
	CREATE TABLE fail_now (yes boolean);
	INSERT INTO fail_now VALUES (true);
	GRANT SELECT ON fail_now TO svc;
	SET ROLE tenant_a;
	CREATE FUNCTION app.flaky(m inbox_message) RETURNS void LANGUAGE plpgsql AS \$\$
	BEGIN
	    IF EXISTS (SELECT FROM public.fail_now) THEN
	        RAISE EXCEPTION 'not yet';
	    END IF;
	    INSERT INTO public.applied VALUES ('flaky', convert_from(m.payload, 'UTF8'), current_user);
	END \$\$;
	SELECT inbox_subscribe('flaky', ARRAY['$topic'], 'app.flaky(inbox_message)', run_as => 'svc',
	                       max_attempts => 100000);
});
enqueue($topic, 'r1');
ok(wait_for_query($node, "SELECT attempts > 0 FROM inbox_retry WHERE subscription = 'flaky'", 't', 60),
	'retry: the message fails and waits in inbox_retry');
$since = now();
$node->safe_psql('postgres', 'REVOKE svc FROM tenant_a');
ok(wait_for_reason($since, '%"flaky"%role "tenant_a", who subscribed, is no longer a member of role "svc"%'),
	'retry: after REVOKE svc FROM tenant_a its retries wait, and inbox_worker says why');
my $attempts = $node->safe_psql('postgres', "SELECT attempts FROM inbox_retry WHERE subscription = 'flaky'");
$node->safe_psql('postgres', 'DELETE FROM fail_now');
$since = now();
ok(wait_for_reason($since, '%"flaky"%no longer a member of role "svc"%'),
	'retry: a later round of retries still waits');
is($node->safe_psql('postgres', "SELECT attempts FROM inbox_retry WHERE subscription = 'flaky'"), $attempts,
	'retry: no attempt was made meanwhile');
is(applied('flaky'), '', 'retry: nothing was applied meanwhile');
$node->safe_psql('postgres', 'GRANT svc TO tenant_a');
ok(wait_for_query($node, "SELECT count(*) FROM applied WHERE sub = 'flaky'", '1', 60),
	'retry: given the role back, the message is applied');
is(position('flaky'), '1 0 0', 'retry: applied once, nothing left to retry, nothing dead-lettered');
$node->safe_psql('postgres', "SET ROLE tenant_a; SELECT inbox_unsubscribe('flaky')");

# 5. A handler that raises an error of a megabyte: what inbox_retry and
# inbox_dead_letter keep of it is bounded, and says it was cut.
$topic = unique_topic('binding.loud');
kafka_admin('create-topic', $topic);
$node->safe_psql('postgres', qq{
	SET ROLE tenant_a;
	CREATE FUNCTION app.loud(m inbox_message) RETURNS void LANGUAGE plpgsql
	AS \$\$ BEGIN RAISE EXCEPTION '%', repeat('x', 1000000); END \$\$;
	SELECT inbox_subscribe('loud_dead', ARRAY['$topic'], 'app.loud(inbox_message)', max_attempts => 2);
	SELECT inbox_subscribe('loud_retry', ARRAY['$topic'], 'app.loud(inbox_message)', max_attempts => 1000);
});
enqueue($topic, 'loud');
ok(wait_for_query($node, q{
	SELECT octet_length(error) <= 4096 AND error LIKE 'xxx%... (truncated)'
	FROM inbox_dead_letter WHERE subscription = 'loud_dead'}, 't', 60),
	'bounded: inbox_dead_letter keeps at most 4 kB of a 1 MB error, marked as cut');
ok(wait_for_query($node, q{
	SELECT attempts >= 1 AND octet_length(error) <= 4096 AND error LIKE 'xxx%... (truncated)'
	FROM inbox_retry WHERE subscription = 'loud_retry'}, 't', 60),
	'bounded: so does inbox_retry');
$node->safe_psql('postgres', q{
	SELECT inbox_unsubscribe('loud_dead', discard_pending => true);
	SELECT inbox_unsubscribe('loud_retry', discard_pending => true);
});

# 6. At most outbox.max_subscriptions subscriptions in a database.
($ret, $out, $err) = $node->psql('postgres', qq{
	\\set VERBOSITY verbose
	SELECT set_config('outbox.max_subscriptions', ((SELECT count(*) FROM inbox_subscription) + 1)::text, false);
	SELECT inbox_subscribe('first', ARRAY['$topic'], 'tc.handle(inbox_message)', run_as => 'tenant_a');
	SELECT inbox_subscribe('one_too_many', ARRAY['$topic'], 'tc.handle(inbox_message)', run_as => 'tenant_a');
});
like($err, qr/53400: this database has 1 inbox subscriptions, as many as outbox.max_subscriptions allows.*HINT:  Unsubscribe/s,
	'ceiling: one subscription more than outbox.max_subscriptions is refused (53400), with a hint');
is($node->safe_psql('postgres', 'SELECT string_agg(name, \',\') FROM inbox_subscription'), 'first',
	'ceiling: the subscriptions within the ceiling are made');
my $ceiling;
is(scalar $node->psql('postgres', 'SHOW outbox.max_subscriptions', stdout => \$ceiling) == 0 && $ceiling,
	'100', 'ceiling: 100 by default');

$node->stop;
done_testing();

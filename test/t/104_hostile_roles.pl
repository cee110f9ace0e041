# Hostile roles against the worker, which runs as the bootstrap superuser,
# and against the trigger function, which any role may attach to a table.
#
# - A role that may CREATE in public (every cluster upgraded from
#   PostgreSQL 14 or older keeps that grant) defines operators for argument
#   types that pg_catalog matches only through an implicit cast; a statement
#   that resolves names through public would bind to them.
# - A database's owner sets the database's search_path to a schema of its
#   own, ahead of pg_catalog, holding =, > and now().
# - A role with no grants attaches outbox_message_check() to a temporary
#   table of another shape, and to a look-alike of the outbox: refused, as
#   it may not execute the function; and, should a role be granted that,
#   the function refuses to fire on any table but the outbox's own.
#
# Each attacker function records who ran it (role, whether superuser) in a
# table of hits.  The worker is the only superuser that could run them: no
# hit may be a superuser's, while the same functions are shown to catch an
# ordinary session that resolves names as the worker once did.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = outbox_node('hostile', conf => "outbox.sent_retention = '1s'");
my $started = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');

# A table of hits, and a function that records one, in schema $schema.
sub hits_sql
{
	my ($schema) = @_;
	return qq{
		CREATE TABLE $schema.hits (attack text, run_as name, superuser boolean);
		GRANT INSERT ON $schema.hits TO PUBLIC;
		CREATE FUNCTION $schema.hit(attack text) RETURNS void LANGUAGE sql AS \$\$
			INSERT INTO $schema.hits
			SELECT attack, current_user,
			       (SELECT rolsuper FROM pg_catalog.pg_roles
			         WHERE rolname OPERATOR(pg_catalog.=) current_user)
		\$\$;
	};
}

# An operator $schema.$op (left, right) that records a hit, then does what
# pg_catalog's does once the arguments are cast.
sub trap_operator_sql
{
	my ($schema, $op, $left, $right, $cast_left, $cast_right, $returns) = @_;
	my %op_names = ('*' => 'times', '=' => 'eq', '>' => 'gt');
	my $name = "trap_${left}_$op_names{$op}_${right}";
	return qq{
		CREATE FUNCTION $schema.$name(a $left, b $right) RETURNS $returns LANGUAGE plpgsql AS \$\$
		BEGIN
			PERFORM $schema.hit('$left $op $right');
			RETURN a::$cast_left OPERATOR(pg_catalog.$op) b::$cast_right;
		END \$\$;
		CREATE OPERATOR $schema.$op (LEFTARG = $left, RIGHTARG = $right, FUNCTION = $schema.$name);
	};
}

sub superuser_hits
{
	my ($db, $schema) = @_;
	return $node->safe_psql($db, "SELECT count(*) FROM $schema.hits WHERE superuser");
}

sub delivers
{
	my ($db, $label) = @_;
	my $topic = unique_topic('hostile');
	$node->safe_psql($db,
		"SELECT count(outbox_enqueue('$topic', i::text, 'k' || i % 3)) FROM generate_series(1, 20) i");
	my $records = consume_topics(topics => [$topic], expect => 20, timeout => 60);
	is(scalar(@$records), 20, "$label: the messages are delivered");
}

# 1. Operators in public, for the arithmetic of the worker's next-retry
# and purge statements.
$node->safe_psql('postgres', q{
	CREATE ROLE attacker LOGIN;
	GRANT CREATE ON SCHEMA public TO attacker;
});
$node->safe_psql('postgres', 'SET ROLE attacker;'
	  . hits_sql('public')
	  . trap_operator_sql('public', '*', 'numeric', 'integer', 'numeric', 'numeric', 'numeric')
	  . trap_operator_sql('public', '*', 'integer', 'interval', 'float8', 'interval', 'interval')
	  . trap_operator_sql('public', '*', 'bigint', 'interval', 'float8', 'interval', 'interval'));

$node->safe_psql('postgres', 'SET ROLE attacker; SELECT 1.5 * 2');
is($node->safe_psql('postgres',
		"SELECT count(*) > 0 FROM hits WHERE NOT superuser AND attack = 'numeric * integer'"),
	't', 'public operators: the trap catches a session whose search_path has public');

delivers('postgres', 'public operators');
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE state = 'sent'", '0', 30),
	'public operators: the sent rows are purged, so the purge ran with the trap in place');
is(superuser_hits('postgres', 'public'), '0', 'public operators: no code of the attacker ran as superuser');
is($node->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = 'attacker'"),
	'f', 'public operators: the attacker is no superuser');

# 2. The trigger function on tables of a role with no grants: an ERROR,
# and the server keeps running.
$node->safe_psql('postgres', 'CREATE ROLE nobody LOGIN');
my @tables = ('t3 (topic bigint, payload bytea)',
	'outbox_message (topic text, key text, payload bytea, headers jsonb, state text, id bigint)');
sub attach_trigger
{
	my ($table) = @_;
	my ($name) = $table =~ /^(\w+)/;
	my ($ret, $stdout, $stderr) = $node->psql('postgres', qq{
		\\set VERBOSITY verbose
		\\set ON_ERROR_STOP on
		SET ROLE nobody;
		CREATE TEMP TABLE $table;
		CREATE TRIGGER x BEFORE INSERT ON $name FOR EACH ROW EXECUTE FUNCTION outbox_message_check();
		INSERT INTO $name (topic, payload) VALUES (16, 'p');
	});
	return ($name, $stderr);
}
for my $table (@tables)
{
	my ($name, $stderr) = attach_trigger($table);
	like($stderr, qr/ERROR:  42501: permission denied for function outbox_message_check/,
		"trigger on a temporary table $name: refused with SQLSTATE 42501");
}
$node->safe_psql('postgres', 'GRANT EXECUTE ON FUNCTION outbox_message_check() TO nobody');
for my $table (@tables)
{
	my ($name, $stderr) = attach_trigger($table);
	like($stderr, qr/ERROR:  42809: outbox_message_check\(\) fires only on the outbox's own table, not on "$name"/,
		"trigger on a temporary table $name, EXECUTE granted: refused with SQLSTATE 42809");
}
is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'), $started,
	'the trigger attacks did not restart the server');

# 3. A database owner's search_path, ahead of pg_catalog.  The worker serves
# one database: point it at the owner's, and restart so that it connects
# with the database's settings.
$node->safe_psql('postgres', q{
	CREATE ROLE owner LOGIN;
	CREATE DATABASE shop OWNER owner;
});
$node->append_conf('postgresql.conf', "outbox.database = 'shop'");
$node->restart;
$node->safe_psql('shop', 'CREATE EXTENSION outbox');
$node->safe_psql('shop', 'SET ROLE owner; CREATE SCHEMA evil;'
	  . hits_sql('evil')
	  . trap_operator_sql('evil', '=', 'bigint', 'bigint', 'bigint', 'bigint', 'boolean')
	  . trap_operator_sql('evil', '>', 'bigint', 'bigint', 'bigint', 'bigint', 'boolean')
	  . q{
		CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
		BEGIN PERFORM evil.hit('now()'); RETURN pg_catalog.now(); END $$;
		ALTER DATABASE shop SET search_path = evil, pg_catalog, public;
	});
$node->restart;
$started = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');

$node->safe_psql('shop', 'SET ROLE owner; SELECT now(), 1::bigint > 2::bigint');
is($node->safe_psql('shop',
		"SELECT count(DISTINCT attack) FROM evil.hits WHERE NOT superuser"),
	'2', "database owner's search_path: the trap catches a session of the database");

delivers('shop', "database owner's search_path");
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE state = 'sent'", '0', 30, 'shop'),
	"database owner's search_path: the sent rows are purged");
is(superuser_hits('shop', 'evil'), '0', "database owner's search_path: no code of the owner ran as superuser");
is($node->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = 'owner'"),
	'f', "database owner's search_path: the owner is no superuser");

is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'), $started,
	'the server was not restarted');
$node->stop('fast');
is(worker_exits($node), 0, 'the worker never crashed');
done_testing();

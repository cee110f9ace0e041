# What a role writes into the outbox cannot break it, another
# application's keys, or a restore:
#
# 1. Trace context.  A sqlcommenter comment's traceparent of a later
#    version followed by CR, LF and byte 0xFF (URL-encoded), and the same
#    in a captured table's tracingspancontext, is sent as version 00, as
#    W3C says; one that is not W3C's grammar (a tail not after '-', 1.1 MB
#    of it, an all-zero id) and a tracestate that is not (an upper-case
#    key, a byte 0xFF, 33 members, over 512 bytes) are dropped with a
#    NOTICE, and the write succeeds; so is a valid one that would make the
#    record larger than outbox.max_payload_size.  Every header stored is valid UTF-8,
#    and pg_dump | pg_restore --single-transaction of the database
#    succeeds with every message.
# 2. Delays.  deliver_at => '294276-12-31' and a deliver_after past
#    outbox.max_delay (7 days by default) are refused (22023, the setting
#    named); a delay within it is taken; only a superuser sets the ceiling.
# 3. Reserved headers.  A header named outbox-message-id, in any case,
#    is refused (22023), through outbox_enqueue() and a plain INSERT.
# 4. Rules.  A DO ALSO rule on outbox_message runs for outbox_enqueue()
#    as for an INSERT, and a DO INSTEAD NOTHING rule keeps the message out.
#
# The worker is kept from Kafka: what is stored is what this test reads.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = outbox_node('hostile_input', conf => "outbox.brokers = '127.0.0.1:1'");
$node->safe_psql('postgres', q{
	CREATE ROLE app LOGIN;
	GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO app;
	GRANT INSERT ON outbox_message TO app;
	SELECT outbox_grant_topic('app', topic, 'publish')
	  FROM unnest(ARRAY['trace.*', 'delay', 'reserved', 'ruled', 'held']) AS topic;
});

my $trace_id = '0af7651916cd43dd8448eb211c80319c';
my $parent_id = 'b7ad6b7169203331';
my $normal = "00-$trace_id-$parent_id-01";

# Run sql as role (undef: the superuser); returns (SQLSTATE or '', stderr).
sub run_sql
{
	my ($sql, $role) = @_;
	my $set_role = $role ? "SET ROLE $role;\n" : '';
	my ($ret, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\n$set_role$sql");
	my ($state) = $err =~ /ERROR:  ([0-9A-Z]{5}):/;
	return ($state // '', $err);
}

# Enqueue one message to topic with a sqlcommenter comment ending the
# statement; returns the NOTICEs it raised.
sub enqueue_with_comment
{
	my ($topic, $comment) = @_;
	my ($state, $err) = run_sql("SELECT outbox_enqueue('$topic', 'x'::text) /*$comment*/", 'app');
	is($state, '', "the write with comment on $topic succeeds");
	return join("\n", $err =~ /(NOTICE:.*)/g);
}

sub headers_of
{
	my ($topic) = @_;
	return $node->safe_psql('postgres',
		"SELECT coalesce(headers::text, 'none') FROM outbox_message WHERE topic IN ('$topic', 'outbox.event.$topic')");
}

# 1. Trace context.
my $tail = "01-$trace_id-$parent_id-01-%0D%0A%FF";
is(enqueue_with_comment('trace.later', "traceparent='$tail'"), '', 'a later version with a tail: no notice');
is(headers_of('trace.later'), qq({"traceparent": "$normal"}), 'it is sent as version 00, without the tail');

my $notes = enqueue_with_comment('trace.glued', "traceparent='01-$trace_id-$parent_id-01%0D%0A%FF'");
like($notes, qr/NOTICE:  22023: outbox: the traceparent of the statement's sqlcommenter comment is not W3C's trace context, and is ignored/,
	'a later version whose tail does not begin with "-": dropped, with a NOTICE');
is(headers_of('trace.glued'), 'none', 'the message has no trace context');

my $huge = 'a' x 1_100_000;
$notes = enqueue_with_comment('trace.huge', "traceparent='$normal$huge'");
like($notes, qr/traceparent .* is ignored/, 'a 1.1 MB version-00 traceparent: dropped, with a NOTICE');
is(headers_of('trace.huge'), 'none', 'and the write succeeded without it');
is(enqueue_with_comment('trace.huge_later', "traceparent='01-$trace_id-$parent_id-01-$huge'"), '',
	'a 1.1 MB later version');
is(headers_of('trace.huge_later'), qq({"traceparent": "$normal"}), 'is sent as its 55 characters of version 00');

# The largest payload a record without key and headers may carry: with the
# trace context it would be too large, so it goes without.
my ($full_state, $full_err) = run_sql(
	"SELECT outbox_enqueue('trace.full', repeat('x', 999909)::text) /*traceparent='$normal'*/", 'app');
is($full_state, '', 'a payload at the record size limit with a trace context in its comment: the write succeeds');
like($full_err, qr/NOTICE:  .*enqueued without its trace context, which would make its record larger than outbox.max_payload_size/,
	'without the trace context, with a NOTICE');
is(headers_of('trace.full'), 'none', 'the message has no trace context');

enqueue_with_comment('trace.zero', "traceparent='00-00000000000000000000000000000000-$parent_id-01'");
is(headers_of('trace.zero'), 'none', 'an all-zero trace id is dropped');

my %bad_states = (
	'an upper-case key' => 'Rojo=00f067aa0ba902b7',
	'a byte 0xFF' => 'rojo=%FF',
	'a CR LF' => 'rojo=1%0D%0Acongo=2',
	'33 members' => join(',', map { "k$_=v" } 1 .. 33),
	'over 512 bytes' => 'rojo=' . ('v' x 250) . ',congo=' . ('v' x 250) . ',x=' . ('v' x 20),
	'a key without value' => 'rojo',
	'a value with "="' => 'rojo=a=b',
	'a tenant beginning with "_"' => '_t\@congo=1');
my $n = 0;
for my $what (sort keys %bad_states)
{
	my $topic = 'trace.state.' . ++$n;
	$notes = enqueue_with_comment($topic, "traceparent='$normal',tracestate='$bad_states{$what}'");
	like($notes, qr/the tracestate of the statement's sqlcommenter comment .* is ignored/,
		"a tracestate with $what: a NOTICE");
	is(headers_of($topic), qq({"traceparent": "$normal"}), "a tracestate with $what is dropped, the traceparent kept");
}
enqueue_with_comment('trace.state.good', "traceparent='$normal',tracestate='rojo=00f067aa0ba902b7, t61\@congo=t61rcWkgMzE,,'");
is(headers_of('trace.state.good'),
	qq({"tracestate": "rojo=00f067aa0ba902b7, t61\@congo=t61rcWkgMzE,,", "traceparent": "$normal"}),
	'a tracestate of W3C\'s grammar (a multi-tenant key, blanks, empty members) is kept');

# A traceparent of a later version set as outbox.traceparent is sent as 00 too.
$node->safe_psql('postgres', "BEGIN; SET LOCAL outbox.traceparent = '01-$trace_id-$parent_id-01-ff';
	SELECT outbox_enqueue('trace.setting', 'x'::text); COMMIT;");
is(headers_of('trace.setting'), qq({"traceparent": "$normal"}), 'outbox.traceparent of a later version: sent as 00');

# A captured row's span context, as Properties.store() escapes CR, LF and ÿ.
$node->safe_psql('postgres', q{
	CREATE TABLE outboxevent (
	    id uuid NOT NULL, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
	    type varchar(255) NOT NULL, payload jsonb, tracingspancontext varchar(256));
	SELECT outbox_capture('outboxevent');
});
my $captured_context = "traceparent=01-$trace_id-$parent_id-01-\\r\\n\\u00ff\ntracestate=rojo\\=1\\u00ff\n";
$node->safe_psql('postgres', qq{
	INSERT INTO outboxevent VALUES ('00000000-0000-4000-8000-000000000001', 'trace.captured', '1', 'Made',
	    '{}', \$\$$captured_context\$\$);
});
like(headers_of('trace.captured'), qr/"traceparent": "$normal"/, 'a captured later version: sent as 00');
unlike(headers_of('trace.captured'), qr/tracestate/, 'its tracestate with a non-ASCII character: dropped');

is($node->safe_psql('postgres', q{
	SELECT count(*) FROM outbox_message
	 WHERE convert_from(convert_to(coalesce(headers::text, ''), 'UTF8'), 'UTF8') IS NOT NULL}),
	$node->safe_psql('postgres', 'SELECT count(*) FROM outbox_message'),
	'every stored header is valid UTF-8');

my $dump = $node->basedir . '/hostile.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-d', $node->connstr('postgres'), '-f', $dump ], 'pg_dump of the outbox');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '--single-transaction', '-d', $node->connstr('restored'), $dump ],
	'pg_restore --single-transaction of it succeeds');
is($node->safe_psql('restored', 'SELECT count(*) FROM outbox_message'),
	$node->safe_psql('postgres', 'SELECT count(*) FROM outbox_message'),
	'and restores every message');

# 2. Delays.
my ($state, $err) = run_sql("SELECT outbox_enqueue('delay', 'x'::text, 'cust-42', deliver_at => '294276-12-31')", 'app');
is($state, '22023', 'deliver_at in the year 294276 is refused (22023)');
like($err, qr/more than outbox.max_delay \(7d\) from now/, 'the error names outbox.max_delay');
like($err, qr/HINT:  .*outbox.max_delay/, 'and so does its hint');
($state) = run_sql("SELECT outbox_enqueue('delay', 'x'::text, 'cust-42', deliver_after => '8 days')", 'app');
is($state, '22023', 'deliver_after of 8 days is refused');
($state) = run_sql("SELECT outbox_enqueue('delay', 'x'::text, 'cust-42', deliver_after => '6 days')", 'app');
is($state, '', 'deliver_after of 6 days is taken');
is($node->safe_psql('postgres', "SELECT state, next_attempt_at > now() + interval '5 days' FROM outbox_message WHERE topic = 'delay'"),
	'retrying|t', 'and waits');
($state) = run_sql("SET outbox.max_delay = '1000d'", 'app');
is($state, '42501', 'a role that enqueues may not raise outbox.max_delay');
($state) = run_sql("SET outbox.max_delay = '1h'; SELECT outbox_enqueue('delay', 'x'::text, 'k', deliver_after => '2 hours')");
is($state, '22023', 'a superuser lowers it to 1h: a delay of 2 hours is refused');
($state) = run_sql("SET outbox.max_delay = '1h'; SELECT outbox_enqueue('delay', 'x'::text, 'k', deliver_at => now() + interval '30 min')");
is($state, '', 'and one of 30 minutes taken');

# 3. Reserved headers.
for my $name ('outbox-message-id', 'Outbox-Message-ID')
{
	($state, $err) = run_sql(qq{SELECT outbox_enqueue('reserved', 'x'::text, 'k', '{"$name": "evil"}')}, 'app');
	is($state, '22023', "outbox_enqueue() with a header \"$name\" is refused (22023)");
	like($err, qr/HINT:  Give the header another name/, 'with a hint');
	($state) = run_sql(qq{INSERT INTO outbox_message (topic, payload, headers) VALUES ('reserved', 'x', '{"$name": "evil"}')}, 'app');
	is($state, '22023', "so is an INSERT with it");
}
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox_message WHERE topic = 'reserved'"), '0',
	'no message carries it');

# 4. Rules, as an owner may add them.
$node->safe_psql('postgres', q{
	CREATE TABLE outbox_audit (topic text, key text);
	CREATE RULE outbox_audit AS ON INSERT TO outbox_message DO ALSO INSERT INTO outbox_audit VALUES (NEW.topic, NEW.key);
});
($state) = run_sql("SELECT outbox_enqueue('ruled', 'x'::text, 'k1')", 'app');
is($state, '', 'outbox_enqueue() under a DO ALSO rule succeeds');
is($node->safe_psql('postgres', 'SELECT topic || \'/\' || key FROM outbox_audit'), 'ruled/k1', 'and the rule ran');
$node->safe_psql('postgres', q{
	DROP RULE outbox_audit ON outbox_message;
	CREATE RULE outbox_hold AS ON INSERT TO outbox_message WHERE NEW.topic = 'held' DO INSTEAD NOTHING;
});
run_sql("SELECT outbox_enqueue('held', 'x'::text, 'k1')", 'app');
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox_message WHERE topic = 'held'"), '0',
	'a DO INSTEAD NOTHING rule keeps the message out');
$node->safe_psql('postgres', 'DROP RULE outbox_hold ON outbox_message');
($state) = run_sql("SELECT outbox_enqueue('held', 'x'::text, 'k1')", 'app');
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox_message WHERE topic = 'held'"), '1',
	'without the rule, it is written');

done_testing();

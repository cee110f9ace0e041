# Every database: the launcher starts a worker for each database that has
# the extension, and each publishes its own database's messages only.
#
# - Three databases under load at once: nothing lost, phantom or out of
#   order in any, and each database's messages in its own topics only.
# - CREATE EXTENSION in a new database, and a database created from a
#   template that has the extension (the template itself is skipped): the
#   first message reaches Kafka within 2 s.
# - DROP DATABASE, ALTER DATABASE ... RENAME or SET TABLESPACE, CREATE
#   DATABASE ... TEMPLATE of a served database succeed without FORCE,
#   while the others go on; a role that does not own a database cannot use
#   them to stop its worker.
# - outbox.databases changed by reload; the WARNING of an enqueue that no
#   worker will publish, once per session.
# - More databases than outbox.max_workers: the rest wait, listed, and one
#   is served when a slot frees; max_worker_processes too small for the
#   budget, said in outbox_launcher.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

# The first message's deadline, from the commit that makes a database
# publishable to its record in Kafka ("within 2 seconds").
my $first_message_deadline_ms = 2000;

my $node = outbox_node('databases',
	conf => "outbox.max_workers = 8\nmax_worker_processes = 16");

# A psql session's stderr, for the WARNINGs; dies if it fails.
sub psql_stderr
{
	my ($db, $sql, %params) = @_;
	my $on = delete $params{node} // $node;
	my ($ret, $out, $err) = $on->psql($db, $sql, %params);
	die "psql in $db failed: $err" if $ret != 0;
	return $err;
}

sub worker_pid
{
	my ($db) = @_;
	return $node->safe_psql('postgres', "SELECT pid FROM outbox_worker WHERE database = '$db'");
}

# A topic whose records carry the time the broker appended them, so that
# the record tells when it reached Kafka.
sub append_time_topic
{
	my ($prefix) = @_;
	my $topic = unique_topic($prefix);
	kafka_admin('create-topic', $topic, '--config', 'message.timestamp.type=LogAppendTime');
	return $topic;
}

# The one record of the topic, and the milliseconds from $since (epoch
# seconds, the server's clock) to its append in Kafka.
sub first_record_after
{
	my ($topic, $since) = @_;
	my $records = consume_topics(topics => [$topic], expect => 1, timeout => 60);
	my $record = $records->[0] or return (undef, undef);
	die "expected LogAppendTime, got $record->{timestamp_type}"
	  unless $record->{timestamp_type} eq 'LogAppendTime';
	return ($record, $record->{timestamp} - $since * 1000);
}

# 1. Three databases under load at once.
my @dbs = qw(shop billing crm);
my %topics;
for my $db (@dbs)
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION outbox');
	$topics{$db} = [ unique_topic("databases.$db"), unique_topic("databases.$db") ];
}
ok(wait_for_query($node,
		"SELECT string_agg(database || ':' || state, ',' ORDER BY database) FROM outbox_worker",
		'billing:idle,crm:idle,postgres:idle,shop:idle', 60),
	'a worker serves each database that has the extension');
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM outbox_worker w
		  JOIN pg_stat_activity a ON a.pid = w.pid
		 WHERE a.backend_type = 'outbox worker' AND a.datname = w.database}), '4',
	'each worker is connected to the database it serves');

my %load = map { ($_ => start_load($node, db => $_, topics => $topics{$_},
			clients => 4, rate => 100, duration => 25)) } @dbs;

# 2. CREATE EXTENSION in a new database while the others are under load.
$node->safe_psql('postgres', 'CREATE DATABASE news');
my $news_topic = append_time_topic('databases.news');
my ($created_at, $enqueued_at) = split /\n/, $node->safe_psql('news', qq{
	CREATE EXTENSION outbox;
	SELECT extract(epoch FROM clock_timestamp());
	SELECT outbox_enqueue('$news_topic', 'first news'::text) \\g /dev/null
	SELECT extract(epoch FROM clock_timestamp());
});
my ($record, $latency_ms) = first_record_after($news_topic, $created_at);
is($record && $record->{value}, 'first news', 'the new database\'s first message is published');
diag(sprintf('CREATE EXTENSION to the first message in Kafka: %.0f ms (from its enqueue\'s commit: %.0f ms), under load in 3 other databases',
		$latency_ms, $latency_ms - ($enqueued_at - $created_at) * 1000));
cmp_ok($latency_ms, '<', $first_message_deadline_ms,
	"it is in Kafka within $first_message_deadline_ms ms of CREATE EXTENSION's commit");
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox_worker WHERE database = 'news'"), '1',
	'a worker serves the new database');

# 3. A database created from template1 once template1 has the extension:
# template1 gets no worker, the copy does.
$node->safe_psql('template1', 'CREATE EXTENSION outbox');
my $err = psql_stderr('template1', qq{
	BEGIN;
	SELECT outbox_enqueue('databases.never', 'in a template'::text);
	ROLLBACK;
});
like($err, qr/WARNING:  outbox: no worker publishes the messages of database "template1"\nDETAIL:  It is a template database, or it does not allow connections: no worker connects to it.\nHINT:  /,
	'an enqueue in a template database says that no worker will publish it');
my $copy_topic = append_time_topic('databases.copy');
($created_at) = split /\n/, $node->safe_psql('postgres', qq{
	CREATE DATABASE fromtmpl;
	SELECT extract(epoch FROM clock_timestamp());
});
$node->safe_psql('fromtmpl', "SELECT outbox_enqueue('$copy_topic', 'first copy'::text)");
($record, $latency_ms) = first_record_after($copy_topic, $created_at);
is($record && $record->{value}, 'first copy', 'the copy\'s first message is published');
diag(sprintf('CREATE DATABASE from a template with the extension to the first message in Kafka: %.0f ms',
		$latency_ms));
cmp_ok($latency_ms, '<', $first_message_deadline_ms,
	"it is in Kafka within $first_message_deadline_ms ms of CREATE DATABASE's commit");
is($node->safe_psql('postgres', q{
		SELECT count(*) FILTER (WHERE database = 'fromtmpl'),
		       count(*) FILTER (WHERE database = 'template1')
		  FROM outbox_worker}), '1|0',
	'the copy is served, the template is not');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE datname = 'template1' AND backend_type = 'outbox worker'"),
	'0', 'no worker is connected to the template');
$node->safe_psql('template1', 'DROP EXTENSION outbox');

# 4. DROP DATABASE, no FORCE, of a database whose worker is publishing a
# backlog while the others are under load.
my $backlog_topic = unique_topic('databases.news.backlog');
# (a plain INSERT is an enqueue too, and several times faster in bulk)
$node->safe_psql('news', qq{
	INSERT INTO outbox_message (topic, key, payload)
	SELECT '$backlog_topic', 'bulk-' || (i % 100), convert_to(json_build_object('n', i)::text, 'UTF8')
	  FROM generate_series(1, 100000) i});
ok(wait_for_query($node,
		"SELECT state = 'publishing' AND (SELECT count(*) FROM outbox_message) > 0
		   FROM outbox_worker WHERE database = 'news'", 't', 60, 'news'),
	'the worker of news is publishing its backlog');
my $t0 = time();
my ($ret, $out);
($ret, $out, $err) = $node->psql('postgres', 'DROP DATABASE news');
my $drop_s = time() - $t0;
is($ret, 0, 'DROP DATABASE of a database being published succeeds without FORCE');
unlike($err, qr/being accessed by other users/, 'no "being accessed by other users"');
note(sprintf('DROP DATABASE took %.2f s', $drop_s));
ok(wait_for_query($node,
		"SELECT count(*) FROM outbox_worker WHERE database IS NULL OR database = 'news'", '0', 10),
	'its worker is gone from outbox_worker');

# 5. A role that does not own a database: its DROP, RENAME and copy of it
# are refused, and the worker of that database is left alone.
$node->safe_psql('postgres', 'CREATE ROLE mallory LOGIN CREATEDB');
my $shop_pid = worker_pid('shop');
my @as_mallory = (extra_params => [ '-U', 'mallory' ]);
for my $attempt (
	[ 'DROP DATABASE shop', qr/must be owner of database shop/ ],
	[ 'ALTER DATABASE shop RENAME TO mallorys', qr/must be owner of database shop/ ],
	[ 'CREATE DATABASE mallorys TEMPLATE shop', qr/permission denied to copy database "shop"/ ])
{
	my ($sql, $refusal) = @$attempt;
	($ret, $out, $err) = $node->psql('postgres', $sql, @as_mallory);
	like($err, $refusal, "a role that does not own the database: $sql is refused");
}
is(worker_pid('shop'), $shop_pid, 'and the worker of shop was not disturbed: the same pid');

# Nor do statements that PostgreSQL refuses before they start stop the
# worker, even a superuser's: DROP or copy inside a transaction block, a
# rename of the database the session is connected to.
for my $attempt (
	[ 'postgres', 'BEGIN; DROP DATABASE shop', qr/cannot run inside a transaction block/ ],
	[ 'postgres', 'BEGIN; CREATE DATABASE shop2 TEMPLATE shop', qr/cannot run inside a transaction block/ ],
	[ 'shop', 'ALTER DATABASE shop RENAME TO shop2', qr/current database cannot be renamed/ ])
{
	my ($db, $sql, $refusal) = @$attempt;
	($ret, $out, $err) = $node->psql($db, $sql);
	like($err, $refusal, "$sql is refused");
}
is(worker_pid('shop'), $shop_pid, 'and the worker of shop was not stopped for them: the same pid');

# The owner of a database, no superuser, may drop it: the check is
# ownership, as DROP DATABASE's own.
$node->safe_psql('postgres', 'CREATE ROLE alice LOGIN; CREATE DATABASE alices OWNER alice');
$node->safe_psql('alices', 'CREATE EXTENSION outbox');
ok(wait_for_query($node, "SELECT pid IS NOT NULL FROM outbox_worker WHERE database = 'alices'", 't', 30),
	'a worker serves a database owned by a role that is no superuser');
($ret, $out, $err) = $node->psql('postgres', 'DROP DATABASE alices', extra_params => [ '-U', 'alice' ]);
is($ret, 0, 'its owner drops it, without FORCE');
unlike($err, qr/being accessed by other users/, 'no "being accessed by other users"');

# The loads end: every database published all its committed messages, and
# only into its own topics.
finish_load($load{$_}) for @dbs;
fault_check($node, db => $_, scenario => "113 every database: $_", topics => $topics{$_}) for @dbs;
my %db_of_message;
for my $db (@dbs)
{
	$db_of_message{$_} = $db for split /\n/, $node->safe_psql($db, 'SELECT message_id FROM fault_log');
}
my ($misplaced, $unknown) = (0, 0);
for my $db (@dbs)
{
	for my $record (@{ consume_topics(topics => $topics{$db}, idle => 3, timeout => 120) })
	{
		my $owner = $db_of_message{ message_id_header($record) // '' };
		$unknown++ if !defined $owner;
		$misplaced++ if defined $owner && $owner ne $db;
	}
}
is("$misplaced|$unknown", '0|0', 'each database\'s topics hold its own messages only');

# ALTER DATABASE ... RENAME and SET TABLESPACE of a served database, and
# CREATE DATABASE ... TEMPLATE of one, no load on them: each succeeds
# without FORCE, its worker having stepped aside, and a new one serves the
# database afterwards (under its new name); the copy, which has the
# extension, gets one of its own.
my $tablespace_dir = PostgreSQL::Test::Utils::tempdir();
$node->safe_psql('postgres', "CREATE TABLESPACE elsewhere LOCATION '$tablespace_dir'");
my $after_topic = unique_topic('databases.after');
for my $case (
	[ 'ALTER DATABASE crm RENAME TO crm_renamed', 'crm', 'crm_renamed' ],
	[ 'ALTER DATABASE billing SET TABLESPACE elsewhere', 'billing', 'billing' ],
	[ 'CREATE DATABASE shop_copy TEMPLATE shop', 'shop', 'shop' ])
{
	my ($sql, $db, $after) = @$case;
	my $pid = worker_pid($db);
	($ret, $out, $err) = $node->psql('postgres', $sql);
	is($ret, 0, "$sql of a served database succeeds without FORCE");
	unlike($err, qr/being accessed by other users/, "$sql: no \"being accessed by other users\"");
	ok(wait_for_query($node,
			"SELECT pid IS NOT NULL AND pid <> $pid FROM outbox_worker WHERE database = '$after'", 't', 30),
		"$sql: a new worker serves $after");
}
ok(wait_for_query($node, "SELECT pid IS NOT NULL FROM outbox_worker WHERE database = 'shop_copy'", 't', 30),
	'the copy of shop has a worker of its own');
$node->safe_psql($_, "SELECT outbox_enqueue('$after_topic', '$_'::text)") for qw(crm_renamed billing shop shop_copy);
is(join(',', sort map { $_->{value} } @{ consume_topics(topics => [$after_topic], expect => 4, timeout => 60) }),
	'billing,crm_renamed,shop,shop_copy', 'and each of them publishes what it enqueues');

# 6, 7. outbox.databases = 'shop', by reload: the other workers leave, an
# enqueue elsewhere is warned of, once per session; back to '', all is
# served again, and what was enqueued meanwhile delivered.
my @others = qw(billing crm_renamed fromtmpl postgres shop_copy);
my $allow_topic = unique_topic('databases.allow');
$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.databases = 'shop'; SELECT pg_reload_conf()");
ok(wait_for_query($node, 'SELECT string_agg(database, \',\') FROM outbox_worker', 'shop', 30),
	'outbox.databases = shop, reloaded: only the worker of shop stays');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox worker' AND datname <> 'shop'"),
	'0', 'the workers of the other databases have exited');
$err = psql_stderr('billing', qq{
	SELECT outbox_enqueue('$allow_topic', 'billing 1'::text);
	SELECT outbox_enqueue('$allow_topic', 'billing 2'::text);
});
like($err, qr/WARNING:  outbox: no worker publishes the messages of database "billing"\nDETAIL:  outbox.databases does not list it.\nHINT:  Add "billing" to outbox.databases, or set it to '' to publish every database, and reload the configuration./,
	'an enqueue in a database outbox.databases does not list is warned of, with why and what to do');
is(() = $err =~ /WARNING:/g, 1, 'once per session: the second enqueue of the session is not');
$err = psql_stderr('billing', "SELECT outbox_enqueue('$allow_topic', 'billing 3'::text)");
like($err, qr/WARNING:  outbox: no worker publishes the messages of database "billing"/,
	'a new session is warned again');
for my $db (grep { $_ ne 'billing' } @others)
{
	$err = psql_stderr($db, "SELECT outbox_enqueue('$allow_topic', '$db 1'::text)");
	like($err, qr/WARNING:  outbox: no worker publishes the messages of database "$db"\nDETAIL:  outbox.databases does not list it./,
		"so is an enqueue in $db");
}
$err = psql_stderr('shop', "SELECT outbox_enqueue('$allow_topic', 'shop 1'::text)");
is($err, '', 'an enqueue in shop is not warned of');
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE topic = '$allow_topic'", '0', 30, 'shop'),
	'and is delivered');
is(join(',', map { $_->{value} } @{ consume_topics(topics => [$allow_topic], idle => 2, timeout => 30) }),
	'shop 1', 'the other databases\' messages wait: only shop\'s is in Kafka');

$node->safe_psql('postgres', 'ALTER SYSTEM RESET outbox.databases; SELECT pg_reload_conf()');
ok(wait_for_query($node, 'SELECT string_agg(database, \',\' ORDER BY database) FROM outbox_worker',
		join(',', sort(@others, 'shop')), 30),
	'outbox.databases back to empty, reloaded: every database is served again');
my $allowed = consume_topics(topics => [$allow_topic], expect => 8, timeout => 60);
is(join(',', sort map { $_->{value} } @$allowed),
	join(',', sort('shop 1', 'billing 1', 'billing 2', 'billing 3', map { "$_ 1" } grep { $_ ne 'billing' } @others)),
	'and what they enqueued meanwhile is delivered');

# The deprecated outbox.database, reloaded, is an allow-list of one.
$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.database = 'billing'; SELECT pg_reload_conf()");
ok(wait_for_query($node, 'SELECT string_agg(database, \',\') FROM outbox_worker', 'billing', 30),
	'outbox.database = billing, reloaded: only the worker of billing stays');
$err = psql_stderr('shop', "BEGIN; SELECT outbox_enqueue('databases.never', 'x'::text); ROLLBACK;");
like($err, qr/WARNING:  outbox: no worker publishes the messages of database "shop"\nDETAIL:  outbox.database does not list it./,
	'an enqueue elsewhere names outbox.database as the reason');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET outbox.database; SELECT pg_reload_conf()');
ok(wait_for_query($node, 'SELECT count(*) FROM outbox_worker', scalar(@others) + 1, 30),
	'outbox.database reset: every database is served again');

# A served database made a template: its worker leaves, and an enqueue
# there is warned of; made an ordinary database again, it is served, and
# what it enqueued meanwhile delivered.
my $template_topic = unique_topic('databases.template');
$node->safe_psql('postgres', 'ALTER DATABASE fromtmpl IS_TEMPLATE true');
ok(wait_for_query($node, "SELECT count(*) FROM outbox_worker WHERE database = 'fromtmpl'", '0', 30),
	'ALTER DATABASE ... IS_TEMPLATE true: the worker of the database leaves');
$err = psql_stderr('fromtmpl', "SELECT outbox_enqueue('$template_topic', 'while a template'::text)");
like($err, qr/WARNING:  outbox: no worker publishes the messages of database "fromtmpl"\nDETAIL:  It is a template database/,
	'an enqueue in it says it is a template');
$node->safe_psql('postgres', 'ALTER DATABASE fromtmpl IS_TEMPLATE false');
is(join(',', map { $_->{value} } @{ consume_topics(topics => [$template_topic], expect => 1, timeout => 60) }),
	'while a template', 'IS_TEMPLATE false: it is served again, and its message delivered');

# CREATE EXTENSION commits while the launcher's probe of the database,
# which read the catalog before that commit, is yet to be reaped: the
# announcement of the extension must not be lost to the probe's stale "no
# extension".  To make that window as wide as a busy machine may: the
# probe waits at the database's pg_extension, locked by a session there,
# until the launcher is stopped (SIGSTOP); then it finds no extension and
# exits; CREATE EXTENSION commits; the launcher goes on.  (The database is
# a template, so not probed, until the lock is taken.)
sub probe_pids
{
	my @pids;
	for my $cmdline (glob '/proc/[0-9]*/cmdline')
	{
		open my $fh, '<', $cmdline or next;
		my $title = <$fh> // '';
		push @pids, $cmdline =~ m{^/proc/(\d+)/} if $title =~ /^postgres: \Q${\ $node->name }\E: outbox probe/;
	}
	return @pids;
}
my $launcher = $node->safe_psql('postgres', 'SELECT pid FROM outbox_launcher');
$node->safe_psql('postgres', 'CREATE DATABASE provisioned IS_TEMPLATE true');
my $holder = $node->background_psql('provisioned');
$holder->query_safe('BEGIN; LOCK TABLE pg_catalog.pg_extension IN ACCESS EXCLUSIVE MODE');
$node->safe_psql('postgres', 'ALTER DATABASE provisioned IS_TEMPLATE false');
my $held = 0;
for (my $deadline = time() + 30; !$held && time() < $deadline; sleep(0.1))
{
	$held = grep {
		$node->safe_psql('postgres', "SELECT count(*) FROM pg_locks WHERE pid = $_ AND NOT granted") eq '1'
	} probe_pids();
}
ok($held, 'the probe of the database waits for its catalog');
kill 'STOP', $launcher or die "cannot stop the launcher: $!";
eval {
	$holder->query_safe('COMMIT');
	my $deadline = time() + 30;
	sleep(0.05) while probe_pids() && time() < $deadline;
	is(scalar(probe_pids()), 0, 'it finds no extension there yet, and exits');
	$node->safe_psql('provisioned', 'CREATE EXTENSION outbox');
};
kill 'CONT', $launcher;
die $@ if $@;
$holder->quit;
ok(wait_for_query($node, "SELECT pid IS NOT NULL FROM outbox_worker WHERE database = 'provisioned'", 't', 15),
	'CREATE EXTENSION committed meanwhile: a worker serves the database');

$node->stop('fast');
is(worker_exits($node), 0, 'no launcher, worker or probe exited with an error: each worker that left was asked to');

# 8. 20 databases, 8 workers: 8 served, 12 waiting and listed; an enqueue
# in a waiting one is warned of; dropping the extension in a served one
# hands its worker to a waiting one, which publishes what waited.  The 20
# are copies of a template that has the extension (a template is never
# served itself); postgres has no extension, so only the 20 count.
my $many = outbox_node('many_databases', no_extension => 1,
	conf => "outbox.max_workers = 8\nmax_worker_processes = 16");
$many->safe_psql('postgres', 'CREATE DATABASE tmpl_outbox IS_TEMPLATE true');
$many->safe_psql('tmpl_outbox', 'CREATE EXTENSION outbox');
my @many = map { sprintf('d%02d', $_) } 1 .. 20;
$many->safe_psql('postgres', join('', map { "CREATE DATABASE $_ TEMPLATE tmpl_outbox;\n" } @many));
ok(wait_for_query($many,
		'SELECT workers, databases_waiting, cardinality(waiting), (SELECT count(*) FROM outbox_worker) FROM outbox_launcher',
		'8|12|12|8', 60, 'd01'),
	'20 databases and outbox.max_workers = 8: 8 served, 12 waiting');
my @served = split /\n/, $many->safe_psql('d01', 'SELECT database FROM outbox_worker ORDER BY database');
my @waiting = split /\n/, $many->safe_psql('d01', 'SELECT unnest(waiting) FROM outbox_launcher ORDER BY 1');
my %is_served = map { ($_ => 1) } @served;
is(join(',', @waiting), join(',', grep { !$is_served{$_} } @many),
	'outbox_launcher lists the 12 that wait, none of those served');
is($many->safe_psql('d01',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox worker'"), '8',
	'8 workers run');
is($many->safe_psql('d01',
		"SELECT count(*) FROM outbox_worker WHERE database = 'tmpl_outbox'"), '0',
	'the template is not among them');

my $waited_topic = unique_topic('databases.waited');
my @warnings;
for my $db (@waiting)
{
	push @warnings, psql_stderr($db, "SELECT outbox_enqueue('$waited_topic', '$db'::text)", node => $many);
}
like($warnings[0], qr/WARNING:  outbox: no worker publishes the messages of database "$waiting[0]"\nDETAIL:  It waits for a worker: the 8 of outbox.max_workers serve other databases, or max_worker_processes has none left \(outbox_launcher says which\).\nHINT:  Raise outbox.max_workers/,
	'an enqueue in a waiting database says it waits for a worker');
is(scalar(grep { /DETAIL:  It waits for a worker/ } @warnings), 12, 'so does one in each of the 12');
my ($victim) = grep { $_ ne 'd01' } @served;
$many->safe_psql($victim, 'DROP EXTENSION outbox');
ok(wait_for_query($many,
		"SELECT workers, databases_waiting, (SELECT count(*) FROM outbox_worker WHERE database = '$victim') FROM outbox_launcher",
		'8|11|0', 30, 'd01'),
	"DROP EXTENSION in $victim: its worker leaves and a waiting database takes the slot");
my @promoted = grep { !$is_served{$_} } split /\n/,
  $many->safe_psql('d01', 'SELECT database FROM outbox_worker ORDER BY database');
is(scalar(@promoted), 1, 'one database that waited is served');
my $promoted = $promoted[0] // 'none';
ok(wait_for_query($many, "SELECT count(*) FROM outbox_message", '0', 30, $promoted),
	"$promoted publishes the message that waited");
is(join(',', map { $_->{value} } @{ consume_topics(topics => [$waited_topic], idle => 2, timeout => 30) }),
	$promoted, 'Kafka has it, and nothing of the 11 still waiting');
$many->stop('fast');
is(worker_exits($many), 0, 'no launcher, worker or probe exited with an error');

# max_worker_processes too small for outbox.max_workers: 3 background
# workers, the launcher one of them (no logical replication launcher), and
# three databases: two served, the third waits, and outbox_launcher says
# why.
my $small = outbox_node('small_budget', no_extension => 1,
	conf => "outbox.max_workers = 4\nmax_worker_processes = 3\nmax_logical_replication_workers = 0");
for my $db (qw(a b c))
{
	$small->safe_psql('postgres', "CREATE DATABASE $db");
	$small->safe_psql($db, 'CREATE EXTENSION outbox');
}
ok(wait_for_query($small,
		"SELECT workers, databases_waiting, last_error ~ 'max_worker_processes' FROM outbox_launcher",
		'2|1|t', 60, 'a'),
	'max_worker_processes = 3: two databases served, one waits, and last_error says to raise max_worker_processes');
my ($short) = grep { my $db = $_; !grep { $_ eq $db } split /\n/, $small->safe_psql('a', 'SELECT database FROM outbox_worker') } qw(a b c);
is($small->safe_psql('a', 'SELECT waiting FROM outbox_launcher'), "{$short}",
	'outbox_launcher lists the one that waits');
note($small->safe_psql('a', 'SELECT last_error FROM outbox_launcher'));
($ret, $out, $err) = $small->psql($short, "SELECT outbox_enqueue('databases.short', 'x'::text)");
like($err, qr/DETAIL:  It waits for a worker: .* or max_worker_processes has none left/,
	"an enqueue in $short says it waits for a worker");
# A database without the extension, created while no background worker is
# left: its probe cannot start either, and outbox_launcher says what to
# raise for that too.
$small->safe_psql('postgres', 'CREATE DATABASE z');
ok(wait_for_query($small, 'SELECT last_error FROM outbox_launcher',
		'could not start a probe of database "z": no background worker slot is free; raise max_worker_processes',
		30, 'a'),
	'a database that cannot be probed for want of a background worker: last_error says to raise max_worker_processes');
$small->stop('fast');
is(worker_exits($small), 0, 'no launcher, worker or probe exited with an error');

done_testing();

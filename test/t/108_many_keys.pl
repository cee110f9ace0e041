# One transaction enqueues 50,000 distinct keys, through outbox_enqueue()
# and through INSERT, under the default lock table.  With a lock per key it
# filled PostgreSQL's shared lock table (its own enqueue, or every new
# connection, failed with "out of shared memory"); with the bounded key locks
# of src/key_lock.c it holds at most 48 of them, other sessions connect and
# vacuum meanwhile, an enqueue for one of its keys waits for its commit, one
# for another key does not wait, and all of it reaches Kafka in per-key
# order.  The locks' tags are keyed
# by a secret drawn at each start, so they tell nothing about the key.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

# KEY_LOCKS_EXACT + KEY_LOCK_BUCKETS in src/key_lock.c
my $max_key_locks = 48;
my $keys = 50_000;

# The lock table as PostgreSQL sizes it by default; rows stay as 'sent' so
# that each record maps back to its id.
my $node = outbox_node('many_keys', conf => join("\n",
		'max_connections = 100', 'max_locks_per_transaction = 64', 'max_prepared_transactions = 2',
		"outbox.sent_retention = '1h'"));
my $topic = unique_topic('many_keys');
$node->safe_psql('postgres', q{
	CREATE ROLE app LOGIN;
	GRANT EXECUTE ON FUNCTION outbox_enqueue(text, text, text, jsonb, integer, interval, timestamptz) TO app;
	CREATE TABLE vacuum_me AS SELECT i FROM generate_series(1, 1000) i;
	CREATE DATABASE other;
});
$node->safe_psql('postgres', "SELECT outbox_grant_topic('app', '$topic', 'publish')");
$node->safe_psql('other', 'CREATE EXTENSION outbox');

# The extension's locks (0x4f42 exact, 0x4f43 bucket) held by a backend.
my $key_locks_of = sub {
	my ($pid) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT count(DISTINCT (classid, objid, objsubid)) FROM pg_locks
		 WHERE locktype = 'advisory' AND objsubid IN (20290, 20291) AND pid = $pid});
};

# The connections and the VACUUM (which autovacuum runs) that must work
# while the transaction is open, as superuser and as an ordinary role.
my $others_get_in = sub {
	my ($when) = @_;
	my ($ret, $stdout, $stderr) = $node->psql('postgres', 'SELECT 1');
	is($ret, 0, "a superuser connects $when") or diag($stderr);
	($ret, $stdout, $stderr) = $node->psql('postgres', 'SELECT 1', extra_params => [ '-U', 'app' ]);
	is($ret, 0, "an ordinary role connects $when") or diag($stderr);
	($ret, $stdout, $stderr) = $node->psql('postgres', 'VACUUM ANALYZE vacuum_me');
	is($ret, 0, "VACUUM runs $when") or diag($stderr);
};

# Half the keys by outbox_enqueue(), key by key, each in a subtransaction
# that stops at "out of shared memory": so if the lock table fills, the
# transaction stays open holding what it took.  (With a lock per key it
# stopped at about 12,800 keys, and then every new connection failed.)
my $big = $node->background_psql('postgres');
my $big_pid = $big->query_safe('SELECT pg_backend_pid()');
$big->query_safe('BEGIN');
$big->query_safe(qq{
	DO \$\$
	BEGIN
		FOR i IN 1 .. @{[ $keys / 2 ]} LOOP
			BEGIN
				PERFORM outbox_enqueue('$topic', 'first'::text, 'key-' || i);
			EXCEPTION WHEN out_of_memory THEN    -- "out of shared memory"
				PERFORM set_config('many_keys.stopped_at', i::text, false);
				EXIT;
			END;
		END LOOP;
	END
	\$\$});
$others_get_in->('while it is open');
is($big->query_safe(q{SELECT current_setting('many_keys.stopped_at', true) IS NULL}), 't',
	'the open transaction enqueued 25,000 keys through outbox_enqueue()')
  or diag('it stopped at key ' . $big->query_safe(q{SELECT current_setting('many_keys.stopped_at')}));

# The other half by INSERT (the trigger locks too), in statements of 5,000,
# then a second message for the first 1,000 keys (some of them under exact
# locks, most under buckets).
for (my $from = $keys / 2 + 1; $from <= $keys; $from += 5000)
{
	my $to = $from + 4999;
	ok(eval {
			$big->query_safe(qq{INSERT INTO outbox_message (topic, key, payload)
				SELECT '$topic', 'key-' || i, 'first' FROM generate_series($from, $to) i});
			1;
		}, "keys $from to $to inserted in the open transaction")
	  or die $@;
}
$big->query_safe(qq{SELECT count(outbox_enqueue('$topic', 'second'::text, 'key-' || i))
	FROM generate_series(1, 1000) i});

cmp_ok($key_locks_of->($big_pid), '<=', $max_key_locks,
	"the transaction of $keys keys holds at most $max_key_locks key locks");
$others_get_in->("while it is open with $keys keys");

# An enqueue for one of its keys waits for its end (key-1 has an exact lock,
# key-30000 is in the table of held pairs); one for a key it does not have
# does not wait (it waited while bulk transactions took every lock bucket).
my @waiters;
for my $key ('key-1', 'key-30000')
{
	my $waiter = $node->background_psql('postgres', extra_params => [ '-U', 'app' ]);
	my $pid = $waiter->query_safe('SELECT pg_backend_pid()');
	$waiter->query_until(qr/enqueueing/, qq{
		\\echo enqueueing
		SELECT outbox_enqueue('$topic', 'after'::text, '$key');
	});
	ok(wait_for_query($node, "SELECT count(*) FROM pg_locks WHERE pid = $pid AND NOT granted", '1'),
		"an enqueue for $key waits for the open transaction");
	push @waiters, $waiter;
}
my ($ret, $stdout, $stderr) = $node->psql('postgres',
	qq{SET lock_timeout = '5s'; SELECT outbox_enqueue('$topic', 'beside'::text, 'not-in-the-big-one') > 0},
	extra_params => [ '-U', 'app' ]);
is("$ret $stdout", '0 t', 'an enqueue for a key the open transaction does not have does not wait for it')
  or diag($stderr);
($ret, $stdout, $stderr) = $node->psql('other', qq{
	BEGIN;
	SET LOCAL lock_timeout = '5s';
	SELECT outbox_enqueue('$topic', 'beside'::text, 'key-30000') > 0;
	ROLLBACK;});
is("$ret $stdout", '0 t', 'nor one for one of its keys in another database') or diag($stderr);

$big->query_safe('COMMIT');
$big->quit;
$_->quit for @waiters;
is($node->safe_psql('postgres', qq{SELECT count(*) FROM outbox_message WHERE topic = '$topic'}),
	$keys + 1000 + 3, 'every message is committed, the waiting ones after it');
is($node->safe_psql('postgres', qq{
	SELECT count(*) FROM outbox_message WHERE topic = '$topic' AND payload = 'after'
	   AND id < (SELECT max(id) FROM outbox_message WHERE topic = '$topic' AND payload <> 'after')}),
	0, 'the enqueues that waited got later ids than all of it');

ok(wait_for_query($node, qq{SELECT count(*) FROM outbox_message WHERE topic = '$topic' AND state <> 'sent'},
		'0', 180), 'every message is acknowledged');
my %committed = map { my ($mid, $key, $id) = split /\|/; ($mid => [ $key, $id ]) }
  split /\n/, $node->safe_psql('postgres',
	qq{SELECT message_id, key, id FROM outbox_message WHERE topic = '$topic'});
my $records = consume_topics(topics => [$topic], expect => scalar(keys %committed),
	idle => 5, timeout => 180);
my $result = check_delivery($records, \%committed);
diag(sprintf('records %d; lost %d, phantom %d, duplicates %d, order faults %d',
		scalar(@$records), @$result{qw(lost phantom duplicates order_faults)}));
is($result->{lost}, 0, 'no message is lost');
is($result->{phantom}, 0, 'nothing is published that was not committed');
is($result->{duplicates}, 0, 'no message is published twice');
is($result->{order_faults}, 0, 'per key, messages arrive in id order');
is_deeply([ map { $_->{value} } grep { $_->{key} eq 'key-1' } @$records ],
	[ 'first', 'second', 'after' ], 'key-1: the big transaction\'s two messages, then the one that waited');

# The lock tag of one pair changes with each start of the server: it is
# keyed by a secret drawn then, so it cannot be computed from the key, nor
# the key from it.
my $tag_of_key = sub {
	return $node->safe_psql('postgres', qq{
		BEGIN;
		SELECT outbox_enqueue('$topic', 'tag'::text, 'same key') > 0;
		SELECT classid || '/' || objid FROM pg_locks
		 WHERE locktype = 'advisory' AND objsubid = 20290 AND pid = pg_backend_pid();
		ROLLBACK;});
};
my $tag_before = $tag_of_key->();
$node->restart;
my $tag_after = $tag_of_key->();
isnt($tag_after, $tag_before, 'the lock tag of a key differs after a restart');

# A prepared transaction holds its keys past its 16th in the table of held
# pairs until COMMIT PREPARED: an enqueue of such a key waits for it, and
# goes on once it is committed, with the later id.
$node->safe_psql('postgres', qq{
	BEGIN;
	SELECT count(outbox_enqueue('$topic', 'prepared'::text, 'prepared-' || i)) FROM generate_series(1, 20) i;
	PREPARE TRANSACTION 'many_keys';});
my $waiter = $node->background_psql('postgres');
my $waiter_pid = $waiter->query_safe('SELECT pg_backend_pid()');
$waiter->query_until(qr/enqueueing/, qq{
	\\echo enqueueing
	SELECT outbox_enqueue('$topic', 'after'::text, 'prepared-20');
});
ok(wait_for_query($node, "SELECT count(*) FROM pg_locks WHERE pid = $waiter_pid AND NOT granted", '1'),
	'an enqueue of a prepared transaction\'s 20th key waits for it');
$node->safe_psql('postgres', q{COMMIT PREPARED 'many_keys'});
ok(wait_for_query($node, qq{SELECT count(*) FROM outbox_message WHERE key = 'prepared-20'}, '2'),
	'once it is committed, the enqueue goes on');
$waiter->quit;
is($node->safe_psql('postgres', qq{SELECT string_agg(convert_from(payload, 'UTF8'), ',' ORDER BY id) FROM outbox_message
	WHERE key = 'prepared-20'}), 'prepared,after', 'and its message comes after the prepared one');

$node->stop('fast');
done_testing();

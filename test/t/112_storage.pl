# The outbox's storage under a long transaction, and the claim floor.
#
# While a REPEATABLE READ snapshot holds the xmin horizon (VACUUM can remove
# no deleted row), messages flow: a segment that held delivered rows is
# truncated, its space back, while the snapshot is still held; and every
# message is delivered, once, in order.
#
# The claim starts from its floor, not from the left edge of the index; so
# every way a row can wait below the floor is shown to be delivered with no
# look for passed rows to find it (outbox.poll_interval is an hour): a
# transaction that commits after later ones were delivered; a prepared
# transaction, before and across a restart; messages held back behind a
# retry.  And a row that another session had locked is found by the look
# of every outbox.poll_interval (a reclaimer's: 122_reclaimer.pl).
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = outbox_node('storage', conf => join("\n",
		"max_prepared_transactions = 2",
		"outbox.max_attempts = 1000",
		"outbox.retry_backoff_base = '200ms'",
		"outbox.retry_backoff_max = '500ms'"));
my $topic = unique_topic('storage');
kafka_admin('create-topic', $topic);

# The worker has found the extension; from now on only commits wake it.
ok(wait_for_query($node, 'SELECT state FROM outbox_worker', 'idle', 30), 'the worker is idle');
$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.poll_interval = '1h'; SELECT pg_reload_conf()");

# What was committed: message_id => [key, id], for check_delivery().
my %committed;
sub enqueue
{
	my ($session, $sql) = @_;
	my $rows = ref $session ? $session->query_safe($sql) : $node->safe_psql('postgres', $sql);
	return [ map { my ($mid, $key, $id) = split /\|/; $committed{$mid} = [ $key, $id ]; $id }
		  split /\n/, $rows ];
}
sub enqueue_sql
{
	my ($payload, $key, $count) = @_;
	return qq{INSERT INTO outbox_message (topic, key, payload)
		SELECT '$topic', '$key', convert_to($payload, 'UTF8') FROM generate_series(1, @{[ $count // 1 ]}) i
		RETURNING message_id, key, id};
}
my $outbox_empty = 'SELECT count(*) FROM outbox_message';

# A transaction that drew its id before later ones were delivered commits:
# its row is below the floor, which the commit lets down.
my $late = $node->background_psql('postgres');
$late->query_safe('BEGIN');
my ($late_id) = @{ enqueue($late, enqueue_sql(q{'late'}, 'late')) };
my $later = enqueue(undef, enqueue_sql(q{'after ' || i}, 'later', 5));
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE id > $late_id", '0', 30),
	"five later messages are delivered while message $late_id is not committed");
$late->query_safe('COMMIT');
ok(wait_for_query($node, $outbox_empty, '0', 30),
	'the message committed after them, below the claim floor, is delivered');

# A prepared transaction's rows commit later, from another session.
$late->query_safe('BEGIN');
enqueue($late, enqueue_sql(q{'prepared'}, 'prepared'));
$late->query_safe("PREPARE TRANSACTION 'outbox_storage_1'");
enqueue(undef, enqueue_sql(q{'after prepared ' || i}, 'later', 5));
ok(wait_for_query($node, $outbox_empty, '0', 30), 'later messages are delivered while one is prepared');
$node->safe_psql('postgres', "COMMIT PREPARED 'outbox_storage_1'");
enqueue(undef, enqueue_sql(q{'wake'}, 'later'));   # COMMIT PREPARED wakes no one
ok(wait_for_query($node, $outbox_empty, '0', 30), 'the prepared message is delivered once committed');

# One prepared before a restart: the new worker has not been told of it.
$late->query_safe('BEGIN');
enqueue($late, enqueue_sql(q{'prepared before the restart'}, 'prepared'));
$late->query_safe("PREPARE TRANSACTION 'outbox_storage_2'");
$late->quit;
$node->restart;
enqueue(undef, enqueue_sql(q{'after the restart ' || i}, 'later', 5));
ok(wait_for_query($node, $outbox_empty, '0', 30),
	'after a restart, later messages are delivered while one is prepared');
$node->safe_psql('postgres', "COMMIT PREPARED 'outbox_storage_2'");
enqueue(undef, enqueue_sql(q{'wake again'}, 'later'));
ok(wait_for_query($node, $outbox_empty, '0', 30),
	'the message prepared before the restart is delivered once committed');

# Messages held back behind a retry, passed by the floor meanwhile.
my (undef, $stale) = refusing_topics('storage');
my $held = $node->safe_psql('postgres', committed_late(qq{
	SELECT outbox_enqueue('$stale', 'first'::text, 'k')}));
ok(wait_for_query($node, "SELECT state FROM outbox_message WHERE id = $held", 'retrying', 30),
	'a message its topic refuses waits to retry');
$node->safe_psql('postgres', committed_late(qq{
	SELECT outbox_enqueue('$stale', 'second'::text, 'k');
	SELECT outbox_enqueue('$stale', 'third'::text, 'k')}));
enqueue(undef, enqueue_sql(q{'beside the retry ' || i}, 'later', 5));
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE topic = '$topic'", '0', 30),
	'messages of other keys, enqueued after, are delivered');
kafka_admin('alter-config', $stale, 'message.timestamp.before.max.ms=9223372036854775807');
ok(wait_for_query($node, $outbox_empty, '0', 30), 'once its topic takes it, the retry goes, and what it held back');
is(join(',', map { $_->{value} } @{ consume_topics(topics => [$stale], expect => 3, timeout => 30) }),
	'first,second,third', 'in order');

# A snapshot holds the xmin horizon; it reads no outbox table, so it holds
# no lock on one.  Messages flow until a segment that held delivered rows
# has been truncated.
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$holder->query_safe('SELECT count(*) FROM pg_class');
my $holder_pid = $holder->query_safe('SELECT pg_backend_pid()');
my $segment_sizes = q{
	SELECT string_agg(c.relname || '=' || pg_relation_size(c.oid), ',' ORDER BY c.relname)
	  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
	 WHERE i.inhparent = 'outbox_message'::regclass};
my (%held_rows, %truncated);
my $deadline = time() + 60;
while (!%truncated && time() < $deadline)
{
	enqueue(undef, enqueue_sql(q{'flow ' || i}, 'flow-' . (time() % 7), 20));
	for (split /,/, $node->safe_psql('postgres', $segment_sizes))
	{
		my ($segment, $bytes) = split /=/;
		$held_rows{$segment} = 1 if $bytes > 0;
		$truncated{$segment} = 1 if $bytes == 0 && $held_rows{$segment};
	}
	sleep(0.2);
}
ok(%truncated, 'a segment that held delivered rows is truncated: ' . join(',', sort keys %truncated));
is($node->safe_psql('postgres', qq{
	SELECT state, backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = $holder_pid}),
	'idle in transaction|t', 'while the snapshot still holds the xmin horizon');
ok(wait_for_query($node, $outbox_empty, '0', 30), 'every message of the flow is delivered');
$holder->query_safe('COMMIT');
$holder->quit;

# A row locked by another session is skipped, and the floor passes it; the
# look of every outbox.poll_interval finds it once the lock is gone.
$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.brokers = '127.0.0.1:1'; SELECT pg_reload_conf()");
ok(wait_for_query($node, 'SELECT state FROM outbox_worker', 'waiting for brokers', 30),
	'the worker is kept from the brokers');
my ($locked_id) = @{ enqueue(undef, enqueue_sql(q{'locked'}, 'locked')) };
my $locker = $node->background_psql('postgres');
$locker->query_safe('BEGIN');
$locker->query_safe("SELECT FROM outbox_message WHERE id = $locked_id FOR UPDATE");
enqueue(undef, enqueue_sql(q{'beside the locked one ' || i}, 'unlocked', 3));
$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.poll_interval = '1s'; ALTER SYSTEM RESET outbox.brokers; SELECT pg_reload_conf()");
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE id <> $locked_id", '0', 30),
	'the messages beside the locked one are delivered');
$locker->query_safe('COMMIT');
$locker->quit;
ok(wait_for_query($node, $outbox_empty, '0', 30), 'the locked one is delivered once its lock is gone');

my $records = consume_topics(topics => [$topic], expect => scalar(keys %committed), timeout => 60);
is_deeply(check_delivery($records, \%committed), { lost => 0, phantom => 0, duplicates => 0, order_faults => 0 },
	scalar(keys %committed) . ' messages delivered, once each, in id order per key');

$node->stop('fast');
is(worker_exits($node), 0, 'the worker never exited');
done_testing();

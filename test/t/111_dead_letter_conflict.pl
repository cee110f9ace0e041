# Recording a batch's outcomes never fails on an id conflict, and never
# loses the record of what Kafka acknowledged.  A dead letter with the id a
# message is about to be dead-lettered under (inserted by hand here; a
# restore that reused ids did it) used to fail the whole turn:
# the deletion of the batch's delivered rows rolled back with it, the
# worker exited, came back 5 s later and published them again.
#
# Now: the healthy messages of that batch are published exactly once, the
# worker never exits, the conflicting message stays in the outbox waiting
# for a retry with the reason (in its last_error and in outbox_worker), the
# outbox keeps flowing; once the stray dead letter is discarded, the
# message is dead-lettered under its own id.  The same when the dead-letter
# statement fails outright (a trigger of the owner's refuses the row): the
# failure is rolled back alone, in its subtransaction.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = outbox_node('dead_letter_conflict', conf => join("\n",
		"outbox.retry_backoff_base = '1s'",
		"outbox.retry_backoff_max = '2s'"));

my $small = unique_topic('conflict.small');    # refuses records over 200 bytes
my $fine = unique_topic('conflict.fine');
kafka_admin('create-topic', $small, '--config', 'max.message.bytes=200');
kafka_admin('create-topic', $fine);

my $big = 'x' x 1000;

# One transaction, so that the worker claims it all as one batch: ten
# healthy messages of $fine before and ten after one that $small refuses as
# too large; $then runs right after that one is enqueued, with its id in
# :id.  Returns that id.
sub enqueue_around_refused
{
	my ($fine, $key, $then) = @_;
	my $id = $node->safe_psql('postgres', qq{
		BEGIN;
		SELECT count(outbox_enqueue('$fine', 'before ' || i, 'k-' || i)) FROM generate_series(1, 10) i;
		SELECT outbox_enqueue('$small', '$big'::text, '$key') AS id \\gset
		$then
		SELECT count(outbox_enqueue('$fine', 'after ' || i, 'k-' || i)) FROM generate_series(1, 10) i;
		COMMIT;
		SELECT :id;
	});
	$id =~ s/.*\n//s;
	return $id;
}

# A dead letter already holds the refused message's id.
my $refused_id = enqueue_around_refused($fine, 'k-small', q{
	INSERT INTO outbox_dead_letter (id, message_id, topic, payload, attempts, created_at, error)
	VALUES (:id, gen_random_uuid(), 'elsewhere', 'stray', 1, now(), 'inserted by hand');});

ok(wait_for_query($node,
		"SELECT state, last_error LIKE 'not moved to outbox_dead_letter, which holds a dead letter with its id: Broker: Message size too large'
		   FROM outbox_message WHERE id = $refused_id",
		"retrying|t", 30),
	'the message whose id outbox_dead_letter holds waits for a retry, saying why');
like($node->safe_psql('postgres', 'SELECT last_error FROM outbox_worker'),
	qr/message $refused_id to topic "\Q$small\E": not moved to outbox_dead_letter/,
	'outbox_worker shows the conflict');
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE topic = '$fine'", '0', 30),
	'the healthy messages of its batch left the outbox');

# Whatever a restarting worker would have published again, it would have by
# now: it came back 5 s after each exit.  Let a few retries of the refused
# message go by, then count.
ok(wait_for_query($node, "SELECT attempts >= 3 FROM outbox_message WHERE id = $refused_id", 't', 30),
	'the refused message is retried with backoff');
my %count;
$count{ $_->{value} }++ for @{ consume_topics(topics => [$fine], idle => 3, timeout => 30) };
is(scalar(keys %count), 20, 'every healthy message was published');
is(scalar(grep { $_ != 1 } values %count), 0, 'each exactly once');
is(worker_exits($node), 0, 'the worker never exited');
is($node->safe_psql('postgres', "SELECT error FROM outbox_dead_letter WHERE id = $refused_id"),
	'inserted by hand', 'the dead letter that was there is untouched');

# The outbox keeps flowing, even for later messages of other keys.
$node->safe_psql('postgres',
	"SELECT count(outbox_enqueue('$fine', 'later ' || i, 'k-' || i)) FROM generate_series(1, 5) i");
is(scalar(@{ consume_topics(topics => [$fine], expect => 25, timeout => 30) }), 25,
	'later messages are published');

# Once the stray dead letter is gone, the message is dead-lettered under its
# own id, with its payload.
$node->safe_psql('postgres', "SELECT outbox_discard($refused_id)");
ok(wait_for_query($node,
		"SELECT topic = '$small' AND length(payload) = 1000 FROM outbox_dead_letter WHERE id = $refused_id",
		't', 30),
	'after the stray dead letter is discarded, the message is dead-lettered');
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox_message"), '0', 'the outbox is empty');
like($node->safe_psql('postgres', "SELECT error FROM outbox_dead_letter WHERE id = $refused_id"),
	qr/Message size too large/, 'with the broker\'s reason');

# A dead-letter statement that fails: only it is undone.
my $fine2 = unique_topic('conflict.fine2');
kafka_admin('create-topic', $fine2);
$node->safe_psql('postgres', q{
	CREATE FUNCTION refuse_dead_letter() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN RAISE EXCEPTION 'dead letters refused for the test'; END $$;
	CREATE TRIGGER refuse BEFORE INSERT ON outbox_dead_letter
	    FOR EACH ROW EXECUTE FUNCTION refuse_dead_letter();
});
my $failing_id = enqueue_around_refused($fine2, 'k-small-2', '');
ok(wait_for_query($node,
		"SELECT state, last_error LIKE 'not moved to outbox_dead_letter (dead letters refused for the test): %'
		   FROM outbox_message WHERE id = $failing_id",
		"retrying|t", 30),
	'a message the dead-letter statement fails for waits for a retry, saying why');
like($node->safe_psql('postgres', 'SELECT last_error FROM outbox_worker'),
	qr/could not move messages to outbox_dead_letter: dead letters refused for the test/,
	'outbox_worker shows the failed statement');
ok(wait_for_query($node, "SELECT attempts >= 2 FROM outbox_message WHERE id = $failing_id", 't', 30),
	'it is retried with backoff');
%count = ();
$count{ $_->{value} }++ for @{ consume_topics(topics => [$fine2], idle => 3, timeout => 30) };
is(scalar(keys %count) . '/' . scalar(grep { $_ != 1 } values %count), '20/0',
	'the healthy messages of its batch were published, each exactly once');
$node->safe_psql('postgres', 'DROP TRIGGER refuse ON outbox_dead_letter');
ok(wait_for_query($node, "SELECT count(*) FROM outbox_dead_letter WHERE id = $failing_id", '1', 30),
	'once the statement works, the message is dead-lettered');

$node->stop('fast');
is(worker_exits($node), 0, 'the worker never exited');
done_testing();

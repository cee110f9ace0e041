# Fault suite: big transactions commit while the worker is in the middle of
# publishing a steady load.  The worker claims the next batch while Kafka
# acknowledges the last one, leaving out the rows in flight; a transaction
# of thousands of rows whose ids surround theirs, committing meanwhile, must
# still go out in id order within each key, and whole.  Each claim waits a
# few milliseconds before its snapshot, so that transactions commit in that
# window: a claim whose snapshot shows one must start below its rows (it
# once took what commits had reported before its snapshot, and published
# the rows of a big transaction above its floor before those below).
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

my $node = outbox_node('big_transactions', conf => "outbox.claim_snapshot_delay = '3ms'");

my @topics = (unique_topic('fault.big'), unique_topic('fault.big'));
kafka_admin('create-topic', $_, '--partitions', 3) for @topics;

my $load = start_load($node, topics => [ $topics[0] ], rate => 1000, duration => 20);
sleep(2);

# Big transactions commit one after another, while the load's small ones
# draw ids in between theirs.
for my $round (1 .. 40)
{
	$node->safe_psql('postgres', qq{
		BEGIN;
		SELECT count(outbox_enqueue('$topics[1]', json_build_object('round', $round, 'n', i)::jsonb,
		                            'big-' || (i % 100)))
		  FROM generate_series(1, 5000) i;
		INSERT INTO fault_log SELECT id, message_id, topic, key FROM outbox_message
		 WHERE xmin = pg_current_xact_id()::xid;
		COMMIT;
	});
	sleep(0.1);
}
finish_load($load);

fault_check($node, scenario => 'big transactions under load', topics => \@topics);

$node->stop('fast');
done_testing();

# Fault suite, the inbox: database A (node "shop") enqueues under load,
# database B (node "coupons") applies each message through an inbox
# subscription whose handler inserts a row.  Under each fault, in the
# middle of a backlog, nothing committed in A is lost in B, nothing is
# applied twice, and each key keeps its order:
#   - B's inbox worker killed with SIGKILL (B restarts, as after any crash);
#   - B stopped with "pg_ctl stop -m immediate" and started again;
#   - the broker killed with SIGKILL and started again;
#   - A's publishing worker killed with SIGKILL: A may publish its batch
#     twice, and B applies it once;
#   - the handler failing for chosen keys, one transiently (its first
#     attempts) and one always: the first is applied after its retries,
#     the second's messages are dead-lettered, and every other key flows.
# Every row runs twice: with A publishing at least once, then exactly once
# (outbox.delivery = exactly_once: each batch a Kafka transaction, which
# the inbox, reading with isolation.level=read_committed, sees only once
# committed; the aborted ones' records are in the topic, and skipped).
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

# The test framework turns crash restarts off; a production server has them on.
my $shop = outbox_node('shop', conf => 'restart_after_crash = on');
my $coupons = outbox_node('coupons', conf => join("\n", 'restart_after_crash = on',
	"outbox.retry_backoff_base = '20ms'", "outbox.retry_backoff_max = '100ms'"));
$coupons->safe_psql('postgres', q{
	CREATE ROLE coupon_svc;
	SELECT outbox_grant_topic('coupon_svc', 'fault.inbox.*', 'subscribe');
	CREATE TABLE inbox_applied (seq bigserial PRIMARY KEY, message_id uuid, key text);
	GRANT INSERT ON inbox_applied TO coupon_svc;
	GRANT USAGE ON SEQUENCE inbox_applied_seq_seq TO coupon_svc;
	CREATE FUNCTION apply_message(m inbox_message) RETURNS void
	LANGUAGE sql AS $$ INSERT INTO inbox_applied (message_id, key) VALUES (m.message_id, m.key) $$;
	-- key-3 fails its first 2 attempts (a sequence counts across rollbacks), fewer than
	-- max_attempts, key-7 always
	CREATE SEQUENCE key3_failures;
	GRANT USAGE ON SEQUENCE key3_failures TO coupon_svc;
	CREATE FUNCTION apply_or_fail(m inbox_message) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN
	    IF m.key = 'key-7' OR (m.key = 'key-3' AND nextval('key3_failures') <= 2) THEN
	        RAISE EXCEPTION 'cannot apply %', m.key;
	    END IF;
	    INSERT INTO inbox_applied (message_id, key) VALUES (m.message_id, m.key);
	END $$;
});

# The process to kill, by its backend_type, on the node.
sub pid_of
{
	my ($node, $type) = @_;
	return $node->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = '$type'");
}

sub kill_and_wait_for_restart
{
	my ($node, $type, $scenario) = @_;
	my $pid = pid_of($node, $type);
	kill 'KILL', $pid or die "cannot kill the $type: $!";
	ok(wait_for_query($node,
			"SELECT count(*) FROM pg_stat_activity WHERE backend_type = '$type' AND pid <> $pid", '1', 120),
		"$scenario: the cluster restarts with a new $type");
}

my $n = 0;
for my $delivery ('at_least_once', 'exactly_once')
{
	$shop->safe_psql('postgres', "ALTER SYSTEM SET outbox.delivery = '$delivery'; SELECT pg_reload_conf()");
	ok(wait_for_query($shop, 'SHOW outbox.delivery', $delivery, 10), "A publishes $delivery");
	for my $fault ('inbox worker SIGKILL mid-batch', 'pg_ctl stop -m immediate of B',
		'broker SIGKILL', 'publishing worker SIGKILL in A', 'handler failing for chosen keys')
	{
		my $scenario = $delivery eq 'exactly_once' ? "exactly-once: $fault" : $fault;
		my $topic = unique_topic('fault.inbox');
		my $failing = $fault =~ /handler/;
		kafka_admin('create-topic', $topic, '--partitions', 3);
		$n++;
		my $handler = $failing ? 'apply_or_fail' : 'apply_message';
		$coupons->safe_psql('postgres', qq{
			SELECT inbox_subscribe('s$n', ARRAY['$topic'], '$handler(inbox_message)', max_attempts => 3,
			                       run_as => 'coupon_svc')});
		ok($coupons->poll_query_until('postgres', "SELECT count(*) FROM inbox_status WHERE topic = '$topic'", '3'),
			"$scenario: subscribed");

		my $skipped_before = $coupons->safe_psql('postgres', 'SELECT duplicates FROM inbox_worker');
		my $load = start_load($shop, topics => [$topic], duration => $failing ? 10 : 15);
		sleep(2);
		enqueue_backlog($shop, $topic, 20000) unless $failing;
		# the fault comes once the inbox is in the middle of the backlog
		ok(wait_for_query($coupons, 'SELECT count(*) BETWEEN 100 AND 19000 FROM inbox_applied', 't', 60),
			"$scenario: the inbox is in the middle of the backlog")
		  unless $fault =~ /in A|handler/;
		if ($fault =~ /^inbox worker/)
		{
			kill_and_wait_for_restart($coupons, 'outbox inbox', $scenario);
		}
		elsif ($fault =~ /immediate/)
		{
			$coupons->stop('immediate');
			$coupons->start;
		}
		elsif ($fault =~ /broker/)
		{
			broker_ctl('kill');
			sleep(2);
			broker_ctl('start');
		}
		elsif (!$failing)
		{
			ok(wait_for_query($shop, 'SELECT state FROM outbox_worker', 'publishing', 60),
				"$scenario: A's worker is publishing");
			kill_and_wait_for_restart($shop, 'outbox worker', $scenario);
		}
		finish_load($load);
		# B's counter of duplicates skipped lives in its shared memory, which a
		# restart of B clears
		my $skipped = $fault =~ /of B|inbox worker/ ? undef
		  : sub { $coupons->safe_psql('postgres', 'SELECT duplicates FROM inbox_worker') - $skipped_before };
		inbox_check($shop, $coupons, scenario => $scenario, topics => [$topic], skipped => $skipped,
			$failing ? (dead_keys => ['key-7']) : ());
		if ($failing)
		{
			is($coupons->safe_psql('postgres', q{
				SELECT count(*) FILTER (WHERE key = 'key-3') > 0 AND count(*) FILTER (WHERE key = 'key-7') = 0
				  FROM inbox_applied}), 't', "$scenario: key-3 is applied after its retries, key-7 never");
			is($coupons->safe_psql('postgres', qq{
				SELECT string_agg(DISTINCT format('%s %s %s', key, attempts, error), ';') FROM inbox_dead_letter
				 WHERE subscription = 's$n'}), 'key-7 3 cannot apply key-7',
				"$scenario: only key-7's messages are dead-lettered, each after 3 attempts");
		}
		$coupons->safe_psql('postgres',
			"TRUNCATE inbox_applied; SELECT inbox_unsubscribe('s$n', discard_pending => true)");
		$shop->safe_psql('postgres', 'TRUNCATE fault_log');
	}
}

$shop->stop('fast');
$coupons->stop('fast');
done_testing();

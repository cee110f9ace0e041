# The broker stops for 20 seconds under a steady load of enqueues, then comes
# back: nothing is lost, nothing rolled back appears, per-key order holds.
# Then a SIGHUP points the worker at a wrong address and back.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $node = outbox_node('outage', conf => "outbox.sent_retention = '1h'");
my $topic = unique_topic('outage');

$node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'warm-up'::text, 'key-0')");
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE state <> 'sent'", '0', 60),
	'delivering before the outage');

# 4 clients at 100 transactions a second in all, for 35 s, one in ten
# rolled back.
my $script = <<"SQL";
\\set k random(1, 20)
\\set rollback random(1, 10)
BEGIN;
SELECT outbox_enqueue('$topic', json_build_object('client', :client_id)::jsonb, 'key-' || :k);
\\if :rollback = 1
ROLLBACK;
\\else
COMMIT;
\\endif
SQL
my $load = start_pgbench($node, $script, '-c', 4, '-j', 2, '-R', 100, '-T', 35, '-P', 5);

sleep(3);
my $stopped_at = time();
broker_ctl('stop');
ok(wait_for_query($node, "SELECT brokers_reachable FROM outbox_worker", 'f', 60),
	'outbox_worker shows the brokers unreachable');
ok(wait_for_query($node, "SELECT count(*) > 0 FROM outbox_message WHERE state <> 'sent'", 't', 30),
	'messages wait in the outbox while the broker is down');
sleep(20 - (time() - $stopped_at)) if time() - $stopped_at < 20;
broker_ctl('start');
my $outage_s = time() - $stopped_at;

finish_pgbench($load);
my $restarted_at = time();
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE state <> 'sent'", '0', 120),
	'the backlog drains after the broker is back');
diag(sprintf('broker down %.1f s; backlog drained %.1f s after the load ended',
		$outage_s, time() - $restarted_at));

my %committed = map { my ($mid, $key, $id) = split /\|/; ($mid => [ $key, $id ]) }
  split /\n/, $node->safe_psql('postgres', 'SELECT message_id, key, id FROM outbox_message');
my $records = consume_topics(topics => [$topic], expect => scalar(keys %committed), idle => 5,
	timeout => 120);
my $result = check_delivery($records, \%committed);
diag(sprintf('committed %d, records %d; lost %d, phantom %d, duplicates %d, order faults %d',
		scalar(keys %committed), scalar(@$records), @$result{qw(lost phantom duplicates order_faults)}));
cmp_ok(scalar(keys %committed), '>', 2000, 'the load kept committing through the outage');
is($result->{lost}, 0, 'nothing committed is lost');
is($result->{phantom}, 0, 'nothing rolled back is published');
is($result->{order_faults}, 0, 'per-key order holds across the outage');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox_dead_letter'), '0',
	'no message was given up on');

# SIGHUP: a wrong address takes effect, and so does the right one after it.
$node->append_conf('postgresql.conf', "outbox.brokers = '127.0.0.1:1'");
$node->reload;
ok(wait_for_query($node, "SELECT state FROM outbox_worker", 'waiting for brokers', 60),
	'after SIGHUP to a wrong address the worker waits for brokers');
is($node->safe_psql('postgres', 'SELECT brokers FROM outbox_worker'), '127.0.0.1:1',
	'outbox_worker shows the new address');
my $held = $node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'after reload'::text, 'key-0')");
ok(wait_for_query($node, "SELECT state FROM outbox_worker", 'waiting for brokers', 10),
	'still waiting after a new message');
is($node->safe_psql('postgres', "SELECT state, attempts FROM outbox_message WHERE id = $held"),
	'pending|0', 'the message waits without spending an attempt');
$node->append_conf('postgresql.conf', "outbox.brokers = '" . brokers() . "'");
$node->reload;
ok(wait_for_query($node, "SELECT state FROM outbox_message WHERE id = $held", 'sent', 60),
	'after SIGHUP back to the broker the message is delivered');

$node->stop('fast');
my $log = slurp_file($node->logfile);
is(worker_exits($node), 0, 'the worker never crashed');
my $kafka_lines = () = $log =~ /outbox: librdkafka/g;
note("$kafka_lines librdkafka log lines over two outages");
cmp_ok($kafka_lines, '<', 30, 'the outages did not flood the server log');
done_testing();

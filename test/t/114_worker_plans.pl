# The worker's plans.  Its statements that scan a range of ids are planned
# once, for any values (store.c's PLAN_ONCE), so their plans must not depend
# on the outbox's statistics, which a queue gets wrong: it swings from empty
# to a backlog and back.  auto_explain logs every plan the worker runs while
# it drains a backlog, first with plans made on an empty, analyzed outbox,
# then with plans made on a full one (the worker away while the backlog was
# enqueued and analyzed), with retries, dead letters and sent retention
# along: each plan reads the outbox by index only (no sequential or bitmap
# scan, no sort of its rows, no hash or merge join, nothing materialized,
# no JIT),
# and the claim's floor is an index condition of the plan made once, so
# that every claim starts at the floor, not at the left edge of the index.
# One statement reads its table page by page on purpose: the look into a
# segment whose turn is over for a message not yet delivered (segment.c),
# a sequential scan of that one segment, which then holds dead rows only;
# its plan, when logged, is checked to be that.  The reclaimer's look for
# the rows the claims passed (store.c) is read as the worker's statements
# are.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = outbox_node('plans', conf => join("\n",
		"shared_preload_libraries = 'outbox, auto_explain'",
		"auto_explain.log_min_duration = 0",
		"auto_explain.log_nested_statements = on",
		"outbox.max_attempts = 2",
		"outbox.retry_backoff_base = '100ms'",
		"outbox.retry_backoff_max = '200ms'"));
my $topic = unique_topic('plans');
kafka_admin('create-topic', $topic);
my ($small, $stale) = refusing_topics('plans');

ok(wait_for_query($node, 'SELECT state FROM outbox_worker', 'idle', 30), 'the worker is idle');
$node->safe_psql('postgres', 'ANALYZE outbox_message');

# A backlog of 20,000 messages over 100 keys, and three each that are
# dead-lettered at once, or retried and then dead-lettered.
sub enqueue_all
{
	$node->safe_psql('postgres', committed_late(qq{
		SELECT count(outbox_enqueue('$topic', json_build_object('n', i)::jsonb, 'k-' || i % 100))
		  FROM generate_series(1, 20000) i;
		SELECT count(outbox_enqueue('$small', repeat('x', 300)::text, 'small-' || i)) FROM generate_series(1, 3) i;
		SELECT count(outbox_enqueue('$stale', 'stale'::text, 'stale-' || i)) FROM generate_series(1, 3) i;
	}));
}

sub wait_drained
{
	my ($what) = @_;
	ok(wait_for_query($node, 'SELECT count(*) FROM outbox_message', '0', 180),
		"$what: the outbox drains");
}

enqueue_all();
wait_drained('plans made on an empty outbox');

# Plans made on a full outbox: the worker leaves while the backlog is
# enqueued and analyzed, and comes back to it.
$node->safe_psql('postgres',
	"ALTER SYSTEM SET outbox.databases = 'nowhere'; SELECT pg_reload_conf()");
ok(publishers_gone($node), 'the worker leaves while the outbox fills');
enqueue_all();
$node->safe_psql('postgres', 'ANALYZE outbox_message');
$node->safe_psql('postgres', 'ALTER SYSTEM RESET outbox.databases; SELECT pg_reload_conf()');
wait_drained('plans made on a full outbox');

# Delivered rows kept as sent: the statement that marks them.
$node->safe_psql('postgres', "ALTER SYSTEM SET outbox.sent_retention = '1h'; SELECT pg_reload_conf()");
ok(wait_for_query($node, 'SHOW outbox.sent_retention', '1h', 10), 'sent retention on');
$node->safe_psql('postgres',
	"SELECT count(outbox_enqueue('$topic', 'kept'::text, 'k-' || i % 100)) FROM generate_series(1, 2000) i");
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE state <> 'sent'", '0', 60),
	'sent retention: every message delivered and kept');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox_dead_letter'), '12',
	'the refused messages are dead letters, the others delivered');

# The plans auto_explain logged for the worker's statements: those that
# name the outbox by its schema, as only the worker's do here.
my @plans = grep { /Query Text: .*public\.outbox_message/s }
  split /^\S.*LOG:  duration: [\d.]+ ms  plan:\n/m, slurp_file($node->logfile);
my %seen = (claim => 0, 'claim of retries' => 0, delete => 0, 'mark sent' => 0,
	retry => 0, 'dead letter' => 0, 'segment look' => 0, 'look for passed rows' => 0);
my @bad;
for my $plan (@plans)
{
	my ($text) = $plan =~ /Query Text: (.*?)\n\t(?!\t)/s;
	$text //= $plan;
	my $kind =
	    $text =~ /outbox_dead_letter/ ? 'dead letter'
	  : $text =~ /SKIP LOCKED/ && $text =~ /state = 'retrying' AND m\.id < \$4/ ? 'claim of retries'
	  : $text =~ /SKIP LOCKED/ ? 'claim'
	  : $text =~ /^DELETE/ ? 'delete'
	  : $text =~ /SET state = 'sent'/ ? 'mark sent'
	  : $text =~ /SET state = 'retrying'/ ? 'retry'
	  : $text =~ /^SELECT EXISTS \(SELECT FROM ONLY public\.outbox_message_\d WHERE/ ? 'segment look'
	  : $text =~ /^SELECT m\.id FROM public\.outbox_message m WHERE m\.state <> 'sent' AND m\.state = 'pending'/
	  ? 'look for passed rows'
	  : 'other';
	$seen{$kind}++;
	if ($kind eq 'segment look')
	{
		push @bad, "segment look not by a sequential scan of its segment alone: $plan"
		  if $plan =~ /Index|Bitmap|Join|Materialize|JIT:/ || $plan !~ /Seq Scan on outbox_message_\d/;
		next;
	}
	push @bad, "$kind: $plan"
	  if $plan =~ /Seq Scan on outbox_message|Bitmap Heap Scan|Hash Join|Merge Join|Materialize|JIT:/
	  || ($kind ne 'dead letter' && $plan =~ /^\s*(?:->\s+)?Sort\s+\(/m);
	push @bad, "claim without its floor as an index condition: $plan"
	  if $kind eq 'claim' && $plan =~ /Index Scan using outbox_message_\d_waiting/
	  && $plan !~ /Index Cond: \(\(id >= \$4\)/;
}
note(join(', ', map { "$_: $seen{$_}" } sort keys %seen));
# a segment is looked into only when one whose turn is over holds blocks,
# and the rows the claims passed once per outbox.poll_interval, by a
# reclaimer: not in every run of this test
ok($seen{$_} > 0, "auto_explain logged the worker's plans of: $_")
  for grep { !/^(?:other|segment look|look for passed rows)$/ } sort keys %seen;
is(scalar(@bad), 0, 'every plan of the worker reads the outbox by index, in id order, from the floor')
  or diag(join("\n----\n", @bad[ 0 .. ($#bad < 2 ? $#bad : 2) ]));

done_testing();

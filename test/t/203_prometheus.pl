# Prometheus: the postgres_exporter queries file (monitoring/queries.yaml)
# run by Debian's prometheus-postgres-exporter against a cluster that has
# published, retried, dead-lettered and consumed messages, connected as a
# monitoring role granted exactly what README's "Metrics" section lists.
# Its /metrics has every metric the file declares, each query ran without
# an error, and the values are what happened: the worker's published count
# as outbox_worker has it, each topic's waiting, retrying and dead letters,
# a non-zero rate and a latency per topic, the worker's state, the inbox's
# lag and retries.  And the Grafana dashboard
# (monitoring/grafana/outbox-dashboard.json) asks only for metrics the file
# declares.
use strict;
use warnings;

use File::Basename qw(dirname);
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use YAML::XS ();

my $exporter = '/usr/bin/prometheus-postgres-exporter';
my $monitoring = dirname(__FILE__) . '/../../monitoring';
my $queries_file = "$monitoring/queries.yaml";
my $dashboard_file = "$monitoring/grafana/outbox-dashboard.json";

# What the queries file declares: every metric (query name _ column, for
# each column that is not a label) and its labels.
my $queries = YAML::XS::LoadFile($queries_file);
my (%declared, %labels_of);
for my $query (sort keys %$queries)
{
	for my $column (@{ $queries->{$query}{metrics} })
	{
		my ($name, $spec) = %$column;
		if ($spec->{usage} eq 'LABEL')
		{
			push @{ $labels_of{$query} }, $name;
		}
		else
		{
			$declared{"${query}_$name"} = $query;
		}
	}
}
cmp_ok(scalar(keys %declared), '>=', 19, scalar(keys %declared) . ' metrics declared by the queries file');

# The dashboard: every metric its expressions name is one the file declares.
my $dashboard = decode_json(slurp_file($dashboard_file));
my @exprs;
my $collect;
$collect = sub {
	my ($node) = @_;
	if (ref $node eq 'HASH')
	{
		push @exprs, $node->{expr} if defined $node->{expr} && !ref $node->{expr};
		push @exprs, $node->{query} if defined $node->{query} && !ref $node->{query};
		$collect->($_) for values %$node;
	}
	elsif (ref $node eq 'ARRAY')
	{
		$collect->($_) for @$node;
	}
};
$collect->($dashboard);
my %used;
for my $expr (@exprs)
{
	(my $code = $expr) =~ s/"(?:[^"\\]|\\.)*"//g;    # not label values
	$used{$1}++ while $code =~ /\b((?:outbox|inbox)_[a-z0-9_]+)\b/g;
}
my @unknown = grep { !$declared{$_} } sort keys %used;
is_deeply(\@unknown, [], 'the dashboard names no metric the queries file does not declare');
cmp_ok(scalar(keys %used), '>=', 12, scalar(keys %used) . ' metrics shown by the dashboard');
my @unshown = grep { !$used{$_} } sort keys %declared;
is_deeply(\@unshown, [], 'and it shows every one of them');

# A cluster that has done some work.
my $node = outbox_node('prometheus', conf => join("\n",
		'outbox.max_attempts = 1000',
		"outbox.retry_backoff_base = '200ms'",
		"outbox.retry_backoff_max = '500ms'"));
my $topic = unique_topic('prometheus.orders');
kafka_admin('create-topic', $topic);
my ($small, $stale) = refusing_topics('prometheus');
$node->safe_psql('postgres', qq{
	CREATE ROLE outbox_monitoring LOGIN;
	GRANT SELECT ON outbox_status, outbox_worker TO outbox_monitoring;
	GRANT EXECUTE ON FUNCTION outbox_worker_status(), outbox_topic_metrics() TO outbox_monitoring;
	GRANT SELECT ON inbox_status, inbox_worker TO outbox_monitoring;
	GRANT EXECUTE ON FUNCTION inbox_worker_status() TO outbox_monitoring;

	CREATE TABLE applied (payload text);
	CREATE FUNCTION apply(m inbox_message) RETURNS void LANGUAGE plpgsql AS \$\$
	BEGIN
	    IF payload_text(m) = 'poison' THEN
	        RAISE EXCEPTION 'poison';
	    END IF;
	    INSERT INTO applied VALUES (payload_text(m));
	END \$\$;
	CREATE ROLE subscriber;
	GRANT INSERT ON applied TO subscriber;
	SELECT outbox_grant_topic('subscriber', '$topic', 'subscribe');
	SELECT inbox_subscribe('orders', ARRAY['$topic'], 'apply(inbox_message)', run_as => 'subscriber');
});
$node->safe_psql('postgres', committed_late(qq{
	SELECT count(outbox_enqueue('$topic', 'order ' || i, 'k-' || i % 5)) FROM generate_series(1, 40) i;
	SELECT outbox_enqueue('$topic', 'poison'::text, 'k-poison');
	SELECT outbox_enqueue('$small', repeat('x', 1000), 'k-small');
	SELECT outbox_enqueue('$stale', 'refused'::text, 'k-stale');
	SELECT outbox_enqueue('$topic', 'later'::text, 'k-later', deliver_after => '1 hour');
}));
ok(wait_for_query($node, "SELECT sent_last_minute FROM outbox_status WHERE topic = '$topic'", '41', 60),
	'41 messages delivered to the topic');
ok(wait_for_query($node, "SELECT dead_letters FROM outbox_status WHERE topic = '$small'", '1', 60),
	'one dead letter');
ok(wait_for_query($node, "SELECT retrying FROM outbox_status WHERE topic = '$stale'", '1', 60),
	'one message retrying');
ok(wait_for_query($node, "SELECT retrying, lag FROM inbox_status WHERE subscription = 'orders'", '1|0', 60),
	'the inbox applied what it could, one message waits to retry');

# The exporter, on a free port of the loopback, connected as the monitoring
# role, with the queries file and nothing else.
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $dsn = sprintf('host=%s port=%d user=outbox_monitoring dbname=postgres sslmode=disable',
	$node->host, $node->port);
my $exporter_log = "$PostgreSQL::Test::Utils::tmp_check/exporter.log";
my $handle = IPC::Run::start(
	[ 'env', "DATA_SOURCE_NAME=$dsn", $exporter, "--extend.query-path=$queries_file",
		"--web.listen-address=127.0.0.1:$port", '--disable-default-metrics',
		'--disable-settings-metrics' ],
	'<', \undef, '>', $exporter_log, '2>&1');

# Scrape /metrics until the topic's series is there, with a deadline.
my $http = HTTP::Tiny->new(timeout => 10);
my $scraped = '';
my $deadline = time() + 60;
while (time() < $deadline)
{
	my $response = $http->get("http://127.0.0.1:$port/metrics");
	$scraped = $response->{content} if $response->{success};
	last if $scraped =~ /^outbox_status_sent_last_minute\{[^}]*topic="\Q$topic\E"[^}]*\} 41$/m;
	sleep(0.2);
}
note($scraped);

# The exposition format: name{label="value",...} value.
my %series;
for my $line (split /\n/, $scraped)
{
	next if $line =~ /^#/ || $line !~ /\S/;
	my ($name, $labels, $value) = $line =~ /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/
	  or next;
	my %label;
	$label{$1} = $2 while ($labels // '') =~ /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
	push @{ $series{$name} }, { labels => \%label, value => $value };
}
sub value_of
{
	my ($name, %want) = @_;
	for my $s (@{ $series{$name} // [] })
	{
		return $s->{value} unless grep { ($s->{labels}{$_} // '') ne $want{$_} } keys %want;
	}
	return undef;
}

is(value_of('pg_exporter_user_queries_load_error'), '0', 'the exporter loaded the queries file');
is(value_of('pg_up'), '1', 'the exporter reaches the database');
is(value_of('pg_exporter_last_scrape_error'), '0', 'and every query ran without an error');
my @missing = grep { !$series{$_} } sort keys %declared;
is_deeply(\@missing, [], 'every metric the queries file declares is exported');
my @unlabelled = grep {
	my $name = $_;
	grep { my $s = $_; grep { !exists $s->{labels}{$_} } @{ $labels_of{ $declared{$name} } } } @{ $series{$name} }
} sort keys %declared;
is_deeply(\@unlabelled, [], 'each with the labels its query declares');

# The values.
my %db = (database => 'postgres');
my $published = $node->safe_psql('postgres', "SELECT published FROM outbox_worker WHERE database = 'postgres'");
cmp_ok($published, '>=', 41, "the worker published $published");
# the counter may have moved on since the scrape, never past the database's own figure
ok(value_of('outbox_worker_published', %db) > 0 && value_of('outbox_worker_published', %db) <= $published,
	'outbox_worker_published is the worker\'s count (' . value_of('outbox_worker_published', %db) . ')');
cmp_ok(value_of('outbox_worker_failed', %db), '>', 0, 'outbox_worker_failed counts the failed attempts');
is(value_of('outbox_worker_dead_lettered', %db), '1', 'outbox_worker_dead_lettered counts the dead letter');
is(value_of('outbox_worker_brokers_reachable', %db), '1', 'the brokers are reachable');
ok(value_of('outbox_worker_last_publish_timestamp_seconds', %db) > time() - 120,
	'and the last publish was recent');
my @states = map { $_->{labels}{state} } @{ $series{outbox_worker_state_current} };
my @current = map { $_->{labels}{state} } grep { $_->{value} eq '1' } @{ $series{outbox_worker_state_current} };
is(scalar(@states), 6, 'outbox_worker_state_current has a series per state (' . join(', ', sort @states) . ')');
ok(@current == 1 && $current[0] =~ /^(idle|publishing)$/, "and is 1 for the one the worker is in (@current)");

my %orders = (%db, topic => $topic);
is(value_of('outbox_status_sent_last_minute', %orders), '41', 'outbox_status_sent_last_minute: 41 for the topic');
my $rate = value_of('outbox_status_sent_per_second', %orders);
ok($rate >= 41 / 60 && $rate <= 41 / 50, "outbox_status_sent_per_second is 41 over the minute's span ($rate)");
my ($p50, $p99) = map { value_of("outbox_status_latency_${_}_seconds", %orders) } ('p50', 'p99');
ok($p50 > 0 && $p50 < 5 && $p99 >= $p50 && $p99 < 5, "latency per topic: p50 $p50 s, p99 $p99 s");
is(value_of('outbox_status_delayed', %orders), '1', 'outbox_status_delayed: the delayed message');
is(value_of('outbox_status_oldest_waiting_age_seconds', %orders), '0',
	'which does not count as waiting before its time');
ok(value_of('outbox_status_oldest_waiting_age_seconds', %db, topic => $stale) > 0,
	'outbox_status_oldest_waiting_age_seconds: the retrying message has waited');
is(value_of('outbox_status_dead_letters', %db, topic => $small), '1', 'outbox_status_dead_letters: 1 for the refusing topic');
is(value_of('outbox_status_retrying', %db, topic => $stale), '1', 'outbox_status_retrying: 1 for the stale topic');
is(value_of('outbox_status_latency_p50_seconds', %db, topic => $stale), 'NaN',
	'and no latency for a topic that delivered nothing');
my %inbox = (%db, subscription => 'orders', topic => $topic, partition => '0');
is(value_of('inbox_status_lag', %inbox), '0', 'inbox_status_lag: 0, all read');
is(value_of('inbox_status_retrying', %inbox), '1', 'inbox_status_retrying: the poison message');
is(value_of('inbox_status_dead_letters', %inbox), '0', 'inbox_status_dead_letters: none');

# What the dashboard names is exported, with data.
my @not_exported = grep { !$series{$_} } sort keys %used;
is_deeply(\@not_exported, [], 'every metric the dashboard shows is in the scrape');

$handle->kill_kill;
$node->stop('fast');
is(worker_exits($node), 0, 'no worker crashed or exited with an error');
done_testing();

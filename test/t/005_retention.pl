# With outbox.sent_retention, a delivered row stays as 'sent' with where it
# went, then goes when its segment is truncated; the claim does not walk the
# rows kept as sent.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

# auto_explain logs the plans of the worker's own statements.
my $node = outbox_node('retention', conf => join("\n",
		"outbox.sent_retention = '3s'",
		"outbox.poll_interval = '500ms'"));
my $topic = unique_topic('retention');

my $id = $node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'kept'::text, 'k')");
ok(wait_for_query($node, "SELECT state FROM outbox_message WHERE id = $id", 'sent', 30),
	'the delivered row stays as sent');
my $record = consume_topics(topics => [$topic], expect => 1, timeout => 30)->[0];
is($node->safe_psql('postgres',
		"SELECT kafka_partition || '/' || kafka_offset, sent_at >= created_at FROM outbox_message WHERE id = $id"),
	"$record->{partition}/$record->{offset}|t",
	'it shows the partition and offset Kafka gave it, and when it was sent');
is($node->safe_psql('postgres', "SELECT sent_retained FROM outbox_status WHERE topic = '$topic'"), '1',
	'outbox_status counts it as sent');
ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE id = $id", '0', 30),
	'it goes, with its segment, once older than outbox.sent_retention');

# Many rows kept as sent, in every segment: the claim reads the partial
# index of waiting rows.
# (Rows that come with their id are taken as restored ones, which keep
# their state; only the owner may write the id.)
$node->safe_psql('postgres', qq{
	INSERT INTO outbox_message (id, topic, payload, state, sent_at, segment)
	SELECT nextval('outbox_message_id_seq'), '$topic', 'old', 'sent', now() + interval '1 day', i % 4
	  FROM generate_series(1, 50000) i;
	ANALYZE outbox_message;
});
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'outbox,auto_explain'\n"
	  . "auto_explain.log_min_duration = 0\n");
$node->restart;
my $new = $node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'new'::text, 'k')");
ok(wait_for_query($node, "SELECT state FROM outbox_message WHERE id = $new", 'sent', 30),
	'a new message is delivered among 50,000 rows kept as sent');
my $log = slurp_file($node->logfile);
my ($claim_plan) = $log =~ /(Query Text: SELECT m\.id, m\.message_id.*?)(?=\n\S|\z)/s;
ok(defined $claim_plan, 'the worker\'s claim was explained');
my $segment = $node->safe_psql('postgres', "SELECT tableoid::regclass FROM outbox_message WHERE id = $new");
like($claim_plan // '', qr/Index Scan using ${segment}_waiting on $segment m/,
	"the claim scans the index of waiting rows of $segment, which holds 12,500 of them");
unlike($claim_plan // '', qr/Seq Scan on $segment m/, 'and never that whole segment');

$node->stop('fast');
done_testing();

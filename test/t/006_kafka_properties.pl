# outbox.kafka_properties is read the same way by the check that a reload
# runs and by the producer: name=value pairs separated by ';', names and
# values trimmed, empty and blank items skipped, an empty name refused.  A
# value the check accepts must give a producer that publishes; a value it
# refuses keeps the previous one, and the worker publishes on.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $node = outbox_node('kafka_properties',
	conf => "outbox.kafka_properties = 'client.id=outbox-kp-0'");

# Write the setting to postgresql.conf and reload; returns the log offset
# before the reload.
sub reload_with
{
	my ($properties) = @_;
	my $offset = -s $node->logfile;
	$node->append_conf('postgresql.conf', "outbox.kafka_properties = '$properties'");
	$node->reload;
	return $offset;
}

# What the postmaster made of the reload since $offset: 'changed' (it took
# the new value), 'refused' (the configuration file has errors) or 'nothing'
# (neither was logged in time).
sub reload_verdict
{
	my ($offset) = @_;
	my $deadline = time() + 30;
	while (time() < $deadline)
	{
		my $log = slurp_file($node->logfile, $offset);
		return 'refused' if $log =~ /configuration file .* contains errors/;
		return 'changed' if $log =~ /parameter "outbox\.kafka_properties" changed/;
		sleep(0.1);
	}
	return 'nothing';
}

sub shown
{
	return $node->safe_psql('postgres', 'SHOW outbox.kafka_properties');
}

# Enqueue a message now; it must reach Kafka, and no error since $since may
# say that librdkafka refuses a property.
my $message_count = 0;

sub publishes
{
	my ($label, $since) = @_;
	my $topic = unique_topic('kafka_properties');
	my $payload = 'message-' . ++$message_count;
	$node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', '$payload'::text)");
	my $records = consume_topics(topics => [$topic], expect => 1, timeout => 30);
	is(join(',', map { $_->{value} } @$records), $payload,
		"$label: a message enqueued afterwards reaches Kafka");
	my $error = $node->safe_psql('postgres',
		"SELECT last_error FROM outbox_worker WHERE last_error_at >= '$since'");
	unlike($error, qr/librdkafka refuses property/,
		"$label: outbox_worker.last_error does not say that librdkafka refuses a property");
}

sub server_now
{
	return $node->safe_psql('postgres', 'SELECT clock_timestamp()');
}

# Malformed values: the reload is refused, with the message and detail of
# the check and not the value, and the setting keeps its previous value.
my $case = 0;
for my $malformed (' =x', '=x', '  = ', 'linger.ms')
{
	my $label = "malformed '$malformed'";
	my $valid = 'client.id=outbox-kp-' . ++$case;
	is(reload_verdict(reload_with($valid)), 'changed', "$label: first '$valid' is applied");

	my $since = server_now();
	my $offset = reload_with($malformed);
	is(reload_verdict($offset), 'refused', "$label: the reload is refused");
	my $log = slurp_file($node->logfile, $offset);
	like($log,
		qr/invalid value for parameter "outbox\.kafka_properties"\n.*DETAIL:  Each property must be written name=value; properties are separated by semicolons\.\n/,
		"$label: the log says why");
	ok(index($log, "\"$malformed\"") < 0, "$label: the log does not repeat the value");
	is(shown(), $valid, "$label: SHOW still shows '$valid'");
	publishes($label, $since);
}

# A name librdkafka does not know is refused at the reload, named (a name
# is no secret) without the value; the setting keeps its previous value.
{
	my $label = "unknown name 'lingerms'";
	my $valid = 'client.id=outbox-kp-' . ++$case;
	is(reload_verdict(reload_with($valid)), 'changed', "$label: first '$valid' is applied");
	my $offset = reload_with('lingerms=51234');
	is(reload_verdict($offset), 'refused', "$label: the reload is refused");
	my $log = slurp_file($node->logfile, $offset);
	like($log, qr/invalid value for parameter "outbox\.kafka_properties": librdkafka has no property "lingerms"/,
		"$label: the log names the property");
	ok(index($log, '51234') < 0, "$label: the log does not repeat the value");
	is(shown(), $valid, "$label: SHOW still shows '$valid'");
}

# A value librdkafka refuses: outbox_worker says so, and once the setting
# is mended and the producer made again, the error goes and the brokers are
# shown reachable.
{
	my $label = "refused value";
	is(reload_verdict(reload_with('security.protocol=bogus')), 'changed', "$label: the reload applies it");
	ok(wait_for_query($node, q{SELECT last_error LIKE '%librdkafka refuses property "security.protocol"%',
			brokers_reachable FROM outbox_worker}, 't|f', 30),
		"$label: outbox_worker.last_error names the property, the brokers unreachable");
	my $since = server_now();
	is(reload_verdict(reload_with('client.id=outbox-kp-mended')), 'changed', "$label: mended");
	publishes("$label: mended", $since);
	ok(wait_for_query($node, q{SELECT coalesce(last_error, 'none'), last_error_at IS NULL, brokers_reachable
			FROM outbox_worker}, 'none|t|t', 30),
		"$label: mended, outbox_worker.last_error is cleared and the brokers are reachable")
	  or diag($node->safe_psql('postgres', 'SELECT * FROM outbox_worker'));
}

# Odd but valid values: each must give a producer that publishes.  Before
# each, a configuration whose producer cannot reach the broker (TLS against
# the plaintext listener), so that a message delivered afterwards can only
# have gone through a producer made from the value under test.
for my $accepted (' linger.ms = 5 ; ; client.id = outbox-test ;', 'client.id = a=b', ' ; ;', '')
{
	my $label = "accepted '$accepted'";
	my $barrier = 'security.protocol=ssl; client.id=outbox-kp-' . ++$case;
	is(reload_verdict(reload_with($barrier)), 'changed', "$label: first '$barrier' is applied");
	ok(wait_for_query($node, 'SELECT state, brokers_reachable FROM outbox_worker',
			'waiting for brokers|f', 30),
		"$label: under '$barrier' the worker cannot reach the broker");

	my $since = server_now();
	is(reload_verdict(reload_with($accepted)), 'changed', "$label: the reload applies it");
	is(shown(), $accepted, "$label: SHOW shows it as written");
	publishes($label, $since);
}

# The producer takes the value as trimmed, after blank items: with
# message.max.bytes at 2000, a small message goes and a larger one is refused
# by librdkafka and dead-lettered.
my $limited = ' ; message.max.bytes = 2000 ; ; client.id = outbox-kp-limit ';
my $since = server_now();
is(reload_verdict(reload_with($limited)), 'changed', "'$limited' is applied");
publishes("'$limited'", $since);
my $big_topic = unique_topic('kafka_properties.big');
$node->safe_psql('postgres', "SELECT outbox_enqueue('$big_topic', repeat('x', 3000))");
ok(wait_for_query($node,
		"SELECT count(*) FROM outbox_dead_letter WHERE topic = '$big_topic' AND error ~* 'too large'",
		'1', 60),
	"'$limited': a 3000-byte message is dead-lettered as too large: message.max.bytes is 2000")
  or diag($node->safe_psql('postgres', 'SELECT topic, state, attempts, last_error FROM outbox_message'));

# An unknown name in postgresql.conf at server start, where PostgreSQL would
# only warn and run the worker without any of the properties: the value
# stays, the worker publishes nothing and says why, until it is mended.
{
	my $label = "unknown name at server start";
	$node->append_conf('postgresql.conf',
		"outbox.kafka_properties = 'lingerms=5; client.id=outbox-kp-start'");
	$node->restart;
	is(shown(), 'lingerms=5; client.id=outbox-kp-start', "$label: the server starts with the value");
	my $topic = unique_topic('kafka_properties.start');
	$node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'held'::text)");
	ok(wait_for_query($node, q{SELECT last_error LIKE '%librdkafka refuses property "lingerms"%'
			FROM outbox_worker}, 't', 30),
		"$label: outbox_worker.last_error names the property")
	  or diag($node->safe_psql('postgres', 'SELECT * FROM outbox_worker'));
	is($node->safe_psql('postgres', "SELECT count(*) FROM outbox_message WHERE topic = '$topic'"), '1',
		"$label: the message waits");
	my $since = server_now();
	is(reload_verdict(reload_with('client.id=outbox-kp-start-mended')), 'changed', "$label: mended");
	is(scalar(@{ consume_topics(topics => [$topic], expect => 1, timeout => 30) }), 1,
		"$label: mended, the message waiting is published");
	publishes("$label: mended", $since);
}

$node->stop('fast');
is(worker_exits($node), 0, 'the worker never crashed');
done_testing();

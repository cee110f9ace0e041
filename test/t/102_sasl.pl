# The worker publishes through an authenticated Kafka listener: SASL/PLAIN,
# then SASL over TLS with a self-signed certificate.  Wrong credentials, or a
# certificate the worker cannot verify, show as "waiting for brokers" with
# the reason in outbox_worker.last_error; the messages wait in the outbox,
# neither lost nor dead-lettered, and go once the configuration is fixed by
# a reload.  No password reaches the server log or last_error.
#
# The test runs a broker of its own, with a plaintext listener for the test's
# consumers and the authenticated ones for the worker, on KAFKA_PORT + 200
# and the next three ports.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $base_port = ($ENV{KAFKA_PORT} // 19092) + 200;
my ($sasl_port, $ssl_port) = ($base_port + 2, $base_port + 3);
my $password = 'app-pw-' . int(rand(1e9));
my $wrong_password = 'wrong-pw-' . int(rand(1e9));

$ENV{KAFKA_PORT} = $base_port;
$ENV{KAFKA_DIR} = PostgreSQL::Test::Utils::tempdir() . '/kafka';
$ENV{KAFKA_SASL_PORT} = $sasl_port;
$ENV{KAFKA_SSL_PORT} = $ssl_port;
$ENV{KAFKA_SASL_USERS} = "app:$password";
$ENV{OUTBOX_KAFKA_BROKERS} = "127.0.0.1:$base_port";
END { broker_ctl('stop') if $ENV{KAFKA_DIR} && -e "$ENV{KAFKA_DIR}/broker.pid"; }
broker_ctl('start');
my $ca = "$ENV{KAFKA_DIR}/tls/ca.pem";

sub sasl_properties
{
	my ($protocol, $secret, $extra) = @_;
	return "security.protocol=$protocol; sasl.mechanisms=PLAIN; sasl.username=app; "
	  . "sasl.password=$secret" . ($extra // '');
}

my $node = outbox_node('sasl', conf => join("\n",
	"outbox.brokers = '127.0.0.1:$sasl_port'",
	"outbox.kafka_properties = '" . sasl_properties('SASL_PLAINTEXT', $password) . "'"));

my @last_errors;

sub reconfigure
{
	my ($brokers, $properties) = @_;
	$node->append_conf('postgresql.conf',
		"outbox.brokers = '$brokers'\noutbox.kafka_properties = '$properties'");
	$node->reload;
}

sub enqueue_messages
{
	my ($topic, $count) = @_;
	$node->safe_psql('postgres', qq{
		SELECT outbox_enqueue('$topic', 'message ' || i, 'key-' || i % 2)
		  FROM generate_series(1, $count) i});
}

# The payloads Kafka has, per key, in the order it has them.
sub payloads_by_key
{
	my ($topic, $count) = @_;
	my %by_key;
	push @{ $by_key{ $_->{key} } }, $_->{value}
	  for @{ consume_topics(topics => [$topic], expect => $count, idle => 3) };
	return \%by_key;
}

# A broken configuration: the worker waits for the brokers and says why, and
# messages enqueued meanwhile stay, untried, for the seconds the test watches.
sub check_waits
{
	my ($what, $error_pattern, $topic) = @_;
	ok(wait_for_query($node,
			"SELECT state = 'waiting for brokers' AND last_error ~* '$error_pattern' FROM outbox_worker",
			't', 60),
		"$what: the worker is waiting for brokers, last_error says why");
	push @last_errors, $node->safe_psql('postgres', 'SELECT last_error FROM outbox_worker');
	note("last_error: $last_errors[-1]");
	enqueue_messages($topic, 5);
	sleep(5);
	is($node->safe_psql('postgres', qq{
			SELECT count(*), sum(attempts), min(state), max(state) FROM outbox_message WHERE topic = '$topic'}),
		'5|0|pending|pending', "$what: the messages wait in the outbox, untried");
	is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox_dead_letter'), '0',
		"$what: nothing is dead-lettered");
	is($node->safe_psql('postgres', 'SELECT state FROM outbox_worker'), 'waiting for brokers',
		"$what: the worker still waits");
}

sub check_delivered
{
	my ($what, $topic) = @_;
	ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE topic = '$topic'", '0', 60),
		"$what: the messages are delivered");
	# Order is promised within a key; the first messages to a topic being
	# created may be retried, and overtaken by another key's.
	is_deeply(payloads_by_key($topic, 5),
		{ 'key-1' => [ 'message 1', 'message 3', 'message 5' ], 'key-0' => [ 'message 2', 'message 4' ] },
		"$what: Kafka has each of them once, in order within each key");
}

# SASL/PLAIN with the right password.
my $topic = unique_topic('sasl');
enqueue_messages($topic, 5);
check_delivered('SASL_PLAINTEXT', $topic);
is($node->safe_psql('postgres', 'SELECT state, brokers, brokers_reachable FROM outbox_worker'),
	"idle|127.0.0.1:$sasl_port|t", 'outbox_worker shows the authenticated listener, reachable');

# A wrong password, then the right one again.
reconfigure("127.0.0.1:$sasl_port", sasl_properties('SASL_PLAINTEXT', $wrong_password));
$topic = unique_topic('sasl.wrong');
check_waits('wrong password', 'authentication', $topic);
reconfigure("127.0.0.1:$sasl_port", sasl_properties('SASL_PLAINTEXT', $password));
check_delivered('password fixed by a reload', $topic);

# SASL over TLS: first without the broker's certificate among the trusted
# ones, then with it.
reconfigure("127.0.0.1:$ssl_port", sasl_properties('SASL_SSL', $password));
$topic = unique_topic('tls');
check_waits('untrusted certificate', 'certificate verify failed', $topic);
reconfigure("127.0.0.1:$ssl_port", sasl_properties('SASL_SSL', $password, "; ssl.ca.location=$ca"));
check_delivered('SASL_SSL, certificate trusted', $topic);

is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox_dead_letter'), '0',
	'nothing was dead-lettered');
ok(!grep({ index($_, $password) >= 0 || index($_, $wrong_password) >= 0 } @last_errors),
	'no password in outbox_worker.last_error');
$node->stop;
my $log = slurp_file($node->logfile);
ok(index($log, $password) < 0 && index($log, $wrong_password) < 0, 'no password in the server log');

done_testing();

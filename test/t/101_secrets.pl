# Kafka secrets in outbox.kafka_properties are never visible to a role that
# is not a superuser: not to a plain role, not to a pg_monitor member (which
# may read settings that only superusers may read), not through SHOW,
# current_setting(), pg_settings, pg_file_settings or the views, and never in
# the server log or outbox_worker.last_error, whatever the configuration:
# valid, malformed, with a property or a value librdkafka refuses.  (A wrong
# password against a real SASL listener is in 102_sasl.pl.)
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

# Each configuration carries its own secret, so that the log shows which
# one leaked, if any.
my @secrets = map { "S3cret-$_-" . int(rand(1e9)) } 1 .. 5;
my ($valid, $malformed, $unknown_property, $refused_value, $changed) = @secrets;

# SASL properties with security.protocol left at plaintext: librdkafka
# ignores them and the worker publishes to the test broker as usual.
sub properties
{
	my ($password, $extra) = @_;
	return "client.id=outbox-secrets; sasl.mechanisms=PLAIN; sasl.username=app; "
	  . "sasl.password=$password" . ($extra // '');
}

my $node = outbox_node('secrets',
	conf => "outbox.kafka_properties = '" . properties($valid) . "'");
$node->safe_psql('postgres', q{
	CREATE ROLE outbox_plain LOGIN;
	-- pg_monitor for pg_read_all_settings, and the views as the README's
	-- monitoring role has them, so that last_error is looked at too
	CREATE ROLE outbox_monitor LOGIN IN ROLE pg_monitor;
	GRANT SELECT ON outbox_status, outbox_worker TO outbox_monitor;
	GRANT EXECUTE ON FUNCTION outbox_worker_status() TO outbox_monitor;
});

# Everything a role can ask the server about the setting, by query; a
# refusal is an answer too.
sub what_role_sees
{
	my ($role) = @_;
	my %seen;
	for my $query (
		'SHOW outbox.kafka_properties',
		"SELECT current_setting('outbox.kafka_properties')",
		"SELECT s::text FROM pg_settings s WHERE name LIKE 'outbox.%'",
		'SHOW ALL',
		'SELECT f::text FROM pg_file_settings f',
		'SELECT w::text FROM outbox_worker w',
		'SELECT s::text FROM outbox_status s')
	{
		my ($stdout, $stderr);
		$node->psql('postgres', $query, stdout => \$stdout, stderr => \$stderr,
			extra_params => [ '-U', $role ]);
		$seen{$query} = "$stdout$stderr";
	}
	return \%seen;
}

sub shows_no_secret
{
	my ($text) = @_;
	return !grep { index($text, $_) >= 0 } @secrets;
}

sub all_of
{
	my ($seen) = @_;
	return join("\n", map { "$_: $seen->{$_}" } sort keys %$seen);
}

my $plain = what_role_sees('outbox_plain');
like($plain->{'SHOW outbox.kafka_properties'}, qr/permission denied|must be superuser/,
	'a plain role may not SHOW outbox.kafka_properties');
ok(shows_no_secret(all_of($plain)), 'a plain role sees no secret anywhere')
  or diag(all_of($plain));

my $monitor = what_role_sees('outbox_monitor');
like($monitor->{'SHOW outbox.kafka_properties'},
	qr/^client\.id=\*+; sasl\.mechanisms=\*+; sasl\.username=\*+; sasl\.password=\*+$/,
	'a pg_monitor member sees the property names, every value masked');
like($monitor->{'SELECT w::text FROM outbox_worker w'}, qr/^\(1,postgres,/,
	'and reads the outbox_worker view');
unlike($monitor->{"SELECT s::text FROM pg_settings s WHERE name LIKE 'outbox.%'"},
	qr/kafka_properties/,
	'outbox.kafka_properties is not in pg_settings, whose reset_val would show it');
ok(shows_no_secret(all_of($monitor)), 'a pg_monitor member sees no secret anywhere')
  or diag(all_of($monitor));
like($node->safe_psql('postgres', 'SHOW outbox.kafka_properties'), qr/\Q$valid\E/,
	'a superuser sees the setting as written');

# Configurations a worker cannot use, each reloaded from postgresql.conf; the
# error must name what is wrong without repeating a value.
sub reload_with
{
	my ($properties) = @_;
	$node->append_conf('postgresql.conf', "outbox.kafka_properties = '$properties'");
	$node->reload;
}

sub worker_error_mentions
{
	my ($pattern) = @_;
	return $node->poll_query_until('postgres',
		"SELECT last_error ~ '$pattern' FROM outbox_worker");
}

my $offset = -s $node->logfile;
reload_with(properties($malformed) =~ s/sasl.password=/sasl.password /r);
ok($node->wait_for_log(qr/configuration file .* contains errors/, $offset),
	'a malformed outbox.kafka_properties is refused at reload');
like(slurp_file($node->logfile, $offset),
	qr/invalid value for parameter "outbox.kafka_properties"\n.*DETAIL:  Each property must be written name=value/,
	'the log says what is wrong with it');
like($node->safe_psql('postgres', 'SHOW outbox.kafka_properties'), qr/\Q$valid\E/,
	'and the setting keeps its previous value');

$offset = -s $node->logfile;
reload_with(properties($valid, "; sasl.pasword=$unknown_property"));
ok($node->wait_for_log(qr/configuration file .* contains errors/, $offset),
	'a property librdkafka does not know is refused at reload');
like(slurp_file($node->logfile, $offset),
	qr/invalid value for parameter "outbox.kafka_properties": librdkafka has no property "sasl.pasword"/,
	'the log names the property');
like($node->safe_psql('postgres', 'SHOW outbox.kafka_properties'), qr/\Q$valid\E/,
	'and the setting keeps its previous value');
my @last_errors;

reload_with(properties($valid, "; security.protocol=$refused_value"));
ok(worker_error_mentions('librdkafka refuses property "security.protocol"'),
	'a value librdkafka refuses is reported by its property\'s name');
push @last_errors, $node->safe_psql('postgres', 'SELECT last_error FROM outbox_worker');
is($node->safe_psql('postgres', 'SELECT state FROM outbox_worker'), 'waiting for brokers',
	'the worker waits meanwhile');

# A usable configuration with a new secret: the worker publishes again.
$offset = -s $node->logfile;
reload_with(properties($changed));
ok($node->wait_for_log(qr/parameter "outbox.kafka_properties" changed/, $offset),
	'the change of outbox.kafka_properties is logged');
my $topic = unique_topic('secrets');
$node->safe_psql('postgres', "SELECT outbox_enqueue('$topic', 'after the reloads'::text)");
ok(wait_for_query($node, 'SELECT count(*) FROM outbox_message', '0', 60),
	'the worker publishes with the new configuration');
ok(shows_no_secret(all_of(what_role_sees('outbox_monitor'))), 'a pg_monitor member still sees no secret');

ok(shows_no_secret(join("\n", @last_errors)), 'no secret in outbox_worker.last_error');
$node->stop;
my $log = slurp_file($node->logfile);
my @leaked = grep { index($log, $_) >= 0 } @secrets;
is_deeply(\@leaked, [], 'no secret in the server log');

done_testing();

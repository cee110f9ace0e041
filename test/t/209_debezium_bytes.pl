# Debezium's records, byte for byte: for each row of test/debezium/cases.jsonl
# inserted into a captured table, the record in Kafka has the key, the value
# and the partition that Debezium 3.6 gives the same row (the PostgreSQL
# connector, EventRouter, Kafka Connect 4.3's JsonConverter or
# StringConverter with Jackson 2.21, on Java 19 or later, and the Java
# producer's partitioner).
#
# The cases cover JsonConverter values (compact, every escape, characters
# outside the Basic Multilingual Plane as surrogate pairs, doubles as Java
# writes them, numbers of every size, nested and empty containers, nulls),
# table.expand.json.payload (what EventRouter leaves out, merges, or keeps a
# string), JsonConverter keys, NULL and empty payloads, and envelopes.  Each
# expected record was written from Jackson's and EventRouter's behaviour and
# is what test/debezium/check finds running the real Debezium on the same
# case (a JVM, which this test does not need).  "debezium": "fails" marks a
# row on which Debezium's task fails and stops publishing: the expected
# record is what is published here (docs/capture.md, "Where it differs from
# Debezium"); "field order", one whose fields Debezium writes in an order of
# its JVM's hash codes.  The partition is Kafka's murmur2 of the key's
# bytes, computed here too, so that the file cannot hold a wrong one.
use strict;
use warnings;

use Cwd qw(abs_path);
use Encode qw(encode);
use File::Basename qw(dirname);
use JSON::PP;
use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $top = abs_path(dirname(__FILE__) . '/../..');
my @cases = map { JSON::PP->new->utf8->decode($_) } grep { /\S/ }
  split /\n/, slurp_file("$top/test/debezium/cases.jsonl");

my $node = outbox_node('bytes', init => { extra => [ '--encoding=UTF8', '--locale=C' ] });
my $run = unique_topic('bytes');

my %converter = (
	json => 'org.apache.kafka.connect.json.JsonConverter',
	string => 'org.apache.kafka.connect.storage.StringConverter');

# Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2) of bytes,
# and the partition the Java producer gives a key of them.
sub murmur2
{
	my ($data) = @_;
	my $m = 0x5bd1e995;
	my $len = length($data);
	my $h = (0x9747b28c ^ $len) & 0xffffffff;
	my $mul = sub { my ($x, $y) = @_; return (($x * ($y & 0xffff)) + ((($x * ($y >> 16)) & 0xffff) << 16)) & 0xffffffff; };
	my $whole = $len - $len % 4;

	for (my $i = 0; $i < $whole; $i += 4)
	{
		my $k = unpack('V', substr($data, $i, 4));
		$k = $mul->($k, $m);
		$k ^= $k >> 24;
		$k = $mul->($k, $m);
		$h = $mul->($h, $m) ^ $k;
	}
	my @tail = map { ord } split //, substr($data, $whole);
	$h ^= $tail[2] << 16 if @tail >= 3;
	$h ^= $tail[1] << 8 if @tail >= 2;
	$h = $mul->($h ^ $tail[0], $m) if @tail >= 1;
	$h ^= $h >> 13;
	$h = $mul->($h, $m);
	$h ^= $h >> 15;
	return $h;
}

sub partition_of
{
	my ($key, $partitions) = @_;
	return (murmur2(encode('UTF-8', $key)) & 0x7fffffff) % $partitions;
}

is(partition_of('customer-42', 6), 3, 'murmur2: the partition Kafka\'s Java producer gives a key');

sub literal
{
	my ($text) = @_;
	return 'NULL' unless defined $text;
	die "a case holds \$c\$" if $text =~ /\$c\$/;
	return "\$c\$$text\$c\$";
}

# One captured table, and one topic, per combination of settings.
my (%table_of, @setup, @inserts);
for my $i (0 .. $#cases)
{
	my $c = $cases[$i];
	my @config = map { $c->{$_} ? $c->{$_} : 'no' }
	  qw(payload_type value_converter key_converter expand tombstone envelope partitions);
	my $config = join('-', @config);

	if (!exists $table_of{$config})
	{
		my $n = scalar(keys %table_of);
		my $table = "events_$n";
		my $topic = "$run.$n";
		my %settings = (
			'route.topic.replacement' => $topic,
			'value.converter' => $converter{ $c->{value_converter} },
			'key.converter' => $converter{ $c->{key_converter} },
			'table.expand.json.payload' => $c->{expand} ? JSON::PP::true : JSON::PP::false,
			'route.tombstone.on.empty.payload' => $c->{tombstone} ? JSON::PP::true : JSON::PP::false);
		$settings{'table.fields.additional.placement'} = 'type:envelope:eventType' if $c->{envelope};

		kafka_admin('create-topic', $topic, '--partitions', $c->{partitions});
		push @setup, "CREATE TABLE $table (id uuid PRIMARY KEY, aggregatetype varchar(255),"
		  . " aggregateid varchar(255), type varchar(255), payload $c->{payload_type});",
		  "SELECT outbox_capture('$table', " . literal(JSON::PP->new->canonical->encode(\%settings)) . ");";
		$table_of{$config} = { table => $table, topic => $topic };
	}
	$c->{id} = sprintf('00000000-0000-4000-8000-%012d', $i);
	$c->{topic} = $table_of{$config}{topic};
	push @inserts, "INSERT INTO $table_of{$config}{table} VALUES ('$c->{id}', 'Order', "
	  . literal($c->{key}) . ", 'OrderCreated', " . literal($c->{payload}) . ");";
}
$node->safe_psql('postgres', encode('UTF-8', join("\n", @setup)));

# A jsonb case holds its payload as PostgreSQL writes it, which is what
# Debezium reads from the WAL and what the expected bytes were made from.
my @unnormal = grep { $_->{payload_type} eq 'jsonb' && defined $_->{payload}
	  && $node->safe_psql('postgres', encode('UTF-8', 'SELECT ' . literal($_->{payload}) . '::jsonb::text'))
	  ne encode('UTF-8', $_->{payload}) } @cases;
is_deeply([ map { $_->{name} } @unnormal ], [], 'every jsonb payload is written as PostgreSQL writes it');

# Each row in a transaction of its own, published at its commit.
for my $i (0 .. $#cases)
{
	my ($ret, $stdout, $stderr) = $node->psql('postgres', encode('UTF-8', $inserts[$i]));
	is($ret, 0, "$cases[$i]{name}: inserted") or diag($stderr);
}

my $records = consume_topics(topics => [ map { $_->{topic} } values %table_of ],
	expect => scalar(@cases) + 1, idle => 3, timeout => 60);
is(scalar(@$records), scalar(@cases), 'one record per row');

my %record_of = map {
	my $record = $_;
	my ($id) = map { $_->[1] } grep { $_->[0] eq 'id' } @{ $record->{headers} };
	(defined $id ? $id : '' => $record)
} @$records;

# A test's name, in ASCII (the TAP output is not UTF-8 on every major).
sub show
{
	my ($text) = @_;
	return 'no bytes' unless defined $text;
	$text = substr($text, 0, 120) . '...' if length($text) > 120;
	return $text =~ s/([^\x20-\x7e])/sprintf('\\x{%X}', ord($1))/ger;
}

# A key's or value's bytes, compared as such.
sub bytes_of
{
	my ($text) = @_;
	return defined $text ? encode('UTF-8', $text) : undef;
}

for my $c (@cases)
{
	my $got = $record_of{ $c->{id} };
	my $expect = $c->{expect};
	my $note = $c->{debezium} ? " (Debezium: $c->{debezium})" : '';

	if (!ok($got, "$c->{name}: published"))
	{
		next;
	}
	ok(!exists $got->{key_b64} && !exists $got->{value_b64}, "$c->{name}: key and value are UTF-8");
	is(bytes_of($got->{key}), bytes_of($expect->{key}), "$c->{name}: key " . show($expect->{key}));
	is(bytes_of($got->{value}), bytes_of($expect->{value}), "$c->{name}: value " . show($expect->{value}) . $note);
	next unless defined $expect->{key};
	is($expect->{partition}, partition_of($expect->{key}, $c->{partitions}),
		"$c->{name}: the expected partition is murmur2's");
	is($got->{partition}, $expect->{partition}, "$c->{name}: partition $expect->{partition} of $c->{partitions}");
}

$node->stop;
done_testing();

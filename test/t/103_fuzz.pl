# Hostile input, generated: a few thousand messages go in through
# outbox_enqueue() (jsonb, text and bytea payloads) and through a plain
# INSERT, with quotes, backslashes, semicolons, SQL and unicode in every
# field, random bytes (NUL included) in payloads, invalid UTF-8, NUL bytes in
# text, malformed, nested and deep headers, up to 10,000 headers, topics
# Kafka would refuse, and records on both sides of the size limit.  Each
# input is either refused with the SQLSTATE its fault calls for, leaving no
# row, or delivered to Kafka unchanged: payload bytes, key and headers.
#
# The seed is fixed and printed; OUTBOX_FUZZ_SEED=n runs another one.
use strict;
use warnings;
use utf8;

use Encode qw(encode_utf8);
use JSON::PP;
use List::Util qw(shuffle sum0);
use MIME::Base64 qw(decode_base64 encode_base64);
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $seed = $ENV{OUTBOX_FUZZ_SEED} // 1130;
srand($seed);
diag("fuzz seed $seed (set OUTBOX_FUZZ_SEED to run another)");

my $random_inputs = 3000;
my $limit = 1000000;    # outbox.max_payload_size, librdkafka's message.max.bytes

# The extension's checks assume a UTF8 database, as Kafka's clients do; the
# node is made with one whatever the machine's locale.  Delivered rows are
# kept, so that each can be compared with what Kafka got.
my $node = PostgreSQL::Test::Cluster->new('fuzz');
$node->init(extra => [ '--encoding=UTF8', '--locale=C' ]);
$node->append_conf('postgresql.conf', join("\n",
	"shared_preload_libraries = 'outbox'",
	"outbox.brokers = '" . brokers() . "'",
	"outbox.database = 'postgres'",
	"outbox.sent_retention = '1h'"));
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');

# A handful of valid topics, so that Kafka does not create thousands.
my @topics = map { unique_topic("fuzz.$_") } qw(a b-c D_e f);

# Fragments that break naive quoting, escaping or splitting, and unicode.
my @fragments = ("'", "''", '"', '\\', '\\\\', ';', '--', '/*', '$$', '$1', '%s', '%n',
	"\n", "\r", "\t", ' ', 'é', '中文', "\x{1F600}", "\x{202E}",
	"'); DROP TABLE outbox_message; --", '\\x00', 'a', 'B', '7', '.', '{', '}', ':', ',');

sub random_text
{
	my ($most) = @_;
	return join('', map { $fragments[ rand @fragments ] } 1 .. int(rand($most + 1)));
}

sub random_bytes
{
	my ($length) = @_;
	return substr(pack('N*', map { int(rand(2**32)) } 0 .. $length / 4), 0, $length);
}

sub random_headers
{
	my ($count) = @_;
	my %headers;
	$headers{ ($count > 20 ? 'h' . keys(%headers) : '') . random_text(4) } =
	  rand() < 0.2 ? undef : random_text(6)
	  while keys %headers < $count;
	return \%headers;
}

# Sizes as librdkafka counts a record (see check_record_size() in
# src/enqueue.c): 36 bytes of framing, the 55-byte outbox-message-id header.
sub varint_size
{
	my ($n) = @_;
	my ($zigzag, $size) = ($n * 2, 1);
	($zigzag, $size) = (int($zigzag / 128), $size + 1) while $zigzag >= 128;
	return $size;
}

sub record_size
{
	my ($in, $payload_length) = @_;
	my $headers = $in->{headers} // {};
	my $bytes = sub { defined $_[0] ? length(encode_utf8($_[0])) : 0 };
	return 36 + 55 + $payload_length + $bytes->($in->{key}) + sum0(
		map {
			my ($n, $v) = ($bytes->($_), $bytes->($headers->{$_}));
			varint_size($n) + $n + varint_size($v) + $v
		} keys %$headers);
}

sub payload_of_kind
{
	my ($kind, $length) = @_;
	return random_bytes($length // int(rand(300))) if $kind eq 'bytea';
	return defined $length ? join('', map { chr(32 + int(rand(95))) } 1 .. $length)
	  : encode_utf8(random_text(30))
	  if $kind eq 'text';
	return JSON::PP->new->utf8->encode({ text => random_text(8), number => int(rand(1e6)),
		list => [ random_text(3), undef, JSON::PP::true ], nested => { q => random_text(4) } });
}

# A valid message; the faults below each spoil one thing of it.
sub valid_input
{
	my (%in) = (way => rand() < 0.5 ? 'enqueue' : 'insert', expect => 'ok');
	$in{kind} = $in{way} eq 'insert' ? 'bytea' : (qw(bytea text jsonb))[ rand 3 ];
	$in{topic} = $topics[ rand @topics ];
	$in{key} = rand() < 0.2 ? undef : random_text(10);
	$in{headers} = rand() < 0.3 ? undef : random_headers(int(rand(6)));
	$in{payload} = payload_of_kind($in{kind});
	return \%in;
}

my @bad_topics = ('', ' ', 'a b', "o'reilly", 'semi;colon', "x'); DROP TABLE outbox_message; --",
	'back\\slash', 'ünïcödé', "\x{1F600}", '.', '..', 't' x 250, "tab\there", "new\nline",
	'a/b', '%s', '$$');

# name => [weight, SQLSTATE, how it spoils a valid input]
my %faults = (
	null_topic => [ 2, '22004', sub { $_[0]{topic} = undef } ],
	bad_topic => [ 4, '22023', sub { $_[0]{topic} = $bad_topics[ rand @bad_topics ] } ],
	null_payload => [ 2, '22004', sub { $_[0]{payload} = undef } ],
	header_not_string => [
		3, '22023',
		sub {
			$_[0]{headers_json} =
			  ('{"h": 1}', '{"h": true}', '{"h": {"x": "y"}}', '{"h": ["x"]}', '{"a": "b", "c": 2.5}')
			  [ rand 5 ];
		}
	],
	headers_not_object => [
		2, '22023', sub { $_[0]{headers_json} = ('[1, 2]', '"text"', '42', 'null', '[]')[ rand 5 ] }
	],
	nested_headers => [
		1, '22023', sub { $_[0]{headers_json} = '{"a": ' x 200 . '"x"' . '}' x 200 }
	],
	nul_in_header => [ 1, '22P05', sub { $_[0]{headers_json} = '{"h": "a\u0000b"}' } ],
	invalid_utf8_in_header => [ 1, '22021', sub { $_[0]{headers_json} = "{\"h\": \"a\xc3\x28\"}" } ],
	invalid_utf8_in_key => [ 1, '22021', sub { $_[0]{key_bytes} = "key\xff\xfe" } ],
	nul_in_key => [ 1, '22021', sub { $_[0]{key_bytes} = "key\x00key" } ],
	invalid_utf8_in_text => [
		1, '22021',
		sub { @{ $_[0] }{qw(way kind payload)} = ('enqueue', 'text', "text\xc3\x28\xa0") }
	],
	nul_in_text => [
		1, '22021', sub { @{ $_[0] }{qw(way kind payload)} = ('enqueue', 'text', "text\x00text") }
	],
	invalid_json_payload => [
		1, '22P02',
		sub { @{ $_[0] }{qw(way kind payload)} = ('enqueue', 'jsonb', "{\"a\": 1, 'b'}") }
	],);
my $fault_weight = sum0(map { $_->[0] } values %faults);

my @inputs;
for (1 .. $random_inputs)
{
	my $in = valid_input();
	if (rand() < 0.2)
	{
		my $pick = rand($fault_weight);
		for my $name (sort keys %faults)
		{
			next if ($pick -= $faults{$name}[0]) >= 0;
			$faults{$name}[2]->($in);
			@$in{qw(fault expect)} = ($name, $faults{$name}[1]);
			last;
		}
	}
	push @inputs, $in;
}

# Rare and heavy inputs, a fixed number of each.  Many headers: they fit.
for my $count (100, 1000, 5000, 9999, 10000, 10000)
{
	my $in = valid_input();
	$in->{headers} = random_headers($count);
	$in->{fault} = 'many_headers';
	push @inputs, $in;
}

# Too big in their key or their headers, or too deep to parse.
for (1 .. 2)
{
	my $in = valid_input();
	@$in{qw(key fault expect)} = ('k' x $limit, 'huge_key', '54000');
	push @inputs, $in;
	$in = valid_input();
	@$in{qw(headers fault expect)} = ({ map { ("header-$_" => 'v' x 100) } 1 .. 10000 }, 'huge_headers', '54000');
	push @inputs, $in;
	$in = valid_input();
	@$in{qw(headers_json fault expect)} = ('{"a": ' x 100000 . '"x"' . '}' x 100000, 'deep_headers', '54001');
	push @inputs, $in;
}

# Records around the limit, with a long key, with headers, with many: the
# payload is sized to leave the record 1 byte under, at, or 1 byte over it.
for my $shape ('plain', 'long key', 'headers', 'many headers')
{
	for my $over (-1, 0, 1)
	{
		my $in = valid_input();
		$in->{kind} = 'text' if $in->{kind} eq 'jsonb';
		$in->{key} = 'key-' . random_text(8) . ('K' x 300000) if $shape eq 'long key';
		$in->{headers} = random_headers(5) if $shape eq 'headers';
		$in->{headers} = random_headers(3000) if $shape eq 'many headers';
		$in->{payload} = payload_of_kind($in->{kind}, $limit - record_size($in, 0) + $over);
		@$in{qw(fault expect)} = ("limit $over ($shape)", $over > 0 ? '54000' : 'ok');
		push @inputs, $in;
	}
}

@inputs = shuffle(@inputs);
$inputs[$_]{n} = $_ + 1 for 0 .. $#inputs;

# The inputs travel to the server in base64, so that the test itself splices
# nothing into SQL; the server decodes them and calls outbox_enqueue() or
# INSERTs, each input in a transaction of its own, recording the id or the
# error.
sub b64 { return defined $_[0] ? encode_base64($_[0], '') : '\N' }

# The bytes of what consume.py prints: text, or base64 where it is not UTF-8.
sub bytes_of
{
	my ($text, $b64) = @_;
	return defined $b64 ? decode_base64($b64) : defined $text ? encode_utf8($text) : undef;
}

my $file = PostgreSQL::Test::Utils::tempdir() . '/inputs.copy';
open(my $fh, '>', $file) or die "cannot write $file: $!";
for my $in (@inputs)
{
	my $headers_json = $in->{headers_json}
	  // (defined $in->{headers} ? JSON::PP->new->utf8->canonical->encode($in->{headers}) : undef);
	my $key = $in->{key_bytes} // (defined $in->{key} ? encode_utf8($in->{key}) : undef);
	print $fh join("\t", $in->{n}, $in->{way}, $in->{kind},
		map { b64($_) } (defined $in->{topic} ? encode_utf8($in->{topic}) : undef),
		$key, $headers_json, $in->{payload}), "\n";
}
close($fh);

$node->safe_psql('postgres', qq{
	CREATE TABLE fuzz_input (n int PRIMARY KEY, way text, kind text,
	                         topic text, key text, headers text, payload text);
	CREATE TABLE fuzz_result (n int PRIMARY KEY, id bigint, sqlstate text, message text, hint text);
	COPY fuzz_input FROM '$file';
	CREATE PROCEDURE fuzz_run() LANGUAGE plpgsql AS \$\$
	DECLARE
	    r record;
	    topic text;
	    key text;
	    headers jsonb;
	    new_id bigint;
	    state text;
	    message text;
	    hint text;
	BEGIN
	    FOR r IN SELECT * FROM fuzz_input ORDER BY n LOOP
	        BEGIN
	            topic := convert_from(decode(r.topic, 'base64'), 'UTF8');
	            key := convert_from(decode(r.key, 'base64'), 'UTF8');
	            headers := convert_from(decode(r.headers, 'base64'), 'UTF8')::jsonb;
	            IF r.way = 'insert' THEN
	                INSERT INTO outbox_message (topic, key, payload, headers)
	                VALUES (topic, key, decode(r.payload, 'base64'), headers)
	                RETURNING id INTO new_id;
	            ELSIF r.kind = 'bytea' THEN
	                new_id := outbox_enqueue(topic, decode(r.payload, 'base64'), key, headers);
	            ELSIF r.kind = 'text' THEN
	                new_id := outbox_enqueue(topic, convert_from(decode(r.payload, 'base64'), 'UTF8'),
	                                         key, headers);
	            ELSE
	                new_id := outbox_enqueue(topic, convert_from(decode(r.payload, 'base64'), 'UTF8')::jsonb,
	                                         key, headers);
	            END IF;
	            INSERT INTO fuzz_result (n, id) VALUES (r.n, new_id);
	        EXCEPTION WHEN OTHERS THEN
	            GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
	                                    hint = PG_EXCEPTION_HINT;
	            INSERT INTO fuzz_result VALUES (r.n, NULL, state, message, hint);
	        END;
	        COMMIT;
	    END LOOP;
	END
	\$\$;
});
$node->safe_psql('postgres', 'CALL fuzz_run()');

# What became of each input.
my %result;
for my $row (split /\n/, $node->safe_psql('postgres', q{
	SELECT r.n, coalesce(r.sqlstate, 'ok'), coalesce(r.hint, '') <> '', m.message_id,
	       CASE WHEN i.kind = 'jsonb' THEN translate(encode(m.payload, 'base64'), E'\n', '') END
	  FROM fuzz_result r JOIN fuzz_input i USING (n) LEFT JOIN outbox_message m USING (id)}))
{
	my ($n, $outcome, $has_hint, $message_id, $stored) = split /\|/, $row;
	$result{$n} = { outcome => $outcome, has_hint => $has_hint eq 't',
		message_id => $message_id, stored => $stored };
}

my (@wrong_outcome, @no_hint, %refused);
my @accepted = grep { $result{ $_->{n} }{outcome} eq 'ok' } @inputs;
for my $in (@inputs)
{
	my $got = $result{ $in->{n} };
	push @wrong_outcome, "input $in->{n} (" . ($in->{fault} // 'valid') . "): expected $in->{expect}, got $got->{outcome}"
	  if $got->{outcome} ne $in->{expect};
	next if $got->{outcome} eq 'ok';
	$refused{ $got->{outcome} }++;
	push @no_hint, $in->{n} if $got->{outcome} =~ /^(22004|22023|54000)$/ && !$got->{has_hint};
}
is(scalar(@wrong_outcome), 0, 'each input is accepted or refused as its fault calls for')
  or diag(join("\n", @wrong_outcome[ 0 .. ($#wrong_outcome < 9 ? $#wrong_outcome : 9) ]));
is_deeply(\@no_hint, [], 'every refusal of the extension has a hint');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox_message'), scalar(@accepted),
	'the outbox holds the accepted messages and nothing of the refused ones');

ok(wait_for_query($node, "SELECT count(*) FROM outbox_message WHERE state <> 'sent'", '0', 120),
	'every accepted message is delivered');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox_dead_letter'), '0',
	'none is dead-lettered');

# Kafka's records, matched to the inputs by outbox-message-id.
my %input_of = map { ($result{ $_->{n} }{message_id} => $_) } @accepted;
my $records = consume_topics(topics => \@topics, expect => scalar(@accepted), timeout => 120);
my (%seen, @changed);
for my $record (@$records)
{
	my $in = $input_of{ message_id_header($record) // '' };
	if (!$in || $seen{ $in->{n} }++)
	{
		push @changed, 'a record that is no accepted input, or a duplicate';
		next;
	}
	my $payload = $in->{kind} eq 'jsonb' ? decode_base64($result{ $in->{n} }{stored}) : $in->{payload};
	my (%got_headers, %expected_headers);
	for my $h (grep { $_->[0] ne 'outbox-message-id' } @{ $record->{headers} })
	{
		$got_headers{ encode_utf8($h->[0]) } =
		  ref $h->[1] ? decode_base64($h->[1]{b64}) : bytes_of($h->[1]);
	}
	$expected_headers{ encode_utf8($_) } = bytes_of($in->{headers}{$_}) for keys %{ $in->{headers} // {} };
	push @changed, "input $in->{n}: payload differs"
	  if (bytes_of($record->{value}, $record->{value_b64}) // '<null>') ne $payload;
	push @changed, "input $in->{n}: key differs"
	  if (bytes_of($record->{key}, $record->{key_b64}) // '<null>')
	  ne (defined $in->{key} ? encode_utf8($in->{key}) : '<null>');
	push @changed, "input $in->{n}: headers differ"
	  if JSON::PP->new->canonical->encode(\%got_headers) ne JSON::PP->new->canonical->encode(\%expected_headers);
}
is(scalar(@$records), scalar(@accepted), 'Kafka holds one record per accepted input');
is(scalar(@changed), 0, 'each record is its input unchanged: payload bytes, key and headers')
  or diag(join("\n", @changed[ 0 .. ($#changed < 9 ? $#changed : 9) ]));

diag(sprintf('fuzz: %d inputs (%d through outbox_enqueue, %d through INSERT): '
	  . '%d delivered byte-exact, %d refused (%s)',
	scalar(@inputs), scalar(grep { $_->{way} eq 'enqueue' } @inputs),
	scalar(grep { $_->{way} eq 'insert' } @inputs), scalar(@accepted),
	sum0(values %refused), join(', ', map { "$_: $refused{$_}" } sort keys %refused)));

# The check at the door is exactly librdkafka's: with the limit raised by one
# byte, a record of limit + 1 bytes passes the door and librdkafka refuses
# it, so the message is dead-lettered as too large.
my $probe = $topics[0];
$node->safe_psql('postgres', qq{
	SET outbox.max_payload_size = @{[ $limit + 1 ]};
	SELECT outbox_enqueue('$probe', repeat('x', @{[ $limit + 1 - 91 ]}));});
ok(wait_for_query($node,
		"SELECT error FROM outbox_dead_letter WHERE topic = '$probe'", 'Broker: Message size too large', 60),
	'a record one byte over librdkafka\'s limit is one librdkafka refuses');

done_testing();

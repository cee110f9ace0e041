# A database whose encoding is not UTF-8 (LATIN1) publishes and consumes,
# and captures a Debezium outbox table whose records are UTF-8, as Kafka
# Connect's converters write them whatever the database's encoding.
# Kafka's keys and headers are UTF-8 text: the publisher sends them so, and
# the inbox converts what it reads to the database's encoding; a key or
# header that LATIN1 cannot hold reaches the handler as the hex of its
# UTF-8 bytes ("\x..."), as bytes that are not UTF-8 do.  The inbox worker
# never stops over it.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = outbox_node('encodings');
$node->safe_psql('postgres', q{
	CREATE DATABASE latin ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0});
$node->safe_psql('latin', 'CREATE EXTENSION outbox');

my $topic = unique_topic('latin');
kafka_admin('create-topic', $topic, '--partitions', '1');

# Every text here is given with escapes, whatever the client's encoding.
$node->safe_psql('latin', qq{
	CREATE ROLE latin_svc;
	CREATE TABLE got (seq bigserial PRIMARY KEY, key_hex text, headers_hex text, payload bytea);
	GRANT INSERT ON got TO latin_svc;
	GRANT USAGE ON SEQUENCE got_seq_seq TO latin_svc;
	CREATE FUNCTION take(m inbox_message) RETURNS void LANGUAGE sql AS \$\$
	    INSERT INTO got (key_hex, headers_hex, payload)
	    VALUES (encode(convert_to(m.key, 'LATIN1'), 'hex'),
	            encode(convert_to((m.headers - 'outbox-message-id')::text, 'LATIN1'), 'hex'),
	            m.payload)
	\$\$;
	GRANT EXECUTE ON FUNCTION take(inbox_message) TO latin_svc;
	SELECT outbox_grant_topic('latin_svc', '$topic', 'subscribe');
	SELECT inbox_subscribe('latin', ARRAY['$topic'], 'take(inbox_message)', run_as => 'latin_svc');
});
my $worker_pid_query =
  "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox inbox' AND datname = 'latin'";
ok($node->poll_query_until('latin', "SELECT count(*) = 1 FROM ($worker_pid_query) w"),
	'an inbox worker serves the LATIN1 database');
my $worker_pid = $node->safe_psql('latin', $worker_pid_query);

# Published from the LATIN1 database: key "café", header h = "naïve".
$node->safe_psql('latin', qq{
	SELECT outbox_enqueue('$topic', '{"n": 1}'::jsonb, U&'caf\\00E9',
	                      jsonb_build_object('h', U&'na\\00EFve'))});
my $records = consume_topics(topics => [$topic], expect => 1);
is(scalar(@$records), 1, 'the LATIN1 database publishes');
my ($record) = @$records;
# consume.py gives text it read as UTF-8 as JSON strings: back to its bytes
my $key = $record->{key} // '';
my ($h) = map { $_->[1] } grep { $_->[0] eq 'h' } @{ $record->{headers} };
$h //= '';
utf8::encode($_) for $key, $h;
is(unpack('H*', $key), unpack('H*', "caf\xc3\xa9"), 'its key reaches Kafka as UTF-8');
is(unpack('H*', $h), unpack('H*', "na\xc3\xafve"), 'and its header values too');
ok(wait_for_query($node, 'SELECT count(*) FROM got', '1', 60, 'latin'),
	'the inbox of the LATIN1 database applies it');
is($node->safe_psql('latin', 'SELECT key_hex FROM got WHERE seq = 1'), unpack('H*', "caf\xe9"),
	'the handler gets the key in LATIN1');
is($node->safe_psql('latin', 'SELECT headers_hex FROM got WHERE seq = 1'),
	unpack('H*', qq({"h": "na\xefve"})), 'and the header');

# From another producer: UTF-8 text that LATIN1 holds, and a snowman that it does not.
kafka_admin('produce', $topic, '--key', "\xc3\xa9t\xc3\xa9", '--value-hex', '01',
	'--header', "h=\xe2\x98\x83");
kafka_admin('produce', $topic, '--key', "snow\xe2\x98\x83", '--value-hex', '02');
ok(wait_for_query($node, 'SELECT count(*) FROM got', '3', 60, 'latin'),
	'messages with text LATIN1 cannot hold are applied');
is($node->safe_psql('latin', q{SELECT key_hex FROM got WHERE payload = '\x01'}), unpack('H*', "\xe9t\xe9"),
	'a UTF-8 key LATIN1 holds is converted');
is($node->safe_psql('latin', q{SELECT convert_from(decode(headers_hex, 'hex'), 'LATIN1') FROM got WHERE payload = '\x01'}),
	'{"h": "\\\\xe29883"}', 'a header value LATIN1 cannot hold comes as the hex of its UTF-8 bytes');
is($node->safe_psql('latin', q{SELECT convert_from(decode(key_hex, 'hex'), 'LATIN1') FROM got WHERE payload = '\x02'}),
	'\\x736e6f77e29883', 'and so does such a key');
is($node->safe_psql('latin', $worker_pid_query), $worker_pid, 'the inbox worker never stopped (same pid)');
is($node->safe_psql('latin', 'SELECT count(*) FROM inbox_dead_letter'), '0', 'no dead letter');

# Captured from the LATIN1 database: a JsonConverter key "café" and a text
# payload "naïve" under StringConverter, a jsonb payload under JsonConverter,
# an array placed in the envelope (to_json()'s text).
my $captured = unique_topic('latin.captured');
kafka_admin('create-topic', $captured, '--partitions', '1');
$node->safe_psql('latin', qq{
	CREATE TABLE text_events (id uuid, aggregatetype text, aggregateid text, type text, payload text);
	CREATE TABLE json_events (LIKE text_events);
	ALTER TABLE json_events ALTER COLUMN payload TYPE jsonb USING payload::jsonb;
	SELECT outbox_capture('text_events', '{"route.topic.replacement": "$captured",
	    "key.converter": "org.apache.kafka.connect.json.JsonConverter"}');
	SELECT outbox_capture('json_events', '{"route.topic.replacement": "$captured",
	    "value.converter": "org.apache.kafka.connect.json.JsonConverter", "table.expand.json.payload": true}');
	INSERT INTO text_events VALUES (gen_random_uuid(), 'Order', U&'caf\\00E9', 'OrderCreated', U&'na\\00EFve');
	INSERT INTO json_events VALUES (gen_random_uuid(), 'Order', '2', 'OrderCreated', jsonb_build_object('s', U&'na\\00EFve'));
	CREATE TABLE tagged_events (LIKE text_events);
	ALTER TABLE tagged_events ADD COLUMN tags text[];
	SELECT outbox_capture('tagged_events', '{"route.topic.replacement": "$captured",
	    "value.converter": "org.apache.kafka.connect.json.JsonConverter", "table.fields.additional.placement": "tags:envelope"}');
	INSERT INTO tagged_events VALUES (gen_random_uuid(), 'Order', '3', 'OrderCreated', 'x', ARRAY[U&'na\\00EFve']);
});
sub utf8_bytes { my ($text) = @_; $text //= ''; utf8::encode($text); return $text; }
my @bytes = map { [ utf8_bytes($_->{key}), utf8_bytes($_->{value}) ] }
  @{ consume_topics(topics => [$captured], expect => 4, idle => 3) };
is_deeply(\@bytes, [ [ "\"caf\xc3\xa9\"", "na\xc3\xafve" ], [ '2', "{\"s\":\"na\xc3\xafve\"}" ],
		[ '3', "{\"payload\":\"x\",\"tags\":[\"na\xc3\xafve\"]}" ] ],
	'captured records are UTF-8: a JSON key, a text value, an expanded JSON value, an array in the envelope');

# A SQL_ASCII database may hold bytes that are no UTF-8: a captured value
# made of them is refused at the insert (Kafka Connect writes UTF-8), and
# nothing is enqueued.
$node->safe_psql('postgres', q{
	CREATE DATABASE bytes ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0});
$node->safe_psql('bytes', q{
	CREATE EXTENSION outbox;
	CREATE TABLE events (id uuid, aggregatetype text, aggregateid text, type text, payload text);
	SELECT outbox_capture('events', '{"value.converter": "org.apache.kafka.connect.json.JsonConverter"}');
});
my ($ret, $stdout, $stderr) = $node->psql('bytes', q{\set VERBOSITY verbose
	INSERT INTO events VALUES (gen_random_uuid(), 'Order', '1', 'OrderCreated', convert_from('\x61ff62f0', 'SQL_ASCII'))});
like($stderr, qr/22021: invalid byte sequence for encoding "UTF8"/, 'a value that is no UTF-8 is refused with 22021');
is($node->safe_psql('bytes', 'SELECT count(*) FROM outbox_message'), '0', 'and nothing is enqueued');

done_testing();

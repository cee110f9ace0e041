# outbox_capture(): an application written for Debezium's outbox (Kafka
# Connect, the PostgreSQL connector, the EventRouter SMT) publishes through
# this extension with no change to its code, and its consumers read the
# records they read from Debezium.
#
# The contract, field by field, as Debezium's documentation states it
# (https://debezium.io/documentation/reference/stable/transformations/outbox-event-router.html,
# the page documentation/modules/ROOT/pages/transformations/outbox-event-router.adoc
# of debezium/debezium; sections in quotes), and where this differs:
#
# - Table ("Basic outbox table"): id uuid, aggregatetype varchar(255),
#   aggregateid varchar(255), type varchar(255), payload jsonb; "Any
#   additional columns"; "Example outbox message" shows it as
#   inventory.outboxevent.
# - Topic: route.topic.replacement, default "outbox.event.${routedByValue}",
#   where ${routedByValue} is the value of route.by.field, default
#   aggregatetype ("Configuration options": route.by.field, route.topic.regex,
#   route.topic.replacement: "The default topic name is outbox.event. followed
#   by the aggregatetype column value").  The value is not lower-cased: the
#   example shows "outbox.event.order" for aggregatetype "Order", which the
#   RegexRouter it describes would not do; here aggregatetype Order is
#   outbox.event.Order.
# - Key: table.field.event.key, default aggregateid ("Basic outbox table":
#   "The SMT uses this value as the key in the emitted outbox message").  Its
#   bytes are key.converter's: StringConverter writes 1, JsonConverter
#   without schemas "1" (the example's "Kafka Message key: "1"").
# - Value: table.field.event.payload, default payload: "By default, the Kafka
#   message value is solely comprised of the payload value" ("Basic outbox
#   table").  A jsonb payload is its text as PostgreSQL writes it (the
#   example's raw event holds that text, keys in jsonb's order); with
#   StringConverter the value is that text; with JsonConverter a JSON
#   string of it, "{\"id\": 1, ...}" ("Example outbox message", "Expanding
#   escaped JSON String as JSON"); with table.expand.json.payload=true and
#   JsonConverter the document itself, compact as Jackson writes it, less
#   its null fields and empty arrays (table.json.payload.null.behavior
#   ignore): 209_debezium_bytes.pl has the bytes, case by case.  A bytea payload with BinaryDataConverter goes as its bytes
#   ("Using Apache Avro as the payload format").
# - Envelope: "if the outbox event is configured to include additional
#   fields, the Kafka message value contains an envelope encapsulating both
#   payload and the additional fields" ("Basic outbox table", "Emitting
#   messages with additional fields"): here, without Kafka Connect schemas,
#   the JSON object JsonConverter writes of that struct,
#   {"payload":...,"<alias>":...}, payload first.
# - Headers: "id", the value of table.field.event.id (default id): "This ID
#   will be stored in the emitted event's headers under the id key"
#   ("Configuration options").  Columns placed with
#   table.fields.additional.placement column:header[:alias], each a header
#   named by its alias or column.  Values as text (Kafka Connect's
#   SimpleHeaderConverter).  The extension adds outbox-message-id, as on
#   every record it publishes.
# - The type column is in no header nor the envelope by default (Debezium
#   1.2, DBZ-2014); "type:header:eventType" puts it in one ("Emitting
#   messages with additional fields").
# - Partition: column:partition, "adding an alias will have no effect"
#   ("Emitting messages with additional fields").
# - Timestamp: "By default, the timestamp in the emitted outbox message is
#   the Debezium event timestamp" (table.field.event.timestamp), when
#   Debezium read the change; here the insert time (the outbox's
#   created_at), a little earlier.
# - Tombstone: route.tombstone.on.empty.payload, default false, "Indicates
#   whether an empty or null payload causes the connector to emit a
#   tombstone event".  Without it a NULL payload is a record without a
#   value under StringConverter, null under JsonConverter, as Debezium
#   publishes it.
# - UPDATE: table.op.invalid.behavior, default warn: "The SMT logs a warning
#   and continues"; "updates to records in an outbox table are not
#   allowed"; "The SMT automatically filters out DELETE operations".
# - Tracing: tracing.span.context.field, default tracingspancontext, holds
#   "a serialized instance of java.util.Properties with injected span
#   context" (integrations/tracing.adoc, "Configuration options"); the SMT
#   "injects the processing span context into message headers"
#   (traceparent, tracestate with otel.propagators=tracecontext).  Here the
#   row's own traceparent and tracestate become the headers: no
#   debezium-read span is made in between.
# - The Quarkus outbox extension (integrations/outbox.adoc): table
#   OutboxEvent with a timestamp, a VARCHAR(8000) payload and a
#   tracingspancontext column; remove-after-insert defaults to true, "The
#   removal of the entry does not impact the Debezium connector from being
#   able to emit CDC events": it inserts and deletes in one transaction.
#
# Also here: a rolled-back insert publishes nothing; concurrent inserters
# keep per-key order; bad settings are refused with their SQLSTATE; a role
# may neither fire the trigger function on a table outbox_capture() did not
# register, nor capture a table it does not own, and the values of a row are
# made text as the inserting role; a partition the topic lacks dead-letters
# the message with the broker's reason; pg_dump keeps what is captured; and
# outbox_uncapture() stops it.
use strict;
use warnings;

use OutboxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = outbox_node('capture', conf => join("\n",
		"outbox.sent_retention = '1h'",
		"outbox.poll_interval = '10min'"));
my $run = unique_topic('capture');

# Every record of a topic, once $expect have come (and nothing more for a
# while, so that one too many shows).
sub records_of
{
	my ($topic, $expect) = @_;
	return consume_topics(topics => [$topic], expect => $expect + 1, idle => 3, timeout => 60);
}

sub headers_of
{
	my ($record) = @_;
	return { map { ($_->[0] => $_->[1]) } @{ $record->{headers} } };
}

# psql's stderr for statements as role $role, SQLSTATEs shown.
sub stderr_of
{
	my ($role, $sql) = @_;
	my ($ret, $stdout, $stderr) = $node->psql('postgres', "\\set VERBOSITY verbose\nSET ROLE $role;\n$sql");
	return $stderr;
}

sub as_role
{
	my ($role, $sql) = @_;
	return $node->safe_psql('postgres', "SET ROLE $role;\n$sql");
}

sub epoch_ms
{
	return $node->safe_psql('postgres', 'SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint');
}

$node->safe_psql('postgres', q{
	CREATE ROLE app_owner;
	CREATE ROLE app;
	CREATE ROLE intruder;
	GRANT EXECUTE ON FUNCTION outbox_capture(regclass, jsonb), outbox_uncapture(regclass) TO app_owner;
	-- the roles that insert into captured tables publish: to every topic here
	SELECT outbox_grant_topic('app_owner', '*', 'publish'), outbox_grant_topic('app', '*', 'publish');
	CREATE SCHEMA inventory AUTHORIZATION app_owner;
	CREATE SCHEMA quarkus AUTHORIZATION app_owner;
	CREATE SCHEMA shop AUTHORIZATION app_owner;
	GRANT USAGE ON SCHEMA inventory, quarkus, shop TO app;
	GRANT CREATE ON SCHEMA public TO intruder;
});

# 1. The documentation's example: its table, its row, the defaults.
my $order = unique_topic('Order');
my $order_payload = '{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}, {"id": 2, "item": "Debezium for Dummies", "status": "ENTERED", "quantity": 1, "totalPrice": 29.99}], "orderDate": "2019-01-31T12:13:01", "customerId": 123}';
as_role('app_owner', q{
	CREATE TABLE inventory.outboxevent (
	    id            uuid NOT NULL PRIMARY KEY,
	    aggregatetype varchar(255) NOT NULL,
	    aggregateid   varchar(255) NOT NULL,
	    type          varchar(255) NOT NULL,
	    payload       jsonb
	);
	GRANT SELECT, INSERT, UPDATE, DELETE ON inventory.outboxevent TO app;
	SELECT outbox_capture('inventory.outboxevent');
});
my $before = epoch_ms();
as_role('app', qq{
	INSERT INTO inventory.outboxevent VALUES ('406c07f3-26f0-4eea-a50c-109940064b8f', '$order', '1', 'OrderCreated',
	    '$order_payload');
});
my $after = epoch_ms();

# The Quarkus pattern: insert and delete in one transaction.  A rolled-back
# insert, an UPDATE and a DELETE publish nothing.
as_role('app', qq{
	BEGIN;
	INSERT INTO inventory.outboxevent VALUES ('00000000-0000-4000-8000-000000000002', '$order', '2', 'OrderCreated', '{"id": 2}');
	DELETE FROM inventory.outboxevent WHERE id = '00000000-0000-4000-8000-000000000002';
	COMMIT;
	BEGIN;
	INSERT INTO inventory.outboxevent VALUES ('00000000-0000-4000-8000-000000000003', '$order', 'rolled-back', 'OrderCreated', '{"id": 3}');
	ROLLBACK;
});
like(stderr_of('app', "UPDATE inventory.outboxevent SET type = 'OrderUpdated'"),
	qr/WARNING:  01000: an UPDATE of captured table "outboxevent" is not published/,
	'an UPDATE of a captured row warns');
as_role('app', 'DELETE FROM inventory.outboxevent');
is($node->safe_psql('postgres', 'SELECT count(*) FROM inventory.outboxevent'), '0', 'the table is empty');

my @records = @{ records_of("outbox.event.$order", 2) };
is(scalar(@records), 2, "two records on outbox.event.$order: the insert, and the one deleted in its transaction");
my ($example) = grep { $_->{key} eq '1' } @records;
my ($quarkus) = grep { $_->{key} eq '2' } @records;
ok($example && $quarkus, 'keyed by aggregateid');
is($example->{value}, $order_payload, 'the value is the jsonb payload\'s text, byte for byte');
is($quarkus->{value}, '{"id": 2}', 'and the deleted row\'s too');
my $example_row = $node->safe_psql('postgres', q{
	SELECT message_id, (extract(epoch FROM created_at) * 1000)::bigint FROM outbox_message
	 WHERE headers ->> 'id' = '406c07f3-26f0-4eea-a50c-109940064b8f'});
my ($example_message_id, $created_ms) = split /\|/, $example_row;
is_deeply(headers_of($example),
	{ 'id' => '406c07f3-26f0-4eea-a50c-109940064b8f', 'outbox-message-id' => $example_message_id },
	'its headers: id, the event id, and the outbox\'s outbox-message-id; no type');
ok(abs($example->{timestamp} - $created_ms) <= 1 && $example->{timestamp} >= $before - 1
	  && $example->{timestamp} <= $after + 1,
	'its timestamp is the insert\'s time');
ok(!grep({ $_->{key} eq 'rolled-back' } @records), 'the rolled-back insert is not published');

# 2. The Quarkus outbox extension's table, its default names, its span
#    context; the connector configuration of Debezium's Quarkus example
#    (route.topic.replacement ${routedByValue}.events) with the type
#    placed as a header, as its docs show.
as_role('app_owner', q{
	CREATE TABLE quarkus.outboxevent (
	    id                 uuid NOT NULL,
	    aggregatetype      varchar(255) NOT NULL,
	    aggregateid        varchar(255) NOT NULL,
	    type               varchar(255) NOT NULL,
	    timestamp          timestamp NOT NULL,
	    payload            varchar(8000),
	    tracingspancontext varchar(256)
	);
	GRANT INSERT, DELETE ON quarkus.outboxevent TO app;
	SELECT outbox_capture('quarkus.outboxevent', '{"route.topic.replacement": "${routedByValue}.events",
	                                               "table.fields.additional.placement": "type:header:eventType"}');
});
# What Properties.store() writes of OpenTelemetry's context: a date, and
# '=' escaped in the tracestate.
my $span_context = "#Wed Dec 02 05:54:37 UTC 2026\ntraceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61rcWkgMzE\n";
as_role('app', qq{
	BEGIN;
	INSERT INTO quarkus.outboxevent VALUES ('00000000-0000-4000-8000-000000000010', '$order', '10', 'OrderCreated',
	    now(), '{"id":10,"customerId":123}', \$\$$span_context\$\$);
	DELETE FROM quarkus.outboxevent;
	COMMIT;
});
@records = @{ records_of("$order.events", 1) };
is(scalar(@records), 1, "one record on $order.events");
is($records[0]{key}, '10', 'keyed by aggregateid');
is($records[0]{value}, '{"id":10,"customerId":123}', 'the varchar payload as it is');
my $headers = headers_of($records[0]);
delete $headers->{'outbox-message-id'};
is_deeply($headers, {
		'id' => '00000000-0000-4000-8000-000000000010',
		'eventType' => 'OrderCreated',
		'traceparent' => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
		'tracestate' => 'rojo=00f067aa0ba902b7,congo=t61rcWkgMzE' },
	'headers: id, eventType, and the span context\'s traceparent and tracestate');

# 3. Each column option, a bytea payload, a header alias, the partition.
my $shipped = "$run.Shipped";
kafka_admin('create-topic', $shipped, '--partitions', '3');
as_role('app_owner', qq{
	CREATE TABLE shop.events (
	    event_uuid uuid NOT NULL,
	    kind       text NOT NULL,
	    customer   text,
	    body       bytea,
	    shard      smallint,
	    urgent     boolean
	);
	GRANT INSERT ON shop.events TO app;
	SELECT outbox_capture('shop.events', '{"route.by.field": "kind",
	    "route.topic.replacement": "$run.\${routedByValue}",
	    "table.field.event.id": "event_uuid", "table.field.event.key": "customer",
	    "table.field.event.payload": "body",
	    "table.fields.additional.placement": "urgent:header:priority, shard:partition:ignored"}');
});
as_role('app', q{
	INSERT INTO shop.events VALUES ('00000000-0000-4000-8000-000000000020', 'Shipped', 'c-1', '\x00ff10', 2, true),
	                               ('00000000-0000-4000-8000-000000000021', 'Shipped', NULL, '\x', NULL, NULL);
	-- a partition the topic lacks: dead-lettered, with the broker's reason
	INSERT INTO shop.events VALUES ('00000000-0000-4000-8000-000000000022', 'Shipped', 'c-2', 'lost', 7, false);
});
@records = @{ records_of($shipped, 2) };
is(scalar(@records), 2, 'two records of shop.events, routed by kind');
my ($c1) = grep { ($_->{key} // '') eq 'c-1' } @records;
my ($unkeyed) = grep { !defined $_->{key} } @records;
ok($c1 && $unkeyed, 'keyed by customer, a NULL customer unkeyed');
is($c1->{value_b64}, 'AP8Q', 'the bytea payload byte for byte');
is($c1->{partition}, 2, 'in the partition of the shard column');
is(headers_of($c1)->{id}, '00000000-0000-4000-8000-000000000020', 'the id header from event_uuid');
is(headers_of($c1)->{priority}, 'true', 'urgent as the header priority');
ok(exists headers_of($unkeyed)->{priority} && !defined headers_of($unkeyed)->{priority},
	'a NULL header column a null header value');
is($unkeyed->{value} // 'null', '', 'an empty bytea an empty value, not a tombstone');
ok(wait_for_query($node, "SELECT key, error ~ 'Unknown partition' FROM outbox_dead_letter WHERE topic = '$shipped'",
		'c-2|t', 60),
	'partition 7 of a 3-partition topic is dead-lettered with the broker\'s reason');

# 4. Converters: the connector of Debezium's outbox example runs
#    JsonConverter without schemas for keys and values.  The documentation's
#    example value is the escaped JSON string; expanded, the document; with
#    a field in the envelope, the envelope.
my $invoice = unique_topic('Invoice');
as_role('app_owner', q{
	CREATE TABLE shop.json_events (LIKE inventory.outboxevent);
	GRANT INSERT ON shop.json_events TO app;
	SELECT outbox_capture('shop.json_events', '{
	    "key.converter": "org.apache.kafka.connect.json.JsonConverter", "key.converter.schemas.enable": "false",
	    "value.converter": "org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable": "false"}');
});
as_role('app', "INSERT INTO shop.json_events VALUES (gen_random_uuid(), '$invoice', '1', 'OrderCreated', '$order_payload')");
as_role('app_owner', q{
	SELECT outbox_capture('shop.json_events', '{
	    "key.converter": "org.apache.kafka.connect.json.JsonConverter",
	    "value.converter": "org.apache.kafka.connect.json.JsonConverter", "table.expand.json.payload": true}');
});
as_role('app', "INSERT INTO shop.json_events VALUES (gen_random_uuid(), '$invoice', '2', 'OrderCreated', '$order_payload')");
as_role('app_owner', q{
	SELECT outbox_capture('shop.json_events', '{
	    "value.converter": "org.apache.kafka.connect.json.JsonConverter", "table.expand.json.payload": true,
	    "table.fields.additional.placement": "type:envelope:eventType"}');
});
as_role('app', "INSERT INTO shop.json_events VALUES (gen_random_uuid(), '$invoice', '3', 'OrderCreated', '{\"id\": 3}')");
@records = @{ records_of("outbox.event.$invoice", 3) };
is(scalar(@records), 3, 'three records of shop.json_events');
is_deeply([ map { $_->{key} } @records ], [ '"1"', '"2"', '3' ], 'JsonConverter keys are JSON strings');
is($records[0]{value},
	q{"{\"id\": 1, \"lineItems\": [{\"id\": 1, \"item\": \"Debezium in Action\", \"status\": \"ENTERED\", \"quantity\": 2, \"totalPrice\": 39.98}, {\"id\": 2, \"item\": \"Debezium for Dummies\", \"status\": \"ENTERED\", \"quantity\": 1, \"totalPrice\": 29.99}], \"orderDate\": \"2019-01-31T12:13:01\", \"customerId\": 123}"},
	'JsonConverter: the payload as the documentation\'s escaped JSON string');
is($records[1]{value},
	q{{"id":1,"lineItems":[{"id":1,"item":"Debezium in Action","status":"ENTERED","quantity":2,"totalPrice":39.98},{"id":2,"item":"Debezium for Dummies","status":"ENTERED","quantity":1,"totalPrice":29.99}],"orderDate":"2019-01-31T12:13:01","customerId":123}},
	'expanded: the JSON document, compact as Jackson writes it');
is($records[2]{value}, '{"payload":{"id":3},"eventType":"OrderCreated"}', 'an envelope: payload, then eventType');

# 5. route.tombstone.on.empty.payload (a string, as a connector's
#    configuration holds it): a NULL or blank payload is a tombstone.
my $deleted = unique_topic('Customer');
as_role('app_owner', q{
	CREATE TABLE shop.customer_events (LIKE inventory.outboxevent);
	ALTER TABLE shop.customer_events ALTER COLUMN payload TYPE text;
	GRANT INSERT ON shop.customer_events TO app;
	SELECT outbox_capture('shop.customer_events', '{"route.tombstone.on.empty.payload": "true"}');
});
as_role('app', qq{
	INSERT INTO shop.customer_events VALUES (gen_random_uuid(), '$deleted', 'c-1', 'CustomerCreated', '{"name": "Li"}'),
	                                        (gen_random_uuid(), '$deleted', 'c-1', 'CustomerDeleted', NULL),
	                                        (gen_random_uuid(), '$deleted', 'c-2', 'CustomerDeleted', ' ');
});
@records = @{ records_of("outbox.event.$deleted", 3) };
is_deeply([ map { [ $_->{key}, $_->{value} ] } sort { $a->{offset} <=> $b->{offset} } @records ],
	[ [ 'c-1', '{"name": "Li"}' ], [ 'c-1', undef ], [ 'c-2', undef ] ],
	'NULL and blank payloads are tombstones, records without a value');

# 6. Per-key order under concurrent inserters, each inserting and deleting
#    as Quarkus does, one transaction in ten rolled back; each committed
#    event is logged in the same transaction.
my $load = unique_topic('Load');
$node->safe_psql('postgres', q{
	CREATE TABLE inventory.load_events (LIKE inventory.outboxevent);
	CREATE TABLE load_log (event_id uuid PRIMARY KEY, key text);
	SELECT outbox_capture('inventory.load_events');
});
run_pgbench($node, qq{
\\set k random(1, 10)
\\set r random(1, 10)
BEGIN;
WITH e AS (INSERT INTO inventory.load_events VALUES (gen_random_uuid(), '$load', 'key-' || :k, 'Tick', '{}') RETURNING id, aggregateid)
INSERT INTO load_log SELECT id, aggregateid FROM e;
DELETE FROM inventory.load_events WHERE aggregateid = 'key-' || :k;
\\if :r = 1
ROLLBACK;
\\else
COMMIT;
\\endif
}, '-c', '8', '-j', '2', '-t', '150');
my %logged = map { my ($id, $key) = split /\|/; ($id => $key) }
  split /\n/, $node->safe_psql('postgres', 'SELECT event_id, key FROM load_log');
my %committed = map { my ($mid, $key, $id) = split /\|/; ($mid => [ $key, $id ]) }
  split /\n/, $node->safe_psql('postgres', "SELECT message_id, key, id FROM outbox_message WHERE topic = 'outbox.event.$load'");
cmp_ok(scalar(keys %logged), '>', 1000, 'over a thousand inserts committed by 8 clients');
is(scalar(keys %committed), scalar(keys %logged), 'each committed insert enqueued one message');
@records = @{ consume_topics(topics => ["outbox.event.$load"], expect => scalar(keys %logged), timeout => 120) };
my $result = check_delivery(\@records, \%committed);
is_deeply($result, { lost => 0, phantom => 0, duplicates => 0, order_faults => 0 },
	'every committed insert published once, in order per key');
is_deeply({ map { (headers_of($_)->{id} => $_->{key}) } @records }, \%logged,
	'the records are the logged events, by id and key: none rolled back');

# 7. Bad settings, with their SQLSTATEs and the accepted keys.
like(stderr_of('app_owner', q{SELECT outbox_capture('shop.events', '{"route.by.fields": "kind"}')}),
	qr/ERROR:  22023: unknown outbox_capture\(\) setting "route.by.fields".*HINT:  The settings outbox_capture\(\) takes are route.by.field, /s,
	'an unknown key: 22023, the hint naming the keys');
like(stderr_of('app_owner', q{SELECT outbox_capture('shop.events', '{"route.tombstone.on.empty.payload": "yes"}')}),
	qr/ERROR:  22023: outbox_capture\(\) setting "route.tombstone.on.empty.payload" must be true or false/,
	'a value of the wrong type: 22023');
like(stderr_of('app_owner', q{SELECT outbox_capture('inventory.outboxevent', '{"table.field.event.payload": "body"}')}),
	qr/ERROR:  42703: column "body" of table "outboxevent", which outbox_capture\(\) setting "table.field.event.payload" names, does not exist/,
	'a column the table lacks: 42703, at outbox_capture() time');
is($node->safe_psql('postgres', q{SELECT settings ->> 'route.by.field' FROM outbox_captured WHERE tbl = 'shop.events'::regclass}),
	'kind', 'refused settings leave the table\'s as they were');

# 8. Hostile roles.  A role without grants cannot make a trigger with the
#    function; granted its EXECUTE, its trigger on a table of its own that
#    outbox_capture() did not register refuses to fire; a role granted
#    outbox_capture() cannot capture (nor uncapture) a table it does not own.
my $stolen = unique_topic('Stolen');
like(stderr_of('intruder', qq{
	CREATE TABLE public.loot (id uuid, aggregatetype text, aggregateid text, type text, payload jsonb);
	CREATE TRIGGER outbox_capture AFTER INSERT ON public.loot FOR EACH ROW EXECUTE FUNCTION outbox_capture_trigger();}),
	qr/ERROR:  42501: permission denied for function outbox_capture_trigger/,
	'a role without grants cannot make a trigger with the function');
$node->safe_psql('postgres', 'GRANT EXECUTE ON FUNCTION outbox_capture_trigger() TO intruder');
like(stderr_of('intruder', qq{
	CREATE TRIGGER outbox_capture AFTER INSERT ON public.loot FOR EACH ROW EXECUTE FUNCTION outbox_capture_trigger();
	INSERT INTO public.loot VALUES (gen_random_uuid(), '$stolen', 'k', 'Stolen', '{}');}),
	qr/ERROR:  42809: outbox_capture_trigger\(\) fires only on tables captured by outbox_capture\(\), not on "loot"/,
	'granted EXECUTE, its trigger on an unregistered table of its own refuses to fire');
like(stderr_of('intruder', qq{
	CREATE TRIGGER early BEFORE INSERT ON public.loot FOR EACH ROW EXECUTE FUNCTION outbox_capture_trigger();
	DROP TRIGGER outbox_capture ON public.loot;
	INSERT INTO public.loot VALUES (gen_random_uuid(), '$stolen', 'k', 'Stolen', '{}');}),
	qr/ERROR:  39P01: outbox_capture_trigger\(\) must be an AFTER INSERT OR UPDATE FOR EACH ROW trigger/,
	'nor in another timing');
$node->safe_psql('postgres', q{
	REVOKE EXECUTE ON FUNCTION outbox_capture_trigger() FROM intruder;
	GRANT EXECUTE ON FUNCTION outbox_capture(regclass, jsonb), outbox_uncapture(regclass) TO intruder;
	GRANT USAGE ON SCHEMA shop TO intruder;
});
like(stderr_of('intruder', q{SELECT outbox_capture('shop.events', '{"route.topic.replacement": "stolen"}')}),
	qr/ERROR:  42501: must be owner of table events/, 'a role granted outbox_capture() captures only its own tables');
like(stderr_of('intruder', q{SELECT outbox_uncapture('shop.events')}),
	qr/ERROR:  42501: must be owner of table events/, 'nor uncaptures another\'s');
is($node->safe_psql('postgres', qq{
	SELECT (SELECT count(*) FROM outbox_message WHERE topic = 'outbox.event.$stolen'),
	       (SELECT settings ->> 'route.by.field' FROM outbox_captured WHERE tbl = 'shop.events'::regclass),
	       (SELECT count(*) FROM outbox_captured WHERE tbl::text LIKE '%loot%')}),
	'0|kind|0', 'nothing enqueued, nothing captured, the owner\'s settings kept');

# The values are made text as the inserting role, the message written as
# the extension's owner: a type's JSON cast, the table owner's code, runs
# as the role that inserts, never as a superuser; a trigger a superuser put
# on the outbox (which makes the write an INSERT, whose privileges count)
# sees the owner write it.
my $mood = unique_topic('Mood');
$node->safe_psql('postgres', q{
	CREATE TABLE public.hits (what text, run_as name, superuser boolean);
	GRANT INSERT ON public.hits TO PUBLIC;
	CREATE FUNCTION public.outbox_write_hit() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
	    INSERT INTO public.hits SELECT 'write', current_user, rolsuper FROM pg_roles WHERE rolname = current_user;
	    RETURN NEW;
	END $$;
	CREATE TRIGGER write_hit BEFORE INSERT ON outbox_message FOR EACH ROW EXECUTE FUNCTION public.outbox_write_hit();
});
as_role('app_owner', q{
	CREATE TYPE shop.mood AS ENUM ('happy');
	CREATE FUNCTION shop.mood_json(shop.mood) RETURNS json LANGUAGE plpgsql AS $$
	BEGIN
	    INSERT INTO public.hits SELECT 'convert', current_user, rolsuper FROM pg_roles WHERE rolname = current_user;
	    RETURN to_json($1::text);
	END $$;
	CREATE CAST (shop.mood AS json) WITH FUNCTION shop.mood_json(shop.mood);
	CREATE TABLE shop.mood_events (LIKE inventory.outboxevent);
	ALTER TABLE shop.mood_events ADD COLUMN mood shop.mood;
	GRANT INSERT ON shop.mood_events TO app;
	SELECT outbox_capture('shop.mood_events', '{"table.fields.additional.placement": "mood:envelope"}');
});
as_role('app', "INSERT INTO shop.mood_events VALUES (gen_random_uuid(), '$mood', 'm', 'Felt', '{}', 'happy')");
$node->safe_psql('postgres', 'DROP TRIGGER write_hit ON outbox_message');
my $owner = $node->safe_psql('postgres',
	"SELECT extowner::regrole FROM pg_extension WHERE extname = 'outbox'");
is($node->safe_psql('postgres', 'SELECT what, run_as, superuser FROM public.hits ORDER BY what'),
	"convert|app|f\nwrite|$owner|t",
	'the column\'s conversion ran as the inserting role, the outbox\'s write as the extension\'s owner');
@records = @{ records_of("outbox.event.$mood", 1) };
is($records[0]{value}, '{"payload":"{}","mood":"happy"}', 'and its message was published');

# 9. pg_dump keeps the captured tables, by name, and their triggers: a
#    restored database publishes what is inserted there.
my $dir = PostgreSQL::Test::Utils::tempdir();
command_ok([ 'pg_dump', '-Fc', '-f', "$dir/capture.dump", '-d', $node->connstr('postgres') ], 'pg_dump -Fc');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
command_ok([ 'pg_restore', '-d', $node->connstr('restored'), "$dir/capture.dump" ], 'pg_restore');
my $captured_query = 'SELECT tbl, settings FROM outbox_captured ORDER BY tbl::text';
is($node->safe_psql('restored', $captured_query), $node->safe_psql('postgres', $captured_query),
	'the restored database captures the same tables, with the same settings');
my $restored = unique_topic('Restored');
$node->safe_psql('restored', qq{
	SET ROLE app;
	INSERT INTO inventory.outboxevent VALUES ('00000000-0000-4000-8000-000000000090', '$restored', '90', 'OrderCreated', '{"id": 90}');
});
@records = @{ records_of("outbox.event.$restored", 1) };
is_deeply([ map { [ $_->{key}, $_->{value}, headers_of($_)->{id} ] } @records ],
	[ [ '90', '{"id": 90}', '00000000-0000-4000-8000-000000000090' ] ],
	'and publishes its inserts');

# 10. outbox_uncapture() stops it.
is(as_role('app_owner', q{SELECT outbox_uncapture('inventory.outboxevent')}), 't', 'outbox_uncapture()');
as_role('app', qq{INSERT INTO inventory.outboxevent VALUES (gen_random_uuid(), '$order', 'after', 'OrderCreated', '{}')});
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox_message WHERE key = 'after'"), '0',
	'an insert after it enqueues nothing');

$node->stop('fast');
is(worker_exits($node), 0, 'no worker crashed or exited with an error');
done_testing();

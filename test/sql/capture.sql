-- outbox_capture(): the SQL surface of capturing a Debezium outbox table.
-- Who may capture (a role granted outbox_capture() that owns the table), the
-- settings refused (an unknown key or a value of the wrong type: 22023, with
-- a hint naming the keys; a column the table lacks: 42703; a column of a
-- type the setting cannot use: 42804), the tables refused, the trigger
-- refusing any table outbox_capture() did not register, and the message
-- each captured row makes (topic, key, payload bytes, headers, partition),
-- in outbox_message: no broker here, test/t/206_debezium_capture.pl shows
-- what Kafka's consumers get.
\set SHOW_CONTEXT never
TRUNCATE outbox_message, outbox_dead_letter;

-- Debezium's documented outbox table (outbox-event-router, "Basic outbox
-- table"), owned by a role that is granted outbox_capture().
CREATE ROLE capture_owner;
CREATE ROLE capture_app;
CREATE ROLE capture_stranger;
GRANT CREATE ON SCHEMA public TO capture_owner, capture_stranger;
GRANT EXECUTE ON FUNCTION outbox_capture(regclass, jsonb), outbox_uncapture(regclass) TO capture_owner;
SET ROLE capture_owner;
CREATE TABLE outboxevent (
    id            uuid NOT NULL PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb
);
GRANT INSERT, UPDATE, DELETE, SELECT ON outboxevent TO capture_app;
RESET ROLE;
-- the inserting role publishes, so it is granted the topics it routes to
SELECT outbox_grant_topic('capture_app', 'outbox.event.*', 'publish');
SELECT outbox_grant_topic('capture_owner', topic, 'publish')
  FROM unnest(ARRAY['outbox.event.*', 'Order.events', 'fixed.topic']) AS topic;

-- Not for PUBLIC: a role without the grant may not capture, even its own table.
SET ROLE capture_stranger;
CREATE TABLE stranger_events (id uuid, aggregatetype varchar(255), aggregateid varchar(255),
                              type varchar(255), payload jsonb);
SELECT outbox_capture('stranger_events');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_uncapture('stranger_events');
\echo :LAST_ERROR_SQLSTATE
-- nor make a trigger with the trigger function
CREATE TRIGGER t AFTER INSERT ON stranger_events FOR EACH ROW EXECUTE FUNCTION outbox_capture_trigger();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- A role granted outbox_capture() captures only tables it owns.
SET ROLE capture_owner;
SELECT outbox_capture('stranger_events');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

-- The defaults are EventRouter's; the call returns every setting as it applies.
SET ROLE capture_owner;
SELECT jsonb_pretty(outbox_capture('outboxevent'));
RESET ROLE;
SELECT tbl, settings FROM outbox_captured;
SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'outboxevent'::regclass;

-- The docs' example row: topic outbox.event.<aggregatetype>, key aggregateid,
-- the payload's text (jsonb's canonical text, as Debezium reads it from the
-- WAL), the event id as the header "id".  The application role needs no
-- grant of the outbox's: it inserts into its own table.
SET ROLE capture_app;
INSERT INTO outboxevent VALUES ('406c07f3-26f0-4eea-a50c-109940064b8f', 'Order', '1', 'OrderCreated',
    '{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}, {"id": 2, "item": "Debezium for Dummies", "status": "ENTERED", "quantity": 1, "totalPrice": 29.99}], "orderDate": "2019-01-31T12:13:01", "customerId": 123}');
-- an UPDATE warns and publishes nothing, a DELETE does nothing
UPDATE outboxevent SET type = 'OrderUpdated';
DELETE FROM outboxevent;
-- insert and delete in one transaction (the Quarkus outbox extension): published
BEGIN;
INSERT INTO outboxevent VALUES ('00000000-0000-4000-8000-000000000002', 'Order', '2', 'OrderCreated', '{"id": 2}');
DELETE FROM outboxevent WHERE id = '00000000-0000-4000-8000-000000000002';
COMMIT;
-- rolled back: nothing
BEGIN;
INSERT INTO outboxevent VALUES ('00000000-0000-4000-8000-000000000003', 'Order', '3', 'OrderCreated', '{"id": 3}');
ROLLBACK;
-- a row that ON CONFLICT DO NOTHING skips publishes nothing
INSERT INTO outboxevent VALUES ('00000000-0000-4000-8000-000000000004', 'Order', '4', 'OrderCreated', '{"id": 4}');
INSERT INTO outboxevent VALUES ('00000000-0000-4000-8000-000000000004', 'Order', '4', 'Skipped', '{"id": 4}')
    ON CONFLICT DO NOTHING;
RESET ROLE;
SELECT topic, key, convert_from(payload, 'UTF8') AS payload, headers, target_partition
  FROM outbox_message ORDER BY id;
TRUNCATE outbox_message;
DELETE FROM outboxevent;

-- A NULL payload is a record without a value, as Debezium publishes it
-- under StringConverter (without asking for tombstones).
INSERT INTO outboxevent VALUES ('00000000-0000-4000-8000-000000000005', 'Order', '5', 'OrderCreated', NULL);
SELECT topic, key, payload IS NULL AS no_value, headers FROM outbox_message;
TRUNCATE outbox_message;

-- Refused at the door, in the inserting transaction: a NULL aggregatetype,
-- a topic Kafka refuses.
ALTER TABLE outboxevent ALTER COLUMN aggregatetype DROP NOT NULL;
INSERT INTO outboxevent VALUES (gen_random_uuid(), NULL, '5', 'OrderCreated', '{}');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO outboxevent VALUES (gen_random_uuid(), 'Order lines', '5', 'OrderCreated', '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS nothing_enqueued FROM outbox_message;

-- Settings refused: an unknown key, with the hint naming the accepted ones;
-- an EventRouter option it does not take, saying why.
SET ROLE capture_owner;
SELECT outbox_capture('outboxevent', '{"route.by.fields": "type"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.field.event.timestamp": "timestamp"}');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY terse
SELECT outbox_capture('outboxevent', '{"route.topic.regex": "(?<routedByValue>.*)"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '["route.by.field"]');
\echo :LAST_ERROR_SQLSTATE
-- values of the wrong type
SELECT outbox_capture('outboxevent', '{"route.by.field": 1}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"route.by.field": ""}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.field.event.key": null}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"route.tombstone.on.empty.payload": "yes"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"route.tombstone.on.empty.payload": 1}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.expand.json.payload": ["true"]}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.op.invalid.behavior": "ignore"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"value.converter": "io.confluent.connect.avro.AvroConverter"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"key.converter": "io.debezium.converters.BinaryDataConverter"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"value.converter.schemas.enable": true}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.fields.additional.placement": 7}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"route.topic.replacement": "orders ${routedByValue}"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"route.topic.replacement": "${routedByValue}.$1"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', format('{"route.topic.replacement": "%s${routedByValue}"}', repeat('t', 250))::jsonb);
\echo :LAST_ERROR_SQLSTATE
-- table.fields.additional.placement that places nothing sensible
SELECT outbox_capture('outboxevent', '{"table.fields.additional.placement": "type"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.fields.additional.placement": "type:body"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.fields.additional.placement": "type:header:a:b"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.fields.additional.placement": "type:header,"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.fields.additional.placement": "type:header:id"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.fields.additional.placement": "type:header:outbox-message-id"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.fields.additional.placement": "type:envelope:payload"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.fields.additional.placement": "type:header:t,aggregateid:header:t"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.fields.additional.placement": "type:partition"}');
\echo :LAST_ERROR_SQLSTATE
-- columns the table lacks, at outbox_capture() time
SELECT outbox_capture('outboxevent', '{"route.by.field": "aggregate_type"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.field.event.id": "uuid"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.field.event.key": "key"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.field.event.payload": "body"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"tracing.span.context.field": "span"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.fields.additional.placement": "eventType:header"}');
\echo :LAST_ERROR_SQLSTATE
-- converters that cannot write the payload
SELECT outbox_capture('outboxevent', '{"value.converter": "io.debezium.converters.BinaryDataConverter"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.expand.json.payload": true}');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
-- none of these changed the settings
RESET ROLE;
SELECT settings FROM outbox_captured WHERE tbl = 'outboxevent'::regclass;

-- Tables refused: not a table, a partition, the extension's own, the catalog's.
SET ROLE capture_owner;
CREATE VIEW outboxevent_view AS SELECT * FROM outboxevent;
SELECT outbox_capture('outboxevent_view');
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE parted_events (LIKE outboxevent) PARTITION BY LIST (aggregatetype);
CREATE TABLE parted_events_order PARTITION OF parted_events FOR VALUES IN ('Order');
CREATE TABLE parted_events_other PARTITION OF parted_events DEFAULT;
SELECT outbox_capture('parted_events_order');
\echo :LAST_ERROR_SQLSTATE
-- a trigger of its own by the name
CREATE TABLE named_events (LIKE outboxevent);
CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER outbox_capture AFTER INSERT ON named_events FOR EACH ROW EXECUTE FUNCTION noop();
SELECT outbox_capture('named_events');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT outbox_capture('outbox_message');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outbox_captured');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('pg_class');
\echo :LAST_ERROR_SQLSTATE

-- The trigger refuses to fire on a table outbox_capture() did not register,
-- before it reads a column, and in any other timing.
CREATE TABLE unregistered (id int);
CREATE TRIGGER hostile AFTER INSERT ON unregistered FOR EACH ROW EXECUTE FUNCTION outbox_capture_trigger();
INSERT INTO unregistered VALUES (1);
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER hostile ON unregistered;
CREATE TRIGGER hostile BEFORE INSERT ON outboxevent FOR EACH ROW EXECUTE FUNCTION outbox_capture_trigger();
INSERT INTO outboxevent VALUES (gen_random_uuid(), 'Order', '6', 'OrderCreated', '{}');
\echo :LAST_ERROR_SQLSTATE
DROP TRIGGER hostile ON outboxevent;
SELECT count(*) AS nothing_enqueued FROM outbox_message;

-- Each option.  Quarkus's table: its own names, a bytea payload (its
-- bytes go as they are), a span context, additional columns placed as
-- headers, in the envelope, and as the partition.
SET ROLE capture_owner;
CREATE TABLE quarkus_outbox (
    id                 uuid NOT NULL,
    aggregatetype      varchar(255) NOT NULL,
    aggregateid        varchar(255) NOT NULL,
    type               varchar(255) NOT NULL,
    timestamp          timestamp NOT NULL,
    payload            bytea,
    tracingspancontext varchar(256),
    shard              integer,
    urgent             boolean
);
SELECT outbox_capture('quarkus_outbox', '{"route.topic.replacement": "${routedByValue}.events",
    "table.fields.additional.placement": "type:header:eventType, urgent:HEADER, shard:partition:ignored"}')
    ->> 'value.converter' AS value_converter;
INSERT INTO quarkus_outbox VALUES ('00000000-0000-4000-8000-000000000010', 'Order', '10', 'OrderCreated',
    '2019-05-03 13:31:34.344', '\x00ff10', E'#Fri May 03 13:31:34 UTC 2019\ntraceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61rcWkgMzE\n', 2, true);
-- the span context's traceparent only when W3C allows it; no span context, no trace headers
INSERT INTO quarkus_outbox VALUES ('00000000-0000-4000-8000-000000000011', 'Order', '11', 'OrderCreated',
    now(), 'x', E'traceparent=00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01\ntracestate=a\\=b', NULL, NULL);
INSERT INTO quarkus_outbox VALUES ('00000000-0000-4000-8000-000000000012', 'Order', '12', 'OrderCreated',
    now(), 'y', NULL, NULL, false);
-- Properties.load()'s rules: a continued line, ':' as separator, comments
INSERT INTO quarkus_outbox VALUES ('00000000-0000-4000-8000-000000000013', 'Order', '13', 'OrderCreated',
    now(), 'z', E'! a comment\n  traceparent : 00-0af7651916cd43dd8448eb211c80319c-\\\n      b7ad6b7169203331-00\n', NULL, NULL);
-- a negative partition is refused
INSERT INTO quarkus_outbox VALUES (gen_random_uuid(), 'Order', '14', 'OrderCreated', now(), 'w', NULL, -1, NULL);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT topic, key, payload, headers, target_partition FROM outbox_message ORDER BY id;
TRUNCATE outbox_message;

-- The session's trace context (outbox.traceparent) goes to a row without
-- one of its own, but never mixes with a row's: its tracestate is not added
-- to the row's traceparent.
BEGIN;
SET LOCAL outbox.traceparent = '00-11111111111111111111111111111111-2222222222222222-01';
SET LOCAL outbox.tracestate = 'session=1';
INSERT INTO quarkus_outbox VALUES ('00000000-0000-4000-8000-000000000020', 'Order', '20', 'OrderCreated',
    now(), 'a', NULL, NULL, NULL);
INSERT INTO quarkus_outbox VALUES ('00000000-0000-4000-8000-000000000021', 'Order', '21', 'OrderCreated',
    now(), 'b', 'traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', NULL, NULL);
COMMIT;
SELECT topic, key, convert_from(payload, 'UTF8') AS payload, headers FROM outbox_message ORDER BY id;
TRUNCATE outbox_message;

-- A boolean and a float are Kafka Connect's BOOLEAN, FLOAT64 and FLOAT32
-- under Debezium: their text (StringConverter, headers) and their JSON are
-- Java's (true, 1.0E-7, 1.0E23, NaN), not PostgreSQL's (t, 1e-07, 1e+23).
SET ROLE capture_owner;
CREATE TABLE typed_outbox (id uuid, aggregatetype varchar(255), aggregateid float8, type varchar(255),
                           payload jsonb, flag boolean, ratio real);
SELECT outbox_capture('typed_outbox', '{"table.fields.additional.placement": "flag:header, ratio:header, flag:envelope, ratio:envelope:share",
    "value.converter": "org.apache.kafka.connect.json.JsonConverter"}') IS NOT NULL AS captured;
INSERT INTO typed_outbox VALUES
    ('00000000-0000-4000-8000-000000000041', 'Order', 1e-7, 'x', '{}', true, 0.1),
    ('00000000-0000-4000-8000-000000000042', 'Order', 1e23, 'x', '{}', false, 'NaN'),
    ('00000000-0000-4000-8000-000000000043', 'Order', 100, 'x', '{}', NULL, '-Infinity');
RESET ROLE;
SELECT key, convert_from(payload, 'UTF8') AS payload, headers FROM outbox_message ORDER BY key;
TRUNCATE outbox_message;
SET ROLE capture_owner;
SELECT outbox_uncapture('typed_outbox');
DROP TABLE typed_outbox;
RESET ROLE;

-- Converters: JsonConverter (schemas disabled) writes the key and payload as
-- JSON; expanded, a JSON payload is its document; an envelope is JSON with
-- the payload first.  A tombstone when asked for, on NULL or blank.
SET ROLE capture_owner;
CREATE TABLE text_outbox (LIKE outboxevent);
ALTER TABLE text_outbox ALTER COLUMN payload TYPE text;
SELECT outbox_capture('outboxevent', '{"key.converter": "org.apache.kafka.connect.json.JsonConverter",
    "value.converter": "org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable": "false"}')
    ->> 'value.converter' AS value_converter;
INSERT INTO outboxevent VALUES ('00000000-0000-4000-8000-000000000030', 'Order', '30', 'OrderCreated', '{"line": "a\nb"}');
INSERT INTO outboxevent VALUES ('00000000-0000-4000-8000-000000000031', 'Order', '31', 'OrderCreated', NULL);
SELECT outbox_capture('outboxevent', '{"value.converter": "org.apache.kafka.connect.json.JsonConverter",
    "table.expand.json.payload": "TRUE"}') ->> 'table.expand.json.payload' AS expanded;
INSERT INTO outboxevent VALUES ('00000000-0000-4000-8000-000000000032', 'Order', '32', 'OrderCreated', '{"line": "a\nb"}');
INSERT INTO outboxevent VALUES ('00000000-0000-4000-8000-000000000033', 'Order', '33', 'OrderCreated', '"a scalar"');
SELECT outbox_capture('outboxevent', '{"table.fields.additional.placement": "type:envelope:eventType,aggregateid:envelope"}')
    ->> 'table.fields.additional.placement' AS placement;
INSERT INTO outboxevent VALUES ('00000000-0000-4000-8000-000000000034', 'Order', '34', 'OrderCreated', '{"id": 34}');
SELECT outbox_capture('text_outbox', '{"route.tombstone.on.empty.payload": true, "route.by.field": "type",
    "route.topic.replacement": "fixed.topic"}') ->> 'route.topic.replacement' AS topic;
INSERT INTO text_outbox VALUES ('00000000-0000-4000-8000-000000000035', 'Order', '35', 'OrderDeleted', NULL);
INSERT INTO text_outbox VALUES ('00000000-0000-4000-8000-000000000036', 'Order', '36', 'OrderDeleted', E' \t ');
INSERT INTO text_outbox VALUES ('00000000-0000-4000-8000-000000000037', 'Order', '37', 'OrderCreated', 'not blank');
-- Expanded, each object of an array gets the fields of them all: a payload
-- of objects that differ can grow beyond a record's size, and is refused
-- before it takes more memory than that.
SELECT outbox_capture('outboxevent', '{"value.converter": "org.apache.kafka.connect.json.JsonConverter",
    "table.expand.json.payload": true}') ->> 'table.expand.json.payload' AS expanded;
INSERT INTO outboxevent SELECT '00000000-0000-4000-8000-000000000038', 'Order', '38', 'OrderCreated',
    jsonb_build_object('lines', jsonb_agg(jsonb_build_object('sku' || i, i))) FROM generate_series(1, 2000) AS i;
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_capture('outboxevent', '{"table.op.invalid.behavior": " FATAL "}') ->> 'table.op.invalid.behavior' AS on_update;
UPDATE outboxevent SET type = 'refused';
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT topic, key, convert_from(payload, 'UTF8') AS payload, headers FROM outbox_message ORDER BY id;
TRUNCATE outbox_message;

-- The values are made text as the inserting role: a type's JSON cast is
-- its owner's code, run as whoever inserts, never as the extension's owner.
SET ROLE capture_owner;
CREATE TYPE mood AS ENUM ('happy');
CREATE FUNCTION mood_json(mood) RETURNS json LANGUAGE sql
    AS $$ SELECT json_build_object('mood', $1::text, 'as', current_user) $$;
CREATE CAST (mood AS json) WITH FUNCTION mood_json(mood);
ALTER TABLE outboxevent ADD COLUMN mood mood;
SELECT outbox_capture('outboxevent', '{"table.fields.additional.placement": "mood:envelope"}') IS NOT NULL AS captured;
RESET ROLE;
SET ROLE capture_app;
INSERT INTO outboxevent VALUES ('00000000-0000-4000-8000-000000000040', 'Order', '40', 'OrderCreated', '{}', 'happy');
RESET ROLE;
SELECT convert_from(payload, 'UTF8') AS payload FROM outbox_message;
TRUNCATE outbox_message;

-- A column a setting names, dropped since: the insert fails, nothing is lost silently.
SET ROLE capture_owner;
ALTER TABLE outboxevent DROP COLUMN mood;
INSERT INTO outboxevent VALUES (gen_random_uuid(), 'Order', '41', 'OrderCreated', '{}');
\echo :LAST_ERROR_SQLSTATE

-- A partitioned table is captured with its partitions.
SELECT outbox_capture('parted_events') IS NOT NULL AS captured;
INSERT INTO parted_events VALUES ('00000000-0000-4000-8000-000000000050', 'Order', '50', 'OrderCreated', '{}'),
                                 ('00000000-0000-4000-8000-000000000051', 'Invoice', '51', 'InvoiceCreated', '{}');
RESET ROLE;
SELECT topic, key, headers FROM outbox_message ORDER BY id;
TRUNCATE outbox_message;

-- Capturing again replaces the settings, not the trigger; outbox_uncapture()
-- drops the trigger (the partitions' with it) and the row; a dropped table
-- is forgotten at the next call.
SET ROLE capture_owner;
SELECT outbox_capture('parted_events', '{"route.topic.replacement": "parted"}') IS NOT NULL AS captured;
SELECT count(*) AS capture_triggers FROM pg_trigger WHERE tgfoid = 'outbox_capture_trigger'::regproc;
SELECT outbox_uncapture('parted_events');
SELECT outbox_uncapture('parted_events');
INSERT INTO parted_events VALUES (gen_random_uuid(), 'Order', '52', 'OrderCreated', '{}');
DROP TABLE text_outbox;
SELECT outbox_uncapture('quarkus_outbox');
RESET ROLE;
SELECT tbl, settings FROM outbox_captured ORDER BY tbl::text;
SELECT count(*) AS capture_triggers FROM pg_trigger WHERE tgfoid = 'outbox_capture_trigger'::regproc;
SELECT count(*) AS nothing_enqueued FROM outbox_message;

-- pg_dump keeps outbox_captured's rows of tables that exist.
SELECT extcondition FROM pg_extension WHERE extname = 'outbox';

DROP TABLE outboxevent, parted_events, named_events, quarkus_outbox, unregistered, stranger_events CASCADE;
DROP FUNCTION noop();
DROP CAST (mood AS json);
DROP FUNCTION mood_json(mood);
DROP TYPE mood;
-- the dropped table's row stays until the next call, and is not dumped
SELECT count(*) AS rows, count(*) FILTER (WHERE EXISTS (SELECT FROM pg_class r WHERE r.oid = tbl)) AS dumped
  FROM outbox_captured;
CREATE TABLE never_captured (id int);
SELECT outbox_uncapture('never_captured');
SELECT count(*) AS forgotten FROM outbox_captured;
DROP TABLE never_captured;
REVOKE ALL ON SCHEMA public FROM capture_owner, capture_stranger;
REVOKE ALL ON FUNCTION outbox_capture(regclass, jsonb), outbox_uncapture(regclass) FROM capture_owner;
DROP ROLE capture_owner, capture_app, capture_stranger;

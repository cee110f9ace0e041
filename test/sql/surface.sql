-- The SQL surface: enqueue in all three payload types, a direct INSERT, the
-- stored bytes, ids in order, and the settings with their defaults.
CREATE EXTENSION outbox;

SELECT outbox_enqueue('user.registered', '{"user_id": 42, "name": "Li"}'::jsonb, 'user-42',
                      '{"trace-id": "t-1", "empty": null}') AS jsonb_id \gset
SELECT outbox_enqueue('sms.welcome', 'Welcome, Li!'::text) AS text_id \gset
SELECT outbox_enqueue('coupon.issue', '\x00ff10'::bytea, 'user-42') AS bytea_id \gset
SELECT :jsonb_id < :text_id AND :text_id < :bytea_id AS ids_in_call_order;

-- jsonb goes as its canonical text, text and bytea byte for byte
SELECT topic, key, payload, headers, state, attempts, last_error,
       message_id IS NOT NULL AS has_message_id,
       next_attempt_at <= now() AS due_now,
       created_at <= clock_timestamp() AS created_in_past
  FROM outbox_message ORDER BY id;
SELECT convert_from(payload, 'UTF8') FROM outbox_message WHERE id = :jsonb_id;

-- a plain INSERT is an equal way to enqueue
INSERT INTO outbox_message (topic, key, payload, headers)
VALUES ('crm.sync', 'user-42', convert_to('{"op":"upsert"}', 'UTF8'), '{"source": "insert"}')
RETURNING topic, key, state, attempts;

-- several rows in one statement keep their order
INSERT INTO outbox_message (topic, key, payload)
SELECT 'multi', 'k', convert_to(i::text, 'UTF8') FROM generate_series(1, 3) i;
SELECT convert_from(payload, 'UTF8') AS payload FROM outbox_message WHERE topic = 'multi' ORDER BY id;

-- a rolled-back enqueue leaves nothing
BEGIN;
SELECT outbox_enqueue('rolled.back', 'x'::text) > 0 AS enqueued;
ROLLBACK;
SELECT count(*) AS rolled_back_rows FROM outbox_message WHERE topic = 'rolled.back';

-- the settings and their defaults
SELECT name, setting, unit, context FROM pg_settings
 WHERE name LIKE 'outbox.%' AND name NOT IN ('outbox.brokers', 'outbox.database')
 ORDER BY name;

-- unknown settings under the outbox prefix are refused
SET outbox.no_such_setting = 1;

-- outbox.kafka_properties may hold secrets: hidden from ordinary roles
CREATE ROLE outbox_reader;
SET ROLE outbox_reader;
-- (the refusal's wording is PostgreSQL's and differs between majors; its SQLSTATE does not)
\set VERBOSITY sqlstate
SHOW outbox.kafka_properties;
\set VERBOSITY default
SELECT count(*) AS visible FROM pg_settings WHERE name = 'outbox.kafka_properties';
RESET ROLE;
DROP ROLE outbox_reader;

-- a malformed outbox.kafka_properties is refused
ALTER SYSTEM SET outbox.kafka_properties = 'compression.type';

-- a message's message_id is a UUID of version 7 (RFC 9562): the variant's
-- bits, then the milliseconds since the Unix epoch in its first 48 bits
-- (within a second of now), which orders ids made one after the other
WITH ids AS (
    SELECT i, outbox_uuid_v7() AS id FROM generate_series(1, 3) i
), stamped AS (
    SELECT i, id, ('x' || lpad(replace(left(id::text, 13), '-', ''), 16, '0'))::bit(64)::bigint AS ms
    FROM ids
)
SELECT bool_and(substr(id::text, 15, 1) = '7') AS version_7,
       bool_and(substr(id::text, 20, 1) IN ('8', '9', 'a', 'b')) AS rfc_variant,
       bool_and(abs(ms - (extract(epoch FROM clock_timestamp()) * 1000)::bigint) < 1000) AS stamped_now,
       count(DISTINCT id) AS distinct_ids
FROM stamped;
SELECT pg_get_expr(adbin, adrelid) AS message_id_default
FROM pg_attrdef
WHERE adrelid = 'outbox_message'::regclass
  AND adnum = (SELECT attnum FROM pg_attribute WHERE attrelid = 'outbox_message'::regclass AND attname = 'message_id');

-- the transaction's trace context (outbox.traceparent and outbox.tracestate)
-- goes into a message's headers, unless they name a traceparent of their
-- own: then none of it is added, as a tracestate belongs to its traceparent
BEGIN;
SET LOCAL outbox.traceparent = '00-11111111111111111111111111111111-2222222222222222-01';
SET LOCAL outbox.tracestate = 'session=1';
SELECT outbox_enqueue('traced', 'a'::text) AS session_traced \gset
SELECT outbox_enqueue('traced', 'b'::text,
                      headers => '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}') AS own_traced \gset
SELECT id = :session_traced AS session_context, headers FROM outbox_message
 WHERE id IN (:session_traced, :own_traced) ORDER BY id;
ROLLBACK;

-- Every refused input: an ERROR with a SQLSTATE, a message and a hint, and
-- nothing left behind.  Both ways in, outbox_enqueue() and INSERT.
\set SHOW_CONTEXT never
TRUNCATE outbox_message;

SELECT outbox_enqueue(NULL, '{}'::jsonb);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('', '{}'::jsonb);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('orders/created', '{}'::jsonb);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('ordres créés', 'x'::text);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('.', 'x'::text);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('..', 'x'::text);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue(repeat('t', 250), 'x'::text);
\echo :LAST_ERROR_SQLSTATE
-- the limits themselves are accepted
SELECT outbox_enqueue(repeat('t', 249), 'x'::text) > 0 AS longest_topic_ok;
SELECT outbox_enqueue('...', 'x'::text) > 0 AS three_dots_ok;
SELECT outbox_enqueue('a-Z_0.9', 'x'::text) > 0 AS all_classes_ok;

SELECT outbox_enqueue('t', NULL::jsonb);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', NULL::text);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', NULL::bytea);
\echo :LAST_ERROR_SQLSTATE

-- The limit is on the whole Kafka record, counted as librdkafka counts it:
-- payload, key and headers, with the 55-byte header outbox-message-id and
-- 36 bytes of framing.  A limit of 101 leaves 10 bytes to the message.
SET outbox.max_payload_size = 101;
SELECT outbox_enqueue('t', '12345678901'::text);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', '{"a": "12345"}'::jsonb);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', '\x0102030405060708090a0b'::bytea);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', '1234567890'::text) > 0 AS at_limit_ok;
-- the key counts
SELECT outbox_enqueue('t', '12345'::text, 'key-56');
\echo :LAST_ERROR_SQLSTATE
-- and the headers: each is its name and value, after a byte for each length
SELECT outbox_enqueue('t', 'x'::text, NULL, '{"h": "1234567"}');
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT outbox_enqueue('t', '1234'::text, 'key-56') > 0 AS key_at_limit_ok;
SELECT outbox_enqueue('t', 'x'::text, NULL, '{"h": "123456"}') > 0 AS header_at_limit_ok;
SELECT outbox_enqueue('t', ''::text, NULL, '{"12345678": null}') > 0 AS null_header_at_limit_ok;
ROLLBACK;
RESET outbox.max_payload_size;
SHOW outbox.max_payload_size;
-- over the default limit of 1000000 bytes: a payload of 999909 bytes is the
-- largest one without key and headers
SELECT outbox_enqueue('t', repeat('x', 999910));
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', 'x'::text, repeat('k', 1000000));
\echo :LAST_ERROR_SQLSTATE
-- 10,000 headers of 100 bytes are too many; 10,000 small ones are fine
SELECT outbox_enqueue('t', 'x'::text, NULL,
                      (SELECT jsonb_object_agg('h' || i, repeat('v', 100)) FROM generate_series(1, 10000) i));
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT outbox_enqueue('t', repeat('x', 999909)) > 0 AS largest_payload_ok;
SELECT outbox_enqueue('t', 'x'::text, NULL,
                      (SELECT jsonb_object_agg('h' || i, 'v') FROM generate_series(1, 10000) i)) > 0 AS many_headers_ok;
ROLLBACK;

-- more than 10,000 headers, however small, are refused
SELECT outbox_enqueue('t', 'x'::text, NULL,
                      (SELECT jsonb_object_agg('h' || i, '') FROM generate_series(1, 10001) i));
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', 'x'::text, NULL,
                      (SELECT jsonb_object_agg('h' || i, '') FROM generate_series(1, 100000) i));
\echo :LAST_ERROR_SQLSTATE
INSERT INTO outbox_message (topic, payload, headers)
SELECT 't', 'x', jsonb_object_agg('h' || i, '') FROM generate_series(1, 10001) i;
\echo :LAST_ERROR_SQLSTATE

SELECT outbox_enqueue('t', 'x'::text, 'k', '[1, 2]');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', 'x'::text, 'k', '"a string"');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', 'x'::text, 'k', '{"n": 1}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', 'x'::text, 'k', '{"nested": {"a": "b"}}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', 'x'::text, 'k', '{"flag": true}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', 'x'::text, 'k', '{"a": "b", "c": null}') > 0 AS string_and_null_headers_ok;

-- the same rules for a direct INSERT
INSERT INTO outbox_message (topic, payload) VALUES (NULL, 'x');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO outbox_message (topic, payload) VALUES ('bad topic', 'x');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO outbox_message (topic, payload) VALUES ('t', NULL);
\echo :LAST_ERROR_SQLSTATE
SET outbox.max_payload_size = 101;
INSERT INTO outbox_message (topic, payload) VALUES ('t', '\x0102030405060708090a0b');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO outbox_message (topic, key, payload) VALUES ('t', 'key-56', '12345');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO outbox_message (topic, payload, headers) VALUES ('t', 'x', '{"h": "1234567"}');
\echo :LAST_ERROR_SQLSTATE
BEGIN;
INSERT INTO outbox_message (topic, key, payload, headers) VALUES ('t', 'k', '1', '{"h": "1234"}')
RETURNING 'insert_at_limit_ok' AS accepted;
ROLLBACK;
RESET outbox.max_payload_size;
INSERT INTO outbox_message (topic, payload, headers) VALUES ('t', 'x', '{"n": 1}');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO outbox_message (topic, payload, state) VALUES ('t', 'x', 'sent');
\echo :LAST_ERROR_SQLSTATE

-- a refused row in a transaction takes the whole transaction with it
BEGIN;
SELECT outbox_enqueue('t', 'first'::text) > 0 AS enqueued;
SELECT outbox_enqueue('bad topic', 'second'::text);
COMMIT;

-- a read-only transaction refuses an enqueue as it refuses an INSERT
BEGIN READ ONLY;
SELECT outbox_enqueue('t', 'read only'::text);
ROLLBACK;

-- an enqueue whose INSERT fails, in a subtransaction rolled back, leaves
-- the next plain INSERT checked as always
CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN IF NEW.payload = 'boom' THEN RAISE EXCEPTION 'boom refused'; END IF; RETURN NEW; END$$;
CREATE TRIGGER a_refuse_boom BEFORE INSERT ON outbox_message
    FOR EACH ROW EXECUTE FUNCTION refuse_boom();
BEGIN;
SAVEPOINT before_boom;
SELECT outbox_enqueue('t', 'boom'::text);
ROLLBACK TO SAVEPOINT before_boom;
INSERT INTO outbox_message (topic, payload) VALUES ('bad topic', 'x');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
DROP TRIGGER a_refuse_boom ON outbox_message;
DROP FUNCTION refuse_boom();

-- only the accepted messages are there
SELECT topic = repeat('t', 249) AS long_topic, convert_from(payload, 'UTF8') AS payload,
       headers
  FROM outbox_message ORDER BY id;

-- only superusers may raise the payload limit
CREATE ROLE outbox_app;
SET ROLE outbox_app;
SET outbox.max_payload_size = 2000000;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP ROLE outbox_app;

-- Privileges: by default only the owner may enqueue, requeue, discard or read
-- payloads (each refusal is SQLSTATE 42501); the GRANTs the README documents
-- give an application, a monitoring and an operator role what they need, and
-- no more.
\set SHOW_CONTEXT never
TRUNCATE outbox_message, outbox_dead_letter;
INSERT INTO outbox_dead_letter (id, message_id, topic, key, payload, attempts, created_at, error)
VALUES (2001, 'c0eebc99-9c0b-4ef8-bb6d-6bb9bd380a21', 'orders', 'o-1', 'one', 10, now(), 'Broker: Message size too large'),
       (2002, 'c0eebc99-9c0b-4ef8-bb6d-6bb9bd380a22', 'orders', 'o-2', 'two', 10, now(), 'Broker: Message size too large');

CREATE ROLE outbox_nobody;
-- the application role, as the README says
CREATE ROLE outbox_app;
GRANT EXECUTE ON FUNCTION outbox_enqueue(text, jsonb, text, jsonb, integer, interval, timestamptz),
                          outbox_enqueue(text, text, text, jsonb, integer, interval, timestamptz),
                          outbox_enqueue(text, bytea, text, jsonb, integer, interval, timestamptz) TO outbox_app;
GRANT INSERT (topic, key, payload, headers) ON outbox_message TO outbox_app;
-- and the topics it publishes to, by the extension's owner
SELECT outbox_grant_topic('outbox_app', 'orders', 'publish'),
       outbox_grant_topic('outbox_app', 'lookalike', 'publish');
-- the monitoring role
CREATE ROLE outbox_monitor;
GRANT SELECT ON outbox_status, outbox_worker, outbox_launcher TO outbox_monitor;
GRANT EXECUTE ON FUNCTION outbox_worker_status(), outbox_launcher_status(), outbox_topic_metrics() TO outbox_monitor;
-- a member of pg_monitor, which the extension grants nothing
CREATE ROLE outbox_pg_monitor IN ROLE pg_monitor;
-- the operator who requeues and discards dead letters
CREATE ROLE outbox_operator;
GRANT EXECUTE ON FUNCTION outbox_requeue(bigint), outbox_discard(bigint) TO outbox_operator;
GRANT SELECT ON outbox_dead_letter TO outbox_operator;

-- A role without grants can do none of it.
SET ROLE outbox_nobody;
SELECT outbox_grant_topic('outbox_nobody', '*', 'publish');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_revoke_topic('outbox_app', 'orders', 'publish');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', '{}'::jsonb);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', 'x'::text);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('t', '\x00'::bytea);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO outbox_message (topic, payload) VALUES ('t', 'x');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_requeue(2001);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_discard(2001);
\echo :LAST_ERROR_SQLSTATE
SELECT payload FROM outbox_message;
\echo :LAST_ERROR_SQLSTATE
SELECT payload FROM outbox_dead_letter;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM outbox_status;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM outbox_worker;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM outbox_worker_status();
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM outbox_launcher;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM outbox_launcher_status();
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM outbox_topic_metrics();
\echo :LAST_ERROR_SQLSTATE
-- nor attach the trigger function to a table of its own
CREATE TEMP TABLE look_alike (topic text, key text, payload bytea, headers jsonb, state text, id bigint);
CREATE TRIGGER x BEFORE INSERT ON look_alike FOR EACH ROW EXECUTE FUNCTION outbox_message_check();
\echo :LAST_ERROR_SQLSTATE
DROP TABLE look_alike;
RESET ROLE;
SELECT has_function_privilege('public', 'outbox_message_check()', 'EXECUTE') AS public_may_execute_trigger;

-- The application role enqueues both ways (the trigger fires although it
-- may not execute the trigger function: triggers are not checked for
-- EXECUTE when they fire), and cannot read the outbox or set the columns
-- the worker owns, the id among them.
SET ROLE outbox_app;
SELECT has_function_privilege('outbox_message_check()', 'EXECUTE') AS may_execute_trigger;
SELECT outbox_enqueue('orders', '{"order": 1}'::jsonb, 'o-1', '{"via": "jsonb"}') > 0 AS enqueued;
SELECT outbox_enqueue('orders', 'text payload'::text, 'o-1') > 0 AS enqueued;
SELECT outbox_enqueue('orders', '\x00ff'::bytea) > 0 AS enqueued;
INSERT INTO outbox_message (topic, key, payload, headers)
VALUES ('orders', 'o-1', 'inserted', '{"via": "insert"}');
-- checks still apply to it
SELECT outbox_enqueue('bad topic', 'x'::text);
\echo :LAST_ERROR_SQLSTATE
-- only to the topics it was granted
SELECT outbox_enqueue('payments', 'x'::text);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO outbox_message (topic, payload) VALUES ('orders.eu', 'x');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO outbox_message (topic, payload, message_id)
VALUES ('orders', 'forged', 'c0eebc99-9c0b-4ef8-bb6d-6bb9bd380a21');
\echo :LAST_ERROR_SQLSTATE
INSERT INTO outbox_message (topic, payload, attempts) VALUES ('orders', 'x', 99);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO outbox_message (id, topic, payload) VALUES (1, 'orders', 'x');
\echo :LAST_ERROR_SQLSTATE
SELECT nextval('outbox_message_id_seq');
\echo :LAST_ERROR_SQLSTATE
SELECT setval('outbox_message_id_seq', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT payload FROM outbox_message;
\echo :LAST_ERROR_SQLSTATE
UPDATE outbox_message SET payload = 'changed';
\echo :LAST_ERROR_SQLSTATE
DELETE FROM outbox_message;
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_requeue(2001);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM outbox_status;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT topic, key, encode(payload, 'escape') AS payload, headers, state, attempts
  FROM outbox_message ORDER BY id;

-- The monitoring role reads the views, which show no payload, key or
-- header, and nothing else.
SET ROLE outbox_monitor;
SELECT topic, waiting, retrying, dead_letters, sent_last_minute, sent_per_second,
       latency_p50, latency_p99 FROM outbox_status;
SELECT * FROM outbox_topic_metrics();
SELECT worker_id, database, state IS NOT NULL AS has_state FROM outbox_worker;
SELECT max_workers, workers FROM outbox_launcher;
SELECT payload FROM outbox_message;
\echo :LAST_ERROR_SQLSTATE
SELECT payload FROM outbox_dead_letter;
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('orders', 'x'::text);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_discard(2001);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO outbox_message (topic, payload) VALUES ('orders', 'x');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- A pg_monitor member reads neither view: pg_monitor is granted nothing.
SET ROLE outbox_pg_monitor;
SELECT * FROM outbox_status;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM outbox_worker;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM outbox_worker_status();
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM outbox_launcher;
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM outbox_topic_metrics();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT attrelid::regclass AS view, string_agg(attname, ', ' ORDER BY attnum) AS columns
  FROM pg_attribute
 WHERE attrelid IN ('outbox_status'::regclass, 'outbox_worker'::regclass,
                    'outbox_launcher'::regclass) AND attnum > 0
 GROUP BY attrelid ORDER BY 1;

-- The operator sees the dead letters, requeues one and discards the other,
-- and cannot enqueue or read the outbox.
SET ROLE outbox_operator;
SELECT id, topic, convert_from(payload, 'UTF8') AS payload, error FROM outbox_dead_letter ORDER BY id;
SELECT outbox_requeue(2001) > 0 AS requeued;
SELECT outbox_discard(2002) AS discarded;
SELECT outbox_enqueue('orders', 'x'::text);
\echo :LAST_ERROR_SQLSTATE
SELECT payload FROM outbox_message;
\echo :LAST_ERROR_SQLSTATE
DELETE FROM outbox_dead_letter;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT count(*) AS dead_letters_left FROM outbox_dead_letter;
SELECT message_id, convert_from(payload, 'UTF8') AS payload, state FROM outbox_message
 WHERE message_id = 'c0eebc99-9c0b-4ef8-bb6d-6bb9bd380a21';

-- The functions that run as the owner cannot be redirected by the caller's
-- search_path: a schema of look-alikes put first, in a new session (so the
-- enqueue statement is prepared under it), changes nothing.
CREATE SCHEMA outbox_lookalike AUTHORIZATION outbox_app;
INSERT INTO outbox_dead_letter (id, message_id, topic, payload, attempts, created_at, error)
VALUES (2003, gen_random_uuid(), 'orders', 'three', 10, now(), 'Broker: Message size too large');
\c -
SET ROLE outbox_app;
CREATE TABLE outbox_lookalike.outbox_message (id bigint, topic text, key text, payload bytea, headers jsonb);
CREATE TABLE outbox_lookalike.outbox_dead_letter (id bigint);
INSERT INTO outbox_lookalike.outbox_dead_letter VALUES (2003);
CREATE FUNCTION outbox_lookalike.gen_random_uuid() RETURNS uuid
    LANGUAGE sql AS $$ SELECT '00000000-0000-0000-0000-000000000000'::uuid $$;
CREATE FUNCTION outbox_lookalike.clock_timestamp() RETURNS timestamptz
    LANGUAGE sql AS $$ SELECT '2000-01-01'::timestamptz $$;
GRANT USAGE ON SCHEMA outbox_lookalike TO outbox_operator;
GRANT ALL ON ALL TABLES IN SCHEMA outbox_lookalike TO outbox_operator;
SET search_path = outbox_lookalike, pg_catalog, public;
SELECT outbox_enqueue('lookalike', 'x'::text, 'k') > 0 AS enqueued;
RESET ROLE;
SET ROLE outbox_operator;
SELECT outbox_discard(2003) AS discarded;
RESET ROLE;
RESET search_path;
SELECT count(*) AS lookalike_messages FROM outbox_lookalike.outbox_message;
SELECT count(*) AS lookalike_dead_letters FROM outbox_lookalike.outbox_dead_letter;
SELECT count(*) AS dead_letters_left FROM outbox_dead_letter;
SELECT message_id <> '00000000-0000-0000-0000-000000000000' AS random_message_id,
       created_at > '2000-01-01' AS real_created_at
  FROM outbox_message WHERE topic = 'lookalike';

DROP SCHEMA outbox_lookalike CASCADE;
DROP OWNED BY outbox_app, outbox_monitor, outbox_operator;
DROP ROLE outbox_nobody, outbox_app, outbox_monitor, outbox_pg_monitor, outbox_operator;

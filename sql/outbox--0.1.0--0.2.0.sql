-- outbox 0.1.0 to 0.2.0: a dump keeps the id order; the trigger function is
-- executable by no one but the owner; pg_monitor is granted nothing; every
-- operator and function is named with its schema.
--
-- Install the new version's files and restart PostgreSQL first (the library
-- is preloaded), then run ALTER EXTENSION outbox UPDATE.  Messages in every
-- state stay where they are; the worker goes on publishing them.

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.2.0'" to load this file. \quit

-- The ids.  0.1.0's identity column drew its id before the trigger ran, so
-- a row restored from a dump could not be told from a new one, and was
-- checked (refused unless pending) and renumbered; and its identity
-- sequence was not dumped, so a restored database handed out the ids of
-- the rows and dead letters it had restored.  From 0.2.0 the trigger draws
-- the id, from a plain sequence that pg_dump dumps as extension
-- configuration.  No one may enqueue meanwhile, so that the new sequence
-- starts where the old one stopped.
LOCK TABLE outbox_message IN ACCESS EXCLUSIVE MODE;

CREATE SEQUENCE outbox_message_id_seq_0_2_0;
SELECT pg_catalog.setval('outbox_message_id_seq_0_2_0', last_value, is_called)
  FROM outbox_message_id_seq;
ALTER TABLE outbox_message ALTER COLUMN id DROP IDENTITY;
ALTER SEQUENCE outbox_message_id_seq_0_2_0 RENAME TO outbox_message_id_seq;
ALTER SEQUENCE outbox_message_id_seq OWNED BY outbox_message.id;
SELECT pg_catalog.pg_extension_config_dump('outbox_message_id_seq', '');

-- Defaults and the state check, with their functions and operators named.
-- (The partial indexes' predicates were bound to pg_catalog's operators
-- when they were created, before any other role could add one: they stay.)
ALTER TABLE outbox_message
    ALTER COLUMN message_id SET DEFAULT pg_catalog.gen_random_uuid(),
    ALTER COLUMN next_attempt_at SET DEFAULT pg_catalog.now(),
    ALTER COLUMN created_at SET DEFAULT pg_catalog.clock_timestamp(),
    DROP CONSTRAINT outbox_message_state_check,
    ADD CONSTRAINT outbox_message_state_check
        CHECK (state OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'retrying', 'sent']));
ALTER TABLE outbox_dead_letter
    ALTER COLUMN failed_at SET DEFAULT pg_catalog.now();

CREATE OR REPLACE FUNCTION outbox_requeue(dead_letter_id bigint)
RETURNS bigint
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER
BEGIN ATOMIC
    WITH requeued AS (
        DELETE FROM outbox_dead_letter WHERE id OPERATOR(pg_catalog.=) dead_letter_id
        RETURNING message_id, topic, key, payload, headers, created_at
    )
    INSERT INTO outbox_message (message_id, topic, key, payload, headers, created_at)
    SELECT message_id, topic, key, payload, headers, created_at FROM requeued
    RETURNING id;
END;

CREATE OR REPLACE FUNCTION outbox_discard(dead_letter_id bigint)
RETURNS boolean
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER
BEGIN ATOMIC
    WITH discarded AS (
        DELETE FROM outbox_dead_letter WHERE id OPERATOR(pg_catalog.=) dead_letter_id RETURNING 1
    )
    SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 0 FROM discarded;
END;

CREATE OR REPLACE VIEW outbox_status AS
WITH outbox AS (
    SELECT topic,
           pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'pending')  AS waiting,
           pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'retrying') AS retrying,
           pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'sent')     AS sent_retained,
           pg_catalog.now() OPERATOR(pg_catalog.-)
               pg_catalog.min(created_at) FILTER (WHERE state OPERATOR(pg_catalog.<>) 'sent')
               AS oldest_waiting_age,
           pg_catalog.max(sent_at) AS last_sent_at
    FROM outbox_message
    GROUP BY topic
), dead AS (
    SELECT topic, pg_catalog.count(*) AS dead_letters, pg_catalog.max(failed_at) AS last_failed_at
    FROM outbox_dead_letter
    GROUP BY topic
)
SELECT coalesce(o.topic, d.topic)           AS topic,
       coalesce(o.waiting, 0::bigint)       AS waiting,
       coalesce(o.retrying, 0::bigint)      AS retrying,
       o.oldest_waiting_age,
       coalesce(d.dead_letters, 0::bigint)  AS dead_letters,
       coalesce(o.sent_retained, 0::bigint) AS sent_retained,
       o.last_sent_at,
       d.last_failed_at
FROM outbox o FULL JOIN dead d ON o.topic OPERATOR(pg_catalog.=) d.topic
ORDER BY 1;

-- Privileges: the trigger function fires without EXECUTE, which only
-- creating a trigger with it needs; monitoring is a role of your own (see
-- the README), since pg_monitor also reads payloads in pg_stat_activity.
REVOKE EXECUTE ON FUNCTION outbox_message_check() FROM PUBLIC;
REVOKE SELECT ON outbox_status, outbox_worker FROM pg_monitor;
REVOKE EXECUTE ON FUNCTION outbox_worker_status() FROM pg_monitor;

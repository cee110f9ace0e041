-- outbox 0.5.0 to 0.6.0: outbox_enqueue() takes a partition and a delay
-- (deliver_after, deliver_at); outbox_status counts the delayed messages,
-- and shows each topic's rate and latency over the last minute
-- (outbox_topic_metrics()).
--
-- Install the new version's files and restart PostgreSQL first (the library
-- is preloaded), then run ALTER EXTENSION outbox UPDATE in each database
-- that has the extension.

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.6.0'" to load this file. \quit

-- The partition a message is sent to, when it names one; NULL leaves it to
-- the producer's partitioner, by key.  Kept with a dead letter, so that a
-- requeued message goes where it was sent.
ALTER TABLE outbox_message ADD COLUMN target_partition integer
    CONSTRAINT outbox_message_target_partition_check
    CHECK (target_partition OPERATOR(pg_catalog.>=) 0);
ALTER TABLE outbox_dead_letter ADD COLUMN target_partition integer;

-- A tombstone, a record without a value, is a row without a payload: only
-- outbox_capture() makes them (route.tombstone.on.empty.payload); the
-- trigger still refuses a NULL payload in a plain INSERT.
ALTER TABLE outbox_message ALTER COLUMN payload DROP NOT NULL;
ALTER TABLE outbox_dead_letter ALTER COLUMN payload DROP NOT NULL;

-- outbox_enqueue() gains three arguments with defaults, which needs new
-- functions: old and new side by side would make every call ambiguous.
-- What was granted on the old ones is granted on the new, and the new
-- ones' initial privileges (pg_init_privs, what pg_dump compares with) are
-- set to what a fresh install records, so that pg_dump still dumps those
-- grants.  A function whose SQL-standard body calls outbox_enqueue()
-- depends on it, and makes the DROP below fail: drop it first, and create
-- it again after the update.
DO $upgrade$
DECLARE
    payload_type text;
    old_function regprocedure;
    new_function regprocedure;
    old_acl aclitem[];
    grants record;
    initial aclitem[];
BEGIN
    FOREACH payload_type IN ARRAY ARRAY['jsonb', 'text', 'bytea'] LOOP
        old_function := pg_catalog.format('@extschema@.outbox_enqueue(text, %s, text, jsonb)', payload_type)::regprocedure;
        SELECT proacl INTO old_acl FROM pg_catalog.pg_proc WHERE oid OPERATOR(pg_catalog.=) old_function;
        EXECUTE pg_catalog.format('DROP FUNCTION %s', old_function);
        EXECUTE pg_catalog.format($sql$
            CREATE FUNCTION @extschema@.outbox_enqueue(topic text, payload %1$s,
                                           key text DEFAULT NULL, headers jsonb DEFAULT NULL,
                                           "partition" integer DEFAULT NULL,
                                           deliver_after interval DEFAULT NULL,
                                           deliver_at timestamptz DEFAULT NULL)
            RETURNS bigint
            AS 'MODULE_PATHNAME', %2$L
            LANGUAGE C VOLATILE SECURITY DEFINER$sql$,
            payload_type, CASE payload_type WHEN 'jsonb' THEN 'outbox_enqueue_jsonb' ELSE 'outbox_enqueue_bytes' END);
        new_function := pg_catalog.format('@extschema@.outbox_enqueue(text, %s, text, jsonb, integer, interval, timestamptz)',
                                          payload_type)::regprocedure;
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', new_function);
        SELECT proacl INTO initial FROM pg_catalog.pg_proc WHERE oid OPERATOR(pg_catalog.=) new_function;
        FOR grants IN SELECT a.grantee, a.is_grantable AS grantable
                        FROM pg_catalog.aclexplode(old_acl) a, pg_catalog.pg_proc p
                       WHERE p.oid OPERATOR(pg_catalog.=) new_function
                         AND a.grantee OPERATOR(pg_catalog.<>) p.proowner LOOP
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', new_function,
                                      CASE WHEN grants.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                           ELSE grants.grantee::regrole::text END,
                                      CASE WHEN grants.grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
        UPDATE pg_catalog.pg_init_privs SET initprivs = initial
         WHERE objoid OPERATOR(pg_catalog.=) new_function
           AND classoid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
           AND objsubid OPERATOR(pg_catalog.=) 0;
    END LOOP;
END
$upgrade$;

CREATE OR REPLACE FUNCTION outbox_requeue(dead_letter_id bigint)
RETURNS bigint
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER
BEGIN ATOMIC
    WITH requeued AS (
        DELETE FROM outbox_dead_letter WHERE id OPERATOR(pg_catalog.=) dead_letter_id
        RETURNING message_id, topic, key, payload, headers, created_at, target_partition
    )
    INSERT INTO outbox_message (message_id, topic, key, payload, headers, created_at, target_partition)
    SELECT message_id, topic, key, payload, headers, created_at, target_partition FROM requeued
    RETURNING id;
END;

-- Metrics: per topic, the messages Kafka acknowledged in the last minute
-- (the window now running and the five 10-second windows before it), how
-- many per second, and their latency from commit to Kafka's
-- acknowledgement (50th and 99th percentiles), read from the publisher's
-- shared memory: src/metrics.c says exactly what is measured.  At most 64
-- topics a minute are told apart; the others count as one row, '(other
-- topics)'.  outbox_status joins it, so a monitoring role needs its EXECUTE.
CREATE FUNCTION outbox_topic_metrics(
    OUT topic text,
    OUT sent_last_minute bigint,
    OUT sent_per_second double precision,
    OUT latency_p50 interval,
    OUT latency_p99 interval)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_topic_metrics'
LANGUAGE C STRICT VOLATILE;

REVOKE EXECUTE ON FUNCTION outbox_topic_metrics() FROM PUBLIC;

-- One row per topic that has messages waiting, retrying, delayed, kept as
-- sent, or dead-lettered, or messages acknowledged in the last minute
-- (outbox_topic_metrics()).  A delayed message (outbox_enqueue()'s
-- deliver_after or deliver_at) waits as a retry does, holding back the later
-- messages of its key, until its time comes: it is a 'retrying' row not yet
-- attempted.  oldest_waiting_age leaves it out until then, and counts from
-- its time after: it is how long the oldest message could have gone and
-- has not.  New columns go at the end, so that an upgrade can replace the
-- view and keep what was granted on it.
CREATE OR REPLACE VIEW outbox_status AS
WITH outbox AS (
    SELECT topic,
           pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'pending')  AS waiting,
           pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'retrying'
                                         AND attempts OPERATOR(pg_catalog.>) 0) AS retrying,
           pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'retrying'
                                         AND attempts OPERATOR(pg_catalog.=) 0) AS delayed,
           pg_catalog.count(*) FILTER (WHERE state OPERATOR(pg_catalog.=) 'sent')     AS sent_retained,
           pg_catalog.now() OPERATOR(pg_catalog.-)
               pg_catalog.min(CASE WHEN attempts OPERATOR(pg_catalog.=) 0
                                    AND state OPERATOR(pg_catalog.=) 'retrying'
                                   THEN next_attempt_at ELSE created_at END)
               FILTER (WHERE state OPERATOR(pg_catalog.<>) 'sent'
                         AND NOT (state OPERATOR(pg_catalog.=) 'retrying'
                                  AND attempts OPERATOR(pg_catalog.=) 0
                                  AND next_attempt_at OPERATOR(pg_catalog.>) pg_catalog.now()))
               AS oldest_waiting_age,
           pg_catalog.max(sent_at) AS last_sent_at
    FROM outbox_message
    GROUP BY topic
), dead AS (
    SELECT topic, pg_catalog.count(*) AS dead_letters, pg_catalog.max(failed_at) AS last_failed_at
    FROM outbox_dead_letter
    GROUP BY topic
), metrics AS (
    SELECT * FROM outbox_topic_metrics()
)
SELECT coalesce(o.topic, d.topic, m.topic)  AS topic,
       coalesce(o.waiting, 0::bigint)       AS waiting,
       coalesce(o.retrying, 0::bigint)      AS retrying,
       o.oldest_waiting_age,
       coalesce(d.dead_letters, 0::bigint)  AS dead_letters,
       coalesce(o.sent_retained, 0::bigint) AS sent_retained,
       o.last_sent_at,
       d.last_failed_at,
       coalesce(o.delayed, 0::bigint)       AS delayed,
       coalesce(m.sent_last_minute, 0::bigint)          AS sent_last_minute,
       coalesce(m.sent_per_second, 0::double precision) AS sent_per_second,
       m.latency_p50,
       m.latency_p99
FROM outbox o FULL JOIN dead d ON o.topic OPERATOR(pg_catalog.=) d.topic
FULL JOIN metrics m ON m.topic OPERATOR(pg_catalog.=) coalesce(o.topic, d.topic)
ORDER BY 1;

-- A role that could read outbox_status (a monitoring role) needs EXECUTE on
-- outbox_topic_metrics() to read it now: it gets it, and the function's
-- initial privileges (pg_init_privs, what pg_dump compares with) are set to
-- what a fresh install records, so that pg_dump dumps those grants.
DO $metrics_grants$
DECLARE
    metrics_function regprocedure := '@extschema@.outbox_topic_metrics()'::regprocedure;
    initial aclitem[];
    grants record;
BEGIN
    SELECT proacl INTO initial FROM pg_catalog.pg_proc WHERE oid OPERATOR(pg_catalog.=) metrics_function;
    FOR grants IN SELECT DISTINCT a.grantee
                    FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
                   WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.outbox_status'::pg_catalog.regclass
                     AND a.privilege_type OPERATOR(pg_catalog.=) 'SELECT'
                     AND a.grantee OPERATOR(pg_catalog.<>) c.relowner LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', metrics_function,
                                  CASE WHEN grants.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                       ELSE grants.grantee::regrole::text END);
    END LOOP;
    UPDATE pg_catalog.pg_init_privs SET initprivs = initial
     WHERE objoid OPERATOR(pg_catalog.=) metrics_function
       AND classoid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
       AND objsubid OPERATOR(pg_catalog.=) 0;
END
$metrics_grants$;


-- ---------------------------------------------------------------------------
-- Debezium outbox compatibility: outbox_capture().
--
-- An application written for Debezium's outbox inserts its events into a
-- table of its own (id, aggregatetype, aggregateid, type, payload, ...),
-- which Debezium's EventRouter publishes.  outbox_capture(tbl, settings)
-- makes this extension publish the table's inserts instead, in the
-- inserting transaction, as EventRouter would route them; the settings are
-- EventRouter's option names (see the README).  It creates the row trigger
-- outbox_capture on the table, which enqueues a message for each inserted
-- row as outbox_enqueue() would.
-- ---------------------------------------------------------------------------

-- The captured tables and the settings each was captured with, as given.
-- By regclass, so that pg_dump writes (and a restore reads) the table's
-- name.  Written by outbox_capture() and outbox_uncapture() only, as the
-- extension's owner; granted to no one.  A table dropped since is
-- forgotten at the next call of either, and never dumped.
CREATE TABLE outbox_captured (
    tbl          regclass PRIMARY KEY,
    settings     jsonb NOT NULL
                 CHECK (pg_catalog.jsonb_typeof(settings) OPERATOR(pg_catalog.=) 'object'),
    captured_at  timestamptz NOT NULL DEFAULT pg_catalog.now()
);

COMMENT ON TABLE outbox_captured IS
    'Tables whose inserts are published as Debezium''s EventRouter would: see outbox_capture() and outbox_uncapture()';

SELECT pg_catalog.pg_extension_config_dump('outbox_captured',
    'WHERE EXISTS (SELECT FROM pg_catalog.pg_class r WHERE r.oid OPERATOR(pg_catalog.=) tbl)');

-- Not SECURITY DEFINER: each checks that its caller owns the table, then
-- writes outbox_captured and creates or drops the trigger as the
-- extension's owner.  No EXECUTE for PUBLIC: a role needs a grant.
CREATE FUNCTION outbox_capture(tbl regclass, settings jsonb DEFAULT '{}')
RETURNS jsonb
AS 'MODULE_PATHNAME', 'outbox_capture'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION outbox_capture(regclass, jsonb) IS
    'Publish the inserts of a Debezium outbox table as EventRouter would, with its options as settings; returns every setting as it applies';

CREATE FUNCTION outbox_uncapture(tbl regclass)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_uncapture'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION outbox_uncapture(regclass) IS
    'Stop publishing the inserts of a table outbox_capture() captured; returns whether it was captured';

-- The trigger outbox_capture() creates.  It fires only on a table
-- outbox_captured lists; no EXECUTE for PUBLIC, so that no other role
-- creates a trigger with it.
CREATE FUNCTION outbox_capture_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'outbox_capture_trigger'
LANGUAGE C;

REVOKE EXECUTE ON FUNCTION
    outbox_capture(regclass, jsonb),
    outbox_uncapture(regclass),
    outbox_capture_trigger()
FROM PUBLIC;

-- outbox 0.2.0 to 0.3.0: the outbox's rows are kept in segments, which the
-- worker truncates once delivered, and the claim starts from the lowest id
-- it has yet to claim instead of the left edge of its index; so that
-- neither the claim nor the outbox's size grows while a long transaction
-- holds back VACUUM.
--
-- Install the new version's files and restart PostgreSQL first (the library
-- is preloaded), then run ALTER EXTENSION outbox UPDATE.  Every message,
-- in every state, is copied with its id into the new table, and the worker
-- goes on publishing them in the same order.  The update holds an ACCESS
-- EXCLUSIVE lock on the outbox while it copies: no one enqueues meanwhile.

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.3.0'" to load this file. \quit

LOCK TABLE outbox_message IN ACCESS EXCLUSIVE MODE;

-- The old table steps aside with its indexes, and lets go of the sequence,
-- which the new one takes over where it stopped.
ALTER TABLE outbox_message RENAME TO outbox_message_0_2_0;
ALTER TABLE outbox_message_0_2_0 RENAME CONSTRAINT outbox_message_pkey TO outbox_message_0_2_0_pkey;
ALTER INDEX outbox_message_waiting RENAME TO outbox_message_0_2_0_waiting;
ALTER INDEX outbox_message_retrying_key RENAME TO outbox_message_0_2_0_retrying_key;
ALTER INDEX outbox_message_sent RENAME TO outbox_message_0_2_0_sent;
ALTER SEQUENCE outbox_message_id_seq OWNED BY NONE;

CREATE TABLE outbox_message (
    id              bigint NOT NULL,
    message_id      uuid NOT NULL DEFAULT pg_catalog.gen_random_uuid(),
    topic           text NOT NULL,
    key             text,
    payload         bytea NOT NULL,
    headers         jsonb,
    state           text NOT NULL DEFAULT 'pending'
                    CONSTRAINT outbox_message_state_check
                    CHECK (state OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'retrying', 'sent'])),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    sent_at         timestamptz,
    kafka_partition integer,
    kafka_offset    bigint,
    segment         smallint NOT NULL
) PARTITION BY LIST (segment);

COMMENT ON TABLE outbox_message IS
    'Messages waiting to be published to Kafka (and, under outbox.sent_retention, recently sent ones)';

-- The segment a row inserted now goes to.  Every role that inserts
-- executes it, as the column's default, so PUBLIC keeps its EXECUTE.
CREATE FUNCTION outbox_segment()
RETURNS smallint
AS 'MODULE_PATHNAME', 'outbox_segment'
LANGUAGE C STABLE PARALLEL SAFE;

ALTER TABLE outbox_message ALTER COLUMN segment SET DEFAULT outbox_segment();

-- The segments, as many as OUTBOX_SEGMENTS in src/segment.h, and their
-- indexes, named after them: the indexes on outbox_message below take
-- them as their partitions.
DO $$
BEGIN
    FOR s IN 0..3 LOOP
        EXECUTE pg_catalog.format($sql$
            CREATE TABLE outbox_message_%1$s PARTITION OF outbox_message FOR VALUES IN (%1$s);
            CREATE INDEX outbox_message_%1$s_waiting ON outbox_message_%1$s (id)
                WHERE state OPERATOR(pg_catalog.<>) 'sent';
            CREATE INDEX outbox_message_%1$s_retrying ON outbox_message_%1$s (id)
                WHERE state OPERATOR(pg_catalog.=) 'retrying';
            CREATE INDEX outbox_message_%1$s_retrying_key ON outbox_message_%1$s (topic, key, id)
                WHERE state OPERATOR(pg_catalog.=) 'retrying';
            CREATE INDEX outbox_message_%1$s_sent ON outbox_message_%1$s (sent_at)
                WHERE state OPERATOR(pg_catalog.=) 'sent';
            SELECT pg_catalog.pg_extension_config_dump('outbox_message_%1$s', '');
            $sql$, s);
    END LOOP;
END
$$;

-- An id is unique, as the sequence draws each once; the key holds the
-- segment too, as a partitioned table's keys must.  (Each segment's is
-- outbox_message_N_pkey.)
ALTER TABLE outbox_message ADD PRIMARY KEY (id, segment);

-- The claim walks waiting rows in id order, from the id below which it
-- knows every row is claimed, delivered or retrying.
CREATE INDEX outbox_message_waiting
    ON outbox_message (id) WHERE state OPERATOR(pg_catalog.<>) 'sent';

-- Messages waiting to retry below that id, claimed when due.
CREATE INDEX outbox_message_retrying
    ON outbox_message (id) WHERE state OPERATOR(pg_catalog.=) 'retrying';

-- A message waiting to retry holds back the later messages of its key.
CREATE INDEX outbox_message_retrying_key
    ON outbox_message (topic, key, id) WHERE state OPERATOR(pg_catalog.=) 'retrying';

-- Whether a segment holds rows sent too recently to go, under
-- outbox.sent_retention.
CREATE INDEX outbox_message_sent
    ON outbox_message (sent_at) WHERE state OPERATOR(pg_catalog.=) 'sent';


ALTER SEQUENCE outbox_message_id_seq OWNED BY outbox_message.id;


-- The grants on the old table, table-wide and per column, go to the new one.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT a.privilege_type, a.grantee, NULL::name AS column_name
          FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
         WHERE c.oid OPERATOR(pg_catalog.=) 'outbox_message_0_2_0'::pg_catalog.regclass
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
        UNION ALL
        SELECT a.privilege_type, a.grantee, t.attname
          FROM pg_catalog.pg_attribute t, pg_catalog.aclexplode(t.attacl) a
         WHERE t.attrelid OPERATOR(pg_catalog.=) 'outbox_message_0_2_0'::pg_catalog.regclass
           AND t.attnum OPERATOR(pg_catalog.>) 0
    LOOP
        EXECUTE pg_catalog.format('GRANT %s %s ON outbox_message TO %s',
            g.privilege_type,
            CASE WHEN g.column_name IS NULL THEN ''
                 ELSE '(' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(g.column_name) OPERATOR(pg_catalog.||) ')' END,
            CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END);
    END LOOP;
END
$$;

-- Every message, with its id, in the segment of now.
INSERT INTO outbox_message
       (id, message_id, topic, key, payload, headers, state, attempts, next_attempt_at,
        last_error, created_at, sent_at, kafka_partition, kafka_offset)
SELECT id, message_id, topic, key, payload, headers, state, attempts, next_attempt_at,
       last_error, created_at, sent_at, kafka_partition, kafka_offset
  FROM outbox_message_0_2_0
 ORDER BY id;

-- The checks, the key locks, the ids and the wake of every new row.
CREATE TRIGGER outbox_message_check
    BEFORE INSERT ON outbox_message
    FOR EACH ROW EXECUTE FUNCTION outbox_message_check();

-- What read the old table reads the new one (their grants stay).
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


-- Out of the extension first, which takes it out of the tables pg_dump
-- dumps as configuration.
ALTER EXTENSION outbox DROP TABLE outbox_message_0_2_0;
DROP TABLE outbox_message_0_2_0;

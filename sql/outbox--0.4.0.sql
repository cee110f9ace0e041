-- outbox 0.4.0: the transactional outbox.
--
-- An application writes its business rows and calls outbox_enqueue() (or
-- INSERTs into outbox_message) in the same transaction.  The outbox
-- background worker publishes each committed row to Kafka and then deletes
-- it, keeps it as 'sent' (outbox.sent_retention), schedules a retry, or moves
-- it to outbox_dead_letter.
--
-- Every operator and function below is named with its schema, pg_catalog,
-- so that what an expression binds to never depends on what other roles
-- created in the schemas on the path when the extension was created.

\echo Use "CREATE EXTENSION outbox" to load this file. \quit

-- The outbox itself.  Only rows not yet sent are the worker's work; the
-- partial indexes below cover exactly those, so delivered rows kept for
-- history never slow down the claim.
--
-- The id has no default: the trigger outbox_message_check draws it from
-- outbox_message_id_seq once the message's key is locked, so that the ids
-- of one key follow commit order.  A row that comes with its id is being
-- restored from a dump and keeps it; only the owner may write the id
-- column, as no one else is granted it (nor the sequence).
--
-- The rows are kept in segments, the partitions below, by the time they
-- were inserted (outbox_segment()).  The worker truncates a segment once
-- every message in it is delivered (and, under outbox.sent_retention, old
-- enough), so that the space of delivered rows comes back at once, even
-- while a long transaction keeps VACUUM from removing them.  The segment a
-- row is in says nothing of its order, which is its id's.
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

CREATE SEQUENCE outbox_message_id_seq OWNED BY outbox_message.id;

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

-- Messages that could not be delivered: a permanent error from Kafka, or
-- outbox.max_attempts failed attempts.
CREATE TABLE outbox_dead_letter (
    id          bigint PRIMARY KEY,
    message_id  uuid NOT NULL,
    topic       text NOT NULL,
    key         text,
    payload     bytea NOT NULL,
    headers     jsonb,
    attempts    integer NOT NULL,
    created_at  timestamptz NOT NULL,
    failed_at   timestamptz NOT NULL DEFAULT pg_catalog.now(),
    error       text NOT NULL
);

COMMENT ON TABLE outbox_dead_letter IS
    'Messages the outbox worker gave up on, with the reason; see outbox_requeue() and outbox_discard()';

CREATE INDEX outbox_dead_letter_topic ON outbox_dead_letter (topic);

-- pg_dump dumps the rows of the segments (above) and of the dead letters,
-- and the sequence's position: a restored database hands out ids above
-- every restored message and every dead letter (whose ids are the
-- messages' own).
SELECT pg_catalog.pg_extension_config_dump('outbox_message_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('outbox_dead_letter', '');

-- Enqueue: check the message, insert it, wake the worker at commit.
--
-- SECURITY DEFINER: they run as the extension's owner, so that EXECUTE alone
-- lets a role enqueue.  Such a role needs no privilege on outbox_message: it
-- cannot read the outbox, nor set a message's id, message_id, state or
-- attempts.  Running as the owner is safe without a SET search_path clause
-- (which would cost a configuration change on every call): the one statement
-- they run names outbox_message with its schema, takes its values as
-- parameters of the columns' own types, and everything else it runs (the
-- defaults, the constraints, the trigger) was bound when the extension was
-- created, so the caller's search_path cannot redirect any of it.
CREATE FUNCTION outbox_enqueue(topic text, payload jsonb,
                               key text DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_enqueue_jsonb'
LANGUAGE C VOLATILE SECURITY DEFINER;

CREATE FUNCTION outbox_enqueue(topic text, payload text,
                               key text DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_enqueue_bytes'
LANGUAGE C VOLATILE SECURITY DEFINER;

CREATE FUNCTION outbox_enqueue(topic text, payload bytea,
                               key text DEFAULT NULL, headers jsonb DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_enqueue_bytes'
LANGUAGE C VOLATILE SECURITY DEFINER;

-- A plain INSERT INTO outbox_message gets the same checks and the same wake.
-- No EXECUTE for PUBLIC (see Privileges): a trigger function is not checked
-- for EXECUTE when its trigger fires, only when a trigger is created with it.
CREATE FUNCTION outbox_message_check()
RETURNS trigger
AS 'MODULE_PATHNAME', 'outbox_message_check'
LANGUAGE C;

CREATE TRIGGER outbox_message_check
    BEFORE INSERT ON outbox_message
    FOR EACH ROW EXECUTE FUNCTION outbox_message_check();

-- Dead letters: put one back into the outbox (it is published after the
-- messages already waiting), or drop it for good.
--
-- SECURITY DEFINER, so that an operator needs EXECUTE only, not the right to
-- delete dead letters or write any row into the outbox.  Their SQL-standard
-- bodies are resolved when they are created, so the caller's search_path
-- cannot redirect them.
CREATE FUNCTION outbox_requeue(dead_letter_id bigint)
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

COMMENT ON FUNCTION outbox_requeue(bigint) IS
    'Move a dead letter back into the outbox; returns its new outbox id, or NULL if there is no such dead letter';

CREATE FUNCTION outbox_discard(dead_letter_id bigint)
RETURNS boolean
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER
BEGIN ATOMIC
    WITH discarded AS (
        DELETE FROM outbox_dead_letter WHERE id OPERATOR(pg_catalog.=) dead_letter_id RETURNING 1
    )
    SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 0 FROM discarded;
END;

COMMENT ON FUNCTION outbox_discard(bigint) IS
    'Delete a dead letter for good; returns whether it existed';

-- One row per topic that has messages waiting, retrying, kept as sent, or
-- dead-lettered.
CREATE VIEW outbox_status AS
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

-- The workers, one per database served, as their shared memory shows them.
CREATE FUNCTION outbox_worker_status(
    OUT worker_id integer,
    OUT database text,
    OUT pid integer,
    OUT state text,
    OUT brokers text,
    OUT brokers_reachable boolean,
    OUT started_at timestamptz,
    OUT published bigint,
    OUT failed bigint,
    OUT dead_lettered bigint,
    OUT last_publish_at timestamptz,
    OUT last_error text,
    OUT last_error_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_worker_status'
LANGUAGE C STRICT VOLATILE;

CREATE VIEW outbox_worker AS SELECT * FROM outbox_worker_status();

-- The launcher, which starts a worker per database: the budget it has
-- (outbox.max_workers), how much of it is used, and the databases that
-- have the extension and wait for a worker.
CREATE FUNCTION outbox_launcher_status(
    OUT pid integer,
    OUT started_at timestamptz,
    OUT max_workers integer,
    OUT workers integer,
    OUT databases_waiting integer,
    OUT waiting text[],
    OUT last_error text,
    OUT last_error_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_launcher_status'
LANGUAGE C STRICT VOLATILE;

CREATE VIEW outbox_launcher AS SELECT * FROM outbox_launcher_status();

-- A fault drill: the worker's producer fails fatally during the next batch,
-- as a real fatal error would; the worker rebuilds it and loses nothing.
CREATE FUNCTION outbox_simulate_fatal_error()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_simulate_fatal_error'
LANGUAGE C STRICT VOLATILE;

REVOKE ALL ON FUNCTION outbox_simulate_fatal_error() FROM PUBLIC;

-- Privileges.  Tables, views and the sequence are granted to no one, and
-- no function keeps the EXECUTE that PUBLIC gets by default: so by default
-- only the owner may enqueue, requeue, discard, read payloads or read the
-- views.  The README gives the GRANTs for an application, a monitoring and
-- an operator role.  A view reads its tables with its owner's rights, but
-- the functions it calls need the EXECUTE of whoever queries it: so a
-- monitoring role gets outbox_worker_status() and outbox_launcher_status()
-- as well as the views.
-- Nothing is granted to pg_monitor, which also reads every session's query
-- text in pg_stat_activity, payloads included.
REVOKE EXECUTE ON FUNCTION
    outbox_enqueue(text, jsonb, text, jsonb),
    outbox_enqueue(text, text, text, jsonb),
    outbox_enqueue(text, bytea, text, jsonb),
    outbox_message_check(),
    outbox_requeue(bigint),
    outbox_discard(bigint),
    outbox_worker_status(),
    outbox_launcher_status()
FROM PUBLIC;

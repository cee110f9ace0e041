-- outbox 0.10.0: the transactional outbox, and the inbox that consumes.
--
-- An application writes its business rows and calls outbox_enqueue() (or
-- INSERTs into outbox_message) in the same transaction.  The outbox
-- background worker publishes each committed row to Kafka and then deletes
-- it, keeps it as 'sent' (outbox.sent_retention), schedules a retry, or moves
-- it to outbox_dead_letter.  On the consuming side, inbox_subscribe() has
-- the inbox worker apply each Kafka message once, in the handler's
-- transaction.
--
-- Every operator and function below is named with its schema, pg_catalog,
-- so that what an expression binds to never depends on what other roles
-- created in the schemas on the path when the extension was created.

\echo Use "CREATE EXTENSION outbox" to load this file. \quit

-- A message's message_id: a UUID of version 7, time first, so that the ids
-- of messages enqueued one after the other sort near each other (a
-- consumer's B-tree of the ids it received grows at its right edge).  For
-- everyone: a role that INSERTs into outbox_message evaluates it as the
-- column's default.
CREATE FUNCTION outbox_uuid_v7()
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_uuid_v7'
LANGUAGE C VOLATILE PARALLEL SAFE;

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
    message_id      uuid NOT NULL DEFAULT outbox_uuid_v7(),
    topic           text NOT NULL,
    key             text,
    payload         bytea,      -- NULL only for a tombstone, from outbox_capture()
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
    segment         smallint NOT NULL,
    target_partition integer
                    CONSTRAINT outbox_message_target_partition_check
                    CHECK (target_partition OPERATOR(pg_catalog.>=) 0)
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
    payload     bytea,
    headers     jsonb,
    attempts    integer NOT NULL,
    created_at  timestamptz NOT NULL,
    failed_at   timestamptz NOT NULL DEFAULT pg_catalog.now(),
    error       text NOT NULL,
    target_partition integer
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
-- They check that the caller may publish to the topic (see Topic grants,
-- below), then write the message as the extension's owner, as a SECURITY
-- DEFINER function would (they are not one, so that the grant checked is
-- the caller's): EXECUTE and a topic grant let a role enqueue.  Such a role
-- needs no privilege on outbox_message: it cannot read the outbox, nor set
-- a message's id, message_id, state or attempts.  Writing as the owner is
-- safe without a SET search_path clause: the one statement they run names
-- outbox_message with its schema, takes its values as parameters of the
-- columns' own types, and everything else it runs (the defaults, the
-- constraints, the trigger) was bound when the extension was created, so
-- the caller's search_path cannot redirect any of it.
CREATE FUNCTION outbox_enqueue(topic text, payload jsonb,
                               key text DEFAULT NULL, headers jsonb DEFAULT NULL,
                               "partition" integer DEFAULT NULL,
                               deliver_after interval DEFAULT NULL,
                               deliver_at timestamptz DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_enqueue_jsonb'
LANGUAGE C VOLATILE;

CREATE FUNCTION outbox_enqueue(topic text, payload text,
                               key text DEFAULT NULL, headers jsonb DEFAULT NULL,
                               "partition" integer DEFAULT NULL,
                               deliver_after interval DEFAULT NULL,
                               deliver_at timestamptz DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_enqueue_bytes'
LANGUAGE C VOLATILE;

CREATE FUNCTION outbox_enqueue(topic text, payload bytea,
                               key text DEFAULT NULL, headers jsonb DEFAULT NULL,
                               "partition" integer DEFAULT NULL,
                               deliver_after interval DEFAULT NULL,
                               deliver_at timestamptz DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_enqueue_bytes'
LANGUAGE C VOLATILE;

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

-- The error of outbox_requeue() and outbox_discard() given an id that no
-- dead letter has (SQLSTATE P0002, no_data_found): it never returns.  Only
-- they call it, as the extension's owner; no EXECUTE for PUBLIC.
CREATE FUNCTION outbox_no_dead_letter(dead_letter_id bigint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_no_dead_letter'
LANGUAGE C VOLATILE STRICT;

-- Dead letters: put one back into the outbox (it is published after the
-- messages already waiting), or drop it for good.  An id that no dead
-- letter has is an error, not a quiet NULL or false: a mistyped id, or one
-- requeued or discarded meanwhile, says so.
--
-- SECURITY DEFINER, so that an operator needs EXECUTE only, not the right to
-- delete dead letters or write any row into the outbox.  Their SQL-standard
-- bodies are resolved when they are created, so the caller's search_path
-- cannot redirect them.  COALESCE calls outbox_no_dead_letter() only when
-- nothing was deleted.
CREATE FUNCTION outbox_requeue(dead_letter_id bigint)
RETURNS bigint
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER
BEGIN ATOMIC
    WITH requeued AS (
        DELETE FROM outbox_dead_letter WHERE id OPERATOR(pg_catalog.=) dead_letter_id
        RETURNING message_id, topic, key, payload, headers, created_at, target_partition
    ), inserted AS (
        INSERT INTO outbox_message (message_id, topic, key, payload, headers, created_at, target_partition)
        SELECT message_id, topic, key, payload, headers, created_at, target_partition FROM requeued
        RETURNING id
    )
    SELECT coalesce((SELECT id FROM inserted), outbox_no_dead_letter(dead_letter_id));
END;

COMMENT ON FUNCTION outbox_requeue(bigint) IS
    'Move a dead letter back into the outbox; returns its new outbox id; an id no dead letter has is an error (P0002)';

CREATE FUNCTION outbox_discard(dead_letter_id bigint)
RETURNS boolean
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER
BEGIN ATOMIC
    WITH discarded AS (
        DELETE FROM outbox_dead_letter WHERE id OPERATOR(pg_catalog.=) dead_letter_id RETURNING true AS existed
    )
    SELECT coalesce((SELECT existed FROM discarded),
                    outbox_no_dead_letter(dead_letter_id) IS NULL);
END;

COMMENT ON FUNCTION outbox_discard(bigint) IS
    'Delete a dead letter for good; returns true; an id no dead letter has is an error (P0002)';

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
CREATE VIEW outbox_status AS
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
    outbox_enqueue(text, jsonb, text, jsonb, integer, interval, timestamptz),
    outbox_enqueue(text, text, text, jsonb, integer, interval, timestamptz),
    outbox_enqueue(text, bytea, text, jsonb, integer, interval, timestamptz),
    outbox_message_check(),
    outbox_requeue(bigint),
    outbox_discard(bigint),
    outbox_no_dead_letter(bigint),
    outbox_worker_status(),
    outbox_launcher_status()
FROM PUBLIC;

-- The inbox: the consuming side.  A subscription names Kafka topics and a
-- handler; the database's inbox worker reads the topics and calls the
-- handler for each message in the transaction that records the message as
-- received, so that the handler's writes and that record commit together or
-- not at all.  The offsets are kept here, not in Kafka: after any crash the
-- worker reads on from the first message not committed.

-- What a handler gets: one message.
CREATE TYPE inbox_message AS (
    subscription text,
    topic        text,
    "partition"  integer,
    "offset"     bigint,
    key          text,
    headers      jsonb,
    payload      bytea,
    message_id   uuid,
    "timestamp"  timestamptz
);

COMMENT ON TYPE inbox_message IS
    'A Kafka message as an inbox handler gets it; message_id is its outbox-message-id header, if it has one';

-- (m).payload_jsonb and (m).payload_text: the payload, read as UTF-8.
-- STABLE, as convert_from() is: so that they are inlined into the
-- handler's statement, not called as functions.
CREATE FUNCTION payload_jsonb(m inbox_message)
RETURNS jsonb
LANGUAGE sql STABLE STRICT PARALLEL SAFE
RETURN pg_catalog.convert_from((m).payload, 'UTF8')::pg_catalog.jsonb;

CREATE FUNCTION payload_text(m inbox_message)
RETURNS text
LANGUAGE sql STABLE STRICT PARALLEL SAFE
RETURN pg_catalog.convert_from((m).payload, 'UTF8');

-- The subscriptions.  A subscription is bound to one function, handler_oid,
-- when it is made: the worker calls that function only, and only while its
-- signature is still handler's (the signature, schema-qualified, as it was
-- when subscribing), so that a function dropped and made again under the
-- same name, by whoever may create in its schema, is never called; the
-- subscription waits instead, saying why.  subscribed_by is the role that
-- called inbox_subscribe(): it must stay a member of run_as.  A dump
-- restores handler_oid as it was; inbox_subscription_bind() binds a
-- restored row again to the function its signature names then.
-- handler_bound_in is the system identifier of the cluster where
-- handler_oid was bound (see the section on it below).
CREATE TABLE inbox_subscription (
    name          text PRIMARY KEY
                  CHECK (name OPERATOR(pg_catalog.<>) ''),
    topics        text[] NOT NULL
                  CHECK (pg_catalog.cardinality(topics) OPERATOR(pg_catalog.>) 0),
    handler       text NOT NULL,
    run_as        regrole NOT NULL,
    max_attempts  integer CHECK (max_attempts OPERATOR(pg_catalog.>) 0),
    start_from    text NOT NULL
                  CHECK (start_from OPERATOR(pg_catalog.=) ANY ('{earliest,now}'::text[])),
    search_path   text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT pg_catalog.now(),
    handler_oid   oid NOT NULL,
    subscribed_by regrole NOT NULL,
    handler_bound_in bigint NOT NULL
);

COMMENT ON TABLE inbox_subscription IS
    'Inbox subscriptions: see inbox_subscribe() and inbox_unsubscribe()';

-- Where each subscription's handler_oid was bound.  pg_upgrade gives every
-- function a new oid, and so does a restore from a dump: an oid bound in
-- another cluster names no function here, or another one.  So each row
-- records handler_bound_in, the system identifier of the cluster that bound
-- it (pg_control_system(): initdb makes a new one, and so pg_upgrade's new
-- cluster has one of its own; a standby and a base backup keep their
-- primary's).  The inbox worker binds a row bound in another cluster again,
-- before its next batch, to the function its handler signature names there
-- (0 if none), and says so in the server's log.
--
-- A handler_oid of 0 means the handler was dropped (the worker stores 0
-- when it finds the function gone): it is never bound again by name, here
-- or by the worker, since a function made since under the dropped one's
-- name is not the function the subscription was checked with.
--
-- A row inserted (inbox_subscribe()'s, bound already; a restore's, whose
-- oids are the dumped database's) is bound to the function its handler
-- names, unless its handler_oid is 0, and recorded as bound in this cluster.
CREATE FUNCTION inbox_subscription_bind()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.handler_oid OPERATOR(pg_catalog.<>) 0::pg_catalog.oid THEN
        NEW.handler_oid := coalesce(pg_catalog.to_regprocedure(NEW.handler)::pg_catalog.oid,
                                    0::pg_catalog.oid);
    END IF;
    NEW.handler_bound_in := (SELECT c.system_identifier FROM pg_catalog.pg_control_system() c);
    RETURN NEW;
END
$$;

REVOKE EXECUTE ON FUNCTION inbox_subscription_bind() FROM PUBLIC;

CREATE TRIGGER inbox_subscription_bind BEFORE INSERT ON inbox_subscription
    FOR EACH ROW EXECUTE FUNCTION inbox_subscription_bind();

-- Where each partition is read from next: the offset after the last message
-- received, committed with the effects of the messages before it.
CREATE TABLE inbox_offset (
    subscription     text NOT NULL REFERENCES inbox_subscription ON DELETE CASCADE,
    topic            text NOT NULL,
    "partition"      integer NOT NULL,
    next_offset      bigint NOT NULL,
    high_watermark   bigint,
    last_applied_at  timestamptz,
    PRIMARY KEY (subscription, topic, "partition")
);

-- The outbox-message-id of every message received, to apply a message that
-- comes twice (a producer that crashed after Kafka took its batch) once.
-- Kept outbox.inbox_dedup_retention.  No foreign key: a check per message
-- would cost more than the row; inbox_unsubscribe() deletes them.  The id
-- leads the key, so that a look into it compares ids, not the subscription
-- name they nearly all share.
CREATE TABLE inbox_received (
    subscription  text NOT NULL,
    message_id    uuid NOT NULL,
    received_at   timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (message_id, subscription)
);

CREATE INDEX inbox_received_at ON inbox_received USING brin (received_at);

-- Messages received and not yet applied: a handler failed on them (their
-- next_attempt_at says when they are tried again), or they wait behind an
-- earlier message of their key that did (next_attempt_at NULL).  id is the
-- order they were received in.
CREATE TABLE inbox_retry (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subscription     text NOT NULL REFERENCES inbox_subscription ON DELETE CASCADE,
    run_as           regrole NOT NULL,
    topic            text NOT NULL,
    "partition"      integer NOT NULL,
    "offset"         bigint NOT NULL,
    key              text,
    headers          jsonb,
    payload          bytea,
    message_id       uuid,
    "timestamp"      timestamptz,
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    received_at      timestamptz NOT NULL DEFAULT pg_catalog.now(),
    failed_at        timestamptz,
    sqlstate         text,
    error            text,
    error_context    text
);

CREATE INDEX inbox_retry_key ON inbox_retry (subscription, topic, key, id);
CREATE INDEX inbox_retry_due ON inbox_retry (subscription, next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;

-- Messages given up on after max_attempts failed attempts, with the last
-- error; see inbox_requeue() and inbox_discard().
CREATE TABLE inbox_dead_letter (
    id             bigint PRIMARY KEY,
    subscription   text NOT NULL,
    run_as         regrole NOT NULL,
    topic          text NOT NULL,
    "partition"    integer NOT NULL,
    "offset"       bigint NOT NULL,
    key            text,
    headers        jsonb,
    payload        bytea,
    message_id     uuid,
    "timestamp"    timestamptz,
    attempts       integer NOT NULL,
    received_at    timestamptz NOT NULL,
    failed_at      timestamptz NOT NULL DEFAULT pg_catalog.now(),
    sqlstate       text NOT NULL,
    error          text NOT NULL,
    error_context  text
);

COMMENT ON TABLE inbox_dead_letter IS
    'Inbox messages given up on, with the last error; see inbox_requeue() and inbox_discard()';

CREATE INDEX inbox_dead_letter_subscription ON inbox_dead_letter (subscription);

-- A role granted SELECT on these (the README's subscriber role) sees the
-- rows of its own subscriptions only: a handler, which runs as its
-- subscription's role, never sees another's messages.
ALTER TABLE inbox_retry ENABLE ROW LEVEL SECURITY;
ALTER TABLE inbox_dead_letter ENABLE ROW LEVEL SECURITY;
CREATE POLICY inbox_retry_own ON inbox_retry
    USING (pg_catalog.pg_has_role(run_as::pg_catalog.oid, 'MEMBER'));
CREATE POLICY inbox_dead_letter_own ON inbox_dead_letter
    USING (pg_catalog.pg_has_role(run_as::pg_catalog.oid, 'MEMBER'));

SELECT pg_catalog.pg_extension_config_dump('inbox_subscription', '');
SELECT pg_catalog.pg_extension_config_dump('inbox_offset', '');
SELECT pg_catalog.pg_extension_config_dump('inbox_received', '');
SELECT pg_catalog.pg_extension_config_dump('inbox_retry', '');
SELECT pg_catalog.pg_extension_config_dump('inbox_dead_letter', '');
-- And the position of inbox_retry's identity sequence: a member of the
-- extension, whose position pg_dump would otherwise leave out, so that a
-- restored database handed out the restored retries' and dead letters'
-- ids again (a dead letter's id is its retry's).
SELECT pg_catalog.pg_extension_config_dump(
    pg_catalog.pg_get_serial_sequence('inbox_retry', 'id')::pg_catalog.regclass, '');

-- Subscribing, and the dead letters.  Not SECURITY DEFINER: each checks
-- who calls it (a subscription's role, or a member of it) and then writes
-- the tables as the extension's owner.  No EXECUTE for PUBLIC: a role may
-- subscribe once granted EXECUTE on inbox_subscribe().
CREATE FUNCTION inbox_subscribe(name text, topics text[], handler regprocedure,
                                max_attempts integer DEFAULT NULL,
                                start_from text DEFAULT 'earliest',
                                run_as regrole DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'inbox_subscribe'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION inbox_subscribe(text, text[], regprocedure, integer, text, regrole) IS
    'Subscribe: the inbox worker calls handler(inbox_message) for each message of the topics, as run_as';

CREATE FUNCTION inbox_unsubscribe(name text, discard_pending boolean DEFAULT false)
RETURNS void
AS 'MODULE_PATHNAME', 'inbox_unsubscribe'
LANGUAGE C VOLATILE;

COMMENT ON FUNCTION inbox_unsubscribe(text, boolean) IS
    'Drop a subscription, its offsets and received ids; with discard_pending, its retries and dead letters too';

CREATE FUNCTION inbox_requeue(dead_letter_id bigint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'inbox_requeue'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION inbox_requeue(bigint) IS
    'Put an inbox dead letter back to be applied again, after the messages of its key waiting; returns its new id; an id no dead letter has is an error (P0002)';

CREATE FUNCTION inbox_discard(dead_letter_id bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'inbox_discard'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION inbox_discard(bigint) IS
    'Delete an inbox dead letter for good; returns true; an id no dead letter has is an error (P0002)';

-- The inbox worker of this database, as its shared memory shows it.
CREATE FUNCTION inbox_worker_status(
    OUT pid integer,
    OUT state text,
    OUT started_at timestamptz,
    OUT applied bigint,
    OUT duplicates bigint,
    OUT failed bigint,
    OUT dead_lettered bigint,
    OUT last_applied_at timestamptz,
    OUT last_error text,
    OUT last_error_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'inbox_worker_status'
LANGUAGE C STRICT VOLATILE;

CREATE VIEW inbox_worker AS SELECT * FROM inbox_worker_status();

-- One row per subscription and partition: where it reads, how far behind
-- the broker it is (as of its last batch), what waits to retry and what
-- was given up on.  No payload.  A topic of a subscription with no
-- partition known yet (the topic is missing, or the worker has not read it
-- yet) has one row, its partition, offsets and lag NULL, so that a
-- subscription that waits shows, with the worker's state and last error
-- saying why.
CREATE VIEW inbox_status AS
WITH retry AS (
    SELECT subscription, topic, "partition", pg_catalog.count(*) AS retrying
    FROM inbox_retry GROUP BY 1, 2, 3
), dead AS (
    SELECT subscription, topic, "partition", pg_catalog.count(*) AS dead_letters
    FROM inbox_dead_letter GROUP BY 1, 2, 3
), positions AS (
    SELECT subscription, topic, "partition", next_offset, high_watermark, last_applied_at
    FROM inbox_offset
    UNION ALL
    SELECT s.name, t.topic, NULL::integer, NULL::bigint, NULL::bigint, NULL::timestamptz
    FROM inbox_subscription s, pg_catalog.unnest(s.topics) AS t(topic)
    WHERE NOT EXISTS (SELECT FROM inbox_offset k
                      WHERE k.subscription OPERATOR(pg_catalog.=) s.name
                        AND k.topic OPERATOR(pg_catalog.=) t.topic)
)
SELECT o.subscription,
       o.topic,
       o."partition",
       o.next_offset,
       o.high_watermark,
       CASE WHEN o.next_offset IS NOT NULL
            THEN GREATEST(o.high_watermark OPERATOR(pg_catalog.-) o.next_offset, 0::bigint)
       END AS lag,
       coalesce(r.retrying, 0::bigint)     AS retrying,
       coalesce(d.dead_letters, 0::bigint) AS dead_letters,
       o.last_applied_at,
       w.state       AS worker_state,
       w.last_error  AS worker_last_error
FROM positions o
LEFT JOIN retry r ON r.subscription OPERATOR(pg_catalog.=) o.subscription
                 AND r.topic OPERATOR(pg_catalog.=) o.topic
                 AND r."partition" OPERATOR(pg_catalog.=) o."partition"
LEFT JOIN dead d ON d.subscription OPERATOR(pg_catalog.=) o.subscription
                AND d.topic OPERATOR(pg_catalog.=) o.topic
                AND d."partition" OPERATOR(pg_catalog.=) o."partition"
LEFT JOIN inbox_worker_status() w ON true
ORDER BY 1, 2, 3;

REVOKE EXECUTE ON FUNCTION
    inbox_subscribe(text, text[], regprocedure, integer, text, regrole),
    inbox_unsubscribe(text, boolean),
    inbox_requeue(bigint),
    inbox_discard(bigint),
    inbox_worker_status()
FROM PUBLIC;

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

-- ---------------------------------------------------------------------------
-- Topic grants: which roles may publish to (enqueue to) and subscribe to
-- which topics.
--
-- The extension's owner gives and takes them with outbox_grant_topic() and
-- outbox_revoke_topic(); outbox_topic_grants lists them.  A topic pattern
-- that ends in * is a prefix ('orders.*' grants 'orders.eu'; '*' alone,
-- every topic), as Kafka's PREFIXED resource pattern; any other is one
-- topic, as Kafka's LITERAL.  Checked, as the role doing it (or a role whose
-- privileges it has), at every enqueue (outbox_enqueue(), an INSERT INTO
-- outbox_message, a captured table's insert), at inbox_subscribe() (the
-- caller and run_as) and before each inbox batch (run_as); superusers and
-- the extension's owner need none.
-- ---------------------------------------------------------------------------

-- The grants.  By regrole, so that a dump holds the roles' names.  Written
-- by the functions below as the extension's owner; granted to no one.
CREATE TABLE outbox_topic_grant (
    role           regrole NOT NULL,
    topic_pattern  text NOT NULL,
    privilege      text NOT NULL
                   CONSTRAINT outbox_topic_grant_privilege_check
                   CHECK (privilege OPERATOR(pg_catalog.=) ANY (ARRAY['publish', 'subscribe'])),
    granted_by     regrole NOT NULL,
    granted_at     timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (role, topic_pattern, privilege)
);

COMMENT ON TABLE outbox_topic_grant IS
    'Who may publish to and subscribe to which topics: see outbox_grant_topic() and outbox_revoke_topic()';

SELECT pg_catalog.pg_extension_config_dump('outbox_topic_grant', '');

-- Each backend keeps the grants it read; a change of the table, however
-- made, tells every backend to read them again.  No EXECUTE for PUBLIC.
CREATE FUNCTION outbox_topic_grant_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'outbox_topic_grant_changed'
LANGUAGE C;

CREATE TRIGGER outbox_topic_grant_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON outbox_topic_grant
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_topic_grant_changed();

-- Not SECURITY DEFINER: they write the table as the extension's owner,
-- and record who called.  No EXECUTE for PUBLIC: the extension's owner
-- (or a superuser) gives and takes grants.
CREATE FUNCTION outbox_grant_topic(role regrole, topic text, privilege text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_grant_topic'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION outbox_grant_topic(regrole, text, text) IS
    'Let a role publish (''publish'') or subscribe (''subscribe'') to a topic, or to every topic of a prefix (''orders.*''); returns whether the grant is new';

CREATE FUNCTION outbox_revoke_topic(role regrole, topic text, privilege text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'outbox_revoke_topic'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION outbox_revoke_topic(regrole, text, text) IS
    'Take back a grant of outbox_grant_topic(), given with the same pattern; returns whether there was one';

CREATE VIEW outbox_topic_grants AS
SELECT role,
       topic_pattern,
       CASE WHEN pg_catalog."right"(topic_pattern, 1) OPERATOR(pg_catalog.=) '*'
            THEN 'prefixed' ELSE 'literal' END AS pattern_type,
       privilege,
       granted_by,
       granted_at
FROM outbox_topic_grant
ORDER BY role::pg_catalog.text COLLATE "C", topic_pattern COLLATE "C", privilege COLLATE "C";

REVOKE EXECUTE ON FUNCTION
    outbox_topic_grant_changed(),
    outbox_grant_topic(regrole, text, text),
    outbox_revoke_topic(regrole, text, text)
FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- Exactly-once publication (outbox.delivery = exactly_once).
-- ---------------------------------------------------------------------------

-- Where a publisher's next start reads its progress records from: the
-- transactional.id of this database's producer ('outbox-' || the cluster's
-- system identifier || '-' || the database's oid), the progress topic, and
-- the offset in its partition 0 below which every record of that id is
-- recorded here.  Written by the publisher alone (docs/exactly-once.md);
-- granted to no one, and not dumped: a restore elsewhere is another
-- database, with a transactional.id of its own.
CREATE TABLE outbox_exactly_once (
    transactional_id  text PRIMARY KEY,
    progress_topic    text NOT NULL,
    progress_offset   bigint NOT NULL,
    recorded_at       timestamptz NOT NULL
);

COMMENT ON TABLE outbox_exactly_once IS
    'With outbox.delivery = exactly_once: where the publisher''s next start reads the progress topic from';

-- A fault drill for exactly-once publication: the publishers pause at a
-- point of their next batch ('before_kafka_commit', 'after_kafka_commit',
-- 'after_recorded') for up to a minute, saying so in pg_stat_activity, so
-- that a crash can be placed there; 'none' lets a paused one go on.
CREATE FUNCTION outbox_simulate_pause(point text)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_simulate_pause'
LANGUAGE C STRICT VOLATILE;

REVOKE ALL ON FUNCTION outbox_simulate_pause(text) FROM PUBLIC;

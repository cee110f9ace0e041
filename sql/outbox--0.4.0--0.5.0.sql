-- outbox 0.4.0 to 0.5.0: the inbox.  inbox_subscribe() has the database's
-- inbox worker read Kafka topics and call a handler for each message, in
-- the transaction that records it as received; inbox_status and
-- inbox_worker show it.  New messages' message_id is a UUID of version 7
-- (outbox_uuid_v7()); every message stays as it is.
--
-- Install the new version's files and restart PostgreSQL first (the library
-- is preloaded), then run ALTER EXTENSION outbox UPDATE in each database
-- that has the extension.

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.5.0'" to load this file. \quit

-- A message's message_id: a UUID of version 7, time first, so that the ids
-- of messages enqueued one after the other sort near each other (a
-- consumer's B-tree of the ids it received grows at its right edge).  For
-- everyone: a role that INSERTs into outbox_message evaluates it as the
-- column's default.
CREATE FUNCTION outbox_uuid_v7()
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_uuid_v7'
LANGUAGE C VOLATILE PARALLEL SAFE;

ALTER TABLE outbox_message ALTER COLUMN message_id SET DEFAULT outbox_uuid_v7();

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

-- The subscriptions.  handler is kept as its signature, schema-qualified,
-- and resolved by the worker at each batch, so that it survives a dump and
-- restore (which gives functions new oids).
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
    created_at    timestamptz NOT NULL DEFAULT pg_catalog.now()
);

COMMENT ON TABLE inbox_subscription IS
    'Inbox subscriptions: see inbox_subscribe() and inbox_unsubscribe()';

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
    'Put an inbox dead letter back to be applied again, after the messages of its key waiting; returns its new id, or NULL if there is no such dead letter';

CREATE FUNCTION inbox_discard(dead_letter_id bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'inbox_discard'
LANGUAGE C VOLATILE STRICT;

COMMENT ON FUNCTION inbox_discard(bigint) IS
    'Delete an inbox dead letter for good; returns whether it existed';

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
-- was given up on.  No payload.
CREATE VIEW inbox_status AS
WITH retry AS (
    SELECT subscription, topic, "partition", pg_catalog.count(*) AS retrying
    FROM inbox_retry GROUP BY 1, 2, 3
), dead AS (
    SELECT subscription, topic, "partition", pg_catalog.count(*) AS dead_letters
    FROM inbox_dead_letter GROUP BY 1, 2, 3
)
SELECT o.subscription,
       o.topic,
       o."partition",
       o.next_offset,
       o.high_watermark,
       GREATEST(o.high_watermark OPERATOR(pg_catalog.-) o.next_offset, 0::bigint) AS lag,
       coalesce(r.retrying, 0::bigint)     AS retrying,
       coalesce(d.dead_letters, 0::bigint) AS dead_letters,
       o.last_applied_at,
       w.state       AS worker_state,
       w.last_error  AS worker_last_error
FROM inbox_offset o
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

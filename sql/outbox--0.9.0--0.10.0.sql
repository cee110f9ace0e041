-- outbox 0.9.0 to 0.10.0.
--
-- Install the new version's files and restart PostgreSQL first (the library
-- is preloaded), then run ALTER EXTENSION outbox UPDATE in each database
-- that has the extension.  Before a pg_upgrade to another PostgreSQL major,
-- update in the old cluster (see docs/operations.md, "Upgrading").

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.10.0'" to load this file. \quit

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

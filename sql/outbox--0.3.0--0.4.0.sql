-- outbox 0.3.0 to 0.4.0: a launcher starts a worker for every database that
-- has the extension (within outbox.max_workers), and outbox_launcher shows
-- it.  outbox_worker has one row per database served, as before per
-- worker; its columns are unchanged.
--
-- Install the new version's files and restart PostgreSQL first (the library
-- is preloaded), then run ALTER EXTENSION outbox UPDATE in each database
-- that has the extension.  No table changes: every message stays as it is.

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.4.0'" to load this file. \quit

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

-- As outbox_worker_status(): for the owner and whom the README's monitoring
-- role grants it to.
REVOKE EXECUTE ON FUNCTION outbox_launcher_status() FROM PUBLIC;

-- outbox 0.8.0 to 0.9.0.
--
-- Install the new version's files and restart PostgreSQL first (the library
-- is preloaded), then run ALTER EXTENSION outbox UPDATE in each database
-- that has the extension.  Before a pg_upgrade to another PostgreSQL major,
-- update in the old cluster (see docs/operations.md, "Upgrading").

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.9.0'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Inbox handlers across pg_upgrade and restores: handler_bound_in.
--
-- The subscriptions there are now were bound in this cluster (0.8.0 bound
-- them by oid at subscribe and at restore), so they are recorded as bound
-- here: the update does not bind any of them again by name.  One whose
-- function is gone is recorded as bound to none (0), as the worker now
-- records it when it finds its handler dropped.
-- ---------------------------------------------------------------------------
ALTER TABLE inbox_subscription ADD COLUMN handler_bound_in bigint;
UPDATE inbox_subscription s
    SET handler_bound_in = (SELECT c.system_identifier FROM pg_catalog.pg_control_system() c),
        handler_oid = CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_proc p
                                        WHERE p.oid OPERATOR(pg_catalog.=) s.handler_oid)
                           THEN s.handler_oid ELSE 0::pg_catalog.oid END;
ALTER TABLE inbox_subscription ALTER COLUMN handler_bound_in SET NOT NULL;

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
CREATE OR REPLACE FUNCTION inbox_subscription_bind()
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

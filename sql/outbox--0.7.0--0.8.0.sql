-- outbox 0.7.0 to 0.8.0.
--
-- Install the new version's files and restart PostgreSQL first (the library
-- is preloaded), then run ALTER EXTENSION outbox UPDATE in each database
-- that has the extension.

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.8.0'" to load this file. \quit

-- Inbox handlers bound to one function.  A subscription names its handler
-- by handler_oid, bound now to the function its signature names (0 if
-- none: the worker then says so, and the subscription waits), and records
-- who subscribed it in subscribed_by.  0.7.0 did not record that role; the
-- run_as role stands for it, which keeps each subscription running as it
-- did while run_as keeps the rights its handler needs.
ALTER TABLE inbox_subscription
    ADD COLUMN handler_oid oid,
    ADD COLUMN subscribed_by regrole;
UPDATE inbox_subscription
    SET handler_oid = coalesce(pg_catalog.to_regprocedure(handler)::pg_catalog.oid, 0::pg_catalog.oid),
        subscribed_by = run_as;
ALTER TABLE inbox_subscription
    ALTER COLUMN handler_oid SET NOT NULL,
    ALTER COLUMN subscribed_by SET NOT NULL;

CREATE FUNCTION inbox_subscription_bind()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.to_regprocedure(NEW.handler)::pg_catalog.oid
       IS DISTINCT FROM NEW.handler_oid THEN
        NEW.handler_oid := coalesce(pg_catalog.to_regprocedure(NEW.handler)::pg_catalog.oid,
                                    0::pg_catalog.oid);
    END IF;
    RETURN NEW;
END
$$;

REVOKE EXECUTE ON FUNCTION inbox_subscription_bind() FROM PUBLIC;

CREATE TRIGGER inbox_subscription_bind BEFORE INSERT ON inbox_subscription
    FOR EACH ROW EXECUTE FUNCTION inbox_subscription_bind();

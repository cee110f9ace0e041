-- outbox 0.7.0 to 0.8.0.
--
-- Install the new version's files and restart PostgreSQL first (the library
-- is preloaded), then run ALTER EXTENSION outbox UPDATE in each database
-- that has the extension.

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.8.0'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Topic grants (see the install script, outbox--0.8.0.sql).
--
-- outbox_enqueue() checks the caller's topic grant, so it is no longer
-- SECURITY DEFINER: it writes the message as the extension's owner itself.
-- ---------------------------------------------------------------------------
ALTER FUNCTION outbox_enqueue(text, jsonb, text, jsonb, integer, interval, timestamptz) SECURITY INVOKER;
ALTER FUNCTION outbox_enqueue(text, text, text, jsonb, integer, interval, timestamptz) SECURITY INVOKER;
ALTER FUNCTION outbox_enqueue(text, bytea, text, jsonb, integer, interval, timestamptz) SECURITY INVOKER;

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

-- So that applications keep working after the update: every role that may
-- enqueue today (EXECUTE on an outbox_enqueue(), or INSERT on outbox_message
-- or on a column of it, granted to it by name) may publish to every topic
-- ('*'), which outbox_topic_grants shows, for the DBA to narrow.  No
-- subscribe grant is made: a subscription whose role is no superuser waits,
-- and says why, until its role is granted its topics.
INSERT INTO outbox_topic_grant (role, topic_pattern, privilege, granted_by)
SELECT DISTINCT g.grantee::pg_catalog.regrole, '*', 'publish', e.extowner::pg_catalog.regrole
FROM pg_catalog.pg_extension e,
     LATERAL (SELECT a.grantee, a.privilege_type
              FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
              WHERE p.pronamespace OPERATOR(pg_catalog.=) e.extnamespace
                AND p.proname OPERATOR(pg_catalog.=) 'outbox_enqueue'
                AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
              UNION ALL
              SELECT a.grantee, a.privilege_type
              FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
              WHERE c.relnamespace OPERATOR(pg_catalog.=) e.extnamespace
                AND c.relname OPERATOR(pg_catalog.=) 'outbox_message'
                AND a.privilege_type OPERATOR(pg_catalog.=) 'INSERT'
              UNION ALL
              SELECT a.grantee, a.privilege_type
              FROM pg_catalog.pg_class c, pg_catalog.pg_attribute t,
                   pg_catalog.aclexplode(t.attacl) a
              WHERE c.relnamespace OPERATOR(pg_catalog.=) e.extnamespace
                AND c.relname OPERATOR(pg_catalog.=) 'outbox_message'
                AND t.attrelid OPERATOR(pg_catalog.=) c.oid
                AND a.privilege_type OPERATOR(pg_catalog.=) 'INSERT') g,
     pg_catalog.pg_authid r
WHERE e.extname OPERATOR(pg_catalog.=) 'outbox'
  AND r.oid OPERATOR(pg_catalog.=) g.grantee
  AND g.grantee OPERATOR(pg_catalog.<>) e.extowner
  AND NOT r.rolsuper;

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

-- Statements on databases pass through the extension's ProcessUtility hook
-- (src/serving.c), which must leave each as PostgreSQL runs it: with every
-- form of its options, for databases with and without the extension, and
-- refused as PostgreSQL refuses it to a role that may not run it.
\set SHOW_CONTEXT never
CREATE DATABASE outbox_db_default TEMPLATE DEFAULT;
ALTER DATABASE outbox_db_default RENAME TO outbox_db_renamed;
CREATE DATABASE outbox_db_copy TEMPLATE outbox_db_renamed;
ALTER DATABASE outbox_db_copy SET TABLESPACE pg_default;
DROP DATABASE outbox_db_copy;
DROP DATABASE IF EXISTS outbox_db_missing;
DROP DATABASE outbox_db_missing;
\echo :LAST_ERROR_SQLSTATE
CREATE ROLE outbox_db_stranger CREATEDB;
SET ROLE outbox_db_stranger;
DROP DATABASE outbox_db_renamed;
\echo :LAST_ERROR_SQLSTATE
ALTER DATABASE outbox_db_renamed RENAME TO outbox_db_stolen;
\echo :LAST_ERROR_SQLSTATE
CREATE DATABASE outbox_db_stolen TEMPLATE outbox_db_renamed;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT datname FROM pg_database WHERE datname LIKE 'outbox_db_%' ORDER BY 1;
DROP DATABASE outbox_db_renamed WITH (FORCE);
DROP ROLE outbox_db_stranger;

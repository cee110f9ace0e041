-- outbox 0.7.0 to 0.8.0.
--
-- Install the new version's files and restart PostgreSQL first (the library
-- is preloaded), then run ALTER EXTENSION outbox UPDATE in each database
-- that has the extension.

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.8.0'" to load this file. \quit

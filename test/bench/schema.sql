-- The bench's tables, beside the extension's outbox_message, in the bench
-- database.  test/bench/bench.py runs this once, after CREATE EXTENSION outbox.

-- B1's business table: the user that seed article 000's registration inserts.
CREATE TABLE app_user (
    id            bigserial PRIMARY KEY,
    email         text NOT NULL UNIQUE,
    name          text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now()
);

-- B1's plain INSERT: outbox_message's columns, defaults, constraints and
-- indexes, without its trigger (LIKE copies no trigger).
CREATE TABLE plain_message (LIKE outbox_message INCLUDING ALL);
-- Since 0.2.0 the outbox's trigger draws its ids, and LIKE copies no
-- trigger: the plain table draws them from an identity, as 0.1.0 did.
DO $$
BEGIN
    IF (SELECT attidentity FROM pg_attribute
         WHERE attrelid = 'plain_message'::regclass AND attname = 'id') = '' THEN
        ALTER TABLE plain_message ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY;
    END IF;
END
$$;

-- The seed poller's table: t_local_message of seed article 000, in
-- PostgreSQL's types.  Delivered rows stay, flipped to SENT.
CREATE TABLE seed_message (
    id              bigserial PRIMARY KEY,
    message_id      varchar(64) NOT NULL UNIQUE DEFAULT gen_random_uuid()::text,
    topic           varchar(100) NOT NULL,
    key             varchar(128),
    payload         text NOT NULL,
    status          varchar(20) NOT NULL DEFAULT 'PENDING',   -- PENDING, SENT, FAILED
    retry_count     integer NOT NULL DEFAULT 0,
    max_retry       integer NOT NULL DEFAULT 10,
    next_retry_time timestamp DEFAULT now(),
    error_msg       text,
    created_at      timestamp NOT NULL DEFAULT now(),
    update_time     timestamp NOT NULL DEFAULT now()
);
CREATE INDEX seed_message_status_next_retry ON seed_message (status, next_retry_time);

-- The tuned poller's table: what publishing needs and nothing else.  Rows are
-- deleted on ack, so it is a queue: vacuum and analyze it every 1,000 changed
-- rows, not after a fraction of a size that swings from empty to millions.
CREATE TABLE tuned_message (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id uuid NOT NULL DEFAULT gen_random_uuid(),
    topic      text NOT NULL,
    key        text,
    payload    text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
        autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 1000,
        autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 1000);

-- B3BG's background: accounts whose balances another pgbench updates while
-- the latency is measured.  bench.py fills it when B3BG runs.  Thresholds
-- of their own, so that autovacuum vacuums and analyzes it every 10,000
-- updates, whatever its size, during the measurement.
CREATE TABLE bg_account (
    id      integer PRIMARY KEY,
    balance bigint NOT NULL,
    pad     text NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
        autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 10000);

-- B1D: B1's messages as rows of Debezium's documented outbox table, one
-- published by outbox_capture(), one by Debezium (test/bench/debezium.sh).
CREATE TABLE captured_outbox (
    id            uuid NOT NULL PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb
);
CREATE TABLE dbz_outbox (LIKE captured_outbox INCLUDING ALL);

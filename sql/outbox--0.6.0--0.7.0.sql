-- outbox 0.6.0 to 0.7.0: an id that no dead letter has is an error
-- (SQLSTATE P0002) for outbox_requeue(), outbox_discard(), inbox_requeue()
-- and inbox_discard(), not a quiet NULL or false; inbox_status shows a
-- subscription's topic before any of its partitions is known.
--
-- Install the new version's files and restart PostgreSQL first (the library
-- is preloaded), then run ALTER EXTENSION outbox UPDATE in each database
-- that has the extension.

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.7.0'" to load this file. \quit

-- CREATE OR REPLACE keeps the functions' and the view's privileges, and
-- their initial privileges (pg_init_privs), as they were: what was granted
-- on them stays granted, and pg_dump still dumps it.

-- The error of outbox_requeue() and outbox_discard() given an id that no
-- dead letter has (SQLSTATE P0002, no_data_found): it never returns.  Only
-- they call it, as the extension's owner; no EXECUTE for PUBLIC.
CREATE FUNCTION outbox_no_dead_letter(dead_letter_id bigint)
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_no_dead_letter'
LANGUAGE C VOLATILE STRICT;

REVOKE EXECUTE ON FUNCTION outbox_no_dead_letter(bigint) FROM PUBLIC;

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
CREATE OR REPLACE FUNCTION outbox_requeue(dead_letter_id bigint)
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

CREATE OR REPLACE FUNCTION outbox_discard(dead_letter_id bigint)
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

-- inbox_requeue() and inbox_discard() raise the error in the library;
-- their comments say so.
COMMENT ON FUNCTION inbox_requeue(bigint) IS
    'Put an inbox dead letter back to be applied again, after the messages of its key waiting; returns its new id; an id no dead letter has is an error (P0002)';

COMMENT ON FUNCTION inbox_discard(bigint) IS
    'Delete an inbox dead letter for good; returns true; an id no dead letter has is an error (P0002)';

-- One row per subscription and partition: where it reads, how far behind
-- the broker it is (as of its last batch), what waits to retry and what
-- was given up on.  No payload.  A topic of a subscription with no
-- partition known yet (the topic is missing, or the worker has not read it
-- yet) has one row, its partition, offsets and lag NULL, so that a
-- subscription that waits shows, with the worker's state and last error
-- saying why.
CREATE OR REPLACE VIEW inbox_status AS
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

-- The views: outbox_status per topic, outbox_worker from shared memory.
TRUNCATE outbox_message, outbox_dead_letter;
SELECT * FROM outbox_status;

SELECT outbox_enqueue('a', 'x'::text, 'k') > 0 AS enqueued;
SELECT outbox_enqueue('a', 'y'::text, 'k') > 0 AS enqueued;
SELECT outbox_enqueue('b', 'z'::text) > 0 AS enqueued;
-- what the worker does to rows, by hand: one retrying, one kept as sent
UPDATE outbox_message SET state = 'retrying', attempts = 1, last_error = 'Local: Message timed out'
 WHERE id = (SELECT min(id) FROM outbox_message WHERE topic = 'a');
UPDATE outbox_message SET state = 'sent', sent_at = now(), kafka_partition = 0, kafka_offset = 7
 WHERE topic = 'b';
INSERT INTO outbox_dead_letter (id, message_id, topic, payload, attempts, created_at, error)
VALUES (1, gen_random_uuid(), 'c', 'x', 1, now(), 'Broker: Message size too large');

SELECT topic, waiting, retrying, oldest_waiting_age IS NOT NULL AS has_age,
       oldest_waiting_age >= interval '0' AS age_not_negative,
       dead_letters, sent_retained, last_sent_at IS NOT NULL AS has_last_sent,
       last_failed_at IS NOT NULL AS has_last_failed,
       -- nothing delivered here: no figures of the last minute
       sent_last_minute, sent_per_second, latency_p50 IS NULL AND latency_p99 IS NULL AS no_latency
  FROM outbox_status;

-- the worker runs here, pointed at a port where no broker listens: wait
-- until it has started and says so
DO $$
BEGIN
    FOR i IN 1..600 LOOP
        EXIT WHEN (SELECT state FROM outbox_worker) = 'waiting for brokers';
        PERFORM pg_sleep(0.1);
    END LOOP;
END
$$;
SELECT worker_id, database, pid > 0 AS has_pid, state, brokers, brokers_reachable,
       started_at <= now() AS started, published, failed, dead_lettered,
       last_publish_at, last_error IS NOT NULL AS has_last_error
  FROM outbox_worker;
-- one worker for this database, and the launcher that started it
SELECT backend_type, count(*) FROM pg_stat_activity
 WHERE backend_type IN ('outbox launcher', 'outbox worker')
 GROUP BY 1 ORDER BY 1;
SELECT pid > 0 AS has_pid, started_at <= now() AS started, max_workers, workers,
       databases_waiting, waiting, last_error
  FROM outbox_launcher;
-- and it claimed nothing while the brokers are unreachable: no attempt spent
SELECT topic, state, attempts FROM outbox_message ORDER BY id;

-- inbox_status: a subscription shows before any partition of its topics is
-- known (here no broker answers), one row per topic, its partition NULL
CREATE ROLE regress_inbox_subscriber;
CREATE FUNCTION regress_inbox_handler(m inbox_message) RETURNS void
LANGUAGE sql BEGIN ATOMIC END;
GRANT EXECUTE ON FUNCTION regress_inbox_handler(inbox_message) TO regress_inbox_subscriber;
SELECT outbox_grant_topic('regress_inbox_subscriber', 'no.such.topic', 'subscribe'),
       outbox_grant_topic('regress_inbox_subscriber', 'another.topic', 'subscribe');
SELECT inbox_subscribe('waiting', ARRAY['no.such.topic', 'another.topic'],
                       'regress_inbox_handler(inbox_message)', run_as => 'regress_inbox_subscriber');
SELECT subscription, topic, "partition", next_offset, high_watermark, lag, retrying,
       dead_letters, last_applied_at
  FROM inbox_status;
SELECT inbox_unsubscribe('waiting');
SELECT count(*) AS rows_left FROM inbox_status;
DROP FUNCTION regress_inbox_handler(inbox_message);
DROP ROLE regress_inbox_subscriber;

-- Dead letters: requeue puts a message back as a new pending row with the
-- same message_id; discard drops it.  (The worker that fills this table is
-- tested against real Kafka in test/t.)
TRUNCATE outbox_message;
INSERT INTO outbox_dead_letter (id, message_id, topic, key, payload, headers, attempts, created_at, error)
VALUES (1001, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'orders', 'o-1', 'one', '{"h": "1"}', 10,
        '2026-01-01 00:00:00+00', 'Broker: Message size too large'),
       (1002, 'b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12', 'orders', 'o-2', 'two', NULL, 1,
        '2026-01-01 00:00:01+00', 'Broker: Topic authorization failed');

SELECT topic, dead_letters FROM outbox_status;

SELECT outbox_requeue(1001) > 0 AS requeued;
SELECT message_id, topic, key, payload, headers, state, attempts, created_at
  FROM outbox_message;
SELECT id FROM outbox_dead_letter ORDER BY id;

-- An id that no dead letter has (one requeued or discarded already, one
-- never there) is an error, P0002 (no_data_found), with a hint; so for the
-- inbox's.
\set VERBOSITY default
SELECT outbox_requeue(1001) AS requeue_again;
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_discard(1002) AS discarded;
SELECT outbox_discard(1002) AS discard_again;
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_requeue(999999);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_discard(999999);
\echo :LAST_ERROR_SQLSTATE
SELECT inbox_requeue(999999);
\echo :LAST_ERROR_SQLSTATE
SELECT inbox_discard(999999);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS dead_letters_left FROM outbox_dead_letter;
SELECT topic, waiting, dead_letters FROM outbox_status;

-- Every dead letter at once, as the README's operator does it.
INSERT INTO outbox_dead_letter (id, message_id, topic, key, payload, attempts, created_at, error)
SELECT 2000 + i, outbox_uuid_v7(), 'bulk', 'b-' || i, 'bulk', 1, '2026-01-01 00:00:00+00', 'e'
  FROM generate_series(1, 3) i;
SELECT count(outbox_requeue(id)) AS requeued FROM outbox_dead_letter WHERE topic = 'bulk';
INSERT INTO outbox_dead_letter (id, message_id, topic, key, payload, attempts, created_at, error)
SELECT 3000 + i, outbox_uuid_v7(), 'bulk', 'b-' || i, 'bulk', 1, '2026-01-01 00:00:00+00', 'e'
  FROM generate_series(1, 3) i;
SELECT bool_and(outbox_discard(id)) AS discarded FROM outbox_dead_letter WHERE topic = 'bulk';
SELECT topic, waiting, dead_letters FROM outbox_status;

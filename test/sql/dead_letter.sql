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

SELECT outbox_requeue(1001) AS requeue_again;
SELECT outbox_discard(1002) AS discarded;
SELECT outbox_discard(1002) AS discard_again;
SELECT count(*) AS dead_letters_left FROM outbox_dead_letter;
SELECT topic, waiting, dead_letters FROM outbox_status;

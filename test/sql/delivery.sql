-- outbox_enqueue()'s partition, deliver_after and deliver_at, and the trace
-- context that goes into the headers, as the rows show them (no broker
-- here: test/t/204_delivery_options.pl shows what Kafka gets).
TRUNCATE outbox_message, outbox_dead_letter;

-- a partition of the caller's choice is kept with the row
SELECT outbox_enqueue('p', 'to 2'::text, 'k', partition => 2) > 0 AS enqueued;
SELECT outbox_enqueue('p', 'any'::text, 'k') > 0 AS enqueued;
SELECT encode(payload, 'escape') AS payload, target_partition FROM outbox_message ORDER BY id;

-- refused: a negative partition, both delays, a negative delay, an infinite time
SELECT outbox_enqueue('p', 'x'::text, partition => -1);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('p', 'x'::text, deliver_after => '1 minute', deliver_at => now());
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('p', 'x'::text, deliver_after => '-1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_enqueue('p', 'x'::text, deliver_at => 'infinity');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS nothing_more FROM outbox_message;

-- a delayed message waits as a retry does, not yet attempted, until its
-- time; one due in the past, or after zero, goes at once
TRUNCATE outbox_message;
SELECT outbox_enqueue('d', 'in an hour'::text, 'k', deliver_after => '1 hour') > 0 AS enqueued;
SELECT outbox_enqueue('d', 'at noon tomorrow'::text, 'j', deliver_at => date_trunc('day', now()) + interval '36 hours') > 0 AS enqueued;
SELECT outbox_enqueue('d', 'yesterday'::text, 'k', deliver_at => now() - interval '1 day') > 0 AS enqueued;
SELECT outbox_enqueue('d', 'after zero'::text, 'k', deliver_after => '0') > 0 AS enqueued;
SELECT encode(payload, 'escape') AS payload, state, attempts,
       next_attempt_at - clock_timestamp() BETWEEN interval '59 minutes' AND interval '61 minutes' AS in_an_hour,
       next_attempt_at = date_trunc('day', now()) + interval '36 hours' AS at_noon_tomorrow
  FROM outbox_message ORDER BY id;
SELECT topic, waiting, retrying, delayed FROM outbox_status WHERE topic = 'd';
-- a message not yet due is not waiting: it ages from its time on
SELECT outbox_enqueue('only.delayed', 'later'::text, deliver_after => '1 hour') > 0 AS enqueued;
SELECT delayed, oldest_waiting_age FROM outbox_status WHERE topic = 'only.delayed';
BEGIN;
UPDATE outbox_message SET next_attempt_at = now() - interval '1 minute' WHERE topic = 'only.delayed';
SELECT delayed, oldest_waiting_age = interval '1 minute' AS waiting_since_its_time FROM outbox_status WHERE topic = 'only.delayed';
COMMIT;

-- the trace context: a traceparent set for the transaction goes into the
-- headers of what it enqueues, with its tracestate; the message's own
-- headers win
TRUNCATE outbox_message;
BEGIN;
SET LOCAL outbox.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SET LOCAL outbox.tracestate = 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7';
SELECT outbox_enqueue('t', 'traced'::text) > 0 AS enqueued;
SELECT outbox_enqueue('t', 'own header'::text,
                      headers => '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "via": "app"}') > 0 AS enqueued;
INSERT INTO outbox_message (topic, payload, headers) VALUES ('t', 'inserted', '{"via": "insert"}');
COMMIT;
-- the next transaction has none
SELECT outbox_enqueue('t', 'after commit'::text) > 0 AS enqueued;
SELECT encode(payload, 'escape') AS payload, headers FROM outbox_message ORDER BY id;

-- a sqlcommenter comment at the end of the statement, URL-encoded
TRUNCATE outbox_message;
SELECT outbox_enqueue('t', 'commented'::text) > 0 AS enqueued /*traceparent='00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',tracestate='congo%3Dt61rcWkgMzE'*/;
-- one that does not end the statement, or whose traceparent is not W3C's, is not read
SELECT /*traceparent='00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'*/ outbox_enqueue('t', 'comment first'::text) > 0 AS enqueued;
SELECT outbox_enqueue('t', 'bad comment'::text) > 0 AS enqueued /*traceparent='00-00000000000000000000000000000000-00f067aa0ba902b7-01'*/;
-- the setting wins over a comment
BEGIN;
SET LOCAL outbox.traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00';
SELECT outbox_enqueue('t', 'set and commented'::text) > 0 AS enqueued /*traceparent='00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'*/;
COMMIT;
SELECT encode(payload, 'escape') AS payload, headers FROM outbox_message ORDER BY id;

-- values that are not W3C's are refused when set
SET outbox.traceparent = '00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01';
\echo :LAST_ERROR_SQLSTATE
SET outbox.traceparent = '00-00000000000000000000000000000000-00f067aa0ba902b7-01';
SET outbox.traceparent = 'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SET outbox.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra';
-- a later version may carry more fields
SET outbox.traceparent = '01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra';
SET outbox.tracestate = 'no equals sign';
\echo :LAST_ERROR_SQLSTATE
SET outbox.tracestate = 'a=1,b=2,c=3,d=4,e=5,f=6,g=7,h=8,i=9,j=10,k=11,l=12,m=13,n=14,o=15,p=16,q=17,r=18,s=19,t=20,u=21,v=22,w=23,x=24,y=25,z=26,aa=27,bb=28,cc=29,dd=30,ee=31,ff=32,gg=33';
RESET outbox.traceparent;
RESET outbox.tracestate;
TRUNCATE outbox_message;

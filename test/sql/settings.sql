-- outbox.kafka_properties: name=value pairs separated by semicolons.  An
-- item that is empty or only white space is skipped; any other must contain
-- '=', and its name (the text before the first '=', trimmed) must not be
-- empty; the value is the rest, trimmed.  ALTER SYSTEM runs the check, the
-- same one a reload runs, and applies nothing.  A refusal never repeats the
-- value, which may hold a secret (hunter2 below).  ECHO queries shows each
-- statement that \gexec runs.
\set VERBOSITY default
\set SHOW_CONTEXT never
\set ECHO queries

-- refused: an empty name, with or without white space around it; no '=';
-- one bad item beside a good one
SELECT format('ALTER SYSTEM SET outbox.kafka_properties = %L', value)
  FROM unnest(ARRAY[' =x', '=x', '  = ', 'linger.ms',
                    'sasl.password=hunter2; =x',
                    'sasl.password=hunter2; sasl.username']) AS value \gexec

-- accepted: white space around names and values, empty and blank items, a
-- value holding '=' (the name ends at the first), an empty value
SELECT format('ALTER SYSTEM SET outbox.kafka_properties = %L', value)
  FROM unnest(ARRAY[' linger.ms = 5 ; ; client.id = a=b ;', '', ' ', ';; ;',
                    'client.id=']) AS value \gexec

-- refused: a name librdkafka does not know, as a producer's property or a
-- topic's; the message names it (a name is no secret), never a value
SELECT format('ALTER SYSTEM SET outbox.kafka_properties = %L', value)
  FROM unnest(ARRAY['lingerms=5', 'sasl.password=hunter2; sasl.pasword=hunter2',
                    'linger.ms=5; compresion.codec=lz4']) AS value \gexec
-- the SQLSTATE of those refusals (psql before 18 keeps it across \gexec, 18 does not)
ALTER SYSTEM SET outbox.kafka_properties = 'compresion.codec=lz4';
\echo :LAST_ERROR_SQLSTATE

-- accepted: a producer's property, a topic's (acks, compression.codec,
-- message.timeout.ms), and one by another of its names (queue.buffering.max.ms
-- is linger.ms); the values are the worker's to try
SELECT format('ALTER SYSTEM SET outbox.kafka_properties = %L', value)
  FROM unnest(ARRAY['linger.ms=5; acks=all; compression.codec=lz4',
                    'message.timeout.ms=2000; queue.buffering.max.ms=5',
                    'plugin.library.paths=/nonexistent/library']) AS value \gexec

ALTER SYSTEM RESET outbox.kafka_properties;

-- outbox.max_batch_bytes: a size (kB without a unit), from 1kB to 1GB;
-- applied at reload, not settable in a session
SHOW outbox.max_batch_bytes;
-- (PostgreSQL words a range differently from major to major; the SQLSTATE is the same)
\set VERBOSITY sqlstate
SELECT format('ALTER SYSTEM SET outbox.max_batch_bytes = %L', value)
  FROM unnest(ARRAY['0', '1025MB']) AS value \gexec
\set VERBOSITY default
ALTER SYSTEM SET outbox.max_batch_bytes = '16 furlongs';
SELECT format('ALTER SYSTEM SET outbox.max_batch_bytes = %L', value)
  FROM unnest(ARRAY['1kB', '1GB', '4096']) AS value \gexec
SET outbox.max_batch_bytes = '1MB';
ALTER SYSTEM RESET outbox.max_batch_bytes;

-- outbox.synchronized_standby_slots: a list of replication slot names
-- (lower-case letters, digits and underscores; a longer name is truncated to
-- 63 characters, as identifiers are); applied at reload.  Whether the slots
-- exist, and are physical, is the worker's to say: the check cannot look
-- (it also runs in the postmaster), and a slot may be made later.
SHOW outbox.synchronized_standby_slots;
SELECT format('ALTER SYSTEM SET outbox.synchronized_standby_slots = %L', value)
  FROM unnest(ARRAY['"Standby"', 'standby-1', 'standby_1,,standby_2', '"standby_1',
                    'standby_1, "a b"']) AS value \gexec
SELECT format('ALTER SYSTEM SET outbox.synchronized_standby_slots = %L', value)
  FROM unnest(ARRAY['standby_1', ' standby_1 , Standby_2 ', 'no_such_slot',
                    repeat('s', 70), '']) AS value \gexec
SET outbox.synchronized_standby_slots = 'standby_1';
ALTER SYSTEM RESET outbox.synchronized_standby_slots;

-- outbox.kafka_properties: name=value pairs separated by semicolons.  An
-- item that is empty or only white space is skipped; any other must contain
-- '=', and its name (the text before the first '=', trimmed) must not be
-- empty; the value is the rest, trimmed.  ALTER SYSTEM runs the check, the
-- same one a reload runs, and applies nothing.  A refusal never repeats the
-- value, which may hold a secret: each is followed by a query that shows the
-- SQLSTATE of the ALTER SYSTEM and looks for the value in its message.
\set VERBOSITY default
\set SHOW_CONTEXT never

-- refused: an empty name, with or without white space around it
ALTER SYSTEM SET outbox.kafka_properties = ' =x';
SELECT :'SQLSTATE' AS sqlstate,
       strpos(:'LAST_ERROR_MESSAGE', ' =x') = 0 AS value_not_in_message;
ALTER SYSTEM SET outbox.kafka_properties = '=x';
SELECT :'SQLSTATE' AS sqlstate,
       strpos(:'LAST_ERROR_MESSAGE', '=x') = 0 AS value_not_in_message;
ALTER SYSTEM SET outbox.kafka_properties = '  = ';
SELECT :'SQLSTATE' AS sqlstate,
       strpos(:'LAST_ERROR_MESSAGE', '  = ') = 0 AS value_not_in_message;
-- refused: no '='
ALTER SYSTEM SET outbox.kafka_properties = 'linger.ms';
SELECT :'SQLSTATE' AS sqlstate,
       strpos(:'LAST_ERROR_MESSAGE', 'linger.ms') = 0 AS value_not_in_message;
-- one bad item refuses the whole setting, and the secret beside it stays out
-- of the message
ALTER SYSTEM SET outbox.kafka_properties = 'sasl.password=hunter2; =x';
SELECT :'SQLSTATE' AS sqlstate,
       strpos(:'LAST_ERROR_MESSAGE', 'hunter2') = 0 AS secret_not_in_message;
ALTER SYSTEM SET outbox.kafka_properties = 'sasl.password=hunter2; sasl.username';
SELECT :'SQLSTATE' AS sqlstate,
       strpos(:'LAST_ERROR_MESSAGE', 'hunter2') = 0 AS secret_not_in_message;

-- accepted: white space around names and values, empty and blank items, a
-- value holding '=' (the name ends at the first), an empty value
ALTER SYSTEM SET outbox.kafka_properties = ' linger.ms = 5 ; ; client.id = a=b ;';
ALTER SYSTEM SET outbox.kafka_properties = '';
ALTER SYSTEM SET outbox.kafka_properties = ' ';
ALTER SYSTEM SET outbox.kafka_properties = ';; ;';
ALTER SYSTEM SET outbox.kafka_properties = 'client.id=';

ALTER SYSTEM RESET outbox.kafka_properties;

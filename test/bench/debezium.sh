#!/usr/bin/env bash
# Debezium as its users run it, an optional peer for the benchmarks: a Kafka
# Connect 4.3 worker in standalone mode with the Debezium 3.6 PostgreSQL
# connector and its outbox EventRouter SMT, Maven Central jars on one classpath.
#
# usage: debezium.sh fetch|start|stop|pid|wait|drop
#   start   fetch (once), write the properties, start the worker, wait until the
#           connector's task is RUNNING (its slot and publication exist by then)
#   stop    SIGTERM, wait for the exit; SIGKILL after DEBEZIUM_STOP_WAIT (30 s)
#   pid     the worker JVM's pid: all of Debezium's CPU is in that one process
#   wait    wait until the task is RUNNING, or fail with its trace; the state:
#           curl 127.0.0.1:$DEBEZIUM_REST_PORT/connectors/outbox-debezium/status
#   drop    stop, drop the slot and the publication, forget the offsets
#   DEBEZIUM_DIR        offsets, properties, log, pid (default /tmp/outbox-debezium-$DEBEZIUM_REST_PORT)
#   DEBEZIUM_REST_PORT  Connect's REST port on 127.0.0.1 (default 18083)
#   KAFKA_BOOTSTRAP     the brokers (default 127.0.0.1:19592, test/bench/run's)
#   PGHOST              socket directory, for drop's psql (default /tmp/outbox-bench-$PGPORT)
#   PGPORT, PGDATABASE, PGUSER  (default 55600, bench, postgres); PGPASSWORD if set
#   DEBEZIUM_TABLES     table.include.list (default public.outboxevent)
#   DEBEZIUM_SLOT, DEBEZIUM_PUBLICATION  their names (default debezium_bench)
#   DEBEZIUM_ROUTER     more EventRouter options, "key=value;key=value" (default none)
#   DEBEZIUM_VALUE_CONVERTER  (default StringConverter: the payload's text)
#   DEBEZIUM_JVM        the JVM's options (default: what Kafka's connect-standalone.sh
#                       and kafka-run-class.sh give it, -Xms256M -Xmx2G and G1)
#   DEBEZIUM_WAIT       seconds start and wait give the task (default 120)
#
# TCP: the PostgreSQL JDBC driver (jdbc:postgresql://host:port/db) has no unix
# socket support of its own (junixsocket's jars and a socketFactory would add
# it; untried).  So Debezium connects to 127.0.0.1:$PGPORT: the cluster needs
# listen_addresses = '127.0.0.1', wal_level = logical, a free slot and sender.
#
# As shipped, nothing tuned.  The producer has what Connect gives every source
# task, acks=all, max.in.flight.requests.per.connection=1,
# enable.idempotence=false, unbounded retries, delivery.timeout.ms and
# max.block.ms, and the client's defaults, linger.ms=5, batch.size=16384, no
# compression.  Debezium's defaults: poll.interval.ms 500, max.batch.size 2048,
# lsn.flush.mode connector.  offset.flush.interval.ms=10000, as Kafka's sample
# connect-standalone.properties: Debezium confirms its LSN to the slot at each
# offset flush, so the slot holds about 10 s of WAL while Connect runs, and
# all WAL written while it is stopped (the next start reads it; drop ends that).
set -euo pipefail

DEBEZIUM_VERSION=3.6.1.Final
CONNECT_VERSION=4.3.0
DEBEZIUM_REST_PORT=${DEBEZIUM_REST_PORT:-18083}
DEBEZIUM_DIR=${DEBEZIUM_DIR:-/tmp/outbox-debezium-$DEBEZIUM_REST_PORT}
KAFKA_BOOTSTRAP=${KAFKA_BOOTSTRAP:-127.0.0.1:19592}
export PGPORT=${PGPORT:-55600} PGDATABASE=${PGDATABASE:-bench} PGUSER=${PGUSER:-postgres}
export PGHOST=${PGHOST:-/tmp/outbox-bench-$PGPORT}
DEBEZIUM_TABLES=${DEBEZIUM_TABLES:-public.outboxevent}
DEBEZIUM_SLOT=${DEBEZIUM_SLOT:-debezium_bench}
DEBEZIUM_PUBLICATION=${DEBEZIUM_PUBLICATION:-debezium_bench}
DEBEZIUM_VALUE_CONVERTER=${DEBEZIUM_VALUE_CONVERTER:-org.apache.kafka.connect.storage.StringConverter}
DEBEZIUM_JVM=${DEBEZIUM_JVM:--Xms256M -Xmx2G -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent}
DEBEZIUM_WAIT=${DEBEZIUM_WAIT:-120}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/outbox/debezium-$DEBEZIUM_VERSION-connect-$CONNECT_VERSION
LIBS=$CACHE/libs PIDFILE=$DEBEZIUM_DIR/connect.pid NAME=outbox-debezium
STATUS_URL=http://127.0.0.1:$DEBEZIUM_REST_PORT/connectors/$NAME/status
# The JVM as Kafka's scripts start Connect: Debezium measured as shipped.
# shellcheck disable=SC2206
JAVA=(java $DEBEZIUM_JVM -Djava.awt.headless=true
    -Dlog4j2.configurationFile="$DEBEZIUM_DIR/log4j2.xml" -cp "$LIBS/*")

say() { echo "debezium.sh: $*" >&2; }
die() { say "$*"; exit 1; }
need() {
    local cmd=$1; shift
    command -v "$cmd" >/dev/null || { say "installing $*"; apt-get install -y -q "$@" >&2; }
}

fetch() {
    [ -d "$LIBS" ] && return 0
    need mvn maven default-jre-headless
    mkdir -p "$CACHE"
    # Debezium leaves Kafka to the Connect it runs in (scope provided), Kafka
    # leaves logging to its distribution: log4j2, as broker.sh (connect-runtime
    # calls it too, for /admin/loggers).
    local gav g a v
    {
        echo '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        echo '  <groupId>outbox.test</groupId><artifactId>debezium-connect</artifactId><version>1</version>'
        echo '  <dependencies>'
        for gav in org.apache.kafka:{connect-runtime,connect-json,connect-transforms}:$CONNECT_VERSION \
            io.debezium:{debezium-connector-postgres,debezium-connect-plugins}:$DEBEZIUM_VERSION \
            org.apache.logging.log4j:{log4j-core,log4j-slf4j-impl}:2.24.3; do
            IFS=: read -r g a v <<<"$gav"
            echo "    <dependency><groupId>$g</groupId><artifactId>$a</artifactId><version>$v</version></dependency>"
        done
        echo '  </dependencies></project>'
    } >"$CACHE/pom.xml"
    say "fetching Debezium $DEBEZIUM_VERSION and Kafka Connect $CONNECT_VERSION jars into $LIBS"
    rm -rf "$LIBS.tmp"
    mvn -q -B -f "$CACHE/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$LIBS.tmp" >"$CACHE/mvn.out" 2>&1 ||
        { cat "$CACHE/mvn.out" >&2; die "mvn failed"; }
    mv "$LIBS.tmp" "$LIBS"
}

pid_of() {
    local pid
    pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
    tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q ConnectStandalone || return 1
    echo "$pid"
}

running() { pid_of >/dev/null; }
# Rewritten on every start, so that the variables apply to restarts.
write_config() {
    mkdir -p "$DEBEZIUM_DIR"
    cat >"$DEBEZIUM_DIR/worker.properties" <<EOF
bootstrap.servers=$KAFKA_BOOTSTRAP
listeners=http://127.0.0.1:$DEBEZIUM_REST_PORT
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=$DEBEZIUM_VALUE_CONVERTER
offset.storage.file.filename=$DEBEZIUM_DIR/offsets.dat
offset.flush.interval.ms=10000
# Every plugin here has ServiceLoader manifests: skip the 2 s classpath scan.
plugin.discovery=service_load
EOF
    local router="" option options
    IFS=';' read -ra options <<<"${DEBEZIUM_ROUTER:-}"
    for option in "${options[@]}"; do
        [ -z "$option" ] || router+="transforms.outbox.$option"$'\n'
    done
    cat >"$DEBEZIUM_DIR/connector.properties" <<EOF
name=$NAME
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
database.hostname=127.0.0.1
database.port=$PGPORT
database.user=$PGUSER
${PGPASSWORD:+database.password=$PGPASSWORD}
database.dbname=$PGDATABASE
topic.prefix=bench
plugin.name=pgoutput
slot.name=$DEBEZIUM_SLOT
publication.name=$DEBEZIUM_PUBLICATION
publication.autocreate.mode=filtered
table.include.list=$DEBEZIUM_TABLES
snapshot.mode=no_data
tombstones.on.delete=false
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=$DEBEZIUM_VALUE_CONVERTER
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
$router
EOF
    cat >"$DEBEZIUM_DIR/log4j2.xml" <<EOF
<Configuration status="warn" shutdownHook="disable">
  <Appenders><File name="file" fileName="$DEBEZIUM_DIR/connect.log">
    <PatternLayout pattern="[%d] %p %X{connector.context}%m (%c)%n"/></File></Appenders>
  <Loggers><Root level="info"><AppenderRef ref="file"/></Root></Loggers>
</Configuration>
EOF
}

log_tail() {
    local log=$DEBEZIUM_DIR/connect.log
    say "errors in $log, then the last lines of it and connect.out:"
    { grep -A1 -E '^\[[^]]*\] (ERROR|FATAL)' "$log" | tail -n 20
      tail -n 20 "$log" "$DEBEZIUM_DIR/connect.out"; } >&2 2>/dev/null || true
}

# The task's state and trace, NO_TASK before it has one (the connector's
# state when FAILED), nothing while the REST API does not answer.
task_state() {
    curl -sf --max-time 5 "$STATUS_URL" 2>/dev/null | jq -r '(.tasks[0] //
        if .connector.state == "FAILED" then .connector else {state: "NO_TASK"} end) as $s |
        $s.state, ($s.trace // empty)' 2>/dev/null || true
}

wait_running() {
    need jq jq; need curl curl
    local deadline=$((SECONDS + DEBEZIUM_WAIT)) status
    while :; do
        status=$(task_state)
        case ${status%%$'\n'*} in
        RUNNING) return 0 ;;
        FAILED) echo "${status#*$'\n'}" >&2; die "the connector or its task FAILED (above; $DEBEZIUM_DIR/connect.log)" ;;
        esac
        [ ! -f "$PIDFILE" ] || running || { log_tail; die "worker process exited"; }
        ((SECONDS < deadline)) || { log_tail; die "task not RUNNING after ${DEBEZIUM_WAIT}s (state: ${status%%$'\n'*})"; }
        sleep 0.5
    done
}

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
    if running; then say "already running (pid $(pid_of))"; return 0; fi
    port_taken "$DEBEZIUM_REST_PORT" && die "port $DEBEZIUM_REST_PORT is taken: stop that, or choose another DEBEZIUM_REST_PORT"
    fetch
    write_config
    # One log per run (the previous one kept), so errors shown are this run's.
    [ ! -f "$DEBEZIUM_DIR/connect.log" ] || mv "$DEBEZIUM_DIR/connect.log" "$DEBEZIUM_DIR/connect.log.1"
    say "starting Kafka Connect on 127.0.0.1:$DEBEZIUM_REST_PORT for 127.0.0.1:$PGPORT/$PGDATABASE -> $KAFKA_BOOTSTRAP (dir $DEBEZIUM_DIR)"
    setsid "${JAVA[@]}" org.apache.kafka.connect.cli.ConnectStandalone \
        "$DEBEZIUM_DIR/worker.properties" "$DEBEZIUM_DIR/connector.properties" \
        </dev/null >"$DEBEZIUM_DIR/connect.out" 2>&1 &
    echo $! >"$PIDFILE"
    wait_running
    say "task RUNNING after ${SECONDS}s (pid $(pid_of))"
}

# Wait up to $1 seconds for the worker to be gone.
wait_exit() {
    local deadline=$((SECONDS + $1))
    while running && ((SECONDS < deadline)); do sleep 0.2; done
    ! running
}

stop() {
    running || { say "not running"; return 0; }
    say "stopping pid $(pid_of)"
    kill -TERM "$(pid_of)"
    if ! wait_exit "${DEBEZIUM_STOP_WAIT:-30}"; then
        say "no exit after SIGTERM, sending SIGKILL"
        kill -KILL "$(pid_of)"
        wait_exit 10 || die "pid still there after SIGKILL"
    fi
    rm -f "$PIDFILE"
}

# The WAL sender may outlive the worker by a moment (slot still active): retry.
drop() {
    stop
    local deadline=$((SECONDS + 30))
    until PGOPTIONS='-c client_min_messages=warning' psql -X -q -v ON_ERROR_STOP=1 -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '$DEBEZIUM_SLOT'" \
        -c "DROP PUBLICATION IF EXISTS \"$DEBEZIUM_PUBLICATION\"" >/dev/null; do
        ((SECONDS < deadline)) || die "cannot drop slot $DEBEZIUM_SLOT"
        sleep 1
    done
    rm -f "$DEBEZIUM_DIR/offsets.dat"
    say "dropped slot $DEBEZIUM_SLOT and publication $DEBEZIUM_PUBLICATION"
}

case ${1:-} in
fetch | start | stop | drop) "$1" ;;
pid) pid_of ;;
wait) wait_running ;;
*) die "usage: $0 fetch|start|stop|pid|wait|drop" ;;
esac

#!/usr/bin/env bash
# An Apache Kafka node (KRaft, broker+controller in one JVM) for tests, run
# straight from Maven Central jars: no Docker, no tarball.  Alone by default;
# test/kafka/cluster.sh runs three of these as one cluster.
#
# usage: broker.sh fetch|start|stop|kill|freeze|thaw|pid|status|wait|new-cluster-id
#        broker.sh console-consumer ARGS...
#   start             format (once) and start the node, wait until it serves
#   stop              controlled shutdown (SIGTERM), wait for the exit
#   kill              SIGKILL, wait for the exit
#   freeze, thaw      SIGSTOP, SIGCONT: the node hangs, alive but silent
#   pid               print the node's pid
#   new-cluster-id    print a fresh cluster id, for KAFKA_CLUSTER_ID
#   console-consumer  run Apache Kafka's own kafka-console-consumer (its
#                     kafka-tools jar, which fetch fetches too) with ARGS
#   KAFKA_PORT        client port, loopback only (default 19092); controller = +1
#   KAFKA_NODE_ID     node.id (default 1)
#   KAFKA_VOTERS      the controller quorum, id@host:port,... (static, as
#                     controller.quorum.voters); unset: this node alone
#   KAFKA_CLUSTER_ID  the cluster id to format with, the same on every voter
#                     (default a fresh one; needed with KAFKA_VOTERS)
#   KAFKA_DIR         data, logs, config and pid file (default /tmp/outbox-kafka-$KAFKA_PORT)
#   KAFKA_HEAP        JVM heap (default 512m)
#   KAFKA_PARTITIONS  partitions of auto-created topics (default 1)
#   KAFKA_EXTRA_PROPS extra server.properties lines; they come last, so they win
#   KAFKA_SASL_PORT   if set, also a SASL_PLAINTEXT listener on this port (mechanism
#                     PLAIN); the PLAINTEXT listener stays for the tests' own clients
#   KAFKA_SSL_PORT    if set, also a SASL_SSL listener (PLAIN over TLS) on this port,
#                     with a self-signed certificate for 127.0.0.1 made once in
#                     $KAFKA_DIR/tls; clients trust $KAFKA_DIR/tls/ca.pem
#   KAFKA_SASL_USERS  users of those listeners, name:password,... (default app:app-secret)
#   KAFKA_VERSION     kafka_2.13 version on Maven Central (default 4.1.2)
#   KAFKA_WAIT        seconds start/wait give the broker to answer (default 90)
set -euo pipefail

KAFKA_VERSION=${KAFKA_VERSION:-4.1.2}
KAFKA_PORT=${KAFKA_PORT:-19092}
KAFKA_DIR=${KAFKA_DIR:-/tmp/outbox-kafka-$KAFKA_PORT}
KAFKA_HEAP=${KAFKA_HEAP:-512m}
KAFKA_WAIT=${KAFKA_WAIT:-90}
KAFKA_NODE_ID=${KAFKA_NODE_ID:-1}
KAFKA_VOTERS=${KAFKA_VOTERS:-}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/outbox/kafka-$KAFKA_VERSION
LIBS=$CACHE/libs
PIDFILE=$KAFKA_DIR/broker.pid
BOOTSTRAP=127.0.0.1:$KAFKA_PORT
# Small heap and the serial collector: a 2-core machine shares its CPUs with
# PostgreSQL and the tests.
JAVA=(java -Xms"$KAFKA_HEAP" -Xmx"$KAFKA_HEAP" -XX:+UseSerialGC -Djava.awt.headless=true
    -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.xml" -cp "$LIBS/*")

say() { echo "broker.sh: $*" >&2; }
die() { say "$*"; exit 1; }

# Install a Debian package when its command is missing (fresh CI machines).
need() {
    local cmd=$1; shift
    command -v "$cmd" >/dev/null || { say "installing $*"; apt-get install -y -q "$@" >&2; }
}

# Fetch the runtime jars of these Maven dependencies (groupId:artifactId:version
# each) into dir, unless it is there: for a pom named name.  Copied into a
# temporary dir and renamed, so that an interrupted fetch is redone.
maven_fetch() {
    local name=$1 dir=$2 dependency group artifact version; shift 2
    [ -d "$dir" ] && return 0
    need mvn maven default-jre-headless
    mkdir -p "$CACHE"
    {
        echo '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        echo "<groupId>outbox.test</groupId><artifactId>$name</artifactId><version>1</version><dependencies>"
        for dependency in "$@"; do
            IFS=: read -r group artifact version <<<"$dependency"
            echo "<dependency><groupId>$group</groupId><artifactId>$artifact</artifactId><version>$version</version></dependency>"
        done
        echo '</dependencies></project>'
    } >"$CACHE/$name.pom.xml"
    say "fetching $* into $dir"
    rm -rf "$dir.tmp"
    mvn -q -B -f "$CACHE/$name.pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$dir.tmp" >"$CACHE/$name.mvn.out" 2>&1 ||
        { cat "$CACHE/$name.mvn.out" >&2; die "mvn failed"; }
    mv "$dir.tmp" "$dir"
}

# kafka_2.13 leaves the logging backend to the distribution, so add log4j2
# and its binding for the slf4j 1.7 API the broker logs through.
fetch() {
    maven_fetch kafka-broker "$LIBS" "org.apache.kafka:kafka_2.13:$KAFKA_VERSION" \
        org.apache.logging.log4j:log4j-core:2.24.3 org.apache.logging.log4j:log4j-slf4j-impl:2.24.3
}

# Apache Kafka's command-line tools, beside the broker's jars: a consumer no
# one here wrote, to read what the outbox published as a Java client does.
TOOLS=$CACHE/tools
fetch_tools() {
    maven_fetch kafka-tools "$TOOLS" "org.apache.kafka:kafka-tools:$KAFKA_VERSION"
}

console_consumer() {
    fetch_tools
    java -Xmx256m -XX:+UseSerialGC -cp "$LIBS/*:$TOOLS/*" \
        org.apache.kafka.tools.consumer.ConsoleConsumer "$@"
}

pid_of() {
    local pid
    pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
    # A reused pid or a zombie (empty cmdline) does not count as our broker.
    tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q kafka.Kafka || return 1
    echo "$pid"
}

running() { pid_of >/dev/null; }

# A cluster id is 16 random bytes in base64url; one starting with '-' would
# be read as an option, as Kafka's own random-uuid also avoids.
new_cluster_id() {
    local id=-
    while [[ $id == -* ]]; do
        id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
    done
    echo "$id"
}

# The broker's certificate for the SASL_SSL listener: self-signed, for
# 127.0.0.1 both as an address and as a name (librdkafka checks the name),
# in a PKCS12 keystore for the broker and as PEM for clients to trust.
make_certificate() {
    local tls=$KAFKA_DIR/tls
    [ -f "$tls/broker.p12" ] && return 0
    mkdir -p "$tls"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=127.0.0.1" \
        -addext "subjectAltName=IP:127.0.0.1,DNS:127.0.0.1,DNS:localhost" \
        -keyout "$tls/broker.key" -out "$tls/ca.pem" 2>"$tls/openssl.out" ||
        { cat "$tls/openssl.out" >&2; die "cannot make a certificate"; }
    openssl pkcs12 -export -in "$tls/ca.pem" -inkey "$tls/broker.key" -name broker \
        -passout pass:outbox-test -out "$tls/broker.p12.tmp" 2>>"$tls/openssl.out" ||
        { cat "$tls/openssl.out" >&2; die "cannot make a keystore"; }
    mv "$tls/broker.p12.tmp" "$tls/broker.p12"
}

# Properties of the SASL_PLAINTEXT and SASL_SSL listeners: mechanism PLAIN,
# the users of KAFKA_SASL_USERS, and the keystore for TLS.
authentication_properties() {
    local users="" entry name entries
    IFS=, read -ra entries <<<"${KAFKA_SASL_USERS:-app:app-secret}"
    for entry in "${entries[@]}"; do
        users+=" user_${entry%%:*}=\"${entry#*:}\""
    done
    echo "sasl.enabled.mechanisms=PLAIN"
    for name in sasl_plaintext sasl_ssl; do
        echo "listener.name.$name.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required$users;"
    done
    if [ -n "${KAFKA_SSL_PORT:-}" ]; then
        echo "ssl.keystore.type=PKCS12"
        echo "ssl.keystore.location=$KAFKA_DIR/tls/broker.p12"
        echo "ssl.keystore.password=outbox-test"
    fi
}

# Rewritten on every start so KAFKA_EXTRA_PROPS and friends apply to restarts;
# node id, ports and log.dirs stay the same, so the stored data stays valid.
write_config() {
    # Inter-broker and controller traffic stays on the plaintext listeners.
    local listeners="PLAINTEXT://$BOOTSTRAP" protocols="PLAINTEXT:PLAINTEXT" authentication=""
    if [ -n "${KAFKA_SASL_PORT:-}" ]; then
        listeners+=",SASL_PLAINTEXT://127.0.0.1:$KAFKA_SASL_PORT"
        protocols+=",SASL_PLAINTEXT:SASL_PLAINTEXT"
    fi
    if [ -n "${KAFKA_SSL_PORT:-}" ]; then
        make_certificate
        listeners+=",SASL_SSL://127.0.0.1:$KAFKA_SSL_PORT"
        protocols+=",SASL_SSL:SASL_SSL"
    fi
    if [ -n "${KAFKA_SASL_PORT:-}${KAFKA_SSL_PORT:-}" ]; then
        authentication=$(authentication_properties)
    fi
    # Internal topics get a replica on every node, up to three; their
    # min.insync.replicas leaves room for one node down.
    local quorum="controller.quorum.bootstrap.servers=127.0.0.1:$((KAFKA_PORT + 1))" replicas=1
    if [ -n "$KAFKA_VOTERS" ]; then
        quorum="controller.quorum.voters=$KAFKA_VOTERS"
        replicas=$(tr , '\n' <<<"$KAFKA_VOTERS" | wc -l)
        replicas=$((replicas > 3 ? 3 : replicas))
    fi
    mkdir -p "$KAFKA_DIR/data" "$KAFKA_DIR/logs"
    cat >"$KAFKA_DIR/server.properties" <<EOF
process.roles=broker,controller
node.id=$KAFKA_NODE_ID
listeners=$listeners,CONTROLLER://127.0.0.1:$((KAFKA_PORT + 1))
advertised.listeners=$listeners
listener.security.protocol.map=$protocols,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
$quorum
log.dirs=$KAFKA_DIR/data
# Few partitions make the first group/transaction coordinator lookup fast.
offsets.topic.replication.factor=$replicas
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=$replicas
transaction.state.log.min.isr=$(((replicas + 1) / 2))
transaction.state.log.num.partitions=1
default.replication.factor=$replicas
num.partitions=${KAFKA_PARTITIONS:-1}
auto.create.topics.enable=true
group.initial.rebalance.delay.ms=0
# After a SIGKILL the restarted broker cannot register until the controller
# has expired the old one's session (default 9 s); keep that short.
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
# The cleaner's default 128 MiB buffer would dominate a 512 MiB heap
# (Kafka wants more than 1 MiB per cleaner thread).
log.cleaner.dedupe.buffer.size=2097152
$authentication
${KAFKA_EXTRA_PROPS:-}
EOF
    # Log to a file in KAFKA_DIR; the terminal only sees our progress lines.
    # log4j's own shutdown hook would stop logging before the broker's shutdown
    # hook has finished, losing the end of a SIGTERM shutdown.
    cat >"$KAFKA_DIR/log4j2.xml" <<EOF
<Configuration status="warn" shutdownHook="disable">
  <Appenders>
    <File name="file" fileName="$KAFKA_DIR/logs/server.log">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Root level="info"><AppenderRef ref="file"/></Root>
  </Loggers>
</Configuration>
EOF
}

log_tail() {
    local log=$KAFKA_DIR/logs/server.log
    {
        # The cause is usually an ERROR line far above the end of the log.
        say "errors in $log:"
        grep -A1 -E '^\[[^]]*\] (ERROR|FATAL)' "$log" 2>/dev/null | tail -n 20 || true
        say "last lines of $log and broker.out:"
        tail -n 20 "$log" "$KAFKA_DIR/broker.out" 2>/dev/null || true
    } >&2
}

wait_ready() {
    need kcat kcat
    local deadline=$((SECONDS + KAFKA_WAIT))
    # Listing all topics (no -t) so the probe never auto-creates one; the broker
    # appears in the metadata only once it is unfenced and can take produce requests.
    until kcat -L -b "$BOOTSTRAP" -m 2 2>/dev/null | grep -q "broker $KAFKA_NODE_ID at"; do
        if [ -f "$PIDFILE" ] && ! running; then
            log_tail; die "broker process exited"
        fi
        if ((SECONDS >= deadline)); then
            log_tail; die "broker not answering on $BOOTSTRAP after ${KAFKA_WAIT}s"
        fi
        sleep 0.5
    done
}

# Does something answer on a port of the loopback?
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
    if running; then say "already running (pid $(pid_of))"; return 0; fi
    # Another broker on the port would answer wait_ready for this one.
    local port
    for port in "$KAFKA_PORT" $((KAFKA_PORT + 1)); do
        port_taken "$port" && die "port $port is taken by another process (another broker?): stop it, or choose another KAFKA_PORT"
    done
    fetch
    write_config
    # Format once; formatting again would fail (or, forced, wipe the cluster id).
    if [ ! -f "$KAFKA_DIR/data/meta.properties" ]; then
        # A static quorum (controller.quorum.voters) is formatted as it is;
        # a lone node makes itself the quorum's only voter.
        local id=${KAFKA_CLUSTER_ID:-} standalone=()
        [ -n "$KAFKA_VOTERS" ] || standalone=(--standalone)
        [ -n "$id" ] || [ -z "$KAFKA_VOTERS" ] || die "KAFKA_VOTERS needs KAFKA_CLUSTER_ID"
        [ -n "$id" ] || id=$(new_cluster_id)
        say "formatting $KAFKA_DIR/data (cluster $id)"
        "${JAVA[@]}" kafka.tools.StorageTool format "${standalone[@]}" -t "$id" \
            -c "$KAFKA_DIR/server.properties" >"$KAFKA_DIR/format.out" 2>&1 ||
            { cat "$KAFKA_DIR/format.out" >&2; die "format failed"; }
    fi
    say "starting node $KAFKA_NODE_ID on $BOOTSTRAP (dir $KAFKA_DIR)"
    # One log per run (the previous one kept), so errors shown are this run's.
    if [ -f "$KAFKA_DIR/logs/server.log" ]; then
        mv "$KAFKA_DIR/logs/server.log" "$KAFKA_DIR/logs/server.log.1"
    fi
    # setsid: the broker outlives this shell and the caller's process group.
    setsid "${JAVA[@]}" kafka.Kafka "$KAFKA_DIR/server.properties" \
        </dev/null >"$KAFKA_DIR/broker.out" 2>&1 &
    echo $! >"$PIDFILE"
    wait_ready
    say "ready after ${SECONDS}s"
}

# Wait up to $1 seconds for the broker process to be gone.
wait_exit() {
    local deadline=$((SECONDS + $1))
    while running && ((SECONDS < deadline)); do sleep 0.2; done
    ! running
}

stop() {
    running || { say "not running"; return 0; }
    say "stopping pid $(pid_of)"
    kill -TERM "$(pid_of)"
    # A frozen node (freeze) acts on the SIGTERM only once it runs again.
    kill -CONT "$(pid_of)"
    if ! wait_exit "${KAFKA_STOP_WAIT:-30}"; then
        say "no exit after SIGTERM, sending SIGKILL"
        kill -KILL "$(pid_of)"
        wait_exit 10 || die "pid still there after SIGKILL"
    fi
    rm -f "$PIDFILE"
}

kill9() {
    running || { say "not running"; return 0; }
    say "killing pid $(pid_of)"
    kill -KILL "$(pid_of)"
    wait_exit 10 || die "pid still there after SIGKILL"
    rm -f "$PIDFILE"
}

# SIGSTOP or SIGCONT: a node that hangs (a long GC pause, a partition from
# the network) without its connections closing.
signal() {
    local pid
    pid=$(pid_of) || die "not running"
    say "sending SIG$1 to pid $pid"
    kill -"$1" "$pid"
}

case ${1:-} in
fetch) fetch; fetch_tools ;;
start) start ;;
stop) stop ;;
kill) kill9 ;;
freeze) signal STOP ;;
thaw) signal CONT ;;
pid) pid_of ;;
status) running ;;
wait) wait_ready ;;
new-cluster-id) new_cluster_id ;;
console-consumer) shift; console_consumer "$@" ;;
*) die "usage: $0 fetch|start|stop|kill|freeze|thaw|pid|status|wait|new-cluster-id|console-consumer" ;;
esac

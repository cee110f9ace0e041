# Shared by test/run-tests and test/demo: install what they need, build and
# install the extension, run the Kafka broker.  Sourced, not run.
#
# Both scripts run as root on Debian 12.  PostgreSQL refuses to run as root,
# so clusters, tests and the broker run as the postgres user; the Kafka jars
# are cached where both can read them.

set -euo pipefail

OUTBOX_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# postgresql_bin MAJOR and librdkafka_prefix VERSION: the other servers and librdkafka.
source "$OUTBOX_SRC/test/servers.sh"
# PG_BIN may name another (relocated) PostgreSQL 15 install to build and test against.
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
export XDG_CACHE_HOME=/var/cache        # broker.sh keeps the Kafka jars in $XDG_CACHE_HOME/outbox
export KAFKA_PORT=${KAFKA_PORT:-19092}
export KAFKA_DIR=${KAFKA_DIR:-/tmp/outbox-kafka-$KAFKA_PORT}
export OUTBOX_KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT

DEBIAN_PACKAGES=(
    build-essential postgresql-15 postgresql-server-dev-15 librdkafka-dev
    kcat python3-confluent-kafka python3-psycopg2 libipc-run-perl
    default-jre-headless maven
    # test/t/203_prometheus.pl: the exporter it runs, and its reader of monitoring/queries.yaml
    prometheus-postgres-exporter libyaml-libyaml-perl
)

step() { printf '\n==> %s\n' "$*" >&2; }

as_postgres() { runuser -u postgres -- env PATH="$PG_BIN:$PATH" "$@"; }

install_dependencies() {
    local missing=()
    [ "$(id -u)" = 0 ] || { echo "run this as root (it installs Debian packages)" >&2; exit 1; }
    for pkg in "${DEBIAN_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$pkg")
    done
    # Java and Maven may come from elsewhere; then their packages are not needed.
    if command -v java >/dev/null && command -v mvn >/dev/null; then
        missing=("${missing[@]/default-jre-headless}")
        missing=("${missing[@]/maven}")
    fi
    missing=($(printf '%s\n' "${missing[@]}" | grep . || true))
    if [ ${#missing[@]} -gt 0 ]; then
        step "installing Debian packages: ${missing[*]}"
        apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
        # The exporter's package starts a service of its own (on port 9187,
        # for the local server); the test runs a private one.
        if printf '%s\n' "${missing[@]}" | grep -qx prometheus-postgres-exporter &&
            [ -d /run/systemd/system ]; then
            systemctl disable --now prometheus-postgres-exporter >&2 || true
        fi
    fi
    # Debian's postgresql package starts a cluster of its own; ours are private.
    step "fetching Apache Kafka from Maven Central (cached after the first run)"
    bash "$OUTBOX_SRC/test/kafka/broker.sh" fetch
}

build_and_install() {
    step "building and installing the outbox extension"
    make -C "$OUTBOX_SRC" -s PG_CONFIG="$PG_BIN/pg_config"
    make -C "$OUTBOX_SRC" -s PG_CONFIG="$PG_BIN/pg_config" install >/dev/null
}

start_broker() {
    step "starting Apache Kafka on $OUTBOX_KAFKA_BROKERS"
    mkdir -p "$KAFKA_DIR" && chown postgres "$KAFKA_DIR"
    as_postgres env XDG_CACHE_HOME="$XDG_CACHE_HOME" KAFKA_PORT="$KAFKA_PORT" KAFKA_DIR="$KAFKA_DIR" \
        bash "$OUTBOX_SRC/test/kafka/broker.sh" start
}

stop_broker() {
    as_postgres env XDG_CACHE_HOME="$XDG_CACHE_HOME" KAFKA_PORT="$KAFKA_PORT" KAFKA_DIR="$KAFKA_DIR" \
        bash "$OUTBOX_SRC/test/kafka/broker.sh" stop || true
}

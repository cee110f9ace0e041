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
# The PostgreSQL major to build and test against (15 to 19: 15 is Debian's,
# the others are fetched and cached by servers.sh), and the librdkafka
# (2.0.2 is Debian's; 2.14.2 is built and cached).  PG_BIN may name the bin
# directory of another install instead, such as a relocated copy.
PG_MAJOR=${OUTBOX_PG_MAJOR:-15}
RDKAFKA_VERSION=${OUTBOX_RDKAFKA:-2.0.2}
PG_BIN=${PG_BIN:-}
export XDG_CACHE_HOME=/var/cache        # broker.sh keeps the Kafka jars in $XDG_CACHE_HOME/outbox
export KAFKA_PORT=${KAFKA_PORT:-19092}
export KAFKA_DIR=${KAFKA_DIR:-/tmp/outbox-kafka-$KAFKA_PORT}
export OUTBOX_KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT

DEBIAN_PACKAGES=(
    build-essential pkg-config postgresql-15 postgresql-server-dev-15 librdkafka-dev
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
    [ -n "$PG_BIN" ] || PG_BIN=$(postgresql_bin "$PG_MAJOR")
    # Every build, the tests' own included, finds that librdkafka.
    local prefix
    prefix=$(librdkafka_prefix "$RDKAFKA_VERSION")
    [ -z "$prefix" ] || export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
}

# build_and_install [DIR [PG_BIN]]: build the tree in DIR (default the
# source tree) against that install (default PG_BIN) and the chosen
# librdkafka, and install it there.
build_and_install() {
    local dir=${1:-$OUTBOX_SRC} bin=${2:-$PG_BIN}
    step "building and installing the outbox extension for $("$bin/pg_config" --version), librdkafka $RDKAFKA_VERSION"
    make -C "$dir" -s clean
    make -C "$dir" -s -j2 PG_CONFIG="$bin/pg_config"
    make -C "$dir" -s PG_CONFIG="$bin/pg_config" install >/dev/null
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

# The tables test/run-tests and test/matrix print.  A part's row: what ran
# and what passed, read from its log and its fault report.
RESULT_FORMAT='%-6s %-10s %-6s %-10s %-9s %-9s %-9s %-12s %7s  %s\n'
print_result_header() {
    printf "$RESULT_FORMAT" major librdkafka set pg_regress isolation 'TAP files' 'TAP tests' 'fault zeros' 'time' status
}
print_fault_header() {
    printf '%-44s %9s %5s %7s %12s %10s %8s\n' scenario committed lost phantom 'order faults' duplicates 'drain s'
}

# result_row MAJOR SET WORK SECONDS STATUS.  pg_regress and isolation:
# passed/run, in the order make installcheck runs them.  TAP: files and
# tests of every prove run.  Fault zeros: the fault table's rows that lost
# nothing and kept per-key order, of all its rows.
result_row() {
    local major=$1 set=$2 work=$3 seconds=$4 status=$5 suites files tests faults
    suites=($(grep -oE '(All [0-9]+ tests passed|[0-9]+ of [0-9]+ tests failed)' "$work/run.log" |
        awk '/passed/ { print $2 "/" $2; next } { print $4 - $1 "/" $4 }'))
    files=$(grep -oE '^Files=[0-9]+' "$work/run.log" | awk -F= '{ n += $2 } END { print n + 0 }')
    tests=$(grep -oE '^Files=[0-9]+, Tests=[0-9]+' "$work/run.log" | awk -F= '{ n += $3 } END { print n + 0 }')
    # A row's counts are the first five numbers in a row: committed, lost,
    # phantom, order faults, duplicates (a scenario's name has fewer).
    faults=$(awk '{ rows++
                    for (i = 1; i + 4 <= NF; i++) {
                        n = 0; for (j = i; j <= i + 4; j++) n += ($j ~ /^[0-9]+$/)
                        if (n == 5) { if ($(i+1) == 0 && $(i+3) == 0) zero++; break }
                    } }
                  END { print zero + 0 "/" rows + 0 }' "$work/tmp_check/fault_report.txt" 2>/dev/null || echo 0/0)
    printf "$RESULT_FORMAT" "$major" "$RDKAFKA_VERSION" "$set" "${suites[0]:--}" "${suites[1]:--}" \
        "$files" "$tests" "$faults" "$((seconds / 60))m$((seconds % 60))s" "$([ "$status" = 0 ] && echo PASS || echo FAIL)"
}

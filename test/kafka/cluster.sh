#!/usr/bin/env bash
# A three-node Apache Kafka cluster for tests: three broker.sh nodes, each
# broker and controller, on loopback, with a static controller quorum of all
# three (controller.quorum.voters) and one cluster id.
#
# usage: cluster.sh start|stop|kill|freeze|thaw|status [NODE...]
#        cluster.sh pid|wait NODE
#        cluster.sh brokers
#   broker.sh's command of that name for each NODE (1, 2 or 3; default all
#   three), in parallel: start formats (once) and starts, and returns once
#   every node serves; stop is a controlled shutdown (SIGTERM), kill a
#   SIGKILL, freeze and thaw SIGSTOP and SIGCONT; status fails unless every
#   node runs.  pid prints a node's pid, wait waits until it serves.
#   brokers prints the bootstrap list.  A node serves only once the
#   controller quorum has a majority: start at least two together.
#   KAFKA_PORT         the single test broker's port (default 19092); node N
#                      listens on KAFKA_PORT + 400 + 2 (N - 1), its controller
#                      one above: 19492..19497 by default
#   KAFKA_CLUSTER_DIR  the nodes' KAFKA_DIRs are node1..node3 in it (default
#                      /tmp/outbox-kafka-cluster-$KAFKA_PORT)
#   KAFKA_HEAP         each node's JVM heap (default 320m: three share the machine)
#   Other KAFKA_* settings of broker.sh apply to every node.
set -euo pipefail

BROKER_SH=$(dirname "$0")/broker.sh
KAFKA_PORT=${KAFKA_PORT:-19092}
KAFKA_CLUSTER_DIR=${KAFKA_CLUSTER_DIR:-/tmp/outbox-kafka-cluster-$KAFKA_PORT}
export KAFKA_HEAP=${KAFKA_HEAP:-320m}
NODES=(1 2 3)

say() { echo "cluster.sh: $*" >&2; }
die() { say "$*"; exit 1; }

client_port() { echo $((KAFKA_PORT + 400 + 2 * ($1 - 1))); }

# Every node's address, comma-separated: 127.0.0.1 and its client port plus
# $2, after $1 with N as the node's id.
addresses() {
    local prefix=$1 offset=$2 n list=()
    for n in "${NODES[@]}"; do
        list+=("${prefix//N/$n}127.0.0.1:$(($(client_port "$n") + offset))")
    done
    (IFS=,; echo "${list[*]}")
}

voters() { addresses 'N@' 1; }

brokers() { addresses '' 0; }

# The cluster id every node is formatted with, made once.
cluster_id() {
    local file=$KAFKA_CLUSTER_DIR/cluster.id
    if [ ! -s "$file" ]; then
        mkdir -p "$KAFKA_CLUSTER_DIR"
        bash "$BROKER_SH" new-cluster-id >"$file.tmp"
        mv "$file.tmp" "$file"
    fi
    cat "$file"
}

# broker.sh's command $2 for node $1.
node() {
    local n=$1 command=$2 voters id port
    [[ " ${NODES[*]} " == *" $n "* ]] || die "no node $n (nodes: ${NODES[*]})"
    # Computed before KAFKA_PORT is the node's.
    voters=$(voters) id=$(cluster_id) port=$(client_port "$n")
    KAFKA_PORT=$port KAFKA_DIR=$KAFKA_CLUSTER_DIR/node$n KAFKA_NODE_ID=$n \
        KAFKA_VOTERS=$voters KAFKA_CLUSTER_ID=$id bash "$BROKER_SH" "$command"
}

# broker.sh's command $1 for nodes $2..., in parallel; fails if any one's did.
nodes() {
    local command=$1 n pids=() status=0
    shift
    if [ "$command" = start ]; then
        # Once, before the nodes race for them.
        bash "$BROKER_SH" fetch
        cluster_id >/dev/null
    fi
    for n in "$@"; do
        node "$n" "$command" &
        pids+=($!)
    done
    for n in "${pids[@]}"; do
        wait "$n" || status=1
    done
    return $status
}

command=${1:-}
shift || true
case $command:$# in
start:* | stop:* | kill:* | freeze:* | thaw:* | status:*)
    [ $# -gt 0 ] || set -- "${NODES[@]}"
    nodes "$command" "$@" ;;
pid:1 | wait:1) node "$1" "$command" ;;
brokers:0) brokers ;;
*) die "usage: $0 start|stop|kill|freeze|thaw|status [NODE...] | pid|wait NODE | brokers" ;;
esac

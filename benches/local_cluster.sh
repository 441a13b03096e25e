# Sourced by benches/ab.sh, benches/restart.sh and benches/random_ids.sh: a fresh 3-node
# cluster of ours on 127.0.0.1:19081-19083, data and logs under $CLUSTER_DIR, stopped and
# removed on exit.
# NODE_ENV="env TOKIO_WORKER_THREADS=1" puts an environment in front of each node.

CLUSTER_PEERS="1=127.0.0.1:19081,2=127.0.0.1:19082,3=127.0.0.1:19083"
# The `pubsub` CLI's arguments naming the three nodes.
CLUSTER_SERVERS=(-s http://127.0.0.1:19081 -s http://127.0.0.1:19082 -s http://127.0.0.1:19083)
CLUSTER_DIR=$(mktemp -d)
# Indexed by node id, so "${CLUSTER_PIDS[@]}" is in node order.
CLUSTER_PIDS=()
trap 'kill "${CLUSTER_PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$CLUSTER_DIR"' EXIT

# cluster_start_node NODE_BIN ID: starts node ID (again, after a kill: same data directory).
cluster_start_node() {
    # shellcheck disable=SC2086 # NODE_ENV is a command prefix
    ${NODE_ENV:-} "$1" --id "$2" --listen "127.0.0.1:1908$2" --peers "$CLUSTER_PEERS" \
        --data-dir "$CLUSTER_DIR/n$2" >>"$CLUSTER_DIR/n$2.log" 2>&1 &
    CLUSTER_PIDS[$2]=$!
}

# cluster_start NODE_BIN: starts the three nodes and waits for a leader, whose id it leaves
# in CLUSTER_LEADER. Call it in the script's own shell (not in `$(...)`), so that
# CLUSTER_PIDS stays known to the exit trap.
cluster_start() {
    local i
    for i in 1 2 3; do cluster_start_node "$1" "$i"; done
    for _ in $(seq 300); do
        CLUSTER_LEADER=$(curl -sf localhost:19081/cluster | sed -n 's/.*"leader_id":"node-\([0-9]\)".*/\1/p' || true)
        [ -n "$CLUSTER_LEADER" ] && return
        sleep 0.1
    done
    echo "no leader elected within 30 s" >&2
    return 1
}

# cluster_cpu: each node's CPU seconds so far (user + system), in node order.
cluster_cpu() {
    local p
    for p in "${CLUSTER_PIDS[@]}"; do awk '{printf "%.2f ", ($14 + $15) / 100}' "/proc/$p/stat"; done
}

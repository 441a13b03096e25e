#!/usr/bin/env bash
# One `pubsub bench` run against a fresh 3-node cluster on 127.0.0.1:19081-19083, for A/B
# comparisons of two builds (run them interleaved: A B A B ...). Prints the bench's numbers,
# the CPU seconds each node used during the run, the generator's user/system CPU and the
# nodes' resident memory afterwards. The cluster and its data are removed at the end.
#
#   benches/ab.sh LABEL NODE_BIN PUBSUB_BIN -- BENCH_ARGS...
#   benches/ab.sh new target/release/pubsub-node target/release/pubsub -- \
#       --publishers 8 --inflight 8 --messages 30000 --payload-bytes 256
#
# NODE_ENV="env TOKIO_WORKER_THREADS=1" puts an environment in front of each node.
set -euo pipefail
[ $# -ge 4 ] && [ "$4" = "--" ] || { sed -n '2,11p' "$0"; exit 2; }
LABEL=$1 NODE=$2 GEN=$3
shift 4
# shellcheck source=benches/local_cluster.sh
source "$(dirname "$0")/local_cluster.sh"
cluster_start "$NODE"
"$GEN" "${CLUSTER_SERVERS[@]}" --json topics create bench >/dev/null
before=$(cluster_cpu)
TIMEFORMAT='%U %S'
{ time "$GEN" "${CLUSTER_SERVERS[@]}" --json bench --topic bench "$@" >"$CLUSTER_DIR/out" 2>/dev/null; } 2>"$CLUSTER_DIR/gen_cpu"
after=$(cluster_cpu)
rss=$(for p in "${CLUSTER_PIDS[@]}"; do awk '/VmRSS/ {printf "%d ", $2 / 1024}' "/proc/$p/status"; done)
python3 - "$LABEL" "$(tail -1 "$CLUSTER_DIR/out")" "$before" "$after" "$(cat "$CLUSTER_DIR/gen_cpu")" "$rss" <<'PY'
import json, sys
label, line, before, after, gen, rss = sys.argv[1:]
report = json.loads(line)
keys = [k for k in report if any(s in k for s in ("msgs_per_sec", "p50", "p99", "deliver"))]
node_cpu = [round(b - a, 2) for a, b in zip(map(float, before.split()), map(float, after.split()))]
print(label, {k: report[k] for k in keys}, "node CPU s", node_cpu, "generator user/sys s", gen, "node RSS MiB", rss)
PY

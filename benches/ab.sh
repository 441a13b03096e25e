#!/usr/bin/env bash
# One `pubsub bench` run against a fresh 3-node cluster on 127.0.0.1:19081-19083, for A/B
# comparisons of two builds (run them interleaved: A B A B ...). Prints the bench's numbers,
# the CPU seconds each node used during the run, the generator's user/system CPU, the
# nodes' resident memory and bytes written to disk afterwards, their log fsyncs (count, mean,
# how many took over 12.8 ms) and log size. The cluster and its data are removed at the end.
#
#   benches/ab.sh LABEL NODE_BIN PUBSUB_BIN -- BENCH_ARGS...
#   benches/ab.sh new target/release/pubsub-node target/release/pubsub -- \
#       --publishers 8 --inflight 8 --messages 30000 --payload-bytes 256
#
# NODE_ENV="env TOKIO_WORKER_THREADS=1" puts an environment in front of each node.
set -euo pipefail
[ $# -ge 4 ] && [ "$4" = "--" ] || { sed -n '2,12p' "$0"; exit 2; }
LABEL=$1 NODE=$2 GEN=$3
shift 4
# shellcheck source=benches/local_cluster.sh
source "$(dirname "$0")/local_cluster.sh"
cluster_start "$NODE"
"$GEN" "${CLUSTER_SERVERS[@]}" --json topics create bench >/dev/null
before=$(cluster_cpu)
TIMEFORMAT='%U %S'
# A run with failed publishes exits non-zero; its report (with the errors) is still printed.
{ time "$GEN" "${CLUSTER_SERVERS[@]}" --json bench --topic bench "$@" >"$CLUSTER_DIR/out" 2>/dev/null || true; } 2>"$CLUSTER_DIR/gen_cpu"
after=$(cluster_cpu)
rss=$(for p in "${CLUSTER_PIDS[@]}"; do awk '/VmRSS/ {printf "%d ", $2 / 1024}' "/proc/$p/status"; done)
# Bytes each node has had written to disk over its life (the run is nearly all of it).
written=$(for p in "${CLUSTER_PIDS[@]}"; do awk '/^write_bytes/ {printf "%d ", $2 / 1048576}' "/proc/$p/io"; done)
for i in 1 2 3; do curl -sf "localhost:1908$i/metrics" >"$CLUSTER_DIR/metrics$i" || true; done
python3 - "$LABEL" "$(tail -1 "$CLUSTER_DIR/out")" "$before" "$after" "$(cat "$CLUSTER_DIR/gen_cpu")" "$rss" "$CLUSTER_DIR" "$written" <<'PY'
import json, sys
label, line, before, after, gen, rss, cluster_dir, written = sys.argv[1:]
report = json.loads(line)
# A run with failed publishes is no measure of the build: its errors are shown first.
keys = [k for k in report if k in ("messages", "errors", "first_error") or any(s in k for s in ("msgs_per_sec", "p50", "p99", "deliver"))]
node_cpu = [round(b - a, 2) for a, b in zip(map(float, before.split()), map(float, after.split()))]

def fsyncs(node):
    # Each node's log fsyncs over its life (the run is nearly all of it): how many, their
    # mean, and how many took longer than 12.8 ms (a disk stall holds every commit behind it).
    metrics = {}
    try:
        for l in open(f"{cluster_dir}/metrics{node}"):
            name, _, value = l.rpartition(" ")
            if name.startswith("pubsub_log_fsync") or name == "pubsub_raft_log_bytes":
                metrics[name] = float(value)
    except OSError:
        return None
    count = metrics.get("pubsub_log_fsync_seconds_count", 0)
    if not count:
        return None
    slow = count - metrics.get('pubsub_log_fsync_seconds_bucket{le="0.0128"}', count)
    mean_ms = metrics.get("pubsub_log_fsync_seconds_sum", 0) / count * 1000
    log = f", log {metrics['pubsub_raft_log_bytes'] / 1048576:.0f} MiB" if "pubsub_raft_log_bytes" in metrics else ""
    return f"{int(count)} mean {mean_ms:.2f} ms, {int(slow)} over 12.8 ms{log}"

print(label, {k: report[k] for k in keys if report[k] is not None}, "node CPU s", node_cpu, "generator user/sys s", gen,
      "node RSS MiB", rss, "node disk writes MiB", written, "fsyncs", [fsyncs(n) for n in (1, 2, 3)])
PY

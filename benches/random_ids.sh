#!/usr/bin/env bash
# Batch publishing with ids the leader generates (random UUID v4, API.md §4), which the Rust
# client never sends: it gives every message a time-ordered id. Random ids are the worst case
# for the dedup index's compactions. Starts a fresh 3-node cluster on 127.0.0.1:19081-19083,
# has `wrk` post one body of 1,000 messages without ids to the leader's batch endpoint from
# 16 connections for SECONDS, and prints the rate, each node's CPU seconds and what the
# nodes' RocksDB compactions took (CPU seconds and MiB written, from their LOG files).
# Run it interleaved for two builds, like benches/ab.sh. Needs `wrk` (apt package wrk).
#
#   benches/random_ids.sh LABEL NODE_BIN PUBSUB_BIN [SECONDS]     (SECONDS defaults to 15)
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,10p' "$0"; exit 2; }
LABEL=$1 NODE=$2 GEN=$3 SECS=${4:-15}
command -v wrk >/dev/null || { echo "random_ids.sh needs wrk (apt-get install wrk)" >&2; exit 2; }
# shellcheck source=benches/local_cluster.sh
source "$(dirname "$0")/local_cluster.sh"
cluster_start "$NODE"
"$GEN" "${CLUSTER_SERVERS[@]}" --json topics create bench >/dev/null
cat >"$CLUSTER_DIR/batch.lua" <<'LUA'
local items = {}
for i = 1, 1000 do items[i] = '{"payload":{"pad":"' .. string.rep("x", 230) .. '"}}' end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"messages":[' .. table.concat(items, ",") .. ']}'
done = function(summary)
  io.write(string.format("batches %d, non-2xx %d\n", summary.requests, summary.errors.status))
end
LUA
before=$(cluster_cpu)
out=$(wrk -t2 -c16 -d"${SECS}s" --timeout 10s -s "$CLUSTER_DIR/batch.lua" \
    "http://127.0.0.1:1908$CLUSTER_LEADER/topics/bench/messages/batch")
after=$(cluster_cpu)
compactions=$(for n in 1 2 3; do
    grep -h '"event": "compaction_finished"' "$CLUSTER_DIR/n$n/db/LOG" | python3 -c '
import json, sys
cpu = out = 0
for line in sys.stdin:
    event = json.loads(line[line.index("{"):])
    cpu += event.get("compaction_time_cpu_micros", 0)
    out += event.get("total_output_size", 0)
print(f"{cpu / 1e6:.2f} s / {out >> 20} MiB", end="; ")'
done)
python3 - "$LABEL" "$out" "$before" "$after" "$compactions" <<'PY'
import re, sys
label, out, before, after, compactions = sys.argv[1:]
rate = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1)) * 1000
batches = re.search(r"batches \d+, non-2xx \d+", out).group(0)
node_cpu = [round(b - a, 2) for a, b in zip(map(float, before.split()), map(float, after.split()))]
print(label, f"{rate:.0f} msgs/s ({batches})", "node CPU s", node_cpu, "compactions per node:", compactions)
PY

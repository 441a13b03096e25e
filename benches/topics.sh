#!/usr/bin/env bash
# Batch publishing to several topics at once, on a fresh 3-node cluster on
# 127.0.0.1:19081-19083: TOPICS `pubsub bench` processes run together, each publishing
# MESSAGES messages in batches of 1,000 to a topic of its own (or all to one topic with
# SAME_TOPIC=1, the same load in one key range), PHASES times over on the same cluster. Each
# phase prints the rate of all of them together and the CPU the nodes used per message; at the
# end, what RocksDB compacted on node 1, per column family (from its LOG). The cluster and its
# data are removed at the end.
#
#   benches/topics.sh NODE_BIN PUBSUB_BIN
#   TOPICS=4 MESSAGES=100000 PHASES=3 SAME_TOPIC=1 benches/topics.sh ...   (the defaults but the last)
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,11p' "$0"; exit 2; }
NODE=$1 GEN=$2
TOPICS=${TOPICS:-4} MESSAGES=${MESSAGES:-100000} PHASES=${PHASES:-3}
# shellcheck source=benches/local_cluster.sh
source "$(dirname "$0")/local_cluster.sh"
cluster_start "$NODE"
topic_of() { if [ -n "${SAME_TOPIC:-}" ]; then echo t1; else echo "t$1"; fi; }
for t in $(seq "$TOPICS"); do "$GEN" "${CLUSTER_SERVERS[@]}" --json topics create "$(topic_of "$t")" >/dev/null; done

for phase in $(seq "$PHASES"); do
    before=$(cluster_cpu)
    began=$(date +%s.%N)
    gens=()
    for t in $(seq "$TOPICS"); do
        "$GEN" "${CLUSTER_SERVERS[@]}" --json bench --topic "$(topic_of "$t")" --batch 1000 --publishers 1 \
            --inflight 4 --messages "$MESSAGES" --payload-bytes 256 >"$CLUSTER_DIR/gen$t.out" 2>/dev/null &
        gens+=($!)
    done
    # Only the generators: the nodes are background jobs of this shell too.
    wait "${gens[@]}"
    ended=$(date +%s.%N)
    after=$(cluster_cpu)
    python3 - "$phase" "$began" "$ended" "$before" "$after" "$CLUSTER_DIR"/gen*.out <<'PY'
import json, sys
phase, began, ended, before, after, outputs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), \
    sys.argv[4], sys.argv[5], sys.argv[6:]
# Each generator's last line is its report: count what the cluster acknowledged, not what was asked.
reports = [json.loads(open(path).read().strip().splitlines()[-1]) for path in outputs]
acked, errors = sum(r["messages"] for r in reports), sum(r["errors"] for r in reports)
cpu = [b - a for a, b in zip(map(float, before.split()), map(float, after.split()))]
print(f"phase {phase}: {acked / (ended - began):,.0f} msgs/s, {acked:,} acknowledged, {errors} failed, "
      f"node CPU {[round(c, 2) for c in cpu]} s, {sum(cpu) * 1e6 / max(acked, 1):.1f} µs per message")
PY
done

python3 - "$CLUSTER_DIR/n1/db/LOG" <<'PY'
import collections, json, sys
jobs, read = collections.Counter(), collections.Counter()
for line in open(sys.argv[1], errors="replace"):
    at = line.find("EVENT_LOG_v1 ")
    if at < 0:
        continue
    event = json.loads(line[at + len("EVENT_LOG_v1 "):])
    if event.get("event") == "compaction_started":
        jobs[event["cf_name"]] += 1
        read[event["cf_name"]] += event["input_data_size"]
print("node 1 compactions:", ", ".join(f"{cf} {jobs[cf]} reading {read[cf] / 1e6:.0f} MB"
                                       for cf in sorted(read, key=read.get, reverse=True)) or "none")
PY

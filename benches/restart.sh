#!/usr/bin/env bash
# Memory and restart with many retained messages (issue 7's targets: 1,000,000 messages of
# 256 B keep a node under 200 MiB resident; a node holding them is ready within 3 s of a
# restart). Starts a fresh 3-node cluster on 127.0.0.1:19081-19083, loads it with batch
# publishes, prints each node's resident memory, `kill -9`s the leader, restarts it, and
# prints the time until its `/ready` answers 200, its memory 5 s later and the topic's
# sequence as that node serves it. The cluster and its data are removed at the end.
#
#   benches/restart.sh NODE_BIN PUBSUB_BIN [MESSAGES]     (MESSAGES defaults to 1000000)
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,9p' "$0"; exit 2; }
NODE=$1 GEN=$2 MESSAGES=${3:-1000000}
# shellcheck source=benches/local_cluster.sh
source "$(dirname "$0")/local_cluster.sh"
cluster_start "$NODE"
leader=$CLUSTER_LEADER
"$GEN" "${CLUSTER_SERVERS[@]}" --json topics create bench >/dev/null
"$GEN" "${CLUSTER_SERVERS[@]}" --json bench --topic bench --batch 1000 --publishers 4 --inflight 4 \
    --messages "$MESSAGES" --payload-bytes 256 2>/dev/null | tail -1 | sed 's/^/load: /'
rss() { awk '/VmRSS/ {printf "%d MiB", $2 / 1024}' "/proc/${CLUSTER_PIDS[$1]}/status"; }
for i in 1 2 3; do echo "node $i$([ "$i" = "$leader" ] && echo ' (leader)'): $(rss "$i") resident after the load"; done

kill -9 "${CLUSTER_PIDS[$leader]}"
wait "${CLUSTER_PIDS[$leader]}" 2>/dev/null || true
began=$(date +%s.%N)
cluster_start_node "$NODE" "$leader"
until curl -sf -o /dev/null "localhost:1908$leader/ready"; do
    kill -0 "${CLUSTER_PIDS[$leader]}" 2>/dev/null || { echo "node $leader exited; its log:" >&2; tail "$CLUSTER_DIR/n$leader.log" >&2; exit 1; }
    sleep 0.02
done
ready=$(date +%s.%N)
sequence() { curl -sf "localhost:1908$leader/topics/bench" | sed -n 's/.*"current_sequence":\([0-9]*\).*/\1/p'; }
echo "node $leader ready $(python3 -c "print(f'{$ready - $began:.2f}')") s after its restart after kill -9, topic at sequence $(sequence)"
sleep 5
after=$(sequence)
echo "node $leader: $(rss "$leader") resident 5 s later, topic at sequence $after of $MESSAGES"
[ "$after" = "$MESSAGES" ] || { echo "the restarted node lost messages" >&2; exit 1; }

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
WORK=$(mktemp -d)
peers="1=127.0.0.1:19081,2=127.0.0.1:19082,3=127.0.0.1:19083"
declare -A pids
start() {
    "$NODE" --id "$1" --listen "127.0.0.1:1908$1" --peers "$peers" --data-dir "$WORK/n$1" >>"$WORK/n$1.log" 2>&1 &
    pids[$1]=$!
}
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
for i in 1 2 3; do start "$i"; done
leader=""
for _ in $(seq 300); do
    leader=$(curl -sf localhost:19081/cluster | sed -n 's/.*"leader_id":"node-\([0-9]\)".*/\1/p') && [ -n "$leader" ] && break
    sleep 0.1
done
[ -n "$leader" ] || { echo "no leader elected" >&2; exit 1; }
servers=(-s http://127.0.0.1:19081 -s http://127.0.0.1:19082 -s http://127.0.0.1:19083)
"$GEN" "${servers[@]}" --json topics create bench >/dev/null
"$GEN" "${servers[@]}" --json bench --topic bench --batch 1000 --publishers 4 --inflight 4 \
    --messages "$MESSAGES" --payload-bytes 256 2>/dev/null | tail -1 | sed 's/^/load: /'
rss() { awk '/VmRSS/ {printf "%d MiB", $2 / 1024}' "/proc/${pids[$1]}/status"; }
for i in 1 2 3; do echo "node $i$([ "$i" = "$leader" ] && echo ' (leader)'): $(rss "$i") resident after the load"; done

kill -9 "${pids[$leader]}"
wait "${pids[$leader]}" 2>/dev/null || true
began=$(date +%s.%N)
start "$leader"
until curl -sf -o /dev/null "localhost:1908$leader/ready"; do
    kill -0 "${pids[$leader]}" 2>/dev/null || { echo "node $leader exited; its log:" >&2; tail "$WORK/n$leader.log" >&2; exit 1; }
    sleep 0.02
done
ready=$(date +%s.%N)
sequence() { curl -sf "localhost:1908$leader/topics/bench" | sed -n 's/.*"current_sequence":\([0-9]*\).*/\1/p'; }
echo "node $leader ready $(python3 -c "print(f'{$ready - $began:.2f}')") s after its restart after kill -9, topic at sequence $(sequence)"
sleep 5
sequence=$(sequence)
echo "node $leader: $(rss "$leader") resident 5 s later, topic at sequence $sequence of $MESSAGES"
[ "$sequence" = "$MESSAGES" ] || { echo "the restarted node lost messages" >&2; exit 1; }

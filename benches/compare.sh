#!/usr/bin/env bash
# Side-by-side benchmark on loopback: our 3-node cluster, a 3-node NATS JetStream cluster
# (R3 file-backed stream) and a 3-member etcd cluster, the same workloads against each in
# turn, one table per section at the end.
#
#   benches/compare.sh
#   SYSTEMS="ours nats" SECTIONS=fanout benches/compare.sh
#
# Sections (SECTIONS, default all four):
#   publish  256-byte payloads, every publish awaited until acknowledged (ours: quorum fsync,
#            over HTTP; NATS: JetStream PubAck; etcd: gRPC put response), C requests in flight in
#            total. Ours, NATS, etcd, and `edge`: our publish API's HTTP edge alone
#            (benches/peers/src/bin/http-edge.rs: one process, the node's HTTP stack and
#            request parsing, no Raft, no disk) driven by the same `pubsub bench`, the ceiling
#            of any per-message HTTP publish on this machine with this client.
#   ws       the same, ours publishing over its WebSocket (`pubsub bench --transport ws`,
#            ceil(C/64) publishers x up to 64 in flight), reported as `ours-ws`, next to NATS
#            (one connection, C publishes in flight) at the same C. Ours and NATS.
#   batch    ours: the batch endpoint, B messages per request, C requests in flight
#            (4 publishers x C/4), 256-byte payloads, each request awaited until
#            acknowledged; NATS: one message per publish with thousands in flight on one
#            connection (its async publish, BATCH_NATS_CONCURRENCY); compared with the best
#            NATS rate of the same run, any C.
#   fanout   (each system on a fresh cluster, after the sections before)
#            one publisher paced at R msgs/s (up to 64 publishes in flight, each awaited
#            until acknowledged) and K subscribers that joined before it started (ours:
#            WebSocket subscriptions at the latest cursor; NATS: JetStream ordered push
#            consumers, deliver policy New, one connection each); deliver latency runs from
#            a timestamp in the payload to arrival at a subscriber. Ours and NATS; the table
#            has deliver p50/p99/p99.9 and ours/NATS of the deliver p99 (below 1: ours is
#            faster).
# Knobs (environment):
#   SECTIONS="publish ws batch fanout" which sections to run
#   SYSTEMS="ours nats etcd edge"  which systems to run (etcd and edge only take part in publish)
#   CONCURRENCY="1 16 64"       publish: C values
#   MESSAGES="3000 40000 80000" publish: messages per C (same order as CONCURRENCY); sized so
#                               that every run lasts seconds (about 3-5 s for NATS and ours,
#                               more for etcd), not one: a one-second run is mostly setup and
#                               start-up, with a few dozen samples past p99.9
#   WS_CONCURRENCY="64 256"     ws: C values (NATS runs the ones publish has not run)
#   WS_MESSAGES="80000 160000"  ws: messages per C
#   BATCH="100:16 1000:16"      batch: runs as B:C (B messages per request, C requests in flight)
#   BATCH_MESSAGES=600000       batch: messages per run
#   BATCH_NATS_CONCURRENCY="1024 4096"  batch: NATS's counterpart, one message per publish with
#                               C in flight on one connection (async publish, thousands of
#                               PubAcks outstanding), BATCH_NATS_MESSAGES=300000 each
#   FANOUT="100:1000 1000:100"  fanout: runs as K:R (K subscribers, R msgs/s) or K:R:N
#   FANOUT_SECS=10              fanout: N = R x FANOUT_SECS when a run gives no N
#   FANOUT_TRANSPORT=http       fanout: how ours publishes (http or ws)
#   FANOUT_NATS_CONNECTIONS=0   fanout: connections NATS subscribers share (0: one each)
#   RUN_SECS=60                 time limit of one publish or ws run (the generator stops
#                               publishing); a fanout run gets N/R + 30 s
#   PORT_BASE=29000             ports PORT_BASE+80.. (ours), +220.. (NATS), +379.. (etcd), +400 (edge)
#   ROUNDS=1                    repeat everything; the order of the systems rotates each
#                               round, every round starts each system on empty data
#                               directories, and each cell of the tables is its median run
#                               (by msgs/s; fanout: by deliver p99; of an even number, the
#                               worse of the middle two; a round with no result for it counts
#                               as its worst); every run is listed below the tables
#                               (use 3 on a shared, noisy machine)
#   PAYLOAD_CONTENT=text        what fills our payloads (`pubsub bench --payload-content`: text,
#                               random or repeat). Ours compresses stored messages, so this
#                               matters for ours alone; the peers' generator sends x…x, and
#                               neither NATS 2.9's file store nor etcd compresses
#   KEEP_DATA=1                 keep the temporary data directory
# Everything listens on 127.0.0.1 and is stopped on exit. Each cluster runs only during its
# own runs, so they never compete for the CPU (the load generator shares the machine
# with the cluster under test). A peer whose Debian package (nats-server, etcd-server) is
# missing and cannot be installed is skipped with a note. The open-files limit is raised to
# its hard limit for the fanout section's many connections.
#
# Builds: ours is expected in ${CARGO_TARGET_DIR:-~/.cache/pubsub-raft/target}/release
# (or the repository's target/release; built into the former when missing); the peers'
# load generator and the HTTP edge (benches/peers, its own Cargo project) go to
# "${CARGO_TARGET_DIR:-~/.cache/pubsub-raft/target}-peers", outside the repository.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$HOME/.cache/pubsub-raft/target}
PEERS_TARGET="$TARGET-peers"
BIN="$TARGET/release"
# scripts/test.sh now builds into the repository's target/ by default: reuse those binaries
# rather than rebuilding RocksDB when CARGO_TARGET_DIR is unset and ~/.cache has none.
if [ -z "${CARGO_TARGET_DIR:-}" ] && [ ! -x "$BIN/pubsub-node" ] && [ -x "$ROOT/target/release/pubsub-node" ]; then
    BIN="$ROOT/target/release"
fi
PEERS_BIN="$PEERS_TARGET/release/peers-bench"
EDGE_BIN="$PEERS_TARGET/release/http-edge"

read -r -a SECT <<<"${SECTIONS:-publish ws batch fanout}"
read -r -a CS <<<"${CONCURRENCY:-1 16 64}"
read -r -a NS <<<"${MESSAGES:-3000 40000 80000}"
read -r -a WS_CS <<<"${WS_CONCURRENCY:-64 256}"
read -r -a WS_NS <<<"${WS_MESSAGES:-80000 160000}"
read -r -a FANOUT_RUNS <<<"${FANOUT:-100:1000 1000:100}"
read -r -a BATCH_RUNS <<<"${BATCH:-100:16 1000:16}"
BATCH_MESSAGES=${BATCH_MESSAGES:-600000}
read -r -a BATCH_NATS_CS <<<"${BATCH_NATS_CONCURRENCY:-1024 4096}"
BATCH_NATS_MESSAGES=${BATCH_NATS_MESSAGES:-300000}
read -r -a SYS <<<"${SYSTEMS:-ours nats etcd edge}"
FANOUT_SECS=${FANOUT_SECS:-10}
FANOUT_TRANSPORT=${FANOUT_TRANSPORT:-http}
FANOUT_NATS_CONNECTIONS=${FANOUT_NATS_CONNECTIONS:-0}
RUN_SECS=${RUN_SECS:-60}
ROUNDS=${ROUNDS:-1}
PAYLOAD=256
PAYLOAD_CONTENT=${PAYLOAD_CONTENT:-text}
# Every run of ours publishes these payloads.
PAYLOAD_ARGS=(--payload-bytes "$PAYLOAD" --payload-content "$PAYLOAD_CONTENT")
PB=${PORT_BASE:-29000}
[ "${#CS[@]}" -eq "${#NS[@]}" ] || { echo "CONCURRENCY and MESSAGES need the same number of values" >&2; exit 2; }
[ "${#WS_CS[@]}" -eq "${#WS_NS[@]}" ] || { echo "WS_CONCURRENCY and WS_MESSAGES need the same number of values" >&2; exit 2; }
for x in "${SECT[@]}"; do
    case $x in publish | ws | batch | fanout) ;; *) echo "unknown section $x (publish, ws, batch, fanout)" >&2; exit 2 ;; esac
done
for x in "${BATCH_RUNS[@]}"; do
    [[ $x =~ ^[1-9][0-9]*:[1-9][0-9]*$ ]] || { echo "BATCH: $x is not B:C" >&2; exit 2; }
done
for x in "${FANOUT_RUNS[@]}"; do
    [[ $x =~ ^[1-9][0-9]*:[1-9][0-9]*(:[1-9][0-9]*)?$ ]] || { echo "FANOUT: $x is not K:R or K:R:N" >&2; exit 2; }
done
# section NAME: NAME is among SECTIONS.
section() { case " ${SECT[*]} " in *" $1 "*) return 0 ;; esac; return 1; }
# fanout_run K:R[:N]: sets FK, FR and FN (N defaults to R x FANOUT_SECS).
fanout_run() { IFS=: read -r FK FR FN <<<"$1"; FN=${FN:-$((FR * FANOUT_SECS))}; }
# ws_only_cs: the ws C values the publish section does not run (NATS runs them for ws).
ws_only_cs() {
    local k c
    for k in "${!WS_CS[@]}"; do
        c=${WS_CS[$k]}
        if section publish && [[ " ${CS[*]} " == *" $c "* ]]; then continue; fi
        echo "$k"
    done
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/pubsub-compare.XXXXXX")
RESULTS="$WORK/results.tsv"
FANOUT_RESULTS="$WORK/fanout.tsv"
NOTES="$WORK/notes.txt"
: >"$RESULTS"
: >"$FANOUT_RESULTS"
: >"$NOTES"
PIDS=()
SKIPPED=""

log() { echo "compare: $*" >&2; }
# The round being run (1-based; empty before the first), which notes and result rows name when
# there are several.
ROUND=
note() {
    local what="$*"
    [ "$ROUNDS" -eq 1 ] || [ -z "$ROUND" ] || what="round $ROUND: $what"
    echo "$what" >>"$NOTES"; log "$what"
}

stop_all() {
    local pid
    for pid in "${PIDS[@]}"; do [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do [ -z "$pid" ] || wait "$pid" 2>/dev/null || true; done
    PIDS=()
}
cleanup() {
    stop_all
    if [ -n "${KEEP_DATA:-}" ]; then log "data and logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Polls `cmd...` every 0.2 s until it succeeds or `secs` pass.
wait_for() {
    local secs=$1 what=$2; shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$end" ]; then log "timed out waiting for $what"; return 1; fi
        sleep 0.2
    done
}

# forget_pid PID: drops PID from PIDS (the element, not a substring of the others).
forget_pid() {
    local kept=() p
    for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || kept+=("$p"); done
    PIDS=("${kept[@]}")
}

# Starts a background process with its output in $WORK/<name>.log and remembers its pid.
spawn() {
    local name=$1; shift
    "$@" >"$WORK/$name.log" 2>&1 &
    PIDS+=("$!")
}

# The whole machine's busy CPU time so far, in clock ticks (user, nice, system, irq,
# softirq; not idle, iowait or steal). One system runs at a time, so what a run adds to it is
# that system's cost, its cluster and its load generator together.
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
busy_ticks() { awk '/^cpu /{ print $2 + $3 + $4 + $7 + $8 }' /proc/stat 2>/dev/null || echo 0; }

# run_gen LOGNAME SECS cmd...: runs a load generator (killed after SECS) in the background,
# so a signal reaches the EXIT trap at once, and sets LINE to its last stdout line and
# BUSY_SECS to the machine's busy CPU seconds during the run.
run_gen() {
    local name=$1 secs=$2; shift 2
    local before
    before=$(busy_ticks)
    timeout "$secs" "$@" >"$WORK/gen.out" 2>>"$WORK/$name-bench.log" &
    local pid=$!
    PIDS+=("$pid")
    wait "$pid" || log "$name generator exited with status $?"
    forget_pid "$pid"
    BUSY_SECS=$(awk -v a="$before" -v b="$(busy_ticks)" -v hz="$CLK_TCK" 'BEGIN { printf "%.3f", (b - a) / hz }')
    LINE=$(tail -n 1 "$WORK/gen.out")
}

# json_num FIELD LINE: a numeric field of a flat JSON object (no jq needed).
json_num() { sed -nE "s/.*\"$1\":(-?[0-9.eE+-]+).*/\1/p" <<<"$2"; }

# record SYSTEM C REQUESTED_MESSAGES JSON_LINE  (publish and ws sections; after run_gen)
record() {
    local sys=$1 c=$2 want=$3 line=$4
    local rate p50 p99 n errs cpu_us
    rate=$(json_num msgs_per_sec "$line"); p50=$(json_num p50_ms "$line"); p99=$(json_num p99_ms "$line")
    n=$(json_num messages "$line"); errs=$(json_num errors "$line")
    # A run with no result writes no row: the tables count it as the worst run of its cell.
    if [ -z "$rate" ]; then note "$sys C=$c: no result"; return; fi
    cpu_us=$(awk -v s="$BUSY_SECS" -v n="$n" 'BEGIN { printf "%.1f", (n > 0 ? s * 1e6 / n : 0) }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$sys" "$c" "$rate" "$p50" "$p99" "$n" "${errs:-0}" "$want" "$cpu_us" "$ROUND" >>"$RESULTS"
    log "$sys C=$c: $(printf '%.0f msgs/s, p50 %.2f ms, p99 %.2f ms, %s acked, %s errors, %.0f µs of machine CPU per message' \
        "$rate" "$p50" "$p99" "$n" "${errs:-0}" "$cpu_us")"
}

# record_fanout SYSTEM K R REQUESTED_MESSAGES JSON_LINE
record_fanout() {
    local sys=$1 k=$2 r=$3 want=$4 line=$5
    local rate n errs got miss derrs d50 d99 d999
    rate=$(json_num msgs_per_sec "$line"); n=$(json_num messages "$line"); errs=$(json_num errors "$line")
    got=$(json_num delivered "$line"); miss=$(json_num deliver_missing "$line"); derrs=$(json_num deliver_errors "$line")
    d50=$(json_num deliver_p50_ms "$line"); d99=$(json_num deliver_p99_ms "$line"); d999=$(json_num deliver_p999_ms "$line")
    if [ -z "$d99" ]; then note "$sys fanout K=$k R=$r: no result"; return; fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$sys" "$k" "$r" "$want" "$rate" "$n" "${errs:-0}" \
        "$got" "${miss:-0}" "$d50" "$d99" "$d999" "$ROUND" >>"$FANOUT_RESULTS"
    log "$sys fanout K=$k R=$r: $(printf '%.0f msgs/s, %s acked, %s errors, %s delivered, %s missing, %s stream errors; deliver p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms' \
        "$rate" "$n" "${errs:-0}" "$got" "${miss:-0}" "${derrs:-0}" "$d50" "$d99" "$d999")"
    if [ "${derrs:-0}" != 0 ]; then note "$sys fanout K=$k R=$r: $derrs subscriber stream errors (gaps or reconnects spent)"; fi
}

# have_pkg BINARY PACKAGE: the binary exists, or the package installs.
have_pkg() {
    command -v "$1" >/dev/null 2>&1 && return 0
    log "$1 missing: installing Debian package $2"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
    { $sudo apt-get update && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y "$2"; } >"$WORK/apt-$2.log" 2>&1 || true
    command -v "$1" >/dev/null 2>&1
}

# The fanout section opens a connection per subscriber (ours, NATS).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")

# ---------------------------------------------------------------- builds
# The edge is driven by our `pubsub bench` too.
if [[ " ${SYS[*]} " == *" ours "* || " ${SYS[*]} " == *" edge "* ]] && { [ ! -x "$BIN/pubsub-node" ] || [ ! -x "$BIN/pubsub" ]; }; then
    log "building pubsub-node and pubsub (release)"
    (cd "$ROOT" && CARGO_TARGET_DIR="$TARGET" cargo build --release --bin pubsub-node --bin pubsub)
fi
NEED_PEERS=""
for s in "${SYS[@]}"; do
    case $s in nats) NEED_PEERS=1 ;; etcd | edge) if section publish; then NEED_PEERS=1; fi ;; esac
done
if [ -n "$NEED_PEERS" ]; then
    # etcd-client compiles etcd's protobuf definitions when it builds: without protoc the
    # peers' generator cannot be built, and only ours runs.
    if have_pkg protoc protobuf-compiler; then
        log "building the peers' load generator and the HTTP edge into $PEERS_TARGET"
        CARGO_TARGET_DIR="$PEERS_TARGET" cargo build --release --quiet --manifest-path "$ROOT/benches/peers/Cargo.toml"
    else
        note "protoc missing and protobuf-compiler not installable: the peers' load generator cannot be built; nats, etcd and edge skipped"
        SKIPPED+=" nats etcd edge"
    fi
fi

# ---------------------------------------------------------------- per-message HTTP publish
# publish_runs SYSTEM SERVER_ARGS...: the publish section's runs of `pubsub bench` against
# the servers SERVER_ARGS names (`-s URL`...), one per C: 1x1, 4x4 or 8x8 publishers x in flight.
publish_runs() {
    local sys=$1; shift
    local k c n p f
    for k in "${!CS[@]}"; do
        c=${CS[$k]}; n=${NS[$k]}
        case $c in 1) p=1 f=1 ;; 16) p=4 f=4 ;; 64) p=8 f=8 ;; *) p=1 f=$c ;; esac
        "$BIN/pubsub" "$@" --json topics create "bench-c$c" >/dev/null 2>&1 || true
        log "$sys C=$c ($p publishers x $f in flight), $n messages"
        run_gen "$sys" $((RUN_SECS + 60)) "$BIN/pubsub" "$@" --json bench --publishers "$p" --inflight "$f" \
            --messages "$n" "${PAYLOAD_ARGS[@]}" --topic "bench-c$c" --duration-secs "$RUN_SECS"
        record "$sys" "$c" "$n" "$LINE"
    done
}

# ---------------------------------------------------------------- ours
# slow_fsyncs: each of our nodes' log fsyncs so far that took over 12.8 ms (from /metrics):
# a disk stall holds every commit behind it, and shows in a fan-out's tail.
slow_fsyncs() {
    local i
    for i in 1 2 3; do
        curl -sf "http://127.0.0.1:$((PB + 80 + i))/metrics" | awk '
            /^pubsub_log_fsync_seconds_count / { count = $2 }
            /^pubsub_log_fsync_seconds_bucket\{le="0.0128"\} / { fast = $2 }
            END { printf "%d ", count - fast }'
    done
}

# start_ours: our 3-node cluster on empty data directories, once it has a leader.
start_ours() {
    local peers="" i
    for i in 1 2 3; do peers+="${peers:+,}$i=127.0.0.1:$((PB + 80 + i))"; done
    rm -rf "${WORK:?}/ours"
    for i in 1 2 3; do
        mkdir -p "$WORK/ours/n$i"
        spawn "ours-$i" "$BIN/pubsub-node" --id "$i" --listen "127.0.0.1:$((PB + 80 + i))" \
            --peers "$peers" --data-dir "$WORK/ours/n$i"
    done
    leader_known() { curl -sf "http://127.0.0.1:$((PB + 81))/cluster" | grep -q '"leader_id":"node-'; }
    wait_for 60 "our leader" leader_known || { note "ours: no leader within 60 s, skipped"; stop_all; return 1; }
}

run_ours() {
    local i urls=()
    for i in 1 2 3; do urls+=(-s "http://127.0.0.1:$((PB + 80 + i))"); done
    start_ours || return 0
    local k c n p f x slow_before
    if section publish; then publish_runs ours "${urls[@]}"; fi
    if section ws; then
        for k in "${!WS_CS[@]}"; do
            c=${WS_CS[$k]}; n=${WS_NS[$k]}
            p=$(((c + 63) / 64)); f=$((c / p))
            "$BIN/pubsub" "${urls[@]}" --json topics create "bench-ws-c$c" >/dev/null 2>&1 || true
            log "ours-ws C=$c ($p WebSocket publishers x $f in flight), $n messages"
            run_gen ours-ws $((RUN_SECS + 60)) "$BIN/pubsub" "${urls[@]}" --json bench --transport ws --publishers "$p" \
                --inflight "$f" --messages "$n" "${PAYLOAD_ARGS[@]}" --topic "bench-ws-c$c" --duration-secs "$RUN_SECS"
            record ours-ws "$c" "$n" "$LINE"
        done
    fi
    if section batch; then
        local b
        for x in "${BATCH_RUNS[@]}"; do
            IFS=: read -r b c <<<"$x"
            p=$((c < 4 ? c : 4)); f=$(((c + p - 1) / p))
            "$BIN/pubsub" "${urls[@]}" --json topics create "bench-b$b-c$c" >/dev/null 2>&1 || true
            log "ours batch B=$b C=$c ($p publishers x $f requests in flight), $BATCH_MESSAGES messages"
            run_gen ours-batch $((RUN_SECS + 60)) "$BIN/pubsub" "${urls[@]}" --json bench --batch "$b" --publishers "$p" \
                --inflight "$f" --messages "$BATCH_MESSAGES" "${PAYLOAD_ARGS[@]}" --topic "bench-b$b-c$c" \
                --duration-secs "$RUN_SECS"
            record "ours-batch$b" "$c" "$BATCH_MESSAGES" "$LINE"
        done
    fi
    if section fanout; then
        # A fresh cluster, as NATS's fan-out gets fresh streams: after the sections before, ours
        # would still be flushing and compacting a million messages during the fan-out.
        if section publish || section ws || section batch; then
            stop_all
            start_ours || return 0
        fi
        for x in "${FANOUT_RUNS[@]}"; do
            fanout_run "$x"
            "$BIN/pubsub" "${urls[@]}" --json topics create "fanout-k$FK-r$FR" >/dev/null 2>&1 || true
            log "ours fanout: $FK subscribers, 1 $FANOUT_TRANSPORT publisher at $FR msgs/s, $FN messages"
            slow_before=$(slow_fsyncs)
            run_gen ours $((FN / FR + 210)) "$BIN/pubsub" "${urls[@]}" --json bench --transport "$FANOUT_TRANSPORT" \
                --publishers 1 --inflight 64 --subscribers "$FK" --rate "$FR" --messages "$FN" \
                "${PAYLOAD_ARGS[@]}" --topic "fanout-k$FK-r$FR" --duration-secs $((FN / FR + 30))
            record_fanout ours "$FK" "$FR" "$FN" "$LINE"
            log "ours fanout K=$FK R=$FR: log fsyncs over 12.8 ms so far, nodes 1-3: $(slow_fsyncs)(before this run: $slow_before)"
        done
    fi
    stop_all
}

# ---------------------------------------------------------------- NATS JetStream
# start_nats: the 3-node NATS cluster on empty data directories, once every server is healthy.
start_nats() {
    local i j routes
    rm -rf "${WORK:?}/nats"
    for i in 1 2 3; do
        routes=""
        for j in 1 2 3; do [ "$j" = "$i" ] || routes+="${routes:+,}nats://127.0.0.1:$((PB + 230 + j))"; done
        mkdir -p "$WORK/nats/n$i"
        spawn "nats-$i" nats-server -a 127.0.0.1 -p "$((PB + 220 + i))" -m "$((PB + 240 + i))" \
            --server_name "n$i" -js -sd "$WORK/nats/n$i" --cluster_name bench \
            --cluster "nats://127.0.0.1:$((PB + 230 + i))" --routes "$routes"
    done
    for i in 1 2 3; do
        # /healthz answers 200 once the server, and JetStream, is ready.
        wait_for 60 "nats n$i" curl -sf "http://127.0.0.1:$((PB + 240 + i))/healthz" \
            || { note "nats: n$i not healthy within 60 s, skipped"; stop_all; return 1; }
    done
}

run_nats() {
    have_pkg nats-server nats-server || { note "nats: package nats-server not installable, skipped"; SKIPPED+=" nats"; return; }
    local i servers=""
    for i in 1 2 3; do servers+="${servers:+,}127.0.0.1:$((PB + 220 + i))"; done
    start_nats || return 0
    local k c n x runs=()
    if section publish; then
        for k in "${!CS[@]}"; do runs+=("${CS[$k]}:${NS[$k]}"); done
    fi
    if section ws; then
        for k in $(ws_only_cs); do runs+=("${WS_CS[$k]}:${WS_NS[$k]}"); done
    fi
    # NATS's counterpart of a batch: async publishes with thousands of PubAcks outstanding.
    if section batch; then
        for c in "${BATCH_NATS_CS[@]}"; do runs+=("$c:$BATCH_NATS_MESSAGES"); done
    fi
    for x in "${runs[@]}"; do
        c=${x%%:*}; n=${x#*:}
        log "nats C=$c, $n messages"
        run_gen nats $((RUN_SECS + 90)) "$PEERS_BIN" nats --servers "$servers" --stream "BENCH_C$c" \
            --concurrency "$c" --messages "$n" --payload-bytes "$PAYLOAD" --duration-secs "$RUN_SECS"
        record nats "$c" "$n" "$LINE"
    done
    if section fanout; then
        # A fresh cluster, as ours gets.
        if [ "${#runs[@]}" -gt 0 ]; then
            stop_all
            start_nats || return 0
        fi
        for x in "${FANOUT_RUNS[@]}"; do
            fanout_run "$x"
            log "nats fanout: $FK ordered consumers, 1 publisher at $FR msgs/s, $FN messages"
            run_gen nats $((FN / FR + 210)) "$PEERS_BIN" nats-fanout --servers "$servers" --stream "FANOUT_K${FK}_R$FR" \
                --subscribers "$FK" --connections "$FANOUT_NATS_CONNECTIONS" --rate "$FR" --inflight 64 \
                --messages "$FN" --payload-bytes "$PAYLOAD" --duration-secs $((FN / FR + 30))
            record_fanout nats "$FK" "$FR" "$FN" "$LINE"
        done
    fi
    stop_all
}

# ---------------------------------------------------------------- etcd
run_etcd() {
    section publish || return 0
    have_pkg etcd etcd-server || { note "etcd: package etcd-server not installable, skipped"; SKIPPED+=" etcd"; return; }
    local i cluster="" servers=""
    for i in 1 2 3; do cluster+="${cluster:+,}e$i=http://127.0.0.1:$((PB + 380 + 2 * i))"; done
    for i in 1 2 3; do
        local cport=$((PB + 379 + 2 * i)) pport=$((PB + 380 + 2 * i))
        spawn "etcd-$i" etcd --name "e$i" --data-dir "$WORK/etcd/e$i" \
            --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
            --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
            --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token pubsub-compare
        servers+="${servers:+,}http://127.0.0.1:$cport"
    done
    for i in 1 2 3; do
        etcd_healthy() { curl -sf "http://127.0.0.1:$((PB + 379 + 2 * i))/health" | grep -q '"health":"true"'; }
        wait_for 60 "etcd e$i" etcd_healthy || { note "etcd: e$i not healthy within 60 s, skipped"; stop_all; return; }
    done
    local k c n
    for k in "${!CS[@]}"; do
        c=${CS[$k]}; n=${NS[$k]}
        log "etcd C=$c, $n messages"
        run_gen etcd $((RUN_SECS + 90)) "$PEERS_BIN" etcd --servers "$servers" \
            --concurrency "$c" --messages "$n" --payload-bytes "$PAYLOAD" --duration-secs "$RUN_SECS"
        record etcd "$c" "$n" "$LINE"
    done
    stop_all
}

# ---------------------------------------------------------------- our HTTP edge alone
run_edge() {
    section publish || return 0
    local addr="127.0.0.1:$((PB + 400))"
    spawn edge "$EDGE_BIN" "$addr"
    wait_for 30 "the HTTP edge" curl -sf "http://$addr/cluster" || { note "edge: not answering within 30 s, skipped"; stop_all; return; }
    publish_runs edge -s "http://$addr"
    stop_all
}

for ((r = 0; r < ROUNDS; r++)); do
    ROUND=$((r + 1))
    for ((q = 0; q < ${#SYS[@]}; q++)); do
        s=${SYS[$(((q + r) % ${#SYS[@]}))]}
        case " $SKIPPED " in *" $s "*) continue ;; esac
        [ "$ROUNDS" -eq 1 ] || log "round $((r + 1))/$ROUNDS: $s"
        # Every round starts each system on empty data directories, so rounds measure the same
        # thing (a restart on the previous round's data made ours pay for compacting it).
        rm -rf "${WORK:?}/$s"
        case $s in
            ours) run_ours ;;
            nats) run_nats ;;
            etcd) run_etcd ;;
            edge) run_edge ;;
            *) note "unknown system $s, skipped"; SKIPPED+=" $s" ;;
        esac
    done
done

# ---------------------------------------------------------------- the tables
# The median run of a cell, shared by the publish and fan-out tables (awk run with
# -v rounds=$ROUNDS): each rule puts a cell k's runs in runs[k], row[k, i] and by[k, i] (the
# figure the runs are ordered by); a round that gave the cell no result (the run or its
# system's start failed) counts as its worst run, and of an even number the worse middle run
# is taken.
# shellcheck disable=SC2016 # awk code, expanded by awk
MEDIAN_RUN='
    # The index of the median of key k'"'"'s runs, ordered worst first by by[] (ascending when
    # higher is better (1), descending when lower is (-1)) after the rounds with no result;
    # 0 when the median is a round with no result.
    function median(k, higher_better,   m, i, j, t, at, missing, mid) {
        m = runs[k]; missing = rounds > m ? rounds - m : 0
        for (i = 1; i <= m; i++) at[i] = i
        for (i = 2; i <= m; i++)
            for (j = i; j > 1 && higher_better * (by[k, at[j - 1]] - by[k, at[j]]) > 0; j--) { t = at[j]; at[j] = at[j - 1]; at[j - 1] = t }
        mid = int((m + missing + 1) / 2)
        return mid <= missing ? 0 : at[mid - missing]
    }'
# Each publish/ws/batch cell is its median run per (system, C) by msgs/s: the awk prelude
# shared by the tables, whose END runs before theirs.
# shellcheck disable=SC2016 # awk code, expanded by awk
MEDIAN_PUBLISH="$MEDIAN_RUN"'
    { k = $1 SUBSEP $2; runs[k]++; row[k, runs[k]] = $0; by[k, runs[k]] = $3 }
    END {
        for (k in runs) {
            i = median(k, 1)
            if (i == 0) { no_result[k] = 1; continue }
            split(row[k, i], f, "\t")
            rate[k] = f[3]; p50[k] = f[4]; p99[k] = f[5]; acked[k] = f[6]; errs[k] = f[7]; want[k] = f[8]; cpu[k] = f[9]
        }
    }
    function cpu_cell(s, c) { return ((s, c) in cpu && cpu[s, c] > 0) ? sprintf("%.0f", cpu[s, c]) : "—" }
    function cell(s, c) {
        if ((s, c) in rate) return sprintf("%.0f | %.2f | %.2f", rate[s, c], p50[s, c], p99[s, c])
        return ((s, c) in no_result) ? "no result | — | —" : "— | — | —"
    }
    function ratio(s, c, other) {
        return ((s, c) in rate && (other, c) in rate && rate[other, c] > 0) ? sprintf("%.2f×", rate[s, c] / rate[other, c]) : "—"
    }'
echo
echo "3 nodes per system on 127.0.0.1, ${PAYLOAD}-byte payloads (ours: $PAYLOAD_CONTENT), every publish awaited until acknowledged"
[ "$ROUNDS" -eq 1 ] || echo "each cell the median of $ROUNDS rounds (of an even number, the worse middle run; a round with no result counts as the worst; system order rotated each round; every run listed below)"
echo "($(nproc) cores, $(date -u +'%Y-%m-%d %H:%M UTC'); load average before $LOAD_BEFORE, after $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?"))"
# What "acknowledged" means differs: say so, with the peers' versions, under every table.
# ran SYSTEM: SYSTEM is among SYSTEMS and was not skipped.
ran() { [[ " ${SYS[*]} " == *" $1 "* && " $SKIPPED " != *" $1 "* ]]; }
# version_of SYSTEM CMD...: the version CMD prints, or "not run" when SYSTEM was not run.
version_of() {
    local sys=$1; shift
    if ran "$sys"; then "$@" 2>/dev/null | head -n 1; else echo "not run"; fi
}
echo "Acknowledged: ours once a majority fsynced the entry; NATS ($(version_of nats nats-server --version))"
echo "at its PubAck, stored by a majority but fsynced only every 2 minutes (its default sync_interval);"
echo "etcd ($(version_of etcd etcd --version)) once a majority fsynced (puts over gRPC, its own"
echo "client protocol, C in flight on one connection to the leader)."
if section publish; then
    echo
    echo "Publish (ours over HTTP), C requests in flight; the HTTP edge alone is our publish API with no Raft and no"
    echo "disk behind it (one process), the same client: the ceiling of per-message HTTP on this machine:"
    echo
    awk -F'\t' -v rounds="$ROUNDS" -v cs="${CS[*]}" -v ns="${NS[*]}" "$MEDIAN_PUBLISH"'
        END {
            nc = split(cs, C, " "); split(ns, N, " ")
            print "| C | messages | ours msgs/s | p50 ms | p99 ms | NATS JetStream R3 msgs/s | p50 ms | p99 ms | etcd 3.4 msgs/s | p50 ms | p99 ms | ours/NATS | ours/etcd | HTTP edge alone msgs/s | p50 ms | p99 ms | ours/edge | NATS/edge |"
            print "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
            for (i = 1; i <= nc; i++) {
                c = C[i]
                printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c, N[i], cell("ours", c), cell("nats", c), cell("etcd", c), ratio("ours", c, "nats"), ratio("ours", c, "etcd"), cell("edge", c), ratio("ours", c, "edge"), ratio("nats", c, "edge")
            }
        }' "$RESULTS"
    echo
    echo "The machine's busy CPU time per acknowledged message during each run above (µs; cluster and load generator"
    echo "together, from /proc/stat; $(nproc) cores are full at $(nproc),000,000 / this messages per second):"
    echo
    awk -F'\t' -v rounds="$ROUNDS" -v cs="${CS[*]}" "$MEDIAN_PUBLISH"'
        END {
            nc = split(cs, C, " ")
            print "| C | ours | NATS JetStream R3 | etcd 3.4 | HTTP edge alone |"
            print "|---|---|---|---|---|"
            for (i = 1; i <= nc; i++) {
                c = C[i]
                printf "| %s | %s | %s | %s | %s |\n", c, cpu_cell("ours", c), cpu_cell("nats", c), cpu_cell("etcd", c), cpu_cell("edge", c)
            }
        }' "$RESULTS"
fi
if section ws; then
    echo
    echo "Publish over our WebSocket (ours-ws: ceil(C/64) publishers x up to 64 in flight) vs NATS (one connection, C in flight):"
    echo
    awk -F'\t' -v rounds="$ROUNDS" -v cs="${WS_CS[*]}" -v ns="${WS_NS[*]}" "$MEDIAN_PUBLISH"'
        END {
            nc = split(cs, C, " "); split(ns, N, " ")
            print "| C | messages | ours-ws msgs/s | p50 ms | p99 ms | ours HTTP msgs/s | p50 ms | p99 ms | NATS JetStream R3 msgs/s | p50 ms | p99 ms | ours-ws/NATS |"
            print "|---|---|---|---|---|---|---|---|---|---|---|---|"
            for (i = 1; i <= nc; i++) {
                c = C[i]
                printf "| %s | %s | %s | %s | %s | %s |\n", c, N[i], cell("ours-ws", c), cell("ours", c), cell("nats", c), ratio("ours-ws", c, "nats")
            }
        }' "$RESULTS"
fi
if section batch; then
    echo
    echo "Batch publish (ours: B messages per request, C requests in flight; latency per request) vs the best"
    echo "NATS rate of this run (its highest cell, of any C: publish, ws, and the batch section's ${BATCH_NATS_CS[*]} in flight, NATS's async publish):"
    echo
    awk -F'\t' -v rounds="$ROUNDS" -v batch_runs="${BATCH_RUNS[*]}" "$MEDIAN_PUBLISH"'
        END {
            # NATS'"'"'s best C: the highest of its cells (each a median over the rounds).
            for (k in rate) { split(k, sc, SUBSEP); if (sc[1] == "nats" && rate[k] > nats_best) { nats_best = rate[k]; nats_c = sc[2] } }
            nr = split(batch_runs, R, " ")
            print "| B | C | messages | ours msgs/s | p50 ms | p99 ms | best NATS msgs/s (its C) | ours/NATS |"
            print "|---|---|---|---|---|---|---|---|"
            for (i = 1; i <= nr; i++) {
                split(R[i], bc, ":"); s = "ours-batch" bc[1]; c = bc[2]
                nats = nats_best > 0 ? sprintf("%.0f (C=%s)", nats_best, nats_c) : "—"
                r = (nats_best > 0 && (s, c) in rate) ? sprintf("%.2f×", rate[s, c] / nats_best) : "—"
                printf "| %s | %s | %s | %s | %s | %s |\n", bc[1], c, (s, c) in want ? want[s, c] : "—", cell(s, c), nats, r
            }
        }' "$RESULTS"
fi
# Publish/ws/batch notes, of every run (not only the median ones): failed publishes, runs that
# hit the time limit.
awk -F'\t' -v rounds="$ROUNDS" '
    { what = (rounds > 1 ? "round " $10 ": " : "") $1 " C=" $2 }
    $7 > 0 { printf "\nnote: %s: %s publishes failed\n", what, $7 }
    $6 < $8 { printf "\nnote: %s: only %s of %s acknowledged within the time limit\n", what, $6, $8 }' "$RESULTS"
if section fanout; then
    echo
    echo "Fan-out: 1 publisher paced at R msgs/s (${FANOUT_TRANSPORT} for ours), K subscribers (ours: WebSocket; NATS: ordered push"
    echo "consumers), deliver latency from the payload's timestamp to arrival; ours/NATS of the deliver p99 (below 1: ours faster)"
    echo
    awk -F'\t' -v fanout_runs="${FANOUT_RUNS[*]}" -v secs="$FANOUT_SECS" -v rounds="$ROUNDS" "$MEDIAN_RUN"'
        # Each cell is its median run per (system, K, R) by deliver p99 (of an even number, the
        # slower of the middle two; a round with no result counts as the worst); the notes
        # below name every run that fell short.
        {
            k = $1 SUBSEP $2 SUBSEP $3; runs[k]++; row[k, runs[k]] = $0; by[k, runs[k]] = $11
            what = sprintf("%s%s fanout K=%s R=%s", (rounds > 1 ? "round " $13 ": " : ""), $1, $2, $3)
            if ($7 > 0) notes = notes sprintf("\nnote: %s: %s publishes failed\n", what, $7)
            if ($6 < $4) notes = notes sprintf("\nnote: %s: only %s of %s acknowledged within the time limit\n", what, $6, $4)
            if ($5 < 0.95 * $3) notes = notes sprintf("\nnote: %s: published %.0f msgs/s, short of the paced %s\n", what, $5, $3)
            if ($9 > 0) notes = notes sprintf("\nnote: %s: %s of %s deliveries missing after the drain timeout\n", what, $9, $6 * $2)
        }
        function cell(s, K, R) {
            if ((s, K, R) in d99) return sprintf("%.2f | %.2f | %.2f | %s", d50[s, K, R], d99[s, K, R], d999[s, K, R], miss[s, K, R])
            return ((s, K, R) in no_result) ? "no result | — | — | —" : "— | — | — | —"
        }
        END {
            for (k in runs) {
                i = median(k, -1)
                if (i == 0) { no_result[k] = 1; continue }
                split(row[k, i], f, "\t")
                want[k] = f[4]; rate[k] = f[5]; acked[k] = f[6]; errs[k] = f[7]; got[k] = f[8]; miss[k] = f[9]
                d50[k] = f[10]; d99[k] = f[11]; d999[k] = f[12]
            }
            n = split(fanout_runs, X, " ")
            print "| K subscribers | R msgs/s | messages | ours deliver p50 ms | p99 ms | p99.9 ms | missing | NATS deliver p50 ms | p99 ms | p99.9 ms | missing | ours/NATS p99 |"
            print "|---|---|---|---|---|---|---|---|---|---|---|---|"
            for (i = 1; i <= n; i++) {
                split(X[i], f, ":"); K = f[1]; R = f[2]; N = (3 in f) ? f[3] : R * secs
                r = (("ours", K, R) in d99 && ("nats", K, R) in d99 && d99["nats", K, R] > 0) ? sprintf("%.2f×", d99["ours", K, R] / d99["nats", K, R]) : "—"
                printf "| %s | %s | %s | %s | %s | %s |\n", K, R, N, cell("ours", K, R), cell("nats", K, R), r
                delete f
            }
            printf "%s", notes
        }' "$FANOUT_RESULTS"
fi
if [ "$ROUNDS" -gt 1 ]; then
    echo
    echo "every publish/ws run (round, system, C, msgs/s, p50 ms, p99 ms, machine CPU µs per message):"
    awk -F'\t' '{ printf "  %s %s C=%s %.0f %.2f %.2f %.0f\n", $10, $1, $2, $3, $4, $5, $9 }' "$RESULTS"
    if [ -s "$FANOUT_RESULTS" ]; then
        echo "every fanout run (round, system, K, R, msgs/s, deliver p50/p99/p99.9 ms, missing):"
        awk -F'\t' '{ printf "  %s %s K=%s R=%s %.0f %.2f %.2f %.2f %s\n", $13, $1, $2, $3, $5, $10, $11, $12, $9 }' "$FANOUT_RESULTS"
    fi
fi
if [ -s "$NOTES" ]; then
    echo
    sed 's/^/note: /' "$NOTES"
fi

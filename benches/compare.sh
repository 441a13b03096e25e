#!/usr/bin/env bash
# Side-by-side publish benchmark on loopback: our 3-node cluster, a 3-node NATS JetStream
# cluster (R3 file-backed stream) and a 3-member etcd cluster, the same workload against
# each in turn, one table at the end.
#
#   benches/compare.sh
#
# Workload: 256-byte payloads, every publish awaited until acknowledged (ours: quorum
# fsync; NATS: JetStream PubAck; etcd: put response), C requests in flight in total.
# Knobs (environment):
#   CONCURRENCY="1 16 64"       C values
#   MESSAGES="3000 10000 20000" messages per C (same order as CONCURRENCY)
#   SYSTEMS="ours nats etcd"    which systems to run
#   RUN_SECS=60                 time limit of one run (the generator stops publishing)
#   PORT_BASE=29000             ports PORT_BASE+80.. (ours), +220.. (NATS), +379.. (etcd)
#   ROUNDS=1                    repeat everything; the order of the systems rotates each
#                               round and the table keeps each cell's best-throughput run
#                               (use 3 on a shared, noisy machine)
#   KEEP_DATA=1                 keep the temporary data directory
# Everything listens on 127.0.0.1 and is stopped on exit. Each cluster runs only during its
# own runs, so the three never compete for the CPU. A peer whose Debian package
# (nats-server, etcd-server) is missing and cannot be installed is skipped with a note.
#
# Builds: ours is expected in ${CARGO_TARGET_DIR:-~/.cache/pubsub-raft/target}/release
# (or the repository's target/release; built into the former when missing); the peers'
# load generator (benches/peers, its own Cargo project) goes to "${CARGO_TARGET_DIR:-~/.cache/pubsub-raft/target}-peers", outside the repository.
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

read -r -a CS <<<"${CONCURRENCY:-1 16 64}"
read -r -a NS <<<"${MESSAGES:-3000 10000 20000}"
read -r -a SYS <<<"${SYSTEMS:-ours nats etcd}"
RUN_SECS=${RUN_SECS:-60}
ROUNDS=${ROUNDS:-1}
PAYLOAD=256
PB=${PORT_BASE:-29000}
[ "${#CS[@]}" -eq "${#NS[@]}" ] || { echo "CONCURRENCY and MESSAGES need the same number of values" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/pubsub-compare.XXXXXX")
RESULTS="$WORK/results.tsv"
NOTES="$WORK/notes.txt"
: >"$RESULTS"
: >"$NOTES"
PIDS=()
SKIPPED=""

log() { echo "compare: $*" >&2; }
note() { echo "$*" >>"$NOTES"; log "$*"; }

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

# Starts a background process with its output in $WORK/<name>.log and remembers its pid.
spawn() {
    local name=$1; shift
    "$@" >"$WORK/$name.log" 2>&1 &
    PIDS+=("$!")
}

# run_gen LOGNAME SECS cmd...: runs a load generator (killed after SECS) in the background,
# so a signal reaches the EXIT trap at once, and sets LINE to its last stdout line.
run_gen() {
    local name=$1 secs=$2; shift 2
    timeout "$secs" "$@" >"$WORK/gen.out" 2>>"$WORK/$name-bench.log" &
    local pid=$!
    PIDS+=("$pid")
    wait "$pid" || log "$name generator exited with status $?"
    PIDS=("${PIDS[@]/$pid}")
    LINE=$(tail -n 1 "$WORK/gen.out")
}

# json_num FIELD LINE: a numeric field of a flat JSON object (no jq needed).
json_num() { sed -nE "s/.*\"$1\":(-?[0-9.eE+-]+).*/\1/p" <<<"$2"; }

# record SYSTEM C JSON_LINE
record() {
    local sys=$1 c=$2 line=$3
    local rate p50 p99 n errs
    rate=$(json_num msgs_per_sec "$line"); p50=$(json_num p50_ms "$line"); p99=$(json_num p99_ms "$line")
    n=$(json_num messages "$line"); errs=$(json_num errors "$line")
    if [ -z "$rate" ]; then note "$sys C=$c: no result"; return; fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$sys" "$c" "$rate" "$p50" "$p99" "$n" "${errs:-0}" >>"$RESULTS"
    log "$sys C=$c: $(printf '%.0f msgs/s, p50 %.2f ms, p99 %.2f ms, %s acked, %s errors' "$rate" "$p50" "$p99" "$n" "${errs:-0}")"
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

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")

# ---------------------------------------------------------------- builds
if [ ! -x "$BIN/pubsub-node" ] || [ ! -x "$BIN/pubsub" ]; then
    log "building pubsub-node and pubsub (release)"
    (cd "$ROOT" && CARGO_TARGET_DIR="$TARGET" cargo build --release --bin pubsub-node --bin pubsub)
fi
NEED_PEERS=""
for s in "${SYS[@]}"; do [ "$s" = ours ] || NEED_PEERS=1; done
if [ -n "$NEED_PEERS" ]; then
    log "building the peers' load generator into $PEERS_TARGET"
    CARGO_TARGET_DIR="$PEERS_TARGET" cargo build --release --quiet --manifest-path "$ROOT/benches/peers/Cargo.toml"
fi

# ---------------------------------------------------------------- ours
run_ours() {
    local peers="" i urls=()
    for i in 1 2 3; do peers+="${peers:+,}$i=127.0.0.1:$((PB + 80 + i))"; urls+=(-s "http://127.0.0.1:$((PB + 80 + i))"); done
    for i in 1 2 3; do
        mkdir -p "$WORK/ours/n$i"
        spawn "ours-$i" "$BIN/pubsub-node" --id "$i" --listen "127.0.0.1:$((PB + 80 + i))" \
            --peers "$peers" --data-dir "$WORK/ours/n$i"
    done
    leader_known() { curl -sf "http://127.0.0.1:$((PB + 81))/cluster" | grep -q '"leader_id":"node-'; }
    wait_for 60 "our leader" leader_known || { note "ours: no leader within 60 s, skipped"; stop_all; return; }
    local k c n p f
    for k in "${!CS[@]}"; do
        c=${CS[$k]}; n=${NS[$k]}
        case $c in 1) p=1 f=1 ;; 16) p=4 f=4 ;; 64) p=8 f=8 ;; *) p=1 f=$c ;; esac
        "$BIN/pubsub" "${urls[@]}" --json topics create "bench-c$c" >/dev/null 2>&1 || true
        log "ours C=$c ($p publishers x $f in flight), $n messages"
        run_gen ours $((RUN_SECS + 60)) "$BIN/pubsub" "${urls[@]}" --json bench --publishers "$p" --inflight "$f" \
            --messages "$n" --payload-bytes "$PAYLOAD" --topic "bench-c$c" --duration-secs "$RUN_SECS"
        record ours "$c" "$LINE"
    done
    stop_all
}

# ---------------------------------------------------------------- NATS JetStream
run_nats() {
    have_pkg nats-server nats-server || { note "nats: package nats-server not installable, skipped"; SKIPPED+=" nats"; return; }
    local i j routes servers=""
    for i in 1 2 3; do
        routes=""
        for j in 1 2 3; do [ "$j" = "$i" ] || routes+="${routes:+,}nats://127.0.0.1:$((PB + 230 + j))"; done
        mkdir -p "$WORK/nats/n$i"
        spawn "nats-$i" nats-server -a 127.0.0.1 -p "$((PB + 220 + i))" -m "$((PB + 240 + i))" \
            --server_name "n$i" -js -sd "$WORK/nats/n$i" --cluster_name bench \
            --cluster "nats://127.0.0.1:$((PB + 230 + i))" --routes "$routes"
        servers+="${servers:+,}127.0.0.1:$((PB + 220 + i))"
    done
    for i in 1 2 3; do
        # /healthz answers 200 once the server, and JetStream, is ready.
        wait_for 60 "nats n$i" curl -sf "http://127.0.0.1:$((PB + 240 + i))/healthz" \
            || { note "nats: n$i not healthy within 60 s, skipped"; stop_all; return; }
    done
    local k c n
    for k in "${!CS[@]}"; do
        c=${CS[$k]}; n=${NS[$k]}
        log "nats C=$c, $n messages"
        run_gen nats $((RUN_SECS + 90)) "$PEERS_BIN" nats --servers "$servers" --stream "BENCH_C$c" \
            --concurrency "$c" --messages "$n" --payload-bytes "$PAYLOAD" --duration-secs "$RUN_SECS"
        record nats "$c" "$LINE"
    done
    stop_all
}

# ---------------------------------------------------------------- etcd
run_etcd() {
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
        record etcd "$c" "$LINE"
    done
    stop_all
}

for ((r = 0; r < ROUNDS; r++)); do
    for ((q = 0; q < ${#SYS[@]}; q++)); do
        s=${SYS[$(((q + r) % ${#SYS[@]}))]}
        case " $SKIPPED " in *" $s "*) continue ;; esac
        [ "$ROUNDS" -eq 1 ] || log "round $((r + 1))/$ROUNDS: $s"
        case $s in
            ours) run_ours ;;
            nats) run_nats ;;
            etcd) run_etcd ;;
            *) note "unknown system $s, skipped"; SKIPPED+=" $s" ;;
        esac
    done
done

# ---------------------------------------------------------------- the table
echo
echo "Publish, ${PAYLOAD}-byte payloads, each awaited until acknowledged; 3 nodes per system on 127.0.0.1"
[ "$ROUNDS" -eq 1 ] || echo "best of $ROUNDS rounds per cell (system order rotated each round; every run listed below)"
echo "($(nproc) cores, $(date -u +'%Y-%m-%d %H:%M UTC'); load average before $LOAD_BEFORE, after $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?"))"
echo
awk -F'\t' -v cs="${CS[*]}" -v ns="${NS[*]}" '
    ($1, $2) in rate && rate[$1, $2] >= $3 { next }
    { rate[$1, $2] = $3; p50[$1, $2] = $4; p99[$1, $2] = $5; acked[$1, $2] = $6; errs[$1, $2] = $7; seen[$1] = 1 }
    function cell(s, c) { return ((s, c) in rate) ? sprintf("%.0f | %.2f | %.2f", rate[s, c], p50[s, c], p99[s, c]) : "— | — | —" }
    function ratio(c, other) {
        return (("ours", c) in rate && (other, c) in rate && rate[other, c] > 0) ? sprintf("%.2f×", rate["ours", c] / rate[other, c]) : "—"
    }
    END {
        nc = split(cs, C, " "); split(ns, N, " ")
        print "| C | messages | ours msgs/s | p50 ms | p99 ms | NATS JetStream R3 msgs/s | p50 ms | p99 ms | etcd 3.4 msgs/s | p50 ms | p99 ms | ours/NATS | ours/etcd |"
        print "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        for (i = 1; i <= nc; i++) {
            c = C[i]
            printf "| %s | %s | %s | %s | %s | %s | %s |\n", c, N[i], cell("ours", c), cell("nats", c), cell("etcd", c), ratio(c, "nats"), ratio(c, "etcd")
        }
        for (i = 1; i <= nc; i++) for (s in seen) if ((s, C[i]) in rate) {
            k = s SUBSEP C[i]
            if (errs[k] > 0) printf "\nnote: %s C=%s: %s publishes failed\n", s, C[i], errs[k]
            if (acked[k] < N[i]) printf "\nnote: %s C=%s: only %s of %s acknowledged within the time limit\n", s, C[i], acked[k], N[i]
        }
    }' "$RESULTS"
if [ "$ROUNDS" -gt 1 ]; then
    echo
    echo "every run (system, C, msgs/s, p50 ms, p99 ms):"
    awk -F'\t' '{ printf "  %s C=%s %.0f %.2f %.2f\n", $1, $2, $3, $4, $5 }' "$RESULTS"
fi
if [ -s "$NOTES" ]; then
    echo
    sed 's/^/note: /' "$NOTES"
fi

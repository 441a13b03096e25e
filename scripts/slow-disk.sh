#!/usr/bin/env bash
# Runs a command (a test run, say) with every fsync and fdatasync of the nodes it starts delayed,
# as on a slow or shared disk: races between a node's steps and its disk show up here rather
# than as rare failures on a slow CI machine. It points PUBSUB_NODE_BIN (read by the test
# harness) at a wrapper that starts `pubsub-node` with a preloaded shim around those two calls.
#
#   FSYNC_DELAY_MS=20 scripts/slow-disk.sh cargo test --release --workspace --test api
#
# Needs a C compiler (cc). Only the multi-process tests start nodes this way; the simulation
# and the Docker tests do not.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
delay_us=$(( ${FSYNC_DELAY_MS:-20} * 1000 ))
node="$CARGO_TARGET_DIR/release/pubsub-node"
[ -x "$node" ] || { echo "no $node: build first (cargo build --release --workspace --bins --tests)" >&2; exit 2; }

work=$(mktemp -d /tmp/pubsub-slow-disk-XXXXXX)
trap 'rm -rf "$work"' EXIT
cat > "$work/slow_sync.c" <<C
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>
/* The call itself, then the delay: the data is as durable as before, only later. */
static int delayed(const char *name, int fd) {
  int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, name);
  int result = real(fd);
  usleep($delay_us);
  return result;
}
int fsync(int fd) { return delayed("fsync", fd); }
int fdatasync(int fd) { return delayed("fdatasync", fd); }
C
cc -shared -fPIC -O2 -o "$work/slow_sync.so" "$work/slow_sync.c" -ldl
# exec: the harness's signals (SIGTERM, SIGKILL) reach the node itself.
printf '#!/bin/sh\nLD_PRELOAD=%s exec %s "$@"\n' "$work/slow_sync.so" "$node" > "$work/pubsub-node"
chmod +x "$work/pubsub-node"
# The CLI's tests find `pubsub` beside the node binary unless told.
export PUBSUB_CLI_BIN="${PUBSUB_CLI_BIN:-$CARGO_TARGET_DIR/release/pubsub}"
echo "==> every fsync and fdatasync of the nodes delayed ${delay_us} us"
PUBSUB_NODE_BIN="$work/pubsub-node" "$@"

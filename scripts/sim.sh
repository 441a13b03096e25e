#!/usr/bin/env bash
# Runs the deterministic simulation (tests/simulation.rs).
#
# It is built with --cfg tokio_unstable so turmoil can seed tokio's RNG and a seed replays
# exactly. That flag changes every crate's build, so it gets its own target directory; the
# RocksDB static library is reused from the main build instead of compiling it a second time.
#   scripts/sim.sh                                   the CI seeds
#   SIM_SEEDS=500 scripts/sim.sh many_seeds          500 more seeds
#   SIM_SEED=42 scripts/sim.sh ci_seeds_three_nodes  replay one seed
set -euo pipefail
cd "$(dirname "$0")/.."
main_target="${CARGO_TARGET_DIR:-$PWD/target}"
rocksdb_lib=$(ls -t "$main_target"/release/build/librocksdb-sys-*/out/librocksdb.a 2>/dev/null | head -1 || true)
if [ -z "$rocksdb_lib" ]; then
  echo "==> building RocksDB once in the main target directory"
  CARGO_TARGET_DIR="$main_target" cargo build --release -p raft-store
  rocksdb_lib=$(ls -t "$main_target"/release/build/librocksdb-sys-*/out/librocksdb.a | head -1)
fi
export ROCKSDB_LIB_DIR="$(dirname "$rocksdb_lib")" ROCKSDB_STATIC=1
export RUSTFLAGS="--cfg tokio_unstable"
export CARGO_TARGET_DIR="$main_target-sim"
exec cargo test --release -p pubsub-tests --test simulation -- --nocapture "$@"

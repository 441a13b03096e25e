#!/usr/bin/env bash
# Runs the deterministic simulation (tests/simulation.rs) on its own, with its output.
#
# .cargo/config.toml builds everything with --cfg tokio_unstable, so turmoil seeds tokio's RNG
# and a seed replays exactly; scripts/test.sh runs the CI seeds with the other tests.
#   scripts/sim.sh                                   the CI seeds
#   SIM_SEEDS=500 scripts/sim.sh many_seeds          500 more seeds (SIM_NODES=5: on 5 nodes)
#   SIM_SEED=42 scripts/sim.sh ci_seeds_three_nodes  replay one seed
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/rustflags.sh
# --workspace, not -p pubsub-tests: the same feature set as the main build, so nothing recompiles.
exec cargo test --release --workspace --test simulation -- --nocapture "$@"

#!/usr/bin/env bash
# Runs every test of the project: unit tests, openraft's storage suite, multi-process
# cluster tests, the deterministic simulation (its CI seeds) and the Docker fault tests.
# It installs what it needs (libclang for RocksDB's bindings, busybox for the image) and
# fails loudly on the first failing test.
set -euo pipefail
cd "$(dirname "$0")/.."

# The repository's target/ unless CARGO_TARGET_DIR says otherwise (CI points it outside the
# clone so every fresh clone reuses one warm RocksDB build).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
mkdir -p "$CARGO_TARGET_DIR"
source scripts/rustflags.sh

need_apt=()
# libclang itself (libclang.so or libclang-N.so), not libclang-cpp, which some images ship
# alone and bindgen cannot use.
ldconfig -p 2>/dev/null | grep -qE 'libclang(-[0-9.]+)?\.so' || need_apt+=(libclang-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "==> installing ${need_apt[*]}"
  apt-get update -qq && apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

echo "==> building (release: one profile for binaries, tests and benches)"
cargo build --release --workspace --bins --tests

if docker info >/dev/null 2>&1; then
  echo "==> building the Docker image for the fault tests"
  deploy/cluster.sh build
else
  echo "==> no Docker engine: the Docker fault tests will be skipped"
fi

echo "==> running the tests"
# The Docker fault test runs on its own below, with its report printed.
cargo test --release --workspace --no-fail-fast -- --skip docker_faults_

echo "==> running the Docker fault tests"
cargo test --release --workspace --test docker_faults -- --nocapture

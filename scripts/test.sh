#!/usr/bin/env bash
# Runs every test of the project: unit tests, openraft's storage suite, multi-process
# cluster tests, the deterministic simulation (its CI seeds), the API tests again on a slow disk
# and the Docker fault tests.
# It installs what it needs (a C/C++ toolchain and libclang for RocksDB, docker-compose when
# the Docker engine has no compose) and fails loudly: every test runs, each failure is printed,
# and any failure makes the script exit non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."

# The repository's target/ unless CARGO_TARGET_DIR says otherwise (CI points it outside the
# clone so every fresh clone reuses one warm RocksDB build).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
mkdir -p "$CARGO_TARGET_DIR"
source scripts/rustflags.sh

# Debian packages missing on this machine (dpkg says; ldconfig is not on a user's PATH).
need_apt=()
have_package() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
have_package libclang-dev || need_apt+=(libclang-dev)
# RocksDB is C++, jemalloc runs configure and make.
{ command -v g++ && command -v make; } >/dev/null 2>&1 || need_apt+=(build-essential)
docker_up=false
if docker info >/dev/null 2>&1; then
  docker_up=true
  docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
fi
if [ ${#need_apt[@]} -gt 0 ] && ! command -v apt-get >/dev/null 2>&1; then
  echo "==> no apt-get here: install the equivalents of ${need_apt[*]} if the build fails"
elif [ ${#need_apt[@]} -gt 0 ]; then
  echo "==> installing ${need_apt[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  # Two commands, not `a && b`: set -e does not stop on a failing left side of `&&`.
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

echo "==> building (release: one profile for binaries, tests and benches)"
cargo build --release --workspace --bins --tests

if $docker_up; then
  # With an engine here, the fault test must run (it builds its image from the binaries just
  # built): it fails instead of skipping.
  export PUBSUB_REQUIRE_DOCKER=1
else
  echo "==> no Docker engine: the Docker fault tests will be skipped"
fi

# One API test opens a node's 1,025 publishing WebSockets; a common soft limit is 1,024 files.
hard_files=$(ulimit -Hn)
if [ "$hard_files" = unlimited ]; then hard_files=1048576; fi
ulimit -n "$hard_files" 2>/dev/null || echo "==> cannot raise the open-files limit to $hard_files (now $(ulimit -n))"
# Every layer runs even when one before failed; the script fails at the end if any did.
failed=()
echo "==> running the tests"
# The Docker fault test runs on its own below, with its report printed.
cargo test --release --workspace --no-fail-fast -- --skip docker_faults_ || failed+=("the tests")

# The API contract again on a slow disk: a race between a node's steps and its fsyncs fails
# here every time instead of rarely on a slow machine (docs/TESTING.md, "On a slow disk").
echo "==> running the API tests with every node fsync delayed 20 ms"
FSYNC_DELAY_MS=20 scripts/slow-disk.sh cargo test --release --workspace --test api || failed+=("the slow-disk API tests")

echo "==> running the Docker fault tests"
cargo test --release --workspace --test docker_faults -- --nocapture || failed+=("the Docker fault tests")

if [ ${#failed[@]} -gt 0 ]; then
  printf '==> FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "==> every test passed"

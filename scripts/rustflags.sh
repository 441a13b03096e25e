# Sourced by test.sh and sim.sh. A RUSTFLAGS in the environment replaces .cargo/config.toml's
# flags instead of adding to them, which would drop --cfg tokio_unstable and leave the
# simulation ignored; add it back.
if [ -n "${RUSTFLAGS:-}" ] && [[ "$RUSTFLAGS" != *tokio_unstable* ]]; then
  echo "==> RUSTFLAGS is set, which replaces .cargo/config.toml's flags: adding --cfg tokio_unstable"
  export RUSTFLAGS="$RUSTFLAGS --cfg tokio_unstable"
fi

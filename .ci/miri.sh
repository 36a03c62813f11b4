#!/usr/bin/env bash
# Miri over the modules with unsafe code (broadcast, clock, the map's shard slab). Needs nightly;
# never required for CI to pass.
. "$(dirname "$0")/lib.sh"
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  skip miri "no nightly toolchain"; exit 0
fi
if ! cargo +nightly miri --version >/dev/null 2>&1; then
  rustup component add --toolchain nightly miri rust-src >/dev/null 2>&1 || true
fi
if ! cargo +nightly miri --version >/dev/null 2>&1; then
  skip miri "miri could not be installed"; exit 0
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}/miri
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-strict-provenance}"
# The modules' tests: `broadcast clock map::`, run as two processes, one per
# core (Miri interprets on one thread), split so that each takes about half:
# four model tests take 130 s of the 180.
idle=map::tests::shard::an_idle_shard_evicts_at_the_effective_deadline
a=(broadcast clock sync map::store "$idle")
b=(map:: --skip map::store --skip "$idle")
both() {
  local dir ra=0 rb=0
  dir=$(mktemp -d)
  cargo +nightly miri test --lib -- "${a[@]}" >"$dir/a" 2>&1 &
  local pa=$!
  cargo +nightly miri test --lib -- "${b[@]}" >"$dir/b" 2>&1 &
  local pb=$!
  wait "$pa" || ra=$?
  wait "$pb" || rb=$?
  cat "$dir/a" "$dir/b"
  rm -rf "$dir"
  [ "$ra" -eq 0 ] && [ "$rb" -eq 0 ]
}
step "miri build" cargo +nightly miri test --lib --no-run
step miri both

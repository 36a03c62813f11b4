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
step miri cargo +nightly miri test --lib -- broadcast clock map::

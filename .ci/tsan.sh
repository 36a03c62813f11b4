#!/usr/bin/env bash
# ThreadSanitizer over the threaded tests (lib + integration). Needs nightly
# with rust-src (for -Zbuild-std); never required for CI to pass.
. "$(dirname "$0")/lib.sh"
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  skip tsan "no nightly toolchain"; exit 0
fi
if ! rustup component list --toolchain nightly 2>/dev/null | grep -q '^rust-src.*(installed)'; then
  rustup component add --toolchain nightly rust-src >/dev/null 2>&1 || true
fi
if ! rustup component list --toolchain nightly 2>/dev/null | grep -q '^rust-src.*(installed)'; then
  skip tsan "rust-src for nightly could not be installed"; exit 0
fi
target=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}/tsan
export RUSTFLAGS="-Zsanitizer=thread"
step tsan cargo +nightly test -Zbuild-std --target "$target" --lib --tests

#!/usr/bin/env bash
# loom models of every concurrent protocol (see loom-tests/README.md).
. "$(dirname "$0")/lib.sh"
export RUSTFLAGS="--cfg expiremap_loom"
export LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-2}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}/loom
step loom cargo test -p expiremap-loom-tests --release

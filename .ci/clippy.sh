#!/usr/bin/env bash
. "$(dirname "$0")/lib.sh"
# Every target of every crate: the benchmarks must keep compiling, and this
# type-checks them (running them is for BENCHMARKS.md, not CI).
step clippy cargo clippy --workspace --all-targets -- -D warnings
# The core crate with every feature (stream, metrics, tracing): the code
# behind them is type-checked and linted too.
step clippy-features cargo clippy -p expiremap --all-targets --all-features -- -D warnings
# expiremap-redis with every feature (tls, metrics, tracing).
step clippy-redis-features cargo clippy -p expiremap-redis --all-targets --all-features -- -D warnings

#!/usr/bin/env bash
. "$(dirname "$0")/lib.sh"
# Every target of every crate: the benchmarks must keep compiling, and this
# type-checks them (running them is for BENCHMARKS.md, not CI).
step clippy cargo clippy --workspace --all-targets -- -D warnings

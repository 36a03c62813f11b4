#!/usr/bin/env bash
# Benchmarks must keep compiling (running them is for BENCHMARKS.md, not CI).
. "$(dirname "$0")/lib.sh"
step bench-build cargo bench -p expiremap-benches --no-run

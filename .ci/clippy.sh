#!/usr/bin/env bash
. "$(dirname "$0")/lib.sh"
step clippy cargo clippy --workspace --all-targets -- -D warnings

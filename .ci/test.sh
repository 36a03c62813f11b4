#!/usr/bin/env bash
# The README's test command, verbatim.
. "$(dirname "$0")/lib.sh"
step test cargo test --release
step test-stream cargo test --release -p expiremap --features stream --lib --test stream -- stream
step test-monitoring cargo test --release -p expiremap --features metrics,tracing --test metrics --test tracing

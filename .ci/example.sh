#!/usr/bin/env bash
# The README's demo command, and the other examples, must keep running.
. "$(dirname "$0")/lib.sh"
for ex in examples/*.rs; do
  name=$(basename "$ex" .rs)
  case "$name" in
    shadow) step "example $name" cargo run --release --example shadow -- --keys 1000 --ops 200000 --threads 4 --max-ttl-ms 20 --seed 1 ;;
    pauses) step "example $name" cargo run --release --example pauses -- --entries 200000 ;;
    # Its feature's dependencies; it checks its counts before it prints.
    metrics) step "example $name" cargo run --release --features metrics --example metrics ;;
    *) step "example $name" cargo run --release --example "$name" ;;
  esac
done

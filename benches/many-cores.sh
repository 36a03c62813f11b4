#!/usr/bin/env bash
# The many-core figures of BENCHMARKS.md ("16 cores", "Writers share the
# eviction work", "Eviction lateness"), and the one-thread hit-ratio
# replay on that machine too, for a machine with no Rust
# toolchain: build static binaries here, copy the folder there, run them.
#
#   bash benches/many-cores.sh build [DIR]   # static binaries into DIR
#                                            # (default target/many-cores)
#   bash DIR/many-cores.sh run OUT           # on the many-core machine:
#                                            # every figure, into OUT/*.txt
#
# `run` takes a few minutes on 16 cores. Set QUICK=1 for a short
# smoke run of the same steps.
set -euo pipefail
mode=${1:-}
case "$mode" in
build)
  cd "$(dirname "$0")/.."
  dir=${2:-target/many-cores}
  target=x86_64-unknown-linux-gnu
  export RUSTFLAGS="-C target-feature=+crt-static"
  json=$(cargo bench -p expiremap-benches --bench scaling --bench eviction_holds \
    --bench hit_ratio --no-run --target "$target" --message-format=json)
  cargo build --release --example lateness --target "$target"
  mkdir -p "$dir"
  for name in scaling eviction_holds hit_ratio; do
    exe=$(printf '%s\n' "$json" | grep '"executable":"[^"]*/'"$name"'-[^"]*"' \
      | sed 's/.*"executable":"\([^"]*\)".*/\1/' | tail -1)
    cp "$exe" "$dir/$name"
  done
  cp "target/$target/release/examples/lateness" "$dir/lateness"
  cp "$0" "$dir/many-cores.sh"
  echo "built into $dir: $(ls "$dir" | tr '\n' ' ')"
  ;;
run)
  here=$(cd "$(dirname "$0")" && pwd)
  out=${2:?usage: many-cores.sh run OUT}
  mkdir -p "$out"
  quick=${QUICK:-}
  secs=1; entries=1000000; rounds=3; requests=3000000
  if [ -n "$quick" ]; then secs=0.1; entries=20000; rounds=1; requests=100000; fi
  cores=$(nproc)
  {
    echo "== scaling, $cores threads, default shards"
    SCALING_SECS=$secs SCALING_THREADS=$cores "$here/scaling" --bench
    echo "== scaling, $cores threads, evictor at nice 19"
    SCALING_SECS=$secs SCALING_THREADS=$cores SCALING_ONLY=churn SCALING_EVICTOR_NICE=19 \
      "$here/scaling" --bench
  } > "$out/scaling.txt" 2>&1
  for shards in 16 64 256; do
    echo "== churn, $cores threads, $shards shards"
    SCALING_SECS=$secs SCALING_THREADS=$cores SCALING_ONLY=churn SCALING_SHARDS=$shards \
      "$here/scaling" --bench
  done > "$out/churn-by-shards.txt" 2>&1
  HOLDS_ROUNDS=$rounds HOLDS_WRITERS=$((cores - 1)) "$here/eviction_holds" --bench \
    > "$out/eviction-holds.txt" 2>&1
  # Two rounds: the first run of a fresh machine also pays for first
  # touches of its memory. Then TTLs over 5 s, which cross a level-2
  # wheel boundary (~2.1 s) while entries are held.
  for round in 1 2; do
    for shards in 1 16 64 256; do
      echo "== lateness, round $round, $entries entries, $shards shards"
      "$here/lateness" --entries "$entries" --shards "$shards" --worst 5
    done
  done > "$out/lateness.txt" 2>&1
  for shards in 1 256; do
    echo "== lateness, $((3 * entries)) entries over 5 s, $shards shards"
    "$here/lateness" --entries $((3 * entries)) --spread-ms 5000 --shards "$shards" --worst 5
  done >> "$out/lateness.txt" 2>&1
  # One thread, so a quieter machine than the development VM; three
  # runs, each with every peer on the same traces.
  for round in 1 2 3; do
    echo "== hit_ratio, round $round"
    HIT_RATIO_REQUESTS=$requests "$here/hit_ratio"
  done > "$out/hit-ratio.txt" 2>&1
  echo "done: $(ls "$out" | tr '\n' ' ')"
  ;;
*)
  sed -n '2,14p' "$0"
  exit 2
  ;;
esac

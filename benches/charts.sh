#!/usr/bin/env bash
# Draws the charts of README.md and BENCHMARKS.md (docs/charts/*.svg) from
# the CSV files in benches/data.
#
#   bash benches/charts.sh        # draw from the data there
#   bash benches/charts.sh run    # rerun the benches first, then draw
#
# `run` reruns `scaling`, `hit_ratio` and the `lateness` example (10^6
# entries at 1, 32, 64 and 128 shards) on this machine with BENCH_CSV_DIR
# set, and replaces scaling.csv, hit_ratio.csv and lateness.csv with what
# they wrote (15-20 minutes on 2 cores; their own variables still apply,
# e.g. SCALING_SECS=0.5 or HIT_RATIO_REQUESTS=300000 for a quick look).
# Where `redis-server` is installed (or REDIS_SERVER names one), it also
# reruns `near_cache` (the near cache, the redis crate's client-side cache
# and plain GETs, on a server it starts; NEAR_CACHE_ROUNDS, NEAR_CACHE_SECS)
# and replaces near_cache.csv; elsewhere that file stays as it is.
# CHARTS_DATA and CHARTS_OUT move the two folders.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${CHARTS_DATA:-benches/data}
out=${CHARTS_OUT:-docs/charts}
if [ "${1:-}" = run ]; then
  fresh=$(mktemp -d)
  export BENCH_CSV_DIR=$fresh
  cargo bench -p expiremap-benches --bench scaling
  cargo bench -p expiremap-benches --bench hit_ratio
  for shards in 1 32 64 128; do
    cargo run --release --example lateness -- --entries "${LATENESS_ENTRIES:-1000000}" --shards "$shards"
  done
  fresh_files="scaling hit_ratio lateness"
  if command -v "${REDIS_SERVER:-redis-server}" >/dev/null; then
    cargo bench -p expiremap-benches --bench near_cache
    fresh_files="$fresh_files near_cache"
  else
    echo "charts.sh: no redis-server: near_cache.csv stays as it is" >&2
  fi
  mkdir -p "$data"
  for f in $fresh_files; do
    {
      echo "# Written by benches/charts.sh run, $(date -u +%F), $(nproc) cores, $(git rev-parse --short HEAD)."
      cat "$fresh/$f.csv"
    } > "$data/$f.csv"
  done
  if [ ! -e "$fresh/near_cache.csv" ] && [ "$data" != benches/data ]; then
    cp benches/data/near_cache.csv "$data/"
  fi
  rm -r "$fresh"
fi
cargo run --release -p expiremap-benches --bin charts -- --data "$data" --out "$out"

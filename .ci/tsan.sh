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
# The model tests below drive one shard, timer wheel or table from one
# thread: nothing for ThreadSanitizer to check, and 108 s of the unit tests'
# 120 s under it. So does tests/memory.rs's count of bytes per entry (no
# eviction thread; 50 s under it). The native test step runs them.
single=(
  map::store::table::grow::tests::growth_step_by_step_keeps_every_entry_findable
  map::store::table::tests::random_ops_match_model
  map::tests::shard::a_phased_shard_evicts_exactly_like_an_unphased_one
  map::tests::shard::an_idle_shard_evicts_at_the_effective_deadline
  map::tests::bound::bounded_shard_random_ops_keep_the_bound_and_every_value
  map::tests::shard::shard_random_ops_keep_table_and_wheel_consistent
  timer::tests::model::model_default_r_one_million_ops
  timer::tests::model::model_r1_hitime
  timer::tests::model::model_r2_r3_r5
  timer::tests::model::model_r6
  bytes_per_entry_stay_within_the_documented_bound
)
# The shadow models run a fifth of their debug-build operations here
# (`scaled` in tests/integration/shadow.rs): 220 s of TSan's time went to
# them, 154 s to the values that panic in `Drop`.
export EXPIREMAP_TEST_DIVISOR=5
skips=()
for t in "${single[@]}"; do skips+=(--skip "$t"); done
step tsan cargo +nightly test -Zbuild-std --target "$target" --lib --tests -- "${skips[@]}"

//! Regression tests: one file per bug, each with a header saying what broke.

#[path = "../common/mod.rs"]
mod common;

mod bound_edges;
mod clock_at_max;
mod concurrent_evict;
mod drop_in_publish;
mod drop_under_lock_in_iter;
mod eq_panic_in_put;
mod expired_elsewhere_first;
mod load_cycle;
mod load_keyed_by_hash;
mod loading_edges;
mod panicking_drop_in_publish;
mod time_read_under_lock;
mod update_beside_a_load;
mod update_conflicts_per_shard;
mod walk_chases_new_keys;
mod weight_near_u64_max;

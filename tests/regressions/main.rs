//! Regression tests: one file per bug, each with a header saying what broke.

#[path = "../common/mod.rs"]
mod common;

mod clock_at_max;
mod concurrent_evict;
mod drop_in_publish;
mod eq_panic_in_put;
mod time_read_under_lock;

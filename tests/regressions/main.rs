//! Regression tests: one file per bug, each with a header saying what broke.

#[path = "../common/mod.rs"]
mod common;

mod drop_in_publish;
mod eq_panic_in_put;
mod user_clock_under_lock;

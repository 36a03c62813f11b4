//! Regression tests: one file per bug, each with a header saying what broke.

mod drop_in_publish;
mod eq_panic_in_put;
mod user_clock_under_lock;

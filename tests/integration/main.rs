//! The integration tests in one binary: one link and one optimized copy of
//! the map's code for all of them, where a binary per file built it
//! eighteen times. Each file is a module and its tests are named by it
//! (`cargo test --test integration -- shadow::`).
//!
//! Those that count the process's allocations (`memory`, `memory_events`,
//! `by_ref`: a counting global allocator is the whole process's) and the
//! regression tests (`regressions/`) stay binaries of their own.

#[path = "../common/mod.rs"]
mod common;

mod async_events;
mod async_loading;
mod bound;
mod bulk;
mod event_release;
mod events;
mod evictor;
mod iteration;
mod loading;
mod map_semantics;
mod moka_surface;
mod panics;
mod ports;
mod refresh;
mod shadow;
mod shutdown;
mod system_clock;
mod writer_eviction;

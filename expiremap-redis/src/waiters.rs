//! The callers waiting for a lease held elsewhere ([`Waiters`]): one table
//! per cache, in its links' [`Config`](crate::connect::Config), which the
//! readers wake by name (an invalidation, or the cache's own write of the
//! key), the supervisors at deadlines, and fleet-wide loading
//! ([`crate::lease`]) registers in before each `LEASE` it sends. Why no
//! wake-up is lost is argued in [`crate::lease`]'s docs.
//!
//! Imports nothing of the crate: the wait machinery ([`wait`]) is written
//! against a small shim ([`sync`]), and `loom-tests/tests/lease.rs` runs
//! that very file over loom's primitives.

mod wait;

pub(crate) use wait::Waiters;
#[cfg(doc)]
pub(crate) use wait::{Registered, Until, Wait};

/// What [`wait`] runs on: `std` here, loom's primitives in its loom model.
mod sync {
    pub(super) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    pub(super) use std::sync::{Arc, Mutex, MutexGuard};
    pub(super) use std::thread::{Thread, current, park_timeout};
    pub(super) use std::time::Instant;
    /// The table's hasher (a fixed one in the model, which must replay).
    pub(super) type NameHasher = std::hash::RandomState;
}

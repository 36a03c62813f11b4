//! The floor where values leave the map, and who hears of it:
//!
//! * `doors`: event routing after the shard lock is released (publish to
//!   subscribers, hand back to the caller, or drop), and the bulk doors
//!   (`clear`, shutdown at drop);
//! * `event`: the events ([`Event`](event::Event), [`Cause`](event::Cause))
//!   and the subscriber handle;
//! * `evictor`: the eviction thread, its plan, wait and pass, the
//!   [`Signal`](evictor::Signal) that wakes it, and writes' share of
//!   eviction when it is behind.
//!
//! Runs user code (`Drop`, `V::clone` of a notification copy) only with no
//! lock held, and never lets a panic in it cut a batch short.
//!
//! May call: `crate::map::store` (a shard's removals and eviction, under
//! its lock), the map's own types (`Inner`, `Config`), `crate::broadcast`,
//! `crate::clock::Time`, `crate::sync` and `crate::unwind`.

pub(super) mod doors;
pub(super) mod event;
pub(super) mod evictor;

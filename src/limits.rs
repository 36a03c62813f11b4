//! The limits the map's settings are checked against: what
//! [`Builder::try_build`](crate::Builder::try_build) enforces and what
//! [`BuildError`](crate::BuildError)'s messages quote. A room of their own,
//! below both (the crate root re-exports them through `map`).

use std::time::Duration;

/// Most shards a map may have.
pub const MAX_SHARDS: usize = 1 << 16;
/// Shortest allowed eviction interval.
pub const MIN_EVICTION_INTERVAL: Duration = Duration::from_micros(100);
/// Finest allowed precision. (It also keeps the timer's tick arithmetic
/// exact up to the largest deadline.)
pub const MIN_PRECISION: Duration = Duration::from_micros(1);
/// Longest allowed eviction interval or precision.
pub const MAX_PERIOD: Duration = Duration::from_secs(3600);
/// Largest event ring.
pub const MAX_EVENT_CAPACITY: usize = 1 << 24;
/// Most subscribers a map may allow.
pub const MAX_SUBSCRIBERS: usize = 1 << 12;

//! [`BuildError`]: the one error of the crate's constructors, the map's
//! [`Builder`](crate::Builder) and the broadcast ring's
//! [`Sender::new`](crate::broadcast::Sender::new). Runtime errors stay with
//! what returns them (`broadcast::{RecvError, SubscribeError, ...}`).

use crate::limits::{
    MAX_EVENT_CAPACITY, MAX_PERIOD, MAX_SHARDS, MAX_SUBSCRIBERS, MIN_EVICTION_INTERVAL,
    MIN_PRECISION,
};
use std::fmt;
use std::time::Duration;

/// A setting rejected by [`Builder::try_build`](crate::Builder::try_build)
/// or [`broadcast::Sender::new`](crate::broadcast::Sender::new): the one
/// error type of the crate's constructors. The message names the setting,
/// the value given and what is allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// `shards` must be a power of two in `1..=MAX_SHARDS`.
    Shards(usize),
    /// `eviction_interval` must lie in `MIN_EVICTION_INTERVAL..=MAX_PERIOD`.
    EvictionInterval(Duration),
    /// `precision` must lie in `MIN_PRECISION..=MAX_PERIOD`.
    Precision(Duration),
    /// `event_capacity` must be a power of two in `1..=MAX_EVENT_CAPACITY`
    /// (a broadcast `Sender`'s `capacity`: any power of two).
    EventCapacity(usize),
    /// `max_subscribers` must lie in `1..=MAX_SUBSCRIBERS` (a broadcast
    /// `Sender`'s `max_readers`: at least 1).
    MaxSubscribers(usize),
    /// `max_entries` must be at least 1.
    MaxEntries(u64),
    /// `max_weight` must be at least 1.
    MaxWeight(u64),
    /// A `weigher` was given without `max_weight`.
    WeigherWithoutMaxWeight,
    /// `max_entries` and `max_weight` were both given.
    TwoBounds,
    /// `time_to_idle` must be above zero.
    TimeToIdle(Duration),
    /// `time_to_live` must be above zero.
    TimeToLive(Duration),
    /// `refresh_after` must be above zero.
    RefreshAfter(Duration),
    /// The eviction thread could not be spawned.
    Spawn(String),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Shards(n) => write!(
                f,
                "invalid shards: {n} (must be a power of two from 1 to {MAX_SHARDS})"
            ),
            Self::EvictionInterval(d) => write!(
                f,
                "invalid eviction_interval: {d:?} (must be from {MIN_EVICTION_INTERVAL:?} to {MAX_PERIOD:?})"
            ),
            Self::Precision(d) => write!(
                f,
                "invalid precision: {d:?} (must be from {MIN_PRECISION:?} to {MAX_PERIOD:?})"
            ),
            Self::EventCapacity(n) => write!(
                f,
                "invalid event_capacity: {n} (must be a power of two from 1 to \
                 {MAX_EVENT_CAPACITY} for a map; any power of two for a broadcast Sender)"
            ),
            Self::MaxSubscribers(n) => write!(
                f,
                "invalid max_subscribers: {n} (must be from 1 to {MAX_SUBSCRIBERS} for a map; \
                 at least 1 for a broadcast Sender's max_readers)"
            ),
            Self::MaxEntries(n) => write!(f, "invalid max_entries: {n} (must be at least 1)"),
            Self::MaxWeight(n) => write!(f, "invalid max_weight: {n} (must be at least 1)"),
            Self::WeigherWithoutMaxWeight => {
                write!(
                    f,
                    "invalid weigher: set without max_weight, which it weighs against"
                )
            }
            Self::TwoBounds => write!(
                f,
                "invalid max_entries with max_weight: choose one (without a weigher every \
                 entry weighs 1, so max_weight alone counts entries)"
            ),
            Self::TimeToIdle(d) => {
                write!(f, "invalid time_to_idle: {d:?} (must be above zero)")
            }
            Self::TimeToLive(d) => {
                write!(f, "invalid time_to_live: {d:?} (must be above zero)")
            }
            Self::RefreshAfter(d) => {
                write!(f, "invalid refresh_after: {d:?} (must be above zero)")
            }
            Self::Spawn(e) => write!(f, "could not spawn the eviction thread: {e}"),
        }
    }
}

impl std::error::Error for BuildError {}

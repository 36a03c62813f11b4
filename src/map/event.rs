//! Eviction events and the subscriber handle.

use crate::broadcast::{self, RecvError, RecvTimeoutError, TryRecvError};
use std::fmt;
use std::time::Duration;

/// The door by which a value left the map.
///
/// New doors may be added (the enum is `#[non_exhaustive]`): match with a
/// wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// Its deadline passed: evicted by the eviction thread or
    /// [`evict_expired`](crate::ExpireMap::evict_expired), or found expired by
    /// `remove`, `clear`, an overwriting `put`, or shutdown.
    Expired,
    /// Removed by `remove` or `clear` while live. Published only with
    /// [`publish_removals(true)`](crate::Builder::publish_removals).
    Removed,
    /// Overwritten by `put` while live. Published only with
    /// [`publish_removals(true)`](crate::Builder::publish_removals).
    Replaced,
    /// Still live when the map was dropped. Published only with
    /// [`notify_on_shutdown(true)`](crate::Builder::notify_on_shutdown) (the
    /// default).
    Shutdown,
    /// Pushed out by the map's capacity bound
    /// ([`max_entries`](crate::Builder::max_entries) or
    /// [`max_weight`](crate::Builder::max_weight)): an entry the policy
    /// chose to make room, or a new value it declined to admit (or that is
    /// heavier than the bound allows on its own). Published by default.
    Size,
}

impl Cause {
    /// `true` for the doors published by default (`Expired`, `Shutdown`,
    /// `Size`).
    pub fn is_eviction(self) -> bool {
        matches!(self, Cause::Expired | Cause::Shutdown | Cause::Size)
    }
}

/// A value that left the map, as seen by a [`Subscriber`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event<K, V> {
    /// The entry's key.
    pub key: K,
    /// The value that left.
    pub value: V,
    /// Which door it left by.
    pub cause: Cause,
    deadline: u64,
    removed_at: u64,
}

impl<K, V> Event<K, V> {
    pub(crate) fn new(key: K, value: V, cause: Cause, deadline: u64, removed_at: u64) -> Self {
        Self {
            key,
            value,
            cause,
            deadline,
            removed_at,
        }
    }

    /// The entry's deadline, as time since the map's clock origin. The value
    /// was visible up to and including this instant.
    pub fn deadline(&self) -> Duration {
        Duration::from_nanos(self.deadline)
    }

    /// When the value left the map, as time since the clock origin.
    pub fn removed_at(&self) -> Duration {
        Duration::from_nanos(self.removed_at)
    }

    /// How long after its deadline the value left (zero if it left before).
    pub fn lateness(&self) -> Duration {
        Duration::from_nanos(self.removed_at.saturating_sub(self.deadline))
    }
}

/// A reader of a map's events, from [`ExpireMap::subscribe`](crate::ExpireMap::subscribe).
///
/// It sees every event published after it subscribed, in publication order.
/// A subscriber that falls more than the ring capacity behind gets
/// `Lagged(n)`, with `n` the exact number of events it missed, and continues
/// from the oldest event still held. After the map is dropped it drains what
/// is left, then sees `Closed`.
pub struct Subscriber<K, V> {
    rx: broadcast::Receiver<Event<K, V>>,
}

impl<K, V> Subscriber<K, V>
where
    K: Clone + Send + Sync,
    V: Clone + Send + Sync,
{
    pub(crate) fn new(rx: broadcast::Receiver<Event<K, V>>) -> Self {
        Self { rx }
    }

    /// Blocks until an event arrives, the subscriber lagged, or the map is
    /// gone and every event was received.
    pub fn recv(&mut self) -> Result<Event<K, V>, RecvError> {
        self.rx.recv()
    }

    /// Returns an event if one is ready, without blocking.
    pub fn try_recv(&mut self) -> Result<Event<K, V>, TryRecvError> {
        self.rx.try_recv()
    }

    /// Like [`recv`](Self::recv), giving up after `timeout`.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Event<K, V>, RecvTimeoutError> {
        self.rx.recv_timeout(timeout)
    }

    /// Moves up to `max` ready events into `out` without blocking; returns
    /// how many. `Err` only if none was moved.
    pub fn try_recv_batch(
        &mut self,
        out: &mut Vec<Event<K, V>>,
        max: usize,
    ) -> Result<usize, TryRecvError> {
        self.rx.try_recv_batch(out, max)
    }
}

impl<K, V> fmt::Debug for Subscriber<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscriber").finish_non_exhaustive()
    }
}

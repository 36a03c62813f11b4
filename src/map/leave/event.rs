//! Eviction events and the subscriber handle.

use crate::broadcast::{self, RecvError, RecvTimeoutError, TryRecvError};
use std::fmt;
use std::task::{Context, Poll};
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

    /// Waits for the next event without blocking a thread: a future that
    /// resolves as [`recv`](Self::recv) returns, on any executor (the task
    /// sleeps with its waker registered; the next event, or the map going
    /// away, wakes it). Dropping the future before it resolves loses no
    /// event. See [`broadcast::Receiver::recv_async`].
    ///
    /// ```
    /// use expiremap::{Cause, ExpireMap, ManualClock, RecvError};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let map = ExpireMap::<&str, u32>::builder()
    ///     .clock(clock.clone())
    ///     .background_eviction(false)
    ///     .build();
    /// let mut events = map.subscribe()?;
    /// let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// rt.block_on(async {
    ///     map.put("a", 1, Duration::from_millis(5));
    ///     clock.advance(Duration::from_millis(6));
    ///     map.evict_expired();
    ///     let e = events.recv_async().await.unwrap();
    ///     assert_eq!((e.key, e.value, e.cause), ("a", 1, Cause::Expired));
    ///     drop(map);
    ///     assert_eq!(events.recv_async().await, Err(RecvError::Closed));
    /// });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_async(&mut self) -> broadcast::Recv<'_, Event<K, V>> {
        self.rx.recv_async()
    }

    /// The poll behind [`recv_async`](Self::recv_async), for hand-written
    /// futures: `Ready` as [`recv`](Self::recv) returns, or `Pending` with
    /// `cx`'s waker registered. See [`broadcast::Receiver::poll_recv`].
    ///
    /// ```
    /// use expiremap::{ExpireMap, ManualClock};
    /// use std::task::{Context, Poll, Waker};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let map = ExpireMap::<u32, u32>::builder()
    ///     .clock(clock.clone())
    ///     .background_eviction(false)
    ///     .build();
    /// let mut events = map.subscribe()?;
    /// let mut cx = Context::from_waker(Waker::noop());
    /// assert!(events.poll_recv(&mut cx).is_pending());
    /// map.put(1, 10, Duration::from_millis(1));
    /// clock.advance(Duration::from_millis(2));
    /// map.evict_expired();
    /// assert!(matches!(events.poll_recv(&mut cx), Poll::Ready(Ok(e)) if e.value == 10));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Result<Event<K, V>, RecvError>> {
        self.rx.poll_recv(cx)
    }
}

/// `Stream` of the events, ending once the map is dropped and every event
/// was received. A lag is an item, `Err(Lagged(n))` with the exact number
/// of events missed; the stream then continues from the oldest event held.
///
/// ```
/// use expiremap::broadcast::Lagged;
/// use expiremap::{ExpireMap, ManualClock};
/// use futures_core::Stream;
/// use std::pin::Pin;
/// use std::task::{Context, Poll, Waker};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let map = ExpireMap::<u32, u32>::builder()
///     .clock(clock.clone())
///     .background_eviction(false)
///     .event_capacity(2)
///     .build();
/// let mut events = map.subscribe()?;
/// for k in 0..3 {
///     map.put(k, k, Duration::from_millis(1));
/// }
/// clock.advance(Duration::from_millis(2));
/// assert_eq!(map.evict_expired(), 3);
/// drop(map);
/// let mut cx = Context::from_waker(Waker::noop());
/// let mut items = Vec::new();
/// while let Poll::Ready(Some(item)) = Pin::new(&mut events).poll_next(&mut cx) {
///     items.push(item.map(|e| e.value));
/// }
/// assert_eq!(items.len(), 3); // Lagged(1), then the two events held
/// assert_eq!(items[0], Err(Lagged(1)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "stream")]
#[cfg_attr(docsrs, doc(cfg(feature = "stream")))]
impl<K, V> futures_core::Stream for Subscriber<K, V>
where
    K: Clone + Send + Sync,
    V: Clone + Send + Sync,
{
    type Item = Result<Event<K, V>, broadcast::Lagged>;

    fn poll_next(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        std::pin::Pin::new(&mut self.get_mut().rx).poll_next(cx)
    }
}

impl<K, V> fmt::Debug for Subscriber<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscriber").finish_non_exhaustive()
    }
}

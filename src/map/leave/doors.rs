//! Where values leave the map: event routing (publish to subscribers, hand
//! back to the caller, or drop) after the shard lock is released, and
//! the bulk doors (`clear`, shutdown at drop).
//!
//! Runs user code (`Drop`, `V::clone` of a notification copy) only with
//! no lock held, and never lets a panic in it cut a batch short
//! (`crate::unwind`).

use crate::broadcast::{self, SubscribeError};
use crate::clock::Time;
use crate::map::store::shard::{self, Door, Removed, Shard};
use crate::map::{Cause, EVICT_BATCH, Event, ExpireMap, Inner};
use crate::sync::{self, AtomicBool, Ordering, RwLock};
use crate::unwind::Panics;
use std::hash::{BuildHasher, Hash};

/// The lazily created event ring.
pub(in crate::map) struct Events<K, V> {
    /// Set (never cleared) once a sender exists: a single load keeps the
    /// unsubscribed map free of any event work.
    created: AtomicBool,
    sender: RwLock<Option<broadcast::Sender<Event<K, V>>>>,
}

impl<K, V> Events<K, V>
where
    K: Send + Sync,
    V: Send + Sync,
{
    /// No ring yet: the first subscriber creates it.
    pub(in crate::map) fn new() -> Self {
        Self {
            created: AtomicBool::new(false),
            sender: RwLock::new(None),
        }
    }

    /// A new reader of the ring, which the first call creates with
    /// `capacity` slots and room for `max` readers (validated by the
    /// builder).
    pub(in crate::map) fn subscribe(
        &self,
        capacity: usize,
        max: usize,
    ) -> Result<broadcast::Receiver<Event<K, V>>, SubscribeError> {
        if let Some(s) = sync::read_recursive(&self.sender).as_ref() {
            return s.subscribe();
        }
        let mut slot = self.sender.write();
        let sender = match slot.as_ref() {
            Some(s) => s,
            None => {
                let s = broadcast::Sender::new(capacity, max)
                    .expect("capacity and max_subscribers were validated by the builder");
                self.created.store(true, Ordering::Release);
                slot.insert(s)
            }
        };
        sender.subscribe()
    }

    /// Whether a sender was ever created (a subscriber came): until then
    /// no event can be published, and this is one load.
    #[inline]
    pub(in crate::map) fn created(&self) -> bool {
        self.created.load(Ordering::Acquire)
    }

    /// Events subscribers lost to lags so far (see [`Stats::events_lost`](crate::map::Stats::events_lost)).
    pub(in crate::map) fn lost(&self) -> u64 {
        if !self.created() {
            return 0;
        }
        sync::read_recursive(&self.sender)
            .as_ref()
            .map_or(0, |s| s.lost())
    }

    /// A sender to publish with, if an event published now would reach
    /// someone. It is a clone, so no lock is held while sending: `send` may
    /// drop old events (user `Drop`), which may drop the last map handle,
    /// whose shutdown takes this slot's write lock on the same thread.
    #[inline]
    pub(in crate::map) fn live_sender(&self) -> Option<broadcast::Sender<Event<K, V>>> {
        if !self.created() {
            return None;
        }
        sync::read_recursive(&self.sender)
            .as_ref()
            .filter(|s| s.receiver_count() > 0)
            .cloned()
    }
}

/// A second handle to the same map (two reference-count increments): what
/// one handle writes, every other reads. The eviction thread stops, is
/// joined, and the live entries are published as [`Cause::Shutdown`] when
/// the last handle is dropped, as moka's and quick_cache's `Cache` do.
impl<K, V, S> Clone for ExpireMap<K, V, S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            owner: self.owner.clone(),
        }
    }
}

/// What the handles of one map share: the eviction thread and the clock
/// watch. Dropped with the last handle ([`ExpireMap`] is `Clone`), which
/// shuts the map down; the thread's own `Arc<Inner>` keeps the map alive
/// until it is joined.
pub(in crate::map) struct Owner<K, V, S> {
    inner: sync::Arc<Inner<K, V, S>>,
    pub(in crate::map) evictor: Option<sync::thread::JoinHandle<()>>,
    pub(in crate::map) watch_key: Option<u64>,
}

impl<K, V, S> Owner<K, V, S> {
    pub(in crate::map) fn new(inner: sync::Arc<Inner<K, V, S>>) -> Self {
        Self {
            inner,
            evictor: None,
            watch_key: None,
        }
    }
}

impl<K, V, S> Drop for Owner<K, V, S> {
    fn drop(&mut self) {
        let inner = &*self.inner;
        if let Some(key) = self.watch_key.take() {
            inner.clock.clock().unwatch(key);
        }
        if let Some(handle) = self.evictor.take() {
            inner.signal.shutdown();
            // The last handle may be dropped by user code running on the
            // eviction thread itself (a value's `Drop`): never join there.
            if handle.thread().id() != sync::thread::current().id() {
                let _ = handle.join();
            }
        }
        (inner.finish)(inner);
    }
}

impl<K, V, S> Inner<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// Hands a value that left by `old.door` to that door: returns it
    /// (`Removed`, `Replaced`) or publishes it (`Expired`), publishing a
    /// notification copy of returned values if `publish_removals` is on.
    /// Runs after the shard lock is released.
    ///
    /// Never unwinds: a panic in user code on the way (the `Drop` of an old
    /// event the publication overwrites, of a value nobody is subscribed
    /// to receive, or `V::clone` of the notification copy) is caught and
    /// dropped, so that the call it serves still returns its value (see
    /// "Panics" in the crate docs).
    pub(in crate::map) fn leave(&self, old: Removed<K, V>, now: impl RemovedAt) -> Option<V> {
        let mut panics = Panics::new();
        let r = match old.door {
            door @ (Door::Expired | Door::Size) => {
                if door == Door::Size {
                    self.size_evicted.add_one();
                }
                match self.events.live_sender() {
                    Some(s) => Self::publish_evicted(&s, old, now.at(&self.clock), &mut panics),
                    None => {
                        panics.run(move || drop(old));
                    }
                }
                None
            }
            door => {
                if !self.config.publish_removals {
                    return Some(old.value);
                }
                if let Some(s) = self.events.live_sender() {
                    let cause = if door == Door::Removed {
                        Cause::Removed
                    } else {
                        Cause::Replaced
                    };
                    let Removed {
                        key,
                        value,
                        deadline,
                        ..
                    } = old;
                    let now = now.at(&self.clock);
                    panics.run(|| {
                        s.send(Event::new(key, value.clone(), cause, deadline, now));
                    });
                    panics.forget();
                    return Some(value);
                }
                Some(old.value)
            }
        };
        panics.forget();
        r
    }

    /// Publishes `old`, which left by the `Expired` or `Size` door, with
    /// `s` (a panic in the `Drop` of an event it displaces is kept in
    /// `panics`).
    fn publish_evicted(
        s: &broadcast::Sender<Event<K, V>>,
        old: Removed<K, V>,
        now: u64,
        panics: &mut Panics,
    ) {
        let cause = if old.door == Door::Size {
            Cause::Size
        } else {
            Cause::Expired
        };
        let event = Event::new(old.key, old.value, cause, old.deadline, now);
        panics.run(move || s.send(event));
    }

    /// [`leave_all`](Self::leave_all), which first settles at once a put's
    /// usual case: entries that left by the `Size` door (counted under the
    /// shard's lock already), of types that run no code when dropped, in a
    /// map that never had a subscriber. Nothing would publish or run for
    /// them, so they are only dropped (one load and no call; a full
    /// bounded map refuses most new keys this way).
    #[inline]
    pub(in crate::map) fn leave_pushed(&self, out: &mut shard::Out<K, V>, now: impl RemovedAt) {
        if out.is_empty() {
            return;
        }
        let plain = !std::mem::needs_drop::<K>() && !std::mem::needs_drop::<V>();
        if plain && out.all_size() && !self.events.created() {
            out.clear();
            return;
        }
        self.leave_all(out, now);
    }

    /// [`leave`](Self::leave) for each entry a put pushed out, which it
    /// takes from `out`. Cold: only a bounded map's full shards push
    /// anything out. The event ring is looked up once for them all. The
    /// `Size` ones were counted under the shard's lock (`ShardSlot`).
    #[cold]
    #[inline(never)]
    pub(in crate::map) fn leave_all(&self, out: &mut shard::Out<K, V>, now: impl RemovedAt) {
        let sender = self.events.live_sender();
        // Read once, and only for a subscriber or an expired entry.
        let mut at = sender.as_ref().map(|_| now.at(&self.clock));
        let mut panics = Panics::new();
        let (mut expired, mut late) = (0, 0);
        out.take_each(|r| match r.door {
            Door::Size | Door::Expired => {
                if r.door == Door::Expired {
                    // Evicted for its deadline (expired entries go first
                    // when a full map makes room), counted as the thread
                    // counts its own.
                    let t = *at.get_or_insert_with(|| now.at(&self.clock));
                    late = late.max(t.saturating_sub(r.deadline));
                    expired += 1;
                }
                match &sender {
                    Some(s) => Self::publish_evicted(s, r, at.unwrap_or(0), &mut panics),
                    None => {
                        panics.run(move || drop(r));
                    }
                }
            }
            // A put pushes out nothing by these doors; were one there, it
            // leaves as `leave` says, its value dropped here.
            _ => {
                panics.run(|| drop(self.leave(r, now)));
            }
        });
        if expired > 0 {
            self.evicted.fetch_add(expired, Ordering::Relaxed);
            self.max_lateness.fetch_max(late, Ordering::Relaxed);
        }
        panics.forget();
    }

    /// Publishes (or drops) every entry of a shard taken out of the map, in
    /// batches, outside every lock. Entries past their deadline leave as
    /// `Expired`; live ones as `live` (`Removed` for `clear`, `Shutdown` at
    /// drop), published only if that cause is enabled. A panicking `Drop`
    /// (of a value, or of an old event a publication displaces) is kept in
    /// `panics` and the drain goes on: every entry leaves by its door.
    pub(in crate::map) fn drain_shard(
        &self,
        shard: Shard<K, V>,
        now: u64,
        live: Cause,
        panics: &mut Panics,
    ) {
        let sender = self.events.live_sender();
        let publish_live = match live {
            Cause::Shutdown => self.config.notify_on_shutdown,
            _ => self.config.publish_removals,
        };
        let mut batch = Vec::with_capacity(if sender.is_some() { EVICT_BATCH } else { 0 });
        let mut removed = 0;
        shard.drain(|e| {
            let expired = now > e.deadline;
            removed += u64::from(!expired && live == Cause::Removed);
            match &sender {
                Some(sender) if expired || publish_live => {
                    let cause = if expired { Cause::Expired } else { live };
                    batch.push(Event::new(e.key, e.value, cause, e.deadline, now));
                    if batch.len() == EVICT_BATCH {
                        panics.run(|| sender.send_batch(batch.drain(..)));
                    }
                }
                _ => {
                    panics.run(move || drop(e));
                }
            }
        });
        if let Some(sender) = sender {
            panics.run(|| sender.send_batch(batch));
        }
        self.count_removed(removed);
    }

    /// Runs once, when the map is dropped (after the thread has stopped, or
    /// on the thread itself): publishes what is still held if asked and
    /// someone listens, then closes the ring so subscribers drain and see
    /// `Closed`. A panicking `Drop` on the way stops nothing; the first is
    /// resumed at the end (dropped instead on a thread already unwinding).
    pub(in crate::map) fn shutdown(&self) {
        // The last publication, with the counts as the map leaves them
        // (the thread, if any, has stopped).
        #[cfg(feature = "metrics")]
        self.publish();
        let mut panics = Panics::new();
        for shard in self.shards.iter() {
            let (taken, now) = self.take_all(shard);
            self.drain_shard(taken, now, Cause::Shutdown, &mut panics);
        }
        let sender = self.events.sender.write().take();
        panics.run(move || drop(sender));
        panics.resume();
    }

    /// Takes every entry out of `shard`, with the time read under its lock:
    /// the time that decides which of them leave as `Expired`.
    pub(in crate::map) fn take_all(
        &self,
        shard: &sync::biased::RwLock<Shard<K, V>>,
    ) -> (Shard<K, V>, u64) {
        let (mut guard, (), now) = self.clock.around(|| shard.write(), |_| (), |t, _| t.now());
        // A write of every key: loads in flight lose to it.
        guard.flights.iter().for_each(|f| f.touch());
        (guard.take_all(now), now)
    }

    /// Publishes or drops a batch of evicted entries, outside every lock;
    /// a panicking `Drop` is kept in `panics`, and the batch still leaves
    /// whole.
    pub(in crate::map) fn leave_evicted(
        &self,
        batch: &mut Vec<Removed<K, V>>,
        now: u64,
        panics: &mut Panics,
    ) {
        // Every evicted deadline is below `now` (see `Shard::evict`).
        let Some(late) = batch.iter().map(|r| now - r.deadline).max() else {
            return;
        };
        self.max_lateness.fetch_max(late, Ordering::Relaxed);
        match self.events.live_sender() {
            // One wake-up of parked subscribers per batch, not per event.
            Some(s) => {
                let events = batch
                    .drain(..)
                    .map(|r| Event::new(r.key, r.value, Cause::Expired, r.deadline, now));
                panics.run(|| s.send_batch(events));
            }
            None => panics.drop_each(batch.drain(..)),
        }
    }
}

/// The time a removal is published with ([`Event::removed_at`]): the time
/// its operation read under the shard lock, or, where that operation read
/// none (`None`, see `Inner::put_time`), the clock read when an event needs
/// it, after the lock (a time within the operation, after the removal).
pub(in crate::map) trait RemovedAt: Copy {
    /// The time, read from `clock` if the operation read none.
    fn at(self, clock: &Time) -> u64;
}

impl RemovedAt for u64 {
    #[inline]
    fn at(self, _: &Time) -> u64 {
        self
    }
}

impl RemovedAt for Option<u64> {
    #[inline]
    fn at(self, clock: &Time) -> u64 {
        self.unwrap_or_else(|| clock.now())
    }
}

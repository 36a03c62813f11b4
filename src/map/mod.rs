//! [`ExpireMap`]: sharded `RwLock` tables, each with its timer index, an
//! optional eviction thread, and event subscriptions.
//!
//! # Ground rules
//!
//! * Each shard is one write-preferring reader-writer lock over a
//!   [`Shard`](store::shard::Shard) (hash table + timer wheel):
//!   [`sync::biased::RwLock`], `parking_lot`'s raw lock whose reads write
//!   nothing shared while no write has come for a while (read-biased).
//!   `get`, `ttl` and `contains_key` take the read lock; everything that
//!   changes an entry takes the write lock. Iteration's spans and large
//!   bulk reads take the read lock unbiased (a writer never spins on them).
//! * The key's hash is computed before any lock is taken. Under a lock the
//!   only user code is `Eq` (lookups, and finding a key's flight) and the
//!   clones the crate docs list (`get`, loading, `update`'s read,
//!   iteration); values that leave the map are dropped, and events
//!   published, after the lock is released (a user panic on the way never
//!   cuts a batch short: `crate::unwind`). The eviction thread runs no user
//!   code under a lock at all, and catches panics from user `Drop` code it
//!   runs.
//! * Loads and updates in flight are registered in their key's shard,
//!   under its write lock (`load::flight`: a load and an update per key at
//!   most, waits that never close a cycle).
//! * The eviction thread and the shards meet only through
//!   [`Signal`](leave::evictor::Signal) and the shard locks; its loop and
//!   passes live in `leave::evictor`, with the wake-up protocol.
//! * Events are built only when someone is subscribed; an unsubscribed map
//!   never allocates the event ring.
//!
//! # Rooms and floors
//!
//! This file holds the map's types, its construction and the plain
//! operations (`put`, `get`, `remove`, the conditional writes, `len`,
//! `clear`, `subscribe`, `stats`). Beside it, the rooms of the map's own
//! paths, then the floors below them, each folder's `mod.rs` saying what
//! it owns and may call:
//!
//! | room | owns | may call |
//! | --- | --- | --- |
//! | `read` | the read path under the read lock, idle-expiry confirmation | `store`, `Time` |
//! | `write` | `write_key` (the write lock with a key's flight in mind), the bounded and conditional put, kicks | `store`, `load::flight`, `leave` |
//! | `expiry` | the map's own expiry: `insert`, `try_insert`, `try_put` | `write`, `read` |
//! | `iter` | iteration and `retain` over locked spans | `store`, `leave` |
//! | `builder`, `stats` | the public builder and counters | |
//! | `monitor` | the `metrics` and `tracing` features: publishing the counters, watching loads | `stats`, `Time` |
//! | `load/` | loading: the loading surface (`get_or_insert_with` and kin, `update`), a key's flights, moka's loaders, refresh ahead, the bulk reads and loads | `write`, `read`, `expiry`, `store` |
//! | `leave/` | where values leave: event routing, `clear`, shutdown; events and subscribers; the eviction thread | `store`, `crate::broadcast` |
//! | `store/` | one shard's storage: the shard (table + slab + timer lists + the bound's hooks) and its hash table, plain `&mut` code | `policy`, `crate::timer` |
//! | `policy/` | the bound: the map-wide budget, each shard's admission sketch and CLOCK hand | nothing of the map's |
//!
//! The clock adapter the map reads time through is `crate::clock::Time`.

mod builder;
mod expiry;
mod iter;
mod leave;
mod load;
mod monitor;
mod policy;
mod read;
mod stats;
mod store;
mod write;

pub use builder::{
    BuildError, Builder, DEFAULT_EVENT_CAPACITY, DEFAULT_EVICTION_INTERVAL,
    DEFAULT_MAX_SUBSCRIBERS, DEFAULT_PRECISION, MAX_EVENT_CAPACITY, MAX_PERIOD, MAX_SHARDS,
    MAX_SUBSCRIBERS, MIN_EVICTION_INTERVAL, MIN_PRECISION,
};
pub use expiry::{Expiry, Refused};
pub use iter::{Iter, Keys};
pub use leave::event::{Cause, Event, Subscriber};
pub use load::Update;
pub use load::bulk::BulkError;
pub use stats::Stats;

/// The condition of [`ExpireMap::expire`], as in Redis `EXPIRE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpireIf {
    /// Set the deadline whatever it was.
    Always,
    /// Only if the new deadline is later than the current one (`GT`).
    Later,
    /// Only if the new deadline is earlier than the current one (`LT`).
    Earlier,
}

use crate::broadcast::SubscribeError;
use crate::clock::Time;
use crate::sync::biased::RwLock;
use crate::sync::{self, Arc, AtomicU64, AtomicUsize, CachePadded, Ordering};
use crate::unwind::Panics;
use builder::{Config, Weigher};
use leave::doors::{self, Events};
use leave::evictor::{self, Signal};
use load::refresh;
use policy::Budget;
use read::Read;
use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use store::shard::{self, PutOutcome, Shard};
use write::PutIf;

use std::time::Duration;

/// Entries evicted per shard-lock hold, so eviction never blocks readers and
/// writers for long. 32 against 256: on 16 cores, puts of expiring keys at
/// 16 threads and 256 shards ran 13.6-13.7 Mops/s against 9.6-13.2, and
/// no worse at 64 or 128 shards; on 2 cores no difference showed (64
/// against 256 earlier). One under loom, so that small models reach a pass
/// that leaves due entries behind between two lock holds.
const EVICT_BATCH: usize = if cfg!(expiremap_loom) { 1 } else { 32 };

/// Timers a pass walks ahead of time per shard-lock hold, once nothing is
/// due in the shard (see `timer::Lists`, "Walking ahead"): each is a cache
/// miss and a relink, less than an eviction (a table removal and an
/// event besides), so holds stay short. Unbounded under loom, where it
/// adds no lock hold to the models.
const PRECASCADE_BATCH: usize = if cfg!(expiremap_loom) {
    usize::MAX
} else {
    256
};

/// Timers of a shard's next level-2 slot a pass walks ahead of time, at
/// most: that slot begins ~2.1 s after the last (at the default
/// precision), so a few thousand a pass (one every 4 ms or more) keep
/// ahead of millions, without one shard's walk holding up a pass.
const PRECASCADE2_PER_PASS: usize = if cfg!(expiremap_loom) {
    usize::MAX
} else {
    4096
};

/// A concurrent map whose entries expire after a per-entry time to live.
///
/// See the [crate docs](crate) for the semantics, the eviction thread, events
/// and memory cost.
///
/// ```
/// use expiremap::ExpireMap;
/// use std::time::Duration;
///
/// let map: ExpireMap<String, u64> = ExpireMap::new();
/// assert_eq!(map.put("a".to_string(), 1, Duration::from_secs(60)), None);
/// assert_eq!(map.get("a"), Some(1));
/// assert_eq!(map.put("a".to_string(), 2, Duration::from_secs(60)), Some(1));
/// assert_eq!(map.remove("a"), Some(2));
/// assert!(map.is_empty());
/// ```
pub struct ExpireMap<K, V, S = ahash::RandomState> {
    inner: Arc<Inner<K, V, S>>,
    /// Shared by every clone: the last one dropped shuts the map down
    /// (`doors::Owner`).
    owner: Arc<doors::Owner<K, V, S>>,
}

/// One shard behind its own cache-padded lock.
type ShardLock<K, V> = CachePadded<ShardSlot<K, V>>;

/// A shard's lock, and on the lock word's cache line the count of values
/// the shard's bound pushed out or refused (`Stats::size_evicted`).
///
/// The count is written only by a thread holding the shard's write lock,
/// with a load and a store (no read-modify-write: the lock already orders
/// the writers), on a line that thread has just written; `stats` sums the
/// shards' counts with no lock. Derefs to the lock.
#[repr(C)]
pub(crate) struct ShardSlot<K, V> {
    size_out: AtomicU64,
    lock: RwLock<Shard<K, V>>,
}

impl<K, V> ShardSlot<K, V> {
    /// Where the shard starts in its slot (`Shard`'s layout test): after
    /// the bound's count and the lock's words.
    #[cfg(all(test, not(expiremap_loom)))]
    pub(crate) const fn shard_offset() -> usize {
        std::mem::offset_of!(Self, lock) + sync::biased::data_offset::<Shard<K, V>>()
    }

    fn new(shard: Shard<K, V>) -> Self {
        Self {
            size_out: AtomicU64::new(0),
            lock: RwLock::new(shard),
        }
    }

    /// Adds `n` to the shard's count of values pushed out by its bound.
    /// The caller holds the shard's write lock (`_held` says so).
    #[inline]
    fn count_size_out(&self, _held: &mut Shard<K, V>, n: u64) {
        if n != 0 {
            let c = self.size_out.load(Ordering::Relaxed);
            self.size_out.store(c + n, Ordering::Relaxed);
        }
    }

    /// The shard's count of values pushed out by its bound.
    fn size_out(&self) -> u64 {
        self.size_out.load(Ordering::Relaxed)
    }
}

impl<K, V> std::ops::Deref for ShardSlot<K, V> {
    type Target = RwLock<Shard<K, V>>;
    #[inline]
    fn deref(&self) -> &Self::Target {
        &self.lock
    }
}

struct Inner<K, V, S> {
    shards: Box<[ShardLock<K, V>]>,
    hasher: S,
    clock: Time,
    config: Config,
    signal: Arc<Signal>,
    events: Events<K, V>,
    /// The capacity bound all shards share, in a bounded map.
    budget: Option<Arc<Budget>>,
    /// Where the next `room_elsewhere` starts looking.
    room_cursor: AtomicUsize,
    /// In a bounded map, per shard: no entry of it has a deadline (its
    /// effective one, idle-capped) before this time (clock ns; `u64::MAX`:
    /// none known), so none is expired until the clock passes it. A lower
    /// bound, lowered by writes and made exact by `room_elsewhere`, each
    /// under the shard's write lock; read without it, to find expired
    /// entries in other shards before a full map evicts live ones. Not padded: it is
    /// written rarely (a put lowers it only for an entry evictable earlier
    /// than any the shard held) and read whole by every put that makes
    /// room, so eight shards to a cache line make that read 8 lines at 64
    /// shards instead of 64.
    due: Box<[AtomicU64]>,
    /// In a bounded map, a lower bound of every `due` time, so that a put
    /// that makes room reads one word, not `due` whole, while nothing in
    /// the map can have expired (see `write::DueMin`).
    due_min: CachePadded<AtomicU64>,
    evicted: AtomicU64,
    /// Of `evicted`, those writes took (`evictor::take_due`).
    evicted_by_writers: AtomicU64,
    /// Values pushed out (or refused) by the bound.
    size_evicted: stats::Tally,
    /// The largest lateness of an eviction (removal time - deadline), ns.
    max_lateness: AtomicU64,
    /// Hit and miss counts, with `record_stats`.
    reads: Option<stats::Reads>,
    /// Reads take [`ExpireMap::read_extra`]'s path: the map has idle
    /// expiry or records stats.
    read_extras: bool,
    /// Weighs entries against `max_weight`; runs before the shard lock.
    weigher: Option<Weigher<K, V>>,
    /// The map's own expiry policy (`expiry`); runs before the shard lock.
    expiry: Option<std::sync::Arc<dyn Expiry<K, V>>>,
    /// Where refresh ahead's reloads run, if not in the caller (`refresh`).
    spawner: Option<refresh::Spawner>,
    /// Reloads started, and those that failed (`refresh`).
    refreshes: AtomicU64,
    refresh_failures: AtomicU64,
    /// The metrics name and the counts only metrics need
    /// ([`Builder::metrics`]).
    #[cfg(feature = "metrics")]
    metrics: Option<monitor::Metrics>,
    /// `Inner::shutdown`, captured where the trait bounds hold, so that the
    /// bound-free `Drop` can call it.
    finish: fn(&Inner<K, V, S>),
}

impl<K, V> ExpireMap<K, V>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// A map with the default settings and a background eviction thread.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A [`Builder`] with the default settings.
    pub fn builder() -> Builder<K, V> {
        Builder::new()
    }
}

impl<K, V> Default for ExpireMap<K, V>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V, S> ExpireMap<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    pub(crate) fn from_parts(
        config: Config,
        clock: Time,
        hasher: S,
        weigher: Option<Weigher<K, V>>,
        expiry: Option<std::sync::Arc<dyn Expiry<K, V>>>,
        spawner: Option<refresh::Spawner>,
    ) -> Result<Self, BuildError> {
        let now = clock.now();
        let budget = config.bound.map(|cap| Arc::new(Budget::new(cap)));
        // The shards count what their bounds push out (`ShardSlot`); this
        // counts only the rare value refused after a search of the others.
        let size_evicted = stats::Tally::new(1);
        let shift = shard::tick_shift(config.precision);
        let writer_lag = evictor::writer_lag(&config, shift);
        let n = config.shards;
        let shards = (0..n)
            .map(|i| {
                let mut shard = Shard::new(shift, shard::phase(i, n), now);
                if let Some(budget) = &budget {
                    // One budget for the map; each shard expects its share.
                    let share = budget.cap.div_ceil(n as u64);
                    shard = shard.bounded_by(budget.clone(), share, weigher.is_some());
                }
                if let Some(idle) = config.idle {
                    shard = shard.idle(idle);
                }
                if config.refresh.is_some() {
                    shard = shard.tracking_writes();
                }
                shard = shard.writer_lag(writer_lag);
                CachePadded::new(ShardSlot::new(shard))
            })
            .collect();
        let background = config.background_eviction;
        let reads = config
            .record_stats
            .then(|| stats::Reads::new(2 * sync::available_parallelism()));
        let read_extras = reads.is_some() || config.idle.is_some();
        #[cfg(feature = "metrics")]
        let metrics_name = config.metrics.clone();
        let inner = Arc::new(Inner {
            shards,
            hasher,
            clock,
            config,
            signal: Arc::new(Signal::new()),
            events: Events::new(),
            due: match &budget {
                Some(_) => (0..n).map(|_| AtomicU64::new(u64::MAX)).collect(),
                None => Box::new([]),
            },
            due_min: CachePadded::new(AtomicU64::new(write::DUE_MIN_NONE)),
            budget,
            room_cursor: AtomicUsize::new(0),
            evicted: AtomicU64::new(0),
            evicted_by_writers: AtomicU64::new(0),
            size_evicted,
            max_lateness: AtomicU64::new(0),
            read_extras,
            reads,
            weigher,
            expiry,
            spawner,
            refreshes: AtomicU64::new(0),
            refresh_failures: AtomicU64::new(0),
            #[cfg(feature = "metrics")]
            metrics: metrics_name.map(|name| monitor::Metrics::new(name, now)),
            finish: Inner::shutdown,
        });
        let mut owner = doors::Owner::new(inner.clone());
        if background {
            let signal = inner.signal.clone();
            owner.watch_key = inner
                .clock
                .clock()
                .watch(Box::new(move || signal.time_changed()));
            let evictor = inner.clone();
            let handle = sync::spawn_named("expiremap-evictor", move || evictor.run_evictor())
                .map_err(|e| BuildError::Spawn(e.to_string()))?;
            owner.evictor = Some(handle);
        }
        Ok(Self {
            inner,
            owner: Arc::new(owner),
        })
    }

    /// Inserts or overwrites `key` with `value`, live for `ttl` from now
    /// (deadline inclusive). Returns the previous value if it was still live.
    ///
    /// **A zero `ttl` is ignored**: nothing changes, `None` is returned, and
    /// a live value of `key` stays readable (to store something already
    /// expired, let an [`Expiry`] policy say zero, or `remove` the key). A
    /// `ttl` too large to represent saturates to the largest deadline. Overwriting
    /// an entry already past its deadline hands the old value to the
    /// `Expired` door (published as [`Cause::Expired`]) and returns `None`.
    pub fn put(&self, key: K, value: V, ttl: Duration) -> Option<V> {
        if ttl.is_zero() {
            return None;
        }
        let inner = &*self.inner;
        if inner.config.bound.is_some() {
            return self.put_always(key, value, ttl);
        }
        let hash = inner.hasher.hash_one(&key);
        // Declared before the lock guard, so that if the user's `Eq` panics
        // in the probe, the key and value are dropped after the guard:
        // outside the lock.
        let mut kv = Some((key, value));
        let ttl = nanos(ttl);
        let (outcome, kick, now, due) = {
            let key = &kv.as_ref().expect("just set").0;
            let (mut shard, read) = inner.write_key_with(hash, key, false, |t, s| {
                inner.put_time(ttl == u64::MAX, t, s)
            });
            // No time read: nothing below depends on it (`put_time`).
            let now = read.unwrap_or(0);
            let deadline = now.saturating_add(ttl);
            let outcome = shard.put(hash, &mut kv, deadline, now);
            let timer = inner.timer_of(deadline, now);
            let kick = inner.needs_kick(&shard, timer);
            (outcome, kick, read, inner.take_due(&mut shard, now))
        };
        self.kick_if(kick);
        // The put's own old value first, then what it evicted after it.
        let old = match outcome {
            // An unbounded shard neither refuses nor runs out of room.
            PutOutcome::Inserted | PutOutcome::Refused | PutOutcome::NoRoom { .. } => None,
            PutOutcome::Overwrote(old) => inner.leave(old, now),
        };
        inner.leave_due(due);
        old
    }

    /// The value for `key` if it is live (`now <= deadline`).
    #[inline]
    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.read_if_live(key, Read::Get, V::clone)
    }

    /// The value for `key` and its remaining time to live, read together.
    pub fn get_with_ttl<Q>(&self, key: &Q) -> Option<(V, Duration)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let r = self.read_live(key, true, |value, left| (value.clone(), left));
        self.count(r.is_some());
        r
    }

    /// The remaining time to live of a live entry.
    pub fn ttl<Q>(&self, key: &Q) -> Option<Duration>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.read_live(key, false, |_, left| left)
    }

    /// `true` if `key` has a live entry.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.read_if_live(key, Read::Peek, |_| ()).is_some()
    }

    /// Removes `key`. Returns its value only if it was live; a value already
    /// past its deadline leaves by the `Expired` door (published as
    /// [`Cause::Expired`]) and `None` is returned. Racing the eviction of the
    /// same entry, exactly one of the two gets the value.
    #[doc(alias = "invalidate")]
    pub fn remove<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let (removed, now, due) = {
            let (mut shard, now) = inner.write_key(hash, key, false);
            let removed = shard.remove(hash, key, now);
            (removed, now, inner.take_due(&mut shard, now))
        };
        if removed
            .as_ref()
            .is_some_and(|r| r.door == shard::Door::Removed)
        {
            inner.count_removed(1);
        }
        let removed = removed.and_then(|r| inner.leave(r, now));
        inner.leave_due(due);
        removed
    }

    /// Gives a live entry the new deadline `now + ttl`. Returns `false` (and
    /// changes nothing) if the entry is absent or expired, or `ttl` is zero.
    /// The same as [`expire`](Self::expire) with [`ExpireIf::Always`].
    pub fn touch<Q>(&self, key: &Q, ttl: Duration) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.expire(key, ttl, ExpireIf::Always)
    }

    /// Sets a live entry's deadline to `now + ttl` if `cond` holds against
    /// its current deadline (Redis `EXPIRE`, with `GT` as
    /// [`ExpireIf::Later`] and `LT` as [`ExpireIf::Earlier`]). Returns
    /// whether the deadline changed. An absent or expired entry, or a zero
    /// `ttl`, changes nothing and returns `false`.
    ///
    /// ```
    /// use expiremap::{ExpireIf, ExpireMap, ManualClock};
    /// use std::time::Duration;
    ///
    /// let map = ExpireMap::<&str, u32>::builder().clock(ManualClock::new()).build();
    /// map.put("a", 1, Duration::from_secs(10));
    /// assert!(!map.expire("a", Duration::from_secs(5), ExpireIf::Later));
    /// assert!(map.expire("a", Duration::from_secs(5), ExpireIf::Earlier));
    /// assert_eq!(map.ttl("a"), Some(Duration::from_secs(5)));
    /// assert!(map.expire("a", Duration::from_secs(60), ExpireIf::Always));
    /// assert!(!map.expire("b", Duration::from_secs(60), ExpireIf::Always));
    /// ```
    pub fn expire<Q>(&self, key: &Q, ttl: Duration, cond: ExpireIf) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if ttl.is_zero() {
            return false;
        }
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let (done, kick, due) = {
            let (mut shard, now) = inner.write_key(hash, key, false);
            let deadline = now.saturating_add(nanos(ttl));
            let timer = shard.touch(hash, key, deadline, now, cond);
            if let Some(t) = timer {
                inner.note_due(hash, t);
            }
            let kick = timer.and_then(|t| inner.needs_kick(&shard, t));
            (timer.is_some(), kick, inner.take_due(&mut shard, now))
        };
        self.kick_if(kick);
        inner.leave_due(due);
        done
    }

    /// Stores `value` for `key` only if it has no live entry (an expired
    /// one counts as absent, and its value leaves as
    /// [`Cause::Expired`]). Returns `None` if it stored the value, else a
    /// clone of the live value, which stays. A zero `ttl` stores nothing
    /// (it returns the live value, if any). In a bounded map the new value
    /// may be refused like any put's (it then leaves as [`Cause::Size`]).
    ///
    /// The live value is cloned under the shard's write lock, as `get`
    /// clones under the read lock.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// let map: ExpireMap<&str, u32> = ExpireMap::new();
    /// let minute = Duration::from_secs(60);
    /// assert_eq!(map.put_if_absent("a", 1, minute), None); // stored
    /// assert_eq!(map.put_if_absent("a", 2, minute), Some(1)); // kept
    /// assert_eq!(map.get("a"), Some(1));
    /// ```
    pub fn put_if_absent(&self, key: K, value: V, ttl: Duration) -> Option<V> {
        if ttl.is_zero() {
            // A read of the live value, not an access (as with a TTL).
            return self.read_if_live(&key, Read::Peek, V::clone);
        }
        self.put_slow(key, value, ttl, PutIf::Absent)
            .unwrap_or(None)
    }

    /// Stores `value` for `key` only over a live entry, live for `ttl` from
    /// now, and returns the old value; `None` (and nothing stored) if the
    /// entry is absent or expired, or `ttl` is zero. Redis `SET ... XX`.
    ///
    /// The key is made with `ToOwned` before any lock is taken (for a
    /// `String` key, `replace` takes a `&str`), so that a weigher can weigh
    /// the new entry outside the lock. In a bounded map the new value
    /// counts as an access, and a weight that grew may push out other
    /// entries (or this one, if it alone is over the bound).
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// let map: ExpireMap<String, u32> = ExpireMap::new();
    /// let minute = Duration::from_secs(60);
    /// assert_eq!(map.replace("a", 1, minute), None); // absent: not stored
    /// assert_eq!(map.get("a"), None);
    /// map.put("a".to_string(), 1, minute);
    /// assert_eq!(map.replace("a", 2, minute), Some(1));
    /// assert_eq!(map.get("a"), Some(2));
    /// ```
    pub fn replace<Q>(&self, key: &Q, value: V, ttl: Duration) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if ttl.is_zero() {
            return None;
        }
        self.put_slow(key.to_owned(), value, ttl, PutIf::Live)
            .unwrap_or(None)
    }

    /// Entries held, including those past their deadline but not yet evicted.
    ///
    /// The shards are counted one after another, not at one instant; in a
    /// map bounded by [`max_entries`](Builder::max_entries), whose entries
    /// never exceed the bound at any instant, the count is capped at the
    /// bound (an entry counted in one shard may have left it, making room
    /// for one counted in a later shard).
    #[doc(alias = "entry_count")]
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// What the entries held weigh: the sum of their
    /// [`weigher`](Builder::weigher) weights, or their count in a map
    /// without a weigher. Like [`len`](Self::len), never above the bound.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// let map = ExpireMap::<u32, Vec<u8>>::builder()
    ///     .max_weight(10 << 30) // 10 GiB
    ///     .weigher(|_, v: &Vec<u8>| v.capacity() as u64)
    ///     .build();
    /// map.put(1, vec![0; 1 << 20], Duration::from_secs(60));
    /// map.put(2, vec![0; 3 << 20], Duration::from_secs(60));
    /// assert_eq!(map.weighted_size(), 4 << 20);
    /// ```
    pub fn weighted_size(&self) -> u64 {
        self.inner.weighted_size()
    }

    /// `true` if no entry is held (see [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.inner.shards.iter().all(|s| s.read().len() == 0)
    }

    /// Removes every entry. Live ones leave by the `Removed` door (published
    /// with `publish_removals`), expired ones by `Expired`.
    ///
    /// If a value's `Drop` (or a dropped event's) panics, every other value
    /// still leaves by its door, and the first panic reaches the caller
    /// once all have.
    #[doc(alias = "invalidate_all")]
    pub fn clear(&self) {
        let inner = &*self.inner;
        let mut panics = Panics::new();
        for shard in inner.shards.iter() {
            let (taken, now) = inner.take_all(shard);
            inner.drain_shard(taken, now, Cause::Removed, &mut panics);
        }
        panics.resume();
    }

    /// A new reader of this map's events. It receives every event published
    /// after this call. Fails if `max_subscribers` readers already exist.
    #[doc(alias = "eviction_listener")]
    pub fn subscribe(&self) -> Result<Subscriber<K, V>, SubscribeError> {
        let cfg = &self.inner.config;
        let events = &self.inner.events;
        events
            .subscribe(cfg.event_capacity, cfg.max_subscribers)
            .map(Subscriber::new)
    }

    /// Publishes every series of [`Builder::metrics`] now (feature
    /// `metrics`; nothing if the map has no metrics name), to the recorder
    /// in force on this thread: one set with
    /// `metrics::with_local_recorder`, else the global one. The eviction
    /// thread publishes at least once a second and the last handle's drop
    /// once more; call this for a scrape that must be current, or to
    /// publish from a map without the thread.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn publish_metrics(&self) {
        self.inner.publish();
    }
}

impl<K, V, S> Inner<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// [`ExpireMap::len`].
    fn len(&self) -> usize {
        let n: usize = self.shards.iter().map(|s| s.read().len()).sum();
        match (&self.budget, &self.weigher) {
            (Some(b), None) => n.min(usize::try_from(b.cap).unwrap_or(usize::MAX)),
            _ => n,
        }
    }

    /// [`ExpireMap::weighted_size`].
    fn weighted_size(&self) -> u64 {
        let Some(budget) = &self.budget else {
            return self.len() as u64;
        };
        // Read one shard after another: the sum may pass the bound (even
        // `u64::MAX`) while entries come and go.
        let held = self.shards.iter().map(|s| s.read().weight());
        held.fold(0, u64::saturating_add).min(budget.cap)
    }

    /// Counts a value that left by the `Removed` door, for the metrics.
    #[inline]
    #[allow(unused_variables)] // without the `metrics` feature nothing is counted
    fn count_removed(&self, n: u64) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.removed.fetch_add(n, sync::Ordering::Relaxed);
        }
    }

    #[inline]
    fn shard(&self, hash: u64) -> &RwLock<Shard<K, V>> {
        &self.shards[self.shard_index(hash)]
    }

    /// `hash`'s shard's lock and what sits beside it.
    #[inline]
    fn slot(&self, hash: u64) -> &ShardSlot<K, V> {
        &self.shards[self.shard_index(hash)]
    }

    /// The index of `hash`'s shard.
    #[inline]
    fn shard_index(&self, hash: u64) -> usize {
        // Bits 40.. pick the shard; the shard's table works from the low 32
        // bits, so the two choices are independent.
        (hash >> 40) as usize & (self.shards.len() - 1)
    }

    /// Takes the lock of `hash`'s shard with `lock`, starts loading what
    /// the operation touches first with `warm`, and reads the time with
    /// `read`, in the order [`Time::around`] explains.
    #[inline(always)]
    fn around<'a, G, W, T>(
        &'a self,
        hash: u64,
        lock: impl FnOnce(&'a RwLock<Shard<K, V>>) -> G,
        warm: impl FnOnce(&Shard<K, V>) -> W,
        read: impl FnOnce(&Time, &G) -> T,
    ) -> (G, W, T)
    where
        G: std::ops::Deref<Target = Shard<K, V>>,
    {
        let shard = self.shard(hash);
        self.clock.around(|| lock(shard), |guard| warm(guard), read)
    }
}

/// `d` in nanoseconds, saturating (without `as_nanos`' u128 arithmetic).
#[inline]
fn nanos(d: Duration) -> u64 {
    d.as_secs()
        .checked_mul(1_000_000_000)
        .and_then(|n| n.checked_add(u64::from(d.subsec_nanos())))
        .unwrap_or(u64::MAX)
}

impl<K, V, S> fmt::Debug for ExpireMap<K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExpireMap")
            .field("shards", &self.inner.config.shards)
            .field("background_eviction", &self.owner.evictor.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(expiremap_loom)))]
mod tests;

//! [`ExpireMap`]: sharded `RwLock` tables, each with its timer index, an
//! optional eviction thread, and event subscriptions.
//!
//! # Ground rules
//!
//! * Each shard is one write-preferring `parking_lot::RwLock` over a
//!   [`Shard`](shard::Shard) (hash table + timer wheel). `get`, `ttl` and
//!   `contains_key` take the read lock; everything that changes an entry takes
//!   the write lock.
//! * The key's hash is computed before any lock is taken. Under a lock the
//!   only user code is `Eq` (lookups, and finding a key's flight) and the
//!   clones the crate docs list (`get`, loading, `update`'s read,
//!   iteration); values that leave the map are dropped, and events
//!   published, after the lock is released (a user panic on the way never
//!   cuts a batch short: `crate::unwind`). The eviction thread runs no user
//!   code under a lock at all, and catches panics from user `Drop` code it
//!   runs.
//! * Loads and updates in flight are registered in their key's shard,
//!   under its write lock (`load`: one flight per key, waits that never
//!   close a cycle).
//! * The eviction thread and the shards meet only through
//!   [`Signal`](evictor::Signal) and the shard locks; its loop and passes
//!   live in `evictor`, with the wake-up protocol.
//! * Events are built only when someone is subscribed; an unsubscribed map
//!   never allocates the event ring.

mod builder;
mod event;
mod evictor;
mod iter;
mod load;
mod policy;
mod shard;
mod stats;
mod table;

/// Hints the CPU to start loading the cache line of `value`.
#[inline]
fn prefetch<T>(value: &T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let p = std::ptr::from_ref(value).cast::<i8>();
        // SAFETY: a prefetch is only a hint: it never faults and has no
        // effect on memory, whatever the address (here a valid reference).
        // `unsafe` is needed before Rust 1.87 made the intrinsic safe.
        #[allow(unused_unsafe)]
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p);
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = value;
}

pub use builder::{
    BuildError, Builder, DEFAULT_EVENT_CAPACITY, DEFAULT_EVICTION_INTERVAL,
    DEFAULT_MAX_SUBSCRIBERS, DEFAULT_PRECISION, MAX_EVENT_CAPACITY, MAX_PERIOD, MAX_SHARDS,
    MAX_SUBSCRIBERS, MIN_EVICTION_INTERVAL, MIN_PRECISION,
};
pub use event::{Cause, Event, Subscriber};
pub use iter::{Iter, Keys};

/// When `put_slow` stores.
enum PutIf<'a, K, V> {
    Always,
    /// No live entry for the key.
    Absent,
    /// A live entry for the key.
    Live,
    /// No write touched the key since this load began.
    Untouched(&'a load::Flight<K, V>),
    /// The commit of an `update` (the key's writes wait for it, so its
    /// entry changed only by leaving). `keep`: store with this write
    /// deadline (the entry's) instead of the TTL, only if the entry read
    /// (live until `live_until`) has not expired since.
    Commit {
        keep: Option<u64>,
        live_until: Option<u64>,
    },
}

/// What a read counts as.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Read {
    /// A user's read of a value: an access for idle expiry, and a hit or
    /// miss for stats.
    Get,
    /// Neither (`contains_key`, and reads that only compare).
    Peek,
}

/// `put_slow`'s `Commit` condition failed: the entry expired since.
struct Stale;

/// What a loading call that missed finds under the write lock.
enum Begun<K, V> {
    /// The key's live value.
    Hit(V),
    /// The key's flight, to wait for.
    Wait(Arc<load::Flight<K, V>>),
    /// A new load, registered for the caller to run.
    Run(Arc<load::Flight<K, V>>),
}

/// What the function given to [`ExpireMap::update`] does with the entry
/// it was shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Update<V> {
    /// Leave the entry as it is (or absent).
    Keep,
    /// Remove the entry (its value leaves as [`Cause::Removed`]).
    Remove,
    /// Store this value, live for this long from now. A zero TTL changes
    /// nothing, as for [`ExpireMap::put`].
    Set(V, Duration),
    /// Store this value with the entry's current deadline (Redis `SET ...
    /// KEEPTTL`). Shown no live entry, it stores nothing.
    SetKeepTtl(V),
}

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

use crate::broadcast::{self, SubscribeError};
use crate::clock::{Clock, SystemClock};
use crate::sync::{self, Arc, AtomicBool, AtomicU64, CachePadded, Ordering, RwLock};
use crate::unwind::Panics;
use builder::{Config, Weigher};
use evictor::Signal;
use shard::{Door, PutOutcome, Removed, Shard};
use std::borrow::Borrow;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::ops::Not;

use std::time::Duration;

/// Entries evicted per shard-lock hold, so eviction never blocks readers and
/// writers for long. One under loom, so that small models reach a pass that
/// leaves due entries behind between two lock holds.
const EVICT_BATCH: usize = if cfg!(expiremap_loom) { 1 } else { 256 };

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
    evictor: Option<sync::thread::JoinHandle<()>>,
    watch_key: Option<u64>,
}

/// One shard behind its own cache-padded lock.
type ShardLock<K, V> = CachePadded<RwLock<Shard<K, V>>>;

struct Inner<K, V, S> {
    shards: Box<[ShardLock<K, V>]>,
    hasher: S,
    clock: Time,
    config: Config,
    signal: Arc<Signal>,
    events: Events<K, V>,
    evicted: AtomicU64,
    /// Values pushed out (or refused) by the bound.
    size_evicted: AtomicU64,
    /// The largest lateness of an eviction (removal time - deadline), ns.
    max_lateness: AtomicU64,
    /// Hit and miss counts, with `record_stats`.
    reads: Option<stats::Reads>,
    /// Reads take [`ExpireMap::read_extra`]'s path: the map has idle
    /// expiry or records stats.
    read_extras: bool,
    /// Weighs entries against `max_weight`; runs before the shard lock.
    weigher: Option<Weigher<K, V>>,
    /// `Inner::shutdown`, captured where the trait bounds hold, so that the
    /// bound-free `Drop` can call it.
    finish: fn(&Inner<K, V, S>),
}

/// The clock, with the default clock called without dynamic dispatch.
pub(crate) enum Time {
    System(SystemClock),
    /// A user clock, guarded so that a reading never goes below an earlier one.
    Other {
        clock: Box<dyn Clock>,
        high: AtomicU64,
    },
}

impl Time {
    /// Wraps `clock`, recognising the default clock so that it is read
    /// without dynamic dispatch or the monotonic guard.
    pub(crate) fn new<C: Clock>(clock: C) -> Self {
        match (&clock as &dyn std::any::Any).downcast_ref::<SystemClock>() {
            Some(sys) => Time::System(*sys),
            None => Time::Other {
                high: AtomicU64::new(clock.now()),
                clock: Box::new(clock),
            },
        }
    }

    #[inline]
    fn now(&self) -> u64 {
        match self {
            Time::System(c) => c.now(),
            Time::Other { clock, high } => {
                let t = clock.now();
                high.fetch_max(t, Ordering::Relaxed).max(t)
            }
        }
    }

    /// An upper bound on [`now`](Self::now): a cheap one for the default
    /// clock, the exact time for a user clock (which has no cheap bound).
    #[inline]
    fn now_at_most(&self) -> u64 {
        match self {
            Time::System(c) => c.now_at_most(),
            Time::Other { .. } => self.now(),
        }
    }

    /// `true` if `deadline` has not passed, given `bound` from
    /// [`now_at_most`](Self::now_at_most), read under the same shard lock.
    #[inline]
    fn live(&self, bound: u64, deadline: u64) -> bool {
        bound <= deadline
            || match self {
                Time::System(c) => c.now_after(bound) <= deadline,
                // The bound was the exact time.
                Time::Other { .. } => false,
            }
    }

    /// Takes `lock`, starts loading what the operation touches first with
    /// `warm` (its table slot), and only then reads the time with `read`.
    ///
    /// The time is read *after* the lock is held, whatever the clock: every
    /// decision an operation makes about "expired or not" must hold at the
    /// instant it acts, and a reading taken before waiting for the lock can
    /// be any amount older than that (a slow lock holder, a preempted
    /// thread). So a user [`Clock`] runs under the shard lock; its docs say
    /// what that asks of it.
    ///
    /// Why after `warm`: a clock read holds up the instructions after it.
    /// The exact read has the vDSO's fence, which waits for every earlier
    /// load; the cheap bound's unfenced `rdtsc` does not wait for loads, but
    /// its micro-ops fill the out-of-order window ahead of this operation's
    /// loads. After a prefetch (which nothing waits for) this operation's
    /// first cache miss is already in flight (BENCHMARKS.md, "lookup_loop").
    #[inline(always)]
    fn around<G, W, T>(
        &self,
        lock: impl FnOnce() -> G,
        warm: impl FnOnce(&G) -> W,
        read: impl FnOnce(&Time) -> T,
    ) -> (G, W, T) {
        let guard = lock();
        let w = warm(&guard);
        let t = match self {
            // A local copy: `read` need not load and test the variant again
            // after the lock (an atomic operation, after which the compiler
            // must reload `self`).
            &Time::System(c) => read(&Time::System(c)),
            Time::Other { .. } => read(self),
        };
        (guard, w, t)
    }

    fn clock(&self) -> &dyn Clock {
        match self {
            Time::System(c) => c,
            Time::Other { clock, .. } => clock.as_ref(),
        }
    }
}

/// The lazily created event ring.
struct Events<K, V> {
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
    /// A sender to publish with, if an event published now would reach
    /// someone. It is a clone, so no lock is held while sending: `send` may
    /// drop old events (user `Drop`), which may drop the last map handle,
    /// whose shutdown takes this slot's write lock on the same thread.
    #[inline]
    fn live_sender(&self) -> Option<broadcast::Sender<Event<K, V>>> {
        if !self.created.load(Ordering::Acquire) {
            return None;
        }
        sync::read_recursive(&self.sender)
            .as_ref()
            .filter(|s| s.receiver_count() > 0)
            .cloned()
    }
}

/// Counters of a map's reads and eviction work, from [`ExpireMap::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Reads that found a live value: `get`, `get_with_ttl`, and
    /// `get_or_insert_with` hits. Counted only with
    /// [`Builder::record_stats`]; 0 otherwise.
    pub hits: u64,
    /// Reads that found no live value (a `get_or_insert_with` miss counts
    /// once, however long it waits or loads). As `hits`.
    pub misses: u64,
    /// Values pushed out, or refused, by the capacity bound (published as
    /// [`Cause::Size`]).
    pub size_evicted: u64,
    /// The latest any eviction of an expired entry came: removal time minus
    /// deadline, the largest seen.
    pub max_lateness: Duration,
    /// Entries evicted because their deadline passed (by the thread or
    /// [`ExpireMap::evict_expired`]). Not counted: an entry a read removed
    /// because it found it idle-expired (see
    /// [`Builder::time_to_idle`](crate::Builder::time_to_idle)), published
    /// as `Expired` all the same.
    pub evicted: u64,
    /// Eviction passes made by the background thread.
    pub passes: u64,
    /// Times the background thread woke from a wait. An idle map adds none.
    pub wakeups: u64,
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
    ) -> Result<Self, BuildError> {
        let now = clock.now();
        let shift = shard::tick_shift(config.precision);
        let n = config.shards;
        let shards = (0..n)
            .map(|i| {
                let mut shard = Shard::new(shift, shard::phase(i, n), now);
                if let Some(bound) = config.bound {
                    // An even split; the first `bound % n` shards take one
                    // more. The builder made `n <= bound`, so each gets 1+.
                    let cap = bound / n as u64 + u64::from((i as u64) < bound % n as u64);
                    shard = shard.bounded(cap, weigher.is_some());
                }
                if let Some(idle) = config.idle {
                    shard = shard.idle(idle);
                }
                CachePadded::new(RwLock::new(shard))
            })
            .collect();
        let background = config.background_eviction;
        let reads = config
            .record_stats
            .then(|| stats::Reads::new(2 * sync::available_parallelism()));
        let read_extras = reads.is_some() || config.idle.is_some();
        let inner = Arc::new(Inner {
            shards,
            hasher,
            clock,
            config,
            signal: Arc::new(Signal::new()),
            events: Events {
                created: AtomicBool::new(false),
                sender: RwLock::new(None),
            },
            evicted: AtomicU64::new(0),
            size_evicted: AtomicU64::new(0),
            max_lateness: AtomicU64::new(0),
            read_extras,
            reads,
            weigher,
            finish: Inner::shutdown,
        });
        let mut map = Self {
            inner,
            evictor: None,
            watch_key: None,
        };
        if background {
            let signal = map.inner.signal.clone();
            map.watch_key = map
                .inner
                .clock
                .clock()
                .watch(Box::new(move || signal.time_changed()));
            let inner = map.inner.clone();
            let handle = sync::spawn_named("expiremap-evictor", move || inner.run_evictor())
                .map_err(|e| BuildError::Spawn(e.to_string()))?;
            map.evictor = Some(handle);
        }
        Ok(map)
    }

    /// Inserts or overwrites `key` with `value`, live for `ttl` from now
    /// (deadline inclusive). Returns the previous value if it was still live.
    ///
    /// A zero `ttl` is ignored: nothing changes and `None` is returned. A `ttl`
    /// too large to represent saturates to the largest deadline. Overwriting
    /// an entry already past its deadline hands the old value to the
    /// `Expired` door (published as [`Cause::Expired`]) and returns `None`.
    pub fn put(&self, key: K, value: V, ttl: Duration) -> Option<V> {
        if ttl.is_zero() {
            return None;
        }
        let inner = &*self.inner;
        if inner.config.bound.is_some() {
            return self
                .put_slow(key, value, ttl, PutIf::Always)
                .unwrap_or(None);
        }
        let hash = inner.hasher.hash_one(&key);
        // Declared before the lock guard, so that if the user's `Eq` panics
        // in the probe, the key and value are dropped after the guard:
        // outside the lock.
        let mut kv = Some((key, value));
        let (outcome, kick, now) = {
            let key = &kv.as_ref().expect("just set").0;
            let (mut shard, now) = inner.write_key(hash, key, false);
            let deadline = now.saturating_add(nanos(ttl));
            let outcome = shard.put(hash, &mut kv, deadline, now);
            let timer = inner.timer_of(deadline, now);
            (outcome, inner.needs_kick(&shard, timer), now)
        };
        self.kick_if(kick);
        match outcome {
            PutOutcome::Inserted | PutOutcome::Refused => None,
            PutOutcome::Overwrote(old) => inner.leave(old, now),
        }
    }

    /// [`put`](Self::put) with the map's
    /// [`time_to_live`](Builder::time_to_live), or with no expiry if none
    /// was set (the deadline saturates: the entry stays until removed,
    /// replaced, or pushed out by a bound). Returns the previous live value.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// let map: ExpireMap<&str, u32> = ExpireMap::new();
    /// assert_eq!(map.insert("a", 1), None);
    /// assert_eq!(map.insert("a", 2), Some(1));
    /// let century = Duration::from_secs(100 * 365 * 86_400);
    /// assert!(map.ttl("a").unwrap() > century); // no expiry
    /// ```
    pub fn insert(&self, key: K, value: V) -> Option<V> {
        self.put(key, value, self.inner.config.time_to_live)
    }

    /// [`put`](Self::put) into a bounded map, and the conditional puts
    /// into any map: the weigher runs first (no lock held), and what the
    /// bound pushes out is published or dropped after the lock is released.
    /// Apart from the unbounded `put`, which pays nothing for it.
    #[inline(never)]
    fn put_slow(
        &self,
        key: K,
        value: V,
        ttl: Duration,
        cond: PutIf<'_, K, V>,
    ) -> Result<Option<V>, Stale> {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(&key);
        let weight = inner.weigher.as_ref().map_or(1, |w| w(&key, &value));
        // Declared before the lock guard, so that if the user's `Eq` panics
        // in the probe, the key and value, and anything the bound pushed out,
        // are dropped after the guard: outside the lock.
        let mut kv = Some((key, value));
        let mut out = shard::Out::new();
        let (outcome, kick, now) = {
            let key = &kv.as_ref().expect("just set").0;
            // A load's store and an update's commit are the writes their
            // key's own flight is waiting for.
            let own = matches!(cond, PutIf::Commit { .. } | PutIf::Untouched(_));
            let (mut shard, now) = inner.write_key(hash, key, own);
            match cond {
                PutIf::Always => {}
                PutIf::Absent => {
                    if let Some(live) = shard.live_value(hash, key, now) {
                        return Ok(Some(live.clone()));
                    }
                }
                PutIf::Live => {
                    if shard.live_value(hash, key, now).is_none() {
                        return Ok(None);
                    }
                }
                // A write during the load wins (see `load`).
                PutIf::Untouched(load) if load.touched() => return Ok(None),
                PutIf::Untouched(_) => {}
                // Kept a deadline that has passed since: nothing to store.
                PutIf::Commit {
                    keep: Some(_),
                    live_until: Some(d),
                } if now > d => return Err(Stale),
                PutIf::Commit { .. } => {}
            }
            let deadline = match cond {
                PutIf::Commit { keep: Some(d), .. } => d,
                _ => now.saturating_add(nanos(ttl)),
            };
            let outcome = shard.put_bounded(hash, &mut kv, deadline, now, weight, &mut out);
            let kick = matches!(outcome, PutOutcome::Refused)
                .not()
                .then(|| inner.needs_kick(&shard, inner.timer_of(deadline, now)))
                .flatten();
            (outcome, kick, now)
        };
        self.kick_if(kick);
        if !out.is_empty() {
            inner.leave_all(out, now);
        }
        Ok(match outcome {
            PutOutcome::Inserted | PutOutcome::Refused => None,
            PutOutcome::Overwrote(old) => inner.leave(old, now),
        })
    }

    /// The value for `key` if it is live (`now <= deadline`).
    #[inline]
    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.is_live(key, Read::Get, V::clone)
    }

    /// Counts a read for [`stats`](Self::stats), if asked to.
    #[inline]
    fn count(&self, hit: bool) {
        if let Some(r) = &self.inner.reads {
            r.count(hit);
        }
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

    /// Applies `f` to the value of the live entry for `key` and its time
    /// left, under the shard's read lock. Reads the exact time. An `access`
    /// counts for idle expiry.
    ///
    /// An entry that looks expired by its idle time alone is confirmed so
    /// under the write lock before the read answers `None` (see
    /// [`expire_idle`](Self::expire_idle)).
    #[inline(always)]
    fn read_live<Q, R, F>(&self, key: &Q, access: bool, f: F) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
        F: FnOnce(&V, Duration) -> R + Copy,
    {
        let mut idle_expired = false;
        let r = self.lookup(key, Time::now, |now, found| {
            Self::read_found(now, found, access, f, &mut idle_expired)
        });
        if r.is_none() && idle_expired {
            return self.read_live_again(key, access, f);
        }
        r
    }

    /// [`read_live`](Self::read_live) after its read found the entry
    /// expired by its idle time alone: confirms that, or reads again.
    #[cold]
    #[inline(never)]
    fn read_live_again<Q, R, F>(&self, key: &Q, access: bool, f: F) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
        F: FnOnce(&V, Duration) -> R + Copy,
    {
        loop {
            if self.expire_idle(key) {
                return None;
            }
            let mut idle_expired = false;
            let r = self.lookup(key, Time::now, |now, found| {
                Self::read_found(now, found, access, f, &mut idle_expired)
            });
            if !idle_expired {
                return r;
            }
        }
    }

    /// `read_live`'s work under the read lock: `f` of the entry `found` if
    /// it is live at `now` (recording an `access`), else `None`, with
    /// `idle_expired` set if it expired by its idle time alone.
    #[inline(always)]
    fn read_found<R>(
        now: u64,
        found: shard::Found<'_, V>,
        access: bool,
        f: impl FnOnce(&V, Duration) -> R,
        idle_expired: &mut bool,
    ) -> Option<R> {
        let live = if access {
            found.access(now)
        } else {
            now <= found.deadline
        };
        if !live {
            *idle_expired = found.idle_expired(now);
            return None;
        }
        let deadline = if access {
            found.deadline_after(now)
        } else {
            found.deadline
        };
        Some(f(found.value, Duration::from_nanos(deadline - now)))
    }

    /// A read found `key`'s entry expired by its idle time alone, under the
    /// read lock. Another read that read the clock before the idle deadline
    /// may still be recording an access that keeps the entry alive; the
    /// write lock waits for it. Under the write lock, then: an entry still
    /// expired is removed (its value leaves as `Expired`), so that no later
    /// read finds it alive again, and this returns `true`; an entry kept
    /// alive by such an access makes it return `false` (read again).
    #[cold]
    #[inline(never)]
    fn expire_idle<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let (removed, now) = {
            let (mut shard, now) = inner.write_now(hash);
            if shard.live_value(hash, key, now).is_some() {
                return false;
            }
            // Like an eviction, this only vacates a node: a load in flight
            // still stores its value.
            (shard.remove(hash, key, now), now)
        };
        if let Some(r) = removed {
            inner.leave(r, now);
        }
        true
    }

    /// Applies `f` to the value of the live entry for `key`, under the
    /// shard's read lock. Unlike [`read_live`](Self::read_live) it never
    /// needs the exact time, only whether the deadline has passed: a cheap
    /// upper bound on the clock usually settles that (see `Time::live`).
    /// A map with idle expiry or stats takes a separate path after one
    /// branch, so that other maps' reads are what they were without them
    /// (the shard's `get_plain`, not the larger `get_from`).
    #[inline(always)]
    fn is_live<Q, R>(&self, key: &Q, read: Read, f: impl FnOnce(&V) -> R + Copy) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.inner.read_extras {
            return self.read_extra(key, read, f);
        }
        self.read_plain(key, f)
    }

    /// [`is_live`](Self::is_live) in a map without idle expiry or stats.
    #[inline(always)]
    fn read_plain<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let (shard, home, bound) =
            inner.around(hash, |l| l.read(), |s| s.start(hash), Time::now_at_most);
        let (value, deadline) = shard.get_plain(home, hash, key)?;
        inner.clock.live(bound, deadline).then(|| f(value))
    }

    /// [`is_live`](Self::is_live) in a map with idle expiry (the exact
    /// time, recorded if the read is an access) or stats (the count).
    /// Inlined like the rest of the read: out of line, its call and saved
    /// registers cost an idle `get` ~20 instructions of ~200.
    #[inline(always)]
    fn read_extra<Q, R>(&self, key: &Q, read: Read, f: impl FnOnce(&V) -> R + Copy) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let r = if self.inner.config.idle.is_some() {
            self.read_live(key, read != Read::Peek, |value, _| f(value))
        } else {
            self.read_plain(key, f)
        };
        if read == Read::Get {
            self.count(r.is_some());
        }
        r
    }

    /// The shared shape of the reads: hash `key`, take the shard's read
    /// lock and read the time with `time` (in the order of
    /// [`Time::around`]), then, under the lock, pass that time and the
    /// entry found (live or not) to `f`.
    #[inline(always)]
    fn lookup<Q, T, R>(
        &self,
        key: &Q,
        time: impl FnOnce(&Time) -> T,
        f: impl FnOnce(T, shard::Found<'_, V>) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let (shard, home, t) = inner.around(hash, |l| l.read(), |s| s.start(hash), time);
        let found = shard.get_from(home, hash, key)?;
        f(t, found)
    }

    /// `true` if `key` has a live entry.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.is_live(key, Read::Peek, |_| ()).is_some()
    }

    /// Removes `key`. Returns its value only if it was live; a value already
    /// past its deadline leaves by the `Expired` door (published as
    /// [`Cause::Expired`]) and `None` is returned. Racing the eviction of the
    /// same entry, exactly one of the two gets the value.
    pub fn remove<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let (removed, now) = {
            let (mut shard, now) = inner.write_key(hash, key, false);
            (shard.remove(hash, key, now), now)
        };
        inner.leave(removed?, now)
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
        let (done, kick) = {
            let (mut shard, now) = inner.write_key(hash, key, false);
            let deadline = now.saturating_add(nanos(ttl));
            let timer = shard.touch(hash, key, deadline, now, cond);
            (
                timer.is_some(),
                timer.and_then(|t| inner.needs_kick(&shard, t)),
            )
        };
        self.kick_if(kick);
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
            return self.is_live(&key, Read::Peek, V::clone);
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

    /// The live value for `key`, or the value `init` makes for it, stored
    /// for `ttl`. At most one caller per key runs its `init` at a time, with
    /// no lock held; other callers of the same key park until it is done
    /// and return (a clone of) its value. A hit costs what `get` costs.
    ///
    /// If `init` panics, the panic reaches its caller, nothing is stored,
    /// and one of the waiting callers runs its own `init`. The value is
    /// stored only if no `put`, `put_if_absent`, `remove` or `clear` touched
    /// the key while `init` ran; otherwise the newer write stands and the
    /// value is only returned. A zero `ttl` returns the value without
    /// storing it. In a bounded map the value may be refused like any
    /// put's.
    ///
    /// `init` may use the map for other keys, those of the same hash
    /// included (loads are told apart by `Eq`). Asking for its own key
    /// (through this call) would wait for itself, and so would a cycle of
    /// loads each waiting for another's key (thread 1's `init` for key 1
    /// loading key 2 while thread 2's `init` for key 2 loads key 1): the
    /// caller that would close such a cycle panics instead, naming the
    /// threads, and the others go on.
    ///
    /// On an async runtime, this call parks the calling thread while
    /// another caller loads the key, and `init` runs on it: call it where
    /// blocking is allowed (`spawn_blocking`), not on a runtime worker.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::time::Duration;
    ///
    /// let map: ExpireMap<&str, u32> = ExpireMap::new();
    /// let calls = AtomicU32::new(0);
    /// let load = || {
    ///     calls.fetch_add(1, Ordering::SeqCst);
    ///     42
    /// };
    /// assert_eq!(map.get_or_insert_with("a", Duration::from_secs(60), load), 42);
    /// assert_eq!(map.get_or_insert_with("a", Duration::from_secs(60), load), 42);
    /// assert_eq!(calls.load(Ordering::SeqCst), 1); // the second was a hit
    /// ```
    pub fn get_or_insert_with(&self, key: K, ttl: Duration, init: impl FnOnce() -> V) -> V {
        match self.try_get_or_insert_with(key, ttl, || Ok::<V, std::convert::Infallible>(init())) {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }

    /// Reads the live entry for `key` (its value and time left, or `None`),
    /// lets `f` decide what to do with it, and does that atomically, as
    /// Java's `ConcurrentHashMap::compute` or moka's `and_compute_with` do:
    /// `f` runs **exactly once** per call, with no lock held (it may use the
    /// map for other keys), and no other write of `key` lands between the
    /// read and the commit. Returns the value stored (in a bounded map the
    /// bound may refuse it, as any put's), the one kept, or `None`.
    ///
    /// How: the call registers an update of `key` in its shard (as a load
    /// registers, see [`get_or_insert_with`](Self::get_or_insert_with)).
    /// Updates of one key run one at a time, in turn, and every write of
    /// `key` (`put`, `remove`, `put_if_absent`, `replace`, `touch`,
    /// `expire`, `retain`'s removal) waits for the update in flight to
    /// commit before it writes. What does not wait: eviction (the entry may
    /// expire while `f` runs: [`Update::Set`] and [`Update::Remove`] still
    /// apply, and [`Update::SetKeepTtl`], whose deadline has then passed,
    /// stores nothing and returns `None`), the capacity bound, and
    /// [`clear`](Self::clear).
    ///
    /// # Panics
    ///
    /// If `f` panics, the panic reaches the caller and nothing is stored.
    /// If `f` writes `key` itself, or waits for a load or update that waits
    /// for this one, that would wait for ever: it panics instead.
    ///
    /// A counter that keeps its window, for example (the fixed-window rate
    /// limiter in `examples/rate_limiter.rs`):
    ///
    /// ```
    /// use expiremap::{ExpireMap, Update};
    /// use std::time::Duration;
    ///
    /// let hits: ExpireMap<&str, u32> = ExpireMap::new();
    /// let window = Duration::from_secs(1);
    /// let count = |key| {
    ///     hits.update(key, |seen| match seen {
    ///         None => Update::Set(1, window),
    ///         Some((n, _left)) => Update::SetKeepTtl(n + 1),
    ///     })
    /// };
    /// assert_eq!(count("client"), Some(1));
    /// assert_eq!(count("client"), Some(2));
    /// assert!(hits.ttl("client").unwrap() <= window); // the window was kept
    /// ```
    pub fn update<F>(&self, key: K, f: F) -> Option<V>
    where
        F: FnOnce(Option<(&V, Duration)>) -> Update<V>,
    {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(&key);
        let lock = inner.shard(hash);
        // The flight's own copy of the key, made before any lock is taken.
        let mut spare = Some(key.clone());
        let (flight, seen) = loop {
            let mut expired = None;
            let found = {
                let (mut shard, now) = inner.write_now(hash);
                if let Some(other) = load::find(&shard.flights, hash, &key) {
                    Err(other.clone())
                } else {
                    let found = shard.get_from(shard.start(hash), hash, &key);
                    let idle_expired = found.as_ref().is_some_and(|f| f.idle_expired(now));
                    let seen = found
                        .filter(|f| now <= f.deadline)
                        .map(|f| (f.value.clone(), f.deadline, f.deadline - now, f.write));
                    if idle_expired {
                        // Found idle-expired: it leaves now, as a read's
                        // find does (see `expire_idle`).
                        expired = shard.remove(hash, &key, now).map(|r| (r, now));
                    }
                    let key = spare.take().expect("registered once");
                    let flight = Arc::new(load::Flight::new(key, hash, load::Kind::Update, false));
                    shard.flights.push(flight.clone());
                    Ok((flight, seen))
                }
            };
            if let Some((r, now)) = expired {
                inner.leave(r, now);
            }
            match found {
                Ok(registered) => break registered,
                Err(other) => {
                    other.wait();
                }
            }
        };
        drop(spare);
        let guard = load::FlightGuard::new(flight, lock);
        let shown = seen
            .as_ref()
            .map(|(v, _, left, _)| (v, Duration::from_nanos(*left)));
        let live_until = seen.as_ref().map(|s| s.1);
        let r = match f(shown) {
            Update::Keep => seen.map(|s| s.0),
            Update::Set(_, ttl) if ttl.is_zero() => seen.map(|s| s.0),
            Update::SetKeepTtl(_) if seen.is_none() => None,
            Update::Set(v, ttl) => {
                let ret = v.clone();
                let cond = PutIf::Commit {
                    keep: None,
                    live_until,
                };
                self.put_slow(key, v, ttl, cond).ok().map(|_| ret)
            }
            Update::SetKeepTtl(v) => {
                let ret = v.clone();
                let cond = PutIf::Commit {
                    keep: seen.as_ref().map(|s| s.3),
                    live_until,
                };
                self.put_slow(key, v, Duration::MAX, cond).ok().map(|_| ret)
            }
            Update::Remove => {
                let (removed, now) = {
                    let (mut shard, now) = inner.write_now(hash);
                    (shard.remove(hash, &key, now), now)
                };
                if let Some(r) = removed {
                    inner.leave(r, now);
                }
                None
            }
        };
        drop(guard);
        r
    }

    /// [`get_or_insert_with`](Self::get_or_insert_with) with an `init` that
    /// may fail: nothing is stored, and its error is returned to its caller
    /// and to every caller waiting for that load whose call returns the
    /// same error type (a clone each, so one failing load is one `init`
    /// however many callers wait, as moka shares it as `Arc<E>`). A waiter
    /// whose call returns another error type, or none
    /// (`get_or_insert_with`), runs its own `init`. Callers that come after
    /// the failure load again.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// let map: ExpireMap<u32, String> = ExpireMap::new();
    /// let minute = Duration::from_secs(60);
    /// let r = map.try_get_or_insert_with(1, minute, || Err::<String, _>("backend down"));
    /// assert_eq!(r, Err("backend down"));
    /// assert_eq!(map.get(&1), None);
    /// let r = map.try_get_or_insert_with(1, minute, || Ok::<_, &str>("one".to_string()));
    /// assert_eq!(r.as_deref(), Ok("one"));
    /// ```
    pub fn try_get_or_insert_with<E>(
        &self,
        key: K,
        ttl: Duration,
        init: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E>
    where
        E: Clone + Send + Sync + 'static,
    {
        // A hit or a miss, counted once.
        if let Some(v) = self.get(&key) {
            return Ok(v);
        }
        self.load(key, ttl, init)
    }

    /// [`get_or_insert_with`](Self::get_or_insert_with) by reference: the
    /// owned key is made (`ToOwned`) only on a miss, so a hit costs what
    /// [`get`](Self::get) costs, with no allocation for a `String` key
    /// (moka's `get_with_by_ref`).
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// let map: ExpireMap<String, usize> = ExpireMap::new();
    /// let minute = Duration::from_secs(60);
    /// let len = map.get_or_insert_with_by_ref("four", minute, || 4);
    /// assert_eq!(len, 4);
    /// // A hit: neither `init` nor an owned `String`.
    /// assert_eq!(map.get_or_insert_with_by_ref("four", minute, || unreachable!()), 4);
    /// ```
    pub fn get_or_insert_with_by_ref<Q>(
        &self,
        key: &Q,
        ttl: Duration,
        init: impl FnOnce() -> V,
    ) -> V
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let r = self
            .try_get_or_insert_with_by_ref(key, ttl, || Ok::<V, std::convert::Infallible>(init()));
        match r {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }

    /// [`try_get_or_insert_with`](Self::try_get_or_insert_with) by
    /// reference: the owned key is made only on a miss.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// let map: ExpireMap<String, u32> = ExpireMap::new();
    /// let minute = Duration::from_secs(60);
    /// let r = map.try_get_or_insert_with_by_ref("a", minute, || Err::<u32, _>("down"));
    /// assert_eq!(r, Err("down"));
    /// assert_eq!(map.try_get_or_insert_with_by_ref("a", minute, || Ok::<_, &str>(1)), Ok(1));
    /// ```
    pub fn try_get_or_insert_with_by_ref<Q, E>(
        &self,
        key: &Q,
        ttl: Duration,
        init: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        E: Clone + Send + Sync + 'static,
    {
        // A hit or a miss, counted once.
        if let Some(v) = self.get(key) {
            return Ok(v);
        }
        self.load(key.to_owned(), ttl, init)
    }

    /// [`update`](Self::update) by reference. The owned key is made
    /// (`ToOwned`) before the update registers, which needs it.
    ///
    /// ```
    /// use expiremap::{ExpireMap, Update};
    /// use std::time::Duration;
    ///
    /// let map: ExpireMap<String, u32> = ExpireMap::new();
    /// let add = |seen: Option<(&u32, Duration)>| match seen {
    ///     None => Update::Set(1, Duration::from_secs(60)),
    ///     Some((n, _)) => Update::SetKeepTtl(n + 1),
    /// };
    /// assert_eq!(map.update_by_ref("hits", add), Some(1));
    /// assert_eq!(map.update_by_ref("hits", add), Some(2));
    /// ```
    pub fn update_by_ref<Q, F>(&self, key: &Q, f: F) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(Option<(&V, Duration)>) -> Update<V>,
    {
        self.update(key.to_owned(), f)
    }

    /// [`try_get_or_insert_with`](Self::try_get_or_insert_with) after its
    /// first look missed: out of line, so that a hit is a `get`.
    #[inline(never)]
    fn load<E>(&self, key: K, ttl: Duration, init: impl FnOnce() -> Result<V, E>) -> Result<V, E>
    where
        E: Clone + Send + Sync + 'static,
    {
        let hash = self.inner.hasher.hash_one(&key);
        // The flight's own copy of the key, made before any lock is taken
        // (and dropped after it, if not needed).
        let mut spare = Some(key.clone());
        let flight = loop {
            match self.begin_load(hash, &key, &mut spare, false) {
                Begun::Hit(v) => return Ok(v),
                Begun::Run(flight) => break flight,
                Begun::Wait(other) => {
                    if let Some(r) = Self::shared(other.wait()) {
                        return r;
                    }
                }
            }
        };
        drop(spare);
        let mut guard = load::FlightGuard::new(flight, self.inner.shard(hash));
        let r = init();
        self.end_load(key, ttl, r, &mut guard)
    }

    /// The async form of [`get_or_insert_with`](Self::get_or_insert_with):
    /// the live value for `key`, or the value the future `init` makes,
    /// stored for `ttl`. A hit returns without polling `init` (and without
    /// an await point that waits). No thread ever parks on behalf of an
    /// async caller: a caller that finds the key being loaded (by an async
    /// or a blocking caller: the two share one flight per key) awaits a
    /// wake-up from the load, so a hundred tasks of one key complete on a
    /// current-thread runtime. No runtime is needed: it runs on any
    /// executor.
    ///
    /// If the future is dropped while it loads (a timeout, a client gone),
    /// the load is handed over: a waiting or later caller loads, and
    /// nothing of the cancelled `init` is stored. A write of the key during
    /// the load wins, a zero `ttl` returns the value without storing it,
    /// and in a bounded map the value may be refused, as for the blocking
    /// form. If `init` panics, the panic reaches its caller and the waiters
    /// go on (one of them loads).
    ///
    /// An `init` that awaits a load of its own key waits for itself (the
    /// future never completes): unlike the blocking form, an async caller
    /// cannot be told from its thread.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     use std::task::{Context, Poll, Waker};
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = Context::from_waker(Waker::noop());
    /// #     loop { if let Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// let map: ExpireMap<u32, String> = ExpireMap::new();
    /// let minute = Duration::from_secs(60);
    /// // On any executor (tokio, async-std, a hand-written one):
    /// let v = block_on(map.get_or_insert_with_async(1, minute, async { "one".to_string() }));
    /// assert_eq!(v, "one");
    /// let again = block_on(map.get_or_insert_with_async(1, minute, async { unreachable!() }));
    /// assert_eq!(again, "one"); // a hit: `init` never polled
    /// ```
    pub async fn get_or_insert_with_async<F>(&self, key: K, ttl: Duration, init: F) -> V
    where
        F: Future<Output = V>,
    {
        let init = async { Ok::<V, std::convert::Infallible>(init.await) };
        match self.try_get_or_insert_with_async(key, ttl, init).await {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }

    /// The async form of
    /// [`try_get_or_insert_with`](Self::try_get_or_insert_with): as
    /// [`get_or_insert_with_async`](Self::get_or_insert_with_async), with a
    /// fallible `init` whose error is shared with the callers waiting for
    /// it (a clone each), blocking or async, whose call returns the same
    /// error type.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     use std::task::{Context, Poll, Waker};
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = Context::from_waker(Waker::noop());
    /// #     loop { if let Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// let map: ExpireMap<u32, u32> = ExpireMap::new();
    /// let minute = Duration::from_secs(60);
    /// let r = block_on(map.try_get_or_insert_with_async(1, minute, async { Err("down") }));
    /// assert_eq!(r, Err("down"));
    /// assert_eq!(map.get(&1), None);
    /// let r = block_on(map.try_get_or_insert_with_async(1, minute, async { Ok::<_, &str>(1) }));
    /// assert_eq!(r, Ok(1));
    /// ```
    pub async fn try_get_or_insert_with_async<F, E>(
        &self,
        key: K,
        ttl: Duration,
        init: F,
    ) -> Result<V, E>
    where
        F: Future<Output = Result<V, E>>,
        E: Clone + Send + Sync + 'static,
    {
        // A hit or a miss, counted once.
        if let Some(v) = self.get(&key) {
            return Ok(v);
        }
        let hash = self.inner.hasher.hash_one(&key);
        let mut spare = Some(key.clone());
        let flight = loop {
            match self.begin_load(hash, &key, &mut spare, true) {
                Begun::Hit(v) => return Ok(v),
                Begun::Run(flight) => break flight,
                Begun::Wait(other) => {
                    if let Some(r) = Self::shared(other.wait_async().await) {
                        return r;
                    }
                }
            }
        };
        drop(spare);
        // Dropped with the future if it is cancelled: the load ends with no
        // value, and a waiter takes it over.
        let mut guard = load::FlightGuard::new(flight, self.inner.shard(hash));
        let r = init.await;
        self.end_load(key, ttl, r, &mut guard)
    }

    /// A loading call's look under `hash`'s write lock after a miss: the
    /// live value (a put or a load landed since the miss), the key's flight
    /// to wait for, or a new load of it, registered (with `spare`'s key)
    /// for the caller to run; `task` if the caller is async.
    fn begin_load(&self, hash: u64, key: &K, spare: &mut Option<K>, task: bool) -> Begun<K, V> {
        let (shard, now) = self.inner.write_now(hash);
        if let Some(f) = shard.get_from(shard.start(hash), hash, key) {
            if f.access(now) {
                return Begun::Hit(f.value.clone());
            }
        }
        let mut shard = shard;
        match load::find(&shard.flights, hash, key) {
            Some(other) => Begun::Wait(other.clone()),
            None => {
                let key = spare.take().expect("registered once");
                let flight = Arc::new(load::Flight::new(key, hash, load::Kind::Load, task));
                shard.flights.push(flight.clone());
                Begun::Run(flight)
            }
        }
    }

    /// What a waiter takes from a flight that ended: a load's value, or its
    /// error if of the waiter's type; `None`: look again (and load).
    fn shared<E: Clone + 'static>(ended: load::Ended<V>) -> Option<Result<V, E>> {
        match ended {
            load::Ended::Value(v) => Some(Ok(v)),
            load::Ended::Failed(e) => e.downcast_ref::<E>().map(|e| Err(e.clone())),
            load::Ended::Over => None,
        }
    }

    /// The loader's side once `init` returned `r`: stores a value (unless a
    /// write of the key came first, or `ttl` is zero) and hands it, or the
    /// error, to the waiters.
    fn end_load<E>(
        &self,
        key: K,
        ttl: Duration,
        r: Result<V, E>,
        guard: &mut load::FlightGuard<'_, K, V>,
    ) -> Result<V, E>
    where
        E: Clone + Send + Sync + 'static,
    {
        match r {
            Ok(v) => {
                if !ttl.is_zero() {
                    let _ = self.put_slow(key, v.clone(), ttl, PutIf::Untouched(&guard.flight));
                }
                guard.done(v.clone());
                Ok(v)
            }
            Err(e) => {
                guard.failed(crate::sync::unmodeled::Arc::new(e.clone()));
                Err(e)
            }
        }
    }

    /// Wakes the eviction thread (if any) to plan again. After unlocking.
    #[inline]
    fn kick_if(&self, kick: Option<u64>) {
        if let (Some(at), Some(_)) = (kick, &self.evictor) {
            self.inner.signal.kick(at);
        }
    }

    /// Entries held, including those past their deadline but not yet evicted.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| s.read().len()).sum()
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
    pub fn clear(&self) {
        let inner = &*self.inner;
        let mut panics = Panics::new();
        for shard in inner.shards.iter() {
            let (taken, now) = inner.take_all(shard);
            inner.drain_shard(taken, now, Cause::Removed, &mut panics);
        }
        panics.resume();
    }

    /// Runs eviction now on the calling thread: evicts every entry that is
    /// due when it starts (up to one precision after its deadline), in
    /// bounded batches. Returns the number evicted.
    pub fn evict_expired(&self) -> usize {
        self.inner.evict_all()
    }

    /// How long until [`evict_expired`](Self::evict_expired) has work:
    /// advancing the clock by it and then calling `evict_expired` always
    /// makes progress, so a loop of the two ends. `None` if the map is empty.
    /// An entry whose deadline saturated (a `ttl` that reaches past the
    /// clock's range) never expires, but the timer index may still report
    /// work for it near the end of the clock's range (where it moves the
    /// entry within the index and evicts nothing): then this is centuries
    /// away, and, once the clock is there, a few short waits before `None`.
    /// A wake-up hint for maps driven without the background thread.
    ///
    /// ```
    /// use expiremap::{ExpireMap, ManualClock};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let map = ExpireMap::<u32, u32>::builder()
    ///     .clock(clock.clone())
    ///     .background_eviction(false)
    ///     .build();
    /// map.put(1, 1, Duration::from_millis(5));
    /// map.put(2, 2, Duration::MAX); // saturates: never expires
    /// while let Some(d) = map.next_expiry() {
    ///     clock.advance(d);
    ///     map.evict_expired();
    /// }
    /// assert_eq!((map.len(), map.get(&1), map.get(&2)), (1, None, Some(2)));
    /// ```
    pub fn next_expiry(&self) -> Option<Duration> {
        let at = self.inner.next_wakeup()?;
        Some(Duration::from_nanos(
            at.saturating_sub(self.inner.clock.now()),
        ))
    }

    /// A new reader of this map's events. It receives every event published
    /// after this call. Fails if `max_subscribers` readers already exist.
    pub fn subscribe(&self) -> Result<Subscriber<K, V>, SubscribeError> {
        let events = &self.inner.events;
        if let Some(s) = sync::read_recursive(&events.sender).as_ref() {
            return s.subscribe().map(Subscriber::new);
        }
        let mut slot = events.sender.write();
        let sender = match slot.as_ref() {
            Some(s) => s,
            None => {
                let cfg = &self.inner.config;
                let s = broadcast::Sender::new(cfg.event_capacity, cfg.max_subscribers)
                    .expect("capacity and max_subscribers were validated by the builder");
                events.created.store(true, Ordering::Release);
                slot.insert(s)
            }
        };
        sender.subscribe().map(Subscriber::new)
    }

    /// Counters of reads (with [`Builder::record_stats`]) and of eviction
    /// work so far.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// let map = ExpireMap::<u32, u32>::builder().record_stats(true).build();
    /// map.put(1, 1, Duration::from_secs(60));
    /// map.get(&1);
    /// map.get(&2);
    /// map.get_or_insert_with(3, Duration::from_secs(60), || 3); // a miss, loaded
    /// map.get_or_insert_with(3, Duration::from_secs(60), || 3); // a hit
    /// let s = map.stats();
    /// assert_eq!((s.hits, s.misses), (2, 2));
    /// ```
    pub fn stats(&self) -> Stats {
        let s = &self.inner.signal;
        let (hits, misses) = self.inner.reads.as_ref().map_or((0, 0), |r| r.totals());
        Stats {
            hits,
            misses,
            size_evicted: self.inner.size_evicted.load(Ordering::Relaxed),
            max_lateness: Duration::from_nanos(self.inner.max_lateness.load(Ordering::Relaxed)),
            evicted: self.inner.evicted.load(Ordering::Relaxed),
            passes: s.passes.load(Ordering::Relaxed),
            wakeups: s.wakeups.load(Ordering::Relaxed),
        }
    }
}

impl<K, V, S> Inner<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    #[inline]
    fn shard(&self, hash: u64) -> &RwLock<Shard<K, V>> {
        // Bits 40.. pick the shard; the shard's table works from the low 32
        // bits, so the two choices are independent.
        let i = (hash >> 40) as usize & (self.shards.len() - 1);
        &self.shards[i]
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
        read: impl FnOnce(&Time) -> T,
    ) -> (G, W, T)
    where
        G: std::ops::Deref<Target = Shard<K, V>>,
    {
        let shard = self.shard(hash);
        self.clock.around(|| lock(shard), |guard| warm(guard), read)
    }

    /// The write lock of `hash`'s shard and the exact time, for the
    /// operations that change a shard.
    #[inline(always)]
    fn write_now(&self, hash: u64) -> (impl std::ops::DerefMut<Target = Shard<K, V>> + '_, u64) {
        // The home slot is only a hint here: the write may grow the table.
        let (guard, _, now) = self.around(hash, |l| l.write(), |s| s.start(hash), Time::now);
        (guard, now)
    }

    /// The write lock of `key`'s shard (hash `hash`) and the exact time,
    /// for a write of `key`: a load of `key` in flight loses to the write
    /// (it is marked), and an update of `key` in flight is waited for
    /// ([`Flight::wait`](load::Flight::wait)) with the lock released, then
    /// the lock is taken again. One predictable branch when nothing is in
    /// flight in the shard. `own`: the write is the one the key's own flight
    /// waits to make (a load's store, an update's commit): no check.
    #[inline(always)]
    fn write_key<Q>(
        &self,
        hash: u64,
        key: &Q,
        own: bool,
    ) -> (impl std::ops::DerefMut<Target = Shard<K, V>> + '_, u64)
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        loop {
            let (shard, now) = self.write_now(hash);
            if own || shard.flights.is_empty() {
                return (shard, now);
            }
            match load::before_write(&shard.flights, hash, key) {
                None => return (shard, now),
                Some(update) => {
                    drop(shard);
                    update.wait();
                }
            }
        }
    }

    /// Where the timer of an entry written at `now` with write deadline
    /// `deadline` goes: with idle expiry, no later than `now + idle`.
    #[inline]
    fn timer_of(&self, deadline: u64, now: u64) -> u64 {
        match self.config.idle {
            Some(idle) => deadline.min(now.saturating_add(idle)),
            None => deadline,
        }
    }

    /// Called under the shard's write lock after a deadline was set: does the
    /// eviction thread need a kick, and for when? (See the protocol in
    /// `evictor`.)
    #[inline]
    fn needs_kick(&self, shard: &Shard<K, V>, deadline: u64) -> Option<u64> {
        shard
            .evictable_at(deadline)
            .filter(|&at| self.signal.needs_kick(at))
    }

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
    fn leave(&self, old: Removed<K, V>, now: u64) -> Option<V> {
        let mut panics = Panics::new();
        let r = match old.door {
            door @ (Door::Expired | Door::Size) => {
                if door == Door::Size {
                    self.size_evicted.fetch_add(1, Ordering::Relaxed);
                }
                match self.events.live_sender() {
                    Some(s) => {
                        let cause = if door == Door::Size {
                            Cause::Size
                        } else {
                            Cause::Expired
                        };
                        let event = Event::new(old.key, old.value, cause, old.deadline, now);
                        panics.run(move || s.send(event));
                    }
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

    /// [`leave`](Self::leave) for each entry a put pushed out. Cold: only
    /// a bounded map's full shards push anything out.
    #[cold]
    #[inline(never)]
    fn leave_all(&self, out: shard::Out<K, V>, now: u64) {
        for r in out {
            self.leave(r, now);
        }
    }

    /// Publishes (or drops) every entry of a shard taken out of the map, in
    /// batches, outside every lock. Entries past their deadline leave as
    /// `Expired`; live ones as `live` (`Removed` for `clear`, `Shutdown` at
    /// drop), published only if that cause is enabled. A panicking `Drop`
    /// (of a value, or of an old event a publication displaces) is kept in
    /// `panics` and the drain goes on: every entry leaves by its door.
    fn drain_shard(&self, shard: Shard<K, V>, now: u64, live: Cause, panics: &mut Panics) {
        let sender = self.events.live_sender();
        let publish_live = match live {
            Cause::Shutdown => self.config.notify_on_shutdown,
            _ => self.config.publish_removals,
        };
        let mut batch = Vec::with_capacity(if sender.is_some() { EVICT_BATCH } else { 0 });
        shard.drain(|e| {
            let expired = now > e.deadline;
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
    }

    /// Runs once, when the map is dropped (after the thread has stopped, or
    /// on the thread itself): publishes what is still held if asked and
    /// someone listens, then closes the ring so subscribers drain and see
    /// `Closed`. A panicking `Drop` on the way stops nothing; the first is
    /// resumed at the end (dropped instead on a thread already unwinding).
    fn shutdown(&self) {
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
    fn take_all(&self, shard: &RwLock<Shard<K, V>>) -> (Shard<K, V>, u64) {
        let (mut guard, (), now) = self.clock.around(|| shard.write(), |_| (), Time::now);
        // A write of every key: loads in flight lose to it.
        guard.flights.iter().for_each(|f| f.touch());
        (guard.take_all(now), now)
    }
}

impl<K, V, S> Drop for ExpireMap<K, V, S> {
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
            .field("background_eviction", &self.evictor.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(expiremap_loom)))]
mod tests;

//! [`Builder`] and its validated [`Config`].

use super::load::refresh::Spawner;
use super::{ExpireMap, Expiry, Time};
use crate::clock::{Clock, SystemClock};
pub use crate::error::BuildError;
pub use crate::limits::{
    MAX_EVENT_CAPACITY, MAX_PERIOD, MAX_SHARDS, MAX_SUBSCRIBERS, MIN_EVICTION_INTERVAL,
    MIN_PRECISION,
};
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// Default pause between eviction passes.
pub const DEFAULT_EVICTION_INTERVAL: Duration = Duration::from_millis(4);
/// Default timer precision (how late eviction may be beyond the interval).
pub const DEFAULT_PRECISION: Duration = Duration::from_millis(1);
/// Default event ring capacity (allocated on the first `subscribe`).
pub const DEFAULT_EVENT_CAPACITY: usize = 1024;
/// Default limit on simultaneous subscribers.
pub const DEFAULT_MAX_SUBSCRIBERS: usize = 64;

/// Validated settings, shared by the map and its eviction thread.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) shards: usize,
    pub(crate) interval: u64,
    pub(crate) precision: u64,
    pub(crate) event_capacity: usize,
    pub(crate) max_subscribers: usize,
    pub(crate) publish_removals: bool,
    pub(crate) notify_on_shutdown: bool,
    pub(crate) background_eviction: bool,
    /// The capacity bound (entries, or weight units), if any.
    pub(crate) bound: Option<u64>,
    /// The time to idle in ns, if any.
    pub(crate) idle: Option<u64>,
    /// Count hits and misses.
    pub(crate) record_stats: bool,
    /// The TTL of [`ExpireMap::insert`] (`Duration::MAX`: no expiry).
    pub(crate) time_to_live: Duration,
    /// Refresh ahead: a loading call reloads a value older than this (ns).
    pub(crate) refresh: Option<u64>,
    /// The `cache` label of the published metrics, if any.
    #[cfg(feature = "metrics")]
    pub(crate) metrics: Option<metrics::SharedString>,
}

/// Weighs an entry for [`Builder::max_weight`]; runs outside every lock.
pub(crate) type Weigher<K, V> = Arc<dyn Fn(&K, &V) -> u64 + Send + Sync>;

/// Configures an [`ExpireMap`]. From [`ExpireMap::builder`].
///
/// ```
/// use expiremap::{ExpireMap, ManualClock};
/// use std::time::Duration;
///
/// let map = ExpireMap::<u64, u64>::builder()
///     .clock(ManualClock::new())
///     .shards(8)
///     .eviction_interval(Duration::from_millis(4))
///     .precision(Duration::from_millis(1))
///     .event_capacity(1 << 16)
///     .max_subscribers(64)
///     .publish_removals(true)
///     .notify_on_shutdown(true)
///     .background_eviction(true)
///     .try_build()?;
/// # drop(map);
/// # Ok::<(), expiremap::BuildError>(())
/// ```
pub struct Builder<K, V, S = ahash::RandomState> {
    shards: Option<usize>,
    interval: Duration,
    precision: Duration,
    clock: Option<Time>,
    hasher: S,
    event_capacity: usize,
    max_subscribers: usize,
    publish_removals: bool,
    notify_on_shutdown: bool,
    background_eviction: bool,
    max_entries: Option<u64>,
    max_weight: Option<u64>,
    idle: Option<Duration>,
    time_to_live: Option<Duration>,
    record_stats: bool,
    weigher: Option<Weigher<K, V>>,
    expiry: Option<Arc<dyn Expiry<K, V>>>,
    refresh_after: Option<Duration>,
    spawner: Option<Spawner>,
    #[cfg(feature = "metrics")]
    metrics: Option<metrics::SharedString>,
    _marker: PhantomData<fn(K, V)>,
}

impl<K, V> Builder<K, V> {
    pub(crate) fn new() -> Self {
        Self {
            shards: None,
            interval: DEFAULT_EVICTION_INTERVAL,
            precision: DEFAULT_PRECISION,
            clock: None,
            hasher: ahash::RandomState::new(),
            event_capacity: DEFAULT_EVENT_CAPACITY,
            max_subscribers: DEFAULT_MAX_SUBSCRIBERS,
            publish_removals: false,
            notify_on_shutdown: true,
            background_eviction: true,
            max_entries: None,
            max_weight: None,
            idle: None,
            time_to_live: None,
            record_stats: false,
            weigher: None,
            expiry: None,
            refresh_after: None,
            spawner: None,
            #[cfg(feature = "metrics")]
            metrics: None,
            _marker: PhantomData,
        }
    }
}

/// The default shard count on `cores` cores: 64 per core up to 256, at
/// least 4 per core, a power of two. On 16 cores, puts of expiring keys at
/// 16 threads ran 6.5-6.7 Mops/s with 64 shards (four per core) and
/// 13.6-13.7 with 256; `get` 37 against 54 (BENCHMARKS.md, "16 cores").
/// On 2 cores, 2 threads, 2.34-2.85 with 128 shards and 1.94-2.03 with 32.
pub(crate) fn default_shards(cores: usize) -> usize {
    let cores = cores.max(1);
    let many = cores.saturating_mul(64).min(256);
    many.max(cores.saturating_mul(4))
        .min(MAX_SHARDS)
        .next_power_of_two()
}

impl<K, V, S> Builder<K, V, S> {
    /// Number of shards (a power of two). Default: 64 per available core
    /// up to 256 shards, and never fewer than four per core, rounded up to
    /// a power of two (128 on 2 cores, 256 on 4 to 64, 512 on 128).
    /// Writes of expiring keys, and reads of hot keys on many cores, wait
    /// less on shard locks with more shards (BENCHMARKS.md, "16 cores").
    /// The price is memory in small maps: a shard with nothing in it costs
    /// about 500 bytes, and its first entries add their timer lists (~1 KB
    /// for TTLs of an hour) and a first slab chunk and table; a map of
    /// 1,000 entries in 128 shards allocates ~280 KB. Set fewer shards for
    /// many small maps. A bound of `n` entries caps the count at `n`.
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = Some(n);
        self
    }

    /// Least time between two eviction passes (default 4 ms).
    pub fn eviction_interval(mut self, d: Duration) -> Self {
        self.interval = d;
        self
    }

    /// Timer granularity (default 1 ms): the eviction thread evicts an entry
    /// at most one precision after its deadline (plus the wait for the next
    /// pass). Internally the timer ticks in the largest power of two
    /// nanoseconds not above this (524,288 ns for 1 ms), so eviction is never
    /// later than asked.
    pub fn precision(mut self, d: Duration) -> Self {
        self.precision = d;
        self
    }

    /// The clock (default [`SystemClock`]); use a
    /// [`ManualClock`](crate::ManualClock) for deterministic tests.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Time::new(clock));
        self
    }

    /// The hasher (default `ahash::RandomState`).
    pub fn hasher<S2>(self, hasher: S2) -> Builder<K, V, S2> {
        Builder {
            shards: self.shards,
            interval: self.interval,
            precision: self.precision,
            clock: self.clock,
            hasher,
            event_capacity: self.event_capacity,
            max_subscribers: self.max_subscribers,
            publish_removals: self.publish_removals,
            notify_on_shutdown: self.notify_on_shutdown,
            background_eviction: self.background_eviction,
            max_entries: self.max_entries,
            max_weight: self.max_weight,
            idle: self.idle,
            time_to_live: self.time_to_live,
            record_stats: self.record_stats,
            weigher: self.weigher,
            expiry: self.expiry,
            refresh_after: self.refresh_after,
            spawner: self.spawner,
            #[cfg(feature = "metrics")]
            metrics: self.metrics,
            _marker: PhantomData,
        }
    }

    /// Capacity of the event ring (a power of two, default 1024). A
    /// subscriber more than this many events behind loses the oldest ones and
    /// is told how many.
    pub fn event_capacity(mut self, n: usize) -> Self {
        self.event_capacity = n;
        self
    }

    /// Most subscribers at once (default 64).
    pub fn max_subscribers(mut self, n: usize) -> Self {
        self.max_subscribers = n;
        self
    }

    /// Also publish `Removed` and `Replaced` events (default `false`).
    pub fn publish_removals(mut self, on: bool) -> Self {
        self.publish_removals = on;
        self
    }

    /// Publish every entry still held at drop as `Shutdown` (or `Expired`,
    /// if past its deadline) when subscribers exist (default `true`).
    pub fn notify_on_shutdown(mut self, on: bool) -> Self {
        self.notify_on_shutdown = on;
        self
    }

    /// Run a background eviction thread (default `true`). Without it, call
    /// [`ExpireMap::evict_expired`] yourself, guided by
    /// [`ExpireMap::next_expiry`]. Reads are exact either way.
    pub fn background_eviction(mut self, on: bool) -> Self {
        self.background_eviction = on;
        self
    }

    /// Bounds the map to at most `n` entries (see [Capacity](crate#capacity)).
    /// When it is full, expired entries go first, then the entries the
    /// policy finds least likely to be read again; a new key the policy
    /// expects to be read less than the entry it would displace is not
    /// stored. Every value pushed out, or refused, is published as
    /// [`Cause::Size`](crate::Cause::Size). `len()` never exceeds `n` once a
    /// call has returned.
    ///
    /// The bound is the map's, not each shard's: `n` distinct keys put
    /// into an empty map are all held, however they hash (see
    /// [Capacity](crate#capacity)). The shard count is lowered to at most
    /// `n` (a power of two): a map that small needs no more.
    ///
    /// ```
    /// use expiremap::{Cause, ExpireMap};
    /// use std::time::Duration;
    ///
    /// let map = ExpireMap::<u32, u32>::builder().max_entries(100).build();
    /// let mut events = map.subscribe()?;
    /// for k in 0..100 {
    ///     map.put(k, k, Duration::from_secs(60));
    /// }
    /// assert_eq!(map.len(), 100); // every one of them
    /// for k in 100..1_000 {
    ///     map.put(k, k, Duration::from_secs(60));
    /// }
    /// assert_eq!(map.len(), 100);
    /// let e = events.try_recv()?;
    /// assert_eq!(e.cause, Cause::Size);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "max_capacity")]
    pub fn max_entries(mut self, n: u64) -> Self {
        self.max_entries = Some(n);
        self
    }

    /// Bounds the total weight of the entries to `w`, each weighed by the
    /// [`weigher`](Self::weigher) (or 1 without one). As
    /// [`max_entries`](Self::max_entries) otherwise; any entry up to `w`
    /// may be stored (pushing out others), and an entry heavier than `w` is
    /// never stored: it is published as [`Cause::Size`](crate::Cause::Size)
    /// at once.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// let map = ExpireMap::<u32, String>::builder()
    ///     .max_weight(10)
    ///     .weigher(|_, v: &String| v.len() as u64)
    ///     .build();
    /// map.put(1, "four".into(), Duration::from_secs(60));
    /// map.put(2, "six!!!".into(), Duration::from_secs(60));
    /// assert_eq!(map.len(), 2);
    /// map.put(3, "eleven chars".into(), Duration::from_secs(60)); // > 10 alone
    /// assert_eq!((map.len(), map.get(&3)), (2, None));
    /// ```
    pub fn max_weight(mut self, w: u64) -> Self {
        self.max_weight = Some(w);
        self
    }

    /// How much an entry weighs against [`max_weight`](Self::max_weight)
    /// (bytes, say: a `u64`, so that the total can pass 4 GiB). It runs
    /// outside every lock, once per `put`, on the key and value being put;
    /// the weight is kept with the entry (8 bytes each).
    pub fn weigher(mut self, f: impl Fn(&K, &V) -> u64 + Send + Sync + 'static) -> Self {
        self.weigher = Some(Arc::new(f));
        self
    }

    /// Counts hits and misses of reads in [`Stats`](crate::Stats) (off by
    /// default: then both stay 0 and reads pay one predictable branch).
    /// The counters are striped across cache lines, one stripe per thread
    /// slot, so that reads on different threads do not share a line for
    /// them. See [`ExpireMap::stats`].
    pub fn record_stats(mut self, on: bool) -> Self {
        self.record_stats = on;
        self
    }

    /// Entries also expire `d` after their last access: a write, or a read
    /// by `get`, `get_many`, `get_with_ttl` or a loading hit (`ttl`,
    /// `contains_key`, `expire` and the read of `update` are not accesses).
    /// Reads stay exact against the effective deadline `min(write deadline, last
    /// access + d)`, which `ttl` reports, and an idle entry leaves as
    /// [`Cause::Expired`](crate::Cause::Expired). A read records its access
    /// under the shard's read lock (an atomic maximum), and the eviction
    /// thread moves the timer of an entry read since it was set instead of
    /// evicting it. It costs 16 bytes per entry. A zero `d` is rejected;
    /// one too large to represent saturates.
    ///
    /// A read of one key (`get`, each of `get_many`'s, `get_with_ttl`,
    /// `ttl`, `contains_key`, a loading call, `update`'s read) that finds
    /// its entry expired by its idle time alone removes it at once: its value leaves as `Expired`
    /// then, not at the next eviction pass (and is not counted in
    /// [`Stats::evicted`](crate::Stats::evicted)). The read takes the
    /// shard's write lock for that, which waits for the reads in flight: one
    /// that read the clock just before the idle deadline may still be
    /// recording its access, and if it does, the entry lives on and the
    /// read answers with it. So an entry such a read reported gone never
    /// comes back (without a write), however reads race at the deadline.
    /// Iteration (`iter`, `keys`, `retain`) is weakly consistent instead: it
    /// skips what its snapshot finds idle-expired, without that
    /// confirmation, so at the very deadline it may miss an entry a racing
    /// read keeps alive.
    ///
    /// ```
    /// use expiremap::{ExpireMap, ManualClock};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let map = ExpireMap::<&str, u32>::builder()
    ///     .clock(clock.clone())
    ///     .time_to_idle(Duration::from_secs(10))
    ///     .build();
    /// map.put("a", 1, Duration::from_secs(60));
    /// clock.advance(Duration::from_secs(8));
    /// assert_eq!(map.get("a"), Some(1)); // an access: idle until 18 s
    /// clock.advance(Duration::from_secs(10));
    /// assert_eq!(map.ttl("a"), Some(Duration::ZERO)); // at 18 s: live (ttl is no access)
    /// clock.advance(Duration::from_nanos(1));
    /// assert_eq!(map.get("a"), None); // idle 10 s + 1 ns
    /// assert_eq!(map.len(), 0); // and removed by that read
    /// ```
    pub fn time_to_idle(mut self, d: Duration) -> Self {
        self.idle = Some(d);
        self
    }

    /// The time to live of the writes that name none ([`ExpireMap::insert`],
    /// [`ExpireMap::get_with`] and the other loaders without a `ttl`), set
    /// once for the map as moka's `time_to_live` is (default: none, so
    /// they store entries that never expire). An
    /// [`expire_after`](Self::expire_after) policy takes its place.
    /// [`ExpireMap::put`] still takes a TTL per call.
    /// [`try_build`](Self::try_build) rejects a zero `d`.
    ///
    /// ```
    /// use expiremap::{ExpireMap, ManualClock};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let map = ExpireMap::<&str, u32>::builder()
    ///     .clock(clock.clone())
    ///     .time_to_live(Duration::from_secs(30))
    ///     .build();
    /// map.insert("a", 1);
    /// assert_eq!(map.ttl("a"), Some(Duration::from_secs(30)));
    /// clock.advance(Duration::from_secs(31));
    /// assert_eq!(map.get("a"), None);
    /// ```
    pub fn time_to_live(mut self, d: Duration) -> Self {
        self.time_to_live = Some(d);
        self
    }

    /// Each entry's time to live from its key and value, for the writes
    /// that name no TTL ([`ExpireMap::insert`], [`ExpireMap::try_insert`],
    /// [`ExpireMap::get_with`] and the other loaders without a `ttl`),
    /// in place of [`time_to_live`](Self::time_to_live): see [`Expiry`].
    /// Calls that take a `ttl` use theirs. A map without a policy pays
    /// nothing for this setting; reads never run it (there is no moka
    /// `expire_after_read`: [`time_to_idle`](Self::time_to_idle) slides
    /// deadlines with reads).
    #[doc(alias = "expire_after_read")]
    pub fn expire_after(mut self, policy: impl Expiry<K, V>) -> Self {
        self.expiry = Some(Arc::new(policy));
        self
    }

    /// Refresh ahead (Caffeine's `refreshAfterWrite`): a loading call
    /// ([`get_with`](ExpireMap::get_with), [`get_or_insert_with`](ExpireMap::get_or_insert_with)
    /// and their kin) that finds a live value written more than `d` ago
    /// returns it and starts one reload of the key with its own loader, so
    /// a key read through a loader is reloaded before its deadline instead
    /// of missing at it. One reload per key at a time (the key's single
    /// flight); every other caller gets the current value without waiting.
    /// The reload's value replaces the entry unless a write of the key
    /// (`put`, `remove`, ...) came meanwhile, which wins; a reload that
    /// fails or panics keeps the current value, and a later call tries
    /// again. A reload's value is timed as a new entry: the call's `ttl`,
    /// or the map's own expiry's `expire_after_create` (a zero from it
    /// expires the old value). Where the reload runs: see
    /// [`refresh_spawner`](Self::refresh_spawner). Plain reads (`get`) never
    /// refresh, nor do bulk loads ([`get_many_with`](ExpireMap::get_many_with)
    /// and kin): they return a live value however old, and load only the
    /// keys that miss. [`Stats`](crate::Stats) counts reloads and their failures.
    /// 8 bytes per entry (the time of its last write), only in maps that
    /// use it. [`try_build`](Self::try_build) rejects a zero `d`.
    ///
    /// ```
    /// use expiremap::{ExpireMap, ManualClock};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let map: ExpireMap<&str, u32> = ExpireMap::builder()
    ///     .clock(clock.clone())
    ///     .time_to_live(Duration::from_secs(60))
    ///     .refresh_after(Duration::from_secs(45))
    ///     .build();
    /// assert_eq!(map.get_with("rate", || 1), 1);
    /// clock.advance(Duration::from_secs(50));
    /// // Older than 45 s: the current value, and a reload (here, in this call).
    /// assert_eq!(map.get_with("rate", || 2), 1);
    /// assert_eq!(map.get("rate"), Some(2));
    /// assert_eq!(map.ttl("rate"), Some(Duration::from_secs(60)));
    /// assert_eq!(map.stats().refreshes, 1);
    /// ```
    pub fn refresh_after(mut self, d: Duration) -> Self {
        self.refresh_after = Some(d);
        self
    }

    /// Where the reloads of [`refresh_after`](Self::refresh_after) run: each
    /// is handed to `spawn` as a boxed future (shaped for `tokio::spawn`;
    /// a blocking loader's reload is a future that completes on its first
    /// poll, so any executor, or a thread that polls it once, will do), and
    /// the call that found the old value returns it at once. Used by the
    /// loaders whose closure or future is `Send + 'static` (moka's names:
    /// [`get_with`](ExpireMap::get_with) and kin); the loaders that take a
    /// `ttl` (`get_or_insert_with` and kin), whose closures may borrow, and
    /// every loader in a map without a spawner, run the reload in the call
    /// that found the old value, after which it returns that value.
    ///
    /// A reload handed over holds a handle to the map until it completes or
    /// is dropped, so a spawner that keeps futures without ever running or
    /// dropping them keeps the map alive (its eviction thread runs on, and
    /// no `Shutdown` is published). Executors drop their tasks when they
    /// shut down.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// // A reload on a thread of its own (a pool would do the same).
    /// let map: ExpireMap<u32, u32> = ExpireMap::builder()
    ///     .refresh_after(Duration::from_secs(30))
    ///     .refresh_spawner(|reload| {
    ///         std::thread::spawn(move || {
    ///             use std::task::{Context, Poll, Waker};
    ///             let mut reload = reload;
    ///             let mut cx = Context::from_waker(Waker::noop());
    ///             while reload.as_mut().poll(&mut cx) == Poll::Pending {
    ///                 std::thread::yield_now();
    ///             }
    ///         });
    ///     })
    ///     .build();
    /// assert_eq!(map.get_with(1, || 10), 10);
    /// ```
    pub fn refresh_spawner(
        mut self,
        spawn: impl Fn(Pin<Box<dyn Future<Output = ()> + Send>>) + Send + Sync + 'static,
    ) -> Self {
        self.spawner = Some(Arc::new(spawn));
        self
    }

    /// Publishes the map's counters through the [`metrics`] facade, with
    /// `name` as their `cache` label (feature `metrics`). Turns on
    /// [`record_stats`](Self::record_stats): hits and misses are series.
    ///
    /// The series (see "Monitoring" in the crate docs) are published from
    /// counters the map keeps, never from `get` or `put`: by the eviction
    /// thread at least once a second (it then wakes once a second even
    /// when the map is idle), when the last handle is dropped, and on
    /// [`ExpireMap::publish_metrics`]. A map without the thread
    /// ([`background_eviction(false)`](Self::background_eviction))
    /// publishes only on the last two. Loads are timed (two clock reads
    /// around the loader) only in a map with a metrics name.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// let users = ExpireMap::<u64, String>::builder().metrics("users").build();
    /// users.put(7, "ada".to_string(), Duration::from_secs(60));
    /// assert_eq!(users.get(&7).as_deref(), Some("ada")); // a hit
    /// users.publish_metrics(); // to the recorder installed, if any
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics(mut self, name: impl Into<metrics::SharedString>) -> Self {
        self.metrics = Some(name.into());
        self
    }

    fn config(&self) -> Result<Config, BuildError> {
        let mut shards = match self.shards {
            Some(n) => n,
            // Under Miri and loom, the four shards that four per core gave
            // their one core: no unsafe code path or protocol depends on
            // the count, and 64 shards a map made every model larger and
            // the Miri step slower (744 s against 679 with four; as
            // `EVICT_BATCH` is one under loom).
            None if cfg!(any(miri, expiremap_loom)) => 4,
            None => default_shards(crate::sync::available_parallelism()),
        };
        if shards == 0 || shards > MAX_SHARDS || !shards.is_power_of_two() {
            return Err(BuildError::Shards(shards));
        }
        let bound = match (self.max_entries, self.max_weight) {
            (Some(_), Some(_)) => return Err(BuildError::TwoBounds),
            (Some(0), None) => return Err(BuildError::MaxEntries(0)),
            (None, Some(0)) => return Err(BuildError::MaxWeight(0)),
            (Some(_), None) if self.weigher.is_some() => {
                return Err(BuildError::WeigherWithoutMaxWeight);
            }
            (None, None) if self.weigher.is_some() => {
                return Err(BuildError::WeigherWithoutMaxWeight);
            }
            (n, w) => n.or(w),
        };
        if let Some(b) = bound {
            // A map that small needs no more shards than entries.
            let most = 1usize << b.min(MAX_SHARDS as u64).ilog2();
            shards = shards.min(most);
        }
        if !(MIN_EVICTION_INTERVAL..=MAX_PERIOD).contains(&self.interval) {
            return Err(BuildError::EvictionInterval(self.interval));
        }
        if !(MIN_PRECISION..=MAX_PERIOD).contains(&self.precision) {
            return Err(BuildError::Precision(self.precision));
        }
        let cap = self.event_capacity;
        if cap == 0 || cap > MAX_EVENT_CAPACITY || !cap.is_power_of_two() {
            return Err(BuildError::EventCapacity(cap));
        }
        if !(1..=MAX_SUBSCRIBERS).contains(&self.max_subscribers) {
            return Err(BuildError::MaxSubscribers(self.max_subscribers));
        }
        let idle = match self.idle {
            Some(d) if d.is_zero() => return Err(BuildError::TimeToIdle(d)),
            Some(d) => Some(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            None => None,
        };
        let time_to_live = match self.time_to_live {
            Some(d) if d.is_zero() => return Err(BuildError::TimeToLive(d)),
            Some(d) => d,
            None => Duration::MAX,
        };
        let refresh = match self.refresh_after {
            Some(d) if d.is_zero() => return Err(BuildError::RefreshAfter(d)),
            Some(d) => Some(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            None => None,
        };
        Ok(Config {
            refresh,
            time_to_live,
            shards,
            interval: self.interval.as_nanos() as u64,
            precision: self.precision.as_nanos() as u64,
            event_capacity: cap,
            max_subscribers: self.max_subscribers,
            publish_removals: self.publish_removals,
            notify_on_shutdown: self.notify_on_shutdown,
            background_eviction: self.background_eviction,
            bound,
            idle,
            // Hits and misses are series of the metrics.
            #[cfg(feature = "metrics")]
            record_stats: self.record_stats || self.metrics.is_some(),
            #[cfg(not(feature = "metrics"))]
            record_stats: self.record_stats,
            #[cfg(feature = "metrics")]
            metrics: self.metrics.clone(),
        })
    }
}

impl<K, V, S> Builder<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// Builds the map, or says which setting is invalid.
    pub fn try_build(mut self) -> Result<ExpireMap<K, V, S>, BuildError> {
        let config = self.config()?;
        let clock = self
            .clock
            .take()
            .unwrap_or_else(|| Time::new(SystemClock::new()));
        ExpireMap::from_parts(
            config,
            clock,
            self.hasher,
            self.weigher.take(),
            self.expiry.take(),
            self.spawner.take(),
        )
    }

    /// Builds the map.
    ///
    /// # Panics
    ///
    /// If a setting is invalid, with the message of [`try_build`](Self::try_build)'s error.
    pub fn build(self) -> ExpireMap<K, V, S> {
        match self.try_build() {
            Ok(map) => map,
            Err(e) => panic!("{e}"),
        }
    }
}

impl<K, V, S> fmt::Debug for Builder<K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Builder");
        d.field("shards", &self.shards)
            .field("eviction_interval", &self.interval)
            .field("precision", &self.precision)
            .field("event_capacity", &self.event_capacity)
            .field("max_subscribers", &self.max_subscribers)
            .field("publish_removals", &self.publish_removals)
            .field("notify_on_shutdown", &self.notify_on_shutdown)
            .field("background_eviction", &self.background_eviction)
            .field("max_entries", &self.max_entries)
            .field("max_weight", &self.max_weight)
            .field("weigher", &self.weigher.is_some())
            .field("expire_after", &self.expiry.is_some())
            .field("refresh_after", &self.refresh_after)
            .field("refresh_spawner", &self.spawner.is_some())
            .field("time_to_idle", &self.idle)
            .field("time_to_live", &self.time_to_live)
            .field("record_stats", &self.record_stats);
        #[cfg(feature = "metrics")]
        d.field("metrics", &self.metrics);
        d.finish_non_exhaustive()
    }
}

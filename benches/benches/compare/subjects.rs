//! The libraries the comparison runs, behind one trait so that every row
//! runs the same code.

use super::*;

pub(super) trait Subject: Send + Sync + Sized + 'static {
    /// Column name (also the criterion function id).
    const NAME: &'static str;
    /// Honours TTLs (rows 6-7 apply).
    const EXPIRES: bool;
    /// Evicts on its own thread: row 6 only polls it.
    const SELF_EVICTING: bool = false;
    /// An empty map. Caches with one TTL for all entries get `ttl`.
    fn build(ttl: Duration) -> Self;
    /// Insert or overwrite. Libraries without per-entry TTL ignore `ttl`.
    fn insert(&self, k: u64, v: u64, ttl: Duration);
    fn get(&self, k: u64) -> Option<u64>;
    /// Pending maintenance: moka `run_pending_tasks`, mini-moka `sync`.
    fn maintain(&self) {}
    /// Entries held (exact after `maintain` for the moka family).
    fn count(&self) -> u64;
}

pub(super) struct Em(pub(super) ExpireMap<u64, u64>);

impl Subject for Em {
    const NAME: &'static str = "expiremap";
    const EXPIRES: bool = true;
    const SELF_EVICTING: bool = true;
    fn build(_: Duration) -> Self {
        Em(ExpireMap::new())
    }
    #[inline]
    fn insert(&self, k: u64, v: u64, ttl: Duration) {
        black_box(self.0.put(k, v, ttl));
    }
    #[inline]
    fn get(&self, k: u64) -> Option<u64> {
        self.0.get(&k)
    }
    fn count(&self) -> u64 {
        self.0.len() as u64
    }
}

pub(super) type MokaCache = moka::sync::Cache<u64, u64, ahash::RandomState>;

/// moka's per-entry expiry, returning the entry's TTL (the same for every
/// entry in rows 1-6) on create and on update.
pub(super) struct FixedExpiry(Duration);

impl Expiry<u64, u64> for FixedExpiry {
    fn expire_after_create(&self, _: &u64, _: &u64, _: Instant) -> Option<Duration> {
        Some(self.0)
    }
    fn expire_after_update(
        &self,
        _: &u64,
        _: &u64,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(self.0)
    }
}

/// moka, with a cache-wide `time_to_live` (`PER_ENTRY = false`, column
/// `moka-ttl`) or per-entry `expire_after` (`PER_ENTRY = true`, column
/// `moka-expire`); everything else is the same.
pub(super) struct Moka<const PER_ENTRY: bool>(pub(super) MokaCache);

pub(super) type MokaTtl = Moka<false>;
pub(super) type MokaExpire = Moka<true>;

impl<const PER_ENTRY: bool> Subject for Moka<PER_ENTRY> {
    const NAME: &'static str = if PER_ENTRY { "moka-expire" } else { "moka-ttl" };
    const EXPIRES: bool = true;
    fn build(ttl: Duration) -> Self {
        let builder = moka::sync::Cache::builder().max_capacity(N);
        let builder = if PER_ENTRY {
            builder.expire_after(FixedExpiry(ttl))
        } else {
            builder.time_to_live(ttl)
        };
        Moka(builder.build_with_hasher(ahash::RandomState::new()))
    }
    #[inline]
    fn insert(&self, k: u64, v: u64, _: Duration) {
        self.0.insert(k, v);
    }
    #[inline]
    fn get(&self, k: u64) -> Option<u64> {
        self.0.get(&k)
    }
    fn maintain(&self) {
        self.0.run_pending_tasks();
    }
    fn count(&self) -> u64 {
        self.0.entry_count()
    }
}

pub(super) struct MiniMoka(mini_moka::sync::Cache<u64, u64, ahash::RandomState>);

impl Subject for MiniMoka {
    const NAME: &'static str = "mini-moka";
    const EXPIRES: bool = true;
    fn build(ttl: Duration) -> Self {
        MiniMoka(
            mini_moka::sync::Cache::builder()
                .max_capacity(N)
                .time_to_live(ttl)
                .build_with_hasher(ahash::RandomState::new()),
        )
    }
    #[inline]
    fn insert(&self, k: u64, v: u64, _: Duration) {
        self.0.insert(k, v);
    }
    #[inline]
    fn get(&self, k: u64) -> Option<u64> {
        self.0.get(&k)
    }
    fn maintain(&self) {
        mini_moka::sync::ConcurrentCacheExt::sync(&self.0);
    }
    fn count(&self) -> u64 {
        self.0.entry_count()
    }
}

pub(super) struct Quick(quick_cache::sync::Cache<u64, u64>);

impl Subject for Quick {
    const NAME: &'static str = "quick_cache";
    const EXPIRES: bool = false;
    fn build(_: Duration) -> Self {
        Quick(quick_cache::sync::Cache::with_weighter(
            N as usize,
            2 * N,
            quick_cache::UnitWeighter,
        ))
    }
    #[inline]
    fn insert(&self, k: u64, v: u64, _: Duration) {
        self.0.insert(k, v);
    }
    #[inline]
    fn get(&self, k: u64) -> Option<u64> {
        self.0.get(&k)
    }
    fn count(&self) -> u64 {
        self.0.len() as u64
    }
}

pub(super) struct Dash(dashmap::DashMap<u64, u64, ahash::RandomState>);

impl Subject for Dash {
    const NAME: &'static str = "dashmap";
    const EXPIRES: bool = false;
    fn build(_: Duration) -> Self {
        Dash(dashmap::DashMap::with_hasher(ahash::RandomState::new()))
    }
    #[inline]
    fn insert(&self, k: u64, v: u64, _: Duration) {
        black_box(self.0.insert(k, v));
    }
    #[inline]
    fn get(&self, k: u64) -> Option<u64> {
        self.0.get(&k).map(|r| *r)
    }
    fn count(&self) -> u64 {
        self.0.len() as u64
    }
}

pub(super) struct Rw(RwLock<HashMap<u64, u64, ahash::RandomState>>);

impl Subject for Rw {
    const NAME: &'static str = "rwlock-hashmap";
    const EXPIRES: bool = false;
    fn build(_: Duration) -> Self {
        Rw(RwLock::new(HashMap::with_hasher(ahash::RandomState::new())))
    }
    #[inline]
    fn insert(&self, k: u64, v: u64, _: Duration) {
        black_box(self.0.write().insert(k, v));
    }
    #[inline]
    fn get(&self, k: u64) -> Option<u64> {
        self.0.read().get(&k).copied()
    }
    fn count(&self) -> u64 {
        self.0.read().len() as u64
    }
}

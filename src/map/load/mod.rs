//! The loading floor: every call that may run a loader, and the flights
//! that make callers of one key share its load.
//!
//! * this file: the loading surface, `get_or_insert_with` and its
//!   fallible, async and by-reference forms, and `update`: what a loading
//!   call does around its flight (look, begin, run `init` with no lock
//!   held, store);
//! * `flight`: a key's flights (a load, an update), their waits and the
//!   cycle check;
//! * `get_with`: moka's loaders, with the map's own expiry;
//! * `refresh`: refresh ahead, the loaders' first look and their reloads;
//! * `bulk`: `get_many`, and `get_many_with` and kin (one load per batch,
//!   a flight per key).
//!
//! May call: the map's paths (`crate::map::write`'s `write_key` and
//! conditional put, `crate::map::read`, `crate::map::expiry`'s TTL),
//! `crate::map::store` (a shard's lookups under its lock), and
//! `crate::map::monitor` (watching a load). `flight` calls only the
//! `Registry` it is given (the shard lock, through a trait).

use crate::map::expiry::Ttl;
use crate::map::monitor::LoadKind;
use crate::map::store::shard::Shard;
use crate::map::{ExpireMap, PutIf};
use crate::sync::Arc;
use crate::sync::biased::RwLock;
use flight::Flight;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

pub(super) mod bulk;
pub(super) mod flight;
mod get_with;
pub(super) mod refresh;

/// What a loading call that missed finds under the write lock.
pub(super) enum Begun<K, V> {
    /// The key's live value.
    Hit(V),
    /// The key's flight, to wait for.
    Wait(Arc<flight::Flight<K, V>>),
    /// A new load, registered for the caller to run.
    Run(Arc<flight::Flight<K, V>>),
}

/// What the function given to [`ExpireMap::update`] does with the entry
/// it was shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Update<V> {
    /// Leave the entry as it is (or absent).
    Keep,
    /// Remove the entry (its value leaves as [`Cause::Removed`](crate::map::Cause::Removed)).
    Remove,
    /// Store this value, live for this long from now. A zero TTL changes
    /// nothing, as for [`ExpireMap::put`].
    Set(V, Duration),
    /// Store this value with the entry's current deadline (Redis `SET ...
    /// KEEPTTL`). Shown no live entry, it stores nothing.
    SetKeepTtl(V),
}

/// A key's flights are registered in its shard, under the shard's write
/// lock (see `flight`).
impl<K, V> flight::Registry<K, V> for RwLock<Shard<K, V>> {
    fn unregister(&self, flight: &Arc<Flight<K, V>>) -> Option<Arc<Flight<K, V>>> {
        self.write().take_flight(flight)
    }
}

impl<K, V> Shard<K, V> {
    /// Takes `flight` out of this shard's list, if it is there (called
    /// under the shard's write lock).
    fn take_flight(&mut self, flight: &Arc<Flight<K, V>>) -> Option<Arc<Flight<K, V>>> {
        let at = self.flights.iter().position(|f| Arc::ptr_eq(f, flight))?;
        Some(self.flights.swap_remove(at))
    }

    /// The store that settles `guard`'s load (under the shard's write
    /// lock) takes its flight out, so that the guard's drop need not lock
    /// again. The handle taken out is dropped here: the guard holds
    /// another, so no key is dropped under the lock.
    pub(super) fn end_flight(&mut self, guard: &flight::FlightGuard<'_, K, V>) {
        if self.take_flight(&guard.flight).is_some() {
            guard.left();
        }
    }
}

impl<K, V, S> ExpireMap<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// The live value for `key`, or the value `init` makes for it, stored
    /// for `ttl`. At most one caller per key runs its `init` at a time, with
    /// no lock held; other callers of the same key park until it is done
    /// and return (a clone of) its value. A hit costs what `get` costs.
    ///
    /// If `init` panics, the panic reaches its caller, nothing is stored,
    /// and one of the waiting callers runs its own `init`. The value is
    /// stored only if no `put`, `put_if_absent`, `remove`, `update` or
    /// `clear` touched the key while `init` ran; otherwise the newer write stands and the
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
    /// An update waits only for another update of `key` (whose `f` runs on
    /// the thread that called it), never for a load of `key` by
    /// [`get_or_insert_with`](Self::get_or_insert_with) or its async and
    /// fallible forms: it is a write of the key, and loads lose to writes.
    /// It goes ahead at once, and the load's value is returned to its
    /// callers but not stored. So an update beside an async load of its
    /// key completes on a current-thread runtime, and blocks no worker for
    /// the load on a multi-thread one.
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
                // A write of the key: a load of it loses (it is touched, and
                // not waited for); an update of it is waited for.
                if let Some(other) = flight::claim(&shard.flights, hash, &key) {
                    Err(other)
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
                    let flight =
                        Arc::new(flight::Flight::new(key, hash, flight::Kind::Update, false));
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
        let guard = flight::FlightGuard::new(flight, lock);
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
                    if r.door == crate::map::store::shard::Door::Removed {
                        inner.count_removed(1);
                    }
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
        match self.look(&key) {
            Some((v, false)) => Ok(v),
            looked => self.stale_or_load(key, Ttl::Given(ttl), init, looked),
        }
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
        match self.look(key) {
            Some((v, false)) => Ok(v),
            looked => self.stale_or_load(key.to_owned(), Ttl::Given(ttl), init, looked),
        }
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
    pub(super) fn load<E>(
        &self,
        key: K,
        ttl: Ttl,
        init: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E>
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
        let mut guard = flight::FlightGuard::new(flight, self.inner.shard(hash));
        let watch = self.inner.load_watch(LoadKind::Load, hash, 1);
        let r = watch.run(init);
        watch.end(r.is_ok());
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
    /// An `init` that asks for its own key, awaiting a load of it or
    /// calling a blocking loader of it inside its future, would wait for
    /// itself: it panics instead, as does an [`Expiry`](crate::Expiry)
    /// policy that asks for the key while this load's value is stored (the
    /// wait is told by the thread polling the `init` or running the policy
    /// at the time). A cycle through other async loads (this `init` awaits
    /// a key whose async `init` awaits this one) is not detected: no thread
    /// runs an async load between polls, and those futures never complete.
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
        if let Some((v, stale)) = self.look(&key) {
            if stale {
                self.refresh_here_async(key, Ttl::Given(ttl), init).await;
            }
            return Ok(v);
        }
        self.load_async(key, Ttl::Given(ttl), init).await
    }

    /// [`load`](Self::load)'s async form: after the first look missed.
    pub(super) async fn load_async<F, E>(&self, key: K, ttl: Ttl, init: F) -> Result<V, E>
    where
        F: Future<Output = Result<V, E>>,
        E: Clone + Send + Sync + 'static,
    {
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
        let mut guard = flight::FlightGuard::new(flight, self.inner.shard(hash));
        self.run_async_load(key, ttl, init, &mut guard, LoadKind::Load)
            .await
    }

    /// Awaits an async load's `init` and ends the load with its outcome
    /// ([`end_load`](Self::end_load)), the thread polling `init` and the
    /// one storing marked as running the load's user code
    /// ([`Flight::acting`](flight::Flight::acting)), and watched as a
    /// load of `kind`.
    pub(super) async fn run_async_load<F, E>(
        &self,
        key: K,
        ttl: Ttl,
        init: F,
        guard: &mut flight::FlightGuard<'_, K, V>,
        kind: LoadKind,
    ) -> Result<V, E>
    where
        F: Future<Output = Result<V, E>>,
        E: Clone + Send + Sync + 'static,
    {
        let flight = guard.flight.clone();
        let watch = self.inner.load_watch(kind, flight.hash, 1);
        let r = watch.run_async(flight::acting_for(&[&*flight], init)).await;
        watch.end(r.is_ok());
        let _acting = flight.acting();
        self.end_load(key, ttl, r, guard)
    }

    /// A loading call's look under `hash`'s write lock after a miss: the
    /// live value (a put or a load landed since the miss), the key's flight
    /// to wait for, or a new load of it, registered (with `spare`'s key)
    /// for the caller to run; `task` if the caller is async.
    pub(super) fn begin_load(
        &self,
        hash: u64,
        key: &K,
        spare: &mut Option<K>,
        task: bool,
    ) -> Begun<K, V> {
        // A shard whose answers do not depend on the time (no deadline, no
        // times of its own) tells a hit at any time: it reads no clock.
        let (shard, (), now) = self.inner.around(
            hash,
            |l| l.write(),
            |s| s.start_write(hash),
            |t, s| if s.time_free() { 0 } else { t.now() },
        );
        if let Some(f) = shard.get_from(shard.start(hash), hash, key) {
            if f.access(now) {
                return Begun::Hit(f.value.clone());
            }
        }
        let mut shard = shard;
        match flight::find(&shard.flights, hash, key) {
            Some(other) => Begun::Wait(other.clone()),
            None => {
                let key = spare.take().expect("registered once");
                let flight = Arc::new(flight::Flight::new(key, hash, flight::Kind::Load, task));
                shard.flights.push(flight.clone());
                Begun::Run(flight)
            }
        }
    }

    /// What a waiter takes from a flight that ended: a load's value, or its
    /// error if of the waiter's type; `None`: look again (and load).
    pub(super) fn shared<E: Clone + 'static>(ended: flight::Ended<V>) -> Option<Result<V, E>> {
        match ended {
            flight::Ended::Value(v) => Some(Ok(v)),
            flight::Ended::Failed(e) => e.downcast_ref::<E>().map(|e| Err(e.clone())),
            flight::Ended::Over => None,
        }
    }

    /// The loader's side once `init` returned `r`: stores a value (unless a
    /// write of the key came first, or `ttl` is zero) and hands it, or the
    /// error, to the waiters.
    pub(super) fn end_load<E>(
        &self,
        key: K,
        ttl: Ttl,
        r: Result<V, E>,
        guard: &mut flight::FlightGuard<'_, K, V>,
    ) -> Result<V, E>
    where
        E: Clone + Send + Sync + 'static,
    {
        match r {
            Ok(v) => {
                // The map's expiry policy runs here, outside every lock.
                let own = matches!(ttl, Ttl::Own);
                let ttl = self.ttl_for_new(ttl, &key, &v);
                if !ttl.is_zero() {
                    // Stored with the flight's hash of the key.
                    let untouched = PutIf::Untouched(guard);
                    let _ = self.put_cond(key, v.clone(), ttl, untouched, false);
                } else if own {
                    // The policy's zero: a live entry (a reload's) expires.
                    self.expire_untouched(&key, &guard.flight);
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
}

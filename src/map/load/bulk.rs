//! Bulk reads and loads: `get_many` (its reads are in `read`), and
//! `get_many_with` with its fallible and async forms.
//!
//! # Ground rules
//!
//! * A batch is planned with no lock held: every key is hashed (the user's
//!   `Hash`) and the keys are ordered by shard. Each shard visited is then
//!   locked once per chunk of up to [`CHUNK`](read::CHUNK) keys (the read lock to read,
//!   the write lock to register loads), so one lock hold does bounded work.
//! * `get_many_with` registers one `Load` flight per distinct missing key
//!   that no other call is loading, in the protocol of `flight`: bulk and
//!   single-key loaders of a key share one flight, told apart by `Eq`, and
//!   a write during the load wins. Flights are guarded as soon as they are
//!   registered, so they end (and their waiters wake) however the call
//!   ends: a value, an error, a panic, a cancelled future.
//! * **A call never waits while it holds flights of its own.** It runs its
//!   one `load` and ends its flights first, then waits for the keys other
//!   calls are loading; a call with no key of its own to load waits first
//!   and looks again (a key whose load elsewhere ended without a value then
//!   becomes its own). So bulk callers never wait for each other in a
//!   cycle, whatever their key sets.
//! * **An `update` in flight is waited for before the call loads.** An
//!   update may leave its key absent, and only the call's one `load` could
//!   then load it; so a look that meets an update ends the flights it
//!   registered (their waiters look again), waits, and looks again with
//!   `load` unused.

use super::flight::{self, Ended, Flight, FlightGuard, Kind};
use crate::map::ExpireMap;
use crate::map::expiry::Ttl;
use crate::map::monitor::LoadKind;
use crate::sync::{Arc, unmodeled};
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

mod read;

/// Why [`try_get_many_with`](ExpireMap::try_get_many_with) (or
/// [`try_get_many_with_async`](ExpireMap::try_get_many_with_async))
/// returned no values.
///
/// ```
/// use expiremap::{BulkError, ExpireMap};
/// use std::time::Duration;
///
/// let map: ExpireMap<u32, u32> = ExpireMap::new();
/// let minute = Duration::from_secs(60);
/// let r = map.try_get_many_with(&[1, 2], minute, |_| Err::<Vec<(u32, u32)>, _>("down"));
/// assert_eq!(r, Err(BulkError::Load("down")));
/// // `load` left out key 2 (position 1 of the keys):
/// let r = map.try_get_many_with(&[1, 2], minute, |_| Ok::<_, &str>(vec![(1, 10)]));
/// assert_eq!(r, Err(BulkError::Missing { index: 1 }));
/// assert_eq!(map.get(&1), Some(10)); // what `load` returned is stored
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BulkError<E> {
    /// A load failed with this error: the call's own `load`, or the load of
    /// a key the call waited for, made by another call with the same error
    /// type (`try_get_or_insert_with` and the `try_` bulk forms share their
    /// errors this way; each gets a clone).
    Load(E),
    /// No value for `keys[index]`: the call's `load` did not return that
    /// key (nothing is stored for it; the keys it did return are stored),
    /// or the key was being loaded by another call whose load ended without
    /// a value (it panicked, was cancelled, or failed with another error
    /// type) after this call's own `load` had already run. If several keys
    /// got no value, `index` is one of them.
    Missing {
        /// The position in `keys` of a key that got no value.
        index: usize,
    },
}

impl<E: fmt::Display> fmt::Display for BulkError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Load(e) => write!(f, "bulk load failed: {e}"),
            Self::Missing { index } => write!(f, "bulk load returned no value for keys[{index}]"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for BulkError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Load(e) => Some(e),
            Self::Missing { .. } => None,
        }
    }
}

/// The distinct keys of a loading batch that its first read missed.
struct Wanted<V> {
    /// Per distinct key: its first position in `keys`,
    at: Vec<usize>,
    /// its hash,
    hash: Vec<u64>,
    /// and its value once the call has it.
    value: Vec<Option<V>>,
    /// Per position in `keys` that missed: `(position, distinct key)`.
    links: Vec<(usize, usize)>,
}

/// What one look of a loading batch found under the write locks.
struct Pass<'a, K, V> {
    /// Flights the call registered, `(distinct key, guard)`: its `load`
    /// runs them.
    own: Vec<(usize, FlightGuard<'a, K, V>)>,
    /// Flights of other calls, `(distinct key, flight)`, to wait for.
    waits: Vec<(usize, Arc<Flight<K, V>>)>,
}

impl<K, V, S> ExpireMap<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// The live value of each key, in the keys' order, loading the missing
    /// ones with **one** call of `load`, stored for `ttl`: Caffeine's
    /// `getAll` with `loadAll`, a database asked once for 50 ids instead of
    /// 50 times.
    ///
    /// `load` gets the distinct keys that missed and that no other call is
    /// loading (each once, however often `keys` repeats it) and returns
    /// `(key, value)` pairs in any order; it runs with no lock held, and is
    /// not called at all when nothing is left to load. Keys that another
    /// call is loading meanwhile (a `get_or_insert_with` or a bulk call:
    /// they share one load per key, told apart by `Eq`) are waited for,
    /// after this call's own `load` has run; callers of the keys this call
    /// loads wait for it and get its values. A hit is what
    /// [`get`](Self::get) reads, and counts as `get` counts it.
    ///
    /// The loaded values are stored as
    /// [`get_or_insert_with`](Self::get_or_insert_with) stores: only if no
    /// write touched the key during the load (the newer write stands, and
    /// the loaded value is only returned), refused as any put's in a
    /// bounded map, and not at all with a zero `ttl`. Pairs for keys `load`
    /// was not asked for are dropped, not stored (no lock held); of several
    /// pairs for one key the first is used.
    ///
    /// # Panics
    ///
    /// If `load` returns no pair for a key it was asked for, this call
    /// stores what `load` returned, ends every load it began (callers
    /// waiting for the missing key load it themselves), and panics naming
    /// the key's position in `keys`; so it does if a key it waited for was
    /// left without a value by the other call's load (a panic, a
    /// cancellation, an error of a `try_` form) after its own `load` had
    /// run. [`try_get_many_with`](Self::try_get_many_with) returns
    /// [`BulkError::Missing`] instead. If `load` panics, the panic reaches
    /// the caller, nothing of it is stored, and the callers waiting for its
    /// keys load them themselves. A `load` that asks the map for one of the
    /// keys it is loading would wait for itself: it panics instead, as
    /// `get_or_insert_with` does.
    ///
    /// On an async runtime this call parks the calling thread while it
    /// waits: use [`get_many_with_async`](Self::get_many_with_async) there.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// let users: ExpireMap<u32, String> = ExpireMap::new();
    /// let minute = Duration::from_secs(60);
    /// users.put(1, "ada".to_string(), minute);
    /// let names = users.get_many_with(&[1, 2, 3], minute, |ids| {
    ///     assert_eq!(ids.len(), 2); // one query for the two that missed
    ///     ids.iter().map(|&id| (id, format!("user {id}"))).collect()
    /// });
    /// assert_eq!(names, ["ada", "user 2", "user 3"]);
    /// assert_eq!(users.get(&3).as_deref(), Some("user 3"));
    /// ```
    pub fn get_many_with(
        &self,
        keys: &[K],
        ttl: Duration,
        load: impl FnOnce(&[K]) -> Vec<(K, V)>,
    ) -> Vec<V> {
        Self::loaded(self.try_get_many_with(keys, ttl, |ks| Ok(load(ks))))
    }

    /// [`get_many_with`](Self::get_many_with) with a `load` that may fail.
    ///
    /// If `load` fails, nothing of it is stored, and its error is returned
    /// as [`BulkError::Load`] to this call and to every call waiting for one
    /// of its keys whose call returns the same error type (a clone each:
    /// `E: Clone`, as for
    /// [`try_get_or_insert_with`](Self::try_get_or_insert_with); wrap it in
    /// an `Arc` to share one). A waiting call of another error type, or
    /// none, loads the key itself. This call returns that error too if a
    /// key it waited for failed that way. A key `load` was asked for and did
    /// not return (and the rare case that
    /// [`get_many_with`](Self::get_many_with) panics on) gives
    /// [`BulkError::Missing`], once every load this call began has ended.
    ///
    /// ```
    /// use expiremap::{BulkError, ExpireMap};
    /// use std::time::Duration;
    ///
    /// let map: ExpireMap<u32, u32> = ExpireMap::new();
    /// let minute = Duration::from_secs(60);
    /// let squares = |ks: &[u32]| Ok::<_, String>(ks.iter().map(|&k| (k, k * k)).collect());
    /// assert_eq!(map.try_get_many_with(&[2, 3], minute, squares), Ok(vec![4, 9]));
    /// let down = |_: &[u32]| Err::<Vec<(u32, u32)>, _>("down".to_string());
    /// assert_eq!(map.try_get_many_with(&[3, 4], minute, down), Err(BulkError::Load("down".into())));
    /// assert_eq!(map.get_many(&[3, 4]), [Some(9), None]);
    /// ```
    pub fn try_get_many_with<E>(
        &self,
        keys: &[K],
        ttl: Duration,
        load: impl FnOnce(&[K]) -> Result<Vec<(K, V)>, E>,
    ) -> Result<Vec<V>, BulkError<E>>
    where
        E: Clone + Send + Sync + 'static,
    {
        let found = self.get_many(keys);
        let Some(mut wanted) = self.wanted(keys, &found) else {
            return Ok(found.into_iter().flatten().collect());
        };
        let mut load = Some(load);
        loop {
            let pass = self.begin_many(keys, &mut wanted, load.is_some(), false);
            if !pass.own.is_empty() {
                let load = load.take().expect("a call registers loads only once");
                let asked = Self::asked(keys, &wanted, &pass.own);
                let watch = self.inner.load_watch(LoadKind::Bulk, 0, asked.len());
                let r = watch.run(|| load(&asked));
                watch.end(r.is_ok());
                self.end_many(&mut wanted, asked, ttl, r, pass.own)?;
            }
            if pass.waits.is_empty() {
                break;
            }
            for (w, other) in pass.waits {
                Self::take_ended(&mut wanted, w, other.wait())?;
            }
        }
        Self::finish(wanted, found)
    }

    /// The async form of [`get_many_with`](Self::get_many_with): the same
    /// single `load` for the missing keys nobody else is loading, here a
    /// future made by `load` from the keys (clone what it needs: it cannot
    /// borrow them). No thread parks on behalf of this call: keys that other
    /// calls are loading (blocking or async: they share one flight per key)
    /// are awaited. If this future is dropped while `load`'s future runs,
    /// nothing of it is stored and callers waiting for its keys load them
    /// themselves. Panics as `get_many_with` does.
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
    /// let load = |ks: &[u32]| {
    ///     let ks = ks.to_vec();
    ///     async move { ks.into_iter().map(|k| (k, k + 100)).collect() }
    /// };
    /// // On any executor (tokio, async-std, a hand-written one):
    /// assert_eq!(block_on(map.get_many_with_async(&[1, 2], minute, load)), [101, 102]);
    /// assert_eq!(map.get(&2), Some(102));
    /// ```
    pub async fn get_many_with_async<F>(
        &self,
        keys: &[K],
        ttl: Duration,
        load: impl FnOnce(&[K]) -> F,
    ) -> Vec<V>
    where
        F: Future<Output = Vec<(K, V)>>,
    {
        let load = |ks: &[K]| {
            let f = load(ks);
            async move { Ok(f.await) }
        };
        Self::loaded(self.try_get_many_with_async(keys, ttl, load).await)
    }

    /// The async form of [`try_get_many_with`](Self::try_get_many_with):
    /// as [`get_many_with_async`](Self::get_many_with_async), with a `load`
    /// whose error is shared as `try_get_many_with` shares it.
    ///
    /// ```
    /// use expiremap::{BulkError, ExpireMap};
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
    /// let down = |_: &[u32]| async { Err::<Vec<(u32, u32)>, _>("down") };
    /// let r = block_on(map.try_get_many_with_async(&[1], minute, down));
    /// assert_eq!(r, Err(BulkError::Load("down")));
    /// ```
    pub async fn try_get_many_with_async<F, E>(
        &self,
        keys: &[K],
        ttl: Duration,
        load: impl FnOnce(&[K]) -> F,
    ) -> Result<Vec<V>, BulkError<E>>
    where
        F: Future<Output = Result<Vec<(K, V)>, E>>,
        E: Clone + Send + Sync + 'static,
    {
        let found = self.get_many(keys);
        let Some(mut wanted) = self.wanted(keys, &found) else {
            return Ok(found.into_iter().flatten().collect());
        };
        let mut load = Some(load);
        loop {
            let pass = self.begin_many(keys, &mut wanted, load.is_some(), true);
            if !pass.own.is_empty() {
                let load = load.take().expect("a call registers loads only once");
                let asked = Self::asked(keys, &wanted, &pass.own);
                // The guards live in this future: dropping it while `load`
                // runs ends the flights with no value.
                // `load` runs (and its future is polled, and the values
                // stored) with the thread marked as running these loads.
                let flights: Vec<_> = pass.own.iter().map(|(_, g)| g.flight.clone()).collect();
                let flights: Vec<&Flight<K, V>> = flights.iter().map(|f| &**f).collect();
                let watch = self.inner.load_watch(LoadKind::Bulk, 0, asked.len());
                let r = flight::acting_for(&flights, async { load(&asked).await });
                let r = watch.run_async(r).await;
                watch.end(r.is_ok());
                let _acting: Vec<_> = flights.iter().map(|f| f.acting()).collect();
                self.end_many(&mut wanted, asked, ttl, r, pass.own)?;
            }
            if pass.waits.is_empty() {
                break;
            }
            for (w, other) in pass.waits {
                Self::take_ended(&mut wanted, w, other.wait_async().await)?;
            }
        }
        Self::finish(wanted, found)
    }

    /// The values of a non-`try_` bulk load, or its documented panic.
    fn loaded(r: Result<Vec<V>, BulkError<Infallible>>) -> Vec<V> {
        match r {
            Ok(v) => v,
            Err(BulkError::Load(never)) => match never {},
            Err(BulkError::Missing { index }) => panic!(
                "expiremap: get_many_with got no value for keys[{index}]: its load did not \
                 return that key, or another call loading it ended without a value after \
                 this call's load had run"
            ),
        }
    }

    /// The distinct keys among those the first read of a loading batch
    /// missed (told apart by hash, then `Eq`, with no lock held); `None` if
    /// it missed none.
    fn wanted(&self, keys: &[K], found: &[Option<V>]) -> Option<Wanted<V>> {
        let mut missed: Vec<(u64, usize)> = (found.iter().enumerate())
            .filter(|(_, v)| v.is_none())
            .map(|(i, _)| (self.inner.hasher.hash_one(&keys[i]), i))
            .collect();
        if missed.is_empty() {
            return None;
        }
        // By hash, and each key's first position first.
        missed.sort_unstable();
        let mut w = Wanted {
            at: Vec::new(),
            hash: Vec::new(),
            value: Vec::new(),
            links: Vec::with_capacity(missed.len()),
        };
        // Where the distinct keys of the current hash begin.
        let mut run = 0;
        for (j, &(h, i)) in missed.iter().enumerate() {
            if j == 0 || missed[j - 1].0 != h {
                run = w.at.len();
            }
            let seen = (run..w.at.len()).find(|&x| keys[w.at[x]] == keys[i]);
            let x = seen.unwrap_or_else(|| {
                w.at.push(i);
                w.hash.push(h);
                w.value.push(None);
                w.at.len() - 1
            });
            w.links.push((i, x));
        }
        Some(w)
    }

    /// One look of a loading batch at the distinct keys it still lacks,
    /// under each of their shards' write lock once: a live value is taken
    /// (an access, as `begin_load`'s look), a key in flight elsewhere is
    /// returned to wait for, and, if `register`, every other key gets a new
    /// load flight of this call (`task`: an async call), guarded at once.
    ///
    /// A key with an `update` in flight may be left without a value by it
    /// (`Update::Keep` of an absent key), and then only this call's `load`
    /// can load it. So a pass that meets an update registers nothing: the
    /// flights it registered before it met one end at once with no value
    /// (their waiters look again), and the call waits, then looks again
    /// with its `load` unused.
    fn begin_many<'a>(
        &'a self,
        keys: &[K],
        wanted: &mut Wanted<V>,
        register: bool,
        task: bool,
    ) -> Pass<'a, K, V> {
        let inner = &*self.inner;
        let mut lacking: Vec<usize> = (0..wanted.at.len())
            .filter(|&w| wanted.value[w].is_none())
            .collect();
        lacking.sort_unstable_by_key(|&w| inner.shard_index(wanted.hash[w]));
        // The flights' own keys, cloned before any lock is taken; those not
        // needed are dropped after the last lock.
        let mut spares: Vec<Option<K>> = match register {
            true => (lacking.iter())
                .map(|&w| Some(keys[wanted.at[w]].clone()))
                .collect(),
            false => Vec::new(),
        };
        let mut spares = spares.iter_mut();
        // Declared before the locks: if user code panics under one, the
        // lock is released before these guards end their flights.
        let mut pass = Pass {
            own: Vec::new(),
            waits: Vec::new(),
        };
        let mut updates = false;
        let same_shard = |a: &usize, b: &usize| {
            inner.shard_index(wanted.hash[*a]) == inner.shard_index(wanted.hash[*b])
        };
        for group in lacking.chunk_by(same_shard) {
            let lock = inner.shard(wanted.hash[group[0]]);
            let (mut shard, now) = inner.write_now(wanted.hash[group[0]]);
            for &w in group {
                let spare = spares.next();
                let (h, key) = (wanted.hash[w], &keys[wanted.at[w]]);
                let hit = (shard.get_from(shard.start(h), h, key))
                    .filter(|f| f.access(now))
                    .map(|f| f.value.clone());
                if hit.is_some() {
                    wanted.value[w] = hit;
                    continue;
                }
                if let Some(other) = flight::find(&shard.flights, h, key) {
                    updates |= other.kind == Kind::Update;
                    pass.waits.push((w, other.clone()));
                    continue;
                }
                if updates {
                    continue;
                }
                if let Some(key) = spare.and_then(Option::take) {
                    let flight = Arc::new(Flight::new(key, h, Kind::Load, task));
                    shard.flights.push(flight.clone());
                    pass.own.push((w, FlightGuard::new(flight, lock)));
                }
            }
        }
        if updates {
            // No lock is held here: the guards unregister their flights.
            pass.own.clear();
        }
        pass
    }

    /// The keys handed to `load`: a copy of each key of `own`, in order
    /// (user `Clone`, no lock held).
    fn asked(keys: &[K], wanted: &Wanted<V>, own: &[(usize, FlightGuard<'_, K, V>)]) -> Vec<K> {
        own.iter()
            .map(|(w, _)| keys[wanted.at[*w]].clone())
            .collect()
    }

    /// The loader's side once `load` returned `r` for `asked` (the keys of
    /// `own`, in order): each value is stored as `end_load` stores it and
    /// handed to its flight's waiters; a failure is shared with them. Every
    /// flight of `own` has ended when this returns or unwinds.
    fn end_many<E>(
        &self,
        wanted: &mut Wanted<V>,
        asked: Vec<K>,
        ttl: Duration,
        r: Result<Vec<(K, V)>, E>,
        mut own: Vec<(usize, FlightGuard<'_, K, V>)>,
    ) -> Result<(), BulkError<E>>
    where
        E: Clone + Send + Sync + 'static,
    {
        let pairs = match r {
            Ok(pairs) => pairs,
            Err(e) => {
                let shared: flight::SharedError = unmodeled::Arc::new(e.clone());
                for (_, guard) in &mut own {
                    guard.failed(shared.clone());
                }
                drop(own);
                return Err(BulkError::Load(e));
            }
        };
        // Match each pair to the key asked (hash, then `Eq`); the first pair
        // of a key wins, and pairs of keys not asked are dropped here.
        let mut by_hash: Vec<(u64, usize)> = (own.iter().enumerate())
            .map(|(j, (w, _))| (wanted.hash[*w], j))
            .collect();
        by_hash.sort_unstable();
        let mut got: Vec<Option<V>> = own.iter().map(|_| None).collect();
        for (k, v) in pairs {
            let h = self.inner.hasher.hash_one(&k);
            let from = by_hash.partition_point(|e| e.0 < h);
            let j = (by_hash[from..].iter())
                .take_while(|e| e.0 == h)
                .map(|e| e.1)
                .find(|&j| got[j].is_none() && asked[j] == k);
            if let Some(j) = j {
                got[j] = Some(v);
            }
        }
        let mut missing = None;
        // By value: if a store unwinds, the guards left end their flights.
        for ((key, (w, mut guard)), v) in asked.into_iter().zip(own).zip(got) {
            match v {
                Some(v) => {
                    let r = self.end_load(key, Ttl::Given(ttl), Ok::<V, Infallible>(v), &mut guard);
                    wanted.value[w] = r.ok();
                }
                None => missing = missing.or(Some(wanted.at[w])),
            }
        }
        match missing {
            Some(index) => Err(BulkError::Missing { index }),
            None => Ok(()),
        }
    }

    /// A waiter's take from the flight of distinct key `w`, which ended:
    /// its value, or its error if of this call's type; otherwise the key
    /// stays lacking (look again).
    fn take_ended<E: Clone + 'static>(
        wanted: &mut Wanted<V>,
        w: usize,
        ended: Ended<V>,
    ) -> Result<(), BulkError<E>> {
        match Self::shared::<E>(ended) {
            Some(Ok(v)) => wanted.value[w] = Some(v),
            Some(Err(e)) => return Err(BulkError::Load(e)),
            None => {}
        }
        Ok(())
    }

    /// The batch's answer, in the keys' order: the first read's values and
    /// the loaded or waited-for ones (moved to a key's last position,
    /// cloned to the others).
    fn finish<E>(mut wanted: Wanted<V>, mut found: Vec<Option<V>>) -> Result<Vec<V>, BulkError<E>> {
        if let Some(x) = wanted.value.iter().position(Option::is_none) {
            return Err(BulkError::Missing {
                index: wanted.at[x],
            });
        }
        let mut uses = vec![0_usize; wanted.at.len()];
        for &(_, x) in &wanted.links {
            uses[x] += 1;
        }
        for &(i, x) in &wanted.links {
            uses[x] -= 1;
            found[i] = match uses[x] {
                0 => wanted.value[x].take(),
                _ => wanted.value[x].clone(),
            };
        }
        debug_assert!(found.iter().all(Option::is_some));
        Ok(found.into_iter().flatten().collect())
    }
}

//! Refresh ahead ([`Builder::refresh_after`](crate::map::Builder::refresh_after)):
//! a loading call that finds a live value written more than `d` ago returns
//! it and reloads the key, so that a key read through a loader is reloaded
//! before its deadline instead of missing at it.
//!
//! # Protocol
//!
//! * A shard of such a map keeps when each entry's value was written
//!   (`Nodes::born`, set by every write of the value under the write lock).
//!   A loading call's first look ([`look`](ExpireMap::look)) reads it with
//!   the value, under the read lock, and answers `Stale` when it is older
//!   than `d`.
//! * A reload is a load flight of the key (`flight`), registered under the
//!   write lock only if the entry is still live and stale there and no
//!   flight of the key runs ([`begin_refresh`](ExpireMap::begin_refresh)):
//!   so at most one reload per key runs, and a reload never starts over a
//!   value written since the look. Callers that hit never look at flights,
//!   so they get the current value without waiting; a caller that misses
//!   (the entry expired or was evicted meanwhile) waits for the reload's
//!   value, as for any load.
//! * The reload ends as any load does (`load::end_load`): its value is
//!   stored only if no write touched the key meanwhile (a write wins), and
//!   an error, a panic or a cancellation stores nothing, so the current
//!   value stays and a later call reloads again.
//! * Where it runs: in the call that found the value, or, with a
//!   [`refresh_spawner`](crate::map::Builder::refresh_spawner) and a loader that
//!   is `Send + 'static`, in a future handed to the spawner. The flight is
//!   registered before the future is handed over, and the future owns it
//!   from the start ([`Pending`]): a future the spawner drops unpolled
//!   still ends the flight, so no waiter waits for ever.

use super::flight::{self, FlightGuard};
use crate::map::expiry::Ttl;
use crate::map::monitor::LoadKind;
use crate::map::{ExpireMap, Inner};
use crate::sync::{Arc, AtomicU64, Ordering};
use std::borrow::Borrow;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::pin::Pin;

/// Where reloads run (`Builder::refresh_spawner`).
pub(in crate::map) type Spawner =
    std::sync::Arc<dyn Fn(Pin<Box<dyn Future<Output = ()> + Send>>) + Send + Sync>;

/// Counts a reload as failed when dropped, unless it succeeded.
struct Failure<'a> {
    count: &'a AtomicU64,
    ok: bool,
}

impl Drop for Failure<'_> {
    fn drop(&mut self) {
        if !self.ok {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A reload handed to the spawner: owns a handle to the map and the
/// registered flight until the future runs it, so that a future dropped
/// unpolled still ends the flight (and counts as a failed reload).
struct Pending<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    map: ExpireMap<K, V, S>,
    hash: u64,
    flight: Option<Arc<flight::Flight<K, V>>>,
}

impl<K, V, S> Drop for Pending<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    fn drop(&mut self) {
        if let Some(flight) = self.flight.take() {
            let inner: &Inner<K, V, S> = &self.map.inner;
            drop(FlightGuard::new(flight, inner.shard(self.hash)));
            inner.refresh_failures.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<K, V, S> ExpireMap<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// A loading call's first look: [`get`](Self::get), and in a map with
    /// refresh ahead whether the value is due a reload (`true`). Counted as
    /// `get` counts.
    #[inline(always)]
    pub(in crate::map) fn look<Q>(&self, key: &Q) -> Option<(V, bool)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.inner.config.refresh {
            None => self.get(key).map(|v| (v, false)),
            Some(after) => self.look_born(key, after),
        }
    }

    /// [`look`](Self::look) in a map with refresh ahead.
    #[inline(never)]
    fn look_born<Q>(&self, key: &Q, after: u64) -> Option<(V, bool)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let found = {
            let (shard, home, now) =
                inner.around(hash, |l| l.read(), |s| s.start(hash), |t, _| t.now());
            shard.get_born(home, hash, key).and_then(|(found, born)| {
                let stale = now.saturating_sub(born) > after;
                found.access(now).then(|| (found.value.clone(), stale))
            })
        };
        match found {
            Some(hit) => {
                self.count(true);
                Some(hit)
            }
            // Absent, expired, or expired by idle time: `get` settles it
            // (and counts it) as for any read.
            None => self.get(key).map(|v| (v, false)),
        }
    }

    /// A loading call whose first look found no fresh value (`looked`: a
    /// stale one, or none): reloads the stale value in this call and
    /// returns it, or loads the missing one. Out of line, so that a fresh
    /// hit costs what `get` does.
    #[inline(never)]
    pub(in crate::map) fn stale_or_load<E>(
        &self,
        key: K,
        ttl: Ttl,
        init: impl FnOnce() -> Result<V, E>,
        looked: Option<(V, bool)>,
    ) -> Result<V, E>
    where
        E: Clone + Send + Sync + 'static,
    {
        match looked {
            Some((v, _)) => {
                self.refresh_here(key, ttl, init);
                Ok(v)
            }
            None => self.load(key, ttl, init),
        }
    }

    /// [`stale_or_load`](Self::stale_or_load) whose reload goes to the
    /// map's spawner, if it has one.
    #[inline(never)]
    pub(in crate::map) fn stale_or_load_spawned<E, I>(
        &self,
        key: K,
        ttl: Ttl,
        init: I,
        looked: Option<(V, bool)>,
    ) -> Result<V, E>
    where
        I: FnOnce() -> Result<V, E> + Send + 'static,
        E: Clone + Send + Sync + 'static,
    {
        match looked {
            Some((v, _)) => {
                self.refresh_spawned(key, ttl, init);
                Ok(v)
            }
            None => self.load(key, ttl, init),
        }
    }

    /// Registers a reload of `key` (a load flight; `task`: run by an async
    /// task or a spawned future, not the calling thread) if its entry is
    /// still live and due a reload, and no flight of the key runs.
    pub(in crate::map) fn begin_refresh(
        &self,
        hash: u64,
        key: &K,
        task: bool,
    ) -> Option<Arc<flight::Flight<K, V>>> {
        let after = self.inner.config.refresh?;
        // The flight's copy of the key, made before the lock (and dropped
        // after it, if not needed).
        let mut spare = Some(key.clone());
        let flight = {
            let (mut shard, now) = self.inner.write_now(hash);
            let due = shard
                .get_born(shard.start(hash), hash, key)
                .is_some_and(|(f, born)| now <= f.deadline && now.saturating_sub(born) > after);
            if due && flight::find(&shard.flights, hash, key).is_none() {
                let key = spare.take().expect("registered once");
                let flight = Arc::new(flight::Flight::new(key, hash, flight::Kind::Load, task));
                shard.flights.push(flight.clone());
                Some(flight)
            } else {
                None
            }
        };
        drop(spare);
        if flight.is_some() {
            self.inner.refreshes.fetch_add(1, Ordering::Relaxed);
        }
        flight
    }

    /// Reloads `key` in this call, if no other reload of it runs: `init`
    /// runs here and its value is stored as a load's (see the module docs).
    #[cold]
    #[inline(never)]
    pub(in crate::map) fn refresh_here<E>(
        &self,
        key: K,
        ttl: Ttl,
        init: impl FnOnce() -> Result<V, E>,
    ) where
        E: Clone + Send + Sync + 'static,
    {
        let hash = self.inner.hasher.hash_one(&key);
        let Some(flight) = self.begin_refresh(hash, &key, false) else {
            return;
        };
        let mut guard = FlightGuard::new(flight, self.inner.shard(hash));
        let mut failure = Failure {
            count: &self.inner.refresh_failures,
            ok: false,
        };
        let watch = self.inner.load_watch(LoadKind::Reload, hash, 1);
        let r = watch.run(init);
        watch.end(r.is_ok());
        failure.ok = self.end_load(key, ttl, r, &mut guard).is_ok();
    }

    /// [`refresh_here`](Self::refresh_here) with a future: awaited here.
    pub(in crate::map) async fn refresh_here_async<F, E>(&self, key: K, ttl: Ttl, init: F)
    where
        F: Future<Output = Result<V, E>>,
        E: Clone + Send + Sync + 'static,
    {
        let hash = self.inner.hasher.hash_one(&key);
        let Some(flight) = self.begin_refresh(hash, &key, true) else {
            return;
        };
        let mut guard = FlightGuard::new(flight, self.inner.shard(hash));
        let mut failure = Failure {
            count: &self.inner.refresh_failures,
            ok: false,
        };
        let r = self.run_async_load(key, ttl, init, &mut guard, LoadKind::Reload);
        failure.ok = r.await.is_ok();
    }

    /// Reloads `key` on the map's spawner if it has one (the call returns
    /// at once), else in this call.
    #[cold]
    #[inline(never)]
    pub(in crate::map) fn refresh_spawned<E, I>(&self, key: K, ttl: Ttl, init: I)
    where
        I: FnOnce() -> Result<V, E> + Send + 'static,
        E: Clone + Send + Sync + 'static,
    {
        if self.inner.spawner.is_none() {
            return self.refresh_here(key, ttl, init);
        }
        // With a spawner there is nothing left to run here.
        let spawned = self.refresh_spawned_async(key, ttl, async move { init() });
        debug_assert!(spawned.is_none());
    }

    /// [`refresh_spawned`](Self::refresh_spawned) with a future: spawned,
    /// or (no spawner) returned for the caller to await here.
    pub(in crate::map) fn refresh_spawned_async<F, E>(
        &self,
        key: K,
        ttl: Ttl,
        init: F,
    ) -> Option<impl Future<Output = ()> + '_>
    where
        F: Future<Output = Result<V, E>> + Send + 'static,
        E: Clone + Send + Sync + 'static,
    {
        let Some(spawn) = self.inner.spawner.clone() else {
            return Some(self.refresh_here_async(key, ttl, init));
        };
        let hash = self.inner.hasher.hash_one(&key);
        let flight = self.begin_refresh(hash, &key, true)?;
        let pending = Pending {
            map: self.clone(),
            hash,
            flight: Some(flight),
        };
        spawn(Box::pin(async move {
            let mut pending = pending;
            let flight = pending.flight.take().expect("run once");
            let map = &pending.map;
            let mut guard = FlightGuard::new(flight, map.inner.shard(hash));
            let mut failure = Failure {
                count: &map.inner.refresh_failures,
                ok: false,
            };
            let r = map.run_async_load(key, ttl, init, &mut guard, LoadKind::Reload);
            failure.ok = r.await.is_ok();
        }));
        None
    }
}

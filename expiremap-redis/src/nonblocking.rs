//! The async API: the same calls as futures that await their reply instead
//! of parking the thread. No runtime: the cache's reader thread completes
//! the waker of a call when its reply is applied, and the supervisor thread
//! wakes a call whose call timeout has passed. A near hit completes on the
//! first poll.
//!
//! `get_or_insert_with_async` has a single flight of its own per key among
//! the async callers of one cache ([`Flights`]), keyed by the Redis key's
//! bytes, so that no `Hash` or `Eq` of the user's key runs under its lock.

use crate::error::Error;
use crate::lease;
use crate::monitor::{self, Counters};
use crate::script::{self, Leased};
use crate::{CacheKey, CacheValue, NearCache, codec};
use std::any::Any;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// How a flight ended, shared by its waiters (behind an `Arc`: a waiter
/// clones the value out with no lock held).
enum Outcome<V> {
    Value(V),
    /// The leader's error, as its `E`; a waiter with another `E` leads a
    /// flight of its own.
    Error(Box<dyn Any + Send + Sync>),
    /// The leader's future was dropped (or panicked) before it ended.
    Abandoned,
}

struct FlightState<V> {
    done: Option<Arc<Outcome<V>>>,
    wakers: Vec<Waker>,
}

struct Flight<V> {
    state: Mutex<FlightState<V>>,
}

impl<V> Flight<V> {
    fn lock(&self) -> MutexGuard<'_, FlightState<V>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The loads in flight of `get_or_insert_with_async`, by Redis key.
pub(crate) struct Flights<V> {
    map: Mutex<HashMap<Vec<u8>, Arc<Flight<V>>>>,
}

impl<V> Flights<V> {
    pub(crate) fn new() -> Self {
        Flights {
            map: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Arc<Flight<V>>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins the flight of `name`, or starts one (`true`: this caller leads).
    fn join(&self, name: &[u8]) -> (Arc<Flight<V>>, bool) {
        let mut map = self.lock();
        match map.entry(name.to_vec()) {
            Entry::Occupied(e) => (Arc::clone(e.get()), false),
            Entry::Vacant(e) => {
                let f = Arc::new(Flight {
                    state: Mutex::new(FlightState {
                        done: None,
                        wakers: Vec::new(),
                    }),
                });
                e.insert(Arc::clone(&f));
                (f, true)
            }
        }
    }
}

/// The leader's hold on its flight: ends it (and wakes the waiters) when
/// dropped, as `Abandoned` unless [`Lead::finish`] said otherwise.
struct Lead<'a, V> {
    flights: &'a Flights<V>,
    name: Vec<u8>,
    flight: Arc<Flight<V>>,
    outcome: Option<Outcome<V>>,
}

impl<V> Lead<'_, V> {
    fn finish(mut self, o: Outcome<V>) {
        self.outcome = Some(o);
    }
}

impl<V> Drop for Lead<'_, V> {
    fn drop(&mut self) {
        let outcome = Arc::new(self.outcome.take().unwrap_or(Outcome::Abandoned));
        // Out of the table first (a new caller starts a new flight), then
        // done; what is dropped is dropped after the locks.
        let removed = self.flights.lock().remove(&self.name);
        let wakers = {
            let mut st = self.flight.lock();
            st.done = Some(outcome);
            std::mem::take(&mut st.wakers)
        };
        drop(removed);
        wakers.into_iter().for_each(Waker::wake);
    }
}

/// Awaits the end of a flight.
struct Landing<V>(Arc<Flight<V>>);

impl<V> Future for Landing<V> {
    type Output = Arc<Outcome<V>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let waker = cx.waker().clone();
        let mut st = self.0.lock();
        if let Some(o) = &st.done {
            let o = Arc::clone(o);
            drop(st);
            return Poll::Ready(o);
        }
        // The older wakers of this task stay listed (a few, then woken
        // together); a clone per poll keeps runtime code off our lock.
        st.wakers.push(waker);
        Poll::Pending
    }
}

impl<K: CacheKey, V: CacheValue> NearCache<K, V> {
    /// [`get`](Self::get) as a future: a near hit is ready on the first
    /// poll; a miss awaits its reply (no thread parked), at most the call
    /// timeout (the timeout is noticed within 50 ms of it).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), expiremap_redis::Error> {
    /// use expiremap_redis::NearCache;
    /// use std::time::Duration;
    ///
    /// let cache: NearCache<String, u64> = NearCache::builder("redis://127.0.0.1:6379").build()?;
    /// cache.put_async("alice".to_string(), 42, Duration::from_secs(60)).await?;
    /// assert_eq!(cache.get_async(&"alice".to_string()).await?, Some(42));
    /// # Ok(()) }
    /// ```
    pub async fn get_async(&self, key: &K) -> Result<Option<V>, Error> {
        if let Some(v) = self.near_read(key)? {
            return Ok(Some(v));
        }
        self.links
            .run_async(key, &self.prefix, |l, hop| l.fetch(key, hop))
            .await
    }

    /// [`put`](Self::put) as a future.
    pub async fn put_async(&self, key: K, value: V, ttl: Duration) -> Result<(), Error> {
        if ttl.is_zero() {
            return Ok(());
        }
        self.links
            .run_async(&key, &self.prefix, |l, hop| {
                l.set(key.clone(), value.clone(), ttl, false, hop)
            })
            .await
            .map(drop)
    }

    /// [`remove`](Self::remove) as a future.
    pub async fn remove_async(&self, key: &K) -> Result<Option<V>, Error> {
        self.links
            .run_async(key, &self.prefix, |l, hop| l.del(key, hop))
            .await
    }

    /// [`get_or_insert_with`](Self::get_or_insert_with) with an `init`
    /// future, awaited only if Redis has no value. At most one async caller
    /// per key of this cache awaits its `init` at a time (the others await
    /// its value); if that caller's future is dropped before it ends, one
    /// of the others takes over with its own `init`. (The blocking
    /// `get_or_insert_with` has a single flight of its own.)
    ///
    /// `init` must not await this cache's `get_or_insert_with_async` for
    /// the same key: it would wait for itself.
    pub async fn get_or_insert_with_async(
        &self,
        key: K,
        ttl: Duration,
        init: impl Future<Output = V>,
    ) -> Result<V, Error> {
        self.try_get_or_insert_with_async(key, ttl, async { Ok::<V, Error>(init.await) })
            .await
    }

    /// [`get_or_insert_with_async`](Self::get_or_insert_with_async) with an
    /// `init` that may fail: nothing is stored, and its error goes to its
    /// caller and to the async callers waiting for it (a clone each; a
    /// waiter whose error type is another leads a load of its own). Errors
    /// of the cache itself are turned into `E` with `From<Error>`.
    pub async fn try_get_or_insert_with_async<E>(
        &self,
        key: K,
        ttl: Duration,
        init: impl Future<Output = Result<V, E>>,
    ) -> Result<V, E>
    where
        E: From<Error> + Clone + Send + Sync + 'static,
    {
        let name = codec::redis_key(&self.prefix, &key).map_err(Error::from)?;
        let mut init = Some(init);
        loop {
            if let Some(v) = self.get_async(&key).await? {
                return Ok(v);
            }
            let (flight, leader) = self.flights.join(&name);
            if !leader {
                let outcome = Landing(flight).await;
                match &*outcome {
                    Outcome::Value(v) => return Ok(v.clone()),
                    Outcome::Error(e) => {
                        if let Some(e) = e.downcast_ref::<E>() {
                            return Err(e.clone());
                        }
                    }
                    Outcome::Abandoned => {}
                }
                continue;
            }
            let lead = Lead {
                flights: &self.flights,
                name: name.clone(),
                flight,
                outcome: None,
            };
            let span = monitor::LoadSpan::new(|| Some(name.clone()), self.lease_ttl.is_some());
            let r = span
                .run_async(self.load_async(&key, ttl, init.take()))
                .await;
            span.end(r.is_ok());
            lead.finish(match &r {
                Ok(v) => Outcome::Value(v.clone()),
                Err(e) => Outcome::Error(Box::new(e.clone())),
            });
            return r;
        }
    }

    /// [`NearCache::load_leased`] awaiting. A future dropped while it holds
    /// the lease gives it back.
    async fn load_leased_async<E>(
        &self,
        key: &K,
        ttl: Duration,
        lease_ttl: Duration,
        init: Option<impl Future<Output = Result<V, E>>>,
    ) -> Result<V, E>
    where
        E: From<Error>,
    {
        let name = self.lease_name(key)?;
        let token = script::token();
        // Armed while a take is in flight too (see `load_leased`): a take
        // that fails, or whose future is dropped, may still land.
        let mut release = lease::Release {
            links: &self.links,
            prefix: &self.prefix,
            key,
            token: &token,
            armed: false,
        };
        let mut waited = false;
        loop {
            let wait = self.waiters.register(name.clone());
            release.armed = true;
            let found = self
                .links
                .run_async(key, &self.prefix, |l, hop| {
                    l.lease(key, &token, lease_ttl, hop)
                })
                .await?;
            release.armed = matches!(found, Leased::Mine);
            match found {
                Leased::Value(v) => return Ok(v),
                Leased::Mine => {
                    if waited {
                        Counters::add(&self.monitor.lease_takeovers);
                    }
                    break;
                }
                Leased::Held(left) => {
                    Counters::add(&self.monitor.lease_waits);
                    waited = true;
                    let patience = lease::patience(left, lease_ttl);
                    let wait = wait.until(patience);
                    #[cfg(feature = "tracing")]
                    let wait = tracing::Instrument::instrument(
                        wait,
                        monitor::lease_wait_span(&name, patience),
                    );
                    wait.await
                }
            }
        }
        let init = init.expect("a caller leads at most once");
        let v = init.await?;
        if !ttl.is_zero() {
            self.links
                .run_multi_async(key, &self.prefix, |l, hop| {
                    l.store_leased(key.clone(), v.clone(), ttl, &token, hop)
                })
                .await?;
            release.armed = false;
        }
        Ok(v)
    }

    /// The leader's load: Redis once more (a value may have come since),
    /// then `init`, stored with `SET ... NX`.
    async fn load_async<E>(
        &self,
        key: &K,
        ttl: Duration,
        init: Option<impl Future<Output = Result<V, E>>>,
    ) -> Result<V, E>
    where
        E: From<Error>,
    {
        if let Some(lease_ttl) = self.lease_ttl {
            return self.load_leased_async(key, ttl, lease_ttl, init).await;
        }
        let fetched = self
            .links
            .run_async(key, &self.prefix, |l, hop| l.fetch(key, hop))
            .await?;
        if let Some(v) = fetched {
            return Ok(v);
        }
        let init = init.expect("a caller leads at most once");
        let v = init.await?;
        if !ttl.is_zero() {
            self.links
                .run_async(key, &self.prefix, |l, hop| {
                    l.set(key.clone(), v.clone(), ttl, true, hop)
                })
                .await?;
        }
        Ok(v)
    }
}

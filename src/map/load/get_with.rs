//! moka's loaders, with the map's own expiry: `get_with`, `try_get_with`
//! (errors shared as `Arc<E>`), `optionally_get_with`, their async forms
//! and `get_with_by_ref`. Each is a `get`, then on a miss the same single
//! flight per key as `get_or_insert_with` (`load`), whose value is stored
//! with the TTL of [`Builder::expire_after`](crate::map::Builder::expire_after)
//! or [`Builder::time_to_live`](crate::map::Builder::time_to_live).

use crate::map::ExpireMap;
use crate::map::expiry::Ttl;
use std::borrow::Borrow;
use std::convert::Infallible;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

/// The "error" of an `optionally_get_with` load whose `init` returned
/// `None`: shared with its waiters like an error, so that they return
/// `None` too instead of loading again.
#[derive(Clone, Copy)]
struct NoValue;

impl<K, V, S> ExpireMap<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// The live value for `key`, or the value `init` makes for it, stored
    /// with the map's own expiry (its
    /// [`expire_after`](crate::map::Builder::expire_after) policy, else its
    /// [`time_to_live`](crate::map::Builder::time_to_live), else none): moka's
    /// `get_with`. One caller per key runs `init` at a time and the others
    /// wait for its value, exactly as
    /// [`get_or_insert_with`](Self::get_or_insert_with), which takes the
    /// TTL per call. A hit costs what `get` costs.
    ///
    /// `init` is `Send + 'static` because with
    /// [`refresh_after`](crate::map::Builder::refresh_after) and a
    /// [`refresh_spawner`](crate::map::Builder::refresh_spawner) the reload it
    /// makes may run after this call returns (move what it needs into it);
    /// `get_or_insert_with` takes any closure and reloads in the caller.
    ///
    /// ```
    /// use expiremap::{ExpireMap, ManualClock};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let users: ExpireMap<u32, String> = ExpireMap::builder()
    ///     .clock(clock.clone())
    ///     .time_to_live(Duration::from_secs(60))
    ///     .build();
    /// assert_eq!(users.get_with(7, || "ada".to_string()), "ada");
    /// assert_eq!(users.get_with(7, || unreachable!()), "ada"); // a hit
    /// assert_eq!(users.ttl(&7), Some(Duration::from_secs(60)));
    /// ```
    pub fn get_with(&self, key: K, init: impl FnOnce() -> V + Send + 'static) -> V {
        match self.look(&key) {
            Some((v, false)) => v,
            looked => {
                let init = move || Ok::<V, Infallible>(init());
                match self.stale_or_load_spawned(key, Ttl::Own, init, looked) {
                    Ok(v) => v,
                    Err(never) => match never {},
                }
            }
        }
    }

    /// [`get_with`](Self::get_with) by reference, where `K: Borrow<Q>`:
    /// the owned key is made (`ToOwned`) only on a miss, so a hit
    /// allocates nothing for a `String` key.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    ///
    /// let lens: ExpireMap<String, usize> = ExpireMap::new();
    /// assert_eq!(lens.get_with_by_ref("four", || 4), 4);
    /// assert_eq!(lens.get_with_by_ref("four", || unreachable!()), 4);
    /// ```
    pub fn get_with_by_ref<Q>(&self, key: &Q, init: impl FnOnce() -> V + Send + 'static) -> V
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self.look(key) {
            Some((v, false)) => v,
            looked => {
                let init = move || Ok::<V, Infallible>(init());
                match self.stale_or_load_spawned(key.to_owned(), Ttl::Own, init, looked) {
                    Ok(v) => v,
                    Err(never) => match never {},
                }
            }
        }
    }

    /// [`get_with`](Self::get_with) with an `init` that may fail: moka's
    /// `try_get_with`. Nothing is stored on an error, which its caller and
    /// every caller waiting for that load through `try_get_with` (or
    /// `try_get_with_async`) with the same `E` share as one `Arc<E>`: `E`
    /// need not be `Clone` (an `std::io::Error` will do). A waiter whose
    /// call has another error type runs its own `init`; callers that come
    /// after the failure load again.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::sync::Arc;
    ///
    /// let map: ExpireMap<u32, String> = ExpireMap::new();
    /// let down = || Err(std::io::Error::other("backend down"));
    /// let e: Arc<std::io::Error> = map.try_get_with(1, down).unwrap_err();
    /// assert_eq!(e.to_string(), "backend down");
    /// assert_eq!(map.get(&1), None);
    /// assert_eq!(map.try_get_with(1, || Ok::<_, std::io::Error>("one".to_string())).unwrap(), "one");
    /// ```
    pub fn try_get_with<E>(
        &self,
        key: K,
        init: impl FnOnce() -> Result<V, E> + Send + 'static,
    ) -> Result<V, Arc<E>>
    where
        E: Send + Sync + 'static,
    {
        match self.look(&key) {
            Some((v, false)) => Ok(v),
            looked => {
                let init = move || init().map_err(Arc::new);
                self.stale_or_load_spawned(key, Ttl::Own, init, looked)
            }
        }
    }

    /// [`get_with`](Self::get_with) with an `init` that may find nothing:
    /// moka's `optionally_get_with`. `None` stores nothing and is what the
    /// callers waiting for that load get too; callers that come after it
    /// load again.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    ///
    /// let map: ExpireMap<u32, String> = ExpireMap::new();
    /// assert_eq!(map.optionally_get_with(1, || None), None);
    /// assert_eq!(map.get(&1), None);
    /// assert_eq!(map.optionally_get_with(1, || Some("one".to_string())).as_deref(), Some("one"));
    /// ```
    pub fn optionally_get_with(
        &self,
        key: K,
        init: impl FnOnce() -> Option<V> + Send + 'static,
    ) -> Option<V> {
        match self.look(&key) {
            Some((v, false)) => Some(v),
            looked => {
                let init = move || init().ok_or(NoValue);
                self.stale_or_load_spawned(key, Ttl::Own, init, looked).ok()
            }
        }
    }

    /// The async form of [`get_with`](Self::get_with): a hit returns
    /// without polling `init`; async and blocking callers of one key share
    /// one flight, and no thread parks on behalf of an async caller (see
    /// [`get_or_insert_with_async`](Self::get_or_insert_with_async), whose
    /// rules it follows: a dropped future hands the load over).
    ///
    /// ```
    /// use expiremap::ExpireMap;
    ///
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     use std::task::{Context, Poll, Waker};
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = Context::from_waker(Waker::noop());
    /// #     loop { if let Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// let map: ExpireMap<u32, String> = ExpireMap::new();
    /// let v = block_on(map.get_with_async(1, async { "one".to_string() }));
    /// assert_eq!(v, "one");
    /// ```
    pub async fn get_with_async<F>(&self, key: K, init: F) -> V
    where
        F: Future<Output = V> + Send + 'static,
    {
        if let Some((v, stale)) = self.look(&key) {
            if stale {
                let init = async { Ok::<V, Infallible>(init.await) };
                if let Some(here) = self.refresh_spawned_async(key, Ttl::Own, init) {
                    here.await;
                }
            }
            return v;
        }
        let init = async { Ok::<V, Infallible>(init.await) };
        match self.load_async(key, Ttl::Own, init).await {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }

    /// The async form of [`try_get_with`](Self::try_get_with): the error
    /// is shared as one `Arc<E>` with the callers waiting for the load,
    /// blocking or async, whose call has the same `E`.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    ///
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     use std::task::{Context, Poll, Waker};
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = Context::from_waker(Waker::noop());
    /// #     loop { if let Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// let map: ExpireMap<u32, u32> = ExpireMap::new();
    /// let r = block_on(map.try_get_with_async(1, async { Err(std::io::Error::other("down")) }));
    /// assert_eq!(r.unwrap_err().to_string(), "down");
    /// let r = block_on(map.try_get_with_async(1, async { Ok::<_, std::io::Error>(1) }));
    /// assert_eq!(r.unwrap(), 1);
    /// ```
    pub async fn try_get_with_async<F, E>(&self, key: K, init: F) -> Result<V, Arc<E>>
    where
        F: Future<Output = Result<V, E>> + Send + 'static,
        E: Send + Sync + 'static,
    {
        if let Some((v, stale)) = self.look(&key) {
            if stale {
                let init = async { init.await.map_err(Arc::new) };
                if let Some(here) = self.refresh_spawned_async(key, Ttl::Own, init) {
                    here.await;
                }
            }
            return Ok(v);
        }
        let init = async { init.await.map_err(Arc::new) };
        self.load_async(key, Ttl::Own, init).await
    }

    /// The async form of [`optionally_get_with`](Self::optionally_get_with).
    ///
    /// ```
    /// use expiremap::ExpireMap;
    ///
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     use std::task::{Context, Poll, Waker};
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = Context::from_waker(Waker::noop());
    /// #     loop { if let Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// let map: ExpireMap<u32, u32> = ExpireMap::new();
    /// assert_eq!(block_on(map.optionally_get_with_async(1, async { None })), None);
    /// assert_eq!(block_on(map.optionally_get_with_async(1, async { Some(1) })), Some(1));
    /// ```
    pub async fn optionally_get_with_async<F>(&self, key: K, init: F) -> Option<V>
    where
        F: Future<Output = Option<V>> + Send + 'static,
    {
        if let Some((v, stale)) = self.look(&key) {
            if stale {
                let init = async { init.await.ok_or(NoValue) };
                if let Some(here) = self.refresh_spawned_async(key, Ttl::Own, init) {
                    here.await;
                }
            }
            return Some(v);
        }
        let init = async { init.await.ok_or(NoValue) };
        self.load_async(key, Ttl::Own, init).await.ok()
    }
}

//! The map's own expiry: the TTL a call uses when it names none
//! (`insert`, `try_insert`, `get_with` and the other loaders without a
//! `ttl` argument). In order: the [`Expiry`] policy of
//! [`Builder::expire_after`](super::Builder::expire_after), else
//! [`Builder::time_to_live`](super::Builder::time_to_live), else none.
//!
//! The policy is user code: it runs before the shard lock is taken, never
//! under it. A write whose policy needs the entry's remaining time (an
//! `insert` over a live entry) reads it first, runs the policy, and
//! commits only if the entry's deadline is still the one it read
//! (`write::PutIf::Seen`), else reads and asks again: the policy may run
//! more than once when writes of one key race, and the deadline stored is
//! always the one it computed from the entry it replaces.

use super::ExpireMap;
use super::load::flight;
use super::store::shard::Door;
use super::write::{NotStored, PutIf};
use crate::clock::Time;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

/// How long an entry lives, computed from its key and value (moka's
/// `Expiry`, `cached`'s `Expires`): an HTTP response's `max-age`, a DNS
/// record's TTL, a session's own expiry.
///
/// Set with [`Builder::expire_after`](super::Builder::expire_after). The
/// map asks it whenever a write names no TTL: [`ExpireMap::insert`],
/// [`ExpireMap::try_insert`], and the loaders without a `ttl` argument
/// ([`ExpireMap::get_with`] and kin). Calls that take a `ttl`
/// (`put`, `get_or_insert_with`, ...) use theirs.
///
/// Each method returns the time to live from now: `None` for no expiry,
/// and a zero [`Duration`] for "already expired": nothing is stored, and a
/// live entry of the key leaves as [`Cause::Expired`](super::Cause::Expired)
/// (unlike a zero `ttl` given to [`put`](ExpireMap::put), which is
/// ignored). The methods run outside every lock and may run more than once
/// for one write when writes of the same key race (each run sees the
/// entry the write then replaces). A panic in them reaches the caller of
/// the write, and nothing is stored.
///
/// moka's `Expiry` also has `expire_after_read`; this one has not: no
/// policy runs on a read. For deadlines that slide with reads, use
/// [`Builder::time_to_idle`](super::Builder::time_to_idle) (an entry
/// expires at the earlier of its write deadline and its last access plus
/// the idle time).
///
/// ```
/// use expiremap::{ExpireMap, Expiry, ManualClock};
/// use std::time::Duration;
///
/// #[derive(Clone)]
/// struct Response { body: String, max_age: Duration }
///
/// struct MaxAge;
/// impl Expiry<String, Response> for MaxAge {
///     fn expire_after_create(&self, _url: &String, r: &Response) -> Option<Duration> {
///         Some(r.max_age)
///     }
/// }
///
/// let clock = ManualClock::new();
/// let cache: ExpireMap<String, Response> =
///     ExpireMap::builder().clock(clock.clone()).expire_after(MaxAge).build();
/// let r = Response { body: "<html>".into(), max_age: Duration::from_secs(300) };
/// cache.insert("/index".to_string(), r);
/// assert_eq!(cache.ttl("/index"), Some(Duration::from_secs(300)));
/// ```
pub trait Expiry<K, V>: Send + Sync + 'static {
    /// The time to live of a new entry (no live entry of `key` was there).
    /// The default: no expiry.
    fn expire_after_create(&self, key: &K, value: &V) -> Option<Duration> {
        let _ = (key, value);
        None
    }

    /// The time to live of `value` written over a live entry whose
    /// remaining time is `current` (`None`: the entry does not expire).
    /// The default keeps the entry's deadline.
    fn expire_after_update(
        &self,
        key: &K,
        value: &V,
        current: Option<Duration>,
    ) -> Option<Duration> {
        let _ = (key, value);
        current
    }
}

/// A key and value the capacity bound declined to admit, handed back by
/// [`ExpireMap::try_put`] and [`ExpireMap::try_insert`].
#[derive(Clone, PartialEq, Eq)]
pub struct Refused<K, V> {
    /// The key that was not stored.
    pub key: K,
    /// The value that was not stored.
    pub value: V,
}

impl<K, V> fmt::Debug for Refused<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refused").finish_non_exhaustive()
    }
}

impl<K, V> fmt::Display for Refused<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the capacity bound declined to admit the entry")
    }
}

impl<K, V> std::error::Error for Refused<K, V> {}

/// The TTL a write uses.
#[derive(Clone, Copy, Debug)]
pub(super) enum Ttl {
    /// The call's own.
    Given(Duration),
    /// The map's: the policy's, else `time_to_live`, else none.
    Own,
}

/// A policy's answer as a TTL for `put`: `None` (no expiry) is the
/// largest, which saturates the deadline.
fn ttl_of(d: Option<Duration>) -> Duration {
    d.unwrap_or(Duration::MAX)
}

impl<K, V, S> ExpireMap<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// The TTL `ttl` stands for, for a new entry `key`, `value` (a zero:
    /// store nothing).
    pub(super) fn ttl_for_new(&self, ttl: Ttl, key: &K, value: &V) -> Duration {
        match (ttl, &self.inner.expiry) {
            (Ttl::Given(d), _) => d,
            (Ttl::Own, Some(e)) => ttl_of(e.expire_after_create(key, value)),
            (Ttl::Own, None) => self.inner.config.time_to_live,
        }
    }

    /// Inserts or overwrites `key` with the map's own expiry: the
    /// [`expire_after`](super::Builder::expire_after) policy's TTL, else
    /// [`time_to_live`](super::Builder::time_to_live)'s, else none (the
    /// deadline saturates: the entry stays until removed, replaced, or
    /// pushed out by a bound). Returns the previous live value, as
    /// [`put`](Self::put) does. A zero TTL from the policy stores nothing
    /// and expires a live entry of the key (it leaves as
    /// [`Cause::Expired`](super::Cause::Expired) and `None` is returned).
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
        if self.inner.expiry.is_none() {
            return self.put(key, value, self.inner.config.time_to_live);
        }
        self.write_own(key, value, false).unwrap_or(None)
    }

    /// [`insert`](Self::insert) that hands the key and value back when the
    /// capacity bound declines to admit them (quick_cache's `try_insert`):
    /// `Err` then, and nothing is published for them. `Ok` holds what
    /// `insert` returns. A map without a bound never refuses.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    ///
    /// let map: ExpireMap<u32, &str> = ExpireMap::builder().shards(1).max_entries(1).build();
    /// assert_eq!(map.try_insert(1, "one"), Ok(None));
    /// for _ in 0..3 {
    ///     map.get(&1); // 1 is asked for, 2 never was
    /// }
    /// let refused = map.try_insert(2, "two").unwrap_err();
    /// assert_eq!((refused.key, refused.value), (2, "two"));
    /// assert_eq!(map.get(&1), Some("one"));
    /// ```
    pub fn try_insert(&self, key: K, value: V) -> Result<Option<V>, Refused<K, V>> {
        self.write_own(key, value, true)
            .map_err(|(key, value)| Refused { key, value })
    }

    /// [`put`](Self::put) that hands the key and value back when the
    /// capacity bound declines to admit them: `Err` then, and nothing is
    /// published for them (a plain `put` publishes them as
    /// [`Cause::Size`](super::Cause::Size)). `Ok` holds what `put` returns;
    /// a zero `ttl` is ignored as by `put` (`Ok(None)`, nothing changes).
    pub fn try_put(&self, key: K, value: V, ttl: Duration) -> Result<Option<V>, Refused<K, V>> {
        if ttl.is_zero() {
            return Ok(None);
        }
        match self.put_cond(key, value, ttl, PutIf::Always, true) {
            Ok(old) => Ok(old),
            Err(NotStored::Refused(key, value) | NotStored::Stale(key, value)) => {
                Err(Refused { key, value })
            }
        }
    }

    /// `key`'s live entry as a write with the map's expiry sees it: the
    /// time left to its write deadline, for the policy (`None` inside: no
    /// expiry; idle expiry is not the policy's: it restarts with the
    /// write), and that deadline, which the commit checks. Not an access.
    fn seen(&self, key: &K) -> Option<(Option<Duration>, u64)> {
        self.lookup(key, Time::now, |now, found| {
            // Live: `now <= deadline <= write`, so the subtraction holds.
            (now <= found.deadline).then(|| {
                let left =
                    (found.write != u64::MAX).then(|| Duration::from_nanos(found.write - now));
                (left, found.write)
            })
        })
    }

    /// A write of `key` with the map's own expiry: `put` with its TTL, or,
    /// with an [`Expiry`] policy, the policy's TTL for the entry it
    /// replaces, committed only over that entry (see the module docs). A
    /// zero from the policy stores nothing and expires a live entry of the
    /// key. `give_back`: a value the bound refuses comes back as `Err`,
    /// unpublished.
    pub(super) fn write_own(
        &self,
        mut key: K,
        mut value: V,
        give_back: bool,
    ) -> Result<Option<V>, (K, V)> {
        let Some(policy) = self.inner.expiry.clone() else {
            let ttl = self.inner.config.time_to_live;
            return match self.put_cond(key, value, ttl, PutIf::Always, give_back) {
                Ok(old) => Ok(old),
                Err(NotStored::Refused(k, v) | NotStored::Stale(k, v)) => Err((k, v)),
            };
        };
        loop {
            let seen = self.seen(&key);
            let d = match seen {
                None => policy.expire_after_create(&key, &value),
                Some((current, _)) => policy.expire_after_update(&key, &value, current),
            };
            let seen = seen.map(|(_, write)| write);
            if d.is_some_and(|d| d.is_zero()) {
                if self.expire_if_seen(&key, seen) {
                    return Ok(None);
                }
                continue;
            }
            match self.put_cond(key, value, ttl_of(d), PutIf::Seen(seen), give_back) {
                Ok(old) => return Ok(old),
                Err(NotStored::Refused(k, v)) => return Err((k, v)),
                // Another write of the key landed since it was read: ask
                // the policy again about the entry there now.
                Err(NotStored::Stale(k, v)) => (key, value) = (k, v),
            }
        }
    }

    /// Removes `key`'s live entry as expired, unless a write touched the
    /// key since `load` began (then that write stands): a load or reload
    /// whose policy said zero.
    pub(super) fn expire_untouched(&self, key: &K, load: &flight::Flight<K, V>) {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let (removed, now) = {
            let (mut shard, now) = inner.write_key(hash, key, true);
            if load.touched() {
                return;
            }
            (shard.remove(hash, key, now), now)
        };
        if let Some(mut r) = removed {
            r.door = Door::Expired;
            inner.leave(r, now);
        }
    }

    /// Removes `key`'s live entry as expired if its write deadline is
    /// still `seen` (`None`: there was none, and nothing is done).
    /// `false`: it changed; read again.
    fn expire_if_seen(&self, key: &K, seen: Option<u64>) -> bool {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let (removed, now) = {
            let (mut shard, now) = inner.write_key(hash, key, false);
            if shard.live_write(hash, key, now) != seen {
                return false;
            }
            if seen.is_none() {
                return true;
            }
            (shard.remove(hash, key, now), now)
        };
        if let Some(mut r) = removed {
            r.door = Door::Expired;
            inner.leave(r, now);
        }
        true
    }
}

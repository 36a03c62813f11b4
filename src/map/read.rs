//! The read path: `get`, `get_with_ttl`, `ttl` and `contains_key` under
//! the shard's read lock, and what a read does when it finds an entry
//! expired by its idle time (confirms it under the write lock).
//!
//! May call the shard's lookups and the clock adapter; runs the user's
//! `Eq` (the probe) and `V::clone` (the answer) under the read lock, as the
//! crate docs list.

use super::ExpireMap;
use super::store::shard::{self};
use crate::clock::Time;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

/// What a read counts as.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Read {
    /// A user's read of a value: an access for idle expiry, and a hit or
    /// miss for stats.
    Get,
    /// Neither (`contains_key`, and reads that only compare).
    Peek,
}

impl<K, V, S> ExpireMap<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// Counts a read for [`stats`](Self::stats), if asked to.
    #[inline]
    pub(super) fn count(&self, hit: bool) {
        if let Some(r) = &self.inner.reads {
            r.count(hit);
        }
    }

    /// Applies `f` to the value of the live entry for `key` and its time
    /// left, under the shard's read lock. Reads the exact time. An `access`
    /// counts for idle expiry.
    ///
    /// An entry that looks expired by its idle time alone is confirmed so
    /// under the write lock before the read answers `None` (see
    /// [`expire_idle`](Self::expire_idle)).
    #[inline(always)]
    pub(super) fn read_live<Q, R, F>(&self, key: &Q, access: bool, f: F) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
        F: FnOnce(&V, Duration) -> R + Copy,
    {
        let mut idle_expired = false;
        let r = self.lookup_counted(key, access, Time::now, |now, found| {
            Self::read_found(now, found, access, f, &mut idle_expired)
        });
        if r.is_none() && idle_expired {
            return self.read_live_again(key, access, f);
        }
        r
    }

    /// The value for `key` if it is live, read without counting as an
    /// access of any kind: no idle-expiry refresh, no access for the
    /// capacity bound's policy, no hit or miss in [`stats`](Self::stats)
    /// (quick_cache's and moka's `peek`). Exact, like
    /// [`get`](Self::get): an entry past its deadline is not returned.
    ///
    /// ```
    /// use expiremap::{ExpireMap, ManualClock};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let map: ExpireMap<&str, u32> = ExpireMap::builder()
    ///     .clock(clock.clone())
    ///     .time_to_idle(Duration::from_secs(10))
    ///     .build();
    /// map.put("a", 1, Duration::from_secs(60));
    /// clock.advance(Duration::from_secs(8));
    /// assert_eq!(map.peek("a"), Some(1)); // no access: still idle since 0 s
    /// clock.advance(Duration::from_secs(3));
    /// assert_eq!(map.peek("a"), None); // idle for 11 s
    /// ```
    pub fn peek<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.read_live(key, false, |value, _| value.clone())
    }

    /// [`read_live`](Self::read_live) after its read found the entry
    /// expired by its idle time alone: confirms that, or reads again.
    #[cold]
    #[inline(never)]
    pub(super) fn read_live_again<Q, R, F>(&self, key: &Q, access: bool, f: F) -> Option<R>
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
            let r = self.lookup_counted(key, access, Time::now, |now, found| {
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
    pub(super) fn read_found<R>(
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
    pub(super) fn expire_idle<Q>(&self, key: &Q) -> bool
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
    pub(super) fn read_if_live<Q, R>(
        &self,
        key: &Q,
        read: Read,
        f: impl FnOnce(&V) -> R + Copy,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.inner.read_extras {
            return self.read_extra(key, read, f);
        }
        self.read_plain(key, f)
    }

    /// [`read_if_live`](Self::read_if_live) in a map without idle expiry or stats.
    #[inline(always)]
    pub(super) fn read_plain<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let (shard, home, ()) = inner.around(hash, |l| l.read(), |s| s.start(hash), |_, _| ());
        // The clock is read at the probe's first tag match, under the lock
        // (`BoundOnce`; BENCHMARKS.md, "The parts of a request"); a shard
        // that never held an entry with a deadline reads none at all.
        let bound = inner.clock.bound_once(shard.timed());
        let (value, deadline) = shard.get_plain(home, hash, key, || {
            bound.read();
        })?;
        bound.live(deadline).then(|| f(value))
    }

    /// [`read_if_live`](Self::read_if_live) in a map with idle expiry (the exact
    /// time, recorded if the read is an access) or stats (the count).
    /// Inlined like the rest of the read: out of line, its call and saved
    /// registers cost an idle `get` ~20 instructions of ~200.
    #[inline(always)]
    pub(super) fn read_extra<Q, R>(
        &self,
        key: &Q,
        read: Read,
        f: impl FnOnce(&V) -> R + Copy,
    ) -> Option<R>
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
    pub(super) fn lookup<Q, T, R>(
        &self,
        key: &Q,
        time: impl FnOnce(&Time) -> T,
        f: impl FnOnce(T, shard::Found<'_, V>) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.lookup_counted(key, true, time, f)
    }

    /// [`lookup`](Self::lookup) that counts as an access for the capacity
    /// bound's policy only if `access`.
    #[inline(always)]
    fn lookup_counted<Q, T, R>(
        &self,
        key: &Q,
        access: bool,
        time: impl FnOnce(&Time) -> T,
        f: impl FnOnce(T, shard::Found<'_, V>) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let (shard, home, t) = inner.around(hash, |l| l.read(), |s| s.start(hash), |t, _| time(t));
        let found = match access {
            true => shard.get_from(home, hash, key)?,
            false => shard.peek_from(home, hash, key)?,
        };
        f(t, found)
    }
}

//! [`Stats`] and the counts behind it. The read counts of
//! [`Builder::record_stats`](super::Builder::record_stats) and the count of
//! values the bound pushed out are striped, so that threads count on
//! different cache lines.

use crate::sync::{AtomicU64, CachePadded, Ordering};
use std::cell::Cell;
use std::time::Duration;

/// Hit and miss counts, each striped by thread slot.
pub(crate) struct Reads {
    hits: Tally,
    misses: Tally,
}

/// Hands out stripe slots to threads, round robin. A plain std atomic even
/// under loom: which stripe a thread counts on is no part of any protocol.
static NEXT_SLOT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

std::thread_local! {
    /// This thread's stripe slot (`usize::MAX`: not assigned yet).
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The calling thread's slot: stable for its life, different from the
/// slots of the threads started just before and after it.
#[inline]
fn slot() -> usize {
    SLOT.with(|s| {
        let mut v = s.get();
        if v == usize::MAX {
            v = NEXT_SLOT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            s.set(v);
        }
        v
    })
}

impl Reads {
    /// Stripes for `threads` threads at once (a power of two at least that).
    pub(crate) fn new(threads: usize) -> Self {
        Self {
            hits: Tally::new(threads),
            misses: Tally::new(threads),
        }
    }

    /// Counts one read: a hit if it found a live value.
    #[inline]
    pub(crate) fn count(&self, hit: bool) {
        if hit {
            self.hits.add_one();
        } else {
            self.misses.add_one();
        }
    }

    /// Counts a batch of reads: `hits` hits and `misses` misses.
    #[inline]
    pub(crate) fn count_many(&self, hits: u64, misses: u64) {
        self.hits.add(hits);
        self.misses.add(misses);
    }

    /// The totals: (hits, misses).
    pub(crate) fn totals(&self) -> (u64, u64) {
        (self.hits.total(), self.misses.total())
    }
}

/// A count bumped on a hot path by every thread (reads, values the bound
/// pushed out): one stripe per thread slot, so that threads count on different
/// cache lines; read by summing.
pub(crate) struct Tally {
    stripes: Box<[CachePadded<AtomicU64>]>,
}

impl Tally {
    /// Stripes for `threads` threads at once (a power of two at least that).
    pub(crate) fn new(threads: usize) -> Self {
        let n = threads.max(1).next_power_of_two();
        Self {
            stripes: (0..n)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
        }
    }

    /// Counts one.
    #[inline]
    pub(crate) fn add_one(&self) {
        self.stripes[slot() & (self.stripes.len() - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `n` (nothing if 0).
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        if n != 0 {
            self.stripes[slot() & (self.stripes.len() - 1)].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The total.
    pub(crate) fn total(&self) -> u64 {
        self.stripes.iter().map(|s| s.load(Ordering::Relaxed)).sum()
    }
}

/// Counters of a map's reads and eviction work, from [`ExpireMap::stats`](super::ExpireMap::stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Reads that found a live value: `get`, `get_with_ttl`, and
    /// `get_or_insert_with` hits; each key of a `get_many` or
    /// `get_many_with`. Counted only with
    /// [`Builder::record_stats`](super::Builder::record_stats); 0 otherwise.
    pub hits: u64,
    /// Reads that found no live value (a `get_or_insert_with` miss counts
    /// once, however long it waits or loads). As `hits`.
    pub misses: u64,
    /// Values pushed out, or refused, by the capacity bound (published as
    /// [`Cause::Size`](super::Cause::Size)).
    pub size_evicted: u64,
    /// The latest any eviction of an expired entry came: removal time minus
    /// deadline, the largest seen.
    pub max_lateness: Duration,
    /// Entries evicted because their deadline passed (by the thread,
    /// [`ExpireMap::evict_expired`](super::ExpireMap::evict_expired), a
    /// write to their shard: see `evicted_by_writers`, or a put into a full
    /// bounded map, which takes expired entries first to make room). Not
    /// counted, though each is published as `Expired` all the same:
    ///
    /// * an expired entry that a write of its key meets (`put`, `insert`,
    ///   `remove` and the other writes: the old value leaves as `Expired`,
    ///   not `Replaced` or `Removed`);
    /// * expired entries that `clear` or the map's drop takes;
    /// * an entry a read removed because it found it idle-expired (see
    ///   [`Builder::time_to_idle`](crate::Builder::time_to_idle)).
    pub evicted: u64,
    /// Of `evicted`, the entries that writes took: a write (`put`,
    /// `remove`, `expire`, a conditional put, a load's store) to a shard
    /// that no eviction has drained for one interval plus one precision
    /// (the thread is behind) takes a few due entries under the lock it
    /// already holds. The rest were the thread's, `evict_expired`'s, or
    /// taken by a full bounded map's put to make room.
    pub evicted_by_writers: u64,
    /// Eviction passes made by the background thread.
    pub passes: u64,
    /// Times the background thread woke from a wait. An idle map adds none
    /// (one a second with `Builder::metrics`, to publish).
    pub wakeups: u64,
    /// Reloads started by refresh ahead
    /// ([`Builder::refresh_after`](super::Builder::refresh_after)).
    pub refreshes: u64,
    /// Reloads that failed: their loader returned an error or `None`,
    /// panicked, or was dropped before it ended. The value they would have
    /// replaced stays.
    pub refresh_failures: u64,
    /// Events that subscribers lost because they fell more than the ring's
    /// capacity behind: the sum of the `n` of every `Lagged(n)` they were
    /// handed (a lag is counted when its subscriber next receives).
    pub events_lost: u64,
}

impl<K, V, S> super::ExpireMap<K, V, S>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: std::hash::BuildHasher + Send + Sync + 'static,
{
    /// Counters of reads (with [`Builder::record_stats`](super::Builder::record_stats)) and of eviction
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
        self.inner.stats()
    }
}

impl<K, V, S> super::Inner<K, V, S>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: std::hash::BuildHasher + Send + Sync + 'static,
{
    /// [`ExpireMap::stats`](super::ExpireMap::stats).
    pub(super) fn stats(&self) -> Stats {
        let s = &self.signal;
        let (hits, misses) = self.reads.as_ref().map_or((0, 0), |r| r.totals());
        Stats {
            hits,
            misses,
            size_evicted: self.size_evicted.total()
                + self.shards.iter().map(|s| s.size_out()).sum::<u64>(),
            max_lateness: Duration::from_nanos(self.max_lateness.load(Ordering::Relaxed)),
            evicted: self.evicted.load(Ordering::Relaxed),
            evicted_by_writers: self.evicted_by_writers.load(Ordering::Relaxed),
            passes: s.passes.load(Ordering::Relaxed),
            wakeups: s.wakeups.load(Ordering::Relaxed),
            refreshes: self.refreshes.load(Ordering::Relaxed),
            refresh_failures: self.refresh_failures.load(Ordering::Relaxed),
            events_lost: self.events.lost(),
        }
    }
}

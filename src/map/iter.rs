//! [`ExpireMap::iter`], [`ExpireMap::keys`] and [`ExpireMap::retain`].
//!
//! # Ground rules
//!
//! * Shards are visited one at a time, each in spans of [`SPAN`] slab
//!   indices (see `store::shard::iter`: an entry keeps its slab index for its whole
//!   life, so a walk over increasing indices meets an entry held throughout
//!   exactly once, however the table grows or shifts meanwhile).
//! * A span is read under the shard's *read* lock, with the time read under
//!   it: the entries live then are cloned into a batch, and the lock is
//!   released before the batch is handed out. The caller's code (a loop
//!   body, `retain`'s `f`, `Drop` of what is handed back) never runs under
//!   a lock. `K::clone` and `V::clone` do, as they do for `get`.
//! * Each walk of a shard ends at the slab length it found when it reached
//!   the shard: nodes appended behind it (keys put meanwhile, by the loop
//!   body or another thread) cannot keep it going.
//! * `retain` is optimistic: it reads a span under the read lock while
//!   *watching* the shard's [`Changes`] log (every write of a node is
//!   logged while someone watches), runs `f` with no lock held, and
//!   removes the entries `f` rejected under the write lock only if their
//!   nodes were not written since. Eviction is not logged, but it only
//!   vacates nodes (a node reused by a put is logged), so a node that still
//!   holds an entry of the same hash bits holds the one `f` was shown. An
//!   entry that changed is read again and `f` asked again, at most
//!   [`RETAIN_TRIES`] times; one whose key has an update in flight is
//!   treated as changed, and waited for.
//!
//! [`Changes`]: super::store::shard::Changes

use super::ExpireMap;
use super::load::flight;
use super::store::shard::{Door, Removed};
use crate::unwind::{Panic, Panics, clone_pair, resume_after_unlock};
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::iter::FusedIterator;

/// Slab indices read per hold of a shard's read lock: at most this many
/// entries are cloned under it. Small under loom and Miri, so that their
/// small maps still take several spans.
const SPAN: u32 = if cfg!(any(expiremap_loom, miri)) {
    4
} else {
    128
};

/// Times `retain` asks `f` about an entry it rejected, while writes of
/// that entry keep landing between the read and the removal. After the
/// last, the entry stays.
pub(crate) const RETAIN_TRIES: usize = 8;

/// The state shared by [`Iter`] and [`Keys`]: where the walk stands and
/// the batch read from the last span, reversed (handed out by `pop`).
struct Walk<'a, K, V, S, T> {
    map: &'a ExpireMap<K, V, S>,
    /// The shard being walked; `shards.len()` once done.
    shard: usize,
    /// The first slab index of the next span in `shard`.
    from: u32,
    /// The slab length `shard` had when the walk reached it: the walk ends
    /// there, so that entries put behind it cannot keep it going.
    end: Option<u32>,
    batch: Vec<T>,
    /// Makes a batch item from a live entry, under the read lock; if a
    /// clone panics, what it had cloned already comes back with the panic.
    take: Take<K, V, T>,
}

/// How a walk clones an entry under the read lock (see [`Walk::take`]).
type Take<K, V, T> = fn(&K, &V) -> Result<T, (K, Panic)>;

impl<'a, K, V, S, T> Walk<'a, K, V, S, T> {
    fn new(map: &'a ExpireMap<K, V, S>, take: Take<K, V, T>) -> Self {
        Self {
            map,
            shard: 0,
            from: 0,
            end: None,
            batch: Vec::new(),
            take,
        }
    }

    fn next(&mut self) -> Option<T> {
        let inner = &*self.map.inner;
        loop {
            if let Some(item) = self.batch.pop() {
                return Some(item);
            }
            let lock = inner.shards.get(self.shard)?;
            // Filled away from `self`: if a clone panics, the partial batch
            // is dropped with the unwinding (outside the lock: it is
            // declared before the guard), and the span (still `from`) is
            // read whole by the next call.
            let mut batch = std::mem::take(&mut self.batch);
            let take = self.take;
            let (next, unwound) = {
                let (guard, (), now) =
                    inner
                        .clock
                        .around(|| lock.read_unbiased(), |_| (), |t, _| t.now());
                let end = *self.end.get_or_insert_with(|| guard.slab_len());
                let span = (self.from, SPAN, end, now);
                guard.clone_span(span, |_, k, v| take(k, v), &mut batch)
            };
            resume_after_unlock(unwound);
            batch.reverse();
            self.batch = batch;
            match next {
                Some(from) => self.from = from,
                None => (self.shard, self.from, self.end) = (self.shard + 1, 0, None),
            }
        }
    }

    /// At least the batch in hand; exactly that once every shard was read.
    fn size_hint(&self) -> (usize, Option<usize>) {
        let done = self.shard >= self.map.inner.shards.len();
        (self.batch.len(), done.then_some(self.batch.len()))
    }
}

/// An iterator over clones of the live entries of an [`ExpireMap`], from
/// [`ExpireMap::iter`]. See there for what it promises under concurrent
/// writes.
pub struct Iter<'a, K, V, S = ahash::RandomState> {
    walk: Walk<'a, K, V, S, (K, V)>,
}

impl<K: Clone, V: Clone, S> Iterator for Iter<'_, K, V, S> {
    type Item = (K, V);

    fn next(&mut self) -> Option<(K, V)> {
        self.walk.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.walk.size_hint()
    }
}

impl<K: Clone, V: Clone, S> FusedIterator for Iter<'_, K, V, S> {}

impl<K, V, S> fmt::Debug for Iter<'_, K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Iter")
            .field("shard", &self.walk.shard)
            .field("from", &self.walk.from)
            .field("batched", &self.walk.batch.len())
            .finish_non_exhaustive()
    }
}

/// An iterator over clones of the keys of the live entries of an
/// [`ExpireMap`], from [`ExpireMap::keys`]. It makes the same promises as
/// [`Iter`], and clones no value.
pub struct Keys<'a, K, V, S = ahash::RandomState> {
    walk: Walk<'a, K, V, S, K>,
}

impl<K: Clone, V, S> Iterator for Keys<'_, K, V, S> {
    type Item = K;

    fn next(&mut self) -> Option<K> {
        self.walk.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.walk.size_hint()
    }
}

impl<K: Clone, V, S> FusedIterator for Keys<'_, K, V, S> {}

impl<K, V, S> fmt::Debug for Keys<'_, K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keys")
            .field("shard", &self.walk.shard)
            .field("from", &self.walk.from)
            .field("batched", &self.walk.batch.len())
            .finish_non_exhaustive()
    }
}

impl<'a, K, V, S> IntoIterator for &'a ExpireMap<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    type Item = (K, V);
    type IntoIter = Iter<'a, K, V, S>;

    /// [`ExpireMap::iter`].
    fn into_iter(self) -> Iter<'a, K, V, S> {
        self.iter()
    }
}

/// An entry of a span that `retain`'s `f` rejected: its slab index and
/// its key's hash.
struct Rejected {
    index: u32,
    hash: u64,
}

impl<K, V, S> ExpireMap<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// An iterator over `(key, value)` clones of the live entries, in no
    /// particular order.
    ///
    /// It is *weakly consistent*, as the iterators of Java's
    /// `ConcurrentHashMap` are: it never fails and never blocks writers
    /// for long, and
    ///
    /// * every entry that is live and unchanged for the whole iteration
    ///   is yielded exactly once;
    /// * no entry is yielded that was past its deadline when it was read
    ///   (each batch reads the time under its shard's lock);
    /// * an entry written, removed or expiring during the iteration may
    ///   be yielded or not, with any value it held while the iteration
    ///   ran (then once: a key is yielded twice only if it was removed
    ///   and put again meanwhile).
    ///
    /// The map is read one shard at a time, a bounded batch of entries
    /// per hold of the shard's read lock, and no lock is held while the
    /// caller's code runs: the loop body may use the map freely, writes to
    /// the entries it is shown included. Like [`get`](Self::get), it
    /// clones keys and values under the shard's read lock, so a `Clone`
    /// should be quick (an `Arc` is).
    ///
    /// ```
    /// use expiremap::{ExpireMap, ManualClock};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let map = ExpireMap::<u32, &str>::builder().clock(clock.clone()).build();
    /// map.put(1, "one", Duration::from_secs(10));
    /// map.put(2, "two", Duration::from_secs(10));
    /// map.put(3, "three", Duration::from_secs(1));
    /// clock.advance(Duration::from_secs(2)); // 3 expires
    ///
    /// let mut seen: Vec<(u32, &str)> = map.iter().collect();
    /// seen.sort();
    /// assert_eq!(seen, [(1, "one"), (2, "two")]);
    ///
    /// // The loop body may write to the map.
    /// for (k, v) in &map {
    ///     map.put(k + 10, v, Duration::from_secs(10));
    /// }
    /// assert_eq!(map.get(&11), Some("one"));
    /// ```
    pub fn iter(&self) -> Iter<'_, K, V, S> {
        Iter {
            walk: Walk::new(self, clone_pair),
        }
    }

    /// An iterator over clones of the keys of the live entries: the same
    /// promises as [`iter`](Self::iter), without cloning any value.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// let map: ExpireMap<u32, Vec<u8>> = ExpireMap::new();
    /// map.put(7, vec![0; 1 << 20], Duration::from_secs(60));
    /// map.put(8, vec![], Duration::from_secs(60));
    /// let mut keys: Vec<u32> = map.keys().collect();
    /// keys.sort();
    /// assert_eq!(keys, [7, 8]);
    /// ```
    pub fn keys(&self) -> Keys<'_, K, V, S> {
        Keys {
            walk: Walk::new(self, |k, _| Ok(k.clone())),
        }
    }

    /// Removes every live entry for which `f` returns `false`. Removed
    /// values leave by the `Removed` door (published as [`Cause::Removed`]
    /// with [`publish_removals`](crate::Builder::publish_removals); else
    /// dropped), after the shard lock is released.
    ///
    /// `f` runs with no lock held, on clones of the entries, so it may use
    /// the map. An entry that changes between `f`'s verdict and its removal
    /// (overwritten, removed, put again, given a new deadline) is kept:
    /// only an entry `f` was shown as it still is leaves. One found past its
    /// deadline by then leaves as [`Cause::Expired`]; entries expired
    /// before `f` could see them are left to eviction, and `f` is not asked
    /// about them. Entries put while `retain` runs may or may not be shown
    /// to `f`, as for [`iter`](Self::iter).
    ///
    /// How a change is seen: while `retain` reads a batch of entries, their
    /// shard logs which entries are written, and a rejected entry is
    /// removed only if the log shows no write of it since `f` saw it;
    /// writes of other entries do not matter. Otherwise `f` is asked again
    /// about what the entry holds now, so `f` may be called more than once
    /// for an entry that keeps changing (keep it free of side effects that
    /// must happen once), and an entry `f` rejected 8 times in a row, each
    /// time changed before the removal, is kept. An entry whose key has an
    /// [`update`](Self::update) in flight is asked about again once it
    /// committed. If `f` panics, the panic reaches the caller; the entries
    /// removed before it are gone (by their doors, as above), the others
    /// stay, and the map stays consistent and usable.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// let map: ExpireMap<u32, u32> = ExpireMap::new();
    /// for i in 0..10 {
    ///     map.put(i, i * i, Duration::from_secs(60));
    /// }
    /// map.retain(|_, &square| square % 2 == 0); // drop the odd squares
    /// let mut kept: Vec<u32> = map.keys().collect();
    /// kept.sort();
    /// assert_eq!(kept, [0, 2, 4, 6, 8]);
    /// ```
    ///
    /// [`Cause::Removed`]: crate::Cause::Removed
    /// [`Cause::Expired`]: crate::Cause::Expired
    #[doc(alias = "invalidate_entries_if")]
    pub fn retain<F>(&self, mut f: F)
    where
        F: FnMut(&K, &V) -> bool,
    {
        let inner = &*self.inner;
        let mut batch = Vec::new();
        for lock in inner.shards.iter() {
            let mut end = None;
            let mut from = Some(0);
            while let Some(at) = from {
                let mut watch = Watch { lock, place: None };
                let unwound;
                {
                    let (guard, (), now) =
                        inner
                            .clock
                            .around(|| lock.read_unbiased(), |_| (), |t, _| t.now());
                    let end = *end.get_or_insert_with(|| guard.slab_len());
                    watch.place = Some(guard.changes.watch());
                    let take = |i, k: &K, v: &V| clone_pair(k, v).map(|(k, v)| (i, k, v));
                    (from, unwound) = guard.clone_span((at, SPAN, end, now), take, &mut batch);
                }
                resume_after_unlock(unwound);
                self.retain_span(&mut watch, &mut batch, &mut f);
            }
        }
    }

    /// Asks `f` about the entries of one span, read into `batch` (left
    /// empty) while `watch` watched their shard, and removes those it
    /// rejects that did not change since (see [`retain`](Self::retain)).
    fn retain_span<F>(&self, watch: &mut Watch<'_, K, V>, batch: &mut Vec<(u32, K, V)>, f: &mut F)
    where
        F: FnMut(&K, &V) -> bool,
    {
        let inner = &*self.inner;
        let lock = watch.lock;
        let mut rejected: Vec<Rejected> = Vec::new();
        let mut panics = Panics::new();
        for attempt in 1..=RETAIN_TRIES {
            // Drained one at a time: if `f` panics, the rest of the batch
            // is dropped with `batch` by the caller, outside every lock.
            while let Some((index, key, value)) = batch.pop() {
                if !f(&key, &value) {
                    let hash = inner.hasher.hash_one(&key);
                    rejected.push(Rejected { index, hash });
                }
            }
            if rejected.is_empty() {
                break;
            }
            let mut out: Vec<Removed<K, V>> = Vec::new();
            let mut again: Vec<Rejected> = Vec::new();
            let mut waits = Vec::new();
            let now = {
                let (mut guard, (), now) =
                    inner.clock.around(|| lock.write(), |_| (), |t, _| t.now());
                let place = watch.place.take().expect("watching");
                for r in rejected.drain(..) {
                    if guard.changes.changed_since(place, r.index) {
                        again.push(r);
                        continue;
                    }
                    if !guard.flights.is_empty() {
                        // A removal is a write of the key: a load of it
                        // loses, an update of it goes first.
                        let update = guard
                            .held(r.index)
                            .and_then(|(k, _)| flight::before_write(&guard.flights, r.hash, k));
                        if let Some(update) = update {
                            waits.push(update);
                            again.push(r);
                            continue;
                        }
                    }
                    if let Some(gone) = guard.take_seen(r.index, r.hash as u32, now) {
                        out.push(gone);
                    }
                }
                guard.changes.unwatch_and_trim();
                now
            };
            let removed = out.iter().filter(|r| r.door == Door::Removed).count();
            inner.count_removed(removed as u64);
            for gone in out {
                panics.run(|| inner.leave(gone, now));
            }
            if again.is_empty() || attempt == RETAIN_TRIES {
                // Out of tries: what changed every time stays.
                break;
            }
            for update in waits {
                update.wait();
            }
            // Changed meanwhile: read what those nodes hold now, and ask
            // `f` again about the entries still of the same keys.
            let mut unwound = None;
            {
                let (guard, (), now) =
                    inner
                        .clock
                        .around(|| lock.read_unbiased(), |_| (), |t, _| t.now());
                watch.place = Some(guard.changes.watch());
                for r in &again {
                    let same = guard
                        .live_at(r.index, now)
                        .filter(|_| guard.hash_bits(r.index) == r.hash as u32);
                    if let Some((k, v)) = same {
                        match clone_pair(k, v) {
                            Ok((k, v)) => batch.push((r.index, k, v)),
                            Err(e) => {
                                unwound = Some(e);
                                break;
                            }
                        }
                    }
                }
            }
            if let Some((key, panic)) = unwound {
                drop(key);
                panics.keep(panic);
                break;
            }
        }
        panics.resume();
    }
}

/// A `retain` span's registration with its shard's [`Changes`]
/// (`place`, while registered). Dropped while registered (nothing to
/// remove, or `f` or a clone panicked), it unregisters under the read lock.
///
/// [`Changes`]: super::store::shard::Changes
struct Watch<'a, K, V> {
    lock: &'a crate::sync::biased::RwLock<super::store::shard::Shard<K, V>>,
    place: Option<usize>,
}

impl<K, V> Drop for Watch<'_, K, V> {
    fn drop(&mut self) {
        if self.place.take().is_some() {
            self.lock.read().changes.unwatch();
        }
    }
}

#[cfg(all(test, not(expiremap_loom)))]
mod tests {
    use crate::{ExpireMap, ManualClock};
    use std::time::Duration;

    /// The map-level walk over real locks, small enough for Miri: spans
    /// across a shard, writes from the loop body and from `f`.
    #[test]
    fn iter_and_retain_over_spans_with_writes_from_inside() {
        let clock = ManualClock::new();
        let map = ExpireMap::<u32, u32>::builder()
            .clock(clock.clone())
            .shards(if cfg!(miri) { 1 } else { 4 })
            .background_eviction(false)
            .build();
        let n = if cfg!(miri) {
            3 * super::SPAN + 1
        } else {
            1000
        };
        for k in 0..n {
            map.put(k, k, Duration::from_millis(u64::from(1 + k % 3)));
        }
        clock.advance(Duration::from_nanos(1_000_001)); // k % 3 == 0 expire
        let mut seen: Vec<u32> = Vec::new();
        for (k, v) in &map {
            assert_eq!(k, v);
            map.put(k + n, k, Duration::from_secs(1));
            map.remove(&(k + n));
            seen.push(k);
        }
        seen.sort_unstable();
        let mut it = map.keys();
        assert_eq!(it.size_hint(), (0, None));
        it.next();
        assert!(it.size_hint().0 > 0);
        it.by_ref().count();
        assert_eq!(it.size_hint(), (0, Some(0)));
        let want: Vec<u32> = (0..n).filter(|k| k % 3 != 0).collect();
        assert_eq!(seen, want);
        map.retain(|&k, _| {
            map.get(&k);
            k % 2 == 0
        });
        let mut kept: Vec<u32> = map.keys().collect();
        kept.sort_unstable();
        let want: Vec<u32> = want.into_iter().filter(|k| k % 2 == 0).collect();
        assert_eq!(kept, want);
    }
}

//! Walking one shard by slab index, for the map's `iter`, `keys` and
//! `retain` (`map::iter` holds the locking protocol around these calls).
//!
//! # Ground rules
//!
//! * A walk's cursor is a slab index, not a table slot. Nodes never move:
//!   the slab only grows, its chunks are never reallocated, and an
//!   overwrite or a new deadline keeps the entry in its node. So an entry
//!   held from the start of a walk to its end keeps one index, and a walk
//!   over increasing indices meets it exactly once, whatever the table does
//!   meanwhile (grow, shift a cluster back after a removal). A node freed
//!   and reused holds a new entry, which a walk may meet or not.
//! * A node holds an entry exactly when its `prev` is not `VACANT` (the
//!   slab invariant on `Entries`); that is the only test made before reading
//!   a node's `kv`.
//! * Reads take `&self` (the caller holds the shard's read lock) and run
//!   only the caller's closure, which clones; [`take_seen`] takes
//!   `&mut self` (the write lock) and runs no user code at all.
//! * An entry's deadline is read only through [`expires_at`].
//!
//! [`take_seen`]: Shard::take_seen
//! [`expires_at`]: Shard::expires_at

use super::{Door, Removed, Shard, VACANT};
use crate::sync::{AtomicU32, Ordering, with_mut_u32};
use crate::unwind::Panic;

/// The nodes written since optimistic readers started watching: how
/// `retain` tells, per entry, whether the entry it showed its `f` changed
/// before it applies `f`'s verdict.
///
/// A reader registers under the shard's *read* lock ([`watch`]: a relaxed
/// increment, ordered against writers by the lock) and gets its place in
/// the log; while any reader watches, every write of a node under the write
/// lock (a put, an overwrite, a new deadline, a removal) appends the node's
/// index. Under the write lock a reader then asks whether a node was
/// written since its place ([`changed_since`]), and stops watching
/// ([`unwatch_and_trim`]; the last to stop there empties the log), or
/// stops under the read lock ([`unwatch`]) if it has nothing to ask. The
/// log grows only while someone watches. Eviction is not
/// logged: it only vacates nodes, and a vacant node reused by a put is
/// logged by the put.
///
/// [`watch`]: Changes::watch
/// [`changed_since`]: Changes::changed_since
/// [`unwatch`]: Changes::unwatch
/// [`unwatch_and_trim`]: Changes::unwatch_and_trim
pub(crate) struct Changes {
    watchers: AtomicU32,
    written: Vec<u32>,
}

impl Changes {
    pub(super) fn new() -> Self {
        Self {
            watchers: AtomicU32::new(0),
            written: Vec::new(),
        }
    }

    /// Starts watching, under the read lock: the place to pass to
    /// [`changed_since`](Self::changed_since).
    pub(crate) fn watch(&self) -> usize {
        self.watchers.fetch_add(1, Ordering::Relaxed);
        self.written.len()
    }

    /// Stops watching, under the read lock.
    pub(crate) fn unwatch(&self) {
        self.watchers.fetch_sub(1, Ordering::Relaxed);
    }

    /// Stops watching, under the write lock: the last watcher to stop
    /// empties the log.
    pub(crate) fn unwatch_and_trim(&mut self) {
        let last = with_mut_u32(&mut self.watchers, |w| {
            *w -= 1;
            *w == 0
        });
        if last {
            self.written = Vec::new();
        }
    }

    /// Whether node `index` was written since `place`, under the write lock.
    pub(crate) fn changed_since(&self, place: usize, index: u32) -> bool {
        self.written[place..].contains(&index)
    }

    /// Node `index` is being written, under the write lock.
    #[inline]
    pub(super) fn wrote(&mut self, index: u32) {
        if with_mut_u32(&mut self.watchers, |w| *w != 0) {
            self.written.push(index);
        }
    }
}

impl<K, V> Shard<K, V> {
    /// The last instant at which node `index`'s entry is visible. The node
    /// must be below the slab's length.
    #[inline]
    pub(crate) fn expires_at(&self, index: u32) -> u64 {
        self.entries.slab.live_until(index)
    }

    /// The 32 hash bits of the key in node `index` (vacant or not), which
    /// must be below the slab's length.
    #[inline]
    pub(crate) fn hash_bits(&self, index: u32) -> u32 {
        self.entries.slab.nodes.hash(index)
    }

    /// One past the highest slab index: every entry's index is below it.
    #[inline]
    pub(crate) fn slab_len(&self) -> u32 {
        // At most `MAX_NODES`, which fits.
        self.entries.slab.nodes.len() as u32
    }

    /// The key and value in node `index`, live or past its deadline;
    /// `None` for a vacant node or an index past the slab.
    #[inline]
    pub(crate) fn held(&self, index: u32) -> Option<&(K, V)> {
        let (node, _) = self.entries.slab.nodes.get(index as usize)?;
        if node.prev.load(Ordering::Relaxed) == VACANT {
            return None;
        }
        // SAFETY: a node whose `prev` is not `VACANT` is linked, so its `kv`
        // is initialised (slab invariant; lookups under the read lock change
        // only `prev`'s count bits, never to `VACANT`). The borrow of `self`
        // keeps every `&mut self` method, the only ones that vacate a node,
        // away for as long as the reference lives.
        Some(unsafe { node.kv.assume_init_ref() })
    }

    /// The key and value in node `index` if it holds an entry live at
    /// `now`.
    #[inline]
    pub(crate) fn live_at(&self, index: u32, now: u64) -> Option<&(K, V)> {
        self.held(index).filter(|_| now <= self.expires_at(index))
    }

    /// Calls `f(index, key, value)` for each entry live at `now` among the
    /// `span` slab indices from `from`, stopping at `end` (a walk passes the
    /// slab length it found when it reached the shard, so that entries put
    /// behind it cannot keep it going) or at the slab's end, or as soon as
    /// `f` returns `false`. Returns where the next call goes on, or `None`
    /// once `end` (or the slab's end) was reached.
    pub(crate) fn visit(
        &self,
        from: u32,
        span: u32,
        end: u32,
        now: u64,
        mut f: impl FnMut(u32, &K, &V) -> bool,
    ) -> Option<u32> {
        let end = end.min(self.slab_len());
        let stop = from.saturating_add(span).min(end);
        for index in from..stop {
            if let Some((key, value)) = self.live_at(index, now) {
                if !f(index, key, value) {
                    break;
                }
            }
        }
        (stop < end).then_some(stop)
    }

    /// [`visit`](Self::visit) that clones each live entry with `take` into
    /// `batch`, stopping at the first clone that panics: that panic comes
    /// back, with what the clone had made already (a key), for the caller
    /// to drop and resume once it has released its lock
    /// ([`crate::unwind::resume_after_unlock`]).
    pub(crate) fn clone_span<T>(
        &self,
        (from, span, end, now): (u32, u32, u32, u64),
        mut take: impl FnMut(u32, &K, &V) -> Result<T, (K, Panic)>,
        batch: &mut Vec<T>,
    ) -> (Option<u32>, Option<(K, Panic)>) {
        let mut unwound = None;
        let next = self.visit(from, span, end, now, |i, k, v| match take(i, k, v) {
            Ok(item) => {
                batch.push(item);
                true
            }
            Err(e) => {
                unwound = Some(e);
                false
            }
        });
        (next, unwound)
    }

    /// Takes the entry in node `index` out of the shard if the node still
    /// holds an entry whose key has hash bits `h32`: as `Removed` if it is
    /// live at `now`, else as `Expired`. `None` if the node is vacant or
    /// holds another key's entry. Runs no user code.
    ///
    /// Whether it is the *same* entry the caller saw is the caller's to
    /// know: `map::iter` calls this only when its [`Changes`] say that no
    /// write reached the node since, so a node that still holds an entry
    /// holds that one.
    ///
    pub(crate) fn take_seen(&mut self, index: u32, h32: u32, now: u64) -> Option<Removed<K, V>> {
        self.held(index)?;
        if self.entries.slab.nodes.hash(index) != h32 {
            return None;
        }
        let door = if now <= self.expires_at(index) {
            Door::Removed
        } else {
            Door::Expired
        };
        Some(self.take_index(index, door))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Door, Shard};
    use std::collections::BTreeMap;

    const SHIFT: u32 = 10;

    /// A poor hash on purpose: collisions make removals shift clusters.
    fn h(k: u64) -> u64 {
        k % 5
    }

    /// Every entry `visit` reports from index 0 in steps of `span`.
    fn walk(s: &Shard<u64, u64>, span: u32, now: u64) -> Vec<(u32, u64, u64)> {
        let mut seen = Vec::new();
        let mut from = Some(0);
        while let Some(at) = from {
            from = s.visit(at, span, u32::MAX, now, |i, &k, &v| {
                seen.push((i, k, v));
                true
            });
        }
        seen
    }

    #[test]
    fn visit_reports_each_live_entry_once_and_skips_vacant_and_expired() {
        let mut s: Shard<u64, u64> = Shard::new(SHIFT, 0, 0);
        let n = if cfg!(miri) { 24 } else { 300 };
        let mut model = BTreeMap::new();
        for k in 0..n {
            // Deadlines 10, 20, 30, 40.
            let d = 10 * (1 + k % 4);
            s.put_owned(h(k), k, k * 100, d, 0);
            model.insert(k, (k * 100, d));
        }
        for k in (0..n).step_by(3) {
            assert!(s.remove(h(k), &k, 0).is_some());
            model.remove(&k);
        }
        // Reuse some of the freed nodes.
        for k in n..n + n / 6 {
            s.put_owned(h(k), k, k * 100, 40, 0);
            model.insert(k, (k * 100, 40));
        }
        s.validate();
        for now in [0, 10, 11, 25, 40, 41] {
            for span in [1, 2, 7, 1000] {
                let seen = walk(&s, span, now);
                let mut got: Vec<(u64, u64)> = seen.iter().map(|&(_, k, v)| (k, v)).collect();
                got.sort_unstable();
                let want: Vec<(u64, u64)> = model
                    .iter()
                    .filter(|&(_, &(_, d))| now <= d)
                    .map(|(&k, &(v, _))| (k, v))
                    .collect();
                assert_eq!(got, want, "now {now} span {span}");
                for &(i, _, _) in &seen {
                    assert!(now <= s.expires_at(i));
                    assert!(s.live_at(i, now).is_some());
                }
            }
        }
        assert!(
            s.visit(s.slab_len(), 4, u32::MAX, 0, |_, _, _| panic!(
                "past the end"
            ))
            .is_none()
        );
    }

    #[test]
    fn take_seen_checks_the_node_and_picks_the_door() {
        let mut s: Shard<u64, u64> = Shard::new(SHIFT, 0, 0);
        for k in 0..6 {
            s.put_owned(h(k), k, k, 10 + k, 0);
        }
        let index = |s: &Shard<u64, u64>, key: u64| {
            let mut at = None;
            s.visit(0, 100, u32::MAX, 0, |i, &k, _| {
                if k == key {
                    at = Some(i);
                }
                true
            });
            at.expect("held")
        };
        let (i1, i2, i3) = (index(&s, 1), index(&s, 2), index(&s, 3));
        // Wrong hash bits: another key's entry, left alone.
        assert!(s.take_seen(i1, h(2) as u32, 0).is_none());
        let r = s.take_seen(i1, h(1) as u32, 11).expect("live");
        assert_eq!((r.key, r.value, r.door), (1, 1, Door::Removed));
        s.validate();
        // Vacant now.
        assert!(s.take_seen(i1, h(1) as u32, 0).is_none());
        assert!(s.live_at(i1, 0).is_none());
        // Past its deadline (12): `Expired`.
        let r = s.take_seen(i2, h(2) as u32, 13).expect("held");
        assert_eq!((r.key, r.door), (2, Door::Expired));
        s.validate();
        // Past the slab.
        assert!(s.take_seen(s.slab_len(), 0, 0).is_none());
        assert!(s.live_at(s.slab_len() + 5, 0).is_none());
        // Out of the table too: a lookup misses, a put inserts anew.
        assert!(s.get(h(1), &1).is_none());
        assert!(s.get(h(3), &3).is_some());
        assert_eq!(s.live_at(i3, 0).map(|kv| kv.0), Some(3));
        assert_eq!(s.len(), 4);
    }

    #[test]
    fn take_seen_gives_a_bounded_shard_its_room_back() {
        let mut s: Shard<u64, u64> = Shard::new(SHIFT, 0, 0).bounded(4, false);
        for k in 0..4 {
            s.put_owned(h(k), k, k, 100, 0);
        }
        assert_eq!(s.usage(), Some((4, 4)));
        let mut seen = Vec::new();
        s.visit(0, 8, u32::MAX, 0, |i, &k, _| {
            seen.push((i, k));
            true
        });
        for &(i, k) in seen.iter().filter(|&&(_, k)| k % 2 == 0) {
            assert!(s.take_seen(i, h(k) as u32, 0).is_some());
            s.validate();
        }
        assert_eq!(s.usage(), Some((2, 4)));
        // The room is there: two new keys fit without pushing anything out
        // (`put_owned` asserts that).
        s.put_owned(h(10), 10, 10, 100, 0);
        s.put_owned(h(11), 11, 11, 100, 0);
        s.validate();
        assert_eq!(s.usage(), Some((4, 4)));
    }
}

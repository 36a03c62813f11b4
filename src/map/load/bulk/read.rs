//! `get_many`: a batch of reads, planned with no lock held and made
//! shard by shard, so that the lookups overlap their cache misses.
//!
//! # Ground rules
//!
//! * Under a shard's read lock `get_many` first starts loading the table
//!   slots of the keys of that shard (a prefetch each, at most [`AHEAD`]
//!   keys ahead of the probe), then probes. A loop of `get`s takes a lock
//!   per key, and a lock's atomic read-modify-write waits for every
//!   earlier load, so no two of its cache misses overlap; here a shard's
//!   misses do. Under the lock the user code
//!   is `Eq` and `V::clone`, as in `get`.
//! * Shards with fewer than [`WARM_BELOW`] of the batch's keys (at the
//!   default shard count, nearly all: 64 keys over 128 shards are ~60
//!   groups) are warmed first, up to [`WINDOW`] keys together: their lock
//!   words prefetched with no lock held, then under each shard's read lock
//!   in turn the keys' table slots prefetched, then under each again the
//!   nodes those slots point to. A lock waits for earlier loads but not
//!   for prefetches, so each pass overlaps the misses of all the window's
//!   keys, across shards. The warm-up holds one read lock at a time, runs
//!   no user code and decides nothing: each read is then made as above,
//!   under its own hold, whatever changed in between.
//! * Each read is the read `get` makes: exact, an access for idle expiry
//!   and for the bound's policy, a hit or a miss in stats. In a map with
//!   idle expiry the exact time is read under each lock. Without it, one
//!   reading of the clock's cheap bound, taken after a chunk's locks, is an
//!   upper bound on the time at each of its reads: a value whose deadline
//!   is at or after it was live when read (`prove_live`); any other is read
//!   again by itself, exactly. A read per lock cost the default shard
//!   count's one-key groups a TSC read each. A key found expired by its
//!   idle time alone is confirmed under the write lock after the read lock
//!   is released, as `get` does (`read_live_again`).

use crate::map::store::shard::{Home, Shard};
use crate::map::store::table::prefetch_line;
use crate::map::{ExpireMap, Inner};
use crate::sync::biased::RwLock;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// Keys per chunk of a batch: the most keys one lock hold of `get_many`
/// reads, so that a huge batch never holds a shard's lock for long (a
/// probe that misses the cache is ~100 ns: a full chunk in one shard holds
/// its read lock for ~0.1 ms).
pub(super) const CHUNK: usize = 1024;

/// How many keys ahead of the probe `get_many` prefetches table slots:
/// enough to keep a core's outstanding misses busy (10-16 line-fill
/// buffers on current x86 cores), few enough that the lines are still in
/// L1 when the probe comes.
const AHEAD: usize = 16;

/// Keys of one shard from which `get_many` reads them without a warm-up:
/// the prefetches under that shard's lock ([`AHEAD`] keys ahead) already
/// overlap their misses. Shorter groups are warmed together, across
/// shards (`read_warmed`): at the default shard count (128 on 2 cores) a
/// batch of 64 keys is ~60 groups of one key.
const WARM_BELOW: usize = AHEAD;

/// Keys of short groups warmed together: enough to keep a core's line-fill
/// buffers busy through each pass, few enough that their slots and nodes
/// (two lines a key) stay in the first-level cache until their read.
const WINDOW: usize = 64;

/// Most shards of a map whose batches `get_many` orders by counting keys
/// per shard (see `Inner::by_shard`): the default shard count up to 64
/// cores.
const COUNTED_SHARDS: usize = 256;

// A chunk's counts per shard fit a `u16`.
const _: () = assert!(CHUNK < u16::MAX as usize);

impl<K, V, S> ExpireMap<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// The live value of each key, in the keys' order: what
    /// [`get`](Self::get) returns for each, read in one pass. The keys are
    /// hashed first and ordered by shard; each shard visited is read-locked
    /// once (per 1,024 keys) for its reads, after a warm-up that starts the
    /// cache misses of shards holding few of the keys together, so the
    /// lookups overlap their misses and a batch of 16 keys or more costs
    /// less than a loop of `get`s: 64 keys over 10^6 entries read in
    /// 0.53–0.65 of the time with the default shard count, 0.34–0.49 with
    /// 8 shards (BENCHMARKS.md, "Batches").
    ///
    /// Every read is what `get` makes: exact (an entry past its deadline is
    /// `None`), an access for idle expiry and for the capacity bound's
    /// policy, and a hit or a miss in [`stats`](Self::stats). A key given
    /// twice is read twice. Under each lock the user code is `Eq` and
    /// `V::clone`, as in `get`.
    ///
    /// ```
    /// use expiremap::ExpireMap;
    /// use std::time::Duration;
    ///
    /// let map: ExpireMap<String, u32> = ExpireMap::new();
    /// map.put("a".to_string(), 1, Duration::from_secs(60));
    /// map.put("c".to_string(), 3, Duration::from_secs(60));
    /// assert_eq!(map.get_many(["a", "b", "c"]), [Some(1), None, Some(3)]);
    /// let owned = ["c".to_string(), "a".to_string()];
    /// assert_eq!(map.get_many(&owned), [Some(3), Some(1)]);
    /// ```
    pub fn get_many<'q, Q>(&self, keys: impl IntoIterator<Item = &'q Q>) -> Vec<Option<V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized + 'q,
    {
        let keys: Vec<&Q> = keys.into_iter().collect();
        if let [key] = keys[..] {
            // Nothing to overlap: no plan to pay for.
            return vec![self.get(key)];
        }
        let mut out = Vec::with_capacity(keys.len());
        out.resize_with(keys.len(), || None);
        self.read_many(&keys, &mut out);
        out
    }

    /// [`get_many`](Self::get_many)'s work: the live value of `keys[i]`
    /// into `out[i]` (which start as `None`), chunk by chunk, shard by
    /// shard; then the idle-expiry confirmations and the stats.
    fn read_many<Q>(&self, keys: &[&Q], out: &mut [Option<V>])
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        let n = keys.len().min(CHUNK);
        // `(hash, position)` in the keys' order, then in shard order; and
        // the home slots of a group.
        let mut hashed: Vec<(u64, usize)> = Vec::with_capacity(n);
        let mut order: Vec<(u64, usize)> = Vec::with_capacity(n);
        let mut homes: Vec<Home> = Vec::with_capacity(n);
        // Keys found expired by idle time alone, to confirm after unlocking.
        let mut again = Vec::new();
        // `(position, deadline)` of the values a chunk's reads found with a
        // deadline, to prove live after its locks (`prove_live`).
        let mut timed = Vec::new();
        for (c, chunk) in keys.chunks(CHUNK).enumerate() {
            hashed.clear();
            let at = c * CHUNK;
            hashed.extend(
                (chunk.iter().enumerate()).map(|(i, k)| (inner.hasher.hash_one(*k), at + i)),
            );
            inner.by_shard(&hashed, &mut order);
            let same_shard = |a: &(u64, usize), b: &(u64, usize)| {
                inner.shard_index(a.0) == inner.shard_index(b.0)
            };
            // Short groups, to warm together before they are read.
            let mut short: Vec<&[(u64, usize)]> = Vec::new();
            let mut short_keys = 0;
            for group in order.chunk_by(same_shard) {
                if group.len() >= WARM_BELOW {
                    self.read_group_any(group, keys, out, &mut homes, &mut again, &mut timed);
                    continue;
                }
                short.push(group);
                short_keys += group.len();
                if short_keys >= WINDOW {
                    self.read_warmed(&short, keys, out, &mut homes, &mut again, &mut timed);
                    short.clear();
                    short_keys = 0;
                }
            }
            self.read_warmed(&short, keys, out, &mut homes, &mut again, &mut timed);
            self.prove_live(&mut timed, keys, out);
        }
        for i in again {
            out[i] = self.read_live_again(keys[i], true, |v, _| v.clone());
        }
        if let Some(reads) = &inner.reads {
            let hits = out.iter().filter(|v| v.is_some()).count() as u64;
            reads.count_many(hits, out.len() as u64 - hits);
        }
    }

    /// [`read_many`](Self::read_many)'s reads of one shard's keys, `group`.
    #[inline(always)]
    fn read_group_any<Q>(
        &self,
        group: &[(u64, usize)],
        keys: &[&Q],
        out: &mut [Option<V>],
        homes: &mut Vec<Home>,
        again: &mut Vec<usize>,
        timed: &mut Vec<(usize, u64)>,
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let lock = self.inner.shard(group[0].0);
        if self.inner.config.idle.is_some() {
            self.read_group_idle(lock, group, keys, out, homes, again);
        } else {
            self.inner.read_group(lock, group, keys, out, homes, timed);
        }
    }

    /// The values of a chunk's reads that have a deadline (`timed`, taken
    /// by `read_group`), proved live at their reads with one reading of the
    /// clock's bound, taken after the chunk's locks: it bounds the time at
    /// every earlier instant, so a deadline at or after it had not passed
    /// when its entry was read. A value it cannot prove (its deadline has
    /// passed since, or had passed at the read: an entry not yet evicted)
    /// is dropped and its key read again by itself, exactly, as `peek`
    /// reads (the first read was the access). Empties `timed`.
    fn prove_live<Q>(&self, timed: &mut Vec<(usize, u64)>, keys: &[&Q], out: &mut [Option<V>])
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if timed.is_empty() {
            return;
        }
        let clock = &self.inner.clock;
        let bound = clock.now_at_most();
        for &(i, deadline) in timed.iter() {
            if !clock.live(bound, deadline) {
                // Not an access again: the first read recorded it.
                out[i] = self.read_live(keys[i], false, |v, _| v.clone());
            }
        }
        timed.clear();
    }

    /// [`read_many`](Self::read_many)'s reads of `groups`, each a few keys
    /// of one shard (fewer than [`WARM_BELOW`]), warmed first across the
    /// shards: their shards' lock words prefetched (no lock held); under
    /// each shard's read lock in turn, the keys' table slots prefetched;
    /// then under each again, the nodes those slots point to (the first
    /// whose tag matches); then each group read as usual. Taking a lock
    /// waits for the loads before it, but not for prefetches, so each pass
    /// overlaps the misses of all the groups' keys, where one read per lock
    /// could overlap none. The warm-up only hints: it decides nothing, runs
    /// no user code, and whatever a writer changes between the holds is
    /// seen by the read.
    fn read_warmed<Q>(
        &self,
        groups: &[&[(u64, usize)]],
        keys: &[&Q],
        out: &mut [Option<V>],
        homes: &mut Vec<Home>,
        again: &mut Vec<usize>,
        timed: &mut Vec<(usize, u64)>,
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        if groups.len() > 1 {
            for group in groups {
                prefetch_line(inner.shard(group[0].0));
            }
            for group in groups {
                let shard = inner.shard(group[0].0).read();
                for &(h, _) in *group {
                    shard.start(h);
                }
            }
            for group in groups {
                let shard = inner.shard(group[0].0).read();
                for &(h, _) in *group {
                    shard.prefetch_found(h);
                }
            }
        }
        for group in groups {
            self.read_group_any(group, keys, out, homes, again, timed);
        }
    }

    /// [`read_many`](Self::read_many) in one shard of a map with idle
    /// expiry: under the read lock and the exact time, each key's read as
    /// `read_live` makes it (an access if live); the keys found expired by
    /// idle time alone go to `again`.
    fn read_group_idle<Q>(
        &self,
        lock: &RwLock<Shard<K, V>>,
        group: &[(u64, usize)],
        keys: &[&Q],
        out: &mut [Option<V>],
        homes: &mut Vec<Home>,
        again: &mut Vec<usize>,
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        homes.clear();
        let (shard, (), now) = self.inner.clock.around(
            || lock.read_for(group.len()),
            |s| homes.extend(group.iter().map(|&(h, _)| s.start(h))),
            |t, _| t.now(),
        );
        for (&(h, i), &home) in group.iter().zip(homes.iter()) {
            let Some(found) = shard.get_from(home, h, keys[i]) else {
                continue;
            };
            let mut idle_expired = false;
            out[i] = Self::read_found(now, found, true, |v, _| v.clone(), &mut idle_expired);
            if idle_expired {
                again.push(i);
            }
        }
    }
}

impl<K, V, S> Inner<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// `hashed` (`(hash, position)` pairs, at most [`CHUNK`]) in the order
    /// of their shards, into `order`: by counting, with a count per shard
    /// on the stack, in a map of up to [`COUNTED_SHARDS`] shards (a
    /// comparison sort of 64 keys cost more than the 64 probes it served:
    /// ~100 instructions a key against ~40); by sorting in a larger one.
    fn by_shard(&self, hashed: &[(u64, usize)], order: &mut Vec<(u64, usize)>) {
        order.clear();
        if self.shards.len() > COUNTED_SHARDS {
            order.extend_from_slice(hashed);
            order.sort_unstable_by_key(|&(h, _)| self.shard_index(h));
            return;
        }
        // `next[s]`: where the next key of shard `s` goes.
        let mut next = [0_u16; COUNTED_SHARDS + 1];
        for &(h, _) in hashed {
            next[self.shard_index(h) + 1] += 1;
        }
        for s in 1..=self.shards.len() {
            next[s] += next[s - 1];
        }
        order.resize(hashed.len(), (0, 0));
        for &e in hashed {
            let at = &mut next[self.shard_index(e.0)];
            order[usize::from(*at)] = e;
            *at += 1;
        }
    }

    /// `get_many`'s reads of one shard's keys in a map without idle
    /// expiry, as `read_plain` reads but for the clock: the read lock; the
    /// table slots of the first [`AHEAD`] keys prefetched; then a probe per
    /// key, each prefetching the slot of the key `AHEAD` later. A value
    /// found is cloned into `out`, and if it has a deadline, noted in
    /// `timed` for `prove_live`, which reads the clock once for the chunk
    /// after its locks, where a read per shard cost each of the default
    /// shard count's one-key groups a TSC read (~22 ns on the development
    /// machine, a fifth of the whole read).
    ///
    /// The probes do not prefetch the nodes the slots point to: the
    /// out-of-order core already overlaps those misses across probes (a
    /// second prefetch stage, from the slot of the key `AHEAD` later to its
    /// node, changed `get_many(64)` by 0-4 % on the 2-core development
    /// machine, inside the noise).
    #[inline(always)]
    fn read_group<Q>(
        &self,
        lock: &RwLock<Shard<K, V>>,
        group: &[(u64, usize)],
        keys: &[&Q],
        out: &mut [Option<V>],
        homes: &mut Vec<Home>,
        timed: &mut Vec<(usize, u64)>,
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        homes.clear();
        let first = &group[..group.len().min(AHEAD)];
        let (shard, (), ()) = self.clock.around(
            || lock.read_for(group.len()),
            |s| homes.extend(first.iter().map(|&(h, _)| s.start(h))),
            |_, _| (),
        );
        for (j, &(h, i)) in group.iter().enumerate() {
            if let Some(&(later, _)) = group.get(j + AHEAD) {
                homes.push(shard.start(later));
            }
            if let Some((value, deadline)) = shard.get_plain(homes[j], h, keys[i], || ()) {
                out[i] = Some(value.clone());
                if deadline != u64::MAX {
                    timed.push((i, deadline));
                }
            }
        }
    }
}

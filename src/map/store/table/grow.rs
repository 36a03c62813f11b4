//! A table's growth: the next slot count, and the move of the old slots
//! into the new ones, all at once or a step at a time.
//!
//! Past [`INCREMENTAL_FROM`] slots (2^17) a table grows a step at a
//! time: the old slots stay beside the new ones, and each probe moves
//! [`MIGRATE_STEP`] of them (32) on, whole clusters at a time, so what is
//! left of the old slots is still a valid table. Lookups and removals
//! that miss the new slots look in the old ones until none is left. At
//! 10^6 entries in one shard, re-placing them all at once made one put
//! hold the shard's write lock for 18-20 ms (2-core VM; every read and
//! the eviction thread waited on it); step by step the longest put of
//! the fill takes ~1 ms (allocating the new slots). The price: the old
//! slots stay allocated beside the new for up to 1/32 of their count in
//! puts after a growth, and those puts take about a microsecond more.
//! Below 2^17 slots a growth all at once takes at most ~2.5 ms; step by
//! step there, a fill of 128 shards put p99 of a put at 2.2-2.7 µs
//! against 0.7-0.8 (`eviction_holds`, nothing expiring).
//!
//! The old slots of a growth under way are [`Old`]; the table's lookups
//! and removals look in them until they are gone ([`Table::find_old`],
//! [`Table::remove_old`]). Nothing here runs user code: a slot is
//! re-placed by the hash bits `hash_of` gives for its slab index.

use super::{EMPTY, MAX_SLOTS, MIN_SLOTS, Table, home_in, next_in, remove_in, scan_in};

/// Slots below which a table grows all at once: re-placing up to 98,304
/// entries takes ~2.5 ms (2-core VM). Larger tables grow a step at a time.
/// Small under `cfg(test)`, so that the unit tests of the table and the
/// shard grow step by step all the time.
pub(super) const INCREMENTAL_FROM: usize = if cfg!(test) { 16 } else { 1 << 17 };

/// Old slots a put moves on while a table grows step by step. A growth by
/// 4/3 leaves room for a quarter of the old slot count in new entries
/// before the new table is 3/4 full, so anything above 4 finishes first
/// (see [`Table::probe`]): at 32 the old slots are gone after 1/32 of
/// their count in puts, and a step (about 24 entries, each a slab read and
/// a slot write at random) takes about a microsecond. Under `cfg(test)` 3,
/// so that the tables of unit tests spend many operations growing.
pub(super) const MIGRATE_STEP: usize = if cfg!(test) { 3 } else { 32 };

/// The slot count after `len`: [`MIN_SLOTS`] first, then 3/2 of a power of
/// two and 4/3 of the others (8, 12, 16, 24, ..., 2^31, 3 * 2^30, 2^32).
pub(super) fn next_len(len: usize) -> usize {
    if len < MIN_SLOTS {
        MIN_SLOTS
    } else if len.is_power_of_two() {
        len + len / 2
    } else {
        len + len / 3
    }
}

/// The slots a growing table has not yet moved into its new ones.
#[derive(Debug, Default)]
#[repr(C)]
pub(super) struct Old {
    /// The slots before the growth; none once every held one has moved.
    pub(super) slots: Box<[u32]>,
    /// Held slots left in `slots`: zero exactly when no growth is under way.
    pub(super) len: usize,
    /// Where the next step starts. Every slot from the growth's start up to
    /// here (in wrapping order) is empty, and a step ends only at an empty
    /// slot, so the clusters from here on are whole: a lookup in `slots`
    /// still finds what they hold.
    pub(super) cursor: usize,
}

impl Table {
    /// The index for `h32`/`eq` among the old slots of a growth under way.
    #[inline]
    pub(super) fn find_old(&self, h32: u32, eq: impl FnMut(u32) -> bool) -> Option<u32> {
        if self.old.len == 0 {
            return None;
        }
        self.scan_old(h32, eq).ok().map(|(_, index)| index)
    }

    /// [`scan_in`] over the old slots (a growth is under way).
    #[inline(never)]
    pub(super) fn scan_old(
        &self,
        h32: u32,
        eq: impl FnMut(u32) -> bool,
    ) -> Result<(usize, u32), usize> {
        let old = &self.old.slots;
        let home = home_in(old.len(), h32);
        scan_in(old, home, self.tag(h32), self.index_mask, eq)
    }

    /// [`remove`](Self::remove) among the old slots of a growth under way.
    #[inline(never)]
    pub(super) fn remove_old(
        &mut self,
        h32: u32,
        eq: impl FnMut(u32) -> bool,
        hash_of: impl Fn(u32) -> u32,
    ) -> Option<u32> {
        let (at, index) = self.scan_old(h32, eq).ok()?;
        // The shift stays inside the cluster of `at`, which lies past the
        // growth's cursor: the moved-from slots stay empty.
        remove_in(&mut self.old.slots, at, self.index_mask, hash_of);
        self.old.len -= 1;
        if self.old.len == 0 {
            self.old = Old::default();
        }
        Some(index)
    }

    /// Moves to the next slot count ([`next_len`], up to [`MAX_SLOTS`]) and
    /// re-places every slot by its key's hash bits: all at once below
    /// [`INCREMENTAL_FROM`] slots, else the first [`MIGRATE_STEP`] of them
    /// now and the rest in the probes that follow. A growth still under way
    /// finishes first.
    #[cold]
    pub(super) fn grow(&mut self, hash_of: &impl Fn(u32) -> u32) {
        if self.old.len != 0 {
            self.migrate(usize::MAX, hash_of);
        }
        if self.slots.len() as u64 >= MAX_SLOTS {
            return;
        }
        let n = next_len(self.slots.len());
        let slots = std::mem::replace(&mut self.slots, vec![EMPTY; n].into_boxed_slice());
        let held = std::mem::replace(&mut self.len, 0);
        if held == 0 {
            return;
        }
        // A table at most 3/4 full has an empty slot; the growth starts
        // just after it, at the start of a cluster.
        let empty = slots.iter().position(|&s| s == EMPTY);
        let empty = empty.expect("a growing table is at most 3/4 full");
        let cursor = next_in(slots.len(), empty);
        let budget = if slots.len() < INCREMENTAL_FROM {
            usize::MAX
        } else {
            MIGRATE_STEP
        };
        self.old = Old {
            slots,
            len: held,
            cursor,
        };
        self.migrate(budget, hash_of);
    }

    /// Moves held old slots into the new ones, from the cursor on: windows
    /// of old slots until `budget` slots were read, then on to the end of
    /// the cluster there, so every cluster is moved whole. Drops the old
    /// slots once none is held.
    ///
    /// In blocks: compact the held slots of a window without a branch per
    /// slot (a table half full is empty at random), read all their hash
    /// bits (independent loads into the slab, which overlap), then place
    /// them. The home slot grows with the hash, so the old slots, read in
    /// order, land roughly in order. A branch on each old slot, and each
    /// hash read waiting behind it, made growth a quarter of a 10^6-entry
    /// fill.
    pub(super) fn migrate(&mut self, budget: usize, hash_of: &impl Fn(u32) -> u32) {
        const BLOCK: usize = 64;
        let (mut held, mut hashes) = ([EMPTY; BLOCK], [0u32; BLOCK]);
        let n = self.old.slots.len();
        let mut read = 0;
        while self.old.len != 0 {
            let c = self.old.cursor;
            let mut k = 0;
            if read < budget {
                let w = BLOCK.min(n - c).min(budget - read);
                for s in &mut self.old.slots[c..c + w] {
                    held[k] = *s;
                    k += usize::from(*s != EMPTY);
                    *s = EMPTY;
                }
                self.old.cursor = next_in(n, c + w - 1);
                read += w;
            } else {
                // The rest of the cluster the last window ended in.
                let mut c = c;
                while k < BLOCK && self.old.slots[c] != EMPTY {
                    held[k] = std::mem::replace(&mut self.old.slots[c], EMPTY);
                    k += 1;
                    c = next_in(n, c);
                }
                self.old.cursor = c;
                if k == 0 {
                    return;
                }
            }
            for (h32, &s) in hashes.iter_mut().zip(&held[..k]) {
                *h32 = hash_of(s & self.index_mask);
            }
            for (&s, &h32) in held[..k].iter().zip(&hashes) {
                let mut i = self.home(h32);
                while self.slots[i] != EMPTY {
                    i = next_in(self.slots.len(), i);
                }
                self.slots[i] = s;
            }
            self.old.len -= k;
            self.len += k;
        }
        self.old = Old::default();
    }
}

#[cfg(test)]
mod tests {
    use super::super::Probe;
    use super::super::tests::{insert, next};
    use super::*;
    use std::collections::HashSet;

    /// A growth moves old slots a few per probe (3 under `cfg(test)`, from
    /// 16 slots up): between steps every entry is found exactly once, in
    /// whichever table holds it, removals in the old slots keep the rest
    /// reachable, moved-from slots stay empty, and a growth that fell
    /// behind (forced here: steps of 3 slots and the ends of the clusters
    /// they reach keep up) finishes before the next begins. Checked after
    /// every operation during a growth (and every 64th otherwise), with
    /// hash bits from 8 values (long clusters that wrap) and from all 2^32.
    #[test]
    #[cfg_attr(miri, ignore = "safe code; slow under Miri")]
    fn growth_step_by_step_keeps_every_entry_findable() {
        for (seed, buckets) in [(4, Some(8u32)), (5, None)] {
            let hash_of = |index: u32| {
                let mixed = index.wrapping_mul(0x2545_F491);
                buckets.map_or(mixed, |b| mixed % b)
            };
            let mut state = seed;
            let mut table = Table::new();
            let mut model: HashSet<u32> = HashSet::new();
            let (mut midway, mut finished_at_once) = (0, 0);
            for _ in 0..8_000 {
                let r = next(&mut state);
                let index = (r % 3_000) as u32;
                let (h32, eq) = (hash_of(index), |i: u32| i == index);
                if r >> 62 == 0 {
                    let want = model.remove(&index).then_some(index);
                    assert_eq!(table.remove(h32, eq, hash_of), want);
                } else {
                    match table.probe(h32, eq, index, hash_of) {
                        Probe::Found(i) => assert!(i == index && model.contains(&index)),
                        Probe::Vacant(at) => {
                            assert!(model.insert(index));
                            table.fill(at, h32, index);
                        }
                    }
                }
                if table.old.len != 0 && r % 16 == 0 && table.len() * 2 > table.slots.len() {
                    let slots = table.slots.len();
                    table.grow(&hash_of);
                    assert!(table.slots.len() > slots);
                    finished_at_once += 1;
                }
                midway += usize::from(table.old.len != 0);
                if table.old.len != 0 || r % 64 == 0 {
                    table.validate(hash_of);
                }
                assert_eq!(table.len(), model.len());
                let probe = (next(&mut state) % 3_000) as u32;
                let want = model.contains(&probe).then_some(probe);
                assert_eq!(table.find(hash_of(probe), |i| i == probe), want);
            }
            assert!(midway > 500, "{midway} operations during a growth");
            assert!(finished_at_once > 0, "no growth finished an earlier one");
            for &index in &model {
                assert_eq!(table.find(hash_of(index), |i| i == index), Some(index));
            }
        }
    }

    /// Between 1/2 and 3/4 full from 6 entries on (at 5 entries the table
    /// has its first 8 slots), through the 3/2, 4/3 growth sequence.
    #[test]
    #[cfg_attr(miri, ignore = "safe code; slow under Miri")]
    fn stays_between_half_and_three_quarters_full() {
        let mut table = Table::new();
        let hash_of = |index: u32| index.wrapping_mul(0x85EB_CA6B);
        let mut lens = vec![];
        for index in 0..10_000u32 {
            insert(&mut table, hash_of(index), index, hash_of);
            let (held, n) = (table.len(), table.slots.len());
            assert!(held * 4 <= n * 3, "{held} in {n} slots");
            assert!(held < 6 || held * 2 >= n, "{held} in {n} slots");
            if lens.last() != Some(&n) {
                lens.push(n);
            }
        }
        let mut want = vec![8usize, 12];
        while *want.last().unwrap() < 16_384 {
            let n = want[want.len() - 2] * 2;
            want.push(n);
        }
        assert_eq!(lens, want);
        assert_eq!(lens[..6], [8, 12, 16, 24, 32, 48]);
        table.validate(hash_of);
    }

    #[test]
    fn slot_counts_end_at_two_to_the_32() {
        let mut n = 8usize;
        let mut steps = 0;
        while (n as u64) < MAX_SLOTS {
            let next = next_len(n);
            assert!(next > n && (next * 2 <= n * 3), "{n} -> {next}");
            n = next;
            steps += 1;
        }
        assert_eq!(n as u64, MAX_SLOTS);
        assert_eq!(steps, 2 * (32 - 3));
    }
}

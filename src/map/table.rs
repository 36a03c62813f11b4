//! The shard's hash table: open addressing with linear probing over 8-byte
//! slots that hold 32 bits of the key's hash and the entry's slab index.
//!
//! # Why not `hashbrown::HashTable`
//!
//! A hit in a SwissTable loads the control-byte group, then the slot: two
//! dependent cache misses before the shard even reaches the slab node that
//! holds the key and value (a third). Here the slot *is* the first load: the
//! stored hash bits reject almost every other key (a false match needs equal
//! 32-bit hashes), so a hit is one slot line and one node, the same two
//! misses as a plain `HashMap<u64, u64>` hit. The control bytes were also a
//! byte per bucket more than this table stores.
//!
//! # Ground rules
//!
//! * No `unsafe` and no user code: the table sees only `u32`s. Key equality is
//!   the caller's closure over the slab index, run only for slots whose hash
//!   bits match.
//! * The home slot is a Fibonacci hash of the stored 32 bits (multiply, keep
//!   the top bits), so growing never needs the key, and a hasher with weak
//!   low bits still spreads over the table.
//! * At most 3/4 full (from 8 slots up to 2^32), so every probe meets an
//!   empty slot and ends. Removal shifts later members of the cluster back instead of
//!   leaving tombstones (Knuth's Algorithm R), so lookups never slow down
//!   after many removals and the table never needs a rehash in place.

use crate::timer::NIL;

/// A slot: the low 32 bits of the key's hash and the entry's slab index.
/// Empty when `index == NIL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    hash: u32,
    index: u32,
}

const EMPTY: Slot = Slot {
    hash: 0,
    index: NIL,
};

/// 2^32 / φ, odd: Knuth's multiplicative hashing constant.
const GOLDEN: u32 = 0x9E37_79B9;

/// Smallest non-empty table, in slots.
const MIN_SLOTS: usize = 8;

/// Largest table, in slots: the home slot is a 32-bit value. A shard's slab
/// holds fewer than 2^32 entries (its indices are `u32`, `NIL` excluded), so
/// a full-size table always keeps an empty slot and every probe still ends;
/// it is simply allowed to fill past 3/4.
const MAX_SLOTS: u64 = 1 << 32;

/// Where [`Table::probe`] stopped.
pub(crate) enum Probe {
    /// The key is held, at this slab index.
    Found(u32),
    /// The key is absent; [`Table::fill`] this slot to insert it.
    Vacant(usize),
}

/// A linear-probing table of `(hash32, slab index)` slots.
#[derive(Debug)]
pub(crate) struct Table {
    /// A power of two in length (or empty).
    slots: Box<[Slot]>,
    /// `32 - log2(slots.len())`: the home slot is the top bits of the product.
    shift: u32,
    len: usize,
}

impl Table {
    pub(crate) fn new() -> Self {
        Self {
            slots: Box::new([]),
            shift: 32,
            len: 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The slot where a probe for hash bits `h32` starts. Only for a
    /// non-empty table (`shift < 32`).
    #[inline]
    fn home(&self, h32: u32) -> usize {
        (h32.wrapping_mul(GOLDEN) >> self.shift) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The position of the slot for hash bits `h32` whose index satisfies
    /// `eq`, if any.
    #[inline]
    fn position(&self, h32: u32, mut eq: impl FnMut(u32) -> bool) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(h32);
        loop {
            let s = self.slots[i];
            if s.index == NIL {
                return None;
            }
            if s.hash == h32 && eq(s.index) {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// The slab index held for hash bits `h32` that satisfies `eq`.
    #[inline]
    pub(crate) fn find(&self, h32: u32, eq: impl FnMut(u32) -> bool) -> Option<u32> {
        self.position(h32, eq).map(|i| self.slots[i].index)
    }

    /// Finds the index for `h32`/`eq`, or makes room for one more slot and
    /// returns where it goes. If `eq` panics, the table is unchanged apart
    /// from possibly having grown.
    #[inline]
    pub(crate) fn probe(&mut self, h32: u32, mut eq: impl FnMut(u32) -> bool) -> Probe {
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(h32);
        loop {
            let s = self.slots[i];
            if s.index == NIL {
                return Probe::Vacant(i);
            }
            if s.hash == h32 && eq(s.index) {
                return Probe::Found(s.index);
            }
            i = (i + 1) & mask;
        }
    }

    /// Stores `index` in the vacant slot `at` that [`probe`](Self::probe)
    /// just returned for `h32` (no change to the table in between).
    #[inline]
    pub(crate) fn fill(&mut self, at: usize, h32: u32, index: u32) {
        debug_assert_eq!(self.slots[at], EMPTY);
        debug_assert_ne!(index, NIL);
        self.slots[at] = Slot { hash: h32, index };
        self.len += 1;
    }

    /// Removes the slot for `h32` whose index satisfies `eq`, returning the
    /// index.
    #[inline]
    pub(crate) fn remove(&mut self, h32: u32, eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let at = self.position(h32, eq)?;
        let index = self.slots[at].index;
        self.remove_at(at);
        Some(index)
    }

    /// Empties slot `hole` and shifts back the later members of its cluster
    /// whose probe passed over it, so no lookup ever stops early.
    fn remove_at(&mut self, mut hole: usize) {
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let s = self.slots[j];
            if s.index == NIL {
                break;
            }
            // `s` may fill the hole unless its home lies cyclically in
            // (hole, j]: then its probe never passed the hole.
            let home = self.home(s.hash);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
    }

    /// Doubles the slot count (from [`MIN_SLOTS`], up to [`MAX_SLOTS`]) and
    /// re-places every slot by its stored hash bits.
    #[cold]
    fn grow(&mut self) {
        if self.slots.len() as u64 >= MAX_SLOTS {
            return;
        }
        let n = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; n].into_boxed_slice());
        // n is a power of two in 8..=2^32, so the shift is in 0..=29.
        self.shift = 32 - n.trailing_zeros();
        let mask = self.mask();
        for s in old.iter().filter(|s| s.index != NIL) {
            let mut i = self.home(s.hash);
            while self.slots[i].index != NIL {
                i = (i + 1) & mask;
            }
            self.slots[i] = *s;
        }
    }

    /// Every held `(hash32, index)`, in slot order. Test-only.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.index != NIL)
            .map(|s| (s.hash, s.index))
    }

    /// Checks that every held slot is reachable by a probe from its home
    /// (no empty slot between them) and that `len` is right. Test-only.
    #[cfg(test)]
    pub(crate) fn validate(&self) {
        let held = self.slots.iter().filter(|s| s.index != NIL).count();
        assert_eq!(held, self.len, "table len mismatch");
        assert!(
            self.slots.is_empty()
                || held * 4 <= self.slots.len() * 3
                || self.slots.len() as u64 == MAX_SLOTS
        );
        for (at, s) in self.slots.iter().enumerate() {
            if s.index == NIL {
                continue;
            }
            let mask = self.mask();
            let mut i = self.home(s.hash);
            while i != at {
                assert_ne!(self.slots[i].index, NIL, "slot {at} cut off from its home");
                i = (i + 1) & mask;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// SplitMix64, for reproducible random operations.
    fn next(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Random inserts and removes against a `HashMap` model, with hash bits
    /// drawn from a small set (4 or 64 values, then all 2^32) so equal
    /// hashes, long clusters and wrap-around are common. The model maps an index to its hash bits.
    #[test]
    #[cfg_attr(miri, ignore = "safe code; ~100 s under Miri")]
    fn random_ops_match_model() {
        for (seed, buckets) in [(1, Some(4u32)), (2, Some(64)), (3, None)] {
            let mut state = seed;
            let mut table = Table::new();
            let mut model: HashMap<u32, u32> = HashMap::new();
            for _ in 0..50_000 {
                let r = next(&mut state);
                let index = (r % 300) as u32;
                let mixed = index.wrapping_mul(0x85EB_CA6B);
                let h32 = buckets.map_or(mixed, |b| mixed % b);
                let eq = |i: u32| i == index;
                if r >> 62 == 0 {
                    assert_eq!(table.remove(h32, eq), model.remove(&index).map(|_| index));
                } else {
                    match table.probe(h32, eq) {
                        Probe::Found(i) => {
                            assert_eq!(i, index);
                            assert!(model.contains_key(&index));
                        }
                        Probe::Vacant(at) => {
                            assert!(!model.contains_key(&index));
                            table.fill(at, h32, index);
                            model.insert(index, h32);
                        }
                    }
                }
                assert_eq!(
                    table.find(h32, eq),
                    model.contains_key(&index).then_some(index)
                );
                assert_eq!(table.len(), model.len());
            }
            table.validate();
            for (&index, &h32) in &model {
                assert_eq!(table.find(h32, |i| i == index), Some(index));
            }
            let mut held: Vec<_> = table.iter().collect();
            held.sort_unstable();
            let mut expect: Vec<_> = model.iter().map(|(&i, &h)| (h, i)).collect();
            expect.sort_unstable();
            assert_eq!(held, expect);
        }
    }

    /// Removal must keep every other member of a wrapped cluster reachable:
    /// fill the last slots of a table with keys homed there, wrap into the
    /// front, then remove from the middle and check everything else.
    #[test]
    fn removal_keeps_wrapped_clusters_reachable() {
        let mut table = Table::new();
        // Grow to 8 slots; find hash bits homed at the last slot.
        let _ = table.probe(0, |_| false);
        let last: Vec<u32> = (0u32..)
            .filter(|&h| table.home(h) == MIN_SLOTS - 1)
            .take(4)
            .collect();
        for (index, &h) in last.iter().enumerate() {
            match table.probe(h, |_| false) {
                Probe::Vacant(at) => table.fill(at, h, index as u32),
                Probe::Found(_) => unreachable!("no slot is held yet"),
            }
        }
        table.validate();
        assert_eq!(table.remove(last[1], |i| i == 1), Some(1));
        table.validate();
        for (index, &h) in last.iter().enumerate() {
            let want = (index != 1).then_some(index as u32);
            assert_eq!(table.find(h, |i| i == index as u32), want);
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "safe code; slow under Miri")]
    fn stays_at_most_three_quarters_full() {
        let mut table = Table::new();
        for index in 0..10_000u32 {
            let h32 = index.wrapping_mul(0x85EB_CA6B);
            match table.probe(h32, |_| false) {
                Probe::Vacant(at) => table.fill(at, h32, index),
                Probe::Found(_) => unreachable!("indices are distinct"),
            }
            assert!(table.len() * 4 <= table.slots.len() * 3);
        }
        // 10,000 / 0.75 = 13,334 -> 16,384 slots.
        assert_eq!(table.slots.len(), 16_384);
        table.validate();
    }
}

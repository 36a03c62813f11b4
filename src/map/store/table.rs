//! The shard's hash table: open addressing with linear probing over 4-byte
//! slots that each hold an entry's slab index and a few bits of its key's
//! hash (a *tag*).
//!
//! # Why not `hashbrown::HashTable`
//!
//! A hit in a SwissTable loads the control-byte group, then the slot: two
//! dependent cache misses before the shard even reaches the slab node that
//! holds the key and value (a third). Here the slot *is* the first load: the
//! tag rejects almost every other key, so a hit is one slot and one node,
//! the same two loads as a plain `HashMap<u64, u64>` hit. At 4 bytes a slot
//! the whole table is the size of an index array: 6.3 bytes per entry at
//! 10^6 entries, where 8-byte `(hash32, index)` slots took 16.8 and made a
//! hit's first load miss the last-level cache twice as often.
//!
//! # Slots
//!
//! The low `b` bits of a slot are the slab index; the rest are the tag, the
//! top `32 - b` bits of a second multiplicative hash of the key's 32 hash
//! bits. `b` starts at [`MIN_INDEX_BITS`] and grows by one whenever the slab
//! outgrows it ([`Table::probe`] is told the slab's length), which is cheap:
//! the tag simply loses its lowest bit. A large shard therefore has a short
//! tag (at 2^28 entries, 4 bits): more slots pass the tag and reach `eq`, but
//! lookups stay correct at every size. An empty slot is all ones, which no
//! held slot can be (its index would be the reserved all-ones index).
//!
//! # Ground rules
//!
//! * No `unsafe` but [`prefetch_line`]'s hint (which the slab uses too)
//!   and the 16-byte SSE2 load of four slots in [`group_masks`], and no
//!   user code: the table sees only `u32`s. Key equality is
//!   the caller's closure over the slab index, run only for slots whose tag
//!   matches. The key's 32 hash bits live with the slab node; growth and
//!   removal ask the caller's `hash_of(index)` for them, never the key.
//! * The home slot is a Fibonacci hash of the 32 bits scaled to the slot
//!   count (multiply by 2^32/φ, then by the count, keep the top 32 bits of
//!   the 64-bit product), so a hasher with weak low bits still spreads over
//!   the table, and the count need not be a power of two.
//! * The count grows by 3/2 and 4/3 in turn (8, 12, 16, 24, 32, ...), not
//!   by 2: a table is between 1/2 and 3/4 full, where doubling left it
//!   between 3/8 and 3/4. At 10^6 entries in 8 shards that is 6.3 instead
//!   of 8.4 bytes of slots per entry. The price: filling a table from
//!   empty re-places each entry 2.3 to 3.8 times on the way up instead of
//!   1 to 2 times. [`Table::grow`] works in branch-free blocks to pay for
//!   it: a fill of 10^6 entries takes as long per insert as it did with
//!   doubling (147-150 ns against 147-153, minimum of 7 fills).
//! * Past 2^17 slots a table grows a step at a time (`grow`): each probe
//!   moves a few old slots on, and lookups and removals that miss the new
//!   slots look in the old ones until none is left.
//! * A probe tests four slots a step: which are empty and which pass the
//!   tag, as two 4-bit masks, then one branch on whether any of the four
//!   ends the walk or needs `eq`. Testing slot by slot, the branch that
//!   ended a walk at its empty slot (or a hit past its home slot) was
//!   mispredicted about once a probe; four at a time, most walks end in
//!   their first step (BENCHMARKS.md, "A full bounded map's miss").
//! * At most 3/4 full (from 8 slots up to 2^32), so every probe meets an
//!   empty slot and ends. Removal shifts later members of the cluster back
//!   instead of leaving tombstones (Knuth's Algorithm R), so lookups never
//!   slow down after many removals and the table never needs a rehash in
//!   place.

mod grow;

use grow::{MIGRATE_STEP, Old};

/// Hints the CPU to start loading the cache line of `value`.
#[inline]
pub(crate) fn prefetch_line<T>(value: &T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let p = std::ptr::from_ref(value).cast::<i8>();
        // SAFETY: a prefetch is only a hint: it never faults and has no
        // effect on memory, whatever the address (here a valid reference).
        // `unsafe` is needed before Rust 1.87 made the intrinsic safe.
        #[allow(unused_unsafe)]
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p);
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = value;
}

/// An empty slot.
const EMPTY: u32 = u32::MAX;

/// 2^32 / φ, odd: Knuth's multiplicative hashing constant, for the home slot.
const GOLDEN: u32 = 0x9E37_79B9;

/// An odd constant for the tag's hash, unrelated to [`GOLDEN`] (a murmur3
/// finaliser constant), so keys sharing a home do not share a tag more often
/// than chance.
const TAG_MUL: u32 = 0x85EB_CA6B;

/// Index bits of a new table: 4,094 slab indices before the first widening.
const MIN_INDEX_BITS: u32 = 12;

/// Slots of a table's first growth (from the single empty slot of a new
/// table).
const MIN_SLOTS: usize = 8;

/// Largest table, in slots: the home slot is a 32-bit value. A shard's slab
/// holds fewer than 2^32 entries (its indices are `u32`, all-ones excluded),
/// so a full-size table always keeps an empty slot and every probe still
/// ends; it is simply allowed to fill past 3/4.
const MAX_SLOTS: u64 = 1 << 32;

/// The home slot of hash bits `h32` in a table of `n` slots: the Fibonacci
/// hash as a fraction of 2^32, times `n`.
#[inline]
fn home_in(n: usize, h32: u32) -> usize {
    // < 2^32 * n / 2^32 = n, and n <= 2^32 fits the product.
    ((u64::from(h32.wrapping_mul(GOLDEN)) * n as u64) >> 32) as usize
}

/// The slot after `i` in a table of `n` slots, wrapping at the end.
#[inline]
fn next_in(n: usize, i: usize) -> usize {
    let j = i + 1;
    if j == n { 0 } else { j }
}

/// How many steps forward, wrapping, from slot `from` to slot `to` in a
/// table of `n` slots.
#[inline]
fn distance_in(n: usize, from: usize, to: usize) -> usize {
    if to >= from { to - from } else { to + n - from }
}

/// Which of four slots are empty (bit `j` for `g[j]`), and which have
/// the tag bits `hi` of `tag` (an empty slot may too).
#[inline(always)]
fn group_masks(g: &[u32; 4], tag: u32, hi: u32) -> (u32, u32) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        use std::arch::x86_64::{
            _mm_and_si128, _mm_castsi128_ps, _mm_cmpeq_epi32, _mm_loadu_si128, _mm_movemask_ps,
            _mm_set1_epi32, _mm_setzero_si128, _mm_xor_si128,
        };
        // SAFETY: SSE2 is part of every x86-64 CPU. The only memory read is
        // the unaligned 16-byte load of `g`, a valid `[u32; 4]` borrowed
        // for the call; the rest works on registers.
        #[allow(unused_unsafe)]
        unsafe {
            let v = _mm_loadu_si128(g.as_ptr().cast());
            let empty = _mm_cmpeq_epi32(v, _mm_set1_epi32(EMPTY as i32));
            let masked = _mm_and_si128(
                _mm_xor_si128(v, _mm_set1_epi32(tag as i32)),
                _mm_set1_epi32(hi as i32),
            );
            let tagged = _mm_cmpeq_epi32(masked, _mm_setzero_si128());
            (
                _mm_movemask_ps(_mm_castsi128_ps(empty)) as u32,
                _mm_movemask_ps(_mm_castsi128_ps(tagged)) as u32,
            )
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        let mut empty = 0u32;
        let mut tagged = 0u32;
        for (j, &s) in g.iter().enumerate() {
            empty |= u32::from(s == EMPTY) << j;
            tagged |= u32::from((s ^ tag) & hi == 0) << j;
        }
        (empty, tagged)
    }
}

/// Walks the cluster of `slots` from `home`: `Ok((position, index))` of the
/// slot whose tag bits equal `tag` and whose index satisfies `eq`, or
/// `Err(position)` of the empty slot that ends the walk.
#[inline(always)]
fn scan_in(
    slots: &[u32],
    home: usize,
    tag: u32,
    index_mask: u32,
    mut eq: impl FnMut(u32) -> bool,
) -> Result<(usize, u32), usize> {
    // From `home` to the end, then from the start: the wrap is tested once,
    // not at every slot (a miss in a 3/4-full table passes ~8 of them).
    let (wrapped, from_home) = slots.split_at(home);
    #[inline(always)]
    fn at(
        i: usize,
        s: u32,
        tag: u32,
        index_mask: u32,
        eq: &mut impl FnMut(u32) -> bool,
    ) -> Option<Result<(usize, u32), usize>> {
        if s == EMPTY {
            Some(Err(i))
        } else if (s ^ tag) & !index_mask == 0 && eq(s & index_mask) {
            Some(Ok((i, s & index_mask)))
        } else {
            None
        }
    }
    // Four slots at a time: one branch on whether any of them ends the
    // walk or passes the tag, instead of one per slot.
    let hi = !index_mask;
    let mut groups = from_home.chunks_exact(4);
    let mut base = home;
    for g in &mut groups {
        let g: &[u32; 4] = g.try_into().expect("chunks of four");
        let (empty, tagged) = group_masks(g, tag, hi);
        let mut events = empty | tagged;
        while events != 0 {
            let j = events.trailing_zeros();
            if empty >> j & 1 != 0 {
                return Err(base + j as usize);
            }
            let index = g[j as usize] & index_mask;
            if eq(index) {
                return Ok((base + j as usize, index));
            }
            events &= events - 1;
        }
        base += 4;
    }
    for (i, &s) in groups.remainder().iter().enumerate() {
        if let Some(r) = at(base + i, s, tag, index_mask, &mut eq) {
            return r;
        }
    }
    for (i, &s) in wrapped.iter().enumerate() {
        if let Some(r) = at(i, s, tag, index_mask, &mut eq) {
            return r;
        }
    }
    unreachable!("a table always holds an empty slot")
}

/// Empties slot `hole` of `slots` and shifts back the later members of its
/// cluster whose probe passed over it, so no lookup ever stops early.
fn remove_in(slots: &mut [u32], mut hole: usize, index_mask: u32, hash_of: impl Fn(u32) -> u32) {
    let n = slots.len();
    let mut j = hole;
    loop {
        j = next_in(n, j);
        let s = slots[j];
        if s == EMPTY {
            break;
        }
        // `s` may fill the hole unless its home lies cyclically in
        // (hole, j]: then its probe never passed the hole.
        let home = home_in(n, hash_of(s & index_mask));
        if distance_in(n, home, j) >= distance_in(n, hole, j) {
            slots[hole] = s;
            hole = j;
        }
    }
    slots[hole] = EMPTY;
}

/// The home slot of a lookup, from [`Table::start`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Home(usize);

/// Where [`Table::probe`] stopped.
pub(crate) enum Probe {
    /// The key is held, at this slab index.
    Found(u32),
    /// The key is absent; [`Table::fill`] this slot to insert it.
    Vacant(usize),
}

/// A linear-probing table of `tag | slab index` slots.
///
/// `repr(C)`: a probe's fields first (see `Shard`'s layout).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Table {
    /// One empty slot (a new table), a length from
    /// [`next_len`](grow::next_len)'s sequence (`2^k` or `3 * 2^k`), or
    /// one chosen by [`with_capacity`](Self::with_capacity) and what grows
    /// from it.
    /// Never zero slots, so a probe never checks for a missing table: it
    /// meets an empty slot.
    slots: Box<[u32]>,
    /// The index bits of a slot (`2^b - 1`); the other bits are the tag.
    /// Both tables of a growth share them.
    index_mask: u32,
    /// Held slots in `slots`.
    len: usize,
    /// While a large table grows: the old slots not yet moved.
    old: Old,
}

impl Table {
    pub(crate) fn new() -> Self {
        Self {
            slots: Box::new([EMPTY]),
            index_mask: (1 << MIN_INDEX_BITS) - 1,
            len: 0,
            old: Old::default(),
        }
    }

    /// A table that holds `n` entries without growing: the fewest slots
    /// that stay at most 3/4 full with `n + 1` (a probe for a new key checks
    /// the load before it knows whether the key is new). Any slot count
    /// works (the home slot is scaled to it); growth from it goes on by 3/2
    /// or 4/3. For a bounded shard, whose entry count is known: its table
    /// is 3/4 full when the shard is, where growth from empty leaves it
    /// between 1/2 and 3/4 full.
    pub(crate) fn with_capacity(n: usize) -> Self {
        let slots = (4 * (n + 1))
            .div_ceil(3)
            .clamp(MIN_SLOTS, MAX_SLOTS as usize);
        Self {
            slots: vec![EMPTY; slots].into_boxed_slice(),
            index_mask: (1 << MIN_INDEX_BITS) - 1,
            len: 0,
            old: Old::default(),
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len + self.old.len
    }

    /// The slot where a probe for hash bits `h32` starts.
    #[inline]
    fn home(&self, h32: u32) -> usize {
        home_in(self.slots.len(), h32)
    }

    /// The tag bits of hash bits `h32`, in place (index bits zero).
    #[inline]
    fn tag(&self, h32: u32) -> u32 {
        (h32 ^ (h32 >> 16)).wrapping_mul(TAG_MUL) & !self.index_mask
    }

    /// Walks the cluster from the home slot of `h32` in the new slots, as
    /// [`scan_in`] does.
    #[inline]
    fn scan(&self, h32: u32, eq: impl FnMut(u32) -> bool) -> Result<(usize, u32), usize> {
        self.scan_from(self.home(h32), h32, eq)
    }

    /// [`scan`](Self::scan) from `home`, which must be `self.home(h32)`.
    #[inline]
    fn scan_from(
        &self,
        home: usize,
        h32: u32,
        eq: impl FnMut(u32) -> bool,
    ) -> Result<(usize, u32), usize> {
        scan_in(&self.slots, home, self.tag(h32), self.index_mask, eq)
    }

    /// The slab index a lookup of hash bits `h32` most likely ends at: the
    /// first slot of its cluster (in the new slots) whose tag matches, with
    /// no `eq` run. Only for a prefetch: it may be another key's entry.
    #[inline]
    pub(crate) fn guess(&self, h32: u32) -> Option<u32> {
        self.scan(h32, |_| true).ok().map(|(_, index)| index)
    }

    /// Hints the CPU to start loading the home slot of hash bits `h32`.
    #[inline]
    pub(crate) fn prefetch_home(&self, h32: u32) {
        self.start(h32);
    }

    /// Starts a lookup of hash bits `h32`: hints the CPU to load its home
    /// slot, and returns that slot for [`find_from`](Self::find_from), so
    /// the lookup does not compute it twice. Valid until the table changes.
    #[inline]
    pub(crate) fn start(&self, h32: u32) -> Home {
        let home = self.home(h32);
        prefetch_line(&self.slots[home]);
        Home(home)
    }

    /// [`find`](Self::find) from `home`, which [`start`](Self::start) gave
    /// for `h32` with the table unchanged since.
    #[inline(always)]
    pub(crate) fn find_from(
        &self,
        home: Home,
        h32: u32,
        eq: impl Fn(u32) -> bool + Copy,
    ) -> Option<u32> {
        debug_assert_eq!(home.0, self.home(h32));
        match self.scan_from(home.0, h32, eq) {
            Ok((_, index)) => Some(index),
            Err(_) if self.old.len == 0 => None,
            Err(_) => self.find_old(h32, eq),
        }
    }

    /// The slab index held for hash bits `h32` that satisfies `eq`.
    #[inline]
    pub(crate) fn find(&self, h32: u32, eq: impl Fn(u32) -> bool + Copy) -> Option<u32> {
        self.find_from(Home(self.home(h32)), h32, eq)
    }

    /// Finds the index for `h32`/`eq`, or makes room for one more slot that
    /// may hold any index up to `max_index`, and returns where it goes.
    /// `hash_of(i)` gives the hash bits of every held index `i` (to re-place
    /// slots when the table grows). If `eq` panics, the table holds the
    /// same entries, maybe further into a growth.
    ///
    /// While a growth is under way each probe first moves
    /// [`MIGRATE_STEP`] old slots on. If the new slots would pass 3/4 full
    /// before the old ones are gone (which the step size rules out for
    /// inserts alone), the growth finishes at once and the next begins.
    ///
    /// # Panics
    ///
    /// If `max_index` is `u32::MAX` (reserved).
    #[inline]
    pub(crate) fn probe(
        &mut self,
        h32: u32,
        mut eq: impl FnMut(u32) -> bool,
        max_index: u32,
        hash_of: impl Fn(u32) -> u32,
    ) -> Probe {
        if max_index >= self.index_mask {
            self.widen(max_index);
        }
        if self.old.len != 0 {
            self.migrate(MIGRATE_STEP, &hash_of);
        }
        if (self.len + self.old.len + 1) * 4 > self.slots.len() * 3 {
            self.grow(&hash_of);
        }
        match self.scan(h32, &mut eq) {
            Ok((_, index)) => Probe::Found(index),
            Err(at) => match self.find_old(h32, eq) {
                Some(index) => Probe::Found(index),
                None => Probe::Vacant(at),
            },
        }
    }

    /// The slot where a key with hash bits `h32`, known to be absent, goes:
    /// the empty slot that ends its cluster. For a [`fill`](Self::fill)
    /// after removals since the [`probe`](Self::probe) that found it
    /// absent (which ran `eq`; this does not).
    pub(crate) fn vacant(&self, h32: u32) -> usize {
        match self.scan(h32, |_| false) {
            Err(at) => at,
            Ok(_) => unreachable!("a probe that never matches ends at an empty slot"),
        }
    }

    /// Stores `index` (at most the `max_index` given to the probe) in the
    /// vacant slot `at` that [`probe`](Self::probe) just returned for `h32`
    /// (no change to the table in between).
    #[inline]
    pub(crate) fn fill(&mut self, at: usize, h32: u32, index: u32) {
        debug_assert_eq!(self.slots[at], EMPTY);
        // Memory safety: an index with bits under the tag would read back
        // as another node, maybe a vacant one. `probe` widened the mask for
        // `max_index`, which `alloc` never exceeds; checked here anyway, as
        // the two sit in different modules (one predictable branch).
        assert!(
            index < self.index_mask,
            "slot index {index} does not fit the table"
        );
        self.slots[at] = self.tag(h32) | index;
        self.len += 1;
    }

    /// Removes the slot for `h32` whose index satisfies `eq`, returning the
    /// index. `hash_of` as for [`probe`](Self::probe).
    #[inline]
    pub(crate) fn remove(
        &mut self,
        h32: u32,
        mut eq: impl FnMut(u32) -> bool,
        hash_of: impl Fn(u32) -> u32,
    ) -> Option<u32> {
        match self.scan(h32, &mut eq) {
            Ok((at, index)) => {
                remove_in(&mut self.slots, at, self.index_mask, hash_of);
                self.len -= 1;
                Some(index)
            }
            Err(_) if self.old.len == 0 => None,
            Err(_) => self.remove_old(h32, eq, hash_of),
        }
    }

    /// Gives slots enough index bits for `max_index`, taking them from the
    /// low end of the tag. Each held index is below the old `2^b - 1`, so
    /// its new bit is zero: clearing the tag's lowest bit per added bit
    /// re-encodes the slot in place, with no hash needed.
    ///
    /// # Panics
    ///
    /// If `max_index` is `u32::MAX`.
    #[cold]
    fn widen(&mut self, max_index: u32) {
        assert_ne!(max_index, u32::MAX, "expiremap: slab index out of range");
        let mut index_mask = self.index_mask;
        while max_index >= index_mask {
            index_mask = index_mask << 1 | 1;
        }
        let added = index_mask & !self.index_mask;
        // Without a branch per slot (half of them are empty, at random): an
        // empty slot keeps all its bits.
        for s in self.slots.iter_mut().chain(self.old.slots.iter_mut()) {
            *s &= !added | u32::from(*s == EMPTY).wrapping_neg();
        }
        self.index_mask = index_mask;
    }

    /// Every held index, new slots then old. Test-only.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots
            .iter()
            .chain(self.old.slots.iter())
            .filter(|&&s| s != EMPTY)
            .map(|&s| s & self.index_mask)
    }

    /// Checks that every held slot is reachable by a probe from its home
    /// (no empty slot between them) in its table, that its tag matches
    /// `hash_of`, that no index is held twice, that a growth's moved-from
    /// slots are empty, and that the lengths are right. Test-only.
    #[cfg(test)]
    pub(crate) fn validate(&self, hash_of: impl Fn(u32) -> u32) {
        assert!(!self.slots.is_empty(), "a table without slots");
        let total = self.len + self.old.len;
        assert!(
            self.slots.len() == 1
                || total * 4 <= self.slots.len() * 3
                || self.slots.len() as u64 == MAX_SLOTS
        );
        let mut seen = std::collections::HashSet::new();
        for (slots, len) in [(&self.slots, self.len), (&self.old.slots, self.old.len)] {
            let held = slots.iter().filter(|&&s| s != EMPTY).count();
            assert_eq!(held, len, "table len mismatch");
            for (at, &s) in slots.iter().enumerate() {
                if s == EMPTY {
                    continue;
                }
                let index = s & self.index_mask;
                assert_ne!(index, self.index_mask, "slot {at} holds the reserved index");
                assert!(seen.insert(index), "index {index} held twice");
                let h32 = hash_of(index);
                assert_eq!(s & !self.index_mask, self.tag(h32), "slot {at}: wrong tag");
                let mut i = home_in(slots.len(), h32);
                while i != at {
                    assert_ne!(slots[i], EMPTY, "slot {at} cut off from its home");
                    i = next_in(slots.len(), i);
                }
            }
        }
        if self.old.len == 0 {
            assert!(self.old.slots.is_empty(), "old slots kept after a growth");
        } else {
            // From the cursor back to the empty slot before the first held
            // one, every slot is empty: held slots sit in one wrapping run.
            let n = self.old.slots.len();
            assert_eq!(self.old.slots[(self.old.cursor + n - 1) % n], EMPTY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// SplitMix64, for reproducible random operations.
    pub(super) fn next(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Inserts `index` with hash bits `h32`, which must be absent.
    pub(super) fn insert(table: &mut Table, h32: u32, index: u32, hash_of: impl Fn(u32) -> u32) {
        match table.probe(h32, |_| false, index, hash_of) {
            Probe::Vacant(at) => table.fill(at, h32, index),
            Probe::Found(_) => unreachable!("`eq` never matches"),
        }
    }

    /// The four-slot masks (SSE2 on x86-64, plain code elsewhere and under
    /// Miri) say, slot by slot, what the one-slot test says: empty slots,
    /// and slots whose bits above the index match the tag's, the empty one
    /// included when the tag's high bits are all ones.
    #[test]
    fn group_masks_match_the_slot_by_slot_test() {
        let mut state = 7;
        for round in 0..if cfg!(miri) { 200 } else { 20_000 } {
            let index_mask = (1u32 << (12 + round % 17)) - 1;
            let hi = !index_mask;
            let tag = match round % 3 {
                0 => u32::MAX,
                _ => next(&mut state) as u32,
            };
            let mut g = [0u32; 4];
            for s in &mut g {
                let r = next(&mut state);
                *s = match r % 4 {
                    0 => EMPTY,
                    1 => (tag & hi) | ((r >> 8) as u32 & index_mask),
                    _ => (r >> 8) as u32,
                };
            }
            let (empty, tagged) = group_masks(&g, tag, hi);
            for (j, &s) in g.iter().enumerate() {
                assert_eq!(empty >> j & 1 != 0, s == EMPTY, "{g:x?} {tag:x}");
                assert_eq!(tagged >> j & 1 != 0, (s ^ tag) & hi == 0, "{g:x?} {tag:x}");
            }
            assert_eq!((empty | tagged) >> 4, 0);
        }
    }

    /// Random inserts and removes against a set model, with hash bits drawn
    /// from a small set (4 or 64 values, then all 2^32) so equal hashes,
    /// long clusters and wrap-around are common. Indices reach past 2^13,
    /// so slots widen twice on the way.
    #[test]
    #[cfg_attr(miri, ignore = "safe code; ~100 s under Miri")]
    fn random_ops_match_model() {
        for (seed, buckets) in [(1, Some(4u32)), (2, Some(64)), (3, None)] {
            let hash_of = |index: u32| {
                let mixed = index.wrapping_mul(0x85EB_CA6B);
                buckets.map_or(mixed, |b| mixed % b)
            };
            let mut state = seed;
            let mut table = Table::new();
            let mut model: HashSet<u32> = HashSet::new();
            for step in 0..50_000u32 {
                let r = next(&mut state);
                // Small indices first, then up to 299 * 34 = 10,166.
                let index = (r % 300) as u32 * (1 + step / 1_500);
                let h32 = hash_of(index);
                let eq = |i: u32| i == index;
                if r >> 62 == 0 {
                    let want = model.remove(&index).then_some(index);
                    assert_eq!(table.remove(h32, eq, hash_of), want);
                } else {
                    match table.probe(h32, eq, index, hash_of) {
                        Probe::Found(i) => {
                            assert_eq!(i, index);
                            assert!(model.contains(&index));
                        }
                        Probe::Vacant(at) => {
                            assert!(!model.contains(&index));
                            table.fill(at, h32, index);
                            model.insert(index);
                        }
                    }
                }
                assert_eq!(table.find(h32, eq), model.contains(&index).then_some(index));
                assert_eq!(table.len(), model.len());
            }
            assert_eq!(table.index_mask, (1 << 14) - 1, "widened twice");
            table.validate(hash_of);
            for &index in &model {
                assert_eq!(table.find(hash_of(index), |i| i == index), Some(index));
            }
            let mut held: Vec<_> = table.iter().collect();
            held.sort_unstable();
            let mut expect: Vec<_> = model.into_iter().collect();
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
        let _ = table.probe(0, |_| false, 0, |_| unreachable!("empty"));
        let last: Vec<u32> = (0u32..)
            .filter(|&h| table.home(h) == MIN_SLOTS - 1)
            .take(4)
            .collect();
        let hash_of = |index: u32| last[index as usize];
        for (index, &h) in last.iter().enumerate() {
            insert(&mut table, h, index as u32, hash_of);
        }
        table.validate(hash_of);
        assert_eq!(table.remove(last[1], |i| i == 1, hash_of), Some(1));
        table.validate(hash_of);
        for (index, &h) in last.iter().enumerate() {
            let want = (index != 1).then_some(index as u32);
            assert_eq!(table.find(h, |i| i == index as u32), want);
        }
    }

    /// Equal hash bits share home and tag, so only `eq` tells them apart;
    /// a tag that differs must reject a slot without calling `eq`.
    #[test]
    fn tags_reject_other_keys_and_equal_hashes_reach_eq() {
        let mut table = Table::new();
        let hash_of = |index: u32| if index < 3 { 7 } else { index };
        for index in 0..100 {
            insert(&mut table, hash_of(index), index, hash_of);
        }
        table.validate(hash_of);
        // Three keys with hash bits 7: `eq` decides among them.
        for index in 0..3 {
            assert_eq!(table.find(7, |i| i == index), Some(index));
        }
        // Hash bits held by no key: with 20-bit tags, `eq` is not called.
        let absent = (1000u32..)
            .find(|&h| {
                table.tag(h) != table.tag(7) && (3..100).all(|i| table.tag(h) != table.tag(i))
            })
            .unwrap();
        assert_eq!(table.find(absent, |_| panic!("eq on a wrong tag")), None);
    }

    /// Widening moves one bit from each held slot's tag to its index field
    /// and keeps every entry findable; at 2^32 - 2 the index takes all bits.
    #[test]
    fn widening_keeps_entries_and_reaches_all_bits() {
        let mut table = Table::new();
        let hash_of = |index: u32| index.wrapping_mul(0x2545_F491);
        for index in 0..1_000 {
            insert(&mut table, hash_of(index), index, hash_of);
        }
        insert(&mut table, hash_of(70_000), 70_000, hash_of);
        assert_eq!(table.index_mask, (1 << 17) - 1);
        table.validate(hash_of);
        for index in (0..1_000).chain([70_000]) {
            assert_eq!(table.find(hash_of(index), |i| i == index), Some(index));
        }
        let big = u32::MAX - 1;
        insert(&mut table, hash_of(big), big, hash_of);
        assert_eq!(table.index_mask, u32::MAX);
        table.validate(hash_of);
        for index in (0..1_000).chain([70_000, big]) {
            assert_eq!(table.find(hash_of(index), |i| i == index), Some(index));
        }
    }

    #[test]
    #[should_panic(expected = "slab index out of range")]
    fn the_all_ones_index_is_refused() {
        let mut table = Table::new();
        let _ = table.probe(1, |_| false, u32::MAX, |i| i);
    }

    /// The home slot covers the whole table for any slot count, and keeps
    /// the order of the Fibonacci hash (so growth fills front to back).
    #[test]
    #[cfg_attr(miri, ignore = "safe code; slow under Miri")]
    fn homes_cover_a_table_of_any_length() {
        for n in [8usize, 12, 24, 3 << 10] {
            let table = Table {
                slots: vec![EMPTY; n].into_boxed_slice(),
                index_mask: (1 << MIN_INDEX_BITS) - 1,
                len: 0,
                old: Old::default(),
            };
            let mut seen = vec![false; n];
            let mut last = (0u32, 0usize);
            for f in (0..=u32::MAX).step_by(1 << 16) {
                // The h32 whose Fibonacci hash is `f` (GOLDEN is odd).
                let h32 = f.wrapping_mul(GOLDEN_INVERSE);
                assert_eq!(h32.wrapping_mul(GOLDEN), f);
                let home = table.home(h32);
                assert!(home < n);
                assert!(f < last.0 || home >= last.1, "order at {f}");
                seen[home] = true;
                last = (f, home);
            }
            assert!(seen.iter().all(|&s| s), "{n}: some slot is nobody's home");
        }
    }

    /// The multiplicative inverse of [`GOLDEN`] modulo 2^32.
    const GOLDEN_INVERSE: u32 = {
        // Newton's iteration doubles the correct low bits each step.
        let mut x = GOLDEN;
        let mut i = 0;
        while i < 5 {
            x = x.wrapping_mul(2u32.wrapping_sub(GOLDEN.wrapping_mul(x)));
            i += 1;
        }
        x
    };
}

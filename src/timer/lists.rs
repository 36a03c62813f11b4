//! The wheel's list machinery, separate from where the nodes live.
//!
//! [`Lists`] holds the list heads, the occupancy bits and `now`; the nodes'
//! links and deadlines live in a store the caller passes in through the
//! [`Links`] trait. [`TimerWheel`](super::TimerWheel) pairs it with a slab of
//! generational nodes; the map's shards pair it with a slab of compact
//! entries that carry their own links (`map::store::shard`), so one entry is one
//! node with no second payload wrapper. The algorithm is described in the
//! [module docs](super). The walking ahead of the next slots' lists
//! ([`Lists`], "Walking ahead") is in `ahead`.

/// Index value meaning "no node".
pub(crate) const NIL: u32 = u32::MAX;

/// Where a [`Lists`] finds the links and deadline of a node.
///
/// Every method is only called for indices of nodes the caller has linked
/// (and not yet unlinked); an implementation may panic otherwise.
pub(crate) trait Links {
    /// `(prev, next)` of a linked node.
    fn links(&self, index: u32) -> (u32, u32);
    /// Sets the `prev` link of a linked node.
    fn set_prev(&mut self, index: u32, to: u32);
    /// Sets the `next` link of a linked node.
    fn set_next(&mut self, index: u32, to: u32);
    /// The deadline tick of a linked node.
    fn deadline(&self, index: u32) -> u64;
    /// Hints that node `index` is about to be read. The default does nothing.
    #[inline]
    fn prefetch_node(&self, index: u32) {
        let _ = index;
    }
}

/// Circular doubly linked lists, one per `(level, slot)` plus the due list,
/// with `R` bits per level, and a second set of level-0 lists for the next
/// level-1 slot (see [Walking ahead](#walking-ahead)).
///
/// # Walking ahead
///
/// When `now` enters a new level-1 slot, the nodes of one list are
/// re-examined one by one (the module docs' cascade): those due in the
/// slot's 2^R ticks go to level 0. In a large wheel that list is long (with
/// 10^6 deadlines over 1 s and 1 ms ticks, ~34,000 nodes every ~34 ms,
/// each a cache miss), and nothing due can be taken until the walk ends.
/// So the walk happens ahead of time, a bounded number of nodes at a time
/// ([`precascade`](Self::precascade)), while `now` is still in the slot
/// before:
///
/// * the *pending* list is the one the next crossing would walk,
///   `list_for(boundary)`, where the *boundary* is the first tick of the
///   next level-1 slot. Every node on it has a deadline at or after the
///   boundary;
/// * a walked node goes where it would be with `now` at the boundary:
///   [`next_place`](Self::next_place). Level 0 there is a second bank of
///   2^R lists (`next_heads`), since level 0 itself still holds the
///   current slot's nodes; levels 1 to the pending list's level minus one
///   are empty while `now` is in the last level-1 slot before a crossing
///   at that level (`now`'s digits there are all ones), so walked nodes
///   use those lists directly;
/// * a node linked meanwhile whose list is the pending one goes straight
///   to its place ahead; one unlinked there is on the pending list or in
///   its place ahead (the heads tell which, where it matters);
/// * crossing the boundary walks what is left of the pending list, makes
///   the current level 0 due, and swaps the bank in as level 0: exactly the
///   lists the cascade would have built.
///
/// A crossing that also moves the level-2 digit (every 2^(2R) ticks; ~2.1
/// s at the map's default precision) has a pending list of up to 2^(2R)
/// ticks of deadlines, too many to walk in the last level-1 slot before
/// it, when its walk as `pending` can start. So that list is walked during
/// the whole level-2 slot before, as `pending2`
/// ([`precascade2`](Self::precascade2)), the same way one level up: its
/// nodes due in the first 2^(2R) ticks after `boundary2` go to a second
/// bank of level-1 lists by their level-1 digit, the others to levels 2
/// and up (empty of other nodes, `now`'s digits there being all ones).
/// When `now` enters the last level-1 slot before `boundary2`, that bank
/// becomes level 1 (empty then) except its digit 0, which goes back on
/// the pending list to be walked into the second bank of level 0 like any
/// other. A move past that slot in one step puts the walked nodes back on
/// `pending2` and moves plainly.
pub(crate) struct Lists<const R: u32> {
    /// List heads: the due list at `DUE` (0), then `1 + level * SLOTS +
    /// slot`. Only as long as the highest level a node was linked at needs
    /// (empty, with no allocation, until the first link): a map has a
    /// wheel per shard, and all 11 levels' heads are ~2.8 KB where entries
    /// that live for minutes use the first three or four (1 KB). Read
    /// through [`head`](Self::head).
    heads: Vec<u32>,
    /// Per level, a bit per non-empty slot.
    slot_bits: Box<[u64]>,
    /// A bit per level with at least one non-empty slot.
    level_bits: u64,
    now: u64,
    /// The first tick of the next level-1 slot (when `pending` is not
    /// [`NO_PENDING`]).
    boundary: u64,
    /// The list the crossing of `boundary` would walk, `list_for(boundary)`;
    /// [`NO_PENDING`] in the last level-1 slot of the tick range.
    pending: usize,
    /// Level 0 as it will be at `boundary`: heads of the nodes ahead due
    /// in its first 2^R ticks, list id `NEXT + digit` (digit 0 holds those
    /// due at `boundary` itself). Empty, with no allocation, until used.
    next_heads: Vec<u32>,
    /// A bit per non-empty list of the second bank of level 0.
    next_bits: u64,
    /// The first tick of the next level-2 slot, when `pending2` is not
    /// [`NO_PENDING`].
    boundary2: u64,
    /// The list the crossing of `boundary2` would walk,
    /// `list_for(boundary2)`, while that crossing is not the next level-1
    /// one (then `pending` is that list); else [`NO_PENDING`].
    pending2: usize,
    /// A bit per non-empty list of the second bank of level 1: lists
    /// `NEXT + SLOTS + digit` of `next_heads` hold the walked nodes of
    /// `pending2` due in `boundary2`'s first 2^(2R) ticks, by their
    /// level-1 digit.
    next1_bits: u64,
}

mod ahead;

/// List ids from here on are [`Lists`]'s second bank of level-0 lists.
const NEXT: usize = 1 << 20;

/// `pending` when there is no next level-1 slot.
const NO_PENDING: usize = usize::MAX;

impl<const R: u32> Lists<R> {
    pub(crate) const SLOTS: usize = 1 << R;
    pub(crate) const LEVELS: usize = 64_usize.div_ceil(R as usize);
    const MASK: u64 = (1 << R) - 1;
    /// List id of the due list.
    const DUE: usize = 0;
    /// The highest list id.
    #[cfg(test)]
    const LAST: usize = Self::LEVELS * Self::SLOTS;
    const CHECK_R: () = assert!(R >= 1 && R <= 6, "R must be in 1..=6");

    pub(crate) fn new(now: u64) -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::CHECK_R;
        let mut lists = Self {
            heads: Vec::new(),
            slot_bits: vec![0; Self::LEVELS].into_boxed_slice(),
            level_bits: 0,
            now,
            boundary: 0,
            pending: NO_PENDING,
            next_heads: Vec::new(),
            next_bits: 0,
            boundary2: 0,
            pending2: NO_PENDING,
            next1_bits: 0,
        };
        lists.find_pending();
        lists
    }

    /// The id of the second bank's level-1 list for `digit`.
    #[inline]
    fn bank1(digit: usize) -> usize {
        NEXT + Self::SLOTS + digit
    }

    /// The head of `list`, `NIL` if it is empty (or nothing was ever linked).
    #[inline]
    fn head(&self, list: usize) -> u32 {
        if list < NEXT {
            self.heads.get(list).copied().unwrap_or(NIL)
        } else {
            self.next_heads.get(list - NEXT).copied().unwrap_or(NIL)
        }
    }

    /// Sets the head of `list`, which has room for one.
    #[inline]
    fn set_head(&mut self, list: usize, head: u32) {
        if list < NEXT {
            self.heads[list] = head;
        } else {
            self.next_heads[list - NEXT] = head;
        }
    }

    /// The id of `(level, slot)`'s list.
    #[inline]
    fn list_id(level: usize, slot: usize) -> usize {
        1 + level * Self::SLOTS + slot
    }

    /// The `(level, slot)` of a list other than the due list.
    #[inline]
    fn level_slot(list: usize) -> (usize, usize) {
        debug_assert_ne!(list, Self::DUE);
        ((list - 1) / Self::SLOTS, (list - 1) % Self::SLOTS)
    }

    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.now
    }

    /// Links node `index`, whose deadline is `deadline`, at the back of its
    /// list.
    #[inline]
    pub(crate) fn link(&mut self, store: &mut impl Links, index: u32, deadline: u64) {
        let list = self.list_for(deadline);
        let list = if list == self.pending {
            self.next_place(deadline)
        } else if list == self.pending2 {
            self.place2(deadline)
        } else {
            list
        };
        self.push_back(store, list, index);
    }

    /// Unlinks node `index`, whose deadline (as linked) is `deadline`.
    #[inline]
    pub(crate) fn unlink(&mut self, store: &mut impl Links, index: u32, deadline: u64) {
        let list = self.list_for(deadline);
        if list == self.pending {
            let ahead = self.next_place(deadline);
            self.unlink_either(store, index, list, ahead);
        } else if list == self.pending2 {
            let ahead = self.place2(deadline);
            self.unlink_either(store, index, list, ahead);
        } else {
            self.unlink_from(store, list, index);
        }
    }

    /// Whether nodes with deadlines `a` and `b` belong on the same list, so
    /// that a node can change from one deadline to the other in place. They
    /// then stay on the same list until it is cascaded: a list at level `l`
    /// holds deadlines that agree with each other on every bit from `l * R`
    /// up, and [`list_for`](Self::list_for) of such deadlines depends on
    /// nothing else until `now` reaches them.
    /// For the pending list's deadlines, their places ahead must agree too.
    #[inline]
    pub(crate) fn same_list(&self, a: u64, b: u64) -> bool {
        let list = self.list_for(a);
        list == self.list_for(b)
            && (list != self.pending || self.next_place(a) == self.next_place(b))
            && (list != self.pending2 || self.place2(a) == self.place2(b))
    }

    /// The first due node, if any (it stays linked).
    #[inline]
    pub(crate) fn first_due(&self) -> Option<u32> {
        let head = self.head(Self::DUE);
        (head != NIL).then_some(head)
    }

    /// Unlinks and returns the first due node.
    #[inline]
    pub(crate) fn pop_due(&mut self, store: &mut impl Links) -> Option<u32> {
        let head = self.first_due()?;
        self.unlink_from(store, Self::DUE, head);
        Some(head)
    }

    /// When `advance` next has work: `None` if nothing is linked,
    /// `Some(now())` if something is due, otherwise a tick in
    /// `(now(), earliest deadline]`.
    pub(crate) fn next_wakeup(&self) -> Option<u64> {
        if self.head(Self::DUE) != NIL {
            return Some(self.now);
        }
        if self.level_bits == 0 && self.next_bits == 0 && self.next1_bits == 0 {
            return None;
        }
        if self.pending == NO_PENDING || self.slot_bits[0] != 0 {
            // Level 0 holds the earliest (or nothing is ahead of time).
            return Some(self.earliest(self.now, self.level_bits));
        }
        // Walked nodes and those still pending are at or after the
        // boundary: the second bank by its digits, levels below the
        // pending list's against the boundary, the rest against `now`.
        let bank = (self.next_bits != 0)
            .then(|| self.boundary + u64::from(self.next_bits.trailing_zeros()));
        let group = |base: u64, levels: u64| {
            let levels = self.level_bits & levels;
            (levels != 0).then(|| self.earliest(base, levels))
        };
        let below = |list: usize| (1u64 << Self::level_slot(list).0) - 1;
        if self.pending2 == NO_PENDING {
            let below = below(self.pending);
            let ahead = group(self.boundary, below);
            let rest = group(self.now, !below);
            return [bank, ahead, rest].into_iter().flatten().min();
        }
        // `pending` is at level 1. Level 1 holds this level-2 slot's nodes;
        // the second bank of level 1 and levels 2 up to `pending2`'s minus
        // one hold nodes walked ahead of `boundary2`.
        let bank1 = (self.next1_bits != 0)
            .then(|| self.boundary2 + (u64::from(self.next1_bits.trailing_zeros()) << R));
        let below2 = below(self.pending2);
        let level1 = group(self.now, 0b10);
        let ahead2 = group(self.boundary2, below2 & !0b11);
        let rest = group(self.now, !below2);
        [bank, level1, bank1, ahead2, rest]
            .into_iter()
            .flatten()
            .min()
    }

    /// The first tick of the earliest non-empty slot of the lowest level in
    /// `levels` (non-zero), taking higher digits from `base`.
    fn earliest(&self, base: u64, levels: u64) -> u64 {
        let level = levels.trailing_zeros();
        let slot = u64::from(self.slot_bits[level as usize].trailing_zeros());
        let shift = level * R;
        let span = shift + R; // bits covered by this level and those below
        let high = if span >= 64 {
            0
        } else {
            base & !((1u64 << span) - 1)
        };
        high | (slot << shift)
    }

    /// Makes every linked node due (for draining), in deadline order across
    /// bins after what is due already.
    pub(crate) fn all_due(&mut self, store: &mut impl Links) {
        self.precascade(store, usize::MAX);
        self.precascade2(store, usize::MAX);
        // Level 0, its bank, level 1, its bank, the rest: deadline order.
        let level0 = Self::list_id(1, 0).min(self.heads.len());
        let level1 = Self::list_id(2, 0).min(self.heads.len());
        let banks = self.next_heads.len();
        let order = (1..level0)
            .chain(NEXT..NEXT + banks.min(Self::SLOTS))
            .chain(level0..level1)
            .chain(NEXT + banks.min(Self::SLOTS)..NEXT + banks)
            .chain(level1..self.heads.len());
        for list in order {
            self.splice_to_due(store, list);
        }
        self.slot_bits.fill(0);
        self.level_bits = 0;
        self.next_bits = 0;
        self.next1_bits = 0;
    }

    /// Fills `out` with the first nodes of the list that holds deadline
    /// `tick` (with others, at a level above 0), from its head; returns how
    /// many it wrote. `None` while some nodes of the pending list are not
    /// walked yet and `tick` is one of its deadlines: they are not on the
    /// list that holds `tick` yet.
    pub(crate) fn list_nodes(
        &self,
        store: &impl Links,
        tick: u64,
        out: &mut [u32],
    ) -> Option<usize> {
        let (list, _) = self.list_of_tick(tick)?;
        let head = self.head(list);
        let mut cur = head;
        let mut n = 0;
        while cur != NIL && n < out.len() {
            out[n] = cur;
            n += 1;
            cur = store.links(cur).1;
            if cur == head {
                break;
            }
        }
        Some(n)
    }

    /// The last tick the list that holds deadline `tick` (after `now()`)
    /// holds: every node on a later list (a later slot, or a higher level)
    /// has a later deadline.
    /// `tick` itself where [`list_nodes`](Self::list_nodes) gives `None`.
    pub(crate) fn list_end(&self, tick: u64) -> u64 {
        self.list_of_tick(tick).map_or(tick, |(_, end)| end)
    }

    /// The list that holds deadline `tick` (after `now()`) and the last
    /// tick it holds; `None` while the pending list holds `tick` and is
    /// not wholly walked.
    fn list_of_tick(&self, tick: u64) -> Option<(usize, u64)> {
        debug_assert!(tick > self.now);
        let list = self.list_for(tick);
        let (list, base) = if list != self.pending && list != self.pending2 {
            (list, self.now)
        } else if self.head(list) != NIL {
            return None;
        } else if list == self.pending {
            (self.next_place(tick), self.boundary)
        } else {
            (self.place2(tick), self.boundary2)
        };
        let below = if list >= Self::bank1(0) {
            R // one level-1 digit
        } else if list >= NEXT {
            0 // one tick
        } else {
            (63 - (tick ^ base).leading_zeros()) / R * R
        };
        Some((list, tick | ((1u64 << below) - 1)))
    }

    /// The list a node with `deadline` belongs on, given the current `now`.
    #[inline]
    pub(super) fn list_for(&self, deadline: u64) -> usize {
        if deadline <= self.now {
            return Self::DUE;
        }
        let bit = 63 - (deadline ^ self.now).leading_zeros();
        let level = bit / R;
        let slot = (deadline >> (level * R)) & Self::MASK;
        Self::list_id(level as usize, slot as usize)
    }

    /// Appends `index` to `list` (first in, first out).
    #[inline]
    fn push_back(&mut self, store: &mut impl Links, list: usize, index: u32) {
        let head = self.head(list);
        if head == NIL {
            self.make_room(list);
            store.set_prev(index, index);
            store.set_next(index, index);
            self.set_head(list, index);
            self.mark_occupied(list);
        } else {
            let (tail, _) = store.links(head);
            store.set_prev(index, tail);
            store.set_next(index, head);
            store.set_next(tail, index);
            store.set_prev(head, index);
        }
    }

    /// Removes `index` from `list`.
    #[inline]
    fn unlink_from(&mut self, store: &mut impl Links, list: usize, index: u32) {
        let (prev, next) = store.links(index);
        if next == index {
            debug_assert_eq!(self.head(list), index);
            self.set_head(list, NIL);
            self.mark_empty(list);
        } else {
            store.set_next(prev, next);
            store.set_prev(next, prev);
            if self.head(list) == index {
                self.set_head(list, next);
            }
        }
    }

    /// Makes sure `list` has a head to set.
    #[inline]
    fn make_room(&mut self, list: usize) {
        let room = if list < NEXT {
            self.heads.len()
        } else {
            NEXT + self.next_heads.len()
        };
        if list >= room {
            self.grow_heads(list);
        }
    }

    /// Makes room for `list`'s head and those of the rest of its level.
    #[cold]
    #[inline(never)]
    fn grow_heads(&mut self, list: usize) {
        if list >= NEXT {
            let len = if list < Self::bank1(0) {
                Self::SLOTS
            } else {
                2 * Self::SLOTS
            };
            self.next_heads.resize(len.max(self.next_heads.len()), NIL);
            return;
        }
        let len = match list {
            Self::DUE => 1,
            _ => Self::list_id(Self::level_slot(list).0 + 1, 0),
        };
        debug_assert!(len > self.heads.len());
        self.heads.resize(len, NIL);
    }

    #[inline]
    fn mark_occupied(&mut self, list: usize) {
        if list >= Self::bank1(0) {
            self.next1_bits |= 1 << (list - Self::bank1(0));
        } else if list >= NEXT {
            self.next_bits |= 1 << (list - NEXT);
        } else if list != Self::DUE {
            let (level, slot) = Self::level_slot(list);
            self.slot_bits[level] |= 1 << slot;
            self.level_bits |= 1 << level;
        }
    }

    #[inline]
    fn mark_empty(&mut self, list: usize) {
        if list >= Self::bank1(0) {
            self.next1_bits &= !(1 << (list - Self::bank1(0)));
        } else if list >= NEXT {
            self.next_bits &= !(1 << (list - NEXT));
        } else if list != Self::DUE {
            let (level, slot) = Self::level_slot(list);
            self.slot_bits[level] &= !(1 << slot);
            if self.slot_bits[level] == 0 {
                self.level_bits &= !(1 << level);
            }
        }
    }

    /// Moves the whole of `list` to the end of the due list, in O(1). Leaves
    /// the occupancy bits to the caller.
    fn splice_to_due(&mut self, store: &mut impl Links, list: usize) {
        let head = self.head(list);
        if head == NIL {
            return;
        }
        self.set_head(list, NIL);
        let due = self.head(Self::DUE);
        if due == NIL {
            if self.heads.is_empty() {
                // Only the second bank was ever linked.
                self.grow_heads(Self::DUE);
            }
            self.heads[Self::DUE] = head;
        } else {
            Self::append(store, due, head);
        }
    }

    /// Links the circular list headed by `head` after the tail of the one
    /// headed by `onto` (both non-empty), in O(1).
    fn append(store: &mut impl Links, onto: u32, head: u32) {
        let (onto_tail, _) = store.links(onto);
        let (tail, _) = store.links(head);
        store.set_next(onto_tail, head);
        store.set_prev(head, onto_tail);
        store.set_next(tail, onto);
        store.set_prev(onto, tail);
    }

    /// Moves time forward to `to` (no-op if `to <= now`), restoring the
    /// placement invariant for every node. See the module docs and
    /// [Walking ahead](Self#walking-ahead).
    pub(crate) fn move_to(&mut self, store: &mut impl Links, to: u64) {
        if to <= self.now {
            return;
        }
        if self.pending != NO_PENDING && to >= self.boundary {
            self.cross(store);
            if self.pending2 != NO_PENDING {
                if to > self.now | Self::MASK {
                    // Past the new level-1 slot: back to plain lists.
                    self.unwind2(store);
                } else if (self.now | Self::MASK) + 1 == self.boundary2 {
                    self.install2(store);
                }
            }
        }
        self.move_plainly(store, to);
        self.find_pending();
    }

    /// [`move_to`](Self::move_to) by the module docs' algorithm alone: with
    /// nothing walked ahead (after a crossing), or within a level-1 slot
    /// (only level 0 changes).
    fn move_plainly(&mut self, store: &mut impl Links, to: u64) {
        let from = self.now;
        if to <= from {
            return;
        }
        self.now = to;
        let m = 63 - (from ^ to).leading_zeros();
        let lm = m / R;

        // Levels below `lm`: wholly due.
        let mut below = self.level_bits & ((1u64 << lm) - 1);
        while below != 0 {
            let level = below.trailing_zeros() as usize;
            below &= below - 1;
            let mut slots = std::mem::take(&mut self.slot_bits[level]);
            while slots != 0 {
                let slot = slots.trailing_zeros() as usize;
                slots &= slots - 1;
                self.splice_to_due(store, Self::list_id(level, slot));
            }
            self.level_bits &= !(1 << level);
        }

        // Level `lm`: slots strictly between the two digits are due; the slot
        // equal to `to`'s digit is re-examined node by node.
        let level = lm as usize;
        let shift = lm * R;
        let old_digit = (from >> shift) & Self::MASK;
        let new_digit = (to >> shift) & Self::MASK;
        debug_assert!(old_digit < new_digit);
        let occupied = self.slot_bits[level];
        // At level 0 the slot of `to`'s digit holds exactly the nodes of
        // tick `to` (they share every higher digit with it), all due now:
        // spliced whole like the slots before it, not walked. Moving one
        // tick at a time (as writes that evict do) re-examines no node.
        let upto = match lm {
            0 => u64::MAX >> (63 - new_digit),
            _ => (1u64 << new_digit) - 1,
        };
        let between = occupied & upto & !((1u64 << (old_digit + 1)) - 1);
        let mut slots = between;
        while slots != 0 {
            let slot = slots.trailing_zeros() as usize;
            slots &= slots - 1;
            self.splice_to_due(store, Self::list_id(level, slot));
        }
        let mut remaining = occupied & !between;
        let recheck = Self::list_id(level, new_digit as usize);
        let head = if lm != 0 && occupied & (1 << new_digit) != 0 {
            remaining &= !(1 << new_digit);
            std::mem::replace(&mut self.heads[recheck], NIL)
        } else {
            NIL
        };
        self.slot_bits[level] = remaining;
        if remaining == 0 {
            self.level_bits &= !(1 << level);
        }
        if head != NIL {
            let (tail, _) = store.links(head);
            let mut cur = head;
            loop {
                let (_, next) = store.links(cur);
                // The walk is one cache miss per node; start the next one
                // before this node's re-link (whose branches may stall).
                store.prefetch_node(next);
                let list = self.list_for(store.deadline(cur));
                debug_assert!(list == Self::DUE || Self::level_slot(list).0 < level);
                self.push_back(store, list, cur);
                if cur == tail {
                    break;
                }
                cur = next;
            }
        }
    }

    /// Checks the list invariants against `store` and calls `visit` once per
    /// linked node; panics with a description if one fails. Test-only.
    #[cfg(test)]
    pub(crate) fn validate(&self, store: &impl Links, mut visit: impl FnMut(u32)) {
        match (self.now | Self::MASK).checked_add(1) {
            Some(b) => assert_eq!((self.boundary, self.pending), (b, self.list_for(b))),
            None => assert_eq!(self.pending, NO_PENDING),
        }
        let mask2 = (1u64 << (2 * R)) - 1;
        match (self.now | mask2).checked_add(1) {
            Some(b2) if self.pending != NO_PENDING && b2 != self.boundary => {
                assert_eq!((self.boundary2, self.pending2), (b2, self.list_for(b2)));
            }
            _ => assert_eq!(self.pending2, NO_PENDING),
        }
        for list in (0..=Self::LAST).chain(NEXT..NEXT + 2 * Self::SLOTS) {
            let head = self.head(list);
            if list >= Self::bank1(0) {
                let bit = self.next1_bits & (1 << (list - Self::bank1(0))) != 0;
                assert_eq!(bit, head != NIL, "level-1 bank bit mismatch at list {list}");
            } else if list >= NEXT {
                let bit = self.next_bits & (1 << (list - NEXT)) != 0;
                assert_eq!(bit, head != NIL, "bank bit mismatch at list {list}");
            } else if list != Self::DUE {
                let (level, slot) = Self::level_slot(list);
                let bit = self.slot_bits[level] & (1 << slot) != 0;
                assert_eq!(bit, head != NIL, "slot bit mismatch at list {list}");
            }
            if head == NIL {
                continue;
            }
            let mut cur = head;
            loop {
                let (prev, next) = store.links(cur);
                visit(cur);
                assert_eq!(store.links(next).0, cur, "broken back link");
                assert_eq!(store.links(prev).1, cur, "broken forward link");
                let (deadline, want) = (store.deadline(cur), self.list_for(store.deadline(cur)));
                assert!(
                    want == list
                        || want == self.pending && self.next_place(deadline) == list
                        || want == self.pending2 && self.place2(deadline) == list,
                    "node {cur} on the wrong list"
                );
                cur = next;
                if cur == head {
                    break;
                }
            }
        }
        for level in 0..Self::LEVELS {
            assert_eq!(
                self.level_bits & (1 << level) != 0,
                self.slot_bits[level] != 0,
                "level bit mismatch at level {level}"
            );
        }
    }
}

//! The wheel's list machinery, separate from where the nodes live.
//!
//! [`Lists`] holds the list heads, the occupancy bits and `now`; the nodes'
//! links and deadlines live in a store the caller passes in through the
//! [`Links`] trait. [`TimerWheel`](super::TimerWheel) pairs it with a slab of
//! generational nodes; the map's shards pair it with a slab of compact
//! entries that carry their own links (`map::shard`), so one entry is one
//! node with no second payload wrapper. The algorithm is described in the
//! [module docs](super).

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
/// with `R` bits per level.
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
}

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
        Self {
            heads: Vec::new(),
            slot_bits: vec![0; Self::LEVELS].into_boxed_slice(),
            level_bits: 0,
            now,
        }
    }

    /// The head of `list`, `NIL` if it is empty (or nothing was ever linked).
    #[inline]
    fn head(&self, list: usize) -> u32 {
        self.heads.get(list).copied().unwrap_or(NIL)
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
        self.push_back(store, self.list_for(deadline), index);
    }

    /// Unlinks node `index`, whose deadline (as linked) is `deadline`.
    #[inline]
    pub(crate) fn unlink(&mut self, store: &mut impl Links, index: u32, deadline: u64) {
        self.unlink_from(store, self.list_for(deadline), index);
    }

    /// Whether nodes with deadlines `a` and `b` belong on the same list, so
    /// that a node can change from one deadline to the other in place. They
    /// then stay on the same list until it is cascaded: a list at level `l`
    /// holds deadlines that agree with each other on every bit from `l * R`
    /// up, and [`list_for`](Self::list_for) of such deadlines depends on
    /// nothing else until `now` reaches them.
    #[inline]
    pub(crate) fn same_list(&self, a: u64, b: u64) -> bool {
        self.list_for(a) == self.list_for(b)
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
        if self.level_bits == 0 {
            return None;
        }
        let level = self.level_bits.trailing_zeros();
        let slot = u64::from(self.slot_bits[level as usize].trailing_zeros());
        let shift = level * R;
        let span = shift + R; // bits covered by this level and those below
        let high = if span >= 64 {
            0
        } else {
            self.now & !((1u64 << span) - 1)
        };
        Some(high | (slot << shift))
    }

    /// Makes every linked node due (for draining), in deadline order across
    /// bins after what is due already.
    pub(crate) fn all_due(&mut self, store: &mut impl Links) {
        for list in 1..self.heads.len() {
            self.splice_to_due(store, list);
        }
        self.slot_bits.fill(0);
        self.level_bits = 0;
    }

    /// Fills `out` with the first nodes of the list that holds deadline
    /// `tick` (with others, at a level above 0), from its head; returns how
    /// many it wrote.
    pub(crate) fn list_nodes(&self, store: &impl Links, tick: u64, out: &mut [u32]) -> usize {
        let head = self.head(self.list_for(tick));
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
        n
    }

    /// The last tick the list that holds deadline `tick` (after `now()`)
    /// holds: every node on a later list (a later slot, or a higher level)
    /// has a later deadline.
    pub(crate) fn list_end(&self, tick: u64) -> u64 {
        debug_assert!(tick > self.now);
        let bit = 63 - (tick ^ self.now).leading_zeros();
        let below = (bit / R) * R;
        tick | ((1u64 << below) - 1)
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
            if list >= self.heads.len() {
                self.grow_heads(list);
            }
            store.set_prev(index, index);
            store.set_next(index, index);
            self.heads[list] = index;
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
            debug_assert_eq!(self.heads[list], index);
            self.heads[list] = NIL;
            self.mark_empty(list);
        } else {
            store.set_next(prev, next);
            store.set_prev(next, prev);
            if self.heads[list] == index {
                self.heads[list] = next;
            }
        }
    }

    /// Makes room for `list`'s head and those of the rest of its level.
    #[cold]
    #[inline(never)]
    fn grow_heads(&mut self, list: usize) {
        let len = match list {
            Self::DUE => 1,
            _ => Self::list_id(Self::level_slot(list).0 + 1, 0),
        };
        debug_assert!(len > self.heads.len());
        self.heads.resize(len, NIL);
    }

    #[inline]
    fn mark_occupied(&mut self, list: usize) {
        if list != Self::DUE {
            let (level, slot) = Self::level_slot(list);
            self.slot_bits[level] |= 1 << slot;
            self.level_bits |= 1 << level;
        }
    }

    #[inline]
    fn mark_empty(&mut self, list: usize) {
        if list != Self::DUE {
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
        self.heads[list] = NIL;
        let due = self.heads[Self::DUE];
        if due == NIL {
            self.heads[Self::DUE] = head;
        } else {
            let (due_tail, _) = store.links(due);
            let (tail, _) = store.links(head);
            store.set_next(due_tail, head);
            store.set_prev(head, due_tail);
            store.set_next(tail, due);
            store.set_prev(due, tail);
        }
    }

    /// Moves time forward to `to` (no-op if `to <= now`), restoring the
    /// placement invariant for every node. See the module docs.
    pub(crate) fn move_to(&mut self, store: &mut impl Links, to: u64) {
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
        for list in 0..=Self::LAST {
            let head = self.head(list);
            if list != Self::DUE {
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
                assert_eq!(
                    self.list_for(store.deadline(cur)),
                    list,
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

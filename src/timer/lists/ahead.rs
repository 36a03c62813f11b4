//! Walking ahead (see [Walking ahead](super::Lists#walking-ahead)): the
//! pending lists' nodes moved, a bounded number at a time, to where they
//! go when `now` crosses the next level-1 (and level-2) boundary; where a
//! node of a pending list goes ahead, and is unlinked from; the crossing
//! itself, and the second bank of level 1 taken in or given back.

use super::{Links, Lists, NEXT, NIL, NO_PENDING};

impl<const R: u32> Lists<R> {
    /// Walks up to `budget` nodes of the pending list to their places ahead
    /// (see [Walking ahead](Self#walking-ahead)). Returns whether nodes
    /// are left on it.
    pub(crate) fn precascade(&mut self, store: &mut impl Links, budget: usize) -> bool {
        self.walk(store, self.pending, budget, Self::next_place)
    }

    /// [`precascade`](Self::precascade) for `pending2`: walks up to
    /// `budget` of its nodes to [`place2`](Self::place2). Returns whether
    /// nodes are left on it.
    pub(crate) fn precascade2(&mut self, store: &mut impl Links, budget: usize) -> bool {
        self.walk(store, self.pending2, budget, Self::place2)
    }

    /// Moves up to `budget` nodes from the head of `list` (a pending list,
    /// or [`NO_PENDING`]) to `place(deadline)`; returns whether nodes are
    /// left on it.
    pub(super) fn walk(
        &mut self,
        store: &mut impl Links,
        list: usize,
        budget: usize,
        place: fn(&Self, u64) -> usize,
    ) -> bool {
        if list == NO_PENDING {
            return false;
        }
        for _ in 0..budget {
            let head = self.head(list);
            if head == NIL {
                return false;
            }
            // One cache miss per node: start the next one first.
            store.prefetch_node(store.links(head).1);
            self.unlink_from(store, list, head);
            let to = place(self, store.deadline(head));
            self.push_back(store, to, head);
        }
        self.head(list) != NIL
    }

    /// Where a node with `deadline` (at or after `boundary`) goes when it
    /// leaves the pending list: its list with `now` at `boundary`, level 0
    /// being the second bank.
    pub(super) fn next_place(&self, deadline: u64) -> usize {
        debug_assert!(self.pending != NO_PENDING && deadline >= self.boundary);
        Self::place_from(deadline, self.boundary, NEXT, 0)
    }

    /// Where a node with `deadline` (at or after `boundary2`) goes when it
    /// leaves `pending2`: the second bank of level 1 for its level-1 digit
    /// if it is due within 2^(2R) ticks of `boundary2`, else its list with
    /// `now` at `boundary2` (levels 2 up to `pending2`'s minus one, empty
    /// of other nodes while `now`'s digits there are all ones).
    pub(super) fn place2(&self, deadline: u64) -> usize {
        debug_assert!(self.pending2 != NO_PENDING && deadline >= self.boundary2);
        Self::place_from(deadline, self.boundary2, Self::bank1(0), R)
    }

    /// The list of `deadline` (at or after `base`) with `now` at `base`,
    /// except that deadlines sharing every digit of `base` from bit
    /// `bank_shift + R` up go to the bank of lists from `bank`, by their
    /// digit at `bank_shift`.
    pub(super) fn place_from(deadline: u64, base: u64, bank: usize, bank_shift: u32) -> usize {
        let x = deadline ^ base;
        if x >> (bank_shift + R) == 0 {
            return bank + ((deadline >> bank_shift) & Self::MASK) as usize;
        }
        let level = (63 - x.leading_zeros()) / R;
        let slot = ((deadline >> (level * R)) & Self::MASK) as usize;
        Self::list_id(level as usize, slot)
    }

    /// Unlinks node `index` of a pending list's deadlines: it is on that
    /// list (not walked yet) or on its place `ahead`. Only a head needs to
    /// know which list it is on, and heads are distinct nodes.
    pub(super) fn unlink_either(
        &mut self,
        store: &mut impl Links,
        index: u32,
        pending: usize,
        ahead: usize,
    ) {
        let list = if self.head(ahead) == index {
            ahead
        } else {
            pending
        };
        self.unlink_from(store, list, index);
    }

    /// Sets `boundary` and `pending` for the current `now`.
    pub(super) fn find_pending(&mut self) {
        match (self.now | Self::MASK).checked_add(1) {
            Some(boundary) => {
                self.boundary = boundary;
                self.pending = self.list_for(boundary);
            }
            None => self.pending = NO_PENDING,
        }
        let mask2 = (1u64 << (2 * R)) - 1;
        self.pending2 = match (self.now | mask2).checked_add(1) {
            Some(b2) if self.pending != NO_PENDING && b2 != self.boundary => {
                self.boundary2 = b2;
                self.list_for(b2)
            }
            _ => NO_PENDING,
        };
    }

    /// Moves `now` to `boundary`: walks what is left of the pending list,
    /// makes the current level 0 due (its deadlines are before the
    /// boundary) and swaps the second bank in as level 0, its list for the
    /// boundary itself made due. The lists are then those a plain move to
    /// the boundary would have left.
    pub(super) fn cross(&mut self, store: &mut impl Links) {
        self.precascade(store, usize::MAX);
        if self.next_bits != 0 && self.heads.len() < Self::list_id(1, 0) {
            self.grow_heads(Self::list_id(0, 0));
        }
        let mut due = std::mem::take(&mut self.slot_bits[0]);
        while due != 0 {
            let slot = due.trailing_zeros() as usize;
            due &= due - 1;
            self.splice_to_due(store, Self::list_id(0, slot));
        }
        let mut bank = std::mem::take(&mut self.next_bits);
        if bank & 1 != 0 {
            self.splice_to_due(store, NEXT);
            bank &= !1;
        }
        let mut slots = bank;
        while slots != 0 {
            let slot = slots.trailing_zeros() as usize;
            slots &= slots - 1;
            self.heads[Self::list_id(0, slot)] = std::mem::replace(&mut self.next_heads[slot], NIL);
        }
        self.slot_bits[0] = bank;
        if bank == 0 {
            self.level_bits &= !1;
        } else {
            self.level_bits |= 1;
        }
        self.now = self.boundary;
    }

    /// `now` has just entered the last level-1 slot before `boundary2`,
    /// which `pending` now names as well: the second bank of level 1 for
    /// digits 1 and up becomes level 1 (empty: `now`'s level-1 digit is all
    /// ones), and its digit 0 goes back on `pending2`, to be walked into
    /// the second bank of level 0 as `pending`. Nodes at levels 2 up were
    /// placed where `next_place` places them.
    pub(super) fn install2(&mut self, store: &mut impl Links) {
        self.splice_onto(store, Self::bank1(0), self.pending2);
        let mut bank = std::mem::take(&mut self.next1_bits);
        if bank != 0 && self.heads.len() < Self::list_id(2, 0) {
            self.grow_heads(Self::list_id(1, 0));
        }
        while bank != 0 {
            let digit = bank.trailing_zeros() as usize;
            bank &= bank - 1;
            let head = std::mem::replace(&mut self.next_heads[Self::SLOTS + digit], NIL);
            self.heads[Self::list_id(1, digit)] = head;
            self.mark_occupied(Self::list_id(1, digit));
        }
    }

    /// Puts every node walked ahead of `boundary2` back on `pending2`, for
    /// a move past the next level-1 slot (which the plain algorithm does).
    pub(super) fn unwind2(&mut self, store: &mut impl Links) {
        let mut bank = self.next1_bits;
        while bank != 0 {
            let digit = bank.trailing_zeros() as usize;
            bank &= bank - 1;
            self.splice_onto(store, Self::bank1(digit), self.pending2);
        }
        let level2 = Self::level_slot(self.pending2).0;
        for level in 2..level2 {
            let mut slots = self.slot_bits[level];
            while slots != 0 {
                let slot = slots.trailing_zeros() as usize;
                slots &= slots - 1;
                self.splice_onto(store, Self::list_id(level, slot), self.pending2);
            }
        }
    }

    /// Moves the whole of list `from` to the end of list `to`, in O(1),
    /// with their occupancy bits.
    pub(super) fn splice_onto(&mut self, store: &mut impl Links, from: usize, to: usize) {
        let head = self.head(from);
        if head == NIL {
            return;
        }
        self.set_head(from, NIL);
        self.mark_empty(from);
        let onto = self.head(to);
        if onto == NIL {
            self.make_room(to);
            self.set_head(to, head);
            self.mark_occupied(to);
        } else {
            Self::append(store, onto, head);
        }
    }
}

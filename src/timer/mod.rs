//! The XOR-order hierarchical timeout index.
//!
//! # Algorithm
//!
//! From hitime (seed 000), generalised to `R` bits per level as in Jane
//! Street's `Timing_wheel` and tokio's wheel (seed 001). Time is a caller-chosen
//! `u64` tick. With the wheel at tick `now`, a pending timer with deadline
//! `d > now` sits at
//!
//! ```text
//! bit   = msb(d ^ now)          // the highest bit where d and now differ
//! level = bit / R
//! slot  = (d >> (level * R)) & (2^R - 1)   // d's R-bit digit at that level
//! ```
//!
//! A timer with `d <= now` sits on the *due* list. With `R = 1` this is
//! hitime's 64 bins exactly (bin = `msb(d ^ now)`).
//!
//! `advance(to)` with `m = msb(now ^ to)` and `lm = m / R`:
//!
//! * every timer at a level below `lm` shares `now`'s bits above `m`, where
//!   `now` has a 0 and `to` a 1, so it is due: whole lists are spliced onto the
//!   due list in O(1) each, without looking at their timers;
//! * at level `lm`, slots whose digit lies strictly between `now`'s and `to`'s
//!   digits are due (spliced whole); only the slot equal to `to`'s digit is
//!   re-examined timer by timer: each is due or moves to a lower level;
//! * levels above `lm` are unchanged: `msb(d ^ to) == msb(d ^ now)` there.
//!
//! A timer only moves down, so it is re-placed at most `ceil(64 / R)` times.
//!
//! # Ground rules
//!
//! * Plain `&mut self` code: no atomics, no locks, no `unsafe`. Threads are the
//!   caller's business (the map puts one wheel inside each shard's lock).
//! * Nodes live in a slab (`Vec<Node<T>>`) linked by `u32` indices into
//!   circular doubly linked lists, one per `(level, slot)` plus the due list.
//!   A node stores no list id: its list is always `list_for(deadline)` against
//!   the current `now`, and every mutation restores that invariant.
//! * A [`TimerId`] is `(index, generation)`. The generation of a slab slot is
//!   bumped every time the slot is freed, so a stale id (fired, cancelled,
//!   reused slot) is a cheap "not found", never another timer.
//! * Firing hands the payload to the caller; until then a due timer can still
//!   be cancelled or rescheduled.

#[cfg(test)]
mod tests;

use std::fmt;

/// Bits per level used by [`TimerWheel::new`]: 64 slots per level, 11
/// levels. Chosen by the lifecycle benchmark in `benches/benches/timer.rs`:
/// in the 4-tick drive (the eviction thread's pattern) R = 6 was fastest or
/// tied at 10^4..10^6 timers and ran the fewest instructions (callgrind: 279
/// per timer at 10^6, against 305 for R = 4 and 428 for R = 1). See
/// BENCHMARKS.md.
pub const DEFAULT_LEVEL_BITS: u32 = 6;

/// Index value meaning "no node".
const NIL: u32 = u32::MAX;

/// A handle to a timer in a [`TimerWheel`].
///
/// Stale handles (the timer fired, was cancelled, or its slot was reused) are
/// simply "not found". Generations are 32-bit: a handle kept across 2^32
/// reuses of the same slot could alias a newer timer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct TimerId {
    index: u32,
    generation: u32,
}

impl TimerId {
    /// The slab index of this timer. Indices are reused after a timer fires or
    /// is cancelled; see [`TimerWheel::id_at`].
    #[inline]
    pub fn index(self) -> u32 {
        self.index
    }
}

/// One slab slot. The enum keeps the generation and links beside the tag, so
/// a node costs `24 + size_of::<T>()` bytes (rounded up to `T`'s alignment).
enum Node<T> {
    Occupied {
        generation: u32,
        prev: u32,
        next: u32,
        deadline: u64,
        value: T,
    },
    Vacant {
        generation: u32,
    },
}

/// A hierarchical timeout index over `u64` ticks with `R` bits per level.
///
/// Insert, cancel and reschedule are O(1); `advance` costs O(timers fired +
/// timers moved down). See the [module docs](self) for the algorithm.
///
/// ```
/// use expiremap::timer::TimerWheel;
///
/// let mut wheel = TimerWheel::new(0);
/// let a = wheel.insert(10, "a");
/// wheel.insert(5, "b");
/// wheel.insert(300, "c");
/// assert_eq!(wheel.cancel(a), Some("a"));
/// assert_eq!(wheel.cancel(a), None); // stale handle: not found
///
/// let mut fired = Vec::new();
/// wheel.advance(100, |_, v| fired.push(v));
/// assert_eq!(fired, ["b"]);
/// assert_eq!(wheel.next_wakeup().map(|t| t <= 300), Some(true));
/// wheel.advance(u64::MAX, |_, v| fired.push(v));
/// assert_eq!(fired, ["b", "c"]);
/// assert!(wheel.is_empty());
/// ```
pub struct TimerWheel<T, const R: u32 = DEFAULT_LEVEL_BITS> {
    nodes: Vec<Node<T>>,
    /// Indices of vacant nodes, reused last-in first-out. A stack beside the
    /// slab rather than a list through the vacant nodes: taking a slot then
    /// reads no cold node (measured: warm-slab insert at 10^6, 150 -> 85 ns).
    free: Vec<u32>,
    /// List heads: `level * SLOTS + slot`, then the due list at `DUE`.
    heads: Box<[u32]>,
    /// Per level, a bit per non-empty slot.
    slot_bits: Box<[u64]>,
    /// A bit per level with at least one non-empty slot.
    level_bits: u64,
    now: u64,
    len: usize,
}

impl<T> TimerWheel<T> {
    /// An empty wheel at tick `now`, with [`DEFAULT_LEVEL_BITS`] per level.
    pub fn new(now: u64) -> Self {
        Self::with_level_bits(now)
    }
}

impl<T, const R: u32> TimerWheel<T, R> {
    /// Slots per level.
    pub const SLOTS: usize = 1 << R;
    /// Levels needed to cover 64 bits.
    pub const LEVELS: usize = 64_usize.div_ceil(R as usize);
    const MASK: u64 = (1 << R) - 1;
    /// List id of the due list.
    const DUE: usize = Self::LEVELS * Self::SLOTS;
    const CHECK_R: () = assert!(R >= 1 && R <= 6, "R must be in 1..=6");

    /// An empty wheel at tick `now` with `R` bits per level (`1..=6`; a
    /// compile-time error otherwise). `R = 1` is hitime's 64 bins.
    pub fn with_level_bits(now: u64) -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::CHECK_R;
        Self {
            nodes: Vec::new(),
            free: Vec::new(),
            heads: vec![NIL; Self::DUE + 1].into_boxed_slice(),
            slot_bits: vec![0; Self::LEVELS].into_boxed_slice(),
            level_bits: 0,
            now,
            len: 0,
        }
    }

    /// The latest tick advanced to (at first, the tick given to `new`).
    #[inline]
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Number of pending timers (due ones not yet fired included).
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` if no timer is pending.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Schedules `value` to fire at `deadline`. A deadline `<= now()` fires at
    /// the next advance. O(1).
    ///
    /// # Panics
    ///
    /// If more than `u32::MAX - 1` timers would be pending at once.
    pub fn insert(&mut self, deadline: u64, value: T) -> TimerId {
        let (index, generation) = if let Some(index) = self.free.pop() {
            let generation = self.generation(index);
            self.nodes[index as usize] = Node::Occupied {
                generation,
                prev: NIL,
                next: NIL,
                deadline,
                value,
            };
            (index, generation)
        } else {
            let index = u32::try_from(self.nodes.len())
                .ok()
                .filter(|&i| i != NIL)
                .expect("TimerWheel: more than u32::MAX - 1 pending timers");
            self.nodes.push(Node::Occupied {
                generation: 0,
                prev: NIL,
                next: NIL,
                deadline,
                value,
            });
            (index, 0)
        };
        self.len += 1;
        self.push_back(self.list_for(deadline), index);
        TimerId { index, generation }
    }

    /// Cancels a pending timer and returns its payload; it will never fire.
    /// `None` if the id is stale (fired, cancelled, or its slot reused). O(1).
    pub fn cancel(&mut self, id: TimerId) -> Option<T> {
        let deadline = self.deadline(id)?;
        self.unlink(self.list_for(deadline), id.index);
        Some(self.release(id.index))
    }

    /// Moves a pending timer to `deadline` (earlier, later, or `<= now()`,
    /// which makes it due). `false` if the id is stale. O(1).
    pub fn reschedule(&mut self, id: TimerId, deadline: u64) -> bool {
        let Some(old) = self.deadline(id) else {
            return false;
        };
        self.unlink(self.list_for(old), id.index);
        if let Node::Occupied { deadline: d, .. } = &mut self.nodes[id.index as usize] {
            *d = deadline;
        }
        self.push_back(self.list_for(deadline), id.index);
        true
    }

    /// The deadline of a pending timer, or `None` if the id is stale.
    #[inline]
    pub fn deadline(&self, id: TimerId) -> Option<u64> {
        match self.nodes.get(id.index as usize)? {
            Node::Occupied {
                generation,
                deadline,
                ..
            } if *generation == id.generation => Some(*deadline),
            _ => None,
        }
    }

    /// The payload of a pending timer, or `None` if the id is stale.
    #[inline]
    pub fn get(&self, id: TimerId) -> Option<&T> {
        match self.nodes.get(id.index as usize)? {
            Node::Occupied {
                generation, value, ..
            } if *generation == id.generation => Some(value),
            _ => None,
        }
    }

    /// Mutable access to the payload of a pending timer.
    #[inline]
    pub fn get_mut(&mut self, id: TimerId) -> Option<&mut T> {
        match self.nodes.get_mut(id.index as usize)? {
            Node::Occupied {
                generation, value, ..
            } if *generation == id.generation => Some(value),
            _ => None,
        }
    }

    /// The payload of the pending timer at slab `index`, if any, whatever its
    /// generation: for callers that store bare indices of timers they know
    /// to be pending (see [`id_at`](Self::id_at)).
    #[inline]
    pub fn get_at(&self, index: u32) -> Option<&T> {
        match self.nodes.get(index as usize)? {
            Node::Occupied { value, .. } => Some(value),
            Node::Vacant { .. } => None,
        }
    }

    /// The id of the pending timer at slab `index`, if any. Lets a caller
    /// store a bare `u32` (for example in a hash table) and recover the handle.
    #[inline]
    pub fn id_at(&self, index: u32) -> Option<TimerId> {
        match self.nodes.get(index as usize)? {
            Node::Occupied { generation, .. } => Some(TimerId {
                index,
                generation: *generation,
            }),
            Node::Vacant { .. } => None,
        }
    }

    /// Advances to tick `now` and fires, in deadline order across bins and
    /// first-in-first-out within a bin, exactly the pending timers whose
    /// deadline is `<= now`. An earlier `now` moves nothing back: it only fires
    /// what is already due.
    pub fn advance(&mut self, now: u64, mut fire: impl FnMut(TimerId, T)) {
        while self.advance_at_most(now, usize::MAX, &mut fire) {}
    }

    /// Like [`advance`](Self::advance) but fires at most `limit` timers.
    /// Returns `true` if more are due: call again (with the same `now`) to
    /// fire them. Lets a caller bound the work done per lock hold.
    pub fn advance_at_most(
        &mut self,
        now: u64,
        limit: usize,
        mut fire: impl FnMut(TimerId, T),
    ) -> bool {
        self.move_to(now);
        for _ in 0..limit {
            let head = self.heads[Self::DUE];
            if head == NIL {
                return false;
            }
            self.unlink(Self::DUE, head);
            let id = TimerId {
                index: head,
                generation: self.generation(head),
            };
            let value = self.release(head);
            fire(id, value);
        }
        self.heads[Self::DUE] != NIL
    }

    /// When `advance` next has work: `None` if nothing is pending,
    /// `Some(now())` if something is already due, and otherwise a tick in
    /// `(now(), earliest pending deadline]` (hitime's `get_wait`). Advancing
    /// to it never fires early and always makes progress, so a driver that
    /// only advances to `next_wakeup()` fires every timer at its deadline.
    pub fn next_wakeup(&self) -> Option<u64> {
        if self.heads[Self::DUE] != NIL {
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

    /// Fires every pending timer (due ones first, then in deadline order
    /// across bins), leaving the wheel empty. For shutdown.
    pub fn drain(&mut self, mut fire: impl FnMut(TimerId, T)) {
        for list in 0..Self::DUE {
            self.splice_to_due(list);
        }
        self.slot_bits.fill(0);
        self.level_bits = 0;
        while self.advance_at_most(self.now, usize::MAX, &mut fire) {}
    }

    // ---- internals -------------------------------------------------------

    /// The list a timer with `deadline` belongs on, given the current `now`.
    #[inline]
    fn list_for(&self, deadline: u64) -> usize {
        if deadline <= self.now {
            return Self::DUE;
        }
        let bit = 63 - (deadline ^ self.now).leading_zeros();
        let level = bit / R;
        let slot = (deadline >> (level * R)) & Self::MASK;
        level as usize * Self::SLOTS + slot as usize
    }

    #[inline]
    fn generation(&self, index: u32) -> u32 {
        match self.nodes[index as usize] {
            Node::Occupied { generation, .. } | Node::Vacant { generation, .. } => generation,
        }
    }

    #[inline]
    fn links(&self, index: u32) -> (u32, u32) {
        match self.nodes[index as usize] {
            Node::Occupied { prev, next, .. } => (prev, next),
            Node::Vacant { .. } => unreachable!("linked node is vacant"),
        }
    }

    #[inline]
    fn set_prev(&mut self, index: u32, to: u32) {
        if let Node::Occupied { prev, .. } = &mut self.nodes[index as usize] {
            *prev = to;
        }
    }

    #[inline]
    fn set_next(&mut self, index: u32, to: u32) {
        if let Node::Occupied { next, .. } = &mut self.nodes[index as usize] {
            *next = to;
        }
    }

    /// Frees an (already unlinked) node and returns its payload.
    fn release(&mut self, index: u32) -> T {
        let vacant = Node::Vacant {
            generation: self.generation(index).wrapping_add(1),
        };
        let Node::Occupied { value, .. } =
            std::mem::replace(&mut self.nodes[index as usize], vacant)
        else {
            unreachable!("released a vacant node")
        };
        self.free.push(index);
        self.len -= 1;
        value
    }

    /// Appends `index` to `list` (first in, first out).
    #[inline]
    fn push_back(&mut self, list: usize, index: u32) {
        let head = self.heads[list];
        if head == NIL {
            self.set_prev(index, index);
            self.set_next(index, index);
            self.heads[list] = index;
            self.mark_occupied(list);
        } else {
            let (tail, _) = self.links(head);
            self.set_prev(index, tail);
            self.set_next(index, head);
            self.set_next(tail, index);
            self.set_prev(head, index);
        }
    }

    /// Removes `index` from `list`.
    #[inline]
    fn unlink(&mut self, list: usize, index: u32) {
        let (prev, next) = self.links(index);
        if next == index {
            debug_assert_eq!(self.heads[list], index);
            self.heads[list] = NIL;
            self.mark_empty(list);
        } else {
            self.set_next(prev, next);
            self.set_prev(next, prev);
            if self.heads[list] == index {
                self.heads[list] = next;
            }
        }
    }

    #[inline]
    fn mark_occupied(&mut self, list: usize) {
        if list != Self::DUE {
            let (level, slot) = (list / Self::SLOTS, list % Self::SLOTS);
            self.slot_bits[level] |= 1 << slot;
            self.level_bits |= 1 << level;
        }
    }

    #[inline]
    fn mark_empty(&mut self, list: usize) {
        if list != Self::DUE {
            let (level, slot) = (list / Self::SLOTS, list % Self::SLOTS);
            self.slot_bits[level] &= !(1 << slot);
            if self.slot_bits[level] == 0 {
                self.level_bits &= !(1 << level);
            }
        }
    }

    /// Moves the whole of `list` to the end of the due list, in O(1). Leaves
    /// the occupancy bits to the caller.
    fn splice_to_due(&mut self, list: usize) {
        let head = std::mem::replace(&mut self.heads[list], NIL);
        if head == NIL {
            return;
        }
        let due = self.heads[Self::DUE];
        if due == NIL {
            self.heads[Self::DUE] = head;
        } else {
            let (due_tail, _) = self.links(due);
            let (tail, _) = self.links(head);
            self.set_next(due_tail, head);
            self.set_prev(head, due_tail);
            self.set_next(tail, due);
            self.set_prev(due, tail);
        }
    }

    /// Moves time forward to `to` (no-op if `to <= now`), restoring the
    /// placement invariant for every node. See the module docs.
    fn move_to(&mut self, to: u64) {
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
                self.splice_to_due(level * Self::SLOTS + slot);
            }
            self.level_bits &= !(1 << level);
        }

        // Level `lm`: slots strictly between the two digits are due; the slot
        // equal to `to`'s digit is re-examined timer by timer.
        let level = lm as usize;
        let shift = lm * R;
        let old_digit = (from >> shift) & Self::MASK;
        let new_digit = (to >> shift) & Self::MASK;
        debug_assert!(old_digit < new_digit);
        let occupied = self.slot_bits[level];
        let between = occupied & ((1u64 << new_digit) - 1) & !((1u64 << (old_digit + 1)) - 1);
        let mut slots = between;
        while slots != 0 {
            let slot = slots.trailing_zeros() as usize;
            slots &= slots - 1;
            self.splice_to_due(level * Self::SLOTS + slot);
        }
        let mut remaining = occupied & !between;
        let recheck = level * Self::SLOTS + new_digit as usize;
        let head = if occupied & (1 << new_digit) != 0 {
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
            let (tail, _) = self.links(head);
            let mut cur = head;
            loop {
                let (_, next) = self.links(cur);
                let Node::Occupied { deadline, .. } = self.nodes[cur as usize] else {
                    unreachable!("linked node is vacant")
                };
                let list = self.list_for(deadline);
                debug_assert!(list == Self::DUE || list / Self::SLOTS < level);
                self.push_back(list, cur);
                if cur == tail {
                    break;
                }
                cur = next;
            }
        }
    }

    /// Checks every internal invariant; panics with a description if one
    /// fails. O(number of nodes). Test-only.
    #[cfg(test)]
    pub(crate) fn validate(&self) {
        let mut seen = vec![false; self.nodes.len()];
        let mut count = 0usize;
        for list in 0..=Self::DUE {
            let head = self.heads[list];
            if list != Self::DUE {
                let (level, slot) = (list / Self::SLOTS, list % Self::SLOTS);
                let bit = self.slot_bits[level] & (1 << slot) != 0;
                assert_eq!(bit, head != NIL, "slot bit mismatch at list {list}");
            }
            if head == NIL {
                continue;
            }
            let mut cur = head;
            loop {
                let (prev, next) = self.links(cur);
                assert!(!seen[cur as usize], "node {cur} linked twice");
                seen[cur as usize] = true;
                count += 1;
                assert_eq!(self.links(next).0, cur, "broken back link");
                assert_eq!(self.links(prev).1, cur, "broken forward link");
                let Node::Occupied { deadline, .. } = self.nodes[cur as usize] else {
                    unreachable!()
                };
                assert_eq!(
                    self.list_for(deadline),
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
        assert_eq!(count, self.len, "len mismatch");
        for &free in &self.free {
            assert!(
                matches!(self.nodes[free as usize], Node::Vacant { .. }),
                "free stack holds occupied node {free}"
            );
        }
        let mut sorted = self.free.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            self.free.len(),
            "free stack holds a node twice"
        );
        assert_eq!(
            self.free.len() + self.len,
            self.nodes.len(),
            "free stack leaks nodes"
        );
    }
}

impl<T, const R: u32> fmt::Debug for TimerWheel<T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimerWheel")
            .field("level_bits", &R)
            .field("now", &self.now)
            .field("len", &self.len)
            .field("next_wakeup", &self.next_wakeup())
            .finish()
    }
}

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

mod lists;
#[cfg(test)]
mod tests;

pub(crate) use lists::{Links, Lists, NIL};
use std::fmt;

/// Bits per level used by [`TimerWheel::new`]: 64 slots per level, 11
/// levels. Chosen by the lifecycle benchmark in `benches/benches/timer.rs`:
/// in the 4-tick drive (the eviction thread's pattern) R = 6 was fastest or
/// tied at 10^4..10^6 timers and ran the fewest instructions (callgrind: 279
/// per timer at 10^6, against 305 for R = 4 and 428 for R = 1). See
/// BENCHMARKS.md.
pub const DEFAULT_LEVEL_BITS: u32 = 6;

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
    nodes: Nodes<T>,
    /// Indices of vacant nodes, reused last-in first-out. A stack beside the
    /// slab rather than a list through the vacant nodes: taking a slot then
    /// reads no cold node (measured: warm-slab insert at 10^6, 150 -> 85 ns).
    free: Vec<u32>,
    lists: Lists<R>,
    len: usize,
}

/// The slab, as the [`Links`] store of the wheel's lists.
struct Nodes<T>(Vec<Node<T>>);

impl<T> Links for Nodes<T> {
    #[inline]
    fn links(&self, index: u32) -> (u32, u32) {
        match self.0[index as usize] {
            Node::Occupied { prev, next, .. } => (prev, next),
            Node::Vacant { .. } => unreachable!("linked node is vacant"),
        }
    }

    #[inline]
    fn set_prev(&mut self, index: u32, to: u32) {
        if let Node::Occupied { prev, .. } = &mut self.0[index as usize] {
            *prev = to;
        }
    }

    #[inline]
    fn set_next(&mut self, index: u32, to: u32) {
        if let Node::Occupied { next, .. } = &mut self.0[index as usize] {
            *next = to;
        }
    }

    #[inline]
    fn deadline(&self, index: u32) -> u64 {
        match self.0[index as usize] {
            Node::Occupied { deadline, .. } => deadline,
            Node::Vacant { .. } => unreachable!("linked node is vacant"),
        }
    }
}

impl<T> TimerWheel<T> {
    /// An empty wheel at tick `now`, with [`DEFAULT_LEVEL_BITS`] per level.
    pub fn new(now: u64) -> Self {
        Self::with_level_bits(now)
    }
}

impl<T, const R: u32> TimerWheel<T, R> {
    /// Slots per level.
    pub const SLOTS: usize = Lists::<R>::SLOTS;
    /// Levels needed to cover 64 bits.
    pub const LEVELS: usize = Lists::<R>::LEVELS;

    /// An empty wheel at tick `now` with `R` bits per level (`1..=6`; a
    /// compile-time error otherwise). `R = 1` is hitime's 64 bins.
    pub fn with_level_bits(now: u64) -> Self {
        Self {
            nodes: Nodes(Vec::new()),
            free: Vec::new(),
            lists: Lists::new(now),
            len: 0,
        }
    }

    /// The latest tick advanced to (at first, the tick given to `new`).
    #[inline]
    pub fn now(&self) -> u64 {
        self.lists.now()
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
        let nodes = &mut self.nodes.0;
        let (index, generation) = if let Some(index) = self.free.pop() {
            let generation = generation(&nodes[index as usize]);
            nodes[index as usize] = Node::Occupied {
                generation,
                prev: NIL,
                next: NIL,
                deadline,
                value,
            };
            (index, generation)
        } else {
            let index = u32::try_from(nodes.len())
                .ok()
                .filter(|&i| i != NIL)
                .expect("TimerWheel: more than u32::MAX - 1 pending timers");
            nodes.push(Node::Occupied {
                generation: 0,
                prev: NIL,
                next: NIL,
                deadline,
                value,
            });
            (index, 0)
        };
        self.len += 1;
        self.lists.link(&mut self.nodes, index, deadline);
        TimerId { index, generation }
    }

    /// Cancels a pending timer and returns its payload; it will never fire.
    /// `None` if the id is stale (fired, cancelled, or its slot reused). O(1).
    pub fn cancel(&mut self, id: TimerId) -> Option<T> {
        let deadline = self.deadline(id)?;
        self.lists.unlink(&mut self.nodes, id.index, deadline);
        Some(self.vacate(id.index))
    }

    /// Moves a pending timer to `deadline` (earlier, later, or `<= now()`,
    /// which makes it due). `false` if the id is stale. O(1).
    pub fn reschedule(&mut self, id: TimerId, deadline: u64) -> bool {
        let Some(old) = self.deadline(id) else {
            return false;
        };
        self.lists.unlink(&mut self.nodes, id.index, old);
        if let Node::Occupied { deadline: d, .. } = &mut self.nodes.0[id.index as usize] {
            *d = deadline;
        }
        self.lists.link(&mut self.nodes, id.index, deadline);
        true
    }

    /// The deadline of a pending timer, or `None` if the id is stale.
    #[inline]
    pub fn deadline(&self, id: TimerId) -> Option<u64> {
        match self.nodes.0.get(id.index as usize)? {
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
        match self.nodes.0.get(id.index as usize)? {
            Node::Occupied {
                generation, value, ..
            } if *generation == id.generation => Some(value),
            _ => None,
        }
    }

    /// Mutable access to the payload of a pending timer.
    #[inline]
    pub fn get_mut(&mut self, id: TimerId) -> Option<&mut T> {
        match self.nodes.0.get_mut(id.index as usize)? {
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
        match self.nodes.0.get(index as usize)? {
            Node::Occupied { value, .. } => Some(value),
            Node::Vacant { .. } => None,
        }
    }

    /// The id of the pending timer at slab `index`, if any. Lets a caller
    /// store a bare `u32` (for example in a hash table) and recover the handle.
    #[inline]
    pub fn id_at(&self, index: u32) -> Option<TimerId> {
        match self.nodes.0.get(index as usize)? {
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
        self.lists.move_to(&mut self.nodes, now);
        for _ in 0..limit {
            let Some(index) = self.lists.pop_due(&mut self.nodes) else {
                return false;
            };
            let id = TimerId {
                index,
                generation: generation(&self.nodes.0[index as usize]),
            };
            let value = self.vacate(index);
            fire(id, value);
        }
        self.lists.first_due().is_some()
    }

    /// When `advance` next has work: `None` if nothing is pending,
    /// `Some(now())` if something is already due, and otherwise a tick in
    /// `(now(), earliest pending deadline]` (hitime's `get_wait`). Advancing
    /// to it never fires early and always makes progress, so a driver that
    /// only advances to `next_wakeup()` fires every timer at its deadline.
    pub fn next_wakeup(&self) -> Option<u64> {
        self.lists.next_wakeup()
    }

    /// Fires every pending timer (due ones first, then in deadline order
    /// across bins), leaving the wheel empty. For shutdown.
    pub fn drain(&mut self, mut fire: impl FnMut(TimerId, T)) {
        self.lists.all_due(&mut self.nodes);
        let now = self.now();
        while self.advance_at_most(now, usize::MAX, &mut fire) {}
    }

    // ---- internals -------------------------------------------------------

    /// Frees an (already unlinked) node and returns its payload.
    fn vacate(&mut self, index: u32) -> T {
        let slot = &mut self.nodes.0[index as usize];
        let vacant = Node::Vacant {
            generation: generation(slot).wrapping_add(1),
        };
        let Node::Occupied { value, .. } = std::mem::replace(slot, vacant) else {
            unreachable!("released a vacant node")
        };
        self.free.push(index);
        self.len -= 1;
        value
    }

    /// Walks up to `budget` timers of the next level-1 slot ahead of time
    /// (`Lists::precascade`), as the map's eviction thread does between
    /// passes. Test-only: the model checks that it changes nothing a
    /// caller sees.
    #[cfg(test)]
    pub(crate) fn precascade(&mut self, budget: usize) -> bool {
        self.lists.precascade(&mut self.nodes, budget)
    }

    /// The same for the next level-2 slot (`Lists::precascade2`).
    /// Test-only.
    #[cfg(test)]
    pub(crate) fn precascade2(&mut self, budget: usize) -> bool {
        self.lists.precascade2(&mut self.nodes, budget)
    }

    /// Checks every internal invariant; panics with a description if one
    /// fails. O(number of nodes). Test-only.
    #[cfg(test)]
    pub(crate) fn validate(&self) {
        let nodes = &self.nodes.0;
        let mut seen = vec![false; nodes.len()];
        let mut count = 0usize;
        self.lists.validate(&self.nodes, |i| {
            assert!(!seen[i as usize], "node {i} linked twice");
            seen[i as usize] = true;
            count += 1;
        });
        assert_eq!(count, self.len, "len mismatch");
        for &free in &self.free {
            assert!(
                matches!(nodes[free as usize], Node::Vacant { .. }),
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
            nodes.len(),
            "free stack leaks nodes"
        );
    }
}

#[inline]
fn generation<T>(node: &Node<T>) -> u32 {
    match *node {
        Node::Occupied { generation, .. } | Node::Vacant { generation } => generation,
    }
}

impl<T, const R: u32> fmt::Debug for TimerWheel<T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimerWheel")
            .field("level_bits", &R)
            .field("now", &self.now())
            .field("len", &self.len)
            .field("next_wakeup", &self.next_wakeup())
            .finish()
    }
}

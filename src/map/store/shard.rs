//! One shard: a hash table of slab indices plus the timer wheel whose slab
//! holds the entries.
//!
//! # Ground rules
//!
//! * Plain `&mut self` code. The map wraps each shard in its own
//!   `RwLock`; the shard knows nothing of locks, threads or events.
//! * One allocation per entry serves both the table and the expiry index: the
//!   entry lives in the wheel's slab node (with the timer links), and the
//!   [`Table`] stores only a 4-byte slot: the node's index and a tag of the
//!   key's hash. Rejecting other keys by tag never touches the slab; a hit
//!   reads one table slot and one node. The key's 32 hash bits sit in a
//!   parallel array of the slab, read only when the table grows or removes.
//! * The hash is computed by the caller before the lock is taken and stored
//!   in the entry, so resizing and eviction never run user `Hash` code. `Eq`
//!   runs inside lookups (inherent to a hash table); it only reads.
//! * Values leave the shard by value (`Removed<K, V>`): the caller drops them,
//!   or publishes them, after releasing the lock.
//! * Time: entries carry their exact deadline in clock nanoseconds. The wheel
//!   runs on ticks of `2^shift` nanoseconds, the largest power of two not
//!   above the configured precision (1 ms gives 524,288 ns), so converting a
//!   time to a tick is a shift, not a division. An entry's timer tick is the
//!   first tick that starts strictly after its deadline, so eviction is never
//!   early and at most one tick (less than one precision) late. Reads compare
//!   the exact deadline.
//!
//! # Rooms
//!
//! This file holds [`Shard`]: the table glue and the operations (lookups,
//! puts, removal, draining). Beside it:
//!
//! * `slab`: the entries' storage ([`Entries`]: slab, free stack, timer
//!   lists) and the slab invariant every `unsafe` read relies on;
//! * `idle`: idle expiry's per-node records and what a lookup found;
//! * `evict`: eviction (what is due, walking ahead, a write's share);
//! * `bound`: the capacity bound's hooks (bounded put, making room);
//! * `out`: what leaves a shard, by which door;
//! * `iter`: the locked spans iteration and `retain` walk, and the log of
//!   the nodes written while `retain` watches ([`Changes`]).

pub(crate) use super::table::Home;
use super::table::{Probe, Table};
use crate::map::policy::{Bound, Budget};
use crate::sync::{Ordering, with_mut_u32};
use crate::timer::{Links, Lists};
use std::borrow::Borrow;

mod bound;
mod evict;
mod idle;
mod iter;
mod out;
mod slab;

use idle::Accesses;
pub(crate) use idle::Found;
pub(crate) use iter::Changes;
pub(crate) use out::{Door, Out, PutOutcome, Removed, Room, Sink};
pub(crate) use slab::Entry;
use slab::{Entries, MAX_NODES, Nodes, Slab, VACANT};

/// The CLOCK hand's place among `n > 0` nodes: `hand % n`, without the
/// division in the usual case (the hand is at most `n`, one past the last
/// node it looked at).
#[inline]
fn wrap(hand: u32, n: u32) -> u32 {
    if hand < n { hand } else { hand % n }
}

/// The most entries a bounded shard's table is sized for up front (1.3 MiB
/// of slots): a larger share grows it as the shard fills, so that a bound
/// of `u64::MAX` costs an empty map 8 × 1.3 MiB at 8 shards, not its share
/// of the bound.
const PRESIZED_TABLE: u64 = 1 << 18;
/// Most nodes of the next timer tick's list a full bounded shard looks at
/// for expired entries before it asks the policy for a victim.
const NEXT_TICK_SEARCH: usize = 32;

/// The table-probe predicate for `key`: user `Eq` on the stored key of a
/// slot whose hash bits already matched.
#[inline]
fn is_key<'a, K, V, Q>(slab: &'a Slab<K, V>, key: &'a Q) -> impl Fn(u32) -> bool + Copy + 'a
where
    K: Borrow<Q>,
    Q: Eq + ?Sized,
{
    // SAFETY: table slots hold live indices (slab invariant).
    move |index| unsafe { slab.kv(index) }.0.borrow() == key
}

/// The stored hash bits of a slab index, for the table to re-place slots.
#[inline]
fn hash_of<K, V>(slab: &Slab<K, V>) -> impl Fn(u32) -> u32 + '_ {
    |index| slab.nodes.hash(index)
}

/// The phase of shard `index` of `shards` (a power of two), in whole ticks.
///
/// Every entry is re-placed by a cascade when time enters its level-1
/// wheel slot (64 ticks, ~34 ms at the default precision), and before that
/// when time enters its level-2 slot (4,096 ticks, ~2.1 s), and so on up.
/// With the same wheel geometry in every shard, all shards cascade in the
/// same eviction pass: at 10^6 entries that pass took ~5.6 ms against ~1.6
/// ms for the others, and set the lateness tail; a level-2 boundary walks
/// every entry due in the next ~2.1 s at once (3 * 10^6 entries over 5 s:
/// events 42 ms late). Numbering each shard's ticks from a different
/// offset spreads the cascades over the passes: shard `i` of `n` takes the
/// digit `d = i * 64 / n` at each of levels 0 to 4 (`d * (1 + 64 + ... +
/// 64^4)`), so its level-1 boundaries fall `d` ticks into a level-1 slot,
/// its level-2 boundaries `65 * d` into a level-2 slot, and so on. The
/// offset is a whole number of ticks, so tick boundaries, and with them
/// eviction times, stay exactly where they were.
pub(crate) fn phase(index: usize, shards: usize) -> u64 {
    const R: u32 = crate::timer::DEFAULT_LEVEL_BITS;
    const SLOTS: usize = crate::timer::Lists::<R>::SLOTS;
    // 1 + 64 + 64^2 + 64^3 + 64^4: one digit repeated at levels 0..=4.
    const REPEAT: u64 = (1 << (5 * R)) / ((1 << R) - 1);
    let digit = (index * SLOTS / shards.max(1)) as u64 % SLOTS as u64;
    digit * REPEAT
}

/// The tick shift for a precision of `precision` ns: the largest `s` with
/// `2^s <= precision` (at least 1).
pub(crate) fn tick_shift(precision: u64) -> u32 {
    (63 - precision.max(2).leading_zeros()).max(1)
}

/// A hash table of slab indices plus a timer wheel whose nodes are the
/// entries. See [`Entries`] for the slab invariant.
///
/// # The end of time
///
/// An entry is live while `now <= deadline`, and its timer tick is the first
/// that starts after its deadline. The clock's range ends at `u64::MAX`, so
/// two cases get a tick of their own, keeping eviction exact there too:
///
/// * deadline `u64::MAX` (a saturated TTL) is live at every time, so it
///   never expires: its tick is one past the last that `tick_of` can reach,
///   and [`next_wakeup`](Shard::next_wakeup) does not report it;
/// * time `u64::MAX` has no tick that starts after it, so `tick_of(u64::MAX)`
///   is the tick after the last: every other deadline is below `u64::MAX`
///   and is due then.
///
/// Overflow: `shift >= 1` and `phase < 2^62`, so every tick is at most
/// `2^63 + 1 + 2^62`.
///
/// # Eviction time
///
/// [`evict`](Shard::evict) never evicts at a time below one the wheel has
/// already reached: the wheel's due list holds exactly the entries whose
/// tick it has passed, so a caller with an older reading of the clock would
/// otherwise pop entries that are live at its time. The wheel only reaches a
/// tick at a time that some caller read, so that floor is never in the
/// future.
///
/// # Layout
///
/// `repr(C)`, and so are the headers inside it, so that what a read
/// touches before the table slot and the node sits on the two cache lines
/// that start with the shard's lock (`ShardSlot`): the lock's words, the
/// table's slots and mask, a growth's leftover count, `timed`, `bound`,
/// and the slab's first chunk (the `layout` test checks it). Left to the
/// compiler, those were four lines apart.
#[repr(C)]
pub(crate) struct Shard<K, V> {
    table: Table,
    entries: Entries<K, V>,
    /// The loads and updates in flight for keys of this shard (see
    /// `map::load`); the shard only keeps them, across `take_all` too.
    pub(crate) flights: Vec<crate::sync::Arc<crate::map::load::flight::Flight<K, V>>>,
    /// Which nodes were written while an optimistic reader (`retain`)
    /// watches.
    pub(crate) changes: Changes,
    /// Writes from this clock time on take due entries (see
    /// [`writers_evict`](Self::writers_evict)): the start of the tick
    /// `writer_lag` ticks after the wheel's, set by every
    /// [`evict`](Self::evict) that leaves nothing due; zero while a write's
    /// eviction left entries due
    /// ([`writers_continue`](Self::writers_continue)).
    writers_from: u64,
    /// How many ticks of no eviction make writes take due entries
    /// (`u64::MAX`, the default: never).
    writer_lag: u64,
}

impl<K, V> Shard<K, V> {
    /// A shard whose ticks last `2^shift` ns (see [`tick_shift`]), numbered
    /// from `phase` (see [`phase`]).
    pub(crate) fn new(shift: u32, phase: u64, now: u64) -> Self {
        // shift >= 1 and a phase below 2^62 keep `tick_for` from overflowing
        // (see "The end of time" on `Shard`).
        assert!((1..64).contains(&shift) && phase < 1 << 62);
        let slab = Slab {
            nodes: Nodes::new(),
            shift,
            phase,
            idle: None,
        };
        Self {
            flights: Vec::new(),
            changes: Changes::new(),
            writers_from: u64::MAX,
            writer_lag: u64::MAX,
            table: Table::new(),
            entries: Entries {
                lists: Lists::new(slab.tick_of(now)),
                slab,
                free: Vec::new(),
                len: 0,
                bound: None,
                timed: false,
            },
        }
    }

    /// This shard, alone under a bound of `cap` entries (or weight units,
    /// if `weighted`): the shard tests' form of [`bounded_by`](Self::bounded_by).
    #[cfg(test)]
    pub(crate) fn bounded(self, cap: u64, weighted: bool) -> Self {
        let budget = crate::sync::Arc::new(Budget::new(cap));
        self.bounded_by(budget, cap, weighted)
    }

    /// This shard, one of those sharing the map-wide `budget` (entries, or
    /// weight units if `weighted`), expecting about `share` of it: see
    /// `policy`. For a new, empty shard.
    pub(crate) fn bounded_by(
        mut self,
        budget: crate::sync::Arc<Budget>,
        share: u64,
        weighted: bool,
    ) -> Self {
        let cap = budget.cap;
        self.entries.bound = Some(Box::new(Bound::new(budget, share, weighted)));
        if !weighted {
            // At most `cap` entries, about `share` of them here: a full
            // map's shards hold their share give or take a few standard
            // deviations. A table sized for a moderate share with room for
            // that (1/64 more and 64 spare; 3/4 full when the shard holds
            // it) that grows as an unbounded one does past it, so that a
            // huge bound does not allocate up front what it may never use;
            // and a slab whose last chunk is no larger than about the
            // share (a hint: a chunk past it grows like a `Vec`).
            let most = share.saturating_add(share / 64 + 64).min(cap);
            self.table = Table::with_capacity(most.min(PRESIZED_TABLE) as usize);
            let about = share.saturating_add(share / 256 + 16).min(cap);
            self.entries.slab.nodes.limit = u32::try_from(about).unwrap_or(u32::MAX);
        }
        self
    }

    /// This shard, whose entries also expire `idle` ns after their last
    /// access. For a new, empty shard.
    pub(crate) fn idle(mut self, idle: u64) -> Self {
        self.entries.slab.idle = Some(idle);
        self.entries.slab.nodes.tracks_idle = true;
        self
    }

    /// This shard, whose writes take due entries once no eviction has
    /// drained it for `lag` ticks (see
    /// [`writers_evict`](Self::writers_evict)).
    pub(crate) fn writer_lag(mut self, lag: u64) -> Self {
        self.writer_lag = lag;
        self.writers_from = self.time_of(self.entries.lists.now().saturating_add(lag));
        self
    }

    /// This shard, which keeps when each entry's value was written (for
    /// refresh ahead). For a new, empty shard.
    pub(crate) fn tracking_writes(mut self) -> Self {
        self.entries.slab.nodes.tracks_born = true;
        self
    }

    /// This shard's budget, share and whether it is weighted, to make
    /// another like it.
    fn bound_config(&self) -> Option<(crate::sync::Arc<Budget>, u64, bool)> {
        let b = self.entries.bound.as_ref()?;
        let (budget, share) = b.config()?;
        Some((budget, share, b.weights.is_some()))
    }

    /// What the entries of a bounded shard weigh (their count without a
    /// weigher); 0 in an unbounded one.
    pub(crate) fn weight(&self) -> u64 {
        self.entries.bound.as_ref().map_or(0, |b| b.used)
    }

    /// What the shard holds against its bound (its weight, or its entry
    /// count), and the bound; `None` if unbounded.
    #[cfg(test)]
    pub(crate) fn usage(&self) -> Option<(u64, u64)> {
        self.entries.bound.as_ref().map(|b| (b.used, b.cap))
    }

    /// When an entry with `deadline` becomes evictable (clock ns): the start
    /// of its timer tick, the first that starts strictly after the deadline.
    /// `None` for a deadline that never expires.
    #[inline]
    pub(crate) fn evictable_at(&self, deadline: u64) -> Option<u64> {
        (deadline != u64::MAX).then(|| self.time_of(self.tick_for(deadline)))
    }

    /// The wheel tick at which an entry with `deadline` becomes evictable:
    /// the first tick starting strictly after the deadline.
    #[inline]
    pub(crate) fn tick_for(&self, deadline: u64) -> u64 {
        self.entries.slab.tick_for(deadline)
    }

    /// Clock time (ns) at which the wheel reaches `tick`.
    #[inline]
    pub(crate) fn time_of(&self, tick: u64) -> u64 {
        let Slab { shift, phase, .. } = self.entries.slab;
        let tick = tick.saturating_sub(phase);
        tick.checked_shl(shift)
            .filter(|t| t >> shift == tick)
            .unwrap_or(u64::MAX)
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.entries.len
    }

    /// Starts a lookup of `hash`: hints the CPU to load its table slot, and
    /// returns where [`get_from`](Self::get_from) continues (a write, which
    /// may grow the table, only wants the hint).
    #[inline]
    pub(crate) fn start(&self, hash: u64) -> Home {
        self.table.start(hash as u32)
    }

    /// Hints the CPU to load the node a lookup of `hash` most likely ends
    /// at ([`Table::guess`]): reads the table (its slots should be in
    /// cache, from a [`start`](Self::start) in an earlier hold of the
    /// lock), no node, and runs no user code. `get_many`'s second warm-up.
    #[inline]
    pub(crate) fn prefetch_found(&self, hash: u64) {
        if let Some(index) = self.table.guess(hash as u32) {
            self.entries.slab.prefetch_kv(index);
        }
    }

    /// [`start`](Self::start) for a write: also hints the CPU to load the
    /// vacant node a new entry would take (freed by an eviction, often on
    /// another core, so a miss), so that the miss overlaps the clock read
    /// and the probe instead of stalling the store.
    #[inline]
    pub(crate) fn start_write(&self, hash: u64) {
        self.table.start(hash as u32);
        if let Some(&index) = self.entries.free.last() {
            self.entries.slab.prefetch_node(index);
        }
        if let Some(b) = &self.entries.bound {
            // A put of a new key into a full map reads its counters, the
            // node under the CLOCK hand and that node's hash bits, then the
            // victim's counters: misses in a chain behind the probe, started
            // here (the victim's from the hand's last victim: a hint).
            b.sketch.prefetch(hash as u32);
            b.sketch.prefetch(b.victim_hint);
            let n = self.entries.slab.nodes.len() as u32;
            if n > 0 {
                self.entries.slab.prefetch_node(wrap(b.hand, n));
            }
        }
    }

    /// The value and exact deadline of the entry for `key`, live or not:
    /// the caller compares the deadline with the time.
    #[cfg(test)]
    pub(crate) fn get<Q>(&self, hash: u64, key: &Q) -> Option<(&V, u64)>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.get_from(self.start(hash), hash, key)
            .map(|f| (f.value, f.deadline))
    }

    /// [`get`](Self::get) from `home`, which [`start`](Self::start) gave
    /// for `hash` under the same lock. Always inlined: every read's hot path.
    #[inline(always)]
    pub(crate) fn get_from<Q>(&self, home: Home, hash: u64, key: &Q) -> Option<Found<'_, V>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.find::<Q, true>(home, hash, key)
    }

    /// [`get_from`](Self::get_from) without counting an access for the
    /// bound's policy (`peek`, and writes that only look).
    #[inline]
    pub(crate) fn peek_from<Q>(&self, home: Home, hash: u64, key: &Q) -> Option<Found<'_, V>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.find::<Q, false>(home, hash, key)
    }

    /// The entry for `key`, live or not; `HIT`: count the lookup as an
    /// access for the bound's policy.
    #[inline(always)]
    fn find<Q, const HIT: bool>(&self, home: Home, hash: u64, key: &Q) -> Option<Found<'_, V>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let slab = &self.entries.slab;
        let index = self.table.find_from(home, hash as u32, is_key(slab, key))?;
        Some(self.found_at::<HIT>(index))
    }

    /// What a lookup that found the table's index `index` hands back.
    #[inline(always)]
    fn found_at<const HIT: bool>(&self, index: u32) -> Found<'_, V> {
        let slab = &self.entries.slab;
        // SAFETY: the caller took `index` from the table, which holds only
        // live indices (slab invariant).
        let node = unsafe { slab.live(index) };
        if HIT && self.entries.bound.is_some() {
            node.hit();
        }
        // SAFETY: as above; a live node's `kv` is initialised.
        let value = &unsafe { node.kv.assume_init_ref() }.1;
        if slab.nodes.tracks_idle {
            return self.found_idle(index, value);
        }
        Found {
            value,
            deadline: node.deadline,
            write: node.deadline,
            idle: None,
        }
    }

    /// [`get_from`](Self::get_from) in a shard without idle expiry, where
    /// an entry's deadline is its node's: the value and that deadline.
    /// Only the shape of the result differs, so that the hottest read keeps
    /// it small; in a shard with idle expiry it is wrong (not unsafe).
    ///
    /// `at_tag` runs (no user code) at each slot whose tag matches, before
    /// its node is read.
    #[inline(always)]
    pub(crate) fn get_plain<Q>(
        &self,
        home: Home,
        hash: u64,
        key: &Q,
        at_tag: impl Fn() + Copy,
    ) -> Option<(&V, u64)>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        debug_assert!(!self.entries.slab.nodes.tracks_idle);
        let slab = &self.entries.slab;
        let is_key = is_key(slab, key);
        let index = self.table.find_from(home, hash as u32, move |i| {
            at_tag();
            is_key(i)
        })?;
        // SAFETY: the table holds only live indices (slab invariant).
        let node = unsafe { slab.live(index) };
        if self.entries.bound.is_some() {
            node.hit();
        }
        // SAFETY: as above; a live node's `kv` is initialised.
        Some((&unsafe { node.kv.assume_init_ref() }.1, node.deadline))
    }

    /// The part of [`get_from`](Self::get_from) only a map with idle expiry
    /// runs: its read of the node's idle record.
    #[inline]
    fn found_idle<'a>(&'a self, index: u32, value: &'a V) -> Found<'a, V> {
        let slab = &self.entries.slab;
        // SAFETY: `index` came from the table, so it is live (slab
        // invariant) and below `nodes.len()`; a shard that tracks idle time
        // pushes an idle record with every node.
        let idle = unsafe { slab.nodes.idle_unchecked(index) };
        let d = slab.idle.unwrap_or(u64::MAX);
        let last = idle.access.load(Ordering::Relaxed);
        Found {
            value,
            deadline: idle.write.min(last.saturating_add(d)),
            write: idle.write,
            idle: Some(Accesses {
                at: &idle.access,
                last,
                idle: d,
            }),
        }
    }

    /// Inserts or overwrites with the key and value in `kv` (which must
    /// hold them). `deadline > now` is the caller's duty.
    ///
    /// They stay in `kv` until the probe (which runs the user's `Eq`) is
    /// over and the shard is known to have room: if either panics, the
    /// caller still owns them and drops them after releasing the lock, so
    /// no user `Drop` runs under it.
    ///
    /// An unbounded shard's; see [`put_bounded`](Self::put_bounded).
    #[inline]
    pub(crate) fn put(
        &mut self,
        hash: u64,
        kv: &mut Option<(K, V)>,
        deadline: u64,
        now: u64,
    ) -> PutOutcome<K, V>
    where
        K: Eq,
    {
        debug_assert!(self.entries.bound.is_none());
        let slab = &self.entries.slab;
        let h32 = hash as u32;
        // The index `alloc` would use; past `MAX_NODES - 1` it panics itself.
        let max_index = slab.nodes.len().min(MAX_NODES - 1) as u32;
        let key = &kv.as_ref().expect("put without a key and value").0;
        match self
            .table
            .probe(h32, is_key(slab, key), max_index, hash_of(slab))
        {
            Probe::Found(index) => PutOutcome::Overwrote(self.overwrite(index, kv, deadline, now)),
            Probe::Vacant(at) => {
                let index = self.entries.alloc(kv, deadline, now, h32, 1);
                self.table.fill(at, h32, index);
                self.changes.wrote(index);
                PutOutcome::Inserted
            }
        }
    }

    /// Puts the value in `kv` into live node `index` with a new deadline;
    /// returns the old value, `Replaced` if it was live at `now`, else
    /// `Expired`. `key` is the caller's (equal to the stored one, which
    /// stays).
    fn overwrite(
        &mut self,
        index: u32,
        kv: &mut Option<(K, V)>,
        deadline: u64,
        now: u64,
    ) -> Removed<K, V> {
        self.changes.wrote(index);
        self.entries.slab.nodes.set_born(index, now);
        let old_deadline = self.entries.slab.live_until(index);
        let sched = self.entries.slab.written(index, deadline, Some(now));
        let node = &mut self.entries.slab.nodes[index as usize];
        let door = if now <= old_deadline {
            Door::Replaced
        } else {
            Door::Expired
        };
        // SAFETY: the index came from the table, so the node is live and
        // its `kv` initialised.
        let pair = unsafe { node.kv.assume_init_mut() };
        let (key, value) = kv.take().expect("put without a key and value");
        let old_value = std::mem::replace(&mut pair.1, value);
        self.entries.reschedule(index, sched);
        Removed {
            key,
            value: old_value,
            deadline: old_deadline,
            door,
        }
    }

    /// Takes live node `index` out of the table and the wheel.
    fn take_index(&mut self, index: u32, door: Door) -> Removed<K, V> {
        let h32 = self.entries.slab.nodes.hash(index);
        let found = self
            .table
            .remove(h32, |i| i == index, hash_of(&self.entries.slab));
        debug_assert_eq!(found, Some(index), "live entry missing from the table");
        let e = self.entries.vacate(index, true);
        Removed {
            key: e.key,
            value: e.value,
            deadline: e.deadline,
            door,
        }
    }

    /// [`put`](Self::put) with the key and value passed by value. Test-only.
    #[cfg(test)]
    pub(crate) fn put_owned(
        &mut self,
        hash: u64,
        key: K,
        value: V,
        deadline: u64,
        now: u64,
    ) -> PutOutcome<K, V>
    where
        K: Eq,
    {
        let mut out = Vec::new();
        let r = self.put_bounded(
            hash,
            &mut Some((key, value)),
            deadline,
            now,
            1,
            &mut out,
            true,
            || false,
        );
        assert!(out.is_empty(), "put_owned on a full bounded shard");
        r
    }

    /// Removes `key` if held. The door is `Removed` if it was live at `now`,
    /// `Expired` otherwise.
    pub(crate) fn remove<Q>(&mut self, hash: u64, key: &Q, now: u64) -> Option<Removed<K, V>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let slab = &self.entries.slab;
        let index = self
            .table
            .remove(hash as u32, is_key(slab, key), hash_of(slab))?;
        self.changes.wrote(index);
        let e = self.entries.vacate(index, true);
        let door = if now <= e.deadline {
            Door::Removed
        } else {
            Door::Expired
        };
        Some(Removed {
            key: e.key,
            value: e.value,
            deadline: e.deadline,
            door,
        })
    }

    /// Sets a new deadline for a live entry; returns where its timer went
    /// (with idle expiry it may be earlier), or `None` if the entry is
    /// absent or expired.
    ///
    /// With `cond`, only if the new deadline is later (`Later`) or earlier
    /// (`Earlier`) than the entry's effective deadline.
    pub(crate) fn touch<Q>(
        &mut self,
        hash: u64,
        key: &Q,
        deadline: u64,
        now: u64,
        cond: crate::map::ExpireIf,
    ) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        use crate::map::ExpireIf;
        let slab = &self.entries.slab;
        let index = self.table.find(hash as u32, is_key(slab, key))?;
        let old = slab.live_until(index);
        let holds = match cond {
            ExpireIf::Always => true,
            ExpireIf::Later => deadline > old,
            ExpireIf::Earlier => deadline < old,
        };
        if now > old || !holds {
            return None;
        }
        self.changes.wrote(index);
        let sched = self.entries.slab.written(index, deadline, None);
        self.entries.reschedule(index, sched);
        Some(sched)
    }

    /// The entry for `key` as a loading call with refresh ahead sees it:
    /// what [`get_from`](Self::get_from) finds, and when its value was
    /// written. Only in a shard that tracks write times.
    #[inline]
    pub(crate) fn get_born<Q>(&self, home: Home, hash: u64, key: &Q) -> Option<(Found<'_, V>, u64)>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let slab = &self.entries.slab;
        let index = self.table.find_from(home, hash as u32, is_key(slab, key))?;
        Some((self.found_at::<true>(index), slab.nodes.born(index)))
    }

    /// The write deadline of the live entry for `key` at `now`, if any
    /// (not an access).
    pub(crate) fn live_write<Q>(&self, hash: u64, key: &Q, now: u64) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let found = self.peek_from(self.start(hash), hash, key)?;
        (now <= found.deadline).then_some(found.write)
    }

    /// The value of the live entry for `key` at `now`, if any.
    pub(crate) fn live_value<Q>(&self, hash: u64, key: &Q, now: u64) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let found = self.get_from(self.start(hash), hash, key)?;
        (now <= found.deadline).then_some(found.value)
    }

    /// `false` while every entry this shard ever held had deadline
    /// `u64::MAX` (never expires): a read then needs no clock. Only a hint
    /// for skipping the read: a deadline met without a bound is still
    /// judged with the exact time (`Time::now_at_most_if`).
    #[inline]
    pub(crate) fn timed(&self) -> bool {
        self.entries.timed
    }

    /// `true` if nothing a write does here depends on the time: the shard
    /// never held a deadline (every entry is live at any time), and keeps
    /// no times of its own (idle expiry's accesses, refresh ahead's write
    /// times). Such a write may be given any time (see `Inner::put_time`).
    #[inline]
    pub(crate) fn time_free(&self) -> bool {
        let nodes = &self.entries.slab.nodes;
        !(self.entries.timed | nodes.tracks_idle | nodes.tracks_born)
    }

    /// Takes every entry out, leaving the shard empty, in O(1) under the lock
    /// (the caller drains the returned shard after unlocking).
    pub(crate) fn take_all(&mut self, now: u64) -> Shard<K, V> {
        let Slab {
            shift, phase, idle, ..
        } = self.entries.slab;
        let mut fresh = Shard::new(shift, phase, now);
        if let Some((budget, share, weighted)) = self.bound_config() {
            fresh = fresh.bounded_by(budget, share, weighted);
        }
        if let Some(idle) = idle {
            fresh = fresh.idle(idle);
        }
        if self.entries.slab.nodes.tracks_born {
            fresh = fresh.tracking_writes();
        }
        fresh = fresh.writer_lag(self.writer_lag);
        // Flights and watchers concern keys, not entries: they stay.
        fresh.flights = std::mem::take(&mut self.flights);
        std::mem::swap(&mut fresh.changes, &mut self.changes);
        let mut taken = std::mem::replace(self, fresh);
        // Out of the map now: its weight goes back to the budget at once,
        // not as each entry drains (a panicking `Drop` may cut that short).
        if let Some(b) = &mut taken.entries.bound {
            b.detach();
        }
        taken
    }

    /// Drains every entry (for `clear` and shutdown), without the lock. If
    /// `f` panics, dropping the shard drops the entries not yet drained.
    pub(crate) fn drain(mut self, mut f: impl FnMut(Entry<K, V>)) {
        self.table = Table::new();
        self.entries.lists.all_due(&mut self.entries.slab);
        while let Some((_, e)) = self.entries.pop_due() {
            f(e);
        }
    }

    /// Test-only consistency check between table and wheel, and of the slab
    /// invariant.
    #[cfg(test)]
    pub(crate) fn validate(&self) {
        let w = &self.entries;
        let n = w.slab.nodes.len();
        let mut live = vec![false; n];
        let mut count = 0;
        w.lists.validate(&w.slab, |i| {
            assert!(!live[i as usize], "node {i} linked twice");
            live[i as usize] = true;
            count += 1;
        });
        assert_eq!(count, w.len, "len mismatch");
        assert_eq!(self.table.len(), w.len, "table and wheel sizes differ");
        self.table.validate(hash_of(&w.slab));
        let mut free = vec![false; n];
        for &f in &w.free {
            assert!(!live[f as usize], "free stack holds live node {f}");
            assert!(!free[f as usize], "free stack holds {f} twice");
            free[f as usize] = true;
        }
        assert_eq!(w.free.len() + w.len, n, "nodes neither live nor free");
        for index in self.table.iter() {
            assert!(live[index as usize], "table points at vacant {index}");
        }
        for (i, &l) in live.iter().enumerate() {
            let vacant = w.slab.nodes[i].prev.load(Ordering::Relaxed) == VACANT;
            assert_eq!(vacant, !l, "node {i}: marked vacant {vacant}, live {l}");
            // A timer is never later than its entry's effective deadline.
            let timer = w.slab.nodes[i].deadline;
            assert!(
                !l || timer <= w.slab.live_until(i as u32),
                "node {i}: timer at {timer} after its effective deadline"
            );
        }
        if let Some(b) = &w.bound {
            let weights: u64 = (0..n as u32)
                .filter(|&i| live[i as usize])
                .map(|i| b.weight(i))
                .sum();
            assert_eq!(b.used, weights, "bound's usage is not the live weights");
            assert!(b.used <= b.cap, "over the bound: {} > {}", b.used, b.cap);
        }
    }
}

#[cfg(test)]
mod hand {
    #[test]
    fn wrap_is_the_remainder() {
        for n in [1u32, 2, 7, 1024] {
            for hand in (0..=3 * n).chain([u32::MAX - 1, u32::MAX]) {
                assert_eq!(super::wrap(hand, n), hand % n, "{hand} % {n}");
            }
        }
    }
}

#[cfg(all(test, not(expiremap_loom)))]
mod layout {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// What a read touches before the table slot and the node lies on the
    /// two cache lines the shard's slot starts with (see "Layout").
    #[test]
    fn a_reads_headers_share_the_locks_two_lines() {
        type S = Shard<u64, u64>;
        let at = crate::map::ShardSlot::<u64, u64>::shard_offset();
        assert!(at <= 32, "the lock's words take {at} bytes");
        assert_eq!(offset_of!(S, table), 0);
        let (timed, bound) = (offset_of!(S, entries.timed), offset_of!(S, entries.bound));
        let first = offset_of!(S, entries.slab.nodes.first);
        assert!(at + timed < 128 && at + bound < 128, "{timed} {bound}");
        // A read takes the first chunk's pointer, one of a `Vec`'s first
        // two words (the second, with rustc 1.95), not its length.
        assert!(at + first + 16 <= 128, "the first chunk starts at {first}");
        assert!(size_of::<crate::map::ShardSlot<u64, u64>>() <= 512);
    }
}

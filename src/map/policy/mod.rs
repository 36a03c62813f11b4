//! The capacity bound: the map-wide [`Budget`] every shard of a bounded
//! map draws on, and what each shard keeps to choose what goes when the
//! budget is spent: what it holds, the CLOCK hand, and a frequency sketch
//! for admission.
//!
//! # One bound for the map
//!
//! The bound is not split between the shards: every new entry (or weight
//! an overwrite adds) is first *reserved* in the [`Budget`], one atomic
//! counter shared by the shards, and only then stored; an entry that leaves
//! gives its weight back. So what the shards hold never exceeds the bound,
//! and a map of `max_entries(n)` holds `n` entries once `n` distinct keys
//! were put, however they hash. When the budget is spent, a put makes room
//! in its own shard first (under the lock it holds); if its shard has
//! nothing to give, it releases its lock and takes the room from the other
//! shards one lock at a time (`map::write`), never holding two.
//!
//! # The policy
//!
//! * **Expired entries first.** A full shard first evicts what its timer
//!   wheel has due, then any entry the CLOCK hand finds past its deadline.
//! * **CLOCK over the slab** (eviction). Every entry has a 2-bit access
//!   count in its node (see `shard::Node`); a hit raises it with one relaxed
//!   atomic operation on the node the lookup already read, under the read
//!   lock. The hand sweeps the slab's indices in order: an entry with a
//!   count loses one and is passed over, the first with none is the victim.
//!   A freed index is the next one reused, so a new entry lands just behind
//!   the hand and gets a full sweep before it can be chosen.
//! * **TinyLFU admission** (Einziger, Friedman and Manes, "TinyLFU: A Highly
//!   Efficient Cache Admission Policy", 2017; the policy of Caffeine and
//!   moka). A count-min [`Sketch`] of 4-bit counters estimates how often
//!   each key was asked for recently, including keys no longer held. A new
//!   key displaces the CLOCK victim only if its estimate is higher than the
//!   victim's; otherwise the new value is refused. A scan of keys seen once
//!   therefore does not flush the cache, and a loop over more keys than fit
//!   keeps a fixed part of it instead of missing every time. A key never
//!   counted loses to any victim, so while no shard may hold an expired
//!   entry it is refused without the hand looking for one (the hand stays).
//!
//!   The candidate is judged by its estimate *before* the put in hand is
//!   counted. A held key's accesses reach the sketch only when the hand
//!   passes it, and a victim is an entry the hand found unread since its
//!   last pass, so its latest access is not counted yet either. Counting
//!   the candidate's latest access and not the victim's would give every
//!   candidate a point over an equally asked-for victim: right after a
//!   halving, when the counts tie, a cache under a loop would churn through
//!   its held set instead of keeping it (the hit-ratio bench's `loop`
//!   trace: 72.9 % that way with 8 shards, 79.7 % this way, with 1 or 8).
//!
//!   The sketch counts every `put` (a miss, in a cache filled on misses) and
//!   the hits the hand finds on an entry as it passes (at most three a
//!   sweep: the 2-bit count). When it has counted ten times the shard's
//!   share of the bound, every counter is halved, so old popularity fades.
//!
//! # Ground rules
//!
//! Plain `&mut self` code like the shard: the shard runs it under its write
//! lock. Keys are known here only by the 32 hash bits the shard stores with
//! each entry, so the policy never runs user code. Calls nothing of the
//! map's.
//!
//! This file holds the [`Budget`] and each shard's [`Bound`]; `sketch`
//! holds the admission [`Sketch`].

use crate::sync::{Arc, AtomicU64, Ordering};

mod sketch;

pub(crate) use sketch::Sketch;

/// The map-wide bound: what the shards hold against it plus what puts in
/// progress have reserved. Shared by every shard of a bounded map.
#[derive(Debug)]
pub(crate) struct Budget {
    /// The bound (entries, or weight).
    pub(crate) cap: u64,
    /// Held plus reserved; never above `cap`.
    used: AtomicU64,
}

impl Budget {
    pub(crate) fn new(cap: u64) -> Self {
        Self {
            cap,
            used: AtomicU64::new(0),
        }
    }

    /// Reserves `w` if it fits under the bound; `false` (nothing reserved)
    /// otherwise.
    pub(crate) fn try_reserve(&self, w: u64) -> bool {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(w).filter(|&n| n <= self.cap) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Gives back `w` reserved or held.
    pub(crate) fn release(&self, w: u64) {
        let before = self.used.fetch_sub(w, Ordering::AcqRel);
        debug_assert!(before >= w, "released more than was reserved");
    }

    /// Whether `w` more would fit now (a sum past `u64::MAX` does not, so
    /// a bound near it still makes room).
    pub(crate) fn fits(&self, w: u64) -> bool {
        let used = self.used.load(Ordering::Acquire);
        used.checked_add(w).is_some_and(|n| n <= self.cap)
    }

    /// Held plus reserved, now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

/// Entries a new shard's sketch is sized for (24 KiB of counters), at most
/// its share of the bound. It grows, four times at a step, as the shard
/// holds more (see [`Bound::add`]): a bound costs what the map holds, not
/// what it may hold, so `max_entries(u64::MAX)` allocates no more than a
/// small one.
const FIRST_SKETCH: u64 = 4096;

/// A bounded shard's policy state.
#[derive(Debug)]
pub(crate) struct Bound {
    /// The map's budget; `None` once the shard was taken out of the map
    /// (`detach`), whose entries then no longer count against it.
    budget: Option<Arc<Budget>>,
    /// The bound, the budget's `cap`.
    pub(crate) cap: u64,
    /// The shard's expected share of the bound, which sizes its sketch.
    share: u64,
    /// What the shard holds: its entries' weights summed (its entry count
    /// without a weigher).
    pub(crate) used: u64,
    /// Next slab index the CLOCK hand looks at.
    pub(crate) hand: u32,
    /// Hash bits of the last victim the hand stayed on: only a hint, for
    /// the next put to start loading its counters (see
    /// `Shard::start_write`); never read for a decision.
    pub(crate) victim_hint: u32,
    pub(crate) sketch: Sketch,
    /// Each slab index's weight, for weighted maps (vacant indices: 0).
    pub(crate) weights: Option<Vec<u64>>,
    /// Candidates counted at least [`WARM`] times refused since the last
    /// halving.
    warm_refused: u64,
    /// While a put in progress in this shard keeps the room it makes (see
    /// [`Bound::keep_freed`]): the weight its removals freed, still counted
    /// in the budget and held by no entry. `None` whenever the shard's lock
    /// is not held by such a put.
    kept: Option<u64>,
    /// Entries held (`used` counts weight in a weighted shard).
    entries: u64,
    /// The sketch grows once `entries` passes this.
    grow_at: u64,
}

/// A refused candidate counted at least this often was popular recently.
/// When the victims' counters are as high (saturated, say, by keys that
/// were popular before), such keys cannot get in until the counters are
/// halved; after `cap` such refusals the sketch halves early, so a shift in
/// popularity takes effect after about `cap` misses instead of a whole
/// halving period.
const WARM: u64 = 15;

impl Bound {
    /// A shard's policy over `budget`, expecting about `share` of it.
    pub(crate) fn new(budget: Arc<Budget>, share: u64, weighted: bool) -> Self {
        let share = share.clamp(1, budget.cap);
        Self {
            cap: budget.cap,
            budget: Some(budget),
            share,
            used: 0,
            hand: 0,
            victim_hint: 0,
            sketch: Sketch::new(share.min(FIRST_SKETCH)),
            weights: weighted.then(Vec::new),
            warm_refused: 0,
            kept: None,
            entries: 0,
            grow_at: Self::grow_at(share.min(FIRST_SKETCH), share, weighted),
        }
    }

    /// The budget and the share, to make another shard like this one.
    pub(crate) fn config(&self) -> Option<(Arc<Budget>, u64)> {
        self.budget.clone().map(|b| (b, self.share))
    }

    /// Reserves `w` in the map's budget (see [`Budget::try_reserve`]).
    pub(crate) fn try_reserve(&self, w: u64) -> bool {
        self.budget.as_ref().is_some_and(|b| b.try_reserve(w))
    }

    /// Gives back `w` reserved and not used.
    pub(crate) fn release(&self, w: u64) {
        if let Some(b) = &self.budget {
            b.release(w);
        }
    }

    /// Whether `w` more fits in the map's budget now, counting what this
    /// shard's put in progress freed and kept.
    pub(crate) fn fits(&self, w: u64) -> bool {
        let kept = self.kept.unwrap_or(0);
        kept >= w || self.budget.as_ref().is_some_and(|b| b.fits(w - kept))
    }

    /// From now until [`settle_kept`](Self::settle_kept), the weight of
    /// entries leaving this shard stays with it (`kept`) instead of going
    /// back to the map's budget, for the put that is making room here.
    ///
    /// A full map's put usually replaces an entry of its own shard: the
    /// victim's weight passes to the new entry under the shard's lock, and
    /// the budget's counter, one cache line every shard's puts share, is
    /// not written at all. Neither the bound nor the count of what is held
    /// changes meaning: kept weight stays counted in the budget, and it is
    /// given back before the lock is released.
    pub(crate) fn keep_freed(&mut self) {
        debug_assert_eq!(self.kept, None);
        self.kept = Some(0);
    }

    /// Reserves `w` for the put in progress: from what it kept first, then
    /// from the budget. `false` (nothing taken) if the two do not cover it.
    pub(crate) fn take_kept_or_reserve(&mut self, w: u64) -> bool {
        let kept = self.kept.unwrap_or(0);
        let taken = kept >= w
            || self
                .budget
                .as_ref()
                .is_some_and(|b| b.try_reserve(w - kept));
        if taken && self.kept.is_some() {
            self.kept = Some(kept.saturating_sub(w));
        }
        taken
    }

    /// Ends [`keep_freed`](Self::keep_freed): what was kept and not taken
    /// goes back to the budget.
    pub(crate) fn settle_kept(&mut self) {
        if let Some(kept @ 1..) = self.kept.take() {
            self.release(kept);
        }
    }

    /// The shard left the map (`clear`, shutdown): its entries stop
    /// counting against the budget now, all at once, whatever happens to
    /// them later.
    pub(crate) fn detach(&mut self) {
        if let Some(b) = self.budget.take() {
            b.release(self.used + self.kept.take().unwrap_or(0));
        }
    }

    /// TinyLFU: does a new key estimated `candidate` times recently (see
    /// [`Sketch::frequency`]; from its own shard's sketch) displace the
    /// victim with hash bits `victim`?
    pub(crate) fn admits(&mut self, candidate: u64, victim: u32) -> bool {
        let c = candidate;
        // A candidate never counted loses to any victim: no need to look.
        if c > 0 && c > self.sketch.frequency(victim) {
            return true;
        }
        if c >= WARM {
            self.warm_refused += 1;
            if self.warm_refused >= self.sketch.sized_for {
                self.sketch.halve();
                self.warm_refused = 0;
            }
        }
        false
    }

    /// The weight recorded for slab index `index`.
    #[inline]
    pub(crate) fn weight(&self, index: u32) -> u64 {
        self.weights.as_ref().map_or(1, |w| w[index as usize])
    }

    /// Records `weight` for `index`, which now holds an entry. The caller
    /// reserved the weight in the budget.
    pub(crate) fn add(&mut self, index: u32, weight: u64) {
        if let Some(w) = &mut self.weights {
            let i = index as usize;
            if w.len() <= i {
                w.resize(i + 1, 0);
            }
            w[i] = weight;
        }
        self.used += weight;
        self.entries += 1;
        if self.entries > self.grow_at {
            self.grow_sketch();
        }
    }

    /// When a sketch sized for `sized_for` grows: once the shard holds
    /// more than that, except that an unweighted shard's sketch sized for
    /// its share grows only once the shard holds a quarter more (shards
    /// hold about their share each, a little over or under, under one
    /// map-wide bound).
    fn grow_at(sized_for: u64, share: u64, weighted: bool) -> u64 {
        if !weighted && sized_for >= share {
            sized_for.max(share.saturating_add(share / 4))
        } else {
            sized_for
        }
    }

    /// The shard holds more entries than its sketch was sized for: a
    /// sketch four times larger (in an unweighted shard, at most its share
    /// of the bound until it holds more than that, and never more than the
    /// bound). The counts start again from zero, as Caffeine's
    /// `ensureCapacity` does; this happens a logarithmic number of times as
    /// a shard fills.
    #[cold]
    fn grow_sketch(&mut self) {
        let sized = self.sketch.sized_for;
        let weighted = self.weights.is_some();
        let mut want = sized.saturating_mul(4);
        if !weighted {
            let room = if sized < self.share {
                self.share
            } else {
                self.entries.saturating_mul(2)
            };
            want = want.min(room).min(self.cap);
        }
        if want > sized {
            self.sketch = Sketch::new(want);
        }
        self.grow_at = Self::grow_at(self.sketch.sized_for, self.share, weighted);
    }

    /// `index`'s entry left: its weight goes back to the budget.
    pub(crate) fn remove(&mut self, index: u32) {
        let weight = self.weight(index);
        if let Some(w) = &mut self.weights {
            w[index as usize] = 0;
        }
        self.used -= weight;
        self.entries -= 1;
        if let (Some(kept), Some(_)) = (&mut self.kept, &self.budget) {
            *kept += weight;
        } else if let Some(b) = &self.budget {
            b.release(weight);
        }
    }

    /// `index`'s entry now weighs `weight`. A gain was reserved by the
    /// caller; a loss goes back to the budget.
    pub(crate) fn reweigh(&mut self, index: u32, weight: u64) {
        let old = self.weight(index);
        if let Some(w) = &mut self.weights {
            w[index as usize] = weight;
        }
        self.used = self.used - old + weight;
        if let (Some(b), true) = (&self.budget, weight < old) {
            b.release(old - weight);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_tracks_weights() {
        let budget = Arc::new(Budget::new(100));
        let mut b = Bound::new(budget.clone(), 100, true);
        assert!(budget.try_reserve(50));
        b.add(3, 40);
        b.add(0, 10);
        assert_eq!((b.used, b.weight(3), budget.used()), (50, 40, 50));
        b.reweigh(3, 5);
        assert_eq!((b.used, budget.used()), (15, 15));
        b.remove(0);
        assert_eq!((b.used, b.weight(0), budget.used()), (5, 0, 5));
        b.detach();
        assert_eq!(budget.used(), 0, "a detached shard gives all back");
        b.remove(3);
        assert_eq!((b.used, budget.used()), (0, 0), "and nothing twice");
        let budget = Arc::new(Budget::new(100));
        let mut c = Bound::new(budget.clone(), 10, false);
        assert!(budget.try_reserve(1));
        c.add(9, 1);
        assert_eq!((c.used, c.weight(9)), (1, 1));
        c.remove(9);
        assert_eq!((c.used, budget.used()), (0, 0));
    }

    #[test]
    fn budget_reserves_up_to_its_cap() {
        let b = Budget::new(10);
        assert!(b.try_reserve(10));
        assert!(!b.try_reserve(1), "full");
        assert!(!b.fits(1));
        b.release(4);
        assert!(b.fits(4) && !b.fits(5));
        assert!(!b.try_reserve(5));
        assert!(b.try_reserve(4));
        let huge = Budget::new(u64::MAX);
        assert!(huge.try_reserve(u64::MAX - 1));
        assert!(!huge.try_reserve(2), "no overflow past the cap");
        assert!(!huge.fits(2), "a sum past u64::MAX does not fit");
        assert!(huge.fits(1));
        assert!(huge.try_reserve(1));
    }
}

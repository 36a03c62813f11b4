//! What a bounded shard keeps to choose what goes when it is full: its
//! share of the bound, what it holds against it, the CLOCK hand, and a
//! frequency sketch for admission.
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
//!   keeps a fixed part of it instead of missing every time.
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
//! each entry, so the policy never runs user code.

/// A count-min sketch of 4-bit counters, 16 to a word, with depth 4 and
/// conservative increments (only the smallest of a key's counters grow).
#[derive(Debug)]
pub(crate) struct Sketch {
    /// Blocks of 8 words (64 bytes), 16 counters to a word.
    words: Box<[u64]>,
    /// Blocks in `words`.
    blocks: u64,
    /// Increments since the last halving.
    added: u64,
    /// Increments between two halvings.
    period: u64,
    /// The entry count it was sized for.
    sized_for: u64,
}

/// Sketch counters per unit of the bound: 8 (4 bytes per entry), half of
/// Caffeine's 16, to keep a bounded `u64 -> u64` map under 48 bytes an entry.
const COUNTERS_PER_ENTRY: u64 = 12;
/// Smallest sketch, in counters: one block of 8 words.
const MIN_COUNTERS: u64 = 128;
/// Largest sketch, in counters (2 GiB of words).
const MAX_COUNTERS: u64 = 1 << 32;
/// The sketch halves after this many increments per unit of the bound.
const PERIOD_PER_ENTRY: u64 = 80;
/// Entries a new shard's sketch is sized for (24 KiB of counters), at most
/// its share of the bound. It grows, four times at a step, as the shard
/// holds more (see [`Bound::add`]): a bound costs what the map holds, not
/// what it may hold, so `max_entries(u64::MAX)` allocates no more than a
/// small one.
const FIRST_SKETCH: u64 = 4096;

impl Sketch {
    /// A sketch for a shard holding up to `cap` entries.
    pub(crate) fn new(cap: u64) -> Self {
        let cap = cap.max(1);
        let counters = cap
            .saturating_mul(COUNTERS_PER_ENTRY)
            .clamp(MIN_COUNTERS, MAX_COUNTERS);
        let blocks = counters.div_ceil(128);
        Self {
            words: vec![0; (blocks * 8) as usize].into_boxed_slice(),
            blocks,
            added: 0,
            period: cap.saturating_mul(PERIOD_PER_ENTRY).max(MIN_COUNTERS),
            sized_for: cap,
        }
    }

    /// The four counters of hash bits `h`, as Caffeine places them: one
    /// 64-byte block of 8 words per key (one cache line), and in it one
    /// counter in each pair of words, all from one round of a 64-bit mixer
    /// (SplitMix64's finaliser).
    #[inline]
    fn positions(&self, h: u32) -> [u64; 4] {
        let mut z = u64::from(h).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // Counter numbers: block * 128 + word * 16 + nibble; the block is
        // the low half of `z` as a fraction of 2^32, times the block count.
        let block = (((z & 0xFFFF_FFFF) * self.blocks) >> 32) << 7;
        std::array::from_fn(|i| {
            let bits = z >> (32 + 8 * i);
            let word = 2 * i as u64 + (bits & 1);
            block | word << 4 | ((bits >> 1) & 15)
        })
    }

    #[inline]
    fn counter(&self, pos: u64) -> u64 {
        (self.words[(pos >> 4) as usize] >> ((pos & 15) * 4)) & 15
    }

    /// How often `h` was counted recently (0 to 15, an over-estimate).
    pub(crate) fn frequency(&self, h: u32) -> u64 {
        let pos = self.positions(h);
        pos.iter().map(|&p| self.counter(p)).min().unwrap_or(0)
    }

    /// Counts one more access to `h`.
    pub(crate) fn increment(&mut self, h: u32) {
        self.added += 1;
        if self.added >= self.period {
            self.halve();
        }
        let pos = self.positions(h);
        let least = pos.iter().map(|&p| self.counter(p)).min().unwrap_or(0);
        if least < 15 {
            for p in pos {
                if self.counter(p) == least {
                    self.words[(p >> 4) as usize] += 1 << ((p & 15) * 4);
                }
            }
        }
    }

    /// Halves every counter (rounding down) and the increment count.
    pub(crate) fn halve(&mut self) {
        for w in self.words.iter_mut() {
            *w = (*w >> 1) & 0x7777_7777_7777_7777;
        }

        self.added /= 2;
    }

    /// Bytes held.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.words.len() * 8
    }
}

/// A bounded shard's policy state.
#[derive(Debug)]
pub(crate) struct Bound {
    /// This shard's share of the bound (entries, or weight).
    pub(crate) cap: u64,
    /// What the shard holds against `cap`: its entries' weights summed (its
    /// entry count without a weigher).
    pub(crate) used: u64,
    /// Next slab index the CLOCK hand looks at.
    pub(crate) hand: u32,
    pub(crate) sketch: Sketch,
    /// Each slab index's weight, for weighted maps (vacant indices: 0).
    pub(crate) weights: Option<Vec<u32>>,
    /// Candidates counted at least [`WARM`] times refused since the last
    /// halving.
    warm_refused: u64,
    /// Entries held (`used` counts weight in a weighted shard).
    entries: u64,
}

/// A refused candidate counted at least this often was popular recently.
/// When the victims' counters are as high (saturated, say, by keys that
/// were popular before), such keys cannot get in until the counters are
/// halved; after `cap` such refusals the sketch halves early, so a shift in
/// popularity takes effect after about `cap` misses instead of a whole
/// halving period.
const WARM: u64 = 15;

impl Bound {
    pub(crate) fn new(cap: u64, weighted: bool) -> Self {
        Self {
            cap,
            used: 0,
            hand: 0,
            sketch: Sketch::new(cap.min(FIRST_SKETCH)),
            weights: weighted.then(Vec::new),
            warm_refused: 0,
            entries: 0,
        }
    }

    /// TinyLFU: does a new key with hash bits `candidate` displace the
    /// victim with hash bits `victim`?
    pub(crate) fn admits(&mut self, candidate: u32, victim: u32) -> bool {
        let c = self.sketch.frequency(candidate);
        if c > self.sketch.frequency(victim) {
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
        self.weights
            .as_ref()
            .map_or(1, |w| u64::from(w[index as usize]))
    }

    /// Records `weight` for `index`, which now holds an entry.
    pub(crate) fn add(&mut self, index: u32, weight: u32) {
        if let Some(w) = &mut self.weights {
            let i = index as usize;
            if w.len() <= i {
                w.resize(i + 1, 0);
            }
            w[i] = weight;
        }
        self.used += u64::from(weight);
        self.entries += 1;
        if self.entries > self.sketch.sized_for {
            self.grow_sketch();
        }
    }

    /// The shard holds more entries than its sketch was sized for: a
    /// sketch four times larger (at most the shard's share of the bound in
    /// an unweighted shard, whose entries never exceed it). The counts start
    /// again from zero, as Caffeine's `ensureCapacity` does; this happens a
    /// logarithmic number of times as a shard fills.
    #[cold]
    fn grow_sketch(&mut self) {
        let mut want = self.sketch.sized_for.saturating_mul(4);
        if self.weights.is_none() {
            want = want.min(self.cap);
        }
        if want > self.sketch.sized_for {
            self.sketch = Sketch::new(want);
        }
    }

    /// `index`'s entry left.
    pub(crate) fn remove(&mut self, index: u32) {
        let weight = self.weight(index);
        if let Some(w) = &mut self.weights {
            w[index as usize] = 0;
        }
        self.used -= weight;
        self.entries -= 1;
    }

    /// `index`'s entry now weighs `weight`.
    pub(crate) fn reweigh(&mut self, index: u32, weight: u32) {
        let old = self.weight(index);
        if let Some(w) = &mut self.weights {
            w[index as usize] = weight;
        }
        self.used = self.used - old + u64::from(weight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sketch_counts_and_saturates() {
        let mut s = Sketch::new(1_000);
        // 12 counters of 4 bits per entry, in whole 64-byte blocks.
        assert_eq!(s.bytes(), 12_000usize.div_ceil(128) * 64);
        assert_eq!(Sketch::new(1).bytes(), 64, "one block at least");
        for _ in 0..5 {
            s.increment(42);
        }
        assert_eq!(s.frequency(42), 5);
        assert_eq!(s.frequency(43), 0);
        for _ in 0..100 {
            s.increment(7);
        }
        assert_eq!(s.frequency(7), 15, "4-bit counters saturate");
    }

    #[test]
    fn sketch_halves_after_its_period() {
        assert_eq!(Sketch::new(10).period, 10 * PERIOD_PER_ENTRY);
        let mut s = Sketch::new(1_000);
        s.period = 20;
        for _ in 0..12 {
            s.increment(1);
        }
        // 8 more increments of other keys reach the period: halved.
        for k in 0..8 {
            s.increment(1_000 + k);
        }
        assert_eq!(s.frequency(1), 6);
        assert_eq!(s.added, 10);
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "no unsafe code, 30k sketch operations: too slow under Miri"
    )]
    fn sketch_tells_frequent_from_rare_among_many() {
        let mut s = Sketch::new(10_000);
        // 1,000 keys seen 8 times, 10,000 seen once.
        for round in 0..8 {
            for k in 0..1_000u32 {
                s.increment(k.wrapping_mul(2_654_435_761));
            }
            if round == 0 {
                for k in 0..10_000u32 {
                    s.increment((k + 1_000_000).wrapping_mul(2_654_435_761));
                }
            }
        }
        let hot = (0..1_000u32)
            .filter(|k| s.frequency(k.wrapping_mul(2_654_435_761)) >= 8)
            .count();
        let cold = (0..10_000u32)
            .filter(|k| s.frequency((k + 1_000_000).wrapping_mul(2_654_435_761)) >= 8)
            .count();
        assert_eq!(hot, 1_000, "an estimate is never below the count");
        assert!(cold < 100, "{cold} of 10,000 rare keys look frequent");
    }

    #[test]
    fn bound_tracks_weights() {
        let mut b = Bound::new(100, true);
        b.add(3, 40);
        b.add(0, 10);
        assert_eq!((b.used, b.weight(3)), (50, 40));
        b.reweigh(3, 5);
        assert_eq!(b.used, 15);
        b.remove(0);
        assert_eq!((b.used, b.weight(0)), (5, 0));
        let mut c = Bound::new(100, false);
        c.add(9, 1);
        assert_eq!((c.used, c.weight(9)), (1, 1));
        c.remove(9);
        assert_eq!(c.used, 0);
    }
}

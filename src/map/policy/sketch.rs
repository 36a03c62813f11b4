//! The admission sketch of a bounded shard ([`Sketch`]): how often each
//! key was asked for recently, by its 32 hash bits, in 4-bit counters that
//! halve with time (see "The policy" in [`super`]'s docs).

/// A count-min sketch of 4-bit counters, 16 to a word, with depth 4 and
/// conservative increments (only the smallest of a key's counters grow).
#[derive(Debug)]
pub(crate) struct Sketch {
    /// Blocks of 8 words (64 bytes, one cache line), 16 counters to a word.
    /// A key's four counters lie in one block, one in each pair of words
    /// (so in four different words).
    blocks: Box<[Block]>,
    /// Increments since the last halving.
    added: u64,
    /// Increments between two halvings.
    period: u64,
    /// The entry count it was sized for.
    pub(super) sized_for: u64,
}

/// 8 words of counters, aligned to a cache line: a key's four counters
/// then cost one line's miss, not two (the allocator aligns a `[u64; 8]`
/// to 16 bytes at most, so most blocks straddled two lines).
#[derive(Clone, Debug, PartialEq)]
#[repr(align(64))]
struct Block([u64; 8]);

/// Where a key's four counters are: its block, and in it each counter's
/// word (below 8) and bit shift.
type Slots = (usize, [(usize, u32); 4]);

/// Sketch counters per unit of the bound: 8 (4 bytes per entry), half of
/// Caffeine's 16, to keep a bounded `u64 -> u64` map under 48 bytes an entry.
const COUNTERS_PER_ENTRY: u64 = 12;
/// Smallest sketch, in counters: one block of 8 words.
const MIN_COUNTERS: u64 = 128;
/// Largest sketch, in counters (2 GiB of words).
const MAX_COUNTERS: u64 = 1 << 32;
/// The sketch halves after this many increments per unit of the bound.
const PERIOD_PER_ENTRY: u64 = 80;

impl Sketch {
    /// A sketch for a shard holding up to `cap` entries.
    pub(crate) fn new(cap: u64) -> Self {
        let cap = cap.max(1);
        let counters = cap
            .saturating_mul(COUNTERS_PER_ENTRY)
            .clamp(MIN_COUNTERS, MAX_COUNTERS);
        let blocks = counters.div_ceil(128);
        Self {
            blocks: vec![Block([0; 8]); blocks as usize].into_boxed_slice(),
            added: 0,
            period: cap.saturating_mul(PERIOD_PER_ENTRY).max(MIN_COUNTERS),
            sized_for: cap,
        }
    }

    /// The block of hash bits `h`'s counters, and the mix that places
    /// them in it (see [`slots`](Self::slots)).
    #[inline]
    fn block_of(&self, h: u32) -> (usize, u64) {
        let mut z = u64::from(h).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let block = (((z & 0xFFFF_FFFF) * self.blocks.len() as u64) >> 32) as usize;
        (block, z)
    }

    /// Hints the CPU to start loading hash bits `h`'s counters.
    #[inline]
    pub(crate) fn prefetch(&self, h: u32) {
        if let Some(b) = self.blocks.get(self.block_of(h).0) {
            crate::map::store::table::prefetch_line(b);
        }
    }

    /// The four counters of hash bits `h`, as Caffeine places them: one
    /// 64-byte block of 8 words per key (one cache line), and in it one
    /// counter in each pair of words, all from one round of a 64-bit mixer
    /// (SplitMix64's finaliser). The block is the low half of the mix as a
    /// fraction of 2^32, times the block count; each following byte picks a
    /// word of its pair (1 bit) and a nibble in it (4 bits).
    #[inline]
    fn slots(&self, h: u32) -> Slots {
        let (block, z) = self.block_of(h);
        let at = std::array::from_fn(|i| {
            let bits = z >> (32 + 8 * i);
            let word = 2 * i + (bits & 1) as usize;
            (word, ((bits >> 1) & 15) as u32 * 4)
        });
        (block, at)
    }

    /// The values of the counters at `at` in `block`.
    #[inline]
    fn read(block: &[u64; 8], at: &[(usize, u32); 4]) -> [u64; 4] {
        at.map(|(word, shift)| (block[word & 7] >> shift) & 15)
    }

    /// How often `h` was counted recently (0 to 15, an over-estimate).
    pub(crate) fn frequency(&self, h: u32) -> u64 {
        let (block, at) = self.slots(h);
        let c = Self::read(&self.blocks[block].0, &at);
        c[0].min(c[1]).min(c[2]).min(c[3])
    }

    /// Counts one more access to `h`.
    pub(crate) fn increment(&mut self, h: u32) {
        self.frequency_then_increment(h);
    }

    /// [`frequency`](Self::frequency) of `h`, then
    /// [`increment`](Self::increment) of it, with one look at its counters
    /// (a full bounded shard's put of a new key does both).
    ///
    /// The increment that reaches the period halves the sketch between the
    /// two, out of line: this path then calls nothing, so it keeps its
    /// counters' places in registers instead of saving them around a call
    /// (callgrind: 145 instructions a call with the halving inline, 3 calls
    /// a miss on the hit-ratio traces).
    #[inline]
    pub(crate) fn frequency_then_increment(&mut self, h: u32) -> u64 {
        if self.added + 1 >= self.period {
            return self.frequency_then_halve_then_increment(h);
        }
        self.added += 1;
        self.count(h)
    }

    /// [`frequency_then_increment`](Self::frequency_then_increment) by the
    /// increment that reaches the period: the estimate before the halving,
    /// the increment after it.
    #[cold]
    #[inline(never)]
    fn frequency_then_halve_then_increment(&mut self, h: u32) -> u64 {
        let before = self.frequency(h);
        self.added += 1;
        self.halve();
        self.count(h);
        before
    }

    /// Adds one to the least of `h`'s counters (each of them at the least,
    /// none past 15: a conservative update), and returns that least from
    /// before.
    #[inline]
    fn count(&mut self, h: u32) -> u64 {
        let (block, at) = self.slots(h);
        let words = &mut self.blocks[block].0;
        let c = Self::read(words, &at);
        let least = c[0].min(c[1]).min(c[2]).min(c[3]);
        // Without branches: which of the four are least is anybody's
        // guess, and a wrong guess costs more than the adds.
        let grow = u64::from(least < 15);
        // The four counters lie in four different words: `c` stays what
        // each holds while the others grow.
        for (&(word, shift), &v) in at.iter().zip(&c) {
            words[word & 7] += (grow & u64::from(v == least)) << shift;
        }
        least
    }

    /// Halves every counter (rounding down) and the increment count.
    /// Once per period: out of the increments' line.
    #[cold]
    #[inline(never)]
    pub(crate) fn halve(&mut self) {
        for w in self.blocks.iter_mut().flat_map(|b| &mut b.0) {
            *w = (*w >> 1) & 0x7777_7777_7777_7777;
        }
        self.added /= 2;
    }

    /// Bytes held.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.blocks.len() * 64
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
        assert_eq!(s.blocks.as_ptr() as usize % 64, 0, "blocks on cache lines");
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
    #[cfg_attr(
        miri,
        ignore = "no unsafe code, 2,000 sketch operations: 43 s under Miri"
    )]
    fn frequency_then_increment_is_frequency_then_increment() {
        let (mut a, mut b) = (Sketch::new(8), Sketch::new(8));
        assert!(a.period < 1_000, "halves within the loop below");
        for i in 0..2_000u32 {
            // Few keys, some sharing counters, so that counts saturate too.
            let h = (i % 37).wrapping_mul(0x9E37_79B9) ^ (i % 5);
            let seen = a.frequency(h);
            a.increment(h);
            assert_eq!(b.frequency_then_increment(h), seen, "step {i}");
            assert_eq!(a.blocks, b.blocks, "step {i}");
            assert_eq!(a.added, b.added);
        }
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
}

//! Shard-level tests: random operations on one shard with `validate()` (table
//! and wheel agree, every timer tick matches its entry's deadline) after each.
//! By topic: `shard` (the table and wheel, time and eviction), `drops`
//! (every value dropped once), `bound` (the capacity bound), `map` (what
//! a whole map adds). The helpers they share are here.

use super::store::shard::{Door, PutOutcome, Shard};
use std::collections::HashMap;

const P: u64 = 1 << SHIFT;
const SHIFT: u32 = 10;

fn h(k: u64) -> u64 {
    // A poor hash on purpose: many collisions exercise Eq-by-index removal.
    k % 7
}

/// A seeded xorshift generator: `rnd(n)` is below `n`.
fn xorshift(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed;
    move |n| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    }
}

/// Whether the random model tests validate the whole shard after `step`:
/// after every step natively; under Miri, which is there for the slab's
/// `unsafe` code, every 16th (a validation visits every node, list and
/// slot, and took most of those tests' time there).
fn validates(step: u64) -> bool {
    !cfg!(miri) || step % 16 == 0
}

/// `put_bounded`'s answer for the other shards of a shard tested alone:
/// none holds expired entries.
fn alone() -> bool {
    false
}

mod bound;
mod drops;
mod map;
mod shard;

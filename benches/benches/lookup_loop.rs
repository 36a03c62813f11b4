//! Where a uniform `get` goes: plain timed loops (not criterion) over 10^6
//! `u64 -> u64` entries, `ExpireMap` beside `parking_lot::RwLock<HashMap>`
//! with ahash, same keys, same run.
//!
//! ```text
//! cargo bench --bench lookup_loop
//! ```
//!
//! * `independent`: each get's key comes from the generator alone, so the
//!   CPU may overlap the cache misses of consecutive gets (what criterion's
//!   `get hit, uniform` row measures too);
//! * `chained`: each key depends on the previous get's result, so no two
//!   gets overlap: the latency of one lookup, misses in a row.
//! * `insert`: N inserts into a fresh map, as the compare bench's insert row.
//!
//! Ratios only (2-vCPU VM); three rounds, printed as they come.

use expiremap::ExpireMap;
use expiremap_benches::{SplitMix64, mix64};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

const N: u64 = 1_000_000;
const OPS: u64 = 10_000_000;
const TTL: Duration = Duration::from_secs(3_600);

type Plain = RwLock<HashMap<u64, u64, ahash::RandomState>>;

fn per_op(start: Instant, ops: u64) -> f64 {
    start.elapsed().as_nanos() as f64 / ops as f64
}

fn independent(get: impl Fn(u64) -> Option<u64>) -> f64 {
    let mut rng = SplitMix64(11);
    let start = Instant::now();
    for _ in 0..OPS {
        black_box(get(mix64(rng.next_u64() % N)));
    }
    per_op(start, OPS)
}

fn chained(get: impl Fn(u64) -> Option<u64>) -> f64 {
    let mut rng = SplitMix64(11);
    let mut last = 0;
    let start = Instant::now();
    for _ in 0..OPS {
        // `last & 1` is 0 or 1: the key depends on the previous result.
        last = get(mix64((rng.next_u64() ^ (last & 1)) % N)).unwrap_or(0);
    }
    per_op(start, OPS)
}

fn main() {
    // `cargo bench` passes `--bench`; anything else (e.g. a test run) skips.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    for round in 1..=3 {
        let em = ExpireMap::<u64, u64>::new();
        let start = Instant::now();
        for i in 0..N {
            em.put(mix64(i), i, TTL);
        }
        let em_insert = per_op(start, N);
        let plain = Plain::default();
        let start = Instant::now();
        for i in 0..N {
            plain.write().insert(mix64(i), i);
        }
        let plain_insert = per_op(start, N);

        let em_ind = independent(|k| em.get(&k));
        let plain_ind = independent(|k| plain.read().get(&k).copied());
        let em_ch = chained(|k| em.get(&k));
        let plain_ch = chained(|k| plain.read().get(&k).copied());
        println!(
            "round {round}: insert {em_insert:.0} vs {plain_insert:.0} ns ({:.2}x) | \
             get independent {em_ind:.0} vs {plain_ind:.0} ns ({:.2}x) | \
             get chained {em_ch:.0} vs {plain_ch:.0} ns ({:.2}x)",
            em_insert / plain_insert,
            em_ind / plain_ind,
            em_ch / plain_ch,
        );
    }
}

//! Bytes per entry stay within the documented bound at sizes that are
//! unlucky for doubling growth (counting global allocator; one test in this
//! binary, so nothing else allocates while it counts).

use expiremap::ExpireMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[path = "common/counting.rs"]
mod counting;
use counting::{Counting, LIVE};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Bytes allocated by an 8-shard `ExpireMap<u64, u64>` holding `n` entries.
fn bytes_for(n: u64) -> f64 {
    let before = LIVE.load(Ordering::SeqCst);
    let map = ExpireMap::<u64, u64>::builder()
        .shards(8)
        .background_eviction(false)
        .build();
    for k in 0..n {
        map.put(k, k, Duration::from_secs(3_600));
    }
    let bytes = LIVE.load(Ordering::SeqCst) - before;
    drop(map);
    bytes as f64
}

/// The crate docs' formula for `u64 -> u64`: 32-byte nodes and their 4 hash
/// bytes, plus at most one partly used chunk of 4,096 of them per shard, and
/// a table of 4-byte slots at least 1/2 full. The sizes are unlucky for
/// doubling growth:
///
/// * 25,500 entries per shard is just past 3/4 of 2^15 slots, where a
///   doubling table (an earlier layout) was 0.39 full: 10.3 bytes of slots
///   per entry, which fails this bound;
/// * 70,000 per shard is just past 2^16, where a doubling slab (an earlier
///   layout still) held nearly twice what it used.
#[test]
fn bytes_per_entry_stay_within_the_documented_bound() {
    const SHARDS: f64 = 8.0;
    for n in [8 * 25_500, 8 * 70_000] {
        let bytes = bytes_for(n);
        let n = n as f64;
        let nodes = 36.0 * n + SHARDS * 4_096.0 * 36.0;
        let table = 4.0 * n * 2.0;
        let fixed = 64.0 * 1024.0; // lists, locks, the shard array
        let bound = nodes + table + fixed;
        println!(
            "{n} entries: {:.1} bytes/entry (bound {:.1})",
            bytes / n,
            bound / n
        );
        assert!(
            bytes <= bound,
            "{n} entries: {bytes} bytes, above the bound {bound}"
        );
    }
}

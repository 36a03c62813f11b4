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

/// Bytes allocated by an 8-shard `ExpireMap<u64, u64>` after `n` puts of
/// distinct keys, optionally with `max_entries(n)`, and the entries held.
fn bytes_for(n: u64, bounded: bool) -> (f64, f64) {
    let before = LIVE.load(Ordering::SeqCst);
    let mut builder = ExpireMap::<u64, u64>::builder()
        .shards(8)
        .background_eviction(false);
    if bounded {
        builder = builder.max_entries(n);
    }
    let map = builder.build();
    for k in 0..n {
        map.put(k, k, Duration::from_secs(3_600));
    }
    let bytes = LIVE.load(Ordering::SeqCst) - before;
    let held = map.len();
    drop(map);
    (bytes as f64, held as f64)
}

/// The crate docs' formula for `u64 -> u64`: 32-byte nodes and their 4 hash
/// bytes, plus at most one partly used chunk of 1,024 of them per shard, and
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
        let (bytes, _) = bytes_for(n, false);
        let n = n as f64;
        let nodes = 36.0 * n + SHARDS * 1_024.0 * 36.0;
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
    // Bounded: the table sized for the bound up front (3/4 full when the
    // map is; a shard's share of up to 2^18 entries), the last slab chunks
    // no larger than needed, and the admission sketch (12 four-bit
    // counters per entry of the bound, grown as the shards fill):
    // under 48 bytes per entry held, everything counted.
    let n = 1_000_000;
    let (bytes, held) = bytes_for(n, true);
    println!(
        "bounded: {held} of {n} held, {:.1} bytes/entry",
        bytes / held
    );
    assert!(held >= 0.99 * n as f64, "only {held} of {n} held");
    assert!(bytes / held <= 48.0, "{:.2} bytes per entry", bytes / held);
    huge_bounds_cost_what_the_map_holds();
}

/// A bound of `u64::MAX` (entries or weight) on 8 shards: at most 32 MB
/// allocated after `build` (it was 683 MB resident, the sketch and table
/// sized for each shard's share of the bound), and `clear` makes shards
/// no larger than new ones. Part of the one test of this binary, so that
/// nothing else allocates while it counts.
fn huge_bounds_cost_what_the_map_holds() {
    const LIMIT: isize = 32 << 20;
    for weighted in [false, true] {
        let before = LIVE.load(Ordering::SeqCst);
        let builder = ExpireMap::<u64, u64>::builder()
            .shards(8)
            .background_eviction(false);
        let map = if weighted {
            builder.max_weight(u64::MAX).weigher(|_, _| 1).build()
        } else {
            builder.max_entries(u64::MAX).build()
        };
        let built = LIVE.load(Ordering::SeqCst) - before;
        println!("bound u64::MAX (weighted: {weighted}): {built} bytes after build");
        assert!(built <= LIMIT, "{built} bytes after build");
        for k in 0..10_000 {
            map.put(k, k, Duration::from_secs(3_600));
        }
        map.clear();
        let cleared = LIVE.load(Ordering::SeqCst) - before;
        assert!(cleared <= 2 * LIMIT, "{cleared} bytes after clear");
        drop(map);
    }
}

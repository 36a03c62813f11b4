//! How long a `get` can wait on a shard lock while the eviction thread
//! works: 10^6 entries with TTLs spread over 1 s, put into a slab scrambled
//! by earlier removals (as in a long-running map), and one thread timing
//! gets of random keys until the map is empty.
//!
//! ```text
//! cargo run --release --example pauses [-- --entries 1000000 --spread-ms 1000]
//! ```
//!
//! Prints the get latency percentiles and how many gets took over 100 µs
//! and 250 µs. On a 2-core machine the reader, the eviction thread and the
//! OS share the cores, so single outliers are scheduling noise; the counts
//! above the thresholds are what a long lock hold shows up in.

use expiremap::ExpireMap;
use std::time::{Duration, Instant};

fn main() {
    let mut entries: u64 = 1_000_000;
    let mut spread_ms: u64 = 1_000;
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let v = pair.get(1).and_then(|v| v.parse().ok());
        match (pair[0].as_str(), v) {
            ("--entries", Some(v)) => entries = v,
            ("--spread-ms", Some(v)) => spread_ms = v,
            _ => {
                eprintln!("usage: pauses [--entries N] [--spread-ms MS]");
                std::process::exit(2);
            }
        }
    }
    let map = ExpireMap::<u64, u64>::new();
    // A long-running map's slab is scrambled: entries come and go, and new
    // ones reuse freed nodes in no particular order. Do the same first, so
    // that the nodes of one timer slot are not neighbours in memory.
    for k in 0..entries {
        map.put(k, k, Duration::from_secs(3_600));
    }
    for k in 0..entries {
        map.remove(&(mix(k) % entries));
    }
    for k in 0..entries {
        map.remove(&k);
    }
    let spread = spread_ms.max(1) * 1_000_000;
    for k in 0..entries {
        // TTLs from 50 ms to 50 ms + spread, in key order scrambled.
        let ttl = 50_000_000 + mix(k) % spread;
        map.put(k, k, Duration::from_nanos(ttl));
    }
    let mut lat: Vec<u32> = Vec::with_capacity(1 << 24);
    let mut x = 0x9E37_79B9_7F4A_7C15_u64;
    let start = Instant::now();
    while !map.is_empty() && start.elapsed() < Duration::from_secs(30) {
        for _ in 0..1_000 {
            x = mix(x);
            let t = Instant::now();
            std::hint::black_box(map.get(&(x % entries)));
            lat.push(t.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32);
        }
    }
    lat.sort_unstable();
    let at = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize];
    let over = |ns: u32| lat.iter().rev().take_while(|&&l| l > ns).count();
    println!(
        "{} gets while {entries} entries expired over {spread_ms} ms: p50 {} ns, p99 {} ns, p99.9 {} ns, p99.99 {} ns, max {} us; over 100 us: {}, over 250 us: {}",
        lat.len(),
        at(0.5),
        at(0.99),
        at(0.999),
        at(0.9999),
        lat.last().copied().unwrap_or(0) / 1_000,
        over(100_000),
        over(250_000),
    );
}

/// SplitMix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

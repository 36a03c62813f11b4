//! Bytes per entry, measured with a counting global allocator.
//!
//! ```text
//! cargo run --release --example memory [-- 1000000]
//! cargo run --release --example memory -- 1000000 bounded   # max_entries(N)
//! ```

use expiremap::ExpireMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[path = "../tests/common/counting.rs"]
mod counting;
use counting::{Counting, LIVE};

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let bounded = std::env::args().nth(2).is_some_and(|a| a == "bounded");
    let before = LIVE.load(Ordering::Relaxed);
    let mut builder = ExpireMap::<u64, u64>::builder().background_eviction(false);
    if bounded {
        builder = builder.max_entries(n);
    }
    let map = builder.build();
    let empty = LIVE.load(Ordering::Relaxed) - before;
    for k in 0..n {
        map.put(k, k, Duration::from_secs(3600));
    }
    let full = LIVE.load(Ordering::Relaxed) - before;
    // A bounded map splits N over its shards, and keys do not split
    // exactly evenly: a few puts into full shards pushed others out.
    let held = map.len() as u64;
    println!(
        "ExpireMap<u64, u64>{}: {held} entries held of {n} put, {} bytes allocated \
         ({} for the empty map): {:.1} bytes/entry",
        if bounded { " with max_entries(N)" } else { "" },
        full,
        empty,
        // A bounded map allocates its table and sketch up front: count them.
        if bounded { full } else { full - empty } as f64 / held as f64
    );
    drop(map);
}

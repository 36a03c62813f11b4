//! Bytes per entry, measured with a counting global allocator.
//!
//! ```text
//! cargo run --release --example memory [-- 1000000]
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
    let before = LIVE.load(Ordering::Relaxed);
    let map = ExpireMap::<u64, u64>::builder()
        .background_eviction(false)
        .build();
    let empty = LIVE.load(Ordering::Relaxed) - before;
    for k in 0..n {
        map.put(k, k, Duration::from_secs(3600));
    }
    let full = LIVE.load(Ordering::Relaxed) - before;
    println!(
        "ExpireMap<u64, u64>: {n} entries, {} bytes allocated ({} for the empty map): {:.1} bytes/entry",
        full,
        empty,
        (full - empty) as f64 / n as f64
    );
    drop(map);
}

//! Bytes per entry, measured with a counting global allocator.
//!
//! ```text
//! cargo run --release --example memory [-- 1000000]
//! ```

use expiremap::ExpireMap;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; it only
// counts the bytes requested and released.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

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

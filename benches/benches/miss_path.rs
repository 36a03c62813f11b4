//! The parts of a bounded cache's request, one at a time, against
//! quick_cache on the same keys in one run: a hit, a miss's `get`, and a
//! miss's store of a key the policy refuses or admits.
//!
//! ```text
//! cargo bench -p expiremap-benches --bench miss_path
//! MISS_PATH_OPS=20000 MISS_PATH_ONLY="expiremap (no TTL)" valgrind --tool=callgrind \
//!     --toggle-collect='*Ours*put*' target/release/deps/miss_path-*   # instructions
//! ```
//!
//! Each cache (capacity 10,000) is filled, then each part is timed over
//! 10^6 operations, 9 times, the contenders alternating; the table shows
//! the best and the median ns per operation. `hit`: keys held;
//! `get miss`: keys never stored; `put new`: keys never seen before (a
//! TinyLFU refuses them at once; quick_cache admits every one to its
//! probation queue).

use expiremap::ExpireMap;
use expiremap_benches::mix64;
use std::hint::black_box;
use std::time::{Duration, Instant};

const CAP: u64 = 10_000;
const TTL: Duration = Duration::from_secs(3600);

trait Cache {
    fn get(&self, k: u64) -> bool;
    fn put(&self, k: u64);
}

struct Ours(ExpireMap<u64, u64>, bool);
impl Cache for Ours {
    #[inline(never)]
    fn get(&self, k: u64) -> bool {
        self.0.get(&k).is_some()
    }
    #[inline(never)]
    fn put(&self, k: u64) {
        if self.1 {
            self.0.put(k, k, TTL);
        } else {
            self.0.insert(k, k);
        }
    }
}

struct Quick(quick_cache::sync::Cache<u64, u64>);
impl Cache for Quick {
    #[inline(never)]
    fn get(&self, k: u64) -> bool {
        self.0.get(&k).is_some()
    }
    #[inline(never)]
    fn put(&self, k: u64) {
        self.0.insert(k, k);
    }
}

struct QuickDeadline(quick_cache::sync::Cache<u64, (u64, Instant)>);
impl Cache for QuickDeadline {
    #[inline(never)]
    fn get(&self, k: u64) -> bool {
        self.0.get(&k).is_some_and(|(_, d)| Instant::now() <= d)
    }
    #[inline(never)]
    fn put(&self, k: u64) {
        self.0.insert(k, (k, Instant::now() + TTL));
    }
}

/// One part of a request: `(cache, i, base)` makes operation `i` of a
/// round whose fresh keys start at `base`.
type Part<'a> = dyn Fn(&dyn Cache, u64, u64) + 'a;

fn contenders() -> Vec<(&'static str, Box<dyn Cache>)> {
    let ours = |ttl| Ours(ExpireMap::builder().max_entries(CAP).build(), ttl);
    vec![
        ("expiremap (TTL)", Box::new(ours(true))),
        ("expiremap (no TTL)", Box::new(ours(false))),
        (
            "quick_cache",
            Box::new(Quick(quick_cache::sync::Cache::new(CAP as usize))),
        ),
        (
            "quick_cache+deadline",
            Box::new(QuickDeadline(quick_cache::sync::Cache::new(CAP as usize))),
        ),
    ]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let ops: u64 = std::env::var("MISS_PATH_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let only = std::env::var("MISS_PATH_ONLY").ok();
    let cs: Vec<_> = contenders()
        .into_iter()
        .filter(|(name, _)| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|n| n == *name))
        })
        .collect();
    for (_, c) in &cs {
        for k in 0..CAP {
            c.put(mix64(k));
        }
    }
    // Held keys (hit), keys never stored (miss), and fresh keys to store.
    let held: Vec<u64> = (0..CAP).map(mix64).collect();
    let parts: [(&str, &Part); 3] = [
        ("hit", &|c, i, _| {
            black_box(c.get(held[(i % CAP) as usize]));
        }),
        ("get miss", &|c, i, base| {
            black_box(c.get(mix64(base + i)));
        }),
        ("put new", &|c, i, base| c.put(mix64(base + i))),
    ];
    let rounds = 9;
    println!("| part | cache | best ns/op | median ns/op |");
    println!("| --- | --- | ---: | ---: |");
    let mut fresh = 1u64 << 40;
    for (part, f) in parts {
        let mut times = vec![Vec::new(); cs.len()];
        for r in 0..rounds {
            for j in 0..cs.len() {
                let j = (r + j) % cs.len();
                let c = cs[j].1.as_ref();
                let t0 = Instant::now();
                for i in 0..ops {
                    f(c, i, fresh);
                }
                times[j].push(t0.elapsed().as_nanos() as f64 / ops as f64);
            }
            fresh += ops;
        }
        for (j, (name, _)) in cs.iter().enumerate() {
            let t = &mut times[j];
            t.sort_by(f64::total_cmp);
            println!("| {part} | {name} | {:.1} | {:.1} |", t[0], t[t.len() / 2]);
        }
    }
}

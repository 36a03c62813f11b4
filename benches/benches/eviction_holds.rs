//! How long a put waits while the eviction thread works through a mass
//! expiry: the shard locks its passes hold, seen from the writers.
//!
//! ```text
//! cargo bench --bench eviction_holds
//! HOLDS_ROUNDS=5 HOLDS_WRITERS=2 cargo bench --bench eviction_holds
//! ```
//!
//! Each round builds a map (default shards, the eviction thread running),
//! fills it with 10^6 entries that all expire 1 s after they were put
//! (over the time the fill takes), and has `HOLDS_WRITERS` threads (default 1) put
//! ever-new long-lived keys, timing each put, until the expired entries
//! are gone. The same round with the fill living an hour (no expiry) is
//! the baseline, in the same run. Printed per round: the puts made while
//! entries were expiring, their latency p50 / p99 / p99.9 / max, and the
//! entries evicted by the thread and by writers. The machine (cores, CPU)
//! is printed first.

use expiremap::ExpireMap;
use expiremap_benches::mix64;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const FILL: u64 = 1_000_000;

fn var(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One round: latencies (ns) of every put made while expiring entries were
/// left, and the map's stats.
fn round(expiring: bool, writers: usize, seed: u64) -> (Vec<u64>, expiremap::Stats) {
    let map = ExpireMap::<u64, u64>::builder().record_stats(false).build();
    let ttl = if expiring {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(3600)
    };
    for i in 0..FILL {
        map.put(mix64(i ^ seed), i, ttl);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let map = map.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut lat = Vec::with_capacity(1 << 22);
                let mut k = (w as u64 + 1) << 40;
                while !stop.load(Ordering::Relaxed) {
                    k += 1;
                    let t = Instant::now();
                    black_box(map.put(mix64(k ^ seed), k, Duration::from_secs(3600)));
                    lat.push(t.elapsed().as_nanos() as u64);
                }
                lat
            })
        })
        .collect();
    // Until the filled entries are gone (or, for the baseline, as long as
    // an expiry takes: 1 s).
    let start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(10));
        let s = map.stats();
        let done = if expiring {
            s.evicted >= FILL
        } else {
            start.elapsed() >= Duration::from_secs(1)
        };
        if done || start.elapsed() > Duration::from_secs(30) {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut lat: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    lat.sort_unstable();
    (lat, map.stats())
}

fn at(sorted: &[u64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len() - 1);
    sorted[i] as f64 / 1e3
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rounds = var("HOLDS_ROUNDS", 3);
    let writers = var("HOLDS_WRITERS", 1);
    let (cores, cpu) = expiremap_benches::machine();
    println!("eviction_holds: {cores} cores, {cpu}; {writers} writer(s); put latency in µs");
    println!("| round | fill | puts | p50 | p99 | p99.9 | max | evicted (thread / writers) |");
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in 0..rounds {
        for expiring in [true, false] {
            let (lat, s) = round(expiring, writers, r as u64);
            println!(
                "| {r} | {} | {} | {:.2} | {:.2} | {:.1} | {:.0} | {} / {} |",
                if expiring { "expiring" } else { "1 h" },
                lat.len(),
                at(&lat, 0.5),
                at(&lat, 0.99),
                at(&lat, 0.999),
                *lat.last().unwrap() as f64 / 1e3,
                s.evicted - s.evicted_by_writers,
                s.evicted_by_writers
            );
        }
    }
}

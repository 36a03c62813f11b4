//! Fleet-wide loading, measured: `P` caches (each on its own connection,
//! standing for a process) × `T` threads read one hot key through
//! `get_or_insert_with`, with a 50 ms loader, the key expiring every
//! 300 ms; leases on, then off. Prints the loads per expiry and the
//! callers' wait (p50, p99, max), then what a lease costs a plain miss
//! (`get_or_insert_with` of absent keys, with an instant loader).
//!
//! ```sh
//! redis-server --port 6399 --save '' &
//! cargo run --release -p expiremap-redis --example lease_herd -- redis://127.0.0.1:6399 8 4
//! ```
//! With `--cluster` after the thread count, the URL is a cluster seed.

use expiremap_redis::NearCache;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const LOAD: Duration = Duration::from_millis(50);
const TTL: Duration = Duration::from_millis(300);
const RUN: Duration = Duration::from_secs(4);

fn cache(url: &str, cluster: bool, prefix: &str, leases: bool) -> NearCache<String, u64> {
    let b = if cluster {
        NearCache::cluster_builder([url])
    } else {
        NearCache::builder(url)
    };
    b.prefix(prefix).leases(leases).build().expect("connect")
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn herd(url: &str, cluster: bool, procs: usize, threads: usize, leases: bool) {
    let prefix = format!("herd{}:", u8::from(leases));
    let caches: Vec<Arc<NearCache<String, u64>>> = (0..procs)
        .map(|_| Arc::new(cache(url, cluster, &prefix, leases)))
        .collect();
    caches[0].remove(&"hot".to_string()).unwrap();
    let start = Instant::now();
    let loads = Arc::new(Mutex::new(Vec::<Duration>::new()));
    let waits = Arc::new(Mutex::new(Vec::<Duration>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let generation = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = caches
        .iter()
        .flat_map(|c| (0..threads).map(move |_| Arc::clone(c)))
        .map(|c| {
            let (loads, waits, stop, generation) = (
                Arc::clone(&loads),
                Arc::clone(&waits),
                Arc::clone(&stop),
                Arc::clone(&generation),
            );
            thread::spawn(move || {
                let mut mine = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    c.get_or_insert_with("hot".to_string(), TTL, || {
                        loads.lock().unwrap().push(start.elapsed());
                        thread::sleep(LOAD);
                        generation.fetch_add(1, Ordering::Relaxed)
                    })
                    .expect("get_or_insert_with");
                    mine.push(t0.elapsed());
                    thread::sleep(Duration::from_millis(1));
                }
                waits.lock().unwrap().extend(mine);
            })
        })
        .collect();
    thread::sleep(RUN);
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    // An expiry: a burst of loads less than TTL / 2 after its first.
    let loads = loads.lock().unwrap();
    let mut expiries = 0;
    let mut first = None;
    for &t in loads.iter() {
        if first.is_none_or(|f: Duration| t - f > TTL / 2) {
            expiries += 1;
            first = Some(t);
        }
    }
    let mut waits = waits.lock().unwrap();
    waits.sort();
    let slow: Vec<Duration> = waits.iter().copied().filter(|w| *w >= LOAD / 2).collect();
    println!(
        "leases {:>3}: {procs} processes x {threads} threads: {} loads in {expiries} expiries \
         = {:.2} loads per expiry; wait of all {} calls p50 {:?} p99 {:?} max {:?}; \
         of the {} calls that waited for a load: p50 {:?} p99 {:?}",
        if leases { "on" } else { "off" },
        loads.len(),
        loads.len() as f64 / expiries.max(1) as f64,
        waits.len(),
        pct(&waits, 0.5),
        pct(&waits, 0.99),
        waits.last().unwrap(),
        slow.len(),
        slow.get(slow.len() / 2).copied().unwrap_or_default(),
        if slow.is_empty() {
            Duration::ZERO
        } else {
            pct(&slow, 0.99)
        },
    );
}

fn miss_cost(url: &str, cluster: bool, leases: bool) {
    let c = cache(url, cluster, &format!("miss{}:", u8::from(leases)), leases);
    let n = 2000;
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let k = format!("k{i}");
        c.remove(&k).unwrap();
        let t0 = Instant::now();
        c.get_or_insert_with(k, Duration::from_secs(60), || 1)
            .unwrap();
        times.push(t0.elapsed());
    }
    times.sort();
    println!(
        "miss, leases {:>3}: get_or_insert_with of an absent key (3 round trips): \
         p50 {:?} p99 {:?} over {n}",
        if leases { "on" } else { "off" },
        pct(&times, 0.5),
        pct(&times, 0.99)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .cloned()
        .unwrap_or("redis://127.0.0.1:6379".into());
    let procs = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(8);
    let threads = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(4);
    let cluster = args.iter().any(|a| a == "--cluster");
    for leases in [true, false] {
        herd(&url, cluster, procs, threads, leases);
    }
    for leases in [true, false, true, false] {
        miss_cost(&url, cluster, leases);
    }
}

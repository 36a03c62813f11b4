//! A service loop over a hot set, read through `get_with` with a slow
//! loader, with and without refresh ahead: the latency of a read across
//! expiries, and the loads each key's expiry costs. Plain timed loops on
//! the real clock (not criterion), three modes in one run on the same
//! inputs:
//!
//! * `no refresh`: the key expires and every reader of it waits for the
//!   reload (once per key: single flight);
//! * `refresh, in the caller`: `refresh_after(0.8 × TTL)`; the one call
//!   that finds the old value runs the reload, the others get the value;
//! * `refresh, spawned`: the same with `refresh_spawner` (a thread per
//!   reload), so no read runs a load at all.
//!
//! Besides percentiles it counts the reads that took at least half the
//! loader's time: those that waited for a load (or were descheduled).
//!
//! ```text
//! cargo bench --bench refresh_ahead
//! REFRESH_SECS=3 REFRESH_THREADS=2 REFRESH_KEYS=32 cargo bench --bench refresh_ahead
//! ```

use expiremap::ExpireMap;
use expiremap_benches::SplitMix64;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_millis(300);
const LOAD: Duration = Duration::from_millis(10);

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    NoRefresh,
    InCaller,
    Spawned,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::NoRefresh => "no refresh",
            Mode::InCaller => "refresh, in the caller",
            Mode::Spawned => "refresh, spawned",
        }
    }
}

fn build(mode: Mode) -> ExpireMap<u64, u64> {
    let b = ExpireMap::builder().time_to_live(TTL);
    match mode {
        Mode::NoRefresh => b.build(),
        Mode::InCaller => b.refresh_after(TTL * 4 / 5).build(),
        Mode::Spawned => b
            .refresh_after(TTL * 4 / 5)
            .refresh_spawner(|reload| {
                thread::spawn(move || {
                    use std::task::{Context, Poll, Waker};
                    let mut reload = reload;
                    let mut cx = Context::from_waker(Waker::noop());
                    while reload.as_mut().poll(&mut cx) == Poll::Pending {
                        thread::yield_now();
                    }
                });
            })
            .build(),
    }
}

/// Runs `threads` readers over `keys` hot keys for `secs`; returns every
/// read's latency (ns, sorted) and the loads made.
fn run(mode: Mode, threads: u64, keys: u64, secs: u64) -> (Vec<u64>, u64) {
    let map = build(mode);
    let loads = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Warm: every key loaded once, before the clock starts.
    for k in 0..keys {
        map.get_with(k, move || k);
    }
    let readers: Vec<_> = (0..threads)
        .map(|t| {
            let (map, loads, stop) = (map.clone(), loads.clone(), stop.clone());
            thread::spawn(move || {
                let mut rng = SplitMix64(t + 1);
                let mut lat = Vec::with_capacity(1 << 20);
                while !stop.load(Ordering::Relaxed) {
                    let k = rng.next_u64() % keys;
                    let l = loads.clone();
                    let t0 = Instant::now();
                    std::hint::black_box(map.get_with(k, move || {
                        thread::sleep(LOAD);
                        l.fetch_add(1, Ordering::Relaxed);
                        k
                    }));
                    lat.push(t0.elapsed().as_nanos() as u64);
                }
                lat
            })
        })
        .collect();
    thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    let mut all: Vec<u64> = readers
        .into_iter()
        .flat_map(|r| r.join().unwrap())
        .collect();
    all.sort_unstable();
    // Let spawned reloads finish before the next mode.
    thread::sleep(LOAD * 3);
    (all, loads.load(Ordering::Relaxed))
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn main() {
    // `cargo bench` passes `--bench`; anything else (e.g. a test run) skips.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let secs = env("REFRESH_SECS", 3);
    let threads = env("REFRESH_THREADS", 2);
    let keys = env("REFRESH_KEYS", 32);
    println!(
        "{threads} readers, {keys} hot keys, TTL {TTL:?}, a {LOAD:?} loader, {secs} s per mode"
    );
    println!(
        "{:<24} {:>10} {:>9} {:>9} {:>10} {:>9} {:>8} {:>12} {:>13}",
        "mode",
        "reads",
        "p50 ns",
        "p99 ns",
        "p99.9 ns",
        "max ms",
        "p99/p50",
        "loads/expiry",
        "reads >= 5 ms"
    );
    for mode in [Mode::NoRefresh, Mode::InCaller, Mode::Spawned] {
        let (lat, loads) = run(mode, threads, keys, secs);
        // Each key would expire once a TTL: what one load per expiry is.
        let expiries = keys as f64 * secs as f64 / TTL.as_secs_f64();
        let (p50, p99) = (pct(&lat, 0.5), pct(&lat, 0.99));
        println!(
            "{:<24} {:>10} {:>9} {:>9} {:>10} {:>9.2} {:>8.1} {:>12.2} {:>13}",
            mode.name(),
            lat.len(),
            p50,
            p99,
            pct(&lat, 0.999),
            *lat.last().unwrap() as f64 / 1e6,
            p99 as f64 / p50.max(1) as f64,
            loads as f64 / expiries,
            lat.len() - lat.partition_point(|&ns| ns < LOAD.as_nanos() as u64 / 2),
        );
    }
}

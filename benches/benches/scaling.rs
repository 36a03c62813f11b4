//! How throughput scales with threads (issue 25): four workloads, threads
//! 1, 2, 4, … up to the core count, `ExpireMap` beside the peers in the
//! same run on the same inputs. Total Mops/s over a fixed time per cell.
//!
//! ```text
//! cargo bench --bench scaling
//! SCALING_SECS=2 SCALING_ONLY=churn SCALING_LIBS=expiremap,dashmap cargo bench --bench scaling
//! SCALING_THREADS=1,16 cargo bench --bench scaling   # only these thread counts
//! SCALING_SHARDS=64 cargo bench --bench scaling      # ExpireMap with 64 shards
//! SCALING_BOUND=10000 cargo bench --bench scaling     # `bounded` at 10^4 entries
//! SCALING_EVICTOR_NICE=19 cargo bench --bench scaling # the eviction thread at nice 19
//! ```
//!
//! `SCALING_EVICTOR_NICE=n` renices `ExpireMap`'s eviction thread (found by
//! its name, `expiremap-evictor`, in `/proc/self/task`) to `n` once the map
//! is built and filled: a stand-in for a server whose cores are saturated by
//! request threads, where the thread gets little CPU. After a churn row,
//! `ExpireMap`'s row ends with the entries evicted by writers and by the
//! thread (`Stats::evicted_by_writers`, `Stats::evicted`).
//!
//! Workloads, over 10^6 `u64 -> u64` entries live for an hour:
//!
//! * `get`: reads of keys drawn uniformly;
//! * `zipf`: reads of keys drawn by a Zipf law of exponent 0.99 (hot keys);
//! * `mix`: 90 % reads, 10 % overwrites, keys drawn uniformly;
//! * `churn`: puts of ever-new keys with a 50 ms TTL beside the long-lived
//!   entries; the entries held at the end show whether memory stays
//!   bounded by the TTL;
//! * `bounded`: a full cache of 10^6 entries (`max_entries`, moka's
//!   `max_capacity`, quick_cache's capacity; dashmap has no bound and sits
//!   it out) read cache-aside over 2 × 10^6 keys drawn uniformly: a get,
//!   and on a miss a put, which pushes an entry out (or is refused).
//!
//! Peers, with the deadline check a user writes: moka (`sync::Cache` with
//! `time_to_live(1 h)`, 50 ms for churn), quick_cache and dashmap holding
//! `(value, deadline)` and comparing the deadline with `Instant::now()` on
//! each read (quick_cache bounded at 2 × 10^6; dashmap never removes).
//! Key draws are made before the timed loop (2^20 per thread), so the loop
//! measures the maps. The machine (cores, CPU model) is printed first.

use expiremap::ExpireMap;
use expiremap_benches::{SplitMix64, mix64};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const N: u64 = 1_000_000;
const LONG: Duration = Duration::from_secs(3600);
const CHURN_TTL: Duration = Duration::from_millis(50);
/// Key draws per thread, cycled through by the timed loop.
const DRAWS: usize = 1 << 20;

/// A map under test: reads report a hit, puts take a TTL.
trait Subject: Send + Sync + 'static {
    const NAME: &'static str;
    /// A map for `ttl` (moka's TTL is per map).
    fn build(ttl: Duration) -> Self;
    /// A map bounded to `cap` entries, if the library has a bound.
    fn bounded(cap: u64) -> Option<Self>
    where
        Self: Sized;
    fn get(&self, k: u64) -> bool;
    fn put(&self, k: u64, v: u64, ttl: Duration);
    /// Entries held (expired ones a peer never removes included).
    fn held(&self) -> u64;
    /// Anything else worth printing after a churn row.
    fn note(&self) -> String {
        String::new()
    }
}

/// `SCALING_EVICTOR_NICE=n`: renices every thread of this process named
/// `expiremap-evictor` to `n` (with `renice`, which a user may run on
/// their own threads when raising the nice value).
fn renice_evictor() {
    let Ok(nice) = std::env::var("SCALING_EVICTOR_NICE") else {
        return;
    };
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == "expiremap-evictor" {
            let tid = task.file_name().to_string_lossy().into_owned();
            let ok = std::process::Command::new("renice")
                .args(["-n", &nice, "-p", &tid])
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "renice of the eviction thread {tid} failed");
        }
    }
}

struct Em(ExpireMap<u64, u64>);

/// `SCALING_SHARDS=n`: `ExpireMap` with `n` shards instead of the default
/// (see `Builder::shards`).
fn em_shards(b: expiremap::Builder<u64, u64>) -> expiremap::Builder<u64, u64> {
    match std::env::var("SCALING_SHARDS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(n) => b.shards(n),
        None => b,
    }
}

impl Subject for Em {
    const NAME: &'static str = "expiremap";
    fn build(_: Duration) -> Self {
        Em(em_shards(ExpireMap::builder()).build())
    }
    fn bounded(cap: u64) -> Option<Self> {
        Some(Em(em_shards(ExpireMap::builder().max_entries(cap)).build()))
    }
    #[inline]
    fn get(&self, k: u64) -> bool {
        self.0.get(&k).is_some()
    }
    #[inline]
    fn put(&self, k: u64, v: u64, ttl: Duration) {
        self.0.put(k, v, ttl);
    }
    fn held(&self) -> u64 {
        self.0.len() as u64
    }
    fn note(&self) -> String {
        let s = self.0.stats();
        format!(
            " evicted {:.2} M by writers, {:.2} M by the thread |",
            s.evicted_by_writers as f64 / 1e6,
            (s.evicted - s.evicted_by_writers) as f64 / 1e6
        )
    }
}

struct Moka(moka::sync::Cache<u64, u64, ahash::RandomState>);

impl Subject for Moka {
    const NAME: &'static str = "moka";
    fn build(ttl: Duration) -> Self {
        Moka(
            moka::sync::Cache::builder()
                .time_to_live(ttl)
                .build_with_hasher(ahash::RandomState::new()),
        )
    }
    fn bounded(cap: u64) -> Option<Self> {
        Some(Moka(
            moka::sync::Cache::builder()
                .max_capacity(cap)
                .time_to_live(LONG)
                .build_with_hasher(ahash::RandomState::new()),
        ))
    }
    #[inline]
    fn get(&self, k: u64) -> bool {
        self.0.get(&k).is_some()
    }
    #[inline]
    fn put(&self, k: u64, v: u64, _: Duration) {
        self.0.insert(k, v);
    }
    fn held(&self) -> u64 {
        self.0.run_pending_tasks();
        self.0.entry_count()
    }
}

struct Quick(quick_cache::sync::Cache<u64, (u64, Instant)>);

impl Subject for Quick {
    const NAME: &'static str = "quick_cache";
    fn build(_: Duration) -> Self {
        Quick(quick_cache::sync::Cache::new(2 * N as usize))
    }
    fn bounded(cap: u64) -> Option<Self> {
        Some(Quick(quick_cache::sync::Cache::new(cap as usize)))
    }
    #[inline]
    fn get(&self, k: u64) -> bool {
        self.0
            .get(&k)
            .is_some_and(|(_, deadline)| Instant::now() <= deadline)
    }
    #[inline]
    fn put(&self, k: u64, v: u64, ttl: Duration) {
        self.0.insert(k, (v, Instant::now() + ttl));
    }
    fn held(&self) -> u64 {
        self.0.len() as u64
    }
}

struct Dash(dashmap::DashMap<u64, (u64, Instant), ahash::RandomState>);

impl Subject for Dash {
    const NAME: &'static str = "dashmap";
    fn build(_: Duration) -> Self {
        Dash(dashmap::DashMap::with_hasher(ahash::RandomState::new()))
    }
    fn bounded(_: u64) -> Option<Self> {
        None
    }
    #[inline]
    fn get(&self, k: u64) -> bool {
        self.0
            .get(&k)
            .is_some_and(|e| Instant::now() <= e.value().1)
    }
    #[inline]
    fn put(&self, k: u64, v: u64, ttl: Duration) {
        self.0.insert(k, (v, Instant::now() + ttl));
    }
    fn held(&self) -> u64 {
        self.0.len() as u64
    }
}

/// Draws of key numbers in `0..N`: uniform, or Zipf(0.99) by inverting the
/// cumulative weights (precomputed once).
struct Draws {
    cdf: Vec<f64>,
}

impl Draws {
    fn new() -> Self {
        let mut cdf = Vec::with_capacity(N as usize);
        let mut sum = 0.0;
        for i in 1..=N {
            sum += 1.0 / (i as f64).powf(0.99);
            cdf.push(sum);
        }
        cdf.iter_mut().for_each(|c| *c /= sum);
        Self { cdf }
    }

    fn keys(&self, zipf: bool, seed: u64) -> Vec<u64> {
        let mut rng = SplitMix64(seed);
        (0..DRAWS)
            .map(|_| {
                let i = if zipf {
                    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                    self.cdf.partition_point(|&c| c < u) as u64
                } else {
                    rng.next_u64() % N
                };
                mix64(i.min(N - 1))
            })
            .collect()
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Work {
    Get,
    Zipf,
    Mix,
    Churn,
    Bounded,
}

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::Get => "get",
            Work::Zipf => "zipf",
            Work::Mix => "mix",
            Work::Churn => "churn",
            Work::Bounded => "bounded",
        }
    }
}

/// `threads` threads doing `work` on `map` for `secs`: total Mops/s.
fn cell<S: Subject>(
    map: &Arc<S>,
    work: Work,
    threads: usize,
    secs: f64,
    keys: &[Arc<Vec<u64>>],
) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(threads + 1));
    // Churn keys: fresh per thread and per cell, above the long-lived ones.
    static NEXT: AtomicU64 = AtomicU64::new(1 << 40);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (map, stop, ops, start) = (map.clone(), stop.clone(), ops.clone(), start.clone());
            let keys = keys[t % keys.len()].clone();
            std::thread::spawn(move || {
                start.wait();
                let mut n = 0u64;
                let mut i = 0usize;
                let mut fresh = NEXT.fetch_add(1 << 32, Ordering::Relaxed);
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        let k = keys[i & (DRAWS - 1)];
                        i += 1;
                        match work {
                            Work::Get | Work::Zipf => {
                                black_box(map.get(k));
                            }
                            Work::Mix => {
                                if i % 10 == 0 {
                                    map.put(k, i as u64, LONG);
                                } else {
                                    black_box(map.get(k));
                                }
                            }
                            Work::Churn => {
                                map.put(mix64(fresh), fresh, CHURN_TTL);
                                fresh += 1;
                            }
                            Work::Bounded => {
                                // Half the draws name a key outside the
                                // filled set: 2 × 10^6 keys in all.
                                let k = k ^ ((i as u64 & 1) << 63);
                                if !map.get(k) {
                                    map.put(k, i as u64, LONG);
                                }
                            }
                        }
                    }
                    n += 256;
                }
                ops.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    ops.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64() / 1e6
}

/// The `bounded` workload's bound: `SCALING_BOUND`, or [`N`] (every key
/// filled is held; a smaller bound makes nearly every request a miss and
/// a refused or evicting put).
fn bound() -> u64 {
    std::env::var("SCALING_BOUND")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(N)
}

/// One library over every selected workload and thread count; prints one
/// row per workload.
fn run<S: Subject>(works: &[Work], counts: &[usize], secs: f64, keys: &[Vec<Arc<Vec<u64>>>; 2]) {
    for &work in works {
        let ttl = if work == Work::Churn { CHURN_TTL } else { LONG };
        let map = if work == Work::Bounded {
            match S::bounded(bound()) {
                Some(m) => Arc::new(m),
                None => continue,
            }
        } else {
            Arc::new(S::build(ttl))
        };
        for i in 0..N {
            map.put(mix64(i), i, LONG);
        }
        renice_evictor();
        let draws = &keys[usize::from(work == Work::Zipf)];
        let mut row = format!("| {} | {} |", work.name(), S::NAME);
        for &threads in counts {
            let mops = cell(&map, work, threads, secs, draws);
            row += &format!(" {mops:.2} |");
            expiremap_benches::csv_row(
                "scaling.csv",
                "workload,library,threads,mops",
                &format!("{},{},{threads},{mops:.2}", work.name(), S::NAME),
            );
        }
        if matches!(work, Work::Churn | Work::Bounded) {
            row += &format!(" {:.2} M held |", map.held() as f64 / 1e6);
        }
        if work == Work::Churn {
            row += &map.note();
        }
        println!("{row}");
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let var = |name: &str| std::env::var(name).ok();
    let secs: f64 = var("SCALING_SECS")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let only = var("SCALING_ONLY");
    let libs = var("SCALING_LIBS");
    let wanted = |sel: &Option<String>, name: &str| {
        sel.as_ref().is_none_or(|s| s.split(',').any(|x| x == name))
    };
    let works: Vec<Work> = [Work::Get, Work::Zipf, Work::Mix, Work::Churn, Work::Bounded]
        .into_iter()
        .filter(|w| wanted(&only, w.name()))
        .collect();
    let (cores, cpu) = expiremap_benches::machine();
    let mut counts = vec![1];
    while counts[counts.len() - 1] * 2 <= cores {
        counts.push(counts[counts.len() - 1] * 2);
    }
    if counts[counts.len() - 1] != cores {
        counts.push(cores);
    }
    if let Some(only) = var("SCALING_THREADS") {
        let pick: Vec<usize> = only.split(',').filter_map(|t| t.parse().ok()).collect();
        counts.retain(|t| pick.contains(t));
        if counts.is_empty() {
            counts = pick.into_iter().filter(|&t| t > 0).collect();
        }
        counts.sort_unstable();
        counts.dedup();
        assert!(!counts.is_empty(), "SCALING_THREADS names no thread count");
    }
    println!(
        "scaling: {cores} cores, {cpu}; {secs} s per cell; total Mops/s; bounded at {}",
        bound()
    );
    let draws = Draws::new();
    let per_thread = |zipf: bool| -> Vec<Arc<Vec<u64>>> {
        (0..counts[counts.len() - 1])
            .map(|t| Arc::new(draws.keys(zipf, 0x5CA1E + t as u64)))
            .collect()
    };
    let keys = [per_thread(false), per_thread(true)];
    let header: String = counts.iter().map(|t| format!(" {t} |")).collect();
    println!("| workload | library |{header}");
    println!("| --- | --- |{}", " ---: |".repeat(counts.len()));
    if wanted(&libs, Em::NAME) {
        run::<Em>(&works, &counts, secs, &keys);
    }
    if wanted(&libs, Moka::NAME) {
        run::<Moka>(&works, &counts, secs, &keys);
    }
    if wanted(&libs, Quick::NAME) {
        run::<Quick>(&works, &counts, secs, &keys);
    }
    if wanted(&libs, Dash::NAME) {
        run::<Dash>(&works, &counts, secs, &keys);
    }
}

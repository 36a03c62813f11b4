//! Loading (issue 17): the hit path of `get_or_insert_with` beside `get`,
//! and a stampede on one cold key, against moka's `get_with` and
//! quick_cache's `get_or_insert_with`, in one run on the same inputs.
//!
//! ```text
//! cargo bench --bench loading
//! ```
//!
//! * `loading hit` (criterion): 100,000 `u64 -> u64` entries, a batch of
//!   1,000 reads of random held keys per iteration: `get`, and the loading
//!   call on a hit, for each library; `expiremap idle get` is ExpireMap's
//!   `get` in a map with `time_to_idle` (each read records an access).
//! * `stampede` (printed table): 8 threads start together on one cold key
//!   whose `init` takes 1 ms; 50 rounds, a new key each. It reports how many
//!   `init`s ran per round (1 is single-flight) and the median round time.
//!
//! Every library gets `ahash::RandomState` where it takes a hasher
//! (quick_cache keeps its default) and room for every entry.

use criterion::{Criterion, Throughput};
use expiremap::ExpireMap;
use expiremap_benches::{SplitMix64, mix64};
use std::hint::black_box;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

const KEYS: u64 = 100_000;
const BATCH: u64 = 1_000;
const TTL: Duration = Duration::from_secs(3_600);
const THREADS: usize = 8;
const ROUNDS: u64 = 50;

/// A cache under test: a plain read, and the loading call.
trait Loader: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn put(&self, k: u64, v: u64);
    fn get(&self, k: u64) -> Option<u64>;
    fn load(&self, k: u64, init: &dyn Fn() -> u64) -> u64;
}

struct Em(ExpireMap<u64, u64>, &'static str);
impl Loader for Em {
    fn name(&self) -> &'static str {
        self.1
    }
    fn put(&self, k: u64, v: u64) {
        self.0.put(k, v, TTL);
    }
    fn get(&self, k: u64) -> Option<u64> {
        self.0.get(&k)
    }
    fn load(&self, k: u64, init: &dyn Fn() -> u64) -> u64 {
        self.0.get_or_insert_with(k, TTL, init)
    }
}

struct Moka(moka::sync::Cache<u64, u64, ahash::RandomState>);
impl Loader for Moka {
    fn name(&self) -> &'static str {
        "moka"
    }
    fn put(&self, k: u64, v: u64) {
        self.0.insert(k, v);
    }
    fn get(&self, k: u64) -> Option<u64> {
        self.0.get(&k)
    }
    fn load(&self, k: u64, init: &dyn Fn() -> u64) -> u64 {
        self.0.get_with(k, init)
    }
}

struct Quick(quick_cache::sync::Cache<u64, u64>);
impl Loader for Quick {
    fn name(&self) -> &'static str {
        "quick_cache"
    }
    fn put(&self, k: u64, v: u64) {
        self.0.insert(k, v);
    }
    fn get(&self, k: u64) -> Option<u64> {
        self.0.get(&k)
    }
    fn load(&self, k: u64, init: &dyn Fn() -> u64) -> u64 {
        self.0
            .get_or_insert_with(&k, || Ok::<_, ()>(init()))
            .expect("infallible")
    }
}

fn subjects() -> Vec<Arc<dyn Loader>> {
    let room = 4 * KEYS;
    vec![
        Arc::new(Em(ExpireMap::new(), "expiremap")),
        Arc::new(Em(
            ExpireMap::builder().time_to_idle(TTL).build(),
            "expiremap idle",
        )),
        Arc::new(Moka(
            moka::sync::Cache::builder()
                .max_capacity(room)
                .time_to_live(TTL)
                .build_with_hasher(ahash::RandomState::new()),
        )),
        Arc::new(Quick(quick_cache::sync::Cache::new(room as usize))),
    ]
}

fn hits(c: &mut Criterion, subjects: &[Arc<dyn Loader>]) {
    let mut g = c.benchmark_group("loading hit");
    g.throughput(Throughput::Elements(BATCH));
    for s in subjects {
        for i in 0..KEYS {
            s.put(mix64(i), i);
        }
        let mut rng = SplitMix64(7);
        g.bench_function(format!("{} get", s.name()), |b| {
            b.iter(|| {
                for _ in 0..BATCH {
                    black_box(s.get(mix64(rng.next_u64() % KEYS)));
                }
            })
        });
        let mut rng = SplitMix64(7);
        g.bench_function(format!("{} load hit", s.name()), |b| {
            b.iter(|| {
                for _ in 0..BATCH {
                    black_box(s.load(mix64(rng.next_u64() % KEYS), &|| unreachable!()));
                }
            })
        });
    }
    g.finish();
}

/// 8 threads on one cold key per round: inits per round, median round.
fn stampede(s: &Arc<dyn Loader>) -> (f64, u32, Duration) {
    let inits = Arc::new(AtomicU32::new(0));
    let mut most = 0;
    let mut times = Vec::new();
    for round in 0..ROUNDS {
        let key = mix64(KEYS + 1 + round);
        let before = inits.load(Ordering::SeqCst);
        let barrier = Arc::new(Barrier::new(THREADS));
        let start = Instant::now();
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let (s, inits, barrier) = (s.clone(), inits.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    s.load(key, &|| {
                        inits.fetch_add(1, Ordering::SeqCst);
                        thread::sleep(Duration::from_millis(1));
                        round
                    })
                })
            })
            .collect();
        for h in handles {
            assert_eq!(
                h.join().unwrap(),
                round,
                "{}: a caller got another value",
                s.name()
            );
        }
        times.push(start.elapsed());
        most = most.max(inits.load(Ordering::SeqCst) - before);
    }
    times.sort_unstable();
    let mean = f64::from(inits.load(Ordering::SeqCst)) / ROUNDS as f64;
    (mean, most, times[times.len() / 2])
}

fn main() {
    // `cargo bench` passes `--bench`; anything else (e.g. a test run) skips.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let subjects = subjects();
    let mut c = Criterion::default().configure_from_args();
    hits(&mut c, &subjects);
    c.final_summary();
    println!("\nstampede: {THREADS} threads, one cold key, init 1 ms, {ROUNDS} rounds");
    println!("| library | inits per round (mean) | most in a round | median round |");
    println!("| --- | --- | --- | --- |");
    for s in &subjects {
        let (mean, most, median) = stampede(s);
        println!("| {} | {mean:.2} | {most} | {median:?} |", s.name());
    }
}

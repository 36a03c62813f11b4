//! The async service of `examples/async_service.rs`, side by side with
//! moka's `future::Cache::get_with`, on the same inputs in one run: 1,000
//! requests (tokio tasks) arriving over one second, each making 30 lookups
//! over 100 keys 1 ms apart; a miss loads its key with a 10 ms async query,
//! cached for 50 ms. Per library and runtime (multi-thread with 2 workers,
//! and current-thread): queries made, wall time, and the p99 lookup
//! latency, over `ASYNC_RUNS` runs (default 5), each bounded by a timeout so
//! that a deadlock is reported, not waited for.
//!
//! ```text
//! cargo bench --bench async_service
//! ```

use expiremap::ExpireMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const TASKS: u64 = 1_000;
const LOOKUPS: u64 = 30;
const KEYS: u64 = 100;
const TTL: Duration = Duration::from_millis(50);
const QUERY: Duration = Duration::from_millis(10);

type Lookup =
    Arc<dyn Fn(u64, Arc<AtomicU64>) -> Pin<Box<dyn Future<Output = String> + Send>> + Send + Sync>;

async fn query(key: u64, queries: Arc<AtomicU64>) -> String {
    queries.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(QUERY).await;
    format!("row {key}")
}

fn expiremap() -> Lookup {
    let cache: Arc<ExpireMap<u64, String>> = Arc::new(ExpireMap::new());
    Arc::new(move |key, queries| {
        let cache = cache.clone();
        Box::pin(async move {
            cache
                .get_or_insert_with_async(key, TTL, query(key, queries))
                .await
        })
    })
}

fn moka() -> Lookup {
    let cache: moka::future::Cache<u64, String> =
        moka::future::Cache::builder().time_to_live(TTL).build();
    Arc::new(move |key, queries| {
        let cache = cache.clone();
        Box::pin(async move { cache.get_with(key, query(key, queries)).await })
    })
}

/// One run's queries, wall time and p99 lookup latency.
type Outcome = (u64, Duration, Duration);

/// One run, or `None` if it did not finish in 60 s.
fn run(rt: &tokio::runtime::Runtime, lookup: Lookup) -> Option<Outcome> {
    let queries = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let work = {
        let queries = queries.clone();
        async move {
            let tasks: Vec<_> = (0..TASKS)
                .map(|t| {
                    let (lookup, queries) = (lookup.clone(), queries.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(t)).await;
                        let mut waits = Vec::with_capacity(LOOKUPS as usize);
                        for i in 0..LOOKUPS {
                            let key = (t * 7 + i * 13) % KEYS;
                            let asked = Instant::now();
                            let row = lookup(key, queries.clone()).await;
                            assert_eq!(row, format!("row {key}"));
                            waits.push(asked.elapsed());
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        waits
                    })
                })
                .collect();
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.expect("a request panicked"));
            }
            all
        }
    };
    let mut latencies = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), work)
            .await
            .ok()
    })?;
    let wall = start.elapsed();
    latencies.sort_unstable();
    let p99 = latencies[latencies.len() * 99 / 100];
    Some((queries.load(Ordering::Relaxed), wall, p99))
}

fn spread<T: Copy + PartialOrd + std::fmt::Debug>(v: &[T]) -> String {
    let lo = v
        .iter()
        .copied()
        .fold(v[0], |a, b| if b < a { b } else { a });
    let hi = v
        .iter()
        .copied()
        .fold(v[0], |a, b| if b > a { b } else { a });
    format!("{lo:.2?}–{hi:.2?}")
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let runs: usize = std::env::var("ASYNC_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!("async service, {runs} runs each, {cores} cores");
    for flavour in ["multi-thread (2 workers)", "current-thread"] {
        let rt = if flavour.starts_with("multi") {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_time()
                .build()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
        }
        .expect("runtime");
        // Per library: the runs' outcomes, and how many hung.
        let mut rows: Vec<(&str, Vec<Outcome>, usize)> = Vec::new();
        for name in ["expiremap", "moka"] {
            rows.push((name, Vec::new(), 0));
        }
        // Alternate the libraries run by run, so that drift hits both.
        for _ in 0..runs {
            for row in rows.iter_mut() {
                let lookup = if row.0 == "expiremap" {
                    expiremap()
                } else {
                    moka()
                };
                match run(&rt, lookup) {
                    Some(r) => row.1.push(r),
                    None => row.2 += 1,
                }
            }
        }
        println!("{flavour}:");
        println!("| library | queries | wall | p99 lookup | runs that hung |");
        println!("| --- | ---: | ---: | ---: | ---: |");
        for (name, results, hung) in &rows {
            if results.is_empty() {
                println!("| {name} | – | – | – | {hung} |");
                continue;
            }
            let q: Vec<u64> = results.iter().map(|r| r.0).collect();
            let w: Vec<Duration> = results.iter().map(|r| r.1).collect();
            let p: Vec<Duration> = results.iter().map(|r| r.2).collect();
            println!(
                "| {name} | {} | {} | {} | {hung} |",
                spread(&q),
                spread(&w),
                spread(&p)
            );
        }
    }
}

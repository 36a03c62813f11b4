//! A tokio service in front of a slow database, as most async services that
//! cache are: 1,000 requests (tasks) arriving over one second, each making
//! 30 lookups over 100 keys, 1 ms apart; a miss loads the key with a 10 ms
//! async query, cached for 50 ms. One query per key at a time, whatever the
//! number of tasks asking: the others await it without blocking a runtime
//! worker.
//!
//! ```text
//! cargo run --release --example async_service
//! ```

use expiremap::ExpireMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const TASKS: u64 = 1_000;
const LOOKUPS: u64 = 30;
const KEYS: u64 = 100;
const TTL: Duration = Duration::from_millis(50);
const QUERY: Duration = Duration::from_millis(10);

/// The "database": an async query that takes `QUERY` and counts itself.
async fn query(key: u64, queries: &AtomicU64) -> String {
    queries.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(QUERY).await;
    format!("row {key}")
}

fn run(runtime: &tokio::runtime::Runtime, name: &str) {
    let cache: Arc<ExpireMap<u64, String>> = Arc::new(ExpireMap::new());
    let queries = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut latencies: Vec<Duration> = runtime.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let (cache, queries) = (cache.clone(), queries.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(t)).await; // arrives
                    let mut waits = Vec::with_capacity(LOOKUPS as usize);
                    for i in 0..LOOKUPS {
                        let key = (t * 7 + i * 13) % KEYS;
                        let asked = Instant::now();
                        let row = cache
                            .get_or_insert_with_async(key, TTL, query(key, &queries))
                            .await;
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
    });
    let wall = start.elapsed();
    latencies.sort_unstable();
    let p99 = latencies[latencies.len() * 99 / 100];
    let queries = queries.load(Ordering::Relaxed);
    println!(
        "{name}: {} lookups in {wall:.2?}, {queries} queries, p99 lookup {p99:.2?}",
        latencies.len()
    );
    // Every key was loaded, and at most once per TTL window: a key's next
    // query starts only once its value, stored at the end of the last one,
    // has expired (single flight plus the cache), however slow the machine.
    let windows = (wall.as_nanos() / TTL.as_nanos()) as u64 + 1;
    assert!(
        queries >= KEYS && queries <= KEYS * windows,
        "{queries} queries"
    );
}

fn main() {
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("runtime");
    run(&multi, "multi-thread runtime, 2 workers");
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    run(&current, "current-thread runtime");
}

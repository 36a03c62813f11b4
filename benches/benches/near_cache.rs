//! A read of one cached key four ways, in one run, against one
//! `redis-server` the bench starts on a free loopback port (as
//! expiremap-redis's tests do) and stops:
//!
//! * `NearCache::get` with the key's near copy present (no network);
//! * the `redis` crate's own client-side cache (its `cache-aio` feature:
//!   RESP3, `CLIENT TRACKING`, a multiplexed tokio connection with a
//!   `CacheConfig`), a `GET` that its cache answers;
//! * a plain `GET` on a multiplexed tokio connection without the cache
//!   (the same client, one round trip);
//! * a plain `GET` on the `redis` crate's blocking connection (one round
//!   trip; the "plain GET" of expiremap-redis's own `near` bench);
//!
//! and a `NearCache::get` of a key Redis does not have (no near copy: one
//! round trip every time). The same key for every row: the Redis name
//! `b:\x01` that the near cache stores `1u64` under, so every `GET` reads
//! the bytes the near cache wrote (the `GET` rows return them undecoded).
//!
//! ```text
//! cargo bench -p expiremap-benches --bench near_cache
//! ```
//!
//! `NEAR_CACHE_ROUNDS` rounds (3 by default), each measuring every row in
//! turn for `NEAR_CACHE_SECS` seconds (1 by default) after a tenth of that
//! to warm up: ns per read, min–max over the rounds, and the ratios per
//! round. The async rows run on a current-thread tokio runtime, a batch of
//! reads inside one `block_on`. Every read of the client-cache row is
//! checked to be a hit of its cache (its statistics: the only miss is the
//! first read, before the rounds). With `BENCH_CSV_DIR` set, writes
//! `near_cache.csv` (the spread of each row) for `src/bin/charts.rs`.
//! Needs `redis-server` (`REDIS_SERVER` names another binary).

#[path = "../../expiremap-redis/tests/common/mod.rs"]
mod common;

use expiremap_redis::NearCache;
use redis::AsyncConnectionConfig;
use redis::caching::CacheConfig;
use std::hint::black_box;
use std::time::{Duration, Instant};

const HOUR: Duration = Duration::from_secs(3600);

/// `name`'s value in the environment, parsed, or `default`.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A row's reads: runs `n` of them and returns how long they took.
type Reads<'a> = Box<dyn FnMut(u64) -> Duration + 'a>;

/// `n` `GET`s of `name` on the async connection `conn`, one after another
/// (each awaited), timed.
fn async_gets<'a>(
    rt: &'a tokio::runtime::Runtime,
    conn: &'a mut redis::aio::MultiplexedConnection,
    name: &'a [u8],
) -> Reads<'a> {
    Box::new(move |n| {
        rt.block_on(async {
            let t0 = Instant::now();
            for _ in 0..n {
                let v: Option<Vec<u8>> = redis::cmd("GET")
                    .arg(black_box(name))
                    .query_async(&mut *conn)
                    .await
                    .unwrap();
                black_box(v);
            }
            t0.elapsed()
        })
    })
}

/// ns per read of `reads` over `secs` seconds (after a tenth of that to
/// warm up), in batches that double until one takes a millisecond; and
/// the number of reads made, warm-up included.
fn measure(reads: &mut Reads<'_>, secs: f64) -> (f64, u64) {
    let mut made = 0;
    let mut n = 1;
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < secs / 10.0 {
        reads(n);
        made += n;
        n = (n * 2).min(1 << 16);
    }
    let (mut took, mut ops, mut n) = (Duration::ZERO, 0u64, 1u64);
    while took.as_secs_f64() < secs {
        let d = reads(n);
        took += d;
        ops += n;
        if d < Duration::from_millis(1) {
            n *= 2;
        }
    }
    (took.as_nanos() as f64 / ops as f64, made + ops)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let rounds: usize = env_or("NEAR_CACHE_ROUNDS", 3).max(1);
    let secs: f64 = env_or("NEAR_CACHE_SECS", 1.0);
    let s = common::Server::start();
    let near: NearCache<u64, u64> = NearCache::builder(s.url())
        .prefix("b:")
        .build()
        .expect("connect");
    near.put(1, 1, HOUR).unwrap();
    assert_eq!(near.peek_near(&1), Some(1));
    // The same Redis key as the near cache's: prefix, postcard(1u64); its
    // value is postcard(1u64).
    let name: &[u8] = b"b:\x01";
    let want = Some(vec![1u8]);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let resp3 = redis::Client::open(format!("{}/?protocol=resp3", s.url())).unwrap();
    let plain = redis::Client::open(s.url()).unwrap();
    let (mut cached, mut multiplexed) = rt.block_on(async {
        let with_cache = AsyncConnectionConfig::new().set_cache_config(CacheConfig::new());
        let cached = resp3
            .get_multiplexed_async_connection_with_config(&with_cache)
            .await
            .expect("a RESP3 connection with the client-side cache");
        let multiplexed = plain
            .get_multiplexed_async_connection()
            .await
            .expect("a multiplexed connection");
        (cached, multiplexed)
    });
    // The cache's first read: its one miss (a GET and a PTTL), then hits.
    let first: Option<Vec<u8>> = rt
        .block_on(redis::cmd("GET").arg(name).query_async(&mut cached))
        .unwrap();
    assert_eq!(first, want);
    let stats = cached.get_cache_statistics().expect("the cache is on");
    assert_eq!((stats.hit, stats.miss), (0, 1));
    let mut sync = s.raw();

    let rows: Vec<(&str, Reads<'_>)> = vec![
        (
            "near hit (NearCache::get)",
            Box::new(|n| {
                let t0 = Instant::now();
                for _ in 0..n {
                    black_box(near.get(black_box(&1)).unwrap());
                }
                t0.elapsed()
            }),
        ),
        (
            "redis client-side cache hit (cache-aio)",
            async_gets(&rt, &mut cached, name),
        ),
        (
            "plain GET (redis crate async)",
            async_gets(&rt, &mut multiplexed, name),
        ),
        (
            "plain GET (redis crate)",
            Box::new(|n| {
                let t0 = Instant::now();
                for _ in 0..n {
                    let v: Option<Vec<u8>> = redis::cmd("GET")
                        .arg(black_box(name))
                        .query(&mut sync)
                        .unwrap();
                    black_box(v);
                }
                t0.elapsed()
            }),
        ),
        (
            "near miss (one round trip)",
            Box::new(|n| {
                let t0 = Instant::now();
                for _ in 0..n {
                    black_box(near.get(black_box(&2)).unwrap());
                }
                t0.elapsed()
            }),
        ),
    ];
    let mut rows = rows;
    // The labels of the table and of near_cache.csv (no commas).
    let names: Vec<&str> = rows.iter().map(|r| r.0).collect();
    let (cores, cpu) = expiremap_benches::machine();
    println!(
        "one key read four ways ({cores} cores, {cpu}): ns per read, \
         {rounds} rounds of {secs} s a row, rows alternating"
    );
    let mut ns = vec![Vec::new(); rows.len()];
    let mut cache_reads = 0;
    for _ in 0..rounds {
        for (i, (_, reads)) in rows.iter_mut().enumerate() {
            let (t, made) = measure(reads, secs);
            ns[i].push(t);
            if i == 1 {
                cache_reads += made;
            }
        }
    }
    drop(rows);
    // Every read of the client-cache row was answered by its cache.
    let stats = cached.get_cache_statistics().expect("the cache is on");
    assert_eq!(
        (stats.hit as u64, stats.miss),
        (cache_reads, 1),
        "client-side cache statistics"
    );
    assert_eq!(near.get(&1).unwrap(), Some(1));

    let span = |v: &[f64]| {
        let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = v.iter().cloned().fold(0.0, f64::max);
        (lo, hi)
    };
    println!("| row | ns per read (min–max) |");
    println!("| --- | --- |");
    for (i, name) in names.iter().enumerate() {
        let (lo, hi) = span(&ns[i]);
        println!("| {name} | {lo:.1}–{hi:.1} |");
        expiremap_benches::csv_row(
            "near_cache.csv",
            "bench,low_ns,high_ns",
            &format!("{name},{lo:.1},{hi:.1}"),
        );
    }
    // Ratios within each round (both rows measured minutes apart at most).
    let ratio = |a: usize, b: usize| {
        let r: Vec<f64> = (0..rounds).map(|k| ns[a][k] / ns[b][k]).collect();
        let (lo, hi) = span(&r);
        format!("{lo:.1}–{hi:.1}×")
    };
    println!("per round, min–max:");
    println!("  client-side cache hit / near hit: {}", ratio(1, 0));
    println!("  plain GET (blocking) / near hit: {}", ratio(3, 0));
    println!(
        "  plain GET (blocking) / client-side cache hit: {}",
        ratio(3, 1)
    );
    println!(
        "  plain GET (async) / client-side cache hit: {}",
        ratio(2, 1)
    );
}

//! Near hits by threads, beside the core map's `get` in the same run: the
//! near-hit path must scale as the core's does (no shared write on it).
//!
//! `cargo bench -p expiremap-redis --bench near_scaling` starts its own
//! `redis-server` on a free loopback port (as the tests do) and stops it.
//! Each row: 4,096 keys (or one hot key), all near (or in the map), every
//! thread reading them in turn from its own offset for `SECS` seconds; a
//! single server and a three-primary cluster it starts; three rounds,
//! rows alternating; the rate in millions of gets a second (min–max over
//! the rounds) and the 2-thread rate over the 1-thread rate.

#[path = "../tests/common/mod.rs"]
mod common;

use expiremap::ExpireMap;
use expiremap_redis::NearCache;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

const HOUR: Duration = Duration::from_secs(3600);
const KEYS: u64 = 4096;
const SECS: f64 = 1.0;
const ROUNDS: usize = 3;

/// Gets a second with `threads` threads calling `get` over the keys.
fn rate(threads: usize, keys: u64, get: &(dyn Fn(u64) -> bool + Sync)) -> f64 {
    let start = Barrier::new(threads);
    let total: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    let t0 = Instant::now();
                    let mut n = 0u64;
                    let mut k = t as u64 * 1021;
                    while t0.elapsed().as_secs_f64() < SECS {
                        for _ in 0..1024 {
                            k = (k + 1) % keys;
                            assert!(black_box(get(black_box(k))));
                        }
                        n += 1024;
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    total as f64 / SECS
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let s = common::Server::start();
    let near_default: NearCache<u64, u64> = NearCache::builder(s.url())
        .prefix("ns:")
        .build()
        .expect("connect");
    let near_bounded: NearCache<u64, u64> = NearCache::builder(s.url())
        .prefix("nb:")
        .max_entries(100_000)
        .build()
        .expect("connect");
    let cluster = common::cluster::Cluster::start(3);
    let near_cluster: NearCache<u64, u64> = NearCache::cluster_builder(cluster.urls())
        .prefix("nc:")
        .build()
        .expect("connect");
    let core: ExpireMap<u64, u64> = ExpireMap::new();
    for k in 0..KEYS {
        near_default.put(k, k, HOUR).unwrap();
        near_bounded.put(k, k, HOUR).unwrap();
        near_cluster.put(k, k, HOUR).unwrap();
        core.put(k, k, HOUR);
    }
    type Get<'a> = &'a (dyn Fn(u64) -> bool + Sync);
    let rows: [(&str, u64, Get<'_>); 6] = [
        ("NearCache::builder(url) get (defaults)", KEYS, &|k| {
            near_default.get(&k).unwrap().is_some()
        }),
        ("NearCache .max_entries(100_000) get", KEYS, &|k| {
            near_bounded.get(&k).unwrap().is_some()
        }),
        ("NearCache::cluster_builder(3 primaries) get", KEYS, &|k| {
            near_cluster.get(&k).unwrap().is_some()
        }),
        ("ExpireMap::new() get", KEYS, &|k| core.get(&k).is_some()),
        ("NearCache::builder(url) get, one hot key", 1, &|k| {
            near_default.get(&k).unwrap().is_some()
        }),
        ("ExpireMap::new() get, one hot key", 1, &|k| {
            core.get(&k).is_some()
        }),
    ];
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("near hits by threads ({cpus} CPUs), M gets/s, {ROUNDS} rounds, min–max");
    let mut got = vec![[Vec::new(), Vec::new()]; rows.len()];
    for _ in 0..ROUNDS {
        for (i, (_, keys, get)) in rows.iter().enumerate() {
            for (j, t) in [1, 2].into_iter().enumerate() {
                got[i][j].push(rate(t, *keys, *get) / 1e6);
            }
        }
    }
    let span = |v: &[f64]| {
        let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = v.iter().cloned().fold(0.0, f64::max);
        format!("{lo:.2}–{hi:.2}")
    };
    println!("| row | 1 thread | 2 threads | 2 / 1 (per round) |");
    println!("| --- | --- | --- | --- |");
    for (i, (name, _, _)) in rows.iter().enumerate() {
        let ratios: Vec<f64> = (0..ROUNDS).map(|r| got[i][1][r] / got[i][0][r]).collect();
        println!(
            "| {name} | {} | {} | {} |",
            span(&got[i][0]),
            span(&got[i][1]),
            span(&ratios)
        );
    }
}

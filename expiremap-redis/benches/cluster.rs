//! Over a Redis Cluster: a near hit (blocking and async) vs a `GET` sent to
//! the key's primary on loopback, beside a single-server cache's near hit,
//! in one run; and the invalidation delay between two caches for a key on
//! each primary (median, p99).
//!
//! `cargo bench -p expiremap-redis --bench cluster` starts its own
//! three-primary cluster (and one plain server) on free loopback ports, as
//! the tests do, and stops them.

#[path = "../tests/common/mod.rs"]
mod common;

use common::cluster::Cluster;
use criterion::{Criterion, criterion_group, criterion_main};
use expiremap_redis::NearCache;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

const HOUR: Duration = Duration::from_secs(3600);
const PREFIX: &str = "bc:";

fn cache(c: &Cluster) -> NearCache<u64, u64> {
    NearCache::cluster_builder(c.urls())
        .prefix(PREFIX)
        .build()
        .expect("a cluster cache")
}

/// The Redis key of `k` (prefix, postcard of a small u64).
fn name(k: u64) -> Vec<u8> {
    assert!(k < 128);
    let mut n = PREFIX.as_bytes().to_vec();
    n.push(k as u8);
    n
}

/// A key on each primary: `keys[i]` is on node `i`.
fn key_per_node(c: &Cluster) -> Vec<u64> {
    let mut raw = c.nodes[0].raw();
    let mut keys = vec![None; c.nodes.len()];
    for k in 0..128 {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(name(k))
            .query(&mut raw)
            .unwrap();
        let i = c.owner(0, slot);
        keys[i].get_or_insert(k);
    }
    keys.into_iter()
        .map(|k| k.expect("a key per node"))
        .collect()
}

fn get(cr: &mut Criterion) {
    let c = Cluster::start(3);
    let near = cache(&c);
    let keys = key_per_node(&c);
    let k = keys[1];
    near.put(k, 1, HOUR).unwrap();
    assert_eq!(near.peek_near(&k), Some(1));
    let mut raw = c.nodes[1].raw();
    let s = common::Server::start();
    let single: NearCache<u64, u64> = NearCache::builder(s.url()).prefix(PREFIX).build().unwrap();
    single.put(k, 1, HOUR).unwrap();

    let mut g = cr.benchmark_group("cluster_get");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    g.bench_function("near_hit", |b| {
        b.iter(|| black_box(near.get(black_box(&k)).unwrap()))
    });
    g.bench_function("near_hit_async", |b| {
        b.iter(|| {
            let mut f = pin!(near.get_async(black_box(&k)));
            match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(v) => black_box(v.unwrap()),
                Poll::Pending => unreachable!("a near hit is ready at once"),
            }
        })
    });
    g.bench_function("single_server_near_hit", |b| {
        b.iter(|| black_box(single.get(black_box(&k)).unwrap()))
    });
    // A cluster client's GET once routed: sent to the key's primary.
    g.bench_function("redis_get_at_primary", |b| {
        b.iter(|| {
            let v: Option<Vec<u8>> = redis::cmd("GET").arg(name(k)).query(&mut raw).unwrap();
            black_box(v)
        })
    });
    // No near copy: routed, one round trip (the value-and-TTL script).
    let absent = keys[2] + 1000;
    g.bench_function("near_miss", |b| {
        b.iter(|| black_box(near.get(black_box(&absent)).unwrap()))
    });
    g.finish();
}

/// Write `k` in `a`, wait until `b`'s near copy is gone: write start to drop.
fn one_invalidation(a: &NearCache<u64, u64>, b: &NearCache<u64, u64>, k: u64, i: u64) -> Duration {
    assert_eq!(b.get(&k).unwrap(), Some(i));
    assert_eq!(b.peek_near(&k), Some(i));
    let t0 = Instant::now();
    a.put(k, i + 1, HOUR).unwrap();
    let deadline = t0 + common::PATIENCE;
    while b.peek_near(&k) == Some(i) {
        assert!(Instant::now() < deadline, "no invalidation");
        std::thread::yield_now();
    }
    t0.elapsed()
}

fn invalidation(_: &mut Criterion) {
    let c = Cluster::start(3);
    let (a, b) = (cache(&c), cache(&c));
    const N: usize = 1000;
    for (node, k) in key_per_node(&c).into_iter().enumerate() {
        a.put(k, 0, HOUR).unwrap();
        let mut d: Vec<Duration> = (0..N as u64)
            .map(|i| one_invalidation(&a, &b, k, i))
            .collect();
        d.sort();
        let q = |p: f64| d[((d.len() - 1) as f64 * p).round() as usize];
        println!(
            "cluster invalidation delay, key on node {node}, over {N} writes: write start to \
             drop median {:?} p99 {:?} max {:?}",
            q(0.5),
            q(0.99),
            d[N - 1]
        );
    }
}

criterion_group!(benches, get, invalidation);
criterion_main!(benches);

//! Near hit vs a plain Redis `GET` on loopback, in one run, the
//! invalidation delay between two caches (median, p99), and how late
//! `subscribe_expirations` reports a key that expired in Redis.
//!
//! `cargo bench -p expiremap-redis --bench near` starts its own
//! `redis-server` on a free loopback port (as the tests do) and stops it.

#[path = "../tests/common/mod.rs"]
mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use expiremap_redis::NearCache;
use std::hint::black_box;
use std::time::{Duration, Instant};

const HOUR: Duration = Duration::from_secs(3600);

fn cache(s: &common::Server) -> NearCache<u64, u64> {
    NearCache::builder(s.url())
        .prefix("b:")
        .build()
        .expect("connect")
}

fn get(c: &mut Criterion) {
    let s = common::Server::start();
    let near = cache(&s);
    near.put(1, 1, HOUR).unwrap();
    assert_eq!(near.peek_near(&1), Some(1));
    let mut raw = s.raw();
    // The same Redis key as the near cache's: prefix, postcard(1u64).
    let name: &[u8] = b"b:\x01";
    let mut g = c.benchmark_group("get");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    g.bench_function("near_hit", |b| {
        b.iter(|| black_box(near.get(black_box(&1)).unwrap()))
    });
    g.bench_function("redis_get", |b| {
        b.iter(|| {
            let v: Option<Vec<u8>> = redis::cmd("GET").arg(name).query(&mut raw).unwrap();
            black_box(v)
        })
    });
    // What a miss sends (value and PTTL in one read-only script, EVAL_RO on
    // Redis 7), on a plain client: the difference to near_miss is the cost
    // of the cache's connection thread (a hand-off to the reader and back).
    g.bench_function("redis_eval_get_pttl", |b| {
        b.iter(|| {
            let v: redis::Value = redis::cmd("EVAL_RO")
                .arg("return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}")
                .arg(1)
                .arg(b"b:\x02".as_slice())
                .query(&mut raw)
                .unwrap();
            black_box(v)
        })
    });
    // A key Redis does not have: no near copy, one round trip every time
    // (the value-and-TTL script).
    g.bench_function("near_miss", |b| {
        b.iter(|| black_box(near.get(black_box(&2)).unwrap()))
    });
    g.finish();
}

/// Write in `a`, wait until `b`'s near copy is gone. Returns (write start to
/// drop, write reply to drop).
fn one_invalidation(
    a: &NearCache<u64, u64>,
    b: &NearCache<u64, u64>,
    i: u64,
) -> (Duration, Duration) {
    assert_eq!(b.get(&7).unwrap(), Some(i));
    assert_eq!(b.peek_near(&7), Some(i));
    let t0 = Instant::now();
    a.put(7, i + 1, HOUR).unwrap();
    let t1 = Instant::now();
    let deadline = t0 + common::PATIENCE;
    while b.peek_near(&7) == Some(i) {
        assert!(Instant::now() < deadline, "no invalidation");
        std::thread::yield_now();
    }
    let t2 = Instant::now();
    (t2 - t0, t2.saturating_duration_since(t1))
}

fn invalidation(c: &mut Criterion) {
    let s = common::Server::start();
    let (a, b) = (cache(&s), cache(&s));
    a.put(7, 0, HOUR).unwrap();
    let mut i = 0;
    let mut g = c.benchmark_group("invalidation");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    g.bench_function("write_to_drop", |bench| {
        bench.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                total += one_invalidation(&a, &b, i).0;
                i += 1;
            }
            total
        })
    });
    g.finish();

    // The distribution, which criterion does not report.
    const N: usize = 2000;
    let mut full = Vec::with_capacity(N);
    let mut after = Vec::with_capacity(N);
    for _ in 0..N {
        let (f, r) = one_invalidation(&a, &b, i);
        i += 1;
        full.push(f);
        after.push(r);
    }
    full.sort();
    after.sort();
    let q = |v: &[Duration], p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    println!(
        "invalidation delay over {N} writes: write start to drop median {:?} p99 {:?} max {:?}; \
         write reply to drop median {:?} p99 {:?} max {:?}",
        q(&full, 0.5),
        q(&full, 0.99),
        full[N - 1],
        q(&after, 0.5),
        q(&after, 0.99),
        after[N - 1]
    );
}

/// How long after a key's deadline `subscribe_expirations` reports it:
/// keys with deadlines spread over one second, written through the cache,
/// each report's time minus its put's start plus its TTL (Redis set the
/// deadline a little after that start, so this is an upper bound). Nothing
/// touches the keys: Redis finds them by its background sweep.
fn expiration_delay() {
    const N: u64 = 200;
    let s = common::Server::start_with(&["--notify-keyspace-events", "Ex"]);
    let writer = cache(&s);
    let watcher: NearCache<u64, u64> = NearCache::builder(s.url())
        .prefix("b:")
        .redis_expirations(true)
        .build()
        .expect("connect");
    let mut rx = watcher.subscribe_expirations().unwrap();
    let mut deadline = Vec::with_capacity(N as usize);
    for k in 0..N {
        let ttl = Duration::from_millis(10 + 5 * k);
        deadline.push(Instant::now() + ttl);
        writer.put(k, k, ttl).unwrap();
    }
    let mut late = Vec::with_capacity(N as usize);
    while late.len() < N as usize {
        let k = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("every key's expiration is reported");
        late.push(Instant::now().saturating_duration_since(deadline[k as usize]));
    }
    late.sort();
    let q = |p: f64| late[((late.len() - 1) as f64 * p).round() as usize];
    println!(
        "expiration report delay over {N} keys (deadlines over 1 s, no reads): \
         median {:?} p99 {:?} max {:?}",
        q(0.5),
        q(0.99),
        late[late.len() - 1]
    );
}

fn delays(_: &mut Criterion) {
    expiration_delay();
}

criterion_group!(benches, get, invalidation, delays);
criterion_main!(benches);

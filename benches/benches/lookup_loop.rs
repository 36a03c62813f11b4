//! Where a uniform `get` goes: plain timed loops (not criterion) over 10^6
//! `u64 -> u64` entries, `ExpireMap` beside `parking_lot::RwLock<HashMap>`
//! with ahash, same keys, same run.
//!
//! ```text
//! cargo bench --bench lookup_loop
//! ```
//!
//! * `independent`: each get's key comes from the generator alone, so the
//!   CPU may overlap the cache misses of consecutive gets (what criterion's
//!   `get hit, uniform` row measures too);
//! * `chained`: each key depends on the previous get's result, so no two
//!   gets overlap: the latency of one lookup, misses in a row.
//! * `insert`: N inserts into a fresh map, as the compare bench's insert row;
//!   `plain insert + clock` adds one exact clock read per insert, which a
//!   TTL insert cannot do without.
//! * `plain + rdtsc`, `plain + 36 adds` (x86-64): the plain map's
//!   independent get followed by one unfenced TSC read, or by 36
//!   independent register additions. If the two slow the plain map's get
//!   alike, a TSC read costs a loop of lookups its micro-ops (which fill the
//!   out-of-order window, so fewer gets' misses overlap), not a wait for
//!   earlier loads.
//!
//! Ratios only (2-vCPU VM); three rounds, printed as they come. With
//! `LOOKUP_LOOP_GETS` set it only makes that many gets, for callgrind (see
//! [`count_gets`]).

use expiremap::ExpireMap;
use expiremap_benches::{SplitMix64, mix64};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

const N: u64 = 1_000_000;
const OPS: u64 = 10_000_000;
const TTL: Duration = Duration::from_secs(3_600);

type Plain = RwLock<HashMap<u64, u64, ahash::RandomState>>;

fn per_op(start: Instant, ops: u64) -> f64 {
    start.elapsed().as_nanos() as f64 / ops as f64
}

fn independent(get: impl Fn(u64) -> Option<u64>) -> f64 {
    let mut rng = SplitMix64(11);
    let start = Instant::now();
    for _ in 0..OPS {
        black_box(get(mix64(rng.next_u64() % N)));
    }
    per_op(start, OPS)
}

fn chained(get: impl Fn(u64) -> Option<u64>) -> f64 {
    let mut rng = SplitMix64(11);
    let mut last = 0;
    let start = Instant::now();
    for _ in 0..OPS {
        // `last & 1` is 0 or 1: the key depends on the previous result.
        last = get(mix64((rng.next_u64() ^ (last & 1)) % N)).unwrap_or(0);
    }
    per_op(start, OPS)
}

/// One unfenced TSC read.
#[cfg(target_arch = "x86_64")]
fn tsc() -> u64 {
    // SAFETY: `rdtsc` exists on every x86-64 CPU and only reads the counter.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_rdtsc()
    }
}

/// 36 register additions in two independent chains: micro-ops that do
/// nothing but take room in the out-of-order window.
#[cfg(target_arch = "x86_64")]
fn adds() -> u64 {
    let (a, b): (u64, u64);
    // SAFETY: only two registers, chosen by the compiler, are written, and
    // the flags (not declared preserved, so the compiler assumes them
    // clobbered); no memory or stack is touched.
    unsafe {
        std::arch::asm!(
            ".rept 18", "add {a}, 1", "add {b}, 1", ".endr",
            a = inout(reg) 0u64 => a,
            b = inout(reg) 0u64 => b,
            options(nomem, nostack),
        );
    }
    a ^ b
}

/// `LOOKUP_LOOP_GETS=n`: only fill a map of 10^5 entries and make `n`
/// uniform gets, for counting instructions, which repeat exactly where
/// times do not:
///
/// ```text
/// cargo bench --bench lookup_loop --no-run   # prints the binary's path
/// for n in 1000000 2000000; do LOOKUP_LOOP_GETS=$n valgrind --tool=callgrind \
///     --callgrind-out-file=cg.$n target/release/deps/lookup_loop-<hash> --bench; done
/// # instructions per get = (total of cg.2000000 - total of cg.1000000) / 10^6
/// ```
///
/// Other variables switch the operation (see the body and BENCHMARKS.md),
/// `LOOKUP_LOOP_BOUNDED=64` among them: a full bounded map of 64 shards
/// read cache-aside. With it, `LOOKUP_LOOP_QUICK` runs the same requests on
/// quick_cache instead (`get`, `insert` on a miss, same capacity and keys),
/// `LOOKUP_LOOP_LOAD` makes each request one `get_or_insert_with`, and
/// `LOOKUP_LOOP_SUBSCRIBE` adds a subscriber that drains the `Size` events
/// every 256 requests (its `try_recv`s are counted too).
fn count_gets(gets: u64) {
    use std::future::Future;
    const KEYS: u64 = 100_000;
    // LOOKUP_LOOP_IDLE: a map with `time_to_idle`; LOOKUP_LOOP_STATS: one
    // with `record_stats`; LOOKUP_LOOP_LOAD: the gets are
    // `get_or_insert_with` hits.
    let mut builder = ExpireMap::<u64, u64>::builder();
    if std::env::var_os("LOOKUP_LOOP_IDLE").is_some() {
        builder = builder.time_to_idle(TTL);
    }
    if std::env::var_os("LOOKUP_LOOP_STATS").is_some() {
        builder = builder.record_stats(true);
    }
    // LOOKUP_LOOP_METRICS (built with `--features metrics`): a map with a
    // metrics name, which turns `record_stats` on and counts puts (no
    // recorder installed: the thread's publications go nowhere).
    #[cfg(feature = "metrics")]
    if std::env::var_os("LOOKUP_LOOP_METRICS").is_some() {
        builder = builder.metrics("lookup_loop");
    }
    // LOOKUP_LOOP_EXPIRY: a map with an `Expiry` policy (which a get
    // never runs).
    if std::env::var_os("LOOKUP_LOOP_EXPIRY").is_some() {
        builder = builder.expire_after(HourPolicy);
    }
    // LOOKUP_LOOP_BOUNDED=s: a full `max_entries(10^5)` map of `s` shards
    // read cache-aside over 2 x 10^5 keys (a get, and on a miss a put,
    // which pushes an entry out or is refused): the cost of an operation
    // of a full bounded map.
    let bounded: Option<usize> = std::env::var("LOOKUP_LOOP_BOUNDED")
        .ok()
        .and_then(|s| s.parse().ok());
    if let Some(shards) = bounded {
        // Fixed hash seeds (here and for quick_cache): the probes' lengths,
        // and so the counts, repeat from run to run.
        builder = builder
            .max_entries(KEYS)
            .shards(shards)
            .hasher(ahash::RandomState::with_seeds(1, 2, 3, 4));
    }
    if let (Some(_), Some(_)) = (bounded, std::env::var_os("LOOKUP_LOOP_QUICK")) {
        let qc = quick_cache::sync::Cache::<u64, u64, _, _>::with(
            KEYS as usize,
            KEYS,
            quick_cache::UnitWeighter,
            ahash::RandomState::with_seeds(1, 2, 3, 4),
            Default::default(),
        );
        for i in 0..KEYS {
            qc.insert(mix64(i), i);
        }
        let mut rng = SplitMix64(11);
        let mut misses = 0u64;
        for i in 0..gets {
            let k = mix64(rng.next_u64() % (2 * KEYS));
            if qc.get(&k).is_none() {
                misses += 1;
                qc.insert(k, i);
            }
        }
        black_box(&qc);
        eprintln!("misses: {misses}");
        return;
    }
    // LOOKUP_LOOP_CHURN: the operations are puts of ever-new keys with a
    // 50 ms TTL beside the 10^5 long-lived entries, on a `ManualClock`
    // advanced 1 µs per put, with no eviction thread: every 4 ms of that
    // time the loop calls `evict_expired`, the thread's pass. Each put's
    // count includes its share of eviction, whoever does it.
    // LOOKUP_LOOP_CHURN=starved: no passes at all, as if the thread got no
    // CPU: the writers' own eviction is all there is.
    let churn = std::env::var_os("LOOKUP_LOOP_CHURN");
    let starved = churn.as_ref().is_some_and(|v| v == "starved");
    let churn = churn.is_some();
    let clock = expiremap::ManualClock::new();
    if churn {
        builder = builder.clock(clock.clone()).background_eviction(false);
    }
    let em = builder.build();
    let load = std::env::var_os("LOOKUP_LOOP_LOAD").is_some();
    // LOOKUP_LOOP_GET_WITH: the gets are `get_with` hits.
    let get_with = std::env::var_os("LOOKUP_LOOP_GET_WITH").is_some();
    // LOOKUP_LOOP_EXACT: the gets are `get_with_ttl` (the exact clock).
    let exact = std::env::var_os("LOOKUP_LOOP_EXACT").is_some();
    // LOOKUP_LOOP_PUT: the operations are `put`s overwriting held keys (a
    // put's cost without table growth).
    let put = std::env::var_os("LOOKUP_LOOP_PUT").is_some();
    // LOOKUP_LOOP_ASYNC: the gets are `get_or_insert_with_async` hits, each
    // future polled once with a no-op waker (what an executor does).
    let async_hit = std::env::var_os("LOOKUP_LOOP_ASYNC").is_some();
    // LOOKUP_LOOP_NO_TTL: the map's entries never expire (what it holds,
    // and, with LOOKUP_LOOP_BOUNDED, what each miss puts).
    let ttl = match std::env::var_os("LOOKUP_LOOP_NO_TTL") {
        Some(_) => Duration::MAX,
        None => TTL,
    };
    for i in 0..KEYS {
        em.put(mix64(i), i, ttl);
    }
    let mut rng = SplitMix64(11);
    if bounded.is_some() && load {
        for i in 0..gets {
            let k = mix64(rng.next_u64() % (2 * KEYS));
            black_box(em.get_or_insert_with(k, TTL, || i));
        }
        return;
    }
    if bounded.is_some() {
        let mut misses = 0u64;
        let mut sub = std::env::var_os("LOOKUP_LOOP_SUBSCRIBE")
            .map(|_| em.subscribe().expect("a first subscriber"));
        for i in 0..gets {
            if i % 256 == 0 {
                if let Some(sub) = &mut sub {
                    while sub.try_recv().is_ok() {}
                }
            }
            let k = mix64(rng.next_u64() % (2 * KEYS));
            if em.get(&k).is_none() {
                misses += 1;
                black_box(em.put(k, i, ttl));
            }
        }
        eprintln!("misses: {misses}");
        return;
    }
    if load {
        for _ in 0..gets {
            let k = mix64(rng.next_u64() % KEYS);
            black_box(em.get_or_insert_with(k, TTL, || unreachable!()));
        }
        return;
    }
    if get_with {
        for _ in 0..gets {
            let k = mix64(rng.next_u64() % KEYS);
            black_box(em.get_with(k, || unreachable!()));
        }
        return;
    }
    if async_hit {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        for _ in 0..gets {
            let k = mix64(rng.next_u64() % KEYS);
            let f = std::pin::pin!(em.get_or_insert_with_async(k, TTL, async { unreachable!() }));
            let _ = black_box(f.poll(&mut cx));
        }
        return;
    }
    if churn {
        for i in 0..gets {
            black_box(em.put(mix64(KEYS + i), i, Duration::from_millis(50)));
            clock.advance(Duration::from_micros(1));
            if i % 4_000 == 3_999 && !starved {
                black_box(em.evict_expired());
            }
        }
        return;
    }
    if put {
        for i in 0..gets {
            black_box(em.put(mix64(rng.next_u64() % KEYS), i, TTL));
        }
        return;
    }
    if exact {
        for _ in 0..gets {
            black_box(em.get_with_ttl(&mix64(rng.next_u64() % KEYS)));
        }
        return;
    }
    for _ in 0..gets {
        black_box(em.get(&mix64(rng.next_u64() % KEYS)));
    }
}

/// An hour for every entry, as an [`expiremap::Expiry`] policy.
struct HourPolicy;

impl expiremap::Expiry<u64, u64> for HourPolicy {
    fn expire_after_create(&self, _: &u64, _: &u64) -> Option<Duration> {
        Some(TTL)
    }
}

fn main() {
    // `cargo bench` passes `--bench`; anything else (e.g. a test run) skips.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if let Some(gets) = std::env::var("LOOKUP_LOOP_GETS")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        count_gets(gets);
        return;
    }
    for round in 1..=3 {
        let em = ExpireMap::<u64, u64>::new();
        let start = Instant::now();
        for i in 0..N {
            em.put(mix64(i), i, TTL);
        }
        let em_insert = per_op(start, N);
        let plain = Plain::default();
        let start = Instant::now();
        for i in 0..N {
            plain.write().insert(mix64(i), i);
        }
        let plain_insert = per_op(start, N);
        // The same inserts into a fresh plain map, each also reading the
        // exact clock (`Instant::now`, the vDSO), as a TTL insert must.
        let timed = Plain::default();
        let start = Instant::now();
        for i in 0..N {
            // Read under the lock, as `ExpireMap::put` does (cheaper than
            // before it: the read then waits for less).
            let mut map = timed.write();
            black_box(Instant::now());
            map.insert(mix64(i), i);
        }
        let timed_insert = per_op(start, N);
        drop(timed);

        let em_ind = independent(|k| em.get(&k));
        let plain_ind = independent(|k| plain.read().get(&k).copied());
        let em_ch = chained(|k| em.get(&k));
        let plain_ch = chained(|k| plain.read().get(&k).copied());
        drop(em);
        // The same keys held without a TTL: a get then reads no clock.
        let never = ExpireMap::<u64, u64>::new();
        for i in 0..N {
            never.insert(mix64(i), i);
        }
        let never_ind = independent(|k| never.get(&k));
        let never_ch = chained(|k| never.get(&k));
        drop(never);
        #[cfg(target_arch = "x86_64")]
        {
            let with_tsc = independent(|k| plain.read().get(&k).copied().map(|v| v ^ tsc()));
            let with_adds = independent(|k| plain.read().get(&k).copied().map(|v| v ^ adds()));
            println!(
                "round {round}: plain get {plain_ind:.0} ns | plain + rdtsc {with_tsc:.0} ns | \
                 plain + 36 adds {with_adds:.0} ns | plain insert {plain_insert:.0} ns | \
                 plain insert + clock {timed_insert:.0} ns"
            );
        }
        println!(
            "round {round}: insert {em_insert:.0} vs {plain_insert:.0} ns ({:.2}x) | \
             get independent {em_ind:.0} vs {plain_ind:.0} ns ({:.2}x) | \
             get chained {em_ch:.0} vs {plain_ch:.0} ns ({:.2}x)",
            em_insert / plain_insert,
            em_ind / plain_ind,
            em_ch / plain_ch,
        );
        println!(
            "round {round}: no TTL: get independent {never_ind:.0} vs {plain_ind:.0} ns ({:.2}x) | \
             get chained {never_ch:.0} vs {plain_ch:.0} ns ({:.2}x)",
            never_ind / plain_ind,
            never_ch / plain_ch,
        );
    }
}

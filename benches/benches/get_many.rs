//! `get_many` of a batch of random keys against a loop of `get`s over the
//! same keys (issues 37 and 52): `ExpireMap::get_many`, `ExpireMap::get`
//! (with the default shard count, and with 8 shards), moka's `get`
//! (`sync::Cache`, `time_to_live`) and quick_cache's `get` (`sync::Cache`),
//! over 10^6 `u64 -> u64` entries, in one run.
//!
//! ```text
//! nice cargo bench -p expiremap-benches --bench get_many
//! ```
//!
//! Plain timed loops, not criterion: each subject reads the same
//! pre-generated batches (64 keys each, uniform over the 10^6 held keys,
//! from seeded SplitMix64) and sums what it finds, so every value is used.
//! The subjects take turns, [`ROUNDS`] rounds of [`BATCHES`] batches each,
//! in a rotating order, so that a slow moment of the machine (2 shared
//! vCPUs) falls on all of them alike; each prints min, median and max ns per
//! key over the rounds, and the ratios of the medians. A second table runs
//! `get_many` against `get` at other batch sizes.
//!
//! Setup, as in the compare bench: keys `mix64(i)`, values `i`, TTL 1 h
//! (nothing expires); ExpireMap with its defaults (`ExpireMap::new()`: 128
//! shards on 2 cores, 256 on 16) and with `shards(8)`, where a batch of 64
//! keys meets ~8 keys a shard;
//! moka `max_capacity(N)` with ahash; quick_cache with weight capacity 2N
//! (its shards each get capacity/shards, so it needs the slack to hold all
//! N; the bench checks that every subject holds all N).
//!
//! `GET_MANY_NO_SIZES=1` skips the second table. With `GET_MANY_ONLY=n` it
//! only fills an ExpireMap of 10^5 entries and reads `n` batches of 64 with
//! `get_many` (`GET_MANY_GETS=1`: with 64 `get`s; `GET_MANY_SHARDS=8`: in
//! a map of 8 shards), for counting instructions with callgrind (see
//! BENCHMARKS.md).

use expiremap::ExpireMap;
use expiremap_benches::{SplitMix64, mix64};
use std::hint::black_box;
use std::time::{Duration, Instant};

const N: u64 = 1_000_000;
const BATCH: usize = 64;
/// Batches per subject per round: 1.28 M keys, ~0.1-0.3 s.
const BATCHES: usize = 20_000;
/// Distinct batches, cycled through: 8 MB of keys.
const POOL: usize = 16_384;
const ROUNDS: usize = 9;
const TTL: Duration = Duration::from_secs(3_600);

type Moka = moka::sync::Cache<u64, u64, ahash::RandomState>;
type Quick = quick_cache::sync::Cache<u64, u64>;
/// A subject: its name, and a read of one batch that sums what it found.
type Subject<'a> = (&'a str, &'a dyn Fn(&[u64]) -> u64);

/// `POOL` batches of `size` random held keys.
fn batches(size: usize, seed: u64) -> Vec<Vec<u64>> {
    let mut rng = SplitMix64(seed);
    (0..POOL)
        .map(|_| (0..size).map(|_| mix64(rng.next_u64() % N)).collect())
        .collect()
}

/// ns per key of `read` over `BATCHES` batches from `pool`.
fn time(pool: &[Vec<u64>], read: &impl Fn(&[u64]) -> u64) -> f64 {
    let keys = (BATCHES * pool[0].len()) as f64;
    let mut sum = 0;
    let start = Instant::now();
    for b in pool.iter().cycle().take(BATCHES) {
        sum += read(b);
    }
    let ns = start.elapsed().as_nanos() as f64;
    black_box(sum);
    ns / keys
}

/// Runs the subjects in turns for `ROUNDS` rounds; returns each one's
/// times (ns per key), in the order given.
fn rounds(pool: &[Vec<u64>], subjects: &[Subject<'_>]) -> Vec<Vec<f64>> {
    let mut times = vec![Vec::new(); subjects.len()];
    // One warm-up pass each, not counted.
    for (_, read) in subjects {
        time(&pool[..pool.len().min(1024)], read);
    }
    for r in 0..ROUNDS {
        for k in 0..subjects.len() {
            let s = (r + k) % subjects.len();
            times[s].push(time(pool, &subjects[s].1));
        }
    }
    for t in &mut times {
        t.sort_by(f64::total_cmp);
    }
    times
}

fn median(t: &[f64]) -> f64 {
    t[t.len() / 2]
}

fn main() {
    if let Ok(n) = std::env::var("GET_MANY_ONLY") {
        return count_only(n.parse().expect("GET_MANY_ONLY=<batches>"));
    }
    println!("get_many: filling four maps of {N} entries ...");
    let em: ExpireMap<u64, u64> = ExpireMap::new();
    let em8: ExpireMap<u64, u64> = ExpireMap::builder().shards(8).build();
    let moka: Moka = moka::sync::Cache::builder()
        .max_capacity(N)
        .time_to_live(TTL)
        .build_with_hasher(ahash::RandomState::new());
    let quick = Quick::with_weighter(N as usize, 2 * N, quick_cache::UnitWeighter);
    for i in 0..N {
        em.put(mix64(i), i, TTL);
        em8.put(mix64(i), i, TTL);
        moka.insert(mix64(i), i);
        quick.insert(mix64(i), i);
    }
    moka.run_pending_tasks();
    assert_eq!(em.len() as u64, N);
    assert_eq!(em8.len() as u64, N);
    assert_eq!(moka.entry_count(), N);
    assert_eq!(quick.len() as u64, N);

    let get_many = |b: &[u64]| em.get_many(b).into_iter().flatten().sum::<u64>();
    let gets = |b: &[u64]| b.iter().filter_map(|k| em.get(k)).sum::<u64>();
    let get_many8 = |b: &[u64]| em8.get_many(b).into_iter().flatten().sum::<u64>();
    let gets8 = |b: &[u64]| b.iter().filter_map(|k| em8.get(k)).sum::<u64>();
    let moka_gets = |b: &[u64]| b.iter().filter_map(|k| moka.get(k)).sum::<u64>();
    let quick_gets = |b: &[u64]| b.iter().filter_map(|k| quick.get(k)).sum::<u64>();
    let pool = batches(BATCH, 37);
    // Every subject finds every key.
    let want: u64 = pool[0].iter().map(|&k| em.get(&k).unwrap()).sum();
    for read in [
        &get_many as &dyn Fn(&[u64]) -> u64,
        &gets,
        &get_many8,
        &gets8,
        &moka_gets,
        &quick_gets,
    ] {
        assert_eq!(read(&pool[0]), want);
    }
    let subjects: [Subject<'_>; 6] = [
        ("expiremap get_many(64)", &get_many),
        ("expiremap 64 x get", &gets),
        ("expiremap 8 shards get_many(64)", &get_many8),
        ("expiremap 8 shards 64 x get", &gets8),
        ("moka 64 x get", &moka_gets),
        ("quick_cache 64 x get", &quick_gets),
    ];
    let times = rounds(&pool, &subjects);
    let (cores, cpu) = expiremap_benches::machine();
    println!(
        "\n## get_many: batches of {BATCH} uniform keys over {N} entries \
         ({ROUNDS} rounds x {BATCHES} batches; {cpu}, {cores} CPUs)\n"
    );
    println!("| subject | ns/key min | median | max | median / get_many's |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let base = median(&times[0]);
    for ((name, _), t) in subjects.iter().zip(&times) {
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.2} |",
            t[0],
            median(t),
            t[t.len() - 1],
            median(t) / base
        );
    }
    // Each map's get_many against its own loop of gets; the least
    // favourable pairing of the rounds is get_many's slowest round against
    // the loop's fastest.
    for (what, many, loop_) in [("default shards", 0, 1), ("8 shards", 2, 3)] {
        let speedup = median(&times[loop_]) / median(&times[many]);
        let worst = times[loop_][0] / times[many][times[many].len() - 1];
        println!(
            "\n{what}: get_many(64) is {speedup:.2}x as fast as 64 gets (median; {worst:.2}x \
             slowest get_many round against fastest get round): target 1.5x {}",
            if speedup >= 1.5 { "MET" } else { "MISSED" }
        );
    }

    if std::env::var_os("GET_MANY_NO_SIZES").is_some() {
        return;
    }
    println!("\n## get_many against a loop of get, by batch size (expiremap, same map)\n");
    println!("| keys per batch | get_many ns/key (median) | get ns/key (median) | ratio |");
    println!("| ---: | ---: | ---: | ---: |");
    for size in [1, 4, 16, 64, 256, 1024] {
        let pool = batches(size, 38 + size as u64);
        let pool = &pool[..(POOL * 16 / size).clamp(64, POOL)];
        let subjects: [Subject<'_>; 2] = [("get_many", &get_many), ("get", &gets)];
        let t = rounds(pool, &subjects);
        let (a, b) = (median(&t[0]), median(&t[1]));
        println!("| {size} | {a:.1} | {b:.1} | {:.2} |", b / a);
    }
}

/// `GET_MANY_ONLY=n`: `n` batches of 64 over 10^5 entries, by `get_many`
/// (or, with `GET_MANY_GETS`, 64 `get`s each), for callgrind:
///
/// ```text
/// for n in 10000 20000; do GET_MANY_ONLY=$n valgrind --tool=callgrind \
///     --callgrind-out-file=cg.$n target/release/deps/get_many-<hash>; done
/// # instructions per key = (total of cg.20000 - total of cg.10000) / (10000 * 64)
/// ```
fn count_only(n: usize) {
    const KEYS: u64 = 100_000;
    // `GET_MANY_SHARDS=8`: that many shards instead of the default.
    let em: ExpireMap<u64, u64> = match std::env::var("GET_MANY_SHARDS") {
        Ok(n) => (ExpireMap::builder())
            .shards(n.parse().expect("GET_MANY_SHARDS=<shards>"))
            .build(),
        Err(_) => ExpireMap::new(),
    };
    for i in 0..KEYS {
        em.put(mix64(i), i, TTL);
    }
    let mut rng = SplitMix64(11);
    let mut batch = [0_u64; BATCH];
    let gets = std::env::var_os("GET_MANY_GETS").is_some();
    for _ in 0..n {
        for k in &mut batch {
            *k = mix64(rng.next_u64() % KEYS);
        }
        if gets {
            for k in &batch {
                black_box(em.get(k));
            }
        } else {
            black_box(em.get_many(&batch));
        }
    }
}

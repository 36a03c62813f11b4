//! Hit ratio and request rate of the bounded map against moka and
//! quick_cache, on the same key traces in one run.
//!
//! ```text
//! cargo bench --bench hit_ratio
//! HIT_RATIO_REQUESTS=300000 cargo bench --bench hit_ratio   # a quick look
//! HIT_RATIO_ONLY=expiremap cargo bench --bench hit_ratio     # one cache (for perf)
//! HIT_RATIO_ONLY=expiremap-no-ttl,quick_cache cargo bench --bench hit_ratio
//! HIT_RATIO_ROUNDS=5 cargo bench --bench hit_ratio           # rounds (default 3)
//! HIT_RATIO_TRACE=shift,scan cargo bench --bench hit_ratio   # some traces only
//! ```
//!
//! Each trace is replayed as a cache is used: `get`; on a miss, `put` with
//! a TTL of one hour, so that only the capacity policy decides what is
//! held. One thread, the trace generated before the clock starts; each
//! trace is replayed in `HIT_RATIO_ROUNDS` rounds (3), each into new
//! caches, the contenders taking turns in a rotating order, and each rate
//! is the median over the rounds. Traces,
//! 3 × 10^6 requests each (over 10^6 keys for the Zipf ones):
//!
//! 1. `zipf-0.99`: Zipf exponent 0.99, capacity 1 % of the keys;
//! 2. `zipf-0.8`: exponent 0.8, capacity 5 %;
//! 3. `scan`: trace 1 with a burst of 20,000 never-repeated keys after
//!    every 50,000 requests (scan resistance), capacity 1 %;
//! 4. `loop`: keys `0, 1, ..., 1.25 C - 1` over and over, capacity `C` =
//!    10,000 (LRU and FIFO hit nothing);
//! 5. `shift`: trace 1 whose popular keys change halfway (the second half
//!    draws from another million keys): how fast the policy forgets.
//!
//! Contenders: `expiremap` (`max_entries(C)`, default shards),
//! `expiremap-1` (`shards(1)`: the policy without the split),
//! `expiremap-no-ttl` (default shards, `insert` with no TTL: quick_cache's
//! feature set, as a user switching from it writes it), moka
//! (`max_capacity(C)` and `time_to_live`, TinyLFU), quick_cache
//! (`Cache::new(C)`, no TTL) and `quick_cache+deadline` (the same, each
//! value stored with its deadline and checked against `Instant::now()` on
//! every `get`: expiry as quick_cache's users add it).
//!
//! The summary compares like with like: `expiremap` (a TTL, exact expiry)
//! against `quick_cache+deadline`, and `expiremap-no-ttl` against plain
//! quick_cache (issue 52's targets: at least 1.0x and 0.8x the rate, with
//! hit ratios no more than 1 point under the best peer's).

use expiremap::ExpireMap;
use expiremap_benches::{SplitMix64, mix64};
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(3600);

trait Cache {
    fn name(&self) -> &'static str;
    fn get(&self, k: u64) -> bool;
    fn put(&self, k: u64);
}

/// Ours, each miss stored with `TTL`, or with no expiry (`insert`) if
/// the flag is set.
struct Ours(ExpireMap<u64, u64>, &'static str, bool);
impl Cache for Ours {
    fn name(&self) -> &'static str {
        self.1
    }
    fn get(&self, k: u64) -> bool {
        self.0.get(&k).is_some()
    }
    fn put(&self, k: u64) {
        if self.2 {
            self.0.insert(k, k);
        } else {
            self.0.put(k, k, TTL);
        }
    }
}

struct Moka(moka::sync::Cache<u64, u64, ahash::RandomState>);
impl Cache for Moka {
    fn name(&self) -> &'static str {
        "moka"
    }
    fn get(&self, k: u64) -> bool {
        self.0.get(&k).is_some()
    }
    fn put(&self, k: u64) {
        self.0.insert(k, k);
    }
}

/// quick_cache with expiry added as its users add it: each value stored
/// with its deadline, and a `get` that reads the clock (`Instant::now()`)
/// and takes a value past its deadline for a miss (the miss's `insert`
/// then overwrites it). The same semantics as ours with a TTL.
struct QuickDeadline(quick_cache::sync::Cache<u64, (u64, Instant)>);
impl Cache for QuickDeadline {
    fn name(&self) -> &'static str {
        "quick_cache+deadline"
    }
    fn get(&self, k: u64) -> bool {
        self.0.get(&k).is_some_and(|(_, d)| Instant::now() <= d)
    }
    fn put(&self, k: u64) {
        self.0.insert(k, (k, Instant::now() + TTL));
    }
}

struct Quick(quick_cache::sync::Cache<u64, u64>);
impl Cache for Quick {
    fn name(&self) -> &'static str {
        "quick_cache"
    }
    fn get(&self, k: u64) -> bool {
        self.0.get(&k).is_some()
    }
    fn put(&self, k: u64) {
        self.0.insert(k, k);
    }
}

fn contenders(cap: u64) -> Vec<Box<dyn Cache>> {
    vec![
        Box::new(Ours(
            ExpireMap::builder().max_entries(cap).build(),
            "expiremap",
            false,
        )),
        Box::new(Ours(
            ExpireMap::builder().max_entries(cap).shards(1).build(),
            "expiremap-1",
            false,
        )),
        Box::new(Ours(
            ExpireMap::builder().max_entries(cap).build(),
            "expiremap-no-ttl",
            true,
        )),
        Box::new(Moka(
            moka::sync::Cache::builder()
                .max_capacity(cap)
                .time_to_live(TTL)
                .build_with_hasher(ahash::RandomState::new()),
        )),
        Box::new(Quick(quick_cache::sync::Cache::new(cap as usize))),
        Box::new(QuickDeadline(quick_cache::sync::Cache::new(cap as usize))),
    ]
}

/// Zipf ranks over `n` keys with exponent `s`, by inverting the CDF.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let mut cdf = Vec::with_capacity(n);
        let mut sum = 0.0;
        for r in 1..=n {
            sum += 1.0 / (r as f64).powf(s);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Self { cdf }
    }

    fn sample(&self, rng: &mut SplitMix64) -> u64 {
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        self.cdf.partition_point(|&c| c < u) as u64
    }
}

struct Trace {
    name: &'static str,
    cap: u64,
    keys: Vec<u64>,
}

fn traces(requests: usize) -> Vec<Trace> {
    const KEYS: usize = 1_000_000;
    let mut rng = SplitMix64(0x5EED);
    let z99 = Zipf::new(KEYS, 0.99);
    let z80 = Zipf::new(KEYS, 0.8);
    let zipf = |z: &Zipf, rng: &mut SplitMix64| -> Vec<u64> {
        (0..requests).map(|_| mix64(z.sample(rng))).collect()
    };
    let mut scan = Vec::with_capacity(requests);
    let mut fresh = KEYS as u64;
    while scan.len() < requests {
        for _ in 0..50_000 {
            scan.push(mix64(z99.sample(&mut rng)));
        }
        for _ in 0..20_000 {
            scan.push(mix64(fresh));
            fresh += 1;
        }
    }
    scan.truncate(requests);
    let loop_cap = 10_000u64;
    let looped = (0..requests as u64)
        .map(|i| mix64(i % (loop_cap * 5 / 4)))
        .collect();
    let half = requests / 2;
    let shift = (0..requests)
        .map(|i| {
            let rank = z99.sample(&mut rng);
            mix64(if i < half {
                rank
            } else {
                rank + 2 * KEYS as u64
            })
        })
        .collect();
    vec![
        Trace {
            name: "zipf-0.99",
            cap: (KEYS / 100) as u64,
            keys: zipf(&z99, &mut rng),
        },
        Trace {
            name: "zipf-0.8",
            cap: (KEYS / 20) as u64,
            keys: zipf(&z80, &mut rng),
        },
        Trace {
            name: "scan",
            cap: (KEYS / 100) as u64,
            keys: scan,
        },
        Trace {
            name: "loop",
            cap: loop_cap,
            keys: looped,
        },
        Trace {
            name: "shift",
            cap: (KEYS / 100) as u64,
            keys: shift,
        },
    ]
}

#[inline(never)]
fn replay(c: &dyn Cache, keys: &[u64]) -> (f64, f64) {
    let t0 = Instant::now();
    let mut hits = 0u64;
    for &k in keys {
        if c.get(k) {
            hits += 1;
        } else {
            c.put(k);
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    (
        hits as f64 / keys.len() as f64,
        keys.len() as f64 / secs / 1e6,
    )
}

/// A contender's results on one trace: its name, hit ratio (the last
/// round's; every round replays the same trace into a new cache) and its
/// rate in each round, in M requests/s.
type Row = (&'static str, f64, Vec<f64>);

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` probing the binary
    }
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let requests = env("HIT_RATIO_REQUESTS", 3_000_000);
    let rounds = env("HIT_RATIO_ROUNDS", 3).max(1);
    let only = std::env::var("HIT_RATIO_ONLY").ok();
    let chosen = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|n| n == name))
    };
    println!("| trace | capacity | cache | hit ratio | Mreq/s median | min | max |");
    println!("| --- | ---: | --- | ---: | ---: | ---: | ---: |");
    let mut summary = Vec::new();
    let only_trace = std::env::var("HIT_RATIO_TRACE").ok();
    for t in traces(requests) {
        if only_trace
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|n| n == t.name))
        {
            continue;
        }
        let mut row: Vec<Row> = Vec::new();
        // Each round replays the trace into new caches, the contenders
        // taking turns in a rotating order, so that a slow moment of the
        // machine falls on all of them alike.
        for r in 0..rounds {
            let cs: Vec<Box<dyn Cache>> = (contenders(t.cap).into_iter())
                .filter(|c| chosen(c.name()))
                .collect();
            for k in 0..cs.len() {
                let c = &cs[(r + k) % cs.len()];
                let (hit, rate) = replay(c.as_ref(), &t.keys);
                match row.iter_mut().find(|e| e.0 == c.name()) {
                    Some(e) => {
                        e.1 = hit;
                        e.2.push(rate);
                    }
                    None => row.push((c.name(), hit, vec![rate])),
                }
            }
        }
        // In the contenders' order.
        let order: Vec<&str> = contenders(1).iter().map(|c| c.name()).collect();
        row.sort_by_key(|e| order.iter().position(|&n| n == e.0));
        for (name, hit, rates) in &row {
            let (lo, hi) = (
                rates.iter().copied().reduce(f64::min),
                rates.iter().copied().reduce(f64::max),
            );
            println!(
                "| {} | {} | {name} | {:.2} % | {:.2} | {:.2} | {:.2} |",
                t.name,
                t.cap,
                hit * 100.0,
                median(rates),
                lo.unwrap_or(0.0),
                hi.unwrap_or(0.0),
            );
            expiremap_benches::csv_row(
                "hit_ratio.csv",
                "trace,cache,hit_ratio_pct",
                &format!("{},{},{:.2}", t.name, name, hit * 100.0),
            );
        }
        summary.push((t.name, row));
    }
    println!();
    println!(
        "Rates: the ratio of the medians over {rounds} rounds (in brackets, the least and \
         greatest ratio of one round's rates)\n"
    );
    println!(
        "| trace | expiremap - best peer (points) | vs moka (rate) | vs quick_cache+deadline (rate) | \
         no TTL vs quick_cache (rate) | vs quick_cache (rate) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    // A cell whose contenders were left out (`HIT_RATIO_ONLY`) shows "-".
    let cell = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    for (name, row) in summary {
        let get = |n: &str| row.iter().find(|r| r.0 == n);
        let (ours, no_ttl) = (get("expiremap"), get("expiremap-no-ttl"));
        let (moka, quick) = (get("moka"), get("quick_cache"));
        let deadline = get("quick_cache+deadline");
        // The best peer's hit ratio (the deadline row holds what plain
        // quick_cache holds).
        let best = [moka, quick, deadline]
            .iter()
            .flatten()
            .map(|p| p.1)
            .reduce(f64::max);
        let points = ours
            .zip(best)
            .map(|(o, b)| format!("{:+.2}", (o.1 - b) * 100.0));
        let rate = |a: Option<&Row>, b: Option<&Row>| {
            a.zip(b).map(|(a, b)| {
                let per_round: Vec<f64> = a.2.iter().zip(&b.2).map(|(x, y)| x / y).collect();
                let lo = per_round.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = per_round.iter().copied().fold(0.0, f64::max);
                format!("{:.2}x ({lo:.2}-{hi:.2})", median(&a.2) / median(&b.2))
            })
        };
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            cell(points),
            cell(rate(ours, moka)),
            cell(rate(ours, deadline)),
            cell(rate(no_ttl, quick)),
            cell(rate(ours, quick))
        );
    }
}

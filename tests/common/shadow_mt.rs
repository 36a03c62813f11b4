//! The multi-threaded shadow-map run on the real clock, shared by
//! `tests/integration/shadow.rs` and `examples/shadow.rs` (the ExpireMap seed's
//! `test_expire_map`, made exact where timing allows).
//!
//! Each thread owns a key range with an exact shadow. Every map call is
//! bracketed by two clock readings `[a, b]`, so a deadline is known to lie in
//! `[lo, hi]`; a result is a mismatch only if it contradicts every instant in
//! that window. Whatever the machine's speed, a correct map never mismatches.
//! Keys shared by all threads are checked for what holds under races: a value
//! returned belongs to that key, was really put, and is not past its deadline.
//! A subscriber checks every event: never early, key and value consistent.
#![allow(dead_code, unreachable_pub)]

use expiremap::{Cause, Clock, ExpireMap, RecvError, SystemClock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Parameters of a run.
#[derive(Clone, Debug)]
pub struct Params {
    pub keys: u64,
    pub ops: u64,
    pub threads: usize,
    pub max_ttl_ms: u64,
    pub seed: u64,
    /// Threads calling `evict_expired` in a loop beside the background
    /// eviction thread.
    pub evictors: usize,
    /// Print a progress line about every second.
    pub progress: bool,
}

/// Outcome of a run.
#[derive(Debug, Default)]
pub struct Summary {
    pub ops: u64,
    pub mismatches: u64,
    pub events: u64,
    pub expired_events: u64,
    pub elapsed: Duration,
    pub first_mismatches: Vec<String>,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What a thread knows of one of its own keys.
#[derive(Clone, Copy, Debug)]
struct Known {
    value: u64,
    /// The deadline lies in `lo..=hi` (clock ns).
    lo: u64,
    hi: u64,
    /// A read already saw it expired.
    dead: bool,
}

impl Known {
    fn surely_live(&self, at_most: u64) -> bool {
        !self.dead && at_most <= self.lo
    }
    fn surely_expired(&self, at_least: u64) -> bool {
        self.dead || at_least > self.hi
    }
}

struct Shared {
    map: ExpireMap<u64, u64>,
    clock: SystemClock,
    /// value -> upper bound of its deadline, for shared keys.
    registry: Mutex<HashMap<u64, u64>>,
    report: Arc<Report>,
    done: AtomicU64,
}

impl Shared {
    fn mismatch(&self, what: String) {
        self.report.mismatch(what);
    }
}

/// Mismatches, shared with the event checker (which outlives the map).
#[derive(Default)]
struct Report {
    mismatches: AtomicU64,
    first: Mutex<Vec<String>>,
}

impl Report {
    fn mismatch(&self, what: String) {
        self.mismatches.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap();
        if first.len() < 10 {
            first.push(what);
        }
    }
}

/// Values carry their key: `key << 24 | thread << 20 | serial (20 bits)`.
fn make_value(key: u64, thread: usize, serial: u64) -> u64 {
    (key << 24) | ((thread as u64) << 20) | (serial & 0xF_FFFF)
}

fn key_of(value: u64) -> u64 {
    value >> 24
}

/// Runs the shadow test and returns its summary.
pub fn run(p: &Params) -> Summary {
    assert!(p.threads >= 1 && p.threads < 16, "threads must be 1..=15");
    assert!(
        p.keys >= 2 * p.threads as u64,
        "need at least 2 keys per thread"
    );
    let clock = SystemClock::new();
    let map = ExpireMap::<u64, u64>::builder()
        .clock(clock)
        .publish_removals(true)
        .event_capacity(1 << 16)
        .build();
    let mut sub = map.subscribe().expect("subscribe");
    let report = Arc::new(Report::default());
    let shared = Arc::new(Shared {
        map,
        clock,
        registry: Mutex::new(HashMap::new()),
        report: report.clone(),
        done: AtomicU64::new(0),
    });
    let start = Instant::now();

    // Event checker: never early, key/value consistent.
    let checker_shared = report.clone();
    let checker = std::thread::spawn(move || {
        let (mut events, mut expired) = (0u64, 0u64);
        loop {
            match sub.recv() {
                Ok(e) => {
                    events += 1;
                    if key_of(e.value) != e.key {
                        checker_shared
                            .mismatch(format!("event value {} not of key {}", e.value, e.key));
                    }
                    if e.cause == Cause::Expired {
                        expired += 1;
                        if e.removed_at() <= e.deadline() {
                            checker_shared.mismatch(format!("early Expired event {e:?}"));
                        }
                    }
                }
                Err(RecvError::Lagged(_)) => {} // allowed: only counts are affected
                Err(RecvError::Closed) => return (events, expired),
            }
        }
    });

    let own = p.keys / (p.threads as u64 + 1);
    let shared_keys = (p.threads as u64 * own)..p.keys;
    let per_thread = p.ops / p.threads as u64;
    let workers: Vec<_> = (0..p.threads)
        .map(|t| {
            let s = shared.clone();
            let p = p.clone();
            let shared_keys = shared_keys.clone();
            std::thread::spawn(move || {
                worker(
                    &s,
                    &p,
                    t,
                    t as u64 * own..(t as u64 + 1) * own,
                    shared_keys,
                    per_thread,
                )
            })
        })
        .collect();

    let progress = p.progress.then(|| {
        let s = shared.clone();
        let total = per_thread * p.threads as u64;
        std::thread::spawn(move || {
            let mut last = 0;
            while s.done.load(Ordering::Relaxed) < total {
                std::thread::sleep(Duration::from_millis(250));
                let now = s.done.load(Ordering::Relaxed);
                if now / (total / 20).max(1) != last / (total / 20).max(1) {
                    eprintln!(
                        "  {:>5.1}%  {} ops  {} mismatches  len {}",
                        100.0 * now as f64 / total as f64,
                        now,
                        s.report.mismatches.load(Ordering::Relaxed),
                        s.map.len()
                    );
                }
                last = now;
            }
        })
    });
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let evictors: Vec<_> = (0..p.evictors)
        .map(|_| {
            let (s, stop) = (shared.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    s.map.evict_expired();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker panicked");
    }
    stop.store(true, Ordering::Relaxed);
    for e in evictors {
        e.join().expect("evictor panicked");
    }
    if let Some(h) = progress {
        h.join().unwrap();
    }
    let elapsed = start.elapsed();
    let shared = Arc::try_unwrap(shared).ok().expect("all threads joined");
    drop(shared.map); // shutdown: Shutdown events, then Closed
    let (events, expired_events) = checker.join().expect("checker panicked");
    let first_mismatches = report.first.lock().unwrap().clone();
    let mismatches = report.mismatches.load(Ordering::Relaxed);
    Summary {
        ops: per_thread * p.threads as u64,
        mismatches,
        events,
        expired_events,
        elapsed,
        first_mismatches,
    }
}

fn worker(
    s: &Shared,
    p: &Params,
    t: usize,
    own: std::ops::Range<u64>,
    shared_keys: std::ops::Range<u64>,
    ops: u64,
) {
    let mut rng = Rng(p.seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut known: HashMap<u64, Known> = HashMap::new();
    let mut serial = 0u64;
    let map = &s.map;
    let now = || s.clock.now();
    for _ in 0..ops {
        let use_shared = !shared_keys.is_empty() && rng.below(5) == 0;
        let key = if use_shared {
            shared_keys.start + rng.below(shared_keys.end - shared_keys.start)
        } else {
            own.start + rng.below(own.end - own.start)
        };
        let ttl = match rng.below(20) {
            0 => Duration::ZERO,
            _ => Duration::from_micros(1 + rng.below(p.max_ttl_ms * 1000)),
        };
        let ttl_ns = ttl.as_nanos() as u64;
        let op = rng.below(100);
        if use_shared {
            shared_op(s, &mut rng, t, key, ttl, op, &mut serial);
        } else {
            let k = known.get(&key).copied();
            match op {
                0..=39 => {
                    serial += 1;
                    let v = make_value(key, t, serial);
                    let a = now();
                    let r = map.put(key, v, ttl);
                    let b = now();
                    if ttl.is_zero() {
                        if r.is_some() {
                            s.mismatch(format!("zero-ttl put returned {r:?}"));
                        }
                    } else {
                        check_read(s, "put", key, k, r, a, b);
                        known.insert(
                            key,
                            Known {
                                value: v,
                                lo: a + ttl_ns,
                                hi: b + ttl_ns,
                                dead: false,
                            },
                        );
                    }
                }
                40..=69 => {
                    let a = now();
                    let r = map.get(&key);
                    let b = now();
                    check_read(s, "get", key, k, r, a, b);
                    if r.is_none() {
                        if let Some(k) = known.get_mut(&key) {
                            k.dead = true;
                        }
                    }
                }
                70..=79 => {
                    let a = now();
                    let r = map.remove(&key);
                    let b = now();
                    check_read(s, "remove", key, k, r, a, b);
                    known.remove(&key);
                }
                80..=87 => {
                    let a = now();
                    let r = map.touch(&key, ttl);
                    let b = now();
                    let shown = r.then_some(k.map_or(0, |k| k.value));
                    if ttl.is_zero() {
                        if r {
                            s.mismatch("zero-ttl touch returned true".into());
                        }
                    } else {
                        check_read(s, "touch", key, k, shown, a, b);
                        match known.get_mut(&key) {
                            Some(k) if r => {
                                k.lo = a + ttl_ns;
                                k.hi = b + ttl_ns;
                            }
                            Some(k) => k.dead = true,
                            None => {}
                        }
                    }
                }
                _ => {
                    let a = now();
                    let r = map.get_with_ttl(&key);
                    let b = now();
                    check_read(s, "get_with_ttl", key, k, r.map(|x| x.0), a, b);
                    match (r, known.get_mut(&key)) {
                        (None, Some(k)) => k.dead = true,
                        (Some((_, rem)), Some(k)) => {
                            let rem = rem.as_nanos() as u64;
                            // deadline = now + rem with now in [a, b]
                            if a + rem > k.hi || b + rem < k.lo {
                                s.mismatch(format!(
                                    "ttl of key {key}: {rem} ns at [{a},{b}] outside [{},{}]",
                                    k.lo, k.hi
                                ));
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        s.done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Checks a read of an own key against the shadow, for a map call made
/// within `[a, b]`.
fn check_read(s: &Shared, what: &str, key: u64, k: Option<Known>, r: Option<u64>, a: u64, b: u64) {
    match (k, r) {
        (None, Some(v)) => s.mismatch(format!("{what}({key}) invented {v}")),
        (None, None) => {}
        (Some(k), Some(v)) => {
            if v != k.value {
                s.mismatch(format!("{what}({key}) returned {v}, expected {}", k.value));
            } else if k.surely_expired(a) {
                s.mismatch(format!(
                    "{what}({key}) returned a value past its deadline (<= {}) at >= {a}",
                    k.hi
                ));
            }
        }
        (Some(k), None) => {
            if k.surely_live(b) {
                s.mismatch(format!(
                    "{what}({key}) lost a live value (deadline >= {}) at <= {b}",
                    k.lo
                ));
            }
        }
    }
}

fn shared_op(
    s: &Shared,
    rng: &mut Rng,
    t: usize,
    key: u64,
    ttl: Duration,
    op: u64,
    serial: &mut u64,
) {
    let map = &s.map;
    let check = |what: &str, r: Option<u64>, a: u64| {
        let Some(v) = r else { return };
        if key_of(v) != key {
            s.mismatch(format!("{what}({key}) returned {v} of key {}", key_of(v)));
            return;
        }
        if let Some(&hi) = s.registry.lock().unwrap().get(&v) {
            if a > hi {
                s.mismatch(format!("{what}({key}) returned {v} past its deadline"));
            }
        }
    };
    match op % 3 {
        0 => {
            *serial += 1;
            let v = make_value(key, t, *serial);
            let a = s.clock.now();
            let r = map.put(key, v, ttl);
            let b = s.clock.now();
            if !ttl.is_zero() {
                s.registry
                    .lock()
                    .unwrap()
                    .insert(v, b + ttl.as_nanos() as u64);
            }
            check("put", r, a);
        }
        1 => {
            let a = s.clock.now();
            check("get", map.get(&key), a);
        }
        _ => {
            let a = s.clock.now();
            let r = if rng.below(2) == 0 {
                map.remove(&key)
            } else {
                map.get(&key)
            };
            check("remove", r, a);
        }
    }
}

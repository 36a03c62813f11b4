//! Clock read cost (issue 2: "benchmark std `Instant` against at least one
//! alternative"): `SystemClock::now()` vs `std::time::Instant::now()` vs
//! `quanta` vs raw `clock_gettime` (Linux only, via the C library std already
//! links; no new dependency).
//!
//! Before the criterion runs it prints what matters for correctness: the
//! kernel clocksource, whether quanta uses the TSC and what its calibration
//! costs, quanta's drift against `Instant`, the coarse clock's resolution, and
//! backward steps seen within one thread and across a thread handoff.

use criterion::Criterion;
use expiremap::{Clock, SystemClock};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod sys {
    /// `struct timespec` on 64-bit Linux.
    #[repr(C)]
    pub(crate) struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }

    pub(crate) const CLOCK_MONOTONIC: i32 = 1;
    pub(crate) const CLOCK_MONOTONIC_COARSE: i32 = 6;

    unsafe extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
        fn clock_getres(clock: i32, res: *mut Timespec) -> i32;
    }

    /// Nanoseconds of `clock` (`clock_gettime`).
    #[inline]
    pub(crate) fn now(clock: i32) -> u64 {
        let mut ts = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable `struct timespec`; the clock ids
        // used are ones Linux defines.
        let rc = unsafe { clock_gettime(clock, &mut ts) };
        debug_assert_eq!(rc, 0);
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    /// Resolution of `clock` in nanoseconds (`clock_getres`).
    pub(crate) fn res(clock: i32) -> u64 {
        let mut ts = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: as in `now`.
        let rc = unsafe { clock_getres(clock, &mut ts) };
        assert_eq!(rc, 0);
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
}

/// Backward steps among `n` consecutive reads of `read` on one thread.
fn backward_steps(n: usize, read: impl Fn() -> u64) -> usize {
    let mut last = read();
    let mut back = 0;
    for _ in 0..n {
        let t = read();
        if t < last {
            back += 1;
        }
        last = t;
    }
    back
}

/// Two threads take turns: one reads its clock and publishes the reading, the
/// other reads its own clock after seeing it. Counts readings that are earlier
/// than the published one (time going back across a causal handoff), and the
/// largest such step back (in the clock's units).
fn handoff_violations<F>(rounds: u64, read: F) -> (u64, u64)
where
    F: Fn() -> u64 + Send + Sync + 'static,
{
    let read = Arc::new(read);
    // Even turn: A publishes; odd turn: B checks. `slot` holds the reading.
    let turn = Arc::new(AtomicU64::new(0));
    let slot = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let b = {
        let (read, turn, slot, stop) = (read.clone(), turn.clone(), slot.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut bad, mut worst) = (0u64, 0u64);
            let mut round = 0u64;
            while round < rounds {
                let want = 2 * round + 1;
                while turn.load(Ordering::Acquire) != want {
                    if stop.load(Ordering::Relaxed) {
                        return (bad, worst);
                    }
                    std::hint::spin_loop();
                }
                let seen = slot.load(Ordering::Relaxed);
                let t = read();
                if t < seen {
                    bad += 1;
                    worst = worst.max(seen - t);
                }
                turn.store(want + 1, Ordering::Release);
                round += 1;
            }
            (bad, worst)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    for round in 0..rounds {
        while turn.load(Ordering::Acquire) != 2 * round {
            std::hint::spin_loop();
            if Instant::now() > deadline {
                stop.store(true, Ordering::Relaxed);
                return b.join().unwrap();
            }
        }
        slot.store(read(), Ordering::Relaxed);
        turn.store(2 * round + 1, Ordering::Release);
    }
    b.join().unwrap()
}

fn report() {
    println!("== clock facts ==");
    let cs =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .unwrap_or_else(|_| "?".into());
    println!("kernel clocksource: {}", cs.trim());

    let t = Instant::now();
    let q = quanta::Clock::new();
    let cal = t.elapsed();
    let (r0, i0) = (q.raw(), Instant::now());
    std::thread::sleep(Duration::from_millis(100));
    let (r1, i1) = (q.raw(), Instant::now());
    let per_ns = (r1 - r0) as f64 / (i1 - i0).as_nanos() as f64;
    println!(
        "quanta::Clock::new() (first, calibrates): {cal:?}; raw units per ns: {per_ns:.3} ({})",
        if (per_ns - 1.0).abs() < 0.01 {
            "looks like the OS monotonic clock"
        } else {
            "TSC"
        }
    );

    // Drift of quanta's scaled time against Instant (CLOCK_MONOTONIC).
    let origin_q = q.now();
    let origin_i = Instant::now();
    for secs in [1u64, 2] {
        std::thread::sleep(Duration::from_secs(secs));
        let dq = q.now().duration_since(origin_q).as_nanos() as f64;
        let di = origin_i.elapsed().as_nanos() as f64;
        println!(
            "after {:.1} s: quanta - Instant = {:+.0} ns ({:+.2} ppm)",
            di / 1e9,
            dq - di,
            (dq - di) / di * 1e6
        );
    }

    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    println!(
        "clock_getres: CLOCK_MONOTONIC {} ns, CLOCK_MONOTONIC_COARSE {} ns",
        sys::res(sys::CLOCK_MONOTONIC),
        sys::res(sys::CLOCK_MONOTONIC_COARSE)
    );

    const N: usize = 10_000_000;
    let sc = SystemClock::new();
    println!(
        "backward steps in {N} reads on one thread: SystemClock {}, quanta now {}, quanta raw {}",
        backward_steps(N, || sc.now()),
        backward_steps(N, || q.now().duration_since(origin_q).as_nanos() as u64),
        backward_steps(N, || q.raw()),
    );

    const ROUNDS: u64 = 1_000_000;
    println!("backward across a thread handoff in {ROUNDS} rounds (count, worst step back):");
    let sc2 = SystemClock::new();
    println!(
        "  SystemClock: {:?} ns",
        handoff_violations(ROUNDS, move || sc2.now())
    );
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    println!(
        "  clock_gettime(CLOCK_MONOTONIC): {:?} ns",
        handoff_violations(ROUNDS, || sys::now(sys::CLOCK_MONOTONIC))
    );
    let q2 = q.clone();
    println!(
        "  quanta now: {:?} ns",
        handoff_violations(ROUNDS, move || q2.now().duration_since(origin_q).as_nanos()
            as u64)
    );
    let q3 = q.clone();
    println!(
        "  quanta raw: {:?} raw units",
        handoff_violations(ROUNDS, move || q3.raw())
    );
    println!();
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("clock_read");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));

    let sc = SystemClock::new();
    g.bench_function("system_clock_now", |b| b.iter(|| black_box(&sc).now()));
    g.bench_function("std_instant_now", |b| b.iter(Instant::now));
    // Where SystemClock's extra cost over `Instant::now()` goes.
    let origin = Instant::now();
    g.bench_function("std_instant_elapsed", |b| {
        b.iter(|| black_box(&origin).elapsed())
    });
    g.bench_function("std_elapsed_secs_nanos_u64", |b| {
        b.iter(|| {
            let d = black_box(&origin).elapsed();
            d.as_secs()
                .saturating_mul(1_000_000_000)
                .saturating_add(u64::from(d.subsec_nanos()))
        })
    });

    let q = quanta::Clock::new();
    let origin = q.now();
    g.bench_function("quanta_clock_now", |b| b.iter(|| black_box(&q).now()));
    // What a quanta-based `Clock::now()` would return: u64 ns since origin.
    g.bench_function("quanta_ns_since_origin", |b| {
        b.iter(|| black_box(&q).now().duration_since(origin).as_nanos() as u64)
    });
    g.bench_function("quanta_clock_raw", |b| b.iter(|| black_box(&q).raw()));
    g.bench_function("quanta_instant_now_global", |b| {
        b.iter(quanta::Instant::now)
    });

    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    {
        g.bench_function("clock_gettime_monotonic", |b| {
            b.iter(|| sys::now(black_box(sys::CLOCK_MONOTONIC)))
        });
        g.bench_function("clock_gettime_monotonic_coarse", |b| {
            b.iter(|| sys::now(black_box(sys::CLOCK_MONOTONIC_COARSE)))
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    // Only when benchmarking for real (`--bench`), not in `cargo test --benches`.
    if std::env::args().any(|a| a == "--bench") {
        report();
    }
    benches(&mut c);
    c.final_summary();
}

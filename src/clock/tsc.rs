//! A cheap *upper bound* on `CLOCK_MONOTONIC`, from an unfenced TSC read.
//!
//! # Why
//!
//! An exact `clock_gettime` costs 36 ns alone, but ~190 ns per `get` in a
//! loop of lookups over a large map: the vDSO orders its TSC read with a
//! fence that waits for every earlier load, so consecutive lookups can no
//! longer overlap their cache misses. A plain `rdtsc` is not ordered and
//! costs little there, provided the arithmetic on its value stays cheap
//! (see [`FRAC`]). It cannot give the exact time, but it can
//! give a bound `U >= now`; if `U <= deadline` the entry is live, which is all
//! `get` needs to know. Otherwise the caller reads the exact clock.
//!
//! # Why the bound holds
//!
//! Each thread keeps an *anchor* `(t0, n0)`: a TSC reading `t0` taken
//! between two fences, and an exact reading `n0` taken after it, so
//! `n0 >= mono(t0)`. For a later TSC reading `t`, with `d = t - t0`:
//!
//! ```text
//! U = n0 + d * MULT / 2^16 + SLACK,   only if t0 <= t <= t0 + MAX_TICKS
//! ```
//!
//! * `MULT / 2^16` is twice an over-estimate of the nanoseconds per TSC
//!   tick, measured between two fenced pairs at least 2 ms apart. The kernel
//!   can slew `CLOCK_MONOTONIC` against its clocksource by about 10 % at most
//!   (`adjtimex` tick plus frequency), so the clock never runs at twice the
//!   measured rate.
//! * `SLACK` (100 µs) covers TSC skew between CPUs (the kernel only uses the
//!   TSC as its clocksource when the CPUs agree to well under a microsecond;
//!   this VM showed ~70 ns) and how far an unfenced `rdtsc` can run ahead of
//!   the instructions before it.
//! * An anchor is used for at most `MAX_TICKS` (0.7 s at 3 GHz), and never
//!   for a reading below its `t0`: a TSC that restarted (after a suspend, say) fails one of
//!   the two checks and sends the caller to the exact clock, which re-anchors.
//!
//! The bound is used only where the kernel's own clock is built on the same
//! counter: x86-64 Linux with `tsc` as the current clocksource and an
//! invariant TSC (CPUID). Elsewhere, under Miri and under loom, a stub
//! module stands in and every question takes the exact clock.

use super::{SystemClock, monotonic_ns};
use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Margin for CPU skew and out-of-order execution, in nanoseconds.
const SLACK: u64 = 100_000;
/// Longest use of one anchor, in TSC ticks (0.7 s at 3 GHz).
const MAX_TICKS: u64 = 1 << 31;
/// Re-anchor when the bound is this far (ns) above the exact time.
const REFRESH: u64 = 4 * SLACK;
/// Shortest calibration span, in nanoseconds.
const CALIBRATION: u64 = 2_000_000;
/// Fractional bits of `MULT`. With `MULT < 2^32` and `d <= MAX_TICKS = 2^31`,
/// `d * MULT` fits in 63 bits: one 64-bit multiply. (The 128-bit multiply
/// and shift of a 32.32 format made a loop of lookups run at ~300 instead of
/// ~200 ns each on this project's AMD EPYC machine; see `bound`.)
const FRAC: u32 = 16;

/// A fenced TSC reading between two exact readings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pair {
    /// Exact time read before the TSC.
    pub(crate) before: u64,
    /// The TSC.
    pub(crate) tsc: u64,
    /// Exact time read after the TSC.
    pub(crate) after: u64,
}

/// A thread's anchor: `tsc`, and an exact time at or after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Anchor {
    tsc: u64,
    nanos: u64,
}

impl Anchor {
    /// No anchor yet: every bound from it is `u64::MAX`.
    const UNSET: Anchor = Anchor {
        tsc: u64::MAX,
        nanos: u64::MAX,
    };

    pub(crate) fn from_pair(p: Pair) -> Anchor {
        Anchor {
            tsc: p.tsc,
            nanos: p.after,
        }
    }

    /// The bound at TSC reading `t` with multiplier `mult`, minus `origin`;
    /// or `u64::MAX` (no bound) if the anchor is unset, `t` is below it, or
    /// it is more than `MAX_TICKS` old.
    ///
    /// Branch-free on purpose: with branches on the fresh TSC value here a
    /// loop of cache-missing lookups ran at ~300 instead of ~190 ns each
    /// (the lookups stopped overlapping their misses).
    #[inline]
    pub(crate) fn bound(self, mult: u64, t: u64, origin: u64) -> u64 {
        // Below the anchor, `d` wraps to a huge value and fails the check.
        let d = t.wrapping_sub(self.tsc);
        let ok = (d <= MAX_TICKS) & (self.nanos != u64::MAX);
        // When `ok`, d <= 2^31 and mult < 2^32 (see `multiplier`): no wrap.
        let grown = d.wrapping_mul(mult) >> FRAC;
        // When `ok`, nanos < 2^62 (time since boot) and grown < 2^63, and the
        // true bound is at least the kernel's time, which is at least
        // `origin`: no step below wraps. Otherwise the value is discarded.
        let b = self
            .nanos
            .wrapping_add(grown)
            .wrapping_add(SLACK)
            .wrapping_sub(origin);
        b | u64::from(!ok).wrapping_neg()
    }
}

/// `2 * 2^FRAC *` an over-estimate of nanoseconds per tick, from two pairs
/// (`a` first), or `None` if the TSC did not move forward or is slower than
/// 32 kHz (a multiplier of 2^32 or more, which could overflow `bound`).
pub(crate) fn multiplier(a: Pair, b: Pair) -> Option<u64> {
    let ticks = b.tsc.checked_sub(a.tsc).filter(|&t| t > 0)?;
    // The widest span the ticks can have taken: from before `a` to after `b`.
    let nanos = b.after.checked_sub(a.before)?;
    let per_tick = (u128::from(nanos) << (FRAC + 1)).div_ceil(u128::from(ticks));
    u64::try_from(per_tick)
        .ok()
        .filter(|&m| m > 0 && m < 1 << 32)
}

/// The first calibration pair, or `None` if the bound is not supported here.
static START: OnceLock<Option<Pair>> = OnceLock::new();
/// The multiplier, once calibrated (0 = not yet).
static MULT: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    static ANCHOR: Cell<Anchor> = const { Cell::new(Anchor::UNSET) };
}

/// Starts calibration (once per process; later calls are one load).
pub(super) fn init() {
    START.get_or_init(|| supported().then(pair));
}

/// An upper bound on `clock.now()`, or `u64::MAX` (no bound).
#[inline]
pub(super) fn bound(clock: &SystemClock) -> u64 {
    // A thread sets its anchor only after it has seen MULT set, and MULT
    // never changes again: with an anchor, this load sees the final value.
    // Without one, the bound is u64::MAX whatever MULT is.
    let mult = MULT.load(Ordering::Acquire);
    ANCHOR.with(|a| a.get()).bound(mult, rdtsc(), clock.origin)
}

/// Called after a `bound()` that did not settle a question, with the exact
/// `clock.now()` read since: calibrates or re-anchors this thread when
/// useful.
#[cold]
pub(super) fn learn(clock: &SystemClock, now: u64, bound: u64) {
    // Back to the kernel's time since boot, which anchors are kept in.
    let now = now.saturating_add(clock.origin);
    let mult = MULT.load(Ordering::Acquire);
    if mult == 0 {
        let Some(Some(start)) = START.get() else {
            return;
        };
        if now.saturating_sub(start.after) < CALIBRATION {
            return;
        }
        let p = pair();
        let Some(m) = multiplier(*start, p) else {
            return;
        };
        // The first calibration wins; every candidate is safe.
        let _ = MULT.compare_exchange(0, m, Ordering::AcqRel, Ordering::Acquire);
        ANCHOR.with(|a| a.set(Anchor::from_pair(p)));
        return;
    }
    if bound.saturating_add(clock.origin).saturating_sub(now) > REFRESH {
        ANCHOR.with(|a| a.set(Anchor::from_pair(pair())));
    }
}

/// An exact reading, a fenced TSC reading, another exact reading.
fn pair() -> Pair {
    let before = monotonic_ns();
    let tsc = fenced_rdtsc();
    let after = monotonic_ns();
    Pair { before, tsc, after }
}

#[inline]
fn rdtsc() -> u64 {
    // SAFETY: `rdtsc` exists on every x86-64 CPU and only reads the counter.
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
}

fn fenced_rdtsc() -> u64 {
    // SAFETY: SSE2 (`lfence`) and `rdtsc` are part of the x86-64 baseline.
    // The fences keep the read after the exact reading before it and before
    // the one after it.
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_mm_lfence();
        let t = core::arch::x86_64::_rdtsc();
        core::arch::x86_64::_mm_lfence();
        t
    }
}

/// The kernel keeps time with the TSC, and the CPU says it is invariant.
fn supported() -> bool {
    // SAFETY: `cpuid` exists on every x86-64 CPU; leaf 0x8000_0000 gives the
    // highest extended leaf, checked before leaf 0x8000_0007 is read.
    #[allow(unused_unsafe)]
    let invariant = unsafe {
        let max = core::arch::x86_64::__cpuid(0x8000_0000).eax;
        max >= 0x8000_0007 && core::arch::x86_64::__cpuid(0x8000_0007).edx & (1 << 8) != 0
    };
    invariant
        && std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|s| s.trim() == "tsc")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Clock;

    const ANCHOR: Anchor = Anchor {
        tsc: 1_000_000,
        nanos: 5_000_000,
    };
    /// 2 * 0.5 ns per tick (a 2 GHz TSC), with FRAC fractional bits.
    const MULT_2GHZ: u64 = 1 << FRAC;

    #[test]
    fn bound_grows_from_the_anchor_with_slack() {
        assert_eq!(ANCHOR.bound(MULT_2GHZ, 1_000_000, 0), 5_000_000 + SLACK);
        assert_eq!(
            ANCHOR.bound(MULT_2GHZ, 1_000_000 + 4_000, 1_000),
            5_000_000 + 4_000 + SLACK - 1_000
        );
        assert_eq!(
            ANCHOR.bound(MULT_2GHZ, 1_000_000 + MAX_TICKS, 0),
            5_000_000 + MAX_TICKS + SLACK
        );
    }

    #[test]
    fn no_bound_when_unset_below_the_anchor_or_too_old() {
        assert_eq!(Anchor::UNSET.bound(MULT_2GHZ, 12_345, 0), u64::MAX);
        assert_eq!(Anchor::UNSET.bound(MULT_2GHZ, u64::MAX, 0), u64::MAX);
        // A TSC that restarted below the anchor.
        assert_eq!(ANCHOR.bound(MULT_2GHZ, 999_999, 0), u64::MAX);
        assert_eq!(ANCHOR.bound(MULT_2GHZ, 0, 0), u64::MAX);
        assert_eq!(
            ANCHOR.bound(MULT_2GHZ, 1_000_000 + MAX_TICKS + 1, 0),
            u64::MAX
        );
    }

    #[test]
    fn multiplier_is_twice_the_widest_rate() {
        let a = Pair {
            before: 100,
            tsc: 1_000,
            after: 140,
        };
        let b = Pair {
            before: 2_000_000,
            tsc: 4_001_000,
            after: 2_000_100,
        };
        // Widest span: 2_000_100 - 100 ns over 4_000_000 ticks.
        let m = multiplier(a, b).unwrap();
        let exact = 2.0 * 2_000_000.0 / 4_000_000.0 * f64::from(1u32 << FRAC);
        assert!(m as f64 >= exact && (m as f64) < exact + 1.0, "{m}");
        assert_eq!(multiplier(b, a), None, "time went back");
        assert_eq!(multiplier(a, a), None, "the TSC did not move");
        // 2^15 ns per tick or slower (a 30 kHz TSC) would overflow `bound`.
        let slow = Pair {
            before: 100 + (1 << 15) * 4,
            tsc: 1_004,
            after: 140 + (1 << 15) * 4,
        };
        assert_eq!(multiplier(a, slow), None, "TSC too slow");
    }

    /// The argument of the module docs, checked on simulated clocks: the
    /// kernel's time runs at a rate within ±10 % of the calibrated one,
    /// anchors are taken with delays between their reads, and the reading
    /// CPU's TSC is up to 1 µs off the anchoring CPU's.
    #[test]
    fn bound_stays_above_a_kernel_clock_slewing_by_ten_percent() {
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..20_000 {
            // ns per tick, in parts per million of 0.4 ns (2.5 GHz).
            let ppm = |r: u64| 0.4 * (900_000 + r) as f64 / 1e6;
            let cal_rate = ppm(rnd(200_001));
            let run_rate = ppm(rnd(200_001));
            let t0 = 1_000_000 + rnd(1 << 40);
            let mono = |rate: f64, t: u64, at: u64, base: u64| -> u64 {
                base + ((t - at) as f64 * rate) as u64
            };
            // Calibration pairs 2..50 ms apart, with up to 5 µs of delay
            // around each TSC read.
            let span = 5_000_000 + rnd(120_000_000);
            let base = 10_000_000_000 + rnd(1 << 40);
            let pa = Pair {
                before: base - rnd(5_000),
                tsc: t0,
                after: base + rnd(5_000),
            };
            let nb = mono(cal_rate, t0 + span, t0, base);
            let pb = Pair {
                before: nb - rnd(5_000),
                tsc: t0 + span,
                after: nb + rnd(5_000),
            };
            let m = multiplier(pa, pb).unwrap();
            // Anchor at pb, then read up to MAX_TICKS later on a CPU whose
            // TSC runs up to 1 µs (2,500 ticks) behind.
            let anchor = Anchor::from_pair(pb);
            let dt = rnd(MAX_TICKS);
            let truth = mono(run_rate, pb.tsc + dt, pb.tsc, nb);
            let seen = (pb.tsc + dt).saturating_sub(rnd(2_500));
            let b = anchor.bound(m, seen, 0);
            assert!(b >= truth, "bound {b} < kernel time {truth}");
        }
    }

    /// On this machine: every bound is at least an exact reading taken
    /// before it, on every thread. Holds however slow the machine is.
    #[test]
    fn bound_is_never_below_an_earlier_exact_reading() {
        let clock = SystemClock::new();
        std::thread::sleep(std::time::Duration::from_millis(3));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut bounded = 0u32;
                    for i in 0..200_000u32 {
                        let before = clock.now();
                        let b = clock.now_at_most();
                        assert!(b >= before, "bound {b} < earlier exact time {before}");
                        if b == u64::MAX || i % 1_000 == 0 {
                            // What a lookup that was not settled does.
                            let _ = clock.now_after(b);
                        } else {
                            bounded += 1;
                        }
                    }
                    bounded
                })
            })
            .collect();
        let bounded: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        if supported() {
            assert_ne!(MULT.load(Ordering::Relaxed), 0, "calibrated after 3 ms");
            assert!(bounded > 0, "the cheap bound was used");
        } else {
            assert_eq!(bounded, 0);
        }
    }
}

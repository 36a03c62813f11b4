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
//! * A suspend stops `CLOCK_MONOTONIC` while the TSC may count on. After
//!   calibration that only makes the bound larger (safe); *during*
//!   calibration it would make the rate look far too small. So each
//!   calibration pair also reads `CLOCK_BOOTTIME`, which counts suspended
//!   time: a calibration span in which `BOOTTIME` ran more than `ASLEEP`
//!   ahead of `MONOTONIC` is thrown away and calibration starts again from
//!   its second pair ([`multiplier`]).
//!
//! # Checked at run time
//!
//! What the argument assumes (one TSC rate, CPUs in step, no clocksource
//! change, no VM migration to another TSC) is checked whenever a thread
//! re-anchors, which a thread using the bound does at least every
//! `MAX_TICKS`: the old anchor's bound at the new pair's TSC reading must be
//! at least the exact time read *before* that TSC reading. A bound below it
//! proves the bound unsound here, and the bound turns itself off for the
//! process: `MULT` goes to 0, which every `bound` reads as "no bound", and
//! every question takes the exact clock from then on.
//!
//! The bound is used only where the kernel's own clock is built on the same
//! counter: x86-64 Linux with `tsc` as the current clocksource and an
//! invariant TSC (CPUID). Elsewhere, under Miri and under loom, a stub
//! module stands in and every question takes the exact clock.

use super::{SystemClock, monotonic_ns};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, Once};

/// Margin for CPU skew and out-of-order execution, in nanoseconds.
const SLACK: u64 = 100_000;
/// Longest use of one anchor, in TSC ticks (0.7 s at 3 GHz).
const MAX_TICKS: u64 = 1 << 31;
/// Re-anchor when the bound is this far (ns) above the exact time.
const REFRESH: u64 = 4 * SLACK;
/// Shortest calibration span, in nanoseconds.
const CALIBRATION: u64 = 2_000_000;
/// How far `CLOCK_BOOTTIME` may run ahead of `CLOCK_MONOTONIC` over a
/// calibration span (ns) before the span counts as slept through. Read
/// delays between the clocks stay far below it; a sleep this short changes
/// the measured rate by at most 5 % of a `CALIBRATION` span, well inside the
/// 2x margin.
const ASLEEP: u64 = 100_000;
/// Fractional bits of `MULT`. With `MULT < 2^32` and `d <= MAX_TICKS = 2^31`,
/// `d * MULT` fits in 63 bits: one 64-bit multiply. (The 128-bit multiply
/// and shift of a 32.32 format made a loop of lookups run at ~300 instead of
/// ~200 ns each on this project's AMD EPYC machine; see `bound`.)
const FRAC: u32 = 16;

/// A fenced TSC reading between two exact readings, themselves between two
/// readings of `CLOCK_BOOTTIME`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pair {
    /// `CLOCK_BOOTTIME`, read first.
    pub(crate) boot_before: u64,
    /// Exact time read before the TSC.
    pub(crate) before: u64,
    /// The TSC.
    pub(crate) tsc: u64,
    /// Exact time read after the TSC.
    pub(crate) after: u64,
    /// `CLOCK_BOOTTIME`, read last.
    pub(crate) boot_after: u64,
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
        // `mult == 0`: not calibrated yet, or turned off.
        let d = t.wrapping_sub(self.tsc);
        let ok = (d <= MAX_TICKS) & (self.nanos != u64::MAX) & (mult != 0);
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

    /// The bound at TSC reading `t` with no limit on the anchor's age, as
    /// a kernel time (`origin` 0), or `None` if there is no anchor or `t` is
    /// below it. For the run-time check only: no overflow in 128 bits.
    fn bound_unlimited(self, mult: u64, t: u64) -> Option<u128> {
        let d = t.checked_sub(self.tsc).filter(|_| self.nanos != u64::MAX)?;
        let grown = (u128::from(d) * u128::from(mult)) >> FRAC;
        Some(u128::from(self.nanos) + grown + u128::from(SLACK))
    }
}

/// `2 * 2^FRAC *` an over-estimate of nanoseconds per tick, from two pairs
/// (`a` first), or `None` if the TSC did not move forward or is slower than
/// 32 kHz (a multiplier of 2^32 or more, which could overflow `bound`), or
/// the machine may have been suspended between them (`BOOTTIME` ran more
/// than `ASLEEP` ahead of `MONOTONIC`: the rate would come out too small).
pub(crate) fn multiplier(a: Pair, b: Pair) -> Option<u64> {
    let ticks = b.tsc.checked_sub(a.tsc).filter(|&t| t > 0)?;
    // The widest span the ticks can have taken: from before `a` to after `b`.
    let nanos = b.after.checked_sub(a.before)?;
    // Suspended time inside the span is at most BOOTTIME's span minus
    // MONOTONIC's (which is at least `nanos`).
    let boot = b.boot_after.checked_sub(a.boot_before)?;
    if boot.saturating_sub(nanos) > ASLEEP {
        return None;
    }
    let per_tick = (u128::from(nanos) << (FRAC + 1)).div_ceil(u128::from(ticks));
    u64::try_from(per_tick)
        .ok()
        .filter(|&m| m > 0 && m < 1 << 32)
}

/// The state every thread's bound shares: one per process ([`STATE`]);
/// tests make their own and drive it with a simulated machine.
#[derive(Debug)]
pub(crate) struct Calibration {
    /// The pair the next calibration measures from; `None` before `init`,
    /// once calibrated, and where the bound is not supported.
    start: Mutex<Option<Pair>>,
    /// The multiplier: 0 while not calibrated, and after the run-time check
    /// turned the bound off. Takes the values 0, then one multiplier, then
    /// possibly 0 again, never another multiplier: a thread that has an
    /// anchor set after seeing a multiplier sees that one or 0.
    mult: AtomicU64,
    /// Set when the run-time check failed: never calibrate again.
    off: AtomicBool,
}

impl Calibration {
    pub(crate) const fn new() -> Self {
        Self {
            start: Mutex::new(None),
            mult: AtomicU64::new(0),
            off: AtomicBool::new(false),
        }
    }

    /// Calibration measures from `p`.
    pub(crate) fn begin(&self, p: Pair) {
        *self.start.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
    }

    #[inline]
    pub(crate) fn mult(&self) -> u64 {
        self.mult.load(Ordering::Acquire)
    }

    /// Whether the run-time check has turned the bound off.
    pub(crate) fn is_off(&self) -> bool {
        self.off.load(Ordering::Acquire)
    }

    /// Called after a bound that did not settle a question, with the exact
    /// time `now` read since, both as kernel times: calibrates once a
    /// calibration span has passed, or re-anchors `anchor` when the bound is
    /// missing or far above `now`, checking the old anchor first (see
    /// "Checked at run time"). `read` takes a new pair.
    pub(crate) fn learn(
        &self,
        anchor: &Cell<Anchor>,
        read: impl Fn() -> Pair,
        now: u64,
        bound: u64,
    ) {
        if self.is_off() {
            return;
        }
        let mult = self.mult();
        if mult == 0 {
            // One thread calibrates; the others keep the exact clock.
            let Ok(mut start) = self.start.try_lock() else {
                return;
            };
            let Some(from) = *start else {
                return; // unsupported, or calibrated meanwhile
            };
            if now.saturating_sub(from.after) < CALIBRATION {
                return;
            }
            let p = read();
            match multiplier(from, p) {
                Some(m) => {
                    *start = None;
                    self.mult.store(m, Ordering::Release);
                    anchor.set(Anchor::from_pair(p));
                }
                // Maybe slept through: measure again, from here.
                None => *start = Some(p),
            }
            return;
        }
        if bound.saturating_sub(now) > REFRESH {
            let p = read();
            let old = anchor.get();
            if old
                .bound_unlimited(mult, p.tsc)
                .is_some_and(|b| b < u128::from(p.before))
            {
                self.off.store(true, Ordering::Release);
                self.mult.store(0, Ordering::Release);
                return;
            }
            anchor.set(Anchor::from_pair(p));
        }
    }
}

/// The process's calibration.
static STATE: Calibration = Calibration::new();
static INIT: Once = Once::new();

std::thread_local! {
    static ANCHOR: Cell<Anchor> = const { Cell::new(Anchor::UNSET) };
}

/// Starts calibration (once per process; later calls are one load).
pub(super) fn init() {
    INIT.call_once(|| {
        if supported() {
            STATE.begin(pair());
        }
    });
}

/// An upper bound on `clock.now()`, or `u64::MAX` (no bound).
#[inline]
pub(super) fn bound(clock: &SystemClock) -> u64 {
    ANCHOR
        .with(|a| a.get())
        .bound(STATE.mult(), rdtsc(), clock.origin)
}

/// Called after a `bound()` that did not settle a question, with the exact
/// `clock.now()` read since: calibrates or re-anchors this thread when
/// useful (see [`Calibration::learn`]).
#[cold]
pub(super) fn learn(clock: &SystemClock, now: u64, bound: u64) {
    // Back to the kernel's time since boot, which anchors are kept in.
    let now = now.saturating_add(clock.origin);
    let bound = bound.saturating_add(clock.origin);
    ANCHOR.with(|a| STATE.learn(a, pair, now, bound));
}

/// `CLOCK_BOOTTIME`, an exact reading, a fenced TSC reading, another exact
/// reading, `CLOCK_BOOTTIME` again.
///
/// `supported` checked that `CLOCK_BOOTTIME` works. Should a reading fail
/// anyway, the 0 in its place makes [`multiplier`] refuse a span that
/// starts or ends with it (its `BOOTTIME` span looks far too long, or goes
/// back).
fn pair() -> Pair {
    let boot_before = boottime_ns().unwrap_or(0);
    let before = monotonic_ns();
    let tsc = fenced_rdtsc();
    let after = monotonic_ns();
    let boot_after = boottime_ns().unwrap_or(0);
    Pair {
        boot_before,
        before,
        tsc,
        after,
        boot_after,
    }
}

/// `CLOCK_BOOTTIME` in nanoseconds (`CLOCK_MONOTONIC` plus time
/// suspended), or `None` if the kernel does not have it (before 2.6.39).
fn boottime_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` for the duration of the
    // call, which only writes it; the result is checked.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    (rc == 0).then(|| {
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64)
    })
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
        && boottime_ns().is_some()
        && std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|s| s.trim() == "tsc")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Clock;

    /// A pair on a machine that did not sleep: `BOOTTIME` equals
    /// `MONOTONIC` plus a constant.
    fn awake(before: u64, tsc: u64, after: u64) -> Pair {
        Pair {
            boot_before: before + 7,
            before,
            tsc,
            after,
            boot_after: after + 7,
        }
    }

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
        let a = awake(100, 1_000, 140);
        let b = awake(2_000_000, 4_001_000, 2_000_100);
        // Widest span: 2_000_100 - 100 ns over 4_000_000 ticks.
        let m = multiplier(a, b).unwrap();
        let exact = 2.0 * 2_000_000.0 / 4_000_000.0 * f64::from(1u32 << FRAC);
        assert!(m as f64 >= exact && (m as f64) < exact + 1.0, "{m}");
        assert_eq!(multiplier(b, a), None, "time went back");
        assert_eq!(multiplier(a, a), None, "the TSC did not move");
        // 2^15 ns per tick or slower (a 30 kHz TSC) would overflow `bound`.
        let slow = awake(100 + (1 << 15) * 4, 1_004, 140 + (1 << 15) * 4);
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
            let pa = awake(base - rnd(5_000), t0, base + rnd(5_000));
            let nb = mono(cal_rate, t0 + span, t0, base);
            let pb = awake(nb - rnd(5_000), t0 + span, nb + rnd(5_000));
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
            assert!(STATE.mult() != 0 || STATE.is_off(), "calibrated after 3 ms");
            assert!(bounded > 0, "the cheap bound was used");
        } else {
            assert_eq!(bounded, 0);
        }
    }

    /// A simulated machine: real time runs on, `MONOTONIC` stops while it
    /// is suspended, `BOOTTIME` does not, and the TSC counts `tsc_per_ns`
    /// ticks per real nanosecond throughout (as it does across a suspend on
    /// the machines the issue saw; a TSC that restarts fails the anchor's
    /// range check instead).
    struct Machine {
        real: Cell<u64>,
        slept: Cell<u64>,
        tsc: Cell<u64>,
        tsc_per_ns: Cell<u64>,
    }

    impl Machine {
        fn new() -> Self {
            Self {
                real: Cell::new(1_000_000_000),
                slept: Cell::new(0),
                tsc: Cell::new(3_000_000_000),
                tsc_per_ns: Cell::new(3),
            }
        }
        fn run(&self, ns: u64) {
            self.real.set(self.real.get() + ns);
            self.tsc.set(self.tsc.get() + ns * self.tsc_per_ns.get());
        }
        fn suspend(&self, ns: u64) {
            self.run(ns);
            self.slept.set(self.slept.get() + ns);
        }
        fn mono(&self) -> u64 {
            self.real.get() - self.slept.get()
        }
        fn pair(&self) -> Pair {
            let (boot, mono, tsc) = (self.real.get(), self.mono(), self.tsc.get());
            Pair {
                boot_before: boot,
                before: mono,
                tsc,
                after: mono,
                boot_after: boot,
            }
        }
    }

    /// What a lookup does: the bound, and when it says nothing (or the
    /// caller wants the exact time anyway), the exact time and `learn`.
    /// Returns the bound if there was one.
    fn lookup(cal: &Calibration, anchor: &Cell<Anchor>, m: &Machine) -> Option<u64> {
        let b = anchor.get().bound(cal.mult(), m.tsc.get(), 0);
        if b == u64::MAX {
            cal.learn(anchor, || m.pair(), m.mono(), b);
            None
        } else {
            Some(b)
        }
    }

    /// Regression: calibration paired its first reading with one taken
    /// after a suspend (the TSC counted on, `MONOTONIC` stopped), so the
    /// rate came out ~1,500 times too small and the bound fell behind the
    /// clock by up to the whole suspend: `get` returned values up to 100 ms
    /// past their deadline. Now `BOOTTIME` shows the sleep and the span is
    /// measured again.
    #[test]
    fn a_suspend_during_calibration_never_yields_a_low_bound() {
        let m = Machine::new();
        let cal = Calibration::new();
        let anchor = Cell::new(Anchor::UNSET);
        cal.begin(m.pair());
        m.suspend(3_000_000_000);
        m.run(CALIBRATION);
        for step in 0..20_000u64 {
            if let Some(b) = lookup(&cal, &anchor, &m) {
                assert!(b >= m.mono(), "step {step}: bound {b} < time {}", m.mono());
            }
            m.run(1 + step % 97 * 1_000);
        }
        assert_ne!(cal.mult(), 0, "calibrated once the machine stayed awake");
        assert!(!cal.is_off());
    }

    /// The same with a sleep below `ASLEEP`: accepted, and still safe (the
    /// 2x margin covers it).
    #[test]
    fn a_short_sleep_during_calibration_is_within_the_margin() {
        let m = Machine::new();
        let cal = Calibration::new();
        let anchor = Cell::new(Anchor::UNSET);
        cal.begin(m.pair());
        m.suspend(ASLEEP);
        m.run(CALIBRATION);
        assert_eq!(lookup(&cal, &anchor, &m), None);
        assert_ne!(cal.mult(), 0, "one calibration span was enough");
        for _ in 0..10_000 {
            m.run(7_919);
            if let Some(b) = lookup(&cal, &anchor, &m) {
                assert!(b >= m.mono());
            }
        }
    }

    /// The run-time check: after calibration the TSC slows to a third of
    /// its rate (a migration to another host, say), so the calibrated
    /// multiplier no longer over-estimates. At the next re-anchor the old
    /// anchor's bound is found below an exact reading, and the bound turns
    /// itself off for good: every later lookup takes the exact clock.
    #[test]
    fn a_bound_found_below_the_clock_turns_itself_off() {
        let m = Machine::new();
        let cal = Calibration::new();
        let anchor = Cell::new(Anchor::UNSET);
        cal.begin(m.pair());
        m.run(CALIBRATION);
        assert_eq!(lookup(&cal, &anchor, &m), None);
        assert_ne!(cal.mult(), 0);
        m.tsc_per_ns.set(1);
        // Run until the anchor's range is used up: the next lookup
        // re-anchors, and checks.
        let mut last = None;
        while let Some(b) = lookup(&cal, &anchor, &m) {
            last = Some(b);
            m.run(1_000_000);
        }
        assert!(last.is_some(), "the bound was in use after the slowdown");
        assert!(cal.is_off(), "the check caught the slow TSC");
        assert_eq!(cal.mult(), 0);
        // Off for good: no recalibration, no bound.
        for _ in 0..100 {
            m.run(CALIBRATION);
            assert_eq!(lookup(&cal, &anchor, &m), None);
        }
        assert_eq!(cal.mult(), 0);
    }

    /// No false alarm: a machine whose TSC keeps its rate (and one that is
    /// suspended after calibration, which only raises the bound) re-anchors
    /// many times and never turns the bound off.
    #[test]
    fn an_honest_tsc_passes_every_check() {
        let m = Machine::new();
        let cal = Calibration::new();
        let anchor = Cell::new(Anchor::UNSET);
        cal.begin(m.pair());
        m.run(CALIBRATION);
        let mut bounded = 0;
        for step in 0..50_000u64 {
            if step == 20_000 {
                m.suspend(5_000_000_000);
            }
            match lookup(&cal, &anchor, &m) {
                Some(b) => {
                    assert!(b >= m.mono());
                    bounded += 1;
                }
                None => assert!(!cal.is_off(), "false alarm at step {step}"),
            }
            m.run(100_000);
        }
        assert!(bounded > 40_000, "{bounded}");
        assert!(!cal.is_off());
    }
}

//! Time: the [`Clock`] trait, the real [`SystemClock`] and the virtual
//! [`ManualClock`].
//!
//! # Ground rules
//!
//! * A clock reads monotonic nanoseconds since its own origin as a `u64`
//!   (about 584 years of range). Nothing else in the crate reads the time.
//! * A clock never goes back. If a user `Clock` does anyway, the map treats
//!   the earlier reading as "no time has passed": it never un-expires an
//!   entry it already evicted, and never evicts early.
//! * A clock that does not advance on its own ([`Clock::is_real_time`] is
//!   `false`) must call the wakers given to [`Clock::watch`] whenever it moves,
//!   so that eviction threads follow virtual time without real sleeps.

use crate::sync::{Arc, AtomicU64, Mutex, Ordering};
use std::fmt;
use std::time::Duration;
#[cfg(not(target_os = "linux"))]
use std::time::Instant;

mod time;
pub(crate) use time::Time;

#[cfg(all(
    target_os = "linux",
    target_arch = "x86_64",
    not(miri),
    not(expiremap_loom)
))]
mod tsc;

/// Elsewhere there is no cheap bound: every question takes the exact clock.
#[cfg(not(all(
    target_os = "linux",
    target_arch = "x86_64",
    not(miri),
    not(expiremap_loom)
)))]
mod tsc {
    pub(super) fn init() {}

    #[inline]
    pub(super) fn bound(_: &super::SystemClock) -> u64 {
        u64::MAX
    }

    #[inline]
    pub(super) fn learn(_: &super::SystemClock, _now: u64, _bound: u64) {}
}

/// A source of monotonic time, in nanoseconds since the clock's origin.
///
/// ```
/// use expiremap::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// assert_eq!(clock.now(), 0);
/// clock.advance(Duration::from_millis(3));
/// assert_eq!(clock.now(), 3_000_000);
/// ```
///
/// # Called under a shard lock
///
/// A map reads its clock *after* it has taken the shard lock of the entry
/// an operation works on, so that whether an entry has expired is decided
/// with the time at which the operation acts, however long it waited for
/// the lock. An operation with nothing to judge by the time reads none: a
/// read in a shard that never held an entry with a deadline, or a put of
/// an entry that never expires into such a shard (in a bounded map, while
/// no other shard holds one either), with neither idle expiry nor refresh
/// ahead on; what such a put pushes out is published with the time read
/// after the unlock. `now` runs while that lock is held: it must be quick,
/// and it must not call into a map that uses this clock (that would wait on
/// the lock it is called under). A panic in `now` propagates to the caller
/// and leaves the map unchanged.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since the clock's origin. Must never decrease (a reading
    /// below an earlier one is taken as the earlier one).
    fn now(&self) -> u64;

    /// `true` if time passes on its own (the eviction thread may sleep for a
    /// real duration); `false` for virtual clocks, which wake watchers instead.
    fn is_real_time(&self) -> bool {
        true
    }

    /// Registers `wake`, to be called after every change of a virtual clock.
    /// Returns a key for [`Clock::unwatch`], or `None` if the clock never
    /// calls wakers (real-time clocks). The default does nothing.
    fn watch(&self, wake: Box<dyn Fn() + Send + Sync>) -> Option<u64> {
        drop(wake);
        None
    }

    /// Removes a waker registered by [`Clock::watch`].
    fn unwatch(&self, key: u64) {
        let _ = key;
    }
}

/// The default clock: the operating system's monotonic clock
/// (`CLOCK_MONOTONIC`), in nanoseconds since this clock was created.
///
/// On Linux it calls `clock_gettime` directly: 36 ns per read on the
/// development VM, against 49 ns through `Instant::now()` and its checked
/// conversions. `quanta` (TSC) reads in 15 ns but was rejected: its raw reads
/// stepped back by ~70 ns across a thread handoff and its calibrated time
/// drifts from the OS clock by ~2 ppm, and a map that promises never to
/// return an expired value needs a clock that is monotonic across threads.
/// Numbers and method: `benches/benches/clock.rs`, BENCHMARKS.md. Elsewhere
/// it uses `std::time::Instant`.
///
/// [`Clock::now`] is always that exact reading. A map's lookups (`get`,
/// `contains_key`) only need to know whether a deadline has passed, and on
/// x86-64 Linux with the TSC as the kernel's clocksource they first try a
/// cheap, provably safe *upper bound* on the time from an unfenced TSC read
/// (`src/clock/tsc.rs`); only an entry within ~0.1-0.5 ms of its deadline
/// needs the exact reading. The exact read's fence stops consecutive
/// lookups from overlapping their cache misses: over 10^6 entries a `get`
/// went from 435 to 320 ns in the compare bench when the bound came in (377
/// to ~190 ns in a bare loop), ~200 ns once the bound's arithmetic became
/// one 64-bit multiply, and ~165 ns since the map reads it after starting
/// the lookup's first cache miss (an unfenced TSC read does not wait for
/// earlier loads, but on this project's AMD machine it is ~36 micro-ops,
/// which crowd the out-of-order window); BENCHMARKS.md has the runs.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    #[cfg(target_os = "linux")]
    origin: u64,
    #[cfg(not(target_os = "linux"))]
    origin: Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        tsc::init();
        #[cfg(target_os = "linux")]
        let origin = monotonic_ns();
        #[cfg(not(target_os = "linux"))]
        let origin = Instant::now();
        Self { origin }
    }
}

impl SystemClock {
    /// A cheap upper bound on [`now`](Clock::now), or `u64::MAX` when there
    /// is none (yet). A lookup that only needs to know whether a deadline has
    /// passed reads this first: `bound <= deadline` proves the entry live
    /// without the exact clock read (fenced, which in a loop of lookups
    /// costs far more than its own 36 ns; see `clock/tsc.rs`).
    #[inline]
    pub(crate) fn now_at_most(&self) -> u64 {
        tsc::bound(self)
    }

    /// The exact [`now`](Clock::now), read after `bound` (from
    /// [`now_at_most`](Self::now_at_most)) did not settle a question. It also
    /// lets the bound calibrate itself and re-anchor this thread.
    #[inline]
    pub(crate) fn now_after(&self, bound: u64) -> u64 {
        let now = self.now();
        tsc::learn(self, now, bound);
        now
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds (since boot; saturating after ~584
/// years).
#[cfg(target_os = "linux")]
#[inline]
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` for the duration of the
    // call, and `CLOCK_MONOTONIC` is supported by every Linux kernel (since
    // 2.6), so the call only writes `ts`. Its result is checked anyway.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> u64 {
        #[cfg(target_os = "linux")]
        {
            monotonic_ns().saturating_sub(self.origin)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let d = Instant::now().saturating_duration_since(self.origin);
            d.as_secs()
                .saturating_mul(1_000_000_000)
                .saturating_add(u64::from(d.subsec_nanos()))
        }
    }
}

/// Virtual time for tests and simulations.
///
/// Clones share one time. Time only moves forward, by [`ManualClock::advance`],
/// and every advance wakes the eviction thread of each map built on this clock,
/// so background eviction follows virtual time deterministically.
///
/// ```
/// use expiremap::{ExpireMap, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let map = ExpireMap::<&str, u32>::builder()
///     .clock(clock.clone())
///     .background_eviction(false)
///     .build();
/// map.put("a", 1, Duration::from_millis(10));
/// clock.advance(Duration::from_millis(10));
/// assert_eq!(map.get("a"), Some(1)); // the deadline is inclusive
/// clock.advance(Duration::from_nanos(1));
/// assert_eq!(map.get("a"), None);
/// ```
#[derive(Clone)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

struct ManualInner {
    now: AtomicU64,
    watchers: Mutex<Watchers>,
}

#[derive(Default)]
struct Watchers {
    next_key: u64,
    list: Vec<(u64, Box<dyn Fn() + Send + Sync>)>,
}

impl ManualClock {
    /// A virtual clock at time 0.
    pub fn new() -> Self {
        Self::starting_at(0)
    }

    /// A virtual clock at `nanos` nanoseconds.
    pub fn starting_at(nanos: u64) -> Self {
        Self {
            inner: Arc::new(ManualInner {
                now: AtomicU64::new(nanos),
                watchers: Mutex::new(Watchers::default()),
            }),
        }
    }

    /// Moves time forward by `by` (saturating at `u64::MAX` nanoseconds) and
    /// wakes every watcher.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let mut cur = self.inner.now.load(Ordering::Acquire);
        loop {
            let next = cur.saturating_add(by);
            match self.inner.now.compare_exchange_weak(
                cur,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(seen) => cur = seen,
            }
        }
        let watchers = self.inner.watchers.lock();
        for (_, wake) in &watchers.list {
            wake();
        }
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now", &self.now())
            .finish()
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        self.inner.now.load(Ordering::Acquire)
    }

    fn is_real_time(&self) -> bool {
        false
    }

    fn watch(&self, wake: Box<dyn Fn() + Send + Sync>) -> Option<u64> {
        let mut w = self.inner.watchers.lock();
        let key = w.next_key;
        w.next_key += 1;
        w.list.push((key, wake));
        Some(key)
    }

    fn unwatch(&self, key: u64) {
        let removed = {
            let mut w = self.inner.watchers.lock();
            w.list
                .iter()
                .position(|(k, _)| *k == key)
                .map(|i| w.list.swap_remove(i))
        };
        // The waker is dropped outside the lock.
        drop(removed);
    }
}

#[cfg(all(test, not(expiremap_loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn manual_clock_clones_share_time_and_saturate() {
        let a = ManualClock::starting_at(u64::MAX - 5);
        let b = a.clone();
        a.advance(Duration::from_nanos(3));
        assert_eq!(b.now(), u64::MAX - 2);
        b.advance(Duration::from_secs(1));
        assert_eq!(a.now(), u64::MAX);
        a.advance(Duration::MAX);
        assert_eq!(a.now(), u64::MAX);
    }

    #[test]
    fn manual_clock_wakes_watchers_until_unwatched() {
        let clock = ManualClock::new();
        let hits = std::sync::Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let key = clock
            .watch(Box::new(move || {
                h.fetch_add(1, Ordering::SeqCst);
            }))
            .unwrap();
        clock.advance(Duration::from_millis(1));
        clock.advance(Duration::ZERO);
        assert_eq!(hits.load(Ordering::SeqCst), 2);
        clock.unwatch(key);
        clock.advance(Duration::from_millis(1));
        assert_eq!(hits.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_deadline_met_without_a_bound_is_judged_with_the_exact_time() {
        // `now_at_most_if(false)` (a shard without deadlines) gives no
        // bound: a finite deadline met with it still reads the clock.
        let manual = Time::new(ManualClock::starting_at(100));
        assert_eq!(manual.now_at_most_if(false), u64::MAX);
        assert_eq!(manual.now_at_most_if(true), 100);
        assert!(manual.live(u64::MAX, u64::MAX));
        assert!(manual.live(u64::MAX, 100));
        assert!(!manual.live(u64::MAX, 99));
        assert!(!manual.live(100, 99), "an exact reading settles it");

        let system = Time::new(SystemClock::new());
        std::thread::sleep(Duration::from_millis(1));
        assert!(!system.live(u64::MAX, 0));
        assert!(system.live(u64::MAX, u64::MAX - 1));
    }

    #[test]
    fn system_clock_is_monotonic() {
        let c = SystemClock::new();
        let mut last = c.now();
        for _ in 0..1000 {
            let t = c.now();
            assert!(t >= last);
            last = t;
        }
        assert!(c.is_real_time());
        assert_eq!(c.watch(Box::new(|| {})), None);
    }
}

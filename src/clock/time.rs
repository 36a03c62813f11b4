//! [`Time`]: how the map reads its [`Clock`]. The default clock is read
//! without dynamic dispatch; a user clock behind a guard that never lets a
//! reading go below an earlier one. [`Time::around`] holds the one rule of
//! when a reading is taken (after the lock, after the first prefetch).
//!
//! Owns no lock and runs no user code but the user clock's `now`.

use super::{Clock, SystemClock};
use crate::sync::{AtomicU64, Ordering};

/// The clock, with the default clock called without dynamic dispatch.
pub(crate) enum Time {
    System(SystemClock),
    /// A user clock, guarded so that a reading never goes below an earlier one.
    Other {
        clock: Box<dyn Clock>,
        high: AtomicU64,
    },
}

impl Time {
    /// Wraps `clock`, recognising the default clock so that it is read
    /// without dynamic dispatch or the monotonic guard.
    pub(crate) fn new<C: Clock>(clock: C) -> Self {
        match (&clock as &dyn std::any::Any).downcast_ref::<SystemClock>() {
            Some(sys) => Time::System(*sys),
            None => Time::Other {
                high: AtomicU64::new(clock.now()),
                clock: Box::new(clock),
            },
        }
    }

    #[inline]
    pub(crate) fn now(&self) -> u64 {
        match self {
            Time::System(c) => c.now(),
            Time::Other { clock, high } => {
                let t = clock.now();
                high.fetch_max(t, Ordering::Relaxed).max(t)
            }
        }
    }

    /// An upper bound on [`now`](Self::now): a cheap one for the default
    /// clock, the exact time for a user clock (which has no cheap bound).
    #[inline]
    pub(crate) fn now_at_most(&self) -> u64 {
        match self {
            Time::System(c) => c.now_at_most(),
            Time::Other { .. } => self.now(),
        }
    }

    /// [`now_at_most`](Self::now_at_most) if `timed` (a shard that may hold
    /// an entry with a deadline), else `u64::MAX` without reading the clock:
    /// every deadline there is `u64::MAX`, which [`live`](Self::live) finds
    /// live with any bound. The flag only saves the read: were a finite
    /// deadline met with the `u64::MAX` bound, `live` reads the exact time.
    #[inline]
    pub(crate) fn now_at_most_if(&self, timed: bool) -> u64 {
        if timed { self.now_at_most() } else { u64::MAX }
    }

    /// [`now_at_most_if`](Self::now_at_most_if)`(timed)`, read at most once
    /// and only when first needed (see [`BoundOnce`]).
    #[inline]
    pub(crate) fn bound_once(&self, timed: bool) -> BoundOnce<'_> {
        BoundOnce {
            time: self,
            timed,
            bound: std::cell::Cell::new(None),
        }
    }

    /// `true` if `deadline` has not passed, given `bound` from
    /// [`now_at_most`](Self::now_at_most), read under the same shard lock.
    /// With a `bound` read later (after the lock, `get_many`'s
    /// `prove_live`), `true` still proves the deadline had not passed at
    /// every earlier instant (both the bound and the time read here only
    /// grow); `false` then proves nothing about them.
    #[inline]
    pub(crate) fn live(&self, bound: u64, deadline: u64) -> bool {
        bound <= deadline
            || match self {
                Time::System(c) => c.now_after(bound) <= deadline,
                // The bound was the exact time, unless it was no bound
                // (`now_at_most_if` of an untimed shard).
                Time::Other { .. } => bound == u64::MAX && self.now() <= deadline,
            }
    }

    /// Takes `lock`, starts loading what the operation touches first with
    /// `warm` (its table slot), and only then reads the time with `read`,
    /// which is given the guard (a shard with nothing to judge by the time
    /// lets it read none: `Shard::timed`, `Inner::put_time`).
    ///
    /// The time is read *after* the lock is held, whatever the clock: every
    /// decision an operation makes about "expired or not" must hold at the
    /// instant it acts, and a reading taken before waiting for the lock can
    /// be any amount older than that (a slow lock holder, a preempted
    /// thread). So a user [`Clock`] runs under the shard lock; its docs say
    /// what that asks of it.
    ///
    /// Why after `warm`: a clock read holds up the instructions after it.
    /// The exact read has the vDSO's fence, which waits for every earlier
    /// load; the cheap bound's unfenced `rdtsc` does not wait for loads, but
    /// its micro-ops fill the out-of-order window ahead of this operation's
    /// loads. After a prefetch (which nothing waits for) this operation's
    /// first cache miss is already in flight (BENCHMARKS.md, "lookup_loop").
    #[inline(always)]
    pub(crate) fn around<G, W, T>(
        &self,
        lock: impl FnOnce() -> G,
        warm: impl FnOnce(&G) -> W,
        read: impl FnOnce(&Time, &G) -> T,
    ) -> (G, W, T) {
        let guard = lock();
        let w = warm(&guard);
        let t = match self {
            // A local copy: `read` need not load and test the variant again
            // after the lock (an atomic operation, after which the compiler
            // must reload `self`).
            &Time::System(c) => read(&Time::System(c), &guard),
            Time::Other { .. } => read(self, &guard),
        };
        (guard, w, t)
    }

    pub(crate) fn clock(&self) -> &dyn Clock {
        match self {
            Time::System(c) => c,
            Time::Other { clock, .. } => clock.as_ref(),
        }
    }
}

/// The cheap bound on the clock ([`Time::now_at_most_if`]), read at most
/// once, when first needed: a read's probe calls [`read`](Self::read) at
/// its first slot whose tag matches, just before it reads that slot's
/// node, and [`live`](Self::live) judges what it found. So a miss reads no
/// clock (an unfenced `rdtsc` costs ~22 ns on the development VM, more
/// than a small map's whole miss), and a hit's read overlaps the node's
/// cache miss (read after the node, it made a large map's hit wait for
/// it). Made under the shard's lock, like every reading of the time.
pub(crate) struct BoundOnce<'a> {
    time: &'a Time,
    timed: bool,
    bound: std::cell::Cell<Option<u64>>,
}

impl BoundOnce<'_> {
    /// Reads the bound, unless it was read.
    #[inline]
    pub(crate) fn read(&self) -> u64 {
        match self.bound.get() {
            Some(b) => b,
            None => {
                let b = self.time.now_at_most_if(self.timed);
                self.bound.set(Some(b));
                b
            }
        }
    }

    /// Whether `deadline` has not passed ([`Time::live`]), against the
    /// bound (read now if it was not).
    #[inline]
    pub(crate) fn live(&self, deadline: u64) -> bool {
        self.time.live(self.read(), deadline)
    }
}

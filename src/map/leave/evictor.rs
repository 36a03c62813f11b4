//! The background eviction thread: its loop and passes (`run_evictor`,
//! `evict_all`, on [`Inner`]), and how others wake it ([`Signal`]).
//!
//! The room's rules: the loop takes shard locks only inside a pass (one
//! bounded batch per hold) and to read a shard's next wake-up when it
//! plans; it runs no user code under a lock; evicted values are published
//! or dropped outside every lock, and a panic in their `Drop` never cuts a
//! pass short (the loop catches it and retries at once).
//!
//! # Protocol
//!
//! The thread alternates *plan*, *wait*, *pass*:
//!
//! 1. **Plan.** It stores `planned = NONE_PLANNED` ("every put must kick"),
//!    then reads each shard's next wake-up under its read lock and sets
//!    `target = max(earliest wake-up, last pass + interval)` (or never, for an
//!    empty map). Under the state mutex it stores `planned = target`.
//! 2. **Wait** on the condvar until `now >= target` or shutdown. A kick
//!    carries the time its entry becomes evictable and brings `target`
//!    forward to it (not before `last pass + interval`), publishing the new
//!    `planned`; reaching `target` leads to *pass*.
//!    With a virtual clock it waits without a timeout: the clock's `advance`
//!    notifies it.
//! 3. **Pass.** Evicts everything due, shard by shard, in bounded batches
//!    that release the shard lock between them.
//!
//! A writer whose new eviction time is earlier than `planned` kicks the
//! thread (lowers `kicked` to that time under the mutex and notifies). It
//! reads `planned` *inside* the shard's write lock. So either the thread's plan-time read of
//! that shard comes after the write (and sees the entry), or the writer's read
//! of `planned` comes after the plan's store of `NONE_PLANNED` (lock order
//! makes it so) and sees `NONE_PLANNED` or the new target: no wake-up is lost.
//! An idle map plans "never" and waits with no timeout: zero wake-ups.

use crate::map::store::shard::{Removed, Shard};
use crate::map::{Config, EVICT_BATCH, Inner, PRECASCADE_BATCH, PRECASCADE2_PER_PASS};
use crate::sync::{self, AtomicBool, AtomicU64, Condvar, Mutex, Ordering};
use crate::unwind::Panics;
use std::hash::{BuildHasher, Hash};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

/// Due entries a write takes from its shard per call, under the lock it
/// already holds (see [`Inner::take_due`]). A put makes one entry, so a
/// few per write let writers catch up a backlog; each costs the write a
/// cache miss or two, under its lock. Measured against 4 and 16 during a
/// mass expiry (`benches/eviction_holds.rs`, BENCHMARKS.md): 8 had the
/// lowest put p99.9. One under loom, like `EVICT_BATCH`.
pub(in crate::map) const WRITER_EVICT: usize = if cfg!(expiremap_loom) { 1 } else { 8 };

/// The ticks of `2^shift` ns a shard may go without an eviction that
/// leaves nothing due before its writes take due entries (see [`Inner::take_due`]): the thread's
/// promise, one `interval` plus one `precision`, rounded up. Within it the
/// due entries are the thread's, so a write costs nothing more while the
/// thread keeps up; past it the thread is behind (starved of CPU, or
/// outpaced by writers), and the writers that make the entries take them.
/// Under loom, zero: every due entry is fair game, so that the models reach
/// the race with few steps.
pub(in crate::map) fn writer_lag(config: &Config, shift: u32) -> u64 {
    if cfg!(expiremap_loom) {
        return 0;
    }
    let lag = config.interval.saturating_add(config.precision);
    (lag >> shift) + u64::from(lag & ((1 << shift) - 1) != 0)
}

/// What a write took from its shard's due entries (see
/// [`Inner::take_due`]): left after the unlock by
/// [`leave_due`](Inner::leave_due).
pub(in crate::map) struct Due<K, V> {
    batch: Vec<Removed<K, V>>,
    /// The time they were evicted at (every deadline is below it).
    at: u64,
}

/// `planned` while the thread is (re)planning or has nothing planned: every
/// new eviction time is earlier, or equal (`u64::MAX`, the end of a clock's
/// range), and a writer kicks for both (see
/// [`needs_kick`](Signal::needs_kick)). Only `planned` uses this value;
/// [`wait`](Signal::wait) takes "nothing planned" as `None`, so a clock at
/// `u64::MAX` never makes "nothing planned" due.
pub(crate) const NONE_PLANNED: u64 = u64::MAX;

#[derive(Debug, Default)]
struct State {
    shutdown: bool,
    /// The earliest eviction time writers kicked for since the thread last
    /// looked.
    kicked: Option<u64>,
}

/// Shared between the map, its thread and the clock's waker.
#[derive(Debug)]
pub(crate) struct Signal {
    state: Mutex<State>,
    cv: Condvar,
    /// Clock time (ns) of the thread's next planned pass.
    planned: AtomicU64,
    /// Set once shutdown has begun; lets the thread skip work early.
    stopping: AtomicBool,
    /// Times the thread returned from a wait (for idle-cost checks).
    pub(crate) wakeups: AtomicU64,
    /// Passes made.
    pub(crate) passes: AtomicU64,
}

/// Why a wait ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The planned time was reached: make a pass.
    Due,
    /// The map is shutting down.
    Shutdown,
    /// The time to publish the metrics came before the planned pass (see
    /// [`Signal::wait`]'s `publish_at`).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    Publish,
}

impl Signal {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            planned: AtomicU64::new(NONE_PLANNED),
            stopping: AtomicBool::new(false),
            wakeups: AtomicU64::new(0),
            passes: AtomicU64::new(0),
        }
    }

    /// Called inside a shard's write lock by a writer whose entry becomes
    /// evictable at `evict_at` (clock ns): does the thread need a kick?
    #[inline]
    pub(crate) fn needs_kick(&self, evict_at: u64) -> bool {
        let planned = self.planned.load(Ordering::SeqCst);
        // A wake-up at `u64::MAX` kicks a thread planning nothing: that value
        // of `planned` cannot tell "nothing" from "at u64::MAX", and one
        // extra plan is harmless. Entries that never expire have no
        // eviction time (the caller does not ask).
        evict_at < planned || planned == NONE_PLANNED
    }

    /// Wakes the thread for an entry evictable at `at`, earlier than its
    /// plan: the thread brings its target forward to it (no new plan).
    /// Called after the shard lock is released.
    pub(crate) fn kick(&self, at: u64) {
        let mut st = self.state.lock();
        st.kicked = Some(st.kicked.map_or(at, |k| k.min(at)));
        self.cv.notify_one();
    }

    /// Wakes the thread to look at the clock again (virtual clocks).
    pub(crate) fn time_changed(&self) {
        let _st = self.state.lock();
        self.cv.notify_one();
    }

    /// Asks the thread to stop, and wakes it.
    pub(crate) fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let mut st = self.state.lock();
        st.shutdown = true;
        self.cv.notify_all();
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Step 1a: every writer kicks until [`wait`](Self::wait) stores a target.
    pub(crate) fn begin_plan(&self) {
        self.planned.store(NONE_PLANNED, Ordering::SeqCst);
    }

    /// Step 2: publishes `target` (`None`: nothing planned) and waits for
    /// it or shutdown. A kick brings the target forward to the kicked time
    /// (never before `floor`, the end of the least interval after the last
    /// pass) and publishes it, without a new plan: a plan reads every
    /// shard, and with many shards a plan redone on every kick could starve
    /// the passes while writers keep kicking. `now` reads the clock;
    /// `real_time` says whether timed waits are real. `publish_at`: the
    /// time (clock ns) to return [`Wake::Publish`] if no pass is due by
    /// then (the metrics' deadline; `None` without metrics): it caps the
    /// wait, and never brings a pass forward.
    pub(crate) fn wait(
        &self,
        mut target: Option<u64>,
        floor: u64,
        real_time: bool,
        publish_at: Option<u64>,
        now: impl Fn() -> u64,
    ) -> Wake {
        let mut st = self.state.lock();
        self.planned
            .store(target.unwrap_or(NONE_PLANNED), Ordering::SeqCst);
        loop {
            if st.shutdown {
                return Wake::Shutdown;
            }
            if let Some(at) = st.kicked.take() {
                let at = at.max(floor);
                let earlier = target.map_or(at, |t| t.min(at));
                target = Some(earlier);
                self.planned.store(earlier, Ordering::SeqCst);
            }
            // Until the pass, or until the metrics are due if sooner.
            let until = match (target, publish_at) {
                (Some(t), Some(p)) => Some(t.min(p)),
                (t, p) => t.or(p),
            };
            match until {
                Some(until) => {
                    let t = now();
                    if target.is_some_and(|target| t >= target) {
                        return Wake::Due;
                    }
                    if t >= until {
                        return Wake::Publish;
                    }
                    if real_time {
                        self.cv.wait_for(&mut st, Duration::from_nanos(until - t));
                    } else {
                        self.cv.wait(&mut st);
                    }
                }
                None => self.cv.wait(&mut st),
            }
            self.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Driving eviction by hand: what a map built with
/// `background_eviction(false)` calls in place of the thread.
impl<K, V, S> crate::map::ExpireMap<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// Runs eviction now on the calling thread: evicts every entry that is
    /// due when it starts (up to one precision after its deadline), in
    /// bounded batches. Returns the number evicted.
    #[doc(alias = "run_pending_tasks")]
    pub fn evict_expired(&self) -> usize {
        self.inner.evict_all()
    }

    /// How long until [`evict_expired`](Self::evict_expired) has work:
    /// advancing the clock by it and then calling `evict_expired` always
    /// makes progress, so a loop of the two ends. `None` if the map is empty.
    /// An entry whose deadline saturated (a `ttl` that reaches past the
    /// clock's range) never expires, but the timer index may still report
    /// work for it near the end of the clock's range (where it moves the
    /// entry within the index and evicts nothing): then this is centuries
    /// away, and, once the clock is there, a few short waits before `None`.
    /// A wake-up hint for maps driven without the background thread.
    ///
    /// ```
    /// use expiremap::{ExpireMap, ManualClock};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let map = ExpireMap::<u32, u32>::builder()
    ///     .clock(clock.clone())
    ///     .background_eviction(false)
    ///     .build();
    /// map.put(1, 1, Duration::from_millis(5));
    /// map.put(2, 2, Duration::MAX); // saturates: never expires
    /// while let Some(d) = map.next_expiry() {
    ///     clock.advance(d);
    ///     map.evict_expired();
    /// }
    /// assert_eq!((map.len(), map.get(&1), map.get(&2)), (1, None, Some(2)));
    /// ```
    pub fn next_expiry(&self) -> Option<Duration> {
        let at = self.inner.next_wakeup()?;
        Some(Duration::from_nanos(
            at.saturating_sub(self.inner.clock.now()),
        ))
    }
}

/// The eviction loop and the passes it makes: what the thread does between
/// its waits on [`Signal`], and what [`evict_expired`] runs on the calling
/// thread.
///
/// [`evict_expired`]: crate::map::ExpireMap::evict_expired
impl<K, V, S> Inner<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// Evicts everything due when each batch takes its shard's lock, and
    /// walks each shard's timers of its next wheel slot ahead of time
    /// ([`Shard::precascade`]). Returns how many entries left.
    ///
    /// Each batch reads the time under the lock it evicts under, and the
    /// shard never evicts at a time below one it has already reached (see
    /// [`Shard::evict`]): two callers at once, or a caller that waited long
    /// for a lock, can only evict entries past their deadline, and each
    /// event's removal time is at least its deadline + 1 ns.
    pub(in crate::map) fn evict_all(&self) -> usize {
        let mut total = 0;
        let mut batch = Vec::with_capacity(EVICT_BATCH);
        let mut panics = Panics::new();
        for shard in self.shards.iter() {
            let mut ahead2 = PRECASCADE2_PER_PASS;
            loop {
                let (more, now) = {
                    let (mut guard, (), now) =
                        self.clock.around(|| shard.write(), |_| (), |t, _| t.now());
                    let (more, at) = guard.evict(now, EVICT_BATCH, &mut batch);
                    // Nothing due: walk the timers of the wheel's next
                    // slot ahead of time, in holds of their own.
                    (more || guard.precascade(PRECASCADE_BATCH, &mut ahead2), at)
                };
                total += batch.len();
                self.evicted
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                self.leave_evicted(&mut batch, now, &mut panics);
                if !more {
                    break;
                }
            }
        }
        panics.resume();
        total
    }

    /// Under `shard`'s write lock, with `now` read under it by a write:
    /// when no eviction has drained the shard's due entries for
    /// [`writer_lag`] ticks (the thread is behind its
    /// own promise of one interval plus one precision), or an earlier
    /// write's eviction left entries due, takes up to [`WRITER_EVICT`] of
    /// its due entries, by the rule the thread's passes follow
    /// ([`Shard::evict`]: only entries whose timer tick has passed, so never
    /// one before its deadline). Once evicted, an entry is out of the table
    /// and the wheel, so no pass, read or other write can find it: each
    /// value leaves once. Otherwise (the usual case: the thread keeps up)
    /// it costs a load and a comparison and leaves the work to the
    /// thread, whose batches cost less per entry than a write's. The caller
    /// hands the result to [`leave_due`](Self::leave_due) after the unlock.
    #[inline]
    pub(in crate::map) fn take_due(&self, shard: &mut Shard<K, V>, now: u64) -> Option<Due<K, V>> {
        if !shard.writers_evict(now) {
            return None;
        }
        Self::take_due_slow(shard, now)
    }

    #[cold]
    #[inline(never)]
    fn take_due_slow(shard: &mut Shard<K, V>, now: u64) -> Option<Due<K, V>> {
        // Allocated at the first entry taken: usually the wake-up only
        // moves timers between the wheel's levels.
        let mut batch = Vec::new();
        let (more, at) = shard.evict(now, WRITER_EVICT, &mut batch);
        if more {
            shard.writers_continue();
        }
        // Empty if the wake-up only moved timers between the wheel's levels.
        (!batch.is_empty()).then_some(Due { batch, at })
    }

    /// Publishes (as `Expired`) or drops what a write took with
    /// [`take_due`](Self::take_due), after the unlock, counted in
    /// `evicted` and `max_lateness` as the thread counts its own. A panic
    /// in a value's `Drop` is caught and dropped (as [`leave`](Self::leave)
    /// does), so the write it rode on still returns; every other value of
    /// the batch still leaves.
    #[inline]
    pub(in crate::map) fn leave_due(&self, due: Option<Due<K, V>>) {
        if let Some(due) = due {
            self.leave_due_slow(due);
        }
    }

    #[cold]
    #[inline(never)]
    fn leave_due_slow(&self, mut due: Due<K, V>) {
        let n = due.batch.len() as u64;
        self.evicted.fetch_add(n, Ordering::Relaxed);
        self.evicted_by_writers.fetch_add(n, Ordering::Relaxed);
        let mut panics = Panics::new();
        self.leave_evicted(&mut due.batch, due.at, &mut panics);
        panics.forget();
    }

    /// Earliest shard wake-up, in clock ns.
    pub(in crate::map) fn next_wakeup(&self) -> Option<u64> {
        self.shards
            .iter()
            .filter_map(|s| s.read().next_wakeup())
            .min()
    }

    /// The eviction thread's loop. User panics (from `Drop` of evicted values
    /// or from event delivery) are caught: a pass that panicked is retried
    /// at once, with nothing lost (entries leave their shard only inside
    /// `evict`, which runs no user code).
    pub(in crate::map) fn run_evictor(&self) {
        let signal = &*self.signal;
        let real_time = self.clock.clock().is_real_time() && sync::TIMED_WAITS;
        let mut last_pass: Option<u64> = None;
        // With metrics: when to publish next (at least once a second).
        #[cfg(feature = "metrics")]
        // The first is due a second after the map was built, however late
        // the thread starts.
        let mut publish_at = self
            .metrics
            .as_ref()
            .map(|m| m.built.saturating_add(crate::map::monitor::PUBLISH_EVERY));
        #[cfg(not(feature = "metrics"))]
        let publish_at = None;
        loop {
            signal.begin_plan();
            let floor = last_pass.map_or(0, |last| last.saturating_add(self.config.interval));
            let target = self.next_wakeup().map(|t| t.max(floor));
            match signal.wait(target, floor, real_time, publish_at, || self.clock.now()) {
                Wake::Shutdown => return,
                Wake::Due => {}
                Wake::Publish => {
                    // No pass: the plan is made again, with `last_pass`
                    // (so the least interval) unchanged.
                    #[cfg(feature = "metrics")]
                    self.publish_now(&mut publish_at);
                    continue;
                }
            }
            // When the pass starts: each batch reads the time again under
            // its lock, never earlier than this.
            let now = self.clock.now();
            // A pass cut short by a panicking user `Drop` left due entries
            // behind: it does not count, so the next plan retries at once.
            if catch_unwind(AssertUnwindSafe(|| self.evict_all())).is_ok() {
                last_pass = Some(now);
            }
            signal.passes.fetch_add(1, Ordering::Relaxed);
            if signal.is_stopping() {
                return;
            }
            // Passes every few ms would keep `Publish` from ever waking it.
            #[cfg(feature = "metrics")]
            if publish_at.is_some_and(|p| self.clock.now() >= p) {
                self.publish_now(&mut publish_at);
            }
        }
    }

    /// The thread's publication of the metrics: the recorder is user code,
    /// so a panic in it is caught (the thread goes on); the next is due
    /// [`PUBLISH_EVERY`](crate::map::monitor::PUBLISH_EVERY) from now.
    #[cfg(feature = "metrics")]
    fn publish_now(&self, publish_at: &mut Option<u64>) {
        let _ = catch_unwind(AssertUnwindSafe(|| self.publish()));
        *publish_at = Some(
            self.clock
                .now()
                .saturating_add(crate::map::monitor::PUBLISH_EVERY),
        );
    }
}

//! The shared state of one broadcast area: the ring, the reader registry,
//! the writer protocol (reserve, write, publish, cleanup), taking freed
//! values out of their slots (clearing, reclaim runs) and who sleeps on the
//! area.
//!
//! Owns every field of [`Inner`]; the sender and receiver modules touch the
//! ring only through the methods here (and, for slot reads, through
//! [`Inner::slot`] under the rules of the parent module).
//!
//! The ground rules (generation encoding, who writes which field, the
//! happens-before edges) are in the parent module's documentation; every
//! `// SAFETY:` comment below refers to them by name.

use crate::sync::futex::{Condvar, Mutex, MutexGuard};
use crate::sync::{AtomicU64, AtomicUsize, CachePadded, Ordering, UnsafeCell, spin_loop, thread};
use std::task::Waker;

/// Top bit of a reader counter: the reader is suspended (holds no claim and
/// may be force-advanced by cleanup).
pub(super) const SUSPENDED: u64 = 1 << 63;

/// Top bit of `read_gen`: a receiver may be asleep (a thread parked on the
/// condition variable, or a task whose waker is in [`Sleepers`]), so the
/// next publish (or the last sender's drop) must notify.
pub(super) const WAITING: u64 = 1 << 63;

/// The low 63 bits of a counter: a sequence number.
pub(super) const SEQ: u64 = !(1 << 63);

/// `Inner::reclaim` bit: a reclaim run is in progress; its runner is the
/// only thread that clears the bits.
const RUNNING: usize = 1;

/// `Inner::reclaim` bit: a reader moved (or left) since the run in progress
/// last scanned the registry, so that run scans again before it ends.
const AGAIN: usize = 2;

/// `Inner::reclaim` bit: a run ended after [`MAX_PASSES`] scans with moves
/// still unscanned, or a reader joined (a run may have seen its slot's old
/// counter), so the next receive runs whether or not it moved.
const PENDING: usize = 4;

/// Scans one reclaim run makes at most: while readers keep moving, a run
/// would otherwise keep one receive serving the others for as long as
/// they do.
const MAX_PASSES: u32 = 4;

/// Spins this many rounds (doubling each time) before yielding the thread.
const SPIN_ROUNDS: u32 = 6;

/// Wakers a notify takes out per hold of the lock; it wakes them after
/// releasing it (a waker is user code), then comes back for the next ones.
pub(super) const WAKE_BATCH: usize = 8;

/// Who is asleep on an area: the state behind `Inner::lock`, touched only
/// with it held.
pub(super) struct Sleepers {
    /// Threads inside `Inner::park`. A notify skips the condition variable
    /// (a system call even with nobody on it) when this is 0.
    threads: usize,
    /// The waker of the async receive of each registry slot, if it is
    /// asleep. Set by its receiver; taken by a notify or by the receiver.
    wakers: Box<[Option<Waker>]>,
    /// How many of `wakers` are `Some`.
    registered: usize,
}

impl Sleepers {
    fn new(max_readers: usize) -> Self {
        Self {
            threads: 0,
            wakers: (0..max_readers).map(|_| None).collect(),
            registered: 0,
        }
    }

    /// Takes the waker of slot `i`, if any.
    fn take(&mut self, i: usize) -> Option<Waker> {
        let w = self.wakers[i].take();
        self.registered -= usize::from(w.is_some());
        w
    }

    /// Nobody is asleep: no publish needs to notify.
    fn is_empty(&self) -> bool {
        self.threads == 0 && self.registered == 0
    }
}

/// The state shared by every handle of one area.
pub(super) struct Inner<T> {
    /// Next sequence number to reserve. CAS by writers only.
    write_gen: CachePadded<AtomicU64>,
    /// Every sequence below `read_gen & SEQ` is published. Low bits moved by
    /// the writer that owns the next sequence (swap); `WAITING` set by
    /// parking receivers (`fetch_or`), cleared by publish and close.
    read_gen: CachePadded<AtomicU64>,
    /// Every sequence below it is freed: no reader reads it again.
    /// Raised by cleanup (`fetch_max`), read by clearing and writers.
    last_valid: CachePadded<AtomicU64>,
    /// Next freed sequence whose value to take out of its slot: claimed by
    /// CAS `d -> d + 1` (while `d < last_valid`) by whoever clears `d`.
    clear_gen: CachePadded<AtomicU64>,
    /// Every sequence below it was taken out: its slot is empty and the
    /// writer of `seq + capacity` may write it. Stored in order by the
    /// claimant of each sequence; read by writers before they reserve.
    cleared: CachePadded<AtomicU64>,
    /// Reclaim runs: `RUNNING | AGAIN` bits. A reader that moved sets
    /// `AGAIN`; the one that finds no run in progress becomes the runner.
    reclaim: CachePadded<AtomicUsize>,
    /// The ring. `None` is an empty (cleared) slot or a tombstone.
    slots: Box<[UnsafeCell<Option<T>>]>,
    /// `capacity - 1`; the capacity is a power of two.
    mask: u64,
    /// Generation of sequence 0: `generation = origin + seq` (wrapping).
    /// Always 0 except in the test-only constructor.
    origin: u64,
    /// One counter per registry slot: `SUSPENDED | seq` or an active `seq`.
    readers: Box<[CachePadded<AtomicU64>]>,
    /// Bit `i % 64` of word `i / 64` is set while a `Receiver` owns
    /// registry slot `i`: one load tells a scan which of 64 slots to visit.
    taken: Box<[AtomicU64]>,
    /// Joins so far: a joiner adds 1 (AcqRel) after taking its slot and
    /// before it loads `published`; cleanup reads it before and after a
    /// scan that skips empty slots (edge J).
    joins: AtomicU64,
    /// Where the next `subscribe` starts probing.
    probe: AtomicUsize,
    /// Live `Sender`s; 0 means closed.
    senders: AtomicUsize,
    /// Live `Receiver`s.
    receivers: AtomicUsize,
    /// Messages receivers lost to lags, added by each receiver as it
    /// reports its lag (a statistic, not part of any protocol: a plain
    /// atomic even under loom, so the models have no more steps).
    lost: crate::sync::unmodeled::AtomicU64,
    /// Who is asleep: parked threads (on `wake`) and the wakers of async
    /// receives. std's futex lock, not parking_lot's, so Miri's
    /// strict-provenance mode can check the blocking paths (see
    /// `sync::futex`).
    lock: Mutex<Sleepers>,
    wake: Condvar,
}

// SAFETY: `Inner` hands `&T` (and clones made from `&T`) to receivers on other
// threads, so `T: Sync` is required; values move in from one thread and are
// dropped on another, so `T: Send` is required. Every access to a slot follows
// the ground rules of the parent module, which make slot accesses data-race
// free. The remaining fields are atomics and locks.
unsafe impl<T: Send + Sync> Send for Inner<T> {}
// SAFETY: as for `Send` above.
unsafe impl<T: Send + Sync> Sync for Inner<T> {}

impl<T> Drop for Inner<T> {
    /// Drops the messages still in the ring one at a time, so that a
    /// panicking `Drop` of one still drops the others (the slice's drop
    /// glue would abort on a second panic); the first panic goes on after.
    fn drop(&mut self) {
        let mut panics = crate::unwind::Panics::new();
        for slot in self.slots.iter() {
            // SAFETY: `&mut self`: no handle is left, so nothing else
            // reads or writes any slot.
            let value = slot.with_mut(|p| unsafe { (*p).take() });
            panics.drop_each(value);
        }
        panics.resume();
    }
}

/// Exponential spin, then yield: used only by the waits the ground rules
/// allow (an earlier writer publishing, a reader mid-copy).
pub(super) struct Backoff(u32);

impl Backoff {
    pub(super) fn new() -> Self {
        Self(0)
    }

    pub(super) fn snooze(&mut self) {
        if cfg!(expiremap_loom) {
            // loom's spin_loop is a yield; one is enough to let others run.
            spin_loop();
        } else if self.0 < SPIN_ROUNDS {
            for _ in 0..1u32 << self.0 {
                spin_loop();
            }
            self.0 += 1;
        } else {
            thread::yield_now();
        }
    }
}

/// Values a writer took out of the ring while reserving, for it to drop
/// after it publishes. Usually none or one; more only when other writers
/// won the sequences it cleared room for.
pub(super) struct Freed<T> {
    first: Option<T>,
    more: Vec<T>,
}

impl<T> Freed<T> {
    pub(super) fn new() -> Self {
        Self {
            first: None,
            more: Vec::new(),
        }
    }

    /// Nothing was taken out (the usual case: readers keep the ring
    /// cleared).
    pub(super) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    fn push(&mut self, value: Option<T>) {
        let Some(v) = value else { return };
        if self.first.is_none() {
            self.first = Some(v);
        } else {
            self.more.push(v);
        }
    }
}

impl<T> IntoIterator for Freed<T> {
    type Item = T;
    type IntoIter = std::iter::Chain<std::option::IntoIter<T>, std::vec::IntoIter<T>>;

    fn into_iter(self) -> Self::IntoIter {
        self.first.into_iter().chain(self.more)
    }
}

impl<T> Inner<T> {
    /// A ring of `capacity` (a power of two) slots and `max_readers` (>= 1)
    /// registry slots; sequence 0 is generation `origin`.
    pub(super) fn new(capacity: usize, max_readers: usize, origin: u64) -> Self {
        debug_assert!(capacity.is_power_of_two() && max_readers >= 1);
        Self {
            write_gen: CachePadded::new(AtomicU64::new(0)),
            read_gen: CachePadded::new(AtomicU64::new(0)),
            last_valid: CachePadded::new(AtomicU64::new(0)),
            clear_gen: CachePadded::new(AtomicU64::new(0)),
            cleared: CachePadded::new(AtomicU64::new(0)),
            reclaim: CachePadded::new(AtomicUsize::new(0)),
            slots: (0..capacity).map(|_| UnsafeCell::new(None)).collect(),
            mask: capacity as u64 - 1,
            origin,
            // An empty registry slot is a reader suspended at sequence 0.
            readers: (0..max_readers)
                .map(|_| CachePadded::new(AtomicU64::new(SUSPENDED)))
                .collect(),
            taken: (0..max_readers.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            joins: AtomicU64::new(0),
            probe: AtomicUsize::new(0),
            senders: AtomicUsize::new(1),
            receivers: AtomicUsize::new(0),
            lost: crate::sync::unmodeled::AtomicU64::new(0),
            lock: Mutex::new(Sleepers::new(max_readers)),
            wake: Condvar::new(),
        }
    }

    /// Counts `n` messages a receiver lost to a lag.
    pub(super) fn lost(&self, n: u64) {
        self.lost
            .fetch_add(n, crate::sync::unmodeled::Ordering::Relaxed);
    }

    /// Messages lost to lags so far, as the receivers reported them.
    pub(super) fn lost_total(&self) -> u64 {
        self.lost.load(crate::sync::unmodeled::Ordering::Relaxed)
    }

    pub(super) fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn max_readers(&self) -> usize {
        self.readers.len()
    }

    /// Index of the ring slot that holds sequence `seq`: the low bits of its
    /// generation. Because the capacity divides 2^64, consecutive
    /// generations map to consecutive slots even across `u64::MAX -> 0`.
    #[inline]
    pub(super) fn slot_index(&self, seq: u64) -> usize {
        (self.origin.wrapping_add(seq) & self.mask) as usize
    }

    #[inline]
    pub(super) fn slot(&self, seq: u64) -> &UnsafeCell<Option<T>> {
        &self.slots[self.slot_index(seq)]
    }

    /// The reader counter of registry slot `i`.
    #[inline]
    pub(super) fn counter(&self, i: usize) -> &AtomicU64 {
        &self.readers[i]
    }

    /// Sequences below the returned value are published (edge P: Acquire).
    #[inline]
    pub(super) fn published(&self) -> u64 {
        self.read_gen.load(Ordering::Acquire) & SEQ
    }

    /// `true` once every `Sender` is gone. Acquire: every publish of every
    /// sender happens-before (each sender's drop is an AcqRel decrement).
    #[inline]
    pub(super) fn closed(&self) -> bool {
        self.senders.load(Ordering::Acquire) == 0
    }

    pub(super) fn receiver_count(&self) -> usize {
        self.receivers.load(Ordering::Relaxed)
    }

    pub(super) fn add_sender(&self) {
        self.senders.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops one sender; the last one closes the area and wakes every
    /// parked receiver.
    pub(super) fn remove_sender(&self) {
        if self.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Edge W: a receiver that set WAITING before this RMW is notified;
            // one that sets it after reads `senders == 0` (AcqRel chain).
            let prev = self.read_gen.fetch_and(SEQ, Ordering::AcqRel);
            if prev & WAITING != 0 {
                self.notify_all();
            }
        }
    }

    /// Wakes every receiver asleep now: parked threads (notified under the
    /// lock they park with) and registered wakers ([`wake_tasks`]).
    ///
    /// [`wake_tasks`]: Self::wake_tasks
    pub(super) fn notify_all(&self) {
        let s = self.lock.lock();
        if s.threads > 0 {
            self.wake.notify_all();
        }
        if s.registered > 0 {
            self.wake_tasks(s);
        }
    }

    /// Wakes every registered waker: takes them out under the lock (`s`,
    /// then taken again as needed), at most [`WAKE_BATCH`] per hold, and
    /// wakes them after releasing it. One pass over the registry: a task
    /// woken here that registers again before the pass reaches its slot is
    /// woken once more, spuriously. None is missed: a waker whose
    /// registration RMW on `read_gen` preceded our caller's was in place
    /// before that registration released `lock`, and every hold of `lock`
    /// here follows our caller's RMW, so the pass finds it, unless its task
    /// gave it up or another notify took it and woke it.
    fn wake_tasks<'a>(&'a self, mut s: MutexGuard<'a, Sleepers>) {
        let mut batch: [Option<Waker>; WAKE_BATCH] = Default::default();
        let mut next = 0;
        loop {
            let mut n = 0;
            while n < WAKE_BATCH && next < s.wakers.len() && s.registered > 0 {
                if let Some(w) = s.take(next) {
                    batch[n] = Some(w);
                    n += 1;
                }
                next += 1;
            }
            // Come back only for wakers left past this batch: a task woken
            // below races for `lock` to register again.
            let more = next < s.wakers.len() && s.registered > 0;
            drop(s);
            for w in &mut batch[..n] {
                if let Some(w) = w.take() {
                    w.wake();
                }
            }
            if !more {
                return;
            }
            s = self.lock.lock();
        }
    }

    // ----- writers ---------------------------------------------------------

    /// Reserves the next sequence for this writer. On return the writer is
    /// the only thread that may touch `slot(seq)` until it publishes `seq`,
    /// the slot is empty, and the take of its previous value (with every
    /// reader access before it) happens-before the return (edges F and C).
    ///
    /// Waits only for an earlier writer to publish, for a reader mid-copy,
    /// or for another thread's clearing mid-move; when the ring is full it
    /// runs cleanup and clears the oldest slot itself, putting the value it
    /// took out in `freed` for the caller to drop after publishing.
    pub(super) fn reserve(&self, freed: &mut Freed<T>) -> u64 {
        let cap = self.mask + 1;
        let mut backoff = Backoff::new();
        let mut seq = self.write_gen.load(Ordering::Relaxed);
        loop {
            // Acquire: edge C (the slot was emptied before `cleared` moved).
            let cleared = self.cleared.load(Ordering::Acquire);
            if seq >= cleared + cap {
                // The ring is full: free and clear the oldest sequence the
                // writer needs.
                let needed = seq + 1 - cap;
                if self.published() < needed {
                    // An earlier writer has not published yet; wait for it.
                    backoff.snooze();
                } else {
                    // Acquire: edge F for everything below it.
                    if self.last_valid.load(Ordering::Acquire) < needed {
                        self.cleanup(needed);
                    }
                    // `last_valid >= needed` now, as loaded or raised here.
                    while let Some(old) = self.clear_one(needed) {
                        freed.push(old);
                    }
                    if self.cleared.load(Ordering::Acquire) < needed {
                        // Another thread is moving the value out; no user
                        // code runs before it stores `cleared`.
                        backoff.snooze();
                    }
                }
                seq = self.write_gen.load(Ordering::Relaxed);
                continue;
            }
            // Past this, sequences would run into the flag bits. At 10^9
            // messages a second that is over a century away, so the check
            // costs one compare that never fails; but a wrapped sequence
            // could let a writer reuse a slot a reader holds, so it is not
            // left to debug builds.
            assert!(seq < SEQ - cap, "broadcast: sequence space exhausted");
            match self.write_gen.compare_exchange_weak(
                seq,
                seq + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return seq,
                Err(now) => seq = now,
            }
        }
    }

    /// Clears one freed sequence below `end`: claims the oldest unclaimed
    /// one (CAS on `clear_gen`), moves its value out, and stores `cleared`
    /// past it once every earlier claim did. Returns the value (`None` for
    /// a tombstone), or `None` if nothing below `end` is left to claim.
    /// Runs no user code.
    ///
    /// `end <= last_valid`, a value this thread loaded from `last_valid`
    /// (Acquire) or raised it to in cleanup (AcqRel, after its Acquire
    /// loads of every counter): every read of a sequence below `end`
    /// happened-before (edge F).
    fn clear_one(&self, end: u64) -> Option<Option<T>> {
        let mut d = self.clear_gen.load(Ordering::Relaxed);
        loop {
            if d >= end {
                return None;
            }
            // Relaxed: the claim only needs atomicity (one claimant per
            // sequence); the edges come from `last_valid` above and
            // `cleared` below.
            match self.clear_gen.compare_exchange_weak(
                d,
                d + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => d = now,
            }
        }
        // SAFETY: `d < end <= last_valid`, acquired by this thread (see
        // above): no reader reads `d` again and every read of it
        // happened-before (edge F); its
        // writer published it before cleanup could free it (edge P through
        // cleanup's Acquire load of `read_gen`). The CAS made this thread
        // the only claimant of `d`, and no writer touches `slot(d)` before
        // `cleared > d`, which only this thread stores (edge C).
        let value = self.slot(d).with_mut(|p| unsafe { (*p).take() });
        let mut backoff = Backoff::new();
        // Acquire: chains the earlier claimants' takes (edge C).
        while self.cleared.load(Ordering::Acquire) != d {
            backoff.snooze(); // an earlier claimant is mid-move
        }
        // Release: edge C, the take happens-before the reuse of the slot.
        self.cleared.store(d + 1, Ordering::Release);
        Some(value)
    }

    /// A receive that moved nothing: runs [`passed`](Self::passed) if a
    /// scan is pending (`PENDING`); otherwise one load.
    pub(super) fn passed_nothing(&self, panics: &mut crate::unwind::Panics) {
        if self.reclaim.load(Ordering::Relaxed) & PENDING != 0 {
            self.passed(0, panics);
        }
    }

    /// A reader moved past sequences from `from` on (or left, with `from`
    /// 0): drops the values every registered reader has passed now, unless
    /// a reclaim run in progress will (it scans again), or an earlier
    /// sequence than `from` is still claimed by another reader (then that
    /// reader's move reclaims). Panics of the values' `Drop` go to
    /// `panics`; the run drops every value it took out whatever they do.
    ///
    /// Edge R: the mover stored its counter (Release) before its
    /// `fetch_or(AGAIN)` here. Every RMW on `reclaim` is AcqRel, so a run
    /// that starts after that RMW, or that reads `AGAIN` when it ends (then
    /// it scans again), sees the move; a run that ended before it released
    /// `last_valid` to this mover, whose skip check then reads the scan's
    /// result.
    pub(super) fn passed(&self, from: u64, panics: &mut crate::unwind::Panics) {
        let prev = self.reclaim.fetch_or(AGAIN, Ordering::AcqRel);
        if prev & RUNNING != 0 {
            return; // the runner scans again and sees this move
        }
        // The last run left `last_valid` at the minimum claim it saw; if
        // that is below `from`, a reader at it has not moved since (its
        // move would have run, or set `AGAIN` for the run in progress),
        // so nothing this move passed is reclaimable. Unless that run
        // stopped with moves unscanned (`PENDING`).
        if prev & PENDING == 0 && from > self.last_valid.load(Ordering::Acquire) {
            return;
        }
        let mut cur = prev | AGAIN;
        loop {
            if cur & RUNNING != 0 {
                return; // another mover became the runner after our RMW
            }
            match self.reclaim.compare_exchange_weak(
                cur,
                RUNNING,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        let mut passes = 0;
        loop {
            // Frees what no reader claims, forcing nobody.
            let freed = self.cleanup(0);
            passes += 1;
            while let Some(old) = self.clear_one(freed) {
                // User code, with no lock of ours held: `RUNNING` only makes
                // other movers leave the scan to this run.
                panics.drop_each(old);
            }
            match self
                .reclaim
                .compare_exchange(RUNNING, 0, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(_) if passes == MAX_PASSES => {
                    // Readers keep moving: leave the next scan to the next
                    // mover, whatever its position.
                    self.reclaim.swap(PENDING, Ordering::AcqRel);
                    return;
                }
                Err(_) => {
                    // `AGAIN`: a reader moved since the scan. Acquire its
                    // move (edge R) and scan once more.
                    self.reclaim.swap(RUNNING, Ordering::AcqRel);
                }
            }
        }
    }

    /// Publishes `seq`: waits until every earlier sequence is published,
    /// then moves `read_gen` past it (Release: edge P). Returns `true` if a
    /// parked receiver asked for a wake-up (edge W), which the caller then
    /// owes and must deliver with [`notify_all`](Self::notify_all) however
    /// it exits. A batch writer delivers one wake-up for the whole batch: a
    /// parked receiver sleeps until the batch is published, never longer.
    pub(super) fn publish_owing(&self, seq: u64) -> bool {
        let mut backoff = Backoff::new();
        while self.read_gen.load(Ordering::Acquire) & SEQ != seq {
            backoff.snooze();
        }
        // Only the owner of `seq` changes the low bits now; receivers may set
        // WAITING concurrently, which the swap reads and clears.
        let prev = self.read_gen.swap(seq + 1, Ordering::AcqRel);
        debug_assert_eq!(prev & SEQ, seq);
        prev & WAITING != 0
    }

    /// Frees at least every sequence below `needed` (which must be
    /// published), and more if no reader holds it: raises `last_valid` to
    /// `target`, the minimum over the claims of registered readers, but never
    /// below `needed`. Suspended readers below `needed` are force-advanced to
    /// exactly `needed` (they will report the lag); an active reader below
    /// `needed` is mid-copy and is waited for.
    ///
    /// Empty registry slots are suspended readers that nobody will resume.
    /// The scan skips them unless a reader joined during it (`joins`
    /// moved): then it scans again and moves them to `target` (the seed's
    /// Pin 3), so a joiner never starts below what was freed (edge J).
    ///
    /// Edge F: every counter value read here (Acquire) was stored by its
    /// reader after it finished reading everything below it; the final
    /// `fetch_max` (Release) passes that on to writers that load
    /// `last_valid`.
    ///
    /// Returns `last_valid` as this call left or found it (at least
    /// `needed`), acquired as edge F requires of
    /// [`clear_one`](Self::clear_one)'s `end`.
    pub(super) fn cleanup(&self, needed: u64) -> u64 {
        let joins = self.joins.load(Ordering::Acquire);
        let published = self.published();
        debug_assert!(needed <= published);
        // Never free an unpublished sequence.
        let needed = needed.min(published);
        let mut target = self.scan(needed, published, false);
        let mut cur = self.last_valid.load(Ordering::Acquire);
        if target <= cur {
            // Nothing to raise (`cur >= target >= needed`), so nothing for
            // a joiner to start below.
            return cur;
        }
        // Edge J: an RMW, so it reads the latest `joins`. Unchanged, every
        // joiner either took its slot before our first load (which then
        // acquired it: the scan saw the slot taken) or will load
        // `published` after this RMW (so it starts at or past ours).
        if self.joins.fetch_add(0, Ordering::AcqRel) != joins {
            target = target.min(self.scan(needed, published, true));
        }
        // `fetch_max` as an explicit CAS loop: the same AcqRel read-modify-
        // write, but one ThreadSanitizer can see (it does not instrument
        // min/max RMWs, and then reports the slot hand-over as a race).
        while cur < target {
            match self.last_valid.compare_exchange_weak(
                cur,
                target,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return target,
                Err(now) => cur = now,
            }
        }
        cur
    }

    /// The scan behind [`cleanup`](Self::cleanup): the lowest claim at or
    /// above `needed` (at most `published`), forcing suspended readers below
    /// `needed` to it. With `empty` it visits every registry slot and moves
    /// empty ones to the target; without, only the slots it sees taken.
    fn scan(&self, needed: u64, published: u64, empty: bool) -> u64 {
        let mut target = published;
        if !empty {
            for (w, word) in self.taken.iter().enumerate() {
                let mut bits = word.load(Ordering::Acquire);
                while bits != 0 {
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    target = self.visit(i, needed, target, true);
                }
            }
            return target;
        }
        for i in 0..self.readers.len() {
            // Whether it is taken is read after the counter, in `visit`.
            target = self.visit(i, needed, target, false);
        }
        target
    }

    /// One registry slot of a [`scan`](Self::scan): returns the target
    /// lowered to its claim, after forcing it to `needed` if it is a
    /// suspended reader below it, or (an empty slot) to the target.
    /// `taken`: the slot was seen taken, so it is a real reader.
    fn visit(&self, i: usize, needed: u64, mut target: u64, taken: bool) -> u64 {
        let counter = self.counter(i);
        let mut backoff = Backoff::new();
        let mut cur = counter.load(Ordering::Acquire);
        loop {
            let pos = cur & SEQ;
            if pos >= target {
                return target; // claims nothing below the target
            }
            // Read after the counter: if `cur` was stored by the current
            // owner (or after it joined), `taken` is seen as `true`.
            let real = taken || self.is_taken(i);
            if cur & SUSPENDED == 0 {
                // Active: copying `pos` (or about to).
                if pos >= needed {
                    return pos;
                }
                backoff.snooze(); // the one wait on a reader: mid-copy
                cur = counter.load(Ordering::Acquire);
                continue;
            }
            if real && pos >= needed {
                return pos; // within capacity: keep what it will read
            }
            // Force-advance: a real reader exactly to `needed`, an empty
            // slot to the current target.
            let to = if real { needed } else { target };
            match counter.compare_exchange(cur, SUSPENDED | to, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if real {
                        target = needed;
                    }
                    return target;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// `true` while a `Receiver` owns registry slot `i` (Acquire).
    #[inline]
    fn is_taken(&self, i: usize) -> bool {
        self.taken[i / 64].load(Ordering::Acquire) & (1 << (i % 64)) != 0
    }

    // ----- registry --------------------------------------------------------

    /// Takes a free registry slot and positions a suspended reader there at
    /// the next sequence to be published. `None` if the registry is full.
    /// Returns `(registry slot, starting sequence)`.
    pub(super) fn join(&self) -> Option<(usize, u64)> {
        let n = self.readers.len();
        let start = self.probe.fetch_add(1, Ordering::Relaxed) % n;
        let i = (0..n).map(|k| (start + k) % n).find(|&i| {
            let bit = 1 << (i % 64);
            self.taken[i / 64].fetch_or(bit, Ordering::AcqRel) & bit == 0
        })?;
        // Edge J: after taking the slot, before loading `published`.
        self.joins.fetch_add(1, Ordering::AcqRel);
        let published = self.published();
        let counter = self.counter(i);
        let mut cur = counter.load(Ordering::Acquire);
        let seq = loop {
            debug_assert!(cur & SUSPENDED != 0, "an unowned reader is active");
            // A cleanup may have moved the empty slot past `published`
            // already; never go back below what it freed.
            let seq = (cur & SEQ).max(published);
            match counter.compare_exchange(
                cur,
                SUSPENDED | seq,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break seq,
                Err(now) => cur = now,
            }
        };
        self.receivers.fetch_add(1, Ordering::Relaxed);
        // A reclaim run that scanned meanwhile saw the slot taken with its
        // old counter, and kept everything from there. Nothing here may
        // drop values (a map subscribes under its own lock), so leave the
        // next scan to the next receive, moving or not.
        self.reclaim.fetch_or(PENDING, Ordering::AcqRel);
        Some((i, seq))
    }

    /// Gives registry slot `i` back. Its counter stays a suspended counter,
    /// which cleanup now treats as empty. Its waker was taken out already
    /// (`Receiver::drop` unregisters first). Then reclaims what only this
    /// reader still held ([`passed`](Self::passed)); panics of the values'
    /// `Drop` go to `panics`.
    pub(super) fn leave(&self, i: usize, panics: &mut crate::unwind::Panics) {
        debug_assert!(self.counter(i).load(Ordering::Relaxed) & SUSPENDED != 0);
        self.receivers.fetch_sub(1, Ordering::Relaxed);
        self.taken[i / 64].fetch_and(!(1 << (i % 64)), Ordering::Release);
        self.passed(0, panics);
    }

    /// Parks the calling receiver until a publish or close may have happened,
    /// unless something already did: `next` is the receiver's next sequence.
    /// Returns `true` if `timeout` elapsed.
    ///
    /// No lost wake-up (edge W): `WAITING` is set by an RMW on `read_gen`
    /// while holding `lock`. A publish or close is an RMW on `read_gen` too,
    /// so it either precedes ours (then we see the new sequence or, through
    /// the AcqRel chain, `senders == 0`, and do not sleep) or follows it
    /// (then it sees `WAITING` and notifies under `lock`, which we hold until
    /// `wait` releases it atomically).
    pub(super) fn park(&self, next: u64, timeout: Option<std::time::Duration>) -> bool {
        let mut guard = self.lock.lock();
        if self.news(next) {
            return false;
        }
        guard.threads += 1;
        let timed_out = match timeout {
            None => {
                self.wake.wait(&mut guard);
                false
            }
            Some(t) => self.wake.wait_for(&mut guard, t).timed_out(),
        };
        guard.threads -= 1;
        timed_out
    }

    /// Sets `WAITING` and reports whether anything happened past `next`
    /// (a publish or a close) before it was set. Called with `lock` held:
    /// the RMW that edge W orders against every publish and close.
    fn news(&self, next: u64) -> bool {
        let prev = self.read_gen.fetch_or(WAITING, Ordering::AcqRel);
        prev & SEQ != next || self.closed()
    }

    /// The async counterpart of [`park`](Self::park): puts `waker` in
    /// registry slot `slot`'s place and sets `WAITING`, unless something
    /// happened past `next` already. Returns `true` if the waker stays
    /// registered (the caller returns `Poll::Pending`), `false` if the
    /// caller must look again (its waker is then not registered).
    ///
    /// No lost wake-up, by the argument of `park` (edge W): the waker is in
    /// place, under `lock`, before the RMW that sets `WAITING`; a publish or
    /// close whose RMW follows ours sees `WAITING` and takes every waker
    /// under `lock`, which it can only get after we release it.
    pub(super) fn register(&self, slot: usize, next: u64, waker: &Waker) -> bool {
        // Cloned, and any waker it replaces dropped, outside the lock: both
        // run the executor's code.
        let mut fresh = Some(waker.clone());
        let mut s = self.lock.lock();
        let keep = s.wakers[slot].as_ref().is_some_and(|w| w.will_wake(waker));
        if !keep {
            let old = std::mem::replace(&mut s.wakers[slot], fresh.take());
            s.registered += usize::from(old.is_none());
            fresh = old; // dropped below
        }
        if self.news(next) {
            let stale = s.take(slot);
            drop(s);
            drop((stale, fresh));
            return false;
        }
        drop(s);
        drop(fresh);
        true
    }

    /// Test-only: `(WAITING is set, wakers registered, threads parked)`.
    #[cfg(test)]
    pub(super) fn sleepers(&self) -> (bool, usize, usize) {
        let s = self.lock.lock();
        let waiting = self.read_gen.load(Ordering::Relaxed) & WAITING != 0;
        (waiting, s.registered, s.threads)
    }

    /// Takes registry slot `slot`'s waker out, if a notify has not taken it
    /// already. If nobody is asleep any more, also clears `WAITING`, so that
    /// an async receive given up (its future dropped) leaves no wake-up for
    /// the next publish to pay. Clearing is safe under `lock`: every sleeper
    /// sets `WAITING` again, under `lock`, before it sleeps.
    pub(super) fn unregister(&self, slot: usize) {
        let mut s = self.lock.lock();
        let waker = s.take(slot);
        // Usually the publish that woke us cleared it already: look first,
        // and write the hot line only if needed.
        if s.is_empty() && self.read_gen.load(Ordering::Relaxed) & WAITING != 0 {
            self.read_gen.fetch_and(SEQ, Ordering::AcqRel);
        }
        drop(s);
        drop(waker); // user code: outside the lock
    }
}

impl<T> std::fmt::Debug for Inner<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("capacity", &self.capacity())
            .field("max_readers", &self.max_readers())
            .field("write_gen", &self.write_gen.load(Ordering::Relaxed))
            .field("read_gen", &(self.read_gen.load(Ordering::Relaxed) & SEQ))
            .field("last_valid", &self.last_valid.load(Ordering::Relaxed))
            .field("cleared", &self.cleared.load(Ordering::Relaxed))
            .field("senders", &self.senders.load(Ordering::Relaxed))
            .field("receivers", &self.receiver_count())
            .finish_non_exhaustive()
    }
}

//! [`RwLock`]: the shards' write-preferring reader-writer lock, whose reads
//! write no shared cache line while the lock is read-biased.
//!
//! A plain reader-writer lock makes every read an atomic add on the lock
//! word, and one to release it: two threads reading the same shard (or,
//! with a map small enough to stay in cache, any shards in turn) pass that
//! word's line between their cores on every read, so reads stop scaling.
//! This lock is the read-biased scheme of Dice and Kogan's BRAVO ("BRAVO —
//! Biased Locking for Reader-Writer Locks", USENIX ATC 2019) over
//! `parking_lot`'s raw lock:
//!
//! * **Biased reads.** While the lock is biased, a reader announces itself
//!   in a slot of its own thread's line of a process-wide table (`TABLE`:
//!   one line of eight slots per thread, the slot picked by the lock's
//!   address) with a compare-and-swap of `0` to the lock's address, then
//!   checks that the lock is still biased. Its release stores `0`. Neither
//!   touches the lock's own line, which every reader only reads.
//! * **Writes revoke the bias.** A writer takes the raw lock's write side
//!   (so later readers queue behind it: the lock stays write-preferring);
//!   if the lock is biased it clears the bias and waits until no slot that
//!   can hold this lock's address holds it (one slot per thread line in
//!   use). Announcing then checking (reader) against clearing then
//!   scanning (writer) is a store-load pattern on both sides: every access
//!   in it is `SeqCst`, so a reader that saw the bias is one the writer
//!   sees, and a reader the writer missed sees no bias and backs out.
//! * **Reads restore it.** A read that finds the lock unbiased takes the
//!   raw lock's read side. Once `16 ×` (thread lines in use) such reads
//!   in a row have come with no write between, one of them sets the bias
//!   again. A revocation costs one load per thread line in use, so a shard
//!   that is written often stays unbiased and pays nothing for the scheme
//!   but a load and a store on its own line; a shard read by many threads
//!   and rarely written reads biased.
//!
//! A biased reader that fails its compare-and-swap (another lock's reader
//! of the same thread holds that slot: a nested read, or more threads than
//! lines sharing one) takes the raw lock as an unbiased read does.
//! Threads take lines in turn, wrapping past [`LINES`]; a line is never
//! given back, so past that many threads some share lines, which is
//! correct and only makes their biased reads collide more.
//!
//! A revoking writer spins, then yields, then sleeps in growing steps
//! while a biased reader holds on: a biased read is held for one lookup
//! and a `V::clone`, never across user code that could wait for the
//! writer (the crate's rule that user code under a shard lock must not
//! call back into the same map covers it), so the wait ends. The map takes
//! its long reads (iteration's spans, a bulk read of more than a few keys
//! of one shard) with [`read_unbiased`](RwLock::read_unbiased), which
//! always takes the raw lock, so no writer spins or sleeps on them.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use super::{AtomicBool, AtomicUsize, Ordering};

/// Thread lines in the table: one cache line of [`SLOTS`] slots each.
#[cfg(not(expiremap_loom))]
pub(crate) const LINES: usize = 64;
/// Slots of one thread's line: one per lock it may hold at once (the slot
/// is picked by the lock's address).
#[cfg(not(expiremap_loom))]
const SLOTS: usize = 8;
/// Under loom: two lines of two slots keep the models small.
#[cfg(expiremap_loom)]
pub(crate) const LINES: usize = 2;
#[cfg(expiremap_loom)]
const SLOTS: usize = 2;

const _: () = assert!(SLOTS.is_power_of_two());

/// Unbiased reads in a row, per thread line in use, that restore the bias.
#[cfg(not(expiremap_loom))]
const REBIAS_PER_LINE: usize = 16;
/// Under loom one read restores it, so short models reach biased reads.
#[cfg(expiremap_loom)]
const REBIAS_PER_LINE: usize = 0;

/// Lookups under one lock past which a read counts as long
/// ([`RwLock::read_for`]).
const LONG_READ: usize = 16;

/// One thread's line of slots: `0`, or the address of a lock the thread
/// reads biased.
#[cfg_attr(not(expiremap_loom), repr(align(64)))]
struct Line([AtomicUsize; SLOTS]);

impl Line {
    #[cfg(not(expiremap_loom))]
    const fn new() -> Self {
        Self([const { AtomicUsize::new(0) }; SLOTS])
    }
    #[cfg(expiremap_loom)]
    fn new() -> Self {
        Self(std::array::from_fn(|_| AtomicUsize::new(0)))
    }
}

/// The process-wide table of biased readers, and how many threads ever
/// took a line (lines in use: the least of that and [`LINES`]).
struct Table {
    lines: [Line; LINES],
    threads: AtomicUsize,
}

#[cfg(not(expiremap_loom))]
static TABLE: Table = Table {
    lines: [const { Line::new() }; LINES],
    threads: AtomicUsize::new(0),
};

#[cfg(expiremap_loom)]
loom::lazy_static! {
    static ref TABLE: Table = Table {
        lines: std::array::from_fn(|_| Line::new()),
        threads: AtomicUsize::new(0),
    };
}

#[cfg(not(expiremap_loom))]
std::thread_local! {
    /// This thread's line, `None` until its first biased read.
    static MY_LINE: std::cell::Cell<Option<&'static Line>> = const { std::cell::Cell::new(None) };
}
#[cfg(expiremap_loom)]
loom::thread_local! {
    static MY_LINE: std::cell::Cell<Option<&'static Line>> = std::cell::Cell::new(None);
}

/// This thread's line, taken on first use.
#[inline(always)]
fn my_line() -> &'static Line {
    match MY_LINE.with(std::cell::Cell::get) {
        Some(line) => line,
        None => take_line(),
    }
}

/// The next line in turn, for a thread's first biased read.
#[cold]
fn take_line() -> &'static Line {
    // `SeqCst`: a writer that counts the lines in use after clearing a
    // bias either counts this one, or this thread's first biased read
    // (after this add) sees the bias cleared.
    let i = TABLE.threads.fetch_add(1, Ordering::SeqCst) % LINES;
    #[cfg(not(expiremap_loom))]
    let table: &'static Table = &TABLE;
    // loom's `lazy_static` lives for the model's execution, as the
    // thread-local that keeps this reference does.
    #[cfg(expiremap_loom)]
    let table: &'static Table = &*TABLE;
    let line = &table.lines[i];
    MY_LINE.with(|l| l.set(Some(line)));
    line
}

/// Lines in use: the ones a revoking writer scans.
#[inline]
fn lines_in_use() -> usize {
    TABLE.threads.load(Ordering::SeqCst).min(LINES)
}

#[cfg(not(expiremap_loom))]
type Raw = parking_lot::RawRwLock;
#[cfg(not(expiremap_loom))]
use parking_lot::lock_api::RawRwLock as _;

/// The shards' reader-writer lock (module docs): `parking_lot`'s
/// write-preferring lock, with reads that write nothing shared while the
/// lock is biased.
///
/// `repr(C)`, the lock's words first and the data right after them: a
/// read's first lines of the data (a shard's table and slab headers) then
/// share the lock word's cache line and the next (see `Shard`).
#[cfg_attr(not(expiremap_loom), repr(C))]
pub(crate) struct RwLock<T> {
    #[cfg(not(expiremap_loom))]
    raw: Raw,
    #[cfg(expiremap_loom)]
    raw: loom::sync::RwLock<()>,
    /// Biased: readers may announce themselves in the table instead of
    /// taking `raw`. Set only by a reader holding `raw`'s read side,
    /// cleared only by a writer holding its write side.
    bias: AtomicBool,
    /// Reads of `raw`'s read side since the last write (restores `bias`).
    /// A hint: its load and store are not one atomic step.
    streak: AtomicUsize,
    #[cfg(not(expiremap_loom))]
    data: std::cell::UnsafeCell<T>,
    #[cfg(expiremap_loom)]
    data: loom::cell::UnsafeCell<T>,
}

/// Where a lock's data starts in it (`Shard`'s layout test).
#[cfg(all(test, not(expiremap_loom)))]
pub(crate) const fn data_offset<T>() -> usize {
    std::mem::offset_of!(RwLock<T>, data)
}

// SAFETY: as for `std::sync::RwLock`: the lock hands out `&mut T` to one
// thread at a time (so `T: Send` moves it between threads) and `&T` to
// several at once (so sharing needs `T: Sync`).
unsafe impl<T: Send> Send for RwLock<T> {}
// SAFETY: see the `Send` impl.
unsafe impl<T: Send + Sync> Sync for RwLock<T> {}

impl<T> RwLock<T> {
    /// An unbiased, unlocked lock over `value`.
    pub(crate) fn new(value: T) -> Self {
        Self {
            #[cfg(not(expiremap_loom))]
            raw: Raw::INIT,
            #[cfg(expiremap_loom)]
            raw: loom::sync::RwLock::new(()),
            bias: AtomicBool::new(false),
            streak: AtomicUsize::new(0),
            #[cfg(not(expiremap_loom))]
            data: std::cell::UnsafeCell::new(value),
            #[cfg(expiremap_loom)]
            data: loom::cell::UnsafeCell::new(value),
        }
    }

    /// What a biased reader stores in its slot: the lock's address (never
    /// `0`; unique among live locks, and a slot holds it only while a
    /// guard borrows the lock).
    #[inline]
    fn id(&self) -> usize {
        (self as *const Self).addr()
    }

    /// The slot of `line` that can hold this lock.
    #[inline]
    fn slot<'a>(&self, line: &'a Line) -> &'a AtomicUsize {
        // Locks sit at least a line apart (the map pads its shards), so
        // neighbouring shards take different slots.
        &line.0[(self.id() >> 7) & (SLOTS - 1)]
    }

    /// A shared lock, biased if it can be.
    #[inline]
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        if self.bias.load(Ordering::Relaxed) {
            let slot = self.slot(my_line());
            if slot
                .compare_exchange(0, self.id(), Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                // The reader's half of the store-load pattern (module docs):
                // announced, then still biased, so a revoking writer will
                // find the slot and wait; and reading `true` here acquires
                // the data as the reader that set the bias held it.
                loom_seq_cst_fence();
                if self.bias.load(Ordering::SeqCst) {
                    return ReadGuard::new(self, Held::Biased(slot));
                }
                slot.store(0, Ordering::Release);
            }
        }
        self.read_unbiased_counting(true)
    }

    /// A shared lock for a batch of `n` lookups: biased for a few (as
    /// short as one `read`), on the raw lock's read side for more.
    #[inline]
    pub(crate) fn read_for(&self, n: usize) -> ReadGuard<'_, T> {
        if n <= LONG_READ {
            self.read()
        } else {
            self.read_unbiased()
        }
    }

    /// A shared lock on the raw lock's read side, never biased: for reads
    /// held long (a writer waits for them parked, not spinning). It does
    /// not count towards restoring the bias.
    #[inline]
    pub(crate) fn read_unbiased(&self) -> ReadGuard<'_, T> {
        self.read_unbiased_counting(false)
    }

    #[inline]
    fn read_unbiased_counting(&self, count: bool) -> ReadGuard<'_, T> {
        #[cfg(not(expiremap_loom))]
        let held = {
            self.raw.lock_shared();
            Held::Shared
        };
        #[cfg(expiremap_loom)]
        let held = Held::Shared(self.raw.read().unwrap());
        if count && !self.bias.load(Ordering::Relaxed) {
            let n = self.streak.load(Ordering::Relaxed);
            // The first comparison spares most unbiased reads the load of
            // the lines in use.
            if n >= REBIAS_PER_LINE && n >= REBIAS_PER_LINE * lines_in_use() {
                // Under the read side: no writer holds the lock, and the
                // next one sees this store (it takes the write side after
                // this read's release).
                self.bias.store(true, Ordering::SeqCst);
            } else {
                self.streak.store(n + 1, Ordering::Relaxed);
            }
        }
        ReadGuard::new(self, held)
    }

    /// The exclusive lock: the raw lock's write side, then, if the lock is
    /// biased, the bias revoked and every biased reader waited for.
    #[inline]
    pub(crate) fn write(&self) -> WriteGuard<'_, T> {
        #[cfg(not(expiremap_loom))]
        self.raw.lock_exclusive();
        #[cfg(expiremap_loom)]
        let raw = self.raw.write().unwrap();
        // Only this thread writes either while it holds the write side.
        if self.bias.load(Ordering::Relaxed) {
            self.revoke();
        }
        if self.streak.load(Ordering::Relaxed) != 0 {
            self.streak.store(0, Ordering::Relaxed);
        }
        WriteGuard {
            lock: self,
            #[cfg(expiremap_loom)]
            ptr: self.data.get_mut(),
            #[cfg(expiremap_loom)]
            _raw: raw,
            _not_send: PhantomData,
        }
    }

    /// Clears the bias and waits until no biased reader holds the lock.
    #[cold]
    fn revoke(&self) {
        // The writer's half of the store-load pattern (module docs).
        self.bias.store(false, Ordering::SeqCst);
        loom_seq_cst_fence();
        let id = self.id();
        for line in &TABLE.lines[..lines_in_use()] {
            let slot = self.slot(line);
            let mut waited = 0u32;
            // `SeqCst` (for the pattern) reading `0` also acquires the
            // reader's release of its slot: its reads of the data
            // happened before this writer's writes.
            while slot.load(Ordering::SeqCst) == id {
                waited = waited.saturating_add(1);
                backoff(waited);
            }
        }
    }
}

/// Nothing, except under loom: loom models `SeqCst` loads, stores and
/// read-modify-writes as `AcqRel` (its README), too weak for the
/// store-load pattern, which the C++ model guarantees for accesses that
/// are all `SeqCst`; it does model `fence(SeqCst)`, so the models check
/// the pattern with a fence after each side's first access.
#[inline(always)]
fn loom_seq_cst_fence() {
    #[cfg(expiremap_loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}

/// A revoking writer's wait for one biased reader: spin, then yield, then
/// sleep in steps that grow to 100 µs (a reader descheduled while it holds
/// its slot may take a while to come back).
#[inline]
fn backoff(waited: u32) {
    #[cfg(expiremap_loom)]
    {
        let _ = waited;
        loom::thread::yield_now();
    }
    #[cfg(not(expiremap_loom))]
    if waited < 64 {
        std::hint::spin_loop();
    } else if waited < 128 {
        std::thread::yield_now();
    } else {
        let us = u64::from(waited - 127).min(100);
        std::thread::sleep(std::time::Duration::from_micros(us));
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLock")
            .field("biased", &self.bias.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// How a read guard holds its lock.
enum Held<'a> {
    /// Announced in this slot of the thread's line.
    Biased(&'a AtomicUsize),
    /// On the raw lock's read side.
    #[cfg(not(expiremap_loom))]
    Shared,
    #[cfg(expiremap_loom)]
    Shared(#[allow(dead_code)] loom::sync::RwLockReadGuard<'a, ()>),
}

/// A shared lock of a [`RwLock`].
pub(crate) struct ReadGuard<'a, T> {
    #[cfg_attr(expiremap_loom, allow(dead_code))]
    lock: &'a RwLock<T>,
    held: Held<'a>,
    /// Taken (its access ended) before the lock is released.
    #[cfg(expiremap_loom)]
    ptr: Option<loom::cell::ConstPtr<T>>,
    /// Released on the thread that took it, as `parking_lot`'s guards are.
    _not_send: PhantomData<*const ()>,
}

impl<'a, T> ReadGuard<'a, T> {
    #[inline]
    fn new(lock: &'a RwLock<T>, held: Held<'a>) -> Self {
        Self {
            lock,
            held,
            #[cfg(expiremap_loom)]
            ptr: Some(lock.data.get()),
            _not_send: PhantomData,
        }
    }
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds a shared lock: either the raw lock's
        // read side, or a biased announcement that a writer waits for
        // (`RwLock::revoke`) before it takes `&mut T`. So no `&mut T`
        // exists while this `&T`, bound to the guard, lives.
        #[cfg(not(expiremap_loom))]
        unsafe {
            &*self.lock.data.get()
        }
        // SAFETY: as above; loom checks the claim.
        #[cfg(expiremap_loom)]
        unsafe {
            self.ptr.as_ref().expect("guard in use").deref()
        }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        #[cfg(expiremap_loom)]
        drop(self.ptr.take());
        match &self.held {
            Held::Biased(slot) => slot.store(0, Ordering::Release),
            #[cfg(not(expiremap_loom))]
            // SAFETY: this guard took the read side (`Held::Shared` is
            // made only after `lock_shared`) and releases it once.
            Held::Shared => unsafe { self.lock.raw.unlock_shared() },
            #[cfg(expiremap_loom)]
            Held::Shared(_) => {}
        }
    }
}

/// The exclusive lock of a [`RwLock`].
pub(crate) struct WriteGuard<'a, T> {
    #[cfg_attr(expiremap_loom, allow(dead_code))]
    lock: &'a RwLock<T>,
    /// Dropped (its access ended) before `_raw`, which releases the lock.
    #[cfg(expiremap_loom)]
    ptr: loom::cell::MutPtr<T>,
    #[cfg(expiremap_loom)]
    _raw: loom::sync::RwLockWriteGuard<'a, ()>,
    _not_send: PhantomData<*const ()>,
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the write side and no biased reader
        // holds the lock (`write` revoked and waited): the data is this
        // guard's alone while it lives.
        #[cfg(not(expiremap_loom))]
        unsafe {
            &*self.lock.data.get()
        }
        // SAFETY: as above; loom checks the claim.
        #[cfg(expiremap_loom)]
        unsafe {
            &*self.ptr.deref()
        }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only
        // reference through the guard.
        #[cfg(not(expiremap_loom))]
        unsafe {
            &mut *self.lock.data.get()
        }
        // SAFETY: as above; loom checks the claim.
        #[cfg(expiremap_loom)]
        unsafe {
            self.ptr.deref()
        }
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: `write` took the write side and this guard releases it
        // once. (Under loom the raw guard field releases it.)
        #[cfg(not(expiremap_loom))]
        unsafe {
            self.lock.raw.unlock_exclusive()
        }
    }
}

#[cfg(all(test, not(expiremap_loom)))]
mod tests;

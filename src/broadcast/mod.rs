//! The reader-generation broadcast area: a lock-free, lossy, multi-writer,
//! multi-reader ring where every reader sees every message it keeps up with.
//!
//! ```
//! use expiremap::broadcast::{Sender, TryRecvError};
//!
//! let tx = Sender::new(4, 8).unwrap(); // 4 messages, up to 8 readers
//! let mut rx = tx.subscribe().unwrap();
//! for i in 0..6 {
//!     tx.send(i); // never waits for `rx`
//! }
//! assert_eq!(rx.try_recv(), Err(TryRecvError::Lagged(2))); // 0 and 1 were freed
//! assert_eq!(rx.try_recv(), Ok(2)); // the oldest message still held
//! let mut rest = Vec::new();
//! assert_eq!(rx.try_recv_batch(&mut rest, 10), Ok(3));
//! assert_eq!(rest, [3, 4, 5]);
//! drop(tx);
//! assert_eq!(rx.try_recv(), Err(TryRecvError::Closed));
//! ```
//!
//! # Algorithm
//!
//! The broadcast "area" of seed 004 (`shared/seeds/004_*.txt`), itself after
//! the LMAX Disruptor: messages get consecutive generation numbers; writers
//! reserve a generation by CAS on `write_gen`, write the slot, and publish in
//! order on `read_gen`. Every reader owns a cache-padded counter in a
//! fixed-size registry; cleanup reads them all to find what no reader can
//! still read, force-advances suspended readers, and raises `last_valid_gen`.
//! It differs from the seed where the seed had holes (see DESIGN.md §4): no
//! read while suspended, `T: Sync`, a power-of-two capacity, writers make room
//! themselves instead of failing, and an `Arc` replaces the tournament drop.
//! A freed message is then taken out of its slot (*cleared*) and dropped by
//! the receiver that passed it last (a *reclaim run*), or by a writer that
//! needs the slot; a slot is reused only once cleared.
//!
//! # Files
//!
//! * This file: the ground rules below and the writing end, [`Sender`]
//!   (reserve, write, publish through `Inner`; it writes a slot only
//!   between its `reserve` and its publish).
//! * `receiver.rs`: the reading end, [`Receiver`] and its guards; it reads
//!   slots only through its `Active` token.
//! * `ring.rs`: `Inner`, the state every handle shares, and every protocol
//!   step on it (cleanup, clearing, reclaim runs, registry, sleepers); it
//!   owns every shared field.
//! * `error.rs`: the error types.
//!
//! # Ground rules
//!
//! ## Generation encoding
//!
//! * A message's *generation* is `origin + seq` (wrapping), where `seq`
//!   counts messages from 0 and `origin` is 0 (a test-only constructor starts
//!   near `u64::MAX`). All counters hold `seq`, which fits in 63 bits: 2^63
//!   messages at one per nanosecond take 292 years.
//! * Ring slot of a message: `generation & (capacity - 1)`. The capacity is a
//!   power of two, so it divides 2^64 and the slot index never jumps, even
//!   when the generation wraps.
//! * Five shared counters, always `cleared <= clear_gen <= last_valid <=
//!   read_gen <= write_gen <= cleared + capacity`:
//!   `seq < cleared` is cleared (its value was taken out; its slot is empty
//!   and the writer of `seq + capacity` may write it); `seq < clear_gen` is
//!   claimed by a clearing thread; `seq < last_valid` is freed (no reader
//!   reads it again, its value may be taken out); `seq < read_gen` is
//!   published; `seq < write_gen` is reserved.
//!   Bit 63 of `read_gen` is `WAITING`: a receiver may be asleep (a thread
//!   parked, or an async receive's waker registered).
//! * A reader counter is `SUSPENDED | seq` (bit 63 set: the reader is between
//!   receives, claims nothing, will next read `seq`, and cleanup may move it
//!   forward) or an active `seq` (the reader is copying `seq` or later; cleanup
//!   never frees `seq` or anything after it). An empty registry slot is a
//!   reader suspended at some `seq` that nobody will resume (initially 0).
//!   Every counter's `seq` only grows.
//!
//! ## Who writes which field
//!
//! | field | written by | how |
//! | --- | --- | --- |
//! | `write_gen` | writers | CAS `seq -> seq + 1` (reserve) |
//! | slot of `seq` | the writer that reserved `seq`, until it publishes; then the thread that claimed `seq` in `clear_gen` | write the value (the slot is empty); take it out |
//! | `clear_gen` | clearing threads: reclaim runs, and writers that find the ring full | CAS `d -> d + 1` while `d < last_valid` (claim) |
//! | `cleared` | the claimant of `d` | store `d + 1` after waiting for `cleared == d` |
//! | `reclaim` `AGAIN` | a receiver that moved, or left | `fetch_or` |
//! | `reclaim` `RUNNING` | the runner: set by CAS from not running (clearing the other bits), cleared by CAS `RUNNING -> 0` (a `swap` back to `RUNNING` if `AGAIN` was set) | |
//! | `reclaim` `PENDING` | a runner that stops after `MAX_PASSES` scans with `AGAIN` set | `swap(PENDING)`, which also clears `RUNNING` |
//! | `read_gen` low bits | the writer that reserved `read_gen` | `swap(seq + 1)` after waiting for `read_gen == seq` |
//! | `read_gen` `WAITING` | sleeping receivers set it under `lock`; publish and the last sender's drop clear it; the last sleeper to give up clears it under `lock` | `fetch_or` / `swap` / `fetch_and` |
//! | `Sleepers` (behind `lock`) | parking threads count themselves; an async receive puts or takes its registry slot's waker; a notify takes every waker | under `lock` only |
//! | `last_valid` | cleanup (any writer) | `fetch_max` |
//! | reader counter, active | its reader only | plain stores (progress, suspend) |
//! | reader counter, suspended | its reader (resume, join) and cleanup (force) | CAS only |
//! | `taken` bit `i` (bit `i % 64` of word `i / 64`) | `subscribe` (`fetch_or`; it owns the slot if the bit was clear), `Receiver` drop (`fetch_and`) | |
//! | `joins` | `subscribe`, after taking its slot (`fetch_add(1)`); cleanup (`fetch_add(0)`, to read the latest) | AcqRel RMWs |
//!
//! A reader reads a slot only through an `Active` token, which exists only
//! between a successful resume CAS and the suspending store in its `Drop`: a
//! suspended reader cannot read, by construction.
//!
//! ## Happens-before edges
//!
//! * **P (publish -> read).** The writer of `seq` writes the slot, then moves
//!   `read_gen` past `seq` with a Release swap; a reader loads `read_gen`
//!   (Acquire) and reads only `seq < read_gen`. It keeps the value it loaded
//!   (`Receiver::known`) and reloads only once it has read up to it: the edge
//!   holds for every later receive on that thread, and the `Receiver` moves
//!   between threads only through a synchronizing hand-off. Each writer waits
//!   for `read_gen == seq` with Acquire loads, so edges chain over writers.
//! * **F (read -> free -> reuse).** A reader stores its counter past `seq`
//!   (Release) only after it finished reading `seq`. Cleanup loads every
//!   counter (Acquire), then raises `last_valid` with an AcqRel `fetch_max`;
//!   a clearing thread claims only below a `last_valid` it loaded
//!   (Acquire) or raised itself in that cleanup. So every read of the old
//!   message happens-before it is taken out.
//! * **C (clear -> reuse).** The claimant of `d` takes the value out, waits
//!   for `cleared == d` (Acquire), then stores `cleared = d + 1` (Release); a
//!   writer loads `cleared` (Acquire) before it reserves `seq`, and reserves
//!   only `seq < cleared + capacity`. So the take of `seq - capacity` (and,
//!   through the chain of claimants, of every earlier sequence) happens-before
//!   the writer writes the slot. Nothing runs user code between a claim and
//!   its `cleared` store, so a writer that waits for `cleared` waits for a
//!   move, never for a `Drop`.
//! * **R (move -> reclaim).** A receiver that moved past sequences stores its
//!   counter (Release), then `fetch_or(AGAIN)` (AcqRel) on `reclaim`. All
//!   RMWs on `reclaim` are AcqRel, so whichever of them comes later in its
//!   order sees the earlier: a run that starts (CAS to `RUNNING`) after a
//!   move's RMW sees the moved counter; a run in progress during it reads
//!   `AGAIN` at its end and scans again; a run that ended before it released
//!   its `last_valid` to the mover.
//! * **Claims.** Cleanup frees below `target` only after seeing every counter
//!   at `>= target`, or a suspended one it moved there by CAS. A reader
//!   resumes by CAS `SUSPENDED | s -> s`; both are RMWs on one location, so
//!   either cleanup saw the active claim (and waited for it or lowered
//!   `target`), or the resume reads the forced value and reports the lag. A
//!   joining reader takes a registry slot, then CASes the slot's counter to
//!   `max(counter, read_gen)`; an empty slot is always a counter too, so a
//!   cleanup racing the join is just a cleanup racing a resume (Pin 3).
//! * **J (join -> cleanup that skips empty slots).** Cleanup first visits
//!   only the slots whose `taken` bit it sees, without moving empty ones.
//!   It loads `joins` before it loads `read_gen`, and `fetch_add(0)`s it
//!   after the scan. A joiner sets its bit, then `fetch_add(1)`s `joins`,
//!   then loads `read_gen`. If the two values cleanup read are equal, each
//!   joiner's RMW is before the first (which acquired it, so the scan saw
//!   the bit: a real reader, claims respected as above) or after the
//!   second (which the joiner acquires, so its `read_gen` load sees at
//!   least what cleanup loaded, and it starts at or past the target). If
//!   they differ, cleanup scans again visiting every slot and moving empty
//!   ones as before.
//! * **W (publish/close -> wake).** See `Inner::park`: the parking receiver
//!   and the publisher (or last sender) both RMW `read_gen`, so one of them
//!   sees the other. Before parking, a blocking receive spins and yields
//!   briefly while watching `read_gen` (not under loom), so a receiver that
//!   keeps up rarely makes a publish pay a wake-up. An async receive
//!   sleeps by the same edge (next section).
//!
//! ## Async receives: the waker protocol
//!
//! [`Receiver::poll_recv`] (behind [`Receiver::recv_async`] and the
//! `Stream` impl) is the blocking receive with the park replaced by a waker
//! registration; the publish path is the same code, so a writer pays for a
//! sleeping task exactly what it pays for a parked thread, and nothing when
//! nobody sleeps (`WAITING` clear: one `swap`, as before).
//!
//! 1. *Look.* `try_recv`; anything but `Empty` is returned (`Ready`).
//! 2. *Register* (`Inner::register`), all under `lock`: put the waker in the
//!    receiver's registry slot of `Sleepers::wakers` (replacing the one an
//!    earlier poll left unless it `will_wake` the same task), *then*
//!    `fetch_or(WAITING)` on `read_gen`. If that RMW read a sequence other
//!    than the receiver's `next`, or `senders == 0`, something happened
//!    since step 1: take the waker back out and go to 1. Else `Pending`.
//! 3. *Notify* (`Inner::notify_all`, owed by a publish or the last sender's
//!    drop whose RMW on `read_gen` found `WAITING`): under `lock`, notify
//!    the condition variable if a thread is parked, and take the wakers out
//!    (at most `WAKE_BATCH` per hold); wake them after releasing `lock`.
//! 4. *Give up* (the future dropped, or the receiver dropped while its
//!    `Stream` poll was pending; also after a `Ready` that followed a
//!    `Pending`): `Inner::unregister` takes the slot's waker out under
//!    `lock`, and if no thread is parked and no waker is left, clears
//!    `WAITING`, so an abandoned receive leaves no wake-up for the next
//!    publish to pay.
//!
//! No lost wake-up: the publish's `swap` (or close's `fetch_and`) and step
//! 2's `fetch_or` are RMWs on one location, so one reads the other. If the
//! publish came first, step 2 reads its sequence (or, through the AcqRel
//! chain of `senders`, the close) and does not sleep. If step 2 came first,
//! the publish reads `WAITING` and notifies; its `lock` is taken after its
//! `swap`, so after step 2 released `lock` (which it held across the
//! `fetch_or`), and it finds the waker. Clearing `WAITING` in step 4 is safe
//! because every sleeper sets it again under `lock` before sleeping, and
//! step 4 holds `lock` and sees none. A waker is user code: it is cloned
//! under `lock` but woken and dropped outside it, so a waker that polls or
//! drops the future inline cannot deadlock on `lock`.
//!
//! No dangling waker: a slot's waker is only ever the latest one its
//! receiver registered; the receiver's `Drop` (and the future's) takes it
//! out before the registry slot is given back, so a new receiver never
//! inherits one. A task can be woken spuriously, never more than once per
//! notify: a notify that took its waker just before the task gave up, or
//! one whose pass took it again after it registered anew.
//!
//! ## Cleanup
//!
//! A writer that finds the ring full (`write_gen == cleared + capacity`)
//! runs cleanup for `needed = write_gen + 1 - capacity` (unless `last_valid`
//! is there already): it frees up to the
//! smallest claim of a registered reader, but at least up to `needed`.
//! Suspended readers below `needed` are moved to exactly `needed`, so a
//! reader with at most `capacity` unread messages never loses any, and a
//! reader that did lose messages resumes at the oldest message still held and
//! reports `Lagged(n)` with the exact count. The only reader a writer waits
//! for is an active one below `needed`: it is copying one message.
//!
//! A writer on a full ring also clears what it needs (it claims
//! `seq - capacity` in `clear_gen`, or waits for the thread that claimed it
//! to store `cleared`), and drops the value after it publishes: at most
//! `capacity` messages are alive at a time and no user code runs between
//! reserve and publish.
//!
//! ## Reclaim runs
//!
//! A message leaves the ring once every registered reader has passed it,
//! not when its slot is reused. After a receive moves a reader (a message
//! received or borrowed and released, tombstones skipped, a lag reported)
//! or a receiver leaves, `Inner::passed`:
//!
//! 1. `fetch_or(AGAIN)` on `reclaim`. If `RUNNING` was set, stop: the run
//!    in progress scans again before it ends (edge R).
//! 2. If the reader's old position is above `last_valid` and `PENDING` is
//!    clear, stop: the last run found a lower claim, held by a reader that
//!    has not moved since (its move would have run, or set `AGAIN` on the
//!    run in progress), so this move freed nothing. A leaving receiver
//!    never stops here.
//! 3. Become the runner: CAS to `RUNNING` (clearing `AGAIN`) unless a run
//!    started meanwhile (it saw this move: stop).
//! 4. Run cleanup with `needed = 0`: it frees up to the lowest claim of a
//!    registered reader and forces nobody. Then clear everything below
//!    `last_valid`, dropping each value after its `cleared` store.
//! 5. CAS `RUNNING -> 0`; if `AGAIN` was set meanwhile, swap back to
//!    `RUNNING` and go to 4, at most `MAX_PASSES` (4) scans in all. After
//!    that, `swap(PENDING)` and stop: while readers keep moving, one
//!    receive does not serve the others for as long as they do, and the
//!    next mover runs whatever its position.
//!
//! A receive that moves nothing (`Empty`, `Closed`) runs too if `PENDING` is
//! set (one load otherwise). A joining reader sets `PENDING` once its
//! counter is in place: a run that scanned during the join saw the slot
//! taken with its old counter and kept everything from there, and a join
//! may not drop values itself (a map subscribes under its own lock).
//!
//! So the receive (or drop) that passes a message last drops it, or a run
//! already in progress does. The exceptions are a run that stopped at
//! `MAX_PASSES` and a run that raced a join: what they kept waits for the
//! next receive of any receiver (or a writer that needs the slots). A receiver that
//! never reads claims its position, so what it has not read stays until a writer needs the slot
//! and forces it forward, as before. A force-advanced reader moves only
//! when it next receives. Values dropped by a run are user code: `RUNNING`
//! is no lock (nobody waits for it; a writer clears what it needs itself),
//! and no lock of ours is held. A panicking `Drop` is caught, the run goes
//! on dropping the rest and ends cleanly, and the receiver keeps the first
//! panic and resumes it when it is dropped (a receive returns what it got).
//!
//! A reclaim run costs the receiver a few RMWs and a scan of the registered
//! readers (one load per 64 registry slots for the `taken` bits, then one
//! per registered reader); a writer pays nothing for it, and no longer runs
//! cleanup while readers keep up.
//!
//! ## Writer panics
//!
//! A writer's slot is emptied right after it reserves it, and a guard
//! publishes the slot if the writer unwinds before writing it. Such an empty
//! published slot is a *tombstone*: receivers skip it silently. It still
//! occupies a generation, so if a receiver lags over it, it is counted in
//! `Lagged(n)` like a message.
//!
//! ## Lifetime
//!
//! Handles share one `Arc`; `Sender`s are also counted, and the last one to
//! go marks the area closed and wakes parked receivers. The ring drops every
//! message it still holds when the last handle goes. Nothing waits in
//! `Drop` except a receiver's reclaim run (a `Receiver` or `RecvRef` drop),
//! and that only for another thread's clearing mid-move (edge C).
//!
//! # Rejected at compile time
//!
//! A message type that is not `Sync` would let two receivers share a `&T`
//! across threads:
//!
//! ```compile_fail,E0599
//! use expiremap::broadcast::Sender;
//! let tx = Sender::<std::cell::Cell<u32>>::new(4, 1); // Cell is not Sync
//! ```
//!
//! A reference obtained from a receiver cannot outlive the guard that keeps
//! the reader active (reading while suspended is impossible):
//!
//! ```compile_fail,E0597
//! use expiremap::broadcast::Sender;
//! let tx = Sender::<String>::new(4, 1).unwrap();
//! let mut rx = tx.subscribe().unwrap();
//! tx.send("a".to_string());
//! let s: &String = {
//!     let guard = rx.try_recv_ref().unwrap();
//!     &*guard
//! }; // the guard suspends the reader here
//! println!("{s}");
//! ```

mod error;
mod receiver;
mod ring;

#[cfg(all(test, not(expiremap_loom)))]
mod tests;
#[cfg(all(test, not(expiremap_loom)))]
mod tests_async;

use crate::BuildError;
#[cfg(feature = "stream")]
pub use error::Lagged;
pub use error::{RecvError, RecvTimeoutError, SubscribeError, TryRecvError};
pub use receiver::{Receiver, Recv, RecvRef};

use crate::sync::Arc;
use crate::unwind::Panics;
use ring::{Freed, Inner};
use std::fmt;

/// The writing end of a broadcast area. Clones are more writers of the same
/// area; the area closes when the last one is dropped.
///
/// `Send + Sync` when `T: Send + Sync`.
pub struct Sender<T> {
    inner: Arc<Inner<T>>,
}

impl<T: Send + Sync> Sender<T> {
    /// A new area holding up to `capacity` messages for up to `max_readers`
    /// live receivers.
    ///
    /// `capacity` must be a power of two (at least 1) and `max_readers` at
    /// least 1; otherwise the error names the bad setting.
    ///
    /// ```
    /// use expiremap::BuildError;
    /// use expiremap::broadcast::Sender;
    /// assert!(Sender::<u32>::new(1024, 16).is_ok());
    /// assert_eq!(
    ///     Sender::<u32>::new(1000, 16).unwrap_err(),
    ///     BuildError::EventCapacity(1000)
    /// );
    /// assert_eq!(Sender::<u32>::new(8, 0).unwrap_err(), BuildError::MaxSubscribers(0));
    /// ```
    pub fn new(capacity: usize, max_readers: usize) -> Result<Self, BuildError> {
        Self::with_origin(capacity, max_readers, 0)
    }

    /// Like [`Sender::new`], with generation `origin` for the first message.
    fn with_origin(capacity: usize, max_readers: usize, origin: u64) -> Result<Self, BuildError> {
        if !capacity.is_power_of_two() {
            return Err(BuildError::EventCapacity(capacity));
        }
        if max_readers == 0 {
            return Err(BuildError::MaxSubscribers(0));
        }
        Ok(Self {
            inner: Arc::new(Inner::new(capacity, max_readers, origin)),
        })
    }

    /// Test-only: the first message gets generation `u64::MAX - capacity`
    /// (or `origin` as given), so generations wrap within a few messages.
    #[cfg(test)]
    pub(crate) fn with_start_generation(
        capacity: usize,
        max_readers: usize,
        origin: u64,
    ) -> Result<Self, BuildError> {
        Self::with_origin(capacity, max_readers, origin)
    }

    /// Publishes `value` to every current receiver.
    ///
    /// Never waits for a slow receiver: if the ring is full, this writer runs
    /// cleanup and frees the oldest message, and receivers that had not read
    /// it get [`TryRecvError::Lagged`]. It may wait briefly for a receiver
    /// that is in the middle of copying the oldest message out, for another
    /// thread moving a freed message out of its slot, and for earlier
    /// writers to publish (messages are published in order). Receivers
    /// that keep up drop what they have all passed themselves, so a send
    /// then neither frees nor drops anything.
    ///
    /// A receiver's `T::clone` (or a held [`RecvRef`]) must not send on the
    /// same area: that writer could wait for its own reader.
    pub fn send(&self, value: T) {
        self.send_with(move || value);
    }

    /// Sends every value of `values`, in order, as if by repeated
    /// [`send`](Self::send), but wakes parked receivers once, after the last
    /// one, instead of once per message: a burst costs one wake-up.
    ///
    /// ```
    /// use expiremap::broadcast::Sender;
    /// let tx = Sender::new(8, 1).unwrap();
    /// let mut rx = tx.subscribe().unwrap();
    /// tx.send_batch([1, 2, 3]);
    /// assert_eq!((rx.recv(), rx.recv(), rx.recv()), (Ok(1), Ok(2), Ok(3)));
    /// ```
    ///
    /// A message that a send takes out of a full ring (the oldest) is
    /// dropped there; if its `Drop` panics, the rest of `values` is still
    /// sent, and the first such panic is resumed once all of them were.
    pub fn send_batch(&self, values: impl IntoIterator<Item = T>) {
        let mut panics = Panics::new();
        {
            let mut wake = OwedWake {
                inner: &self.inner,
                owed: false,
            };
            for value in values {
                let freed = self.send_owing(move || value, &mut wake.owed);
                panics.drop_each(freed);
            }
            // `wake` delivers an owed wake-up here, or while unwinding.
        }
        panics.resume();
    }

    /// Reserves a slot, builds the value with `make`, publishes it. If `make`
    /// unwinds, the slot is published as a tombstone so the ring keeps going.
    fn send_with(&self, make: impl FnOnce() -> T) {
        let mut wake = OwedWake {
            inner: &self.inner,
            owed: false,
        };
        let freed = self.send_owing(make, &mut wake.owed);
        // The freed messages' `Drop` runs after publishing, outside the
        // reserve..publish window.
        drop(wake);
        if !freed.is_empty() {
            let mut panics = Panics::new();
            panics.drop_each(freed);
            panics.resume();
        }
    }

    /// The body of every send. A wake-up owed by the publish is added to
    /// `owed`; the caller's [`OwedWake`] delivers it. Returns the messages
    /// the send took out of a full ring, for the caller to drop.
    #[must_use]
    fn send_owing(&self, make: impl FnOnce() -> T, owed: &mut bool) -> Freed<T> {
        let inner = &*self.inner;
        let mut freed = Freed::new();
        let seq = inner.reserve(&mut freed);
        let slot = inner.slot(seq);
        let publish = Publish { inner, seq, owed };
        let value = make();
        // SAFETY: `reserve` made this writer the only thread that touches
        // `slot(seq)` until `seq` is published (the guard publishes only
        // when dropped, below), and the take of the slot's previous message
        // happened-before (edge C), so the slot is empty and nobody reads
        // or takes it meanwhile.
        slot.with_mut(|p| unsafe {
            debug_assert!((*p).is_none());
            *p = Some(value);
        });
        drop(publish);
        freed
    }

    /// Registers a new receiver. It starts at the next message published
    /// after it joined.
    ///
    /// ```
    /// use expiremap::broadcast::{Sender, SubscribeError};
    /// let tx = Sender::<u8>::new(8, 1).unwrap();
    /// let rx = tx.subscribe().unwrap();
    /// assert_eq!(tx.subscribe().unwrap_err(), SubscribeError::RegistryFull { max_readers: 1 });
    /// drop(rx);
    /// assert!(tx.subscribe().is_ok()); // the slot is reused
    /// ```
    pub fn subscribe(&self) -> Result<Receiver<T>, SubscribeError> {
        match self.inner.join() {
            Some((slot, next)) => Ok(Receiver::new(Arc::clone(&self.inner), slot, next)),
            None => Err(SubscribeError::RegistryFull {
                max_readers: self.inner.max_readers(),
            }),
        }
    }

    /// The number of live receivers (one atomic load): a writer can skip
    /// building a message when it is 0.
    pub fn receiver_count(&self) -> usize {
        self.inner.receiver_count()
    }

    /// Messages that receivers lost to lags, counted as each reports its
    /// `Lagged(n)` (a lag not yet reported is not counted).
    pub fn lost(&self) -> u64 {
        self.inner.lost_total()
    }

    /// The number of messages the ring holds.
    pub fn capacity(&self) -> usize {
        self.inner.capacity()
    }
}

/// Publishes its sequence when dropped, whether the slot was written or the
/// writer is unwinding (then the slot is a tombstone). A wake-up the publish
/// owes is added to `owed`.
struct Publish<'a, 'b, T> {
    inner: &'a Inner<T>,
    seq: u64,
    owed: &'b mut bool,
}

/// Delivers a wake-up owed by one or more publishes when dropped, so that it
/// is delivered even if a message's `Drop` unwinds in the middle of a batch.
struct OwedWake<'a, T> {
    inner: &'a Inner<T>,
    owed: bool,
}

impl<T> Drop for OwedWake<'_, T> {
    fn drop(&mut self) {
        if self.owed {
            self.inner.notify_all();
        }
    }
}

impl<T> Drop for Publish<'_, '_, T> {
    fn drop(&mut self) {
        *self.owed |= self.inner.publish_owing(self.seq);
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.inner.add_sender();
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        self.inner.remove_sender();
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("area", &*self.inner)
            .finish()
    }
}

//! The reading end of a broadcast area: [`Receiver`], its receives
//! (blocking, non-blocking, in place, batched, async) and the `Active`
//! token through which alone a reader reads a slot.
//!
//! Owns the receiver's own state (`next`, `known`, `registered`, the panic
//! it keeps) and its registry counter while active. It touches the shared ring only through
//! `Inner`'s methods, and reads a slot only through an `Active` token, under
//! the ground rules of the parent module (edges P, F and R).

#[cfg(feature = "stream")]
use super::error::Lagged;
use super::error::{RecvError, RecvTimeoutError, TryRecvError};
use super::ring::{Backoff, Inner, SEQ, SUSPENDED};
use crate::clock::{Clock, SystemClock};
use crate::sync::{Arc, Ordering};
use crate::unwind::Panics;
use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// Backoff steps a blocking receive spends watching `read_gen` before it
/// parks: 6 rounds of doubling spins (127 `spin_loop` hints in all), then
/// 4 yields of the thread.
const SPINS_BEFORE_PARK: u32 = 10;

/// The reading end of a broadcast area: one registry slot and a position.
/// Created by [`Sender::subscribe`](super::Sender::subscribe); dropping it
/// frees the registry slot.
///
/// A message leaves the ring (is dropped) as soon as every receiver has
/// passed it: received it, lost it to a lag, or gone away. The receive (or
/// the receiver's drop) that passes it last drops it. If such a `Drop`
/// panics, the receive still returns what it got, and the first such panic
/// is resumed when this receiver is dropped.
///
/// `Send` when `T: Send + Sync`.
pub struct Receiver<T> {
    pub(super) inner: Arc<Inner<T>>,
    /// Registry slot owned by this receiver.
    pub(super) slot: usize,
    /// Next sequence to read, as this receiver last set it. The counter may
    /// have been force-advanced past it since; the difference is the lag.
    next: u64,
    /// The highest `read_gen` this receiver has loaded (Acquire), or `next`
    /// if higher: `next..known` is published and its writes happened-before.
    /// Receives use it instead of loading the hot `read_gen` line again.
    known: u64,
    /// `true` if an async receive may have left a waker in this receiver's
    /// place in `Sleepers` (a notify may have taken it since).
    registered: bool,
    /// The first panic of a message's `Drop` that a receive ran (as the
    /// last receiver to pass it), resumed when the receiver is dropped.
    panics: KeptPanic,
}

/// What an active reader found at its position.
enum Next {
    /// A message is at `Active::pos`.
    Ready,
    /// Nothing published yet; senders remain.
    Empty,
    /// Nothing left and every sender is gone.
    Closed,
}

/// Proof that a receiver is active: its counter holds a claim at or below
/// `pos`, so nothing from `pos` on is freed while this token lives. Only
/// [`Receiver::resume`] creates one; its `Drop` suspends the reader at `pos`.
pub(super) struct Active<'a, T> {
    pub(super) rx: &'a mut Receiver<T>,
    /// Next sequence to read; the stored claim is `<= pos`.
    pos: u64,
    /// `read_gen` as last loaded: `pos..limit` is published.
    limit: u64,
    /// The receiver's `next` when it resumed: it has passed `from..pos`
    /// (read them, skipped tombstones, or lost them to a lag) once it
    /// suspends at `pos`.
    from: u64,
    /// `true` once [`suspend`](Self::suspend) ran: the token no longer
    /// claims anything and must not store the counter again (cleanup may
    /// have force-advanced it since).
    suspended: bool,
}

impl<T> Active<'_, T> {
    /// Skips tombstones and reports whether a message is at `pos`.
    fn advance(&mut self) -> Next {
        loop {
            if self.pos == self.limit {
                self.limit = self.rx.inner.published();
                if self.pos == self.limit {
                    if !self.rx.inner.closed() {
                        return Next::Empty;
                    }
                    // Closed: every publish happened-before; look once more.
                    self.limit = self.rx.inner.published();
                    if self.pos == self.limit {
                        return Next::Closed;
                    }
                }
            }
            if self.current().is_some() {
                return Next::Ready;
            }
            self.pos += 1; // a tombstone left by a panicking writer
        }
    }

    /// The message at `pos` (`None` for a tombstone). Requires `pos < limit`.
    fn current(&self) -> Option<&T> {
        assert!(self.pos < self.limit);
        #[cfg(all(debug_assertions, not(expiremap_loom)))]
        debug_assert_eq!(
            self.rx.inner.counter(self.rx.slot).load(Ordering::Relaxed) & SUSPENDED,
            0,
            "read by a suspended reader"
        );
        // SAFETY: `pos < limit`, a value of `read_gen` this receiver loaded
        // with Acquire (now or in an earlier receive: `known`), so the slot
        // holds `pos`'s message and its write happened-before
        // (edge P). This token's claim is `<= pos` and stays so while `&self`
        // is borrowed (claims only change through `&mut self` or `Drop`), so
        // no writer takes or overwrites the slot until then (edge F).
        self.rx
            .inner
            .slot(self.pos)
            .with(|p| unsafe { (*p).as_ref() })
    }

    /// Clones the message at `pos` and moves past it. Requires `Ready`.
    fn take_clone(&mut self) -> T
    where
        T: Clone,
    {
        // If `clone` unwinds, `Drop` suspends at `pos`: the message is
        // retried by the next receive.
        let value = self.current().expect("advance returned Ready").clone();
        self.pos += 1;
        value
    }

    /// Publishes progress without suspending, so that a writer waiting for
    /// this reader (mid-batch) waits for one message, not the whole batch.
    fn release_before_pos(&self) {
        let counter = self.rx.inner.counter(self.rx.slot);
        // Release: edge F for every message below `pos`.
        counter.store(self.pos, Ordering::Release);
    }
}

impl<T> Active<'_, T> {
    /// Suspends the reader at `pos`, once. After this the token reads
    /// nothing (`current` asserts so in debug builds).
    fn suspend(&mut self) {
        if std::mem::replace(&mut self.suspended, true) {
            return;
        }
        let counter = self.rx.inner.counter(self.rx.slot);
        // Release: edges F and R. Plain store: only the owner writes an
        // active counter; cleanup's CAS expects a suspended value and fails.
        counter.store(SUSPENDED | self.pos, Ordering::Release);
        self.rx.next = self.pos;
        self.rx.known = self.limit;
    }

    /// Suspends the reader, then drops the values it was the last to pass
    /// ([`Inner::passed`]). A panic of their `Drop` is kept by the receiver
    /// (its first one) and resumed when the receiver is dropped, so that no
    /// receive loses the message or the lag it reports.
    fn release(&mut self) {
        self.suspend();
        if self.pos > self.from {
            let rx = &mut *self.rx;
            rx.inner.passed(self.from, &mut rx.panics.0);
        }
    }
}

impl<T> Drop for Active<'_, T> {
    /// Suspends without reclaiming (a receive that unwinds, say from a
    /// panicking `clone`): the next receive's move reclaims.
    fn drop(&mut self) {
        self.suspend();
    }
}

impl<T> Receiver<T> {
    /// A receiver in registry slot `slot`, whose next message is `next`.
    pub(super) fn new(inner: Arc<Inner<T>>, slot: usize, next: u64) -> Self {
        Self {
            inner,
            slot,
            next,
            known: next,
            registered: false,
            panics: KeptPanic::default(),
        }
    }

    /// Fast check, without becoming active: `true` if nothing was published
    /// past `next`. Loads `read_gen` only when everything known was read. A
    /// forced advance never passes `read_gen`, so a lagged receiver is never
    /// reported empty.
    fn nothing_new(&mut self) -> bool {
        if self.next < self.known {
            return false;
        }
        self.known = self.inner.published();
        self.known == self.next
    }

    /// The start of every non-blocking receive: `Empty`/`Closed` without
    /// becoming active if nothing new was published; otherwise resumes, and
    /// reports a lag (suspending again at the oldest message held) before
    /// anything is read.
    fn begin(&mut self) -> Result<Active<'_, T>, TryRecvError> {
        if self.nothing_new() {
            self.inner.passed_nothing(&mut self.panics.0);
            return Err(self.empty_or_closed());
        }
        let (mut active, lag) = self.resume();
        if lag > 0 {
            active.rx.inner.lost(lag);
            active.release();
            return Err(TryRecvError::Lagged(lag));
        }
        Ok(active)
    }

    /// Becomes active: CAS `SUSPENDED | s -> s` on our own counter, where `s`
    /// may have been moved forward by cleanup since we suspended. Returns the
    /// token and the number of messages lost in between.
    fn resume(&mut self) -> (Active<'_, T>, u64) {
        let counter = self.inner.counter(self.slot);
        let mut cur = counter.load(Ordering::Relaxed);
        loop {
            debug_assert!(cur & SUSPENDED != 0, "resume of an active reader");
            match counter.compare_exchange_weak(
                cur,
                cur & SEQ,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        let pos = cur & SEQ;
        debug_assert!(pos >= self.next);
        let lag = pos - self.next;
        let active = Active {
            pos,
            // `known` was loaded with Acquire by this receiver: still valid.
            limit: pos.max(self.known),
            from: self.next,
            suspended: false,
            rx: self,
        };
        (active, lag)
    }

    /// Before parking, spins (then yields) for a short while, watching
    /// `read_gen` only: a receiver that keeps up with its writer would
    /// otherwise park after nearly every message and make every publish pay
    /// a wake-up. Returns `true` if something was published or the area
    /// closed. Not under loom, where spinning only multiplies schedules.
    fn spin_for_news(&mut self) -> bool {
        if cfg!(expiremap_loom) {
            return false;
        }
        let mut backoff = Backoff::new();
        for _ in 0..SPINS_BEFORE_PARK {
            backoff.snooze();
            if !self.nothing_new() || self.inner.closed() {
                return true;
            }
        }
        false
    }

    /// Takes this receiver's waker out of the ring if an async receive left
    /// one there. Costs a lock only after an async receive went to sleep.
    fn unregister(&mut self) {
        if std::mem::take(&mut self.registered) {
            self.inner.unregister(self.slot);
        }
    }

    /// `Err(Closed)` if closed and drained, else `Err(Empty)`; no activation.
    fn empty_or_closed(&mut self) -> TryRecvError {
        if self.inner.closed() && self.nothing_new() {
            TryRecvError::Closed
        } else {
            TryRecvError::Empty
        }
    }
}

impl<T: Send + Sync> Receiver<T> {
    /// Borrows the next message in place, without cloning. The receiver
    /// stays active while the guard lives, and a writer that needs this
    /// message's slot waits for the guard: keep it short.
    ///
    /// ```
    /// use expiremap::broadcast::Sender;
    /// let tx = Sender::new(4, 1).unwrap();
    /// let mut rx = tx.subscribe().unwrap();
    /// tx.send(String::from("hello"));
    /// let msg = rx.try_recv_ref().unwrap();
    /// assert_eq!(msg.len(), 5);
    /// ```
    pub fn try_recv_ref(&mut self) -> Result<RecvRef<'_, T>, TryRecvError> {
        let mut active = self.begin()?;
        let err = match active.advance() {
            Next::Ready => {
                let seq = active.pos;
                active.pos += 1; // suspend past it when the guard drops
                return Ok(RecvRef { active, seq });
            }
            Next::Empty => TryRecvError::Empty,
            Next::Closed => TryRecvError::Closed,
        };
        active.release(); // it may have skipped tombstones
        Err(err)
    }
}

impl<T: Clone + Send + Sync> Receiver<T> {
    /// Receives the next message, blocking until one is published or every
    /// sender is gone.
    ///
    /// `Err(Lagged(n))` reports `n` lost messages; the next call continues
    /// from the oldest message still held. `Err(Closed)` means every sender
    /// is gone and everything was received.
    pub fn recv(&mut self) -> Result<T, RecvError> {
        loop {
            match self.try_recv() {
                Ok(v) => return Ok(v),
                Err(TryRecvError::Lagged(n)) => return Err(RecvError::Lagged(n)),
                Err(TryRecvError::Closed) => return Err(RecvError::Closed),
                Err(TryRecvError::Empty) => {
                    if !self.spin_for_news() {
                        self.inner.park(self.next, None);
                    }
                }
            }
        }
    }

    /// Receives the next message if one is available now.
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        let mut active = self.begin()?;
        let r = match active.advance() {
            Next::Ready => Ok(active.take_clone()),
            Next::Empty => Err(TryRecvError::Empty),
            Next::Closed => Err(TryRecvError::Closed),
        };
        active.release();
        r
    }

    /// Receives the next message asynchronously: the future resolves as
    /// [`recv`](Self::recv) returns, on any executor. While nothing is
    /// published the task sleeps with its waker registered in the ring,
    /// and the next publish (or the last sender leaving) wakes it. Dropping
    /// the future takes the waker back out.
    ///
    /// The future borrows the receiver, so a message it has not yet
    /// returned is never lost: a receive given up (the future dropped, say
    /// by a `select!` that took another branch) leaves it for the next one.
    ///
    /// Polled by hand, with a waker that counts its wake-ups:
    ///
    /// ```
    /// use expiremap::broadcast::Sender;
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::task::{Context, Poll, Wake, Waker};
    ///
    /// struct CountWakes(AtomicUsize);
    /// impl Wake for CountWakes {
    ///     fn wake(self: Arc<Self>) {
    ///         self.0.fetch_add(1, Ordering::SeqCst);
    ///     }
    /// }
    ///
    /// let tx = Sender::new(4, 1).unwrap();
    /// let mut rx = tx.subscribe().unwrap();
    /// let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
    /// let waker = Waker::from(Arc::clone(&wakes));
    /// let mut cx = Context::from_waker(&waker);
    ///
    /// let mut recv = pin!(rx.recv_async());
    /// assert!(recv.as_mut().poll(&mut cx).is_pending()); // asleep, waker registered
    /// tx.send(7);
    /// assert_eq!(wakes.0.load(Ordering::SeqCst), 1); // the publish woke it
    /// assert_eq!(recv.as_mut().poll(&mut cx), Poll::Ready(Ok(7)));
    /// ```
    pub fn recv_async(&mut self) -> Recv<'_, T> {
        Recv { rx: self }
    }

    /// The poll behind [`recv_async`](Self::recv_async) and the `Stream`
    /// impl: `Ready` as [`recv`](Self::recv) returns, or `Pending` with
    /// `cx`'s waker registered in the ring (replacing one an earlier poll
    /// left), to be woken by the next publish or the last sender leaving.
    /// The waker stays registered until a later poll returns `Ready`, the
    /// waker is woken, or the receiver is dropped.
    ///
    /// ```
    /// use expiremap::broadcast::{RecvError, Sender};
    /// use std::task::{Context, Poll, Waker};
    ///
    /// let tx = Sender::new(4, 1).unwrap();
    /// let mut rx = tx.subscribe().unwrap();
    /// let mut cx = Context::from_waker(Waker::noop());
    /// assert_eq!(rx.poll_recv(&mut cx), Poll::Pending);
    /// tx.send("a");
    /// assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Ok("a")));
    /// drop(tx);
    /// assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Err(RecvError::Closed)));
    /// ```
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Result<T, RecvError>> {
        loop {
            let r = match self.try_recv() {
                Ok(v) => Ok(v),
                Err(TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
                Err(TryRecvError::Closed) => Err(RecvError::Closed),
                Err(TryRecvError::Empty) => {
                    // `register` returns `false` with the waker taken back
                    // out: something was published or the area closed since
                    // `try_recv` looked.
                    self.registered = self.inner.register(self.slot, self.next, cx.waker());
                    if self.registered {
                        return Poll::Pending;
                    }
                    continue;
                }
            };
            self.unregister();
            return Poll::Ready(r);
        }
    }

    /// Like [`recv`](Self::recv), but gives up with `Err(Timeout)` after
    /// `timeout`.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        let clock = SystemClock::new();
        let limit = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        loop {
            match self.try_recv() {
                Ok(v) => return Ok(v),
                Err(TryRecvError::Lagged(n)) => return Err(RecvTimeoutError::Lagged(n)),
                Err(TryRecvError::Closed) => return Err(RecvTimeoutError::Closed),
                Err(TryRecvError::Empty) => {}
            }
            let elapsed = clock.now();
            if elapsed >= limit {
                return Err(RecvTimeoutError::Timeout);
            }
            if self.spin_for_news() {
                continue;
            }
            let left = Duration::from_nanos(limit - elapsed);
            if self.inner.park(self.next, Some(left)) {
                // One last look: a message may have landed with the timeout.
                return self.try_recv().map_err(|e| match e {
                    TryRecvError::Empty => RecvTimeoutError::Timeout,
                    TryRecvError::Lagged(n) => RecvTimeoutError::Lagged(n),
                    TryRecvError::Closed => RecvTimeoutError::Closed,
                });
            }
        }
    }

    /// Appends up to `max` available messages to `out`, activating once for
    /// the whole batch. Returns how many were appended (at least 1), or the
    /// same errors as [`try_recv`](Self::try_recv) when none were; `max == 0`
    /// returns `Ok(0)`.
    pub fn try_recv_batch(&mut self, out: &mut Vec<T>, max: usize) -> Result<usize, TryRecvError> {
        if max == 0 {
            return Ok(0);
        }
        let mut active = self.begin()?;
        let mut n = 0;
        let r = loop {
            if n == max {
                break Ok(n);
            }
            match active.advance() {
                Next::Ready => {
                    out.push(active.take_clone());
                    n += 1;
                    active.release_before_pos();
                }
                Next::Empty if n > 0 => break Ok(n),
                Next::Closed if n > 0 => break Ok(n),
                Next::Empty => break Err(TryRecvError::Empty),
                Next::Closed => break Err(TryRecvError::Closed),
            }
        };
        active.release();
        r
    }
}

impl<T> Drop for Receiver<T> {
    /// Gives the registry slot back, then drops the messages no other
    /// receiver still needs. Resumes the first panic of a message's `Drop`
    /// run by this receiver, here or in any of its receives.
    fn drop(&mut self) {
        self.unregister();
        self.inner.leave(self.slot, &mut self.panics.0);
        std::mem::take(&mut self.panics.0).resume();
    }
}

/// The first panic of a message's `Drop` run by a receiver's receives,
/// kept until the receiver is dropped.
#[derive(Default)]
pub(super) struct KeptPanic(Panics);

// SAFETY: the payload is `Send` but not `Sync`; a `KeptPanic` is only ever
// touched through `&mut` (its receiver's receives and drop), never through
// `&`, so sharing `&KeptPanic` across threads gives access to nothing.
unsafe impl Sync for KeptPanic {}

/// `Stream` of the messages, ending after every sender is gone and
/// everything was received. A lag is an item, `Err(Lagged(n))`, after which
/// the stream continues from the oldest message still held.
///
/// ```
/// use expiremap::broadcast::{Lagged, Sender};
/// use futures_core::Stream;
/// use std::pin::Pin;
/// use std::task::{Context, Poll, Waker};
///
/// let tx = Sender::new(2, 1).unwrap();
/// let mut rx = tx.subscribe().unwrap();
/// for i in 0..3 {
///     tx.send(i);
/// }
/// drop(tx);
/// let mut cx = Context::from_waker(Waker::noop());
/// let mut next = || Pin::new(&mut rx).poll_next(&mut cx);
/// assert_eq!(next(), Poll::Ready(Some(Err(Lagged(1)))));
/// assert_eq!(next(), Poll::Ready(Some(Ok(1))));
/// assert_eq!(next(), Poll::Ready(Some(Ok(2))));
/// assert_eq!(next(), Poll::Ready(None)); // closed and drained
/// ```
#[cfg(feature = "stream")]
#[cfg_attr(docsrs, doc(cfg(feature = "stream")))]
impl<T: Clone + Send + Sync> futures_core::Stream for Receiver<T> {
    type Item = Result<T, Lagged>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_recv(cx).map(|r| match r {
            Ok(v) => Some(Ok(v)),
            Err(RecvError::Lagged(n)) => Some(Err(Lagged(n))),
            Err(RecvError::Closed) => None,
        })
    }
}

/// The future of [`Receiver::recv_async`]: resolves to the next message,
/// `Err(Lagged(n))` or `Err(Closed)`, as [`Receiver::recv`] returns.
/// Dropping it before it resolves takes its waker out of the ring and
/// loses no message.
#[must_use = "futures do nothing unless polled"]
pub struct Recv<'a, T> {
    rx: &'a mut Receiver<T>,
}

impl<T: Clone + Send + Sync> Future for Recv<'_, T> {
    type Output = Result<T, RecvError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().rx.poll_recv(cx)
    }
}

impl<T> Drop for Recv<'_, T> {
    fn drop(&mut self) {
        self.rx.unregister();
    }
}

impl<T> fmt::Debug for Recv<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recv").field("rx", &*self.rx).finish()
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("slot", &self.slot)
            .field("next", &self.next)
            .field("area", &*self.inner)
            .finish()
    }
}

/// A message borrowed in place by [`Receiver::try_recv_ref`]. The receiver
/// is active (it holds the message) until the guard is dropped; the drop
/// then drops the message from the ring if every other receiver has passed
/// it too (a panic of its `Drop` is resumed from the guard's).
pub struct RecvRef<'a, T> {
    pub(super) active: Active<'a, T>,
    seq: u64,
}

impl<T> Drop for RecvRef<'_, T> {
    fn drop(&mut self) {
        self.active.release();
    }
}

impl<T> Deref for RecvRef<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        let inner = &self.active.rx.inner;
        // SAFETY: `seq < active.limit` (published, edge P) and the stored
        // claim is `<= seq` until `active` is dropped, which cannot happen
        // while `&self` is borrowed; the slot was `Some` when the guard was
        // made and nobody writes it while the claim holds (edge F).
        let value = inner.slot(self.seq).with(|p| unsafe { (*p).as_ref() });
        value.expect("a RecvRef points at a message")
    }
}

impl<T: fmt::Debug> fmt::Debug for RecvRef<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RecvRef").field(&**self).finish()
    }
}

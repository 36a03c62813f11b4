//! The reply slot of one call: the reader (or whoever fails the call) fills
//! it once, and the caller either parks its thread on it (the blocking API)
//! or awaits it as a future (the async API): the filler wakes whichever is
//! waiting. No runtime: a future's waker is completed by the cache's reader
//! thread, and its call timeout by the supervisor thread (which looks at the
//! pending calls at least every [`TICK_MAX`]).
//!
//! Wakers and unparks run with no lock of ours held.

use crate::error::Error;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// The longest the supervisor sleeps between two looks at the pending
/// calls' deadlines: an awaited call fails at most this long after its
/// call timeout (a blocking one on time, by its own park timeout).
pub(crate) const TICK_MAX: Duration = Duration::from_millis(50);

enum Waiter {
    None,
    Thread(Thread),
    Task(Waker),
}

impl Waiter {
    fn wake(self) {
        match self {
            Waiter::None => {}
            Waiter::Thread(t) => t.unpark(),
            Waiter::Task(w) => w.wake(),
        }
    }
}

struct State<T> {
    value: Option<Result<T, Error>>,
    /// The sender is gone without a value: the call was dropped (the
    /// connection went away under it).
    orphaned: bool,
    /// The supervisor saw the deadline pass while a task waited.
    expired: bool,
    waiter: Waiter,
}

struct Slot<T> {
    state: Mutex<State<T>>,
    deadline: Instant,
    timeout: Duration,
}

impl<T> Slot<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The filling end, held by the call's op in the pending queue.
pub(crate) struct Sender<T>(Option<Arc<Slot<T>>>);

/// The waiting end, held by the caller; a [`Future`] of the reply.
pub(crate) struct Receiver<T>(Arc<Slot<T>>);

/// `now + timeout`, or, past what an `Instant` holds (a timeout of
/// `Duration::MAX`: no timeout), a century from now.
pub(crate) fn far(now: Instant, timeout: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(timeout)
        .or_else(|| now.checked_add(CENTURY))
        .unwrap_or(now)
}

/// A slot for a call that waits at most `timeout` from now.
pub(crate) fn channel<T>(timeout: Duration) -> (Sender<T>, Receiver<T>) {
    channel_until(far(Instant::now(), timeout), timeout)
}

/// A slot for a try of a call that waits until `deadline` at most (the
/// call's, set when it began: its redirects share its `timeout`, which
/// its error names).
pub(crate) fn channel_until<T>(deadline: Instant, timeout: Duration) -> (Sender<T>, Receiver<T>) {
    let slot = Arc::new(Slot {
        state: Mutex::new(State {
            value: None,
            orphaned: false,
            expired: false,
            waiter: Waiter::None,
        }),
        deadline,
        timeout,
    });
    (Sender(Some(Arc::clone(&slot))), Receiver(slot))
}

impl<T> Sender<T> {
    /// Fills the slot and wakes its waiter (after the lock is released).
    pub(crate) fn send(mut self, r: Result<T, Error>) {
        if let Some(slot) = self.0.take() {
            let waiter = {
                let mut st = slot.lock();
                st.value = Some(r);
                std::mem::replace(&mut st.waiter, Waiter::None)
            };
            waiter.wake();
        }
    }

    /// If the call's deadline has passed at `now` and a task awaits it:
    /// marks it expired and returns its waker, for the caller to wake with
    /// no lock held. (A parked thread times out on its own.)
    pub(crate) fn expire(&self, now: Instant) -> Option<Waker> {
        let slot = self.0.as_ref()?;
        if now < slot.deadline {
            return None;
        }
        let mut st = slot.lock();
        if !matches!(st.waiter, Waiter::Task(_)) {
            return None;
        }
        st.expired = true;
        match std::mem::replace(&mut st.waiter, Waiter::None) {
            Waiter::Task(w) => Some(w),
            _ => None,
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            let waiter = {
                let mut st = slot.lock();
                st.orphaned = true;
                std::mem::replace(&mut st.waiter, Waiter::None)
            };
            waiter.wake();
        }
    }
}

/// The error of a call whose connection went away before its reply.
pub(crate) fn lost() -> Error {
    Error::connection(
        io::ErrorKind::ConnectionAborted,
        "connection lost before the reply",
    )
}

fn timed_out(timeout: Duration) -> Error {
    Error::connection(
        io::ErrorKind::TimedOut,
        &format!(
            "no reply within the call timeout ({timeout:?}); a write may still be applied by \
             the server"
        ),
    )
}

impl<T> Receiver<T> {
    /// What the slot says now, if final.
    fn take(st: &mut State<T>, slot: &Slot<T>, now: Instant) -> Option<Result<T, Error>> {
        if let Some(v) = st.value.take() {
            return Some(v);
        }
        if st.orphaned {
            return Some(Err(lost()));
        }
        if st.expired || now >= slot.deadline {
            return Some(Err(timed_out(slot.timeout)));
        }
        None
    }

    /// Parks this thread until the reply, the loss of the call, or the
    /// deadline.
    pub(crate) fn wait(self) -> Result<T, Error> {
        let slot = &*self.0;
        loop {
            let now = Instant::now();
            {
                let mut st = slot.lock();
                if let Some(r) = Self::take(&mut st, slot, now) {
                    return r;
                }
                st.waiter = Waiter::Thread(thread::current());
            }
            thread::park_timeout(slot.deadline.saturating_duration_since(now));
        }
    }
}

impl<T> Future for Receiver<T> {
    type Output = Result<T, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let slot = &*self.0;
        // The runtime's waker is cloned, and the old one dropped, with no
        // lock of ours held.
        let waker = Waiter::Task(cx.waker().clone());
        let old = {
            let mut st = slot.lock();
            if let Some(r) = Self::take(&mut st, slot, Instant::now()) {
                return Poll::Ready(r);
            }
            std::mem::replace(&mut st.waiter, waker)
        };
        drop(old);
        Poll::Pending
    }
}

//! The callers waiting for a lease held elsewhere, and how they are woken
//! (see "Why no wake-up is lost" in [`crate::lease`]'s docs).
//!
//! Written against `super::sync` only: the cache uses `std`'s primitives,
//! and `loom-tests/tests/lease.rs` includes this very file over loom's
//! (with a clock that never reaches a deadline, so that only a wake can end
//! a wait and a lost one is a deadlock).

use super::sync::{
    Arc, AtomicBool, AtomicUsize, Instant, Mutex, MutexGuard, NameHasher, Ordering, Thread,
    current, park_timeout,
};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::PoisonError;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

struct WaitState {
    deadline: Option<Instant>,
    waker: Option<Waker>,
}

/// One caller waiting for a held lease to end.
pub(crate) struct Wait {
    woken: AtomicBool,
    thread: Thread,
    state: Mutex<WaitState>,
}

impl Wait {
    fn lock(&self) -> MutexGuard<'_, WaitState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `woken` is stored before the waker is taken under the state's lock
    /// (see [`Until`]), and before the unpark (a parked caller tests it
    /// after each park).
    fn wake(&self) {
        self.woken.store(true, Ordering::Release);
        let waker = self.lock().waker.take();
        self.thread.unpark();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The callers waiting for leases held elsewhere, by the Redis name they
/// wait on (the key's, which holds the lease). One table per cache, shared by
/// its links: the readers wake by name, the supervisors at deadlines.
#[derive(Default)]
pub(crate) struct Waiters {
    /// Registered waits; raised under `map`'s lock, so a reader that
    /// finds it zero has nobody to wake that registered before the
    /// command whose reply it has read.
    count: AtomicUsize,
    map: Mutex<Table>,
}

/// The waits by name.
type Table = HashMap<Vec<u8>, Vec<Arc<Wait>>, NameHasher>;

impl Waiters {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `true` if someone waits (a reader's cheap test before it names keys).
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }

    /// Registers a wait of this thread on `names`, *before* the
    /// [`LEASE`](crate::script::LEASE) it follows is sent.
    pub(crate) fn register(&self, name: Vec<u8>) -> Registered<'_> {
        let wait = Arc::new(Wait {
            woken: AtomicBool::new(false),
            thread: current(),
            state: Mutex::new(WaitState {
                deadline: None,
                waker: None,
            }),
        });
        let mut map = self.lock();
        map.entry(name.clone()).or_default().push(Arc::clone(&wait));
        self.count.fetch_add(1, Ordering::AcqRel);
        drop(map);
        Registered {
            waiters: self,
            name,
            wait,
        }
    }

    /// Wakes the waits on `name` (an invalidation, or our own write).
    pub(crate) fn wake(&self, name: &[u8]) {
        if !self.active() {
            return;
        }
        let woken = self.lock().get(name).cloned().unwrap_or_default();
        woken.iter().for_each(|w| w.wake());
    }

    /// Wakes every wait (a flush, a lost connection).
    pub(crate) fn wake_all(&self) {
        if !self.active() {
            return;
        }
        let all: Vec<Arc<Wait>> = self.lock().values().flatten().cloned().collect();
        all.iter().for_each(|w| w.wake());
    }

    /// Wakes the waits past their deadline (the supervisors, every tick:
    /// what ends an awaited wait on time).
    pub(crate) fn expire(&self, now: Instant) {
        if !self.active() {
            return;
        }
        let due: Vec<Arc<Wait>> = self
            .lock()
            .values()
            .flatten()
            .filter(|w| w.lock().deadline.is_some_and(|d| d <= now))
            .cloned()
            .collect();
        due.iter().for_each(|w| w.wake());
    }
}

/// A registered wait; deregisters when dropped.
pub(crate) struct Registered<'a> {
    waiters: &'a Waiters,
    name: Vec<u8>,
    wait: Arc<Wait>,
}

impl Registered<'_> {
    /// Parks until woken or `left` has passed.
    pub(crate) fn block(&self, left: Duration) {
        let deadline = Instant::now() + left;
        while !self.wait.woken.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            park_timeout(deadline - now);
        }
    }

    /// Awaits a wake or `left`'s end (noticed by a supervisor within its
    /// tick).
    pub(crate) fn until(&self, left: Duration) -> Until<'_> {
        self.wait.lock().deadline = Some(Instant::now() + left);
        Until(&self.wait)
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut map = self.waiters.lock();
        if let Some(list) = map.get_mut(&self.name) {
            list.retain(|w| !Arc::ptr_eq(w, &self.wait));
            if list.is_empty() {
                map.remove(&self.name);
            }
        }
        self.waiters.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The future of [`Registered::until`]: its waker is stored under the
/// wait's lock, and `woken` tested under it. A wake either takes the lock
/// first (it stored `woken` before, so the poll sees it) or after the
/// poll (it then takes the stored waker and wakes it).
pub(crate) struct Until<'a>(&'a Wait);

impl Future for Until<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let w = self.0;
        // The runtime's waker is cloned, and the old one dropped, with no
        // lock of ours held.
        let waker = cx.waker().clone();
        let mut st = w.lock();
        let due = st.deadline.is_none_or(|d| d <= Instant::now());
        if w.woken.load(Ordering::Acquire) || due {
            return Poll::Ready(());
        }
        let old = st.waker.replace(waker);
        drop(st);
        drop(old);
        Poll::Pending
    }
}

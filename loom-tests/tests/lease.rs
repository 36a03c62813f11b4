//! loom models of `expiremap-redis`'s lease waits: the wait machinery of
//! `expiremap-redis/src/waiters/wait.rs`, included here as it is, over
//! loom's primitives (see "Why no wake-up is lost" in
//! `expiremap-redis/src/lease.rs`). The network is not modelled: a
//! waiter registers, then "sends" its `LEASE` by queueing an op under the
//! link's mutex; the reader pops it (the reply) and then wakes by name
//! (an invalidation the server sent after that reply). Under loom the
//! clock never reaches a deadline, so only a wake ends a wait and a lost
//! one is a deadlock report. See `../README.md`.

#[allow(dead_code, unreachable_pub)]
#[path = "../../expiremap-redis/src/waiters/wait.rs"]
mod wait;

/// What `wait.rs` runs on here: loom's primitives and a clock that never
/// reaches a deadline under loom; `std`'s otherwise (the plain run).
mod sync {
    #[cfg(expiremap_loom)]
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    #[cfg(expiremap_loom)]
    pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
    #[cfg(expiremap_loom)]
    pub(crate) use loom::thread::{Thread, current};

    /// No timeouts under loom: a park ends by an unpark only.
    #[cfg(expiremap_loom)]
    pub(crate) fn park_timeout(_: std::time::Duration) {
        loom::thread::park();
    }

    /// A clock that stands still: every deadline is in the future.
    #[cfg(expiremap_loom)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
    pub(crate) struct Instant(std::time::Duration);

    #[cfg(expiremap_loom)]
    impl Instant {
        pub(crate) fn now() -> Self {
            Instant(std::time::Duration::ZERO)
        }
    }

    #[cfg(expiremap_loom)]
    impl std::ops::Add<std::time::Duration> for Instant {
        type Output = Instant;
        fn add(self, d: std::time::Duration) -> Instant {
            Instant(self.0 + d)
        }
    }

    #[cfg(expiremap_loom)]
    impl std::ops::Sub for Instant {
        type Output = std::time::Duration;
        fn sub(self, o: Instant) -> std::time::Duration {
            self.0 - o.0
        }
    }

    #[cfg(not(expiremap_loom))]
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    #[cfg(not(expiremap_loom))]
    pub(crate) use std::sync::{Arc, Mutex, MutexGuard};
    #[cfg(not(expiremap_loom))]
    pub(crate) use std::thread::{Thread, current, park_timeout};
    #[cfg(not(expiremap_loom))]
    pub(crate) use std::time::Instant;

    /// A fixed hasher: an execution replays only if the table iterates in
    /// the same order every time (`wake_all`).
    pub(crate) type NameHasher =
        std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;
}

use expiremap_loom_tests::{block_on, model, thread};
use std::collections::VecDeque;
use std::time::Duration;
use sync::{Arc, Instant, Mutex};
use wait::Waiters;

/// How long a wait may last: under loom never reached; in the plain run,
/// a wait that lasts this long was not woken, and the model fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// A link: the ops sent and not answered yet, under its mutex.
type Link = Arc<Mutex<VecDeque<()>>>;

/// The name a wait on `key`'s lease listens on: the key's (which holds
/// the lease while it is loaded).
fn names(key: &[u8]) -> Vec<u8> {
    key.to_vec()
}

/// Sends an op: what `Shared::call` does under the link's mutex.
fn send(link: &Link) {
    link.lock().unwrap().push_back(());
}

/// The reader: waits for each of `replies` replies (pops its op), then
/// applies what the server sent after it with `then` (given the reply's
/// number, from 1).
fn reader(
    link: Link,
    waiters: &'static Waiters,
    replies: usize,
    then: impl Fn(&Waiters, usize) + Send + 'static,
) {
    let mut n = 0;
    while n < replies {
        let op = link.lock().unwrap().pop_front();
        match op {
            Some(_) => {
                n += 1;
                then(waiters, n);
            }
            None => thread::yield_now(),
        }
    }
}

fn woken_in_time(t0: Instant) {
    assert!(
        Instant::now() - t0 < PATIENCE,
        "the wait ended by its deadline"
    );
}

/// A fresh table for one execution, leaked so that a registration can
/// move to another thread (it borrows the table).
fn table() -> &'static Waiters {
    Box::leak(Box::default())
}

/// Runs `waiter` on a thread of its own beside a reader that answers
/// `replies` replies with `then`, joins both (and the thread `waiter`
/// may hand back), and checks that no wait is left registered. (The model's main thread waits for nothing but the
/// joins: loom does not allow an unpark of a thread blocked on a join or
/// a mutex, and a wake may unpark its waiter after the waiter saw
/// `woken`, as std allows.)
fn run(
    replies: usize,
    then: impl Fn(&Waiters, usize) + Send + 'static,
    waiter: impl FnOnce(&'static Waiters, &Link) -> Option<thread::JoinHandle<()>> + Send + 'static,
) {
    let waiters = table();
    let link: Link = Arc::default();
    let r = {
        let link = link.clone();
        thread::spawn(move || reader(link, waiters, replies, then))
    };
    let w = {
        let link = link.clone();
        thread::spawn(move || waiter(waiters, &link))
    };
    if let Some(task) = w.join().unwrap() {
        task.join().unwrap();
    }
    r.join().unwrap();
    assert!(!waiters.active(), "a wait left registered");
}

/// A blocking waiter registers, sends `LEASE` and parks; the reader pops
/// the reply and then applies the invalidation of the lease (the
/// holder's store): the waiter wakes.
#[test]
fn an_invalidation_after_the_reply_wakes_a_parked_waiter() {
    model(|| {
        run(
            1,
            |w, _| w.wake(b"k"),
            |waiters, link| {
                let wait = waiters.register(names(b"k"));
                send(link);
                let t0 = Instant::now();
                wait.block(PATIENCE);
                woken_in_time(t0);
                None
            },
        );
    });
}

/// The same with an awaiting waiter (`Until`), woken by the key's name
/// (a `put`). The task is polled on another thread than the one that
/// registered (a task that moved between an executor's workers), so only
/// its waker, not the registering thread's unpark, can wake it.
#[test]
fn an_invalidation_after_the_reply_wakes_an_awaiting_waiter() {
    model(|| {
        run(
            1,
            |w, _| w.wake(b"k"),
            |waiters, link| {
                let wait = waiters.register(names(b"k"));
                send(link);
                Some(thread::spawn(move || {
                    let t0 = Instant::now();
                    block_on(wait.until(PATIENCE));
                    woken_in_time(t0);
                }))
            },
        );
    });
}

/// A lost connection wakes every wait: two registered waits (one awaited,
/// one parked for, by one caller after the other), the loss after the
/// replies of both `LEASE`s.
#[test]
fn a_lost_connection_wakes_every_wait() {
    model(|| {
        run(
            2,
            |w, n| {
                if n == 2 {
                    w.wake_all();
                }
            },
            |waiters, link| {
                let a = waiters.register(names(b"a"));
                send(link);
                let b = waiters.register(names(b"b"));
                send(link);
                let t0 = Instant::now();
                block_on(a.until(PATIENCE));
                b.block(PATIENCE);
                woken_in_time(t0);
                None
            },
        );
    });
}

/// A retry: the first round's wait is dropped (its `LEASE` found the
/// key) while the reader wakes it; the second round registers afresh
/// before its own `LEASE`, and the wake after that reply reaches it.
#[test]
fn a_retry_registers_afresh_and_a_wake_racing_a_drop_is_harmless() {
    model(|| {
        run(
            2,
            |w, _| w.wake(b"k"),
            |waiters, link| {
                let first = waiters.register(names(b"k"));
                send(link);
                drop(first);
                let second = waiters.register(names(b"k"));
                send(link);
                let t0 = Instant::now();
                second.block(PATIENCE);
                woken_in_time(t0);
                None
            },
        );
    });
}

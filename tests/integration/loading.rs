//! `get_or_insert_with` and `try_get_or_insert_with`: one `init` per key at
//! a time, waiters parked and handed its value, failures and panics handed
//! on, a write during the load winning, and a zero TTL.

use crate::common::manual;
use expiremap::{Cause, ExpireMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::Duration;

const MINUTE: Duration = Duration::from_secs(60);
/// How long a failure (a stuck waiter) takes to show; never reached when
/// the map is right, whatever the machine's speed.
const PATIENCE: Duration = Duration::from_secs(120);

/// Runs `n` callers of `f` at once on threads, and collects their results
/// (a stuck caller fails the test after `PATIENCE`).
fn at_once<R: Send + 'static>(
    n: usize,
    f: impl Fn(usize) -> R + Send + Sync + 'static,
) -> Vec<thread::Result<R>> {
    let f = Arc::new(f);
    let barrier = Arc::new(Barrier::new(n));
    let (tx, rx) = mpsc::channel();
    for i in 0..n {
        let (f, barrier, tx) = (f.clone(), barrier.clone(), tx.clone());
        thread::spawn(move || {
            barrier.wait();
            let r = catch_unwind(AssertUnwindSafe(|| f(i)));
            tx.send(r).unwrap();
        });
    }
    (0..n)
        .map(|_| rx.recv_timeout(PATIENCE).expect("a caller is stuck"))
        .collect()
}

#[test]
fn eight_callers_of_one_cold_key_run_init_once() {
    for _ in 0..20 {
        let map = Arc::new(ExpireMap::<u32, u32>::new());
        let calls = Arc::new(AtomicU32::new(0));
        let (m, c) = (map.clone(), calls.clone());
        let results = at_once(8, move |_| {
            m.get_or_insert_with(1, MINUTE, || {
                c.fetch_add(1, Ordering::SeqCst);
                thread::sleep(Duration::from_millis(5)); // lets others arrive
                7
            })
        });
        assert!(results.into_iter().all(|r| r.unwrap() == 7));
        assert_eq!(calls.load(Ordering::SeqCst), 1, "init ran more than once");
        assert_eq!(map.get(&1), Some(7));
    }
}

#[test]
fn a_panicking_init_hands_the_load_to_a_waiter() {
    let map = Arc::new(ExpireMap::<u32, u32>::new());
    let calls = Arc::new(AtomicU32::new(0));
    let (m, c) = (map.clone(), calls.clone());
    let results = at_once(6, move |_| {
        m.get_or_insert_with(1, MINUTE, || {
            // The first init panics, every later one succeeds.
            if c.fetch_add(1, Ordering::SeqCst) == 0 {
                thread::sleep(Duration::from_millis(5));
                panic!("init failed");
            }
            9
        })
    });
    let panics = results.iter().filter(|r| r.is_err()).count();
    assert_eq!(panics, 1, "only the panicking init's caller sees it");
    assert!(results.into_iter().flatten().all(|v| v == 9));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "one failed, one loaded");
    assert_eq!(map.get(&1), Some(9));
}

/// A failing `init`: nothing is stored for it, and its error goes to its
/// caller and to the callers that waited for that load (shared, not run
/// again); callers that came after the failure load again, and their value
/// is stored.
#[test]
fn a_failing_init_shares_its_error_and_stores_nothing() {
    let map = Arc::new(ExpireMap::<u32, u32>::new());
    let failed = Arc::new(AtomicBool::new(false));
    let inits = Arc::new(AtomicU32::new(0));
    let (m, f, n) = (map.clone(), failed.clone(), inits.clone());
    let results = at_once(4, move |_| {
        m.try_get_or_insert_with(1, MINUTE, || {
            n.fetch_add(1, Ordering::SeqCst);
            if !f.swap(true, Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(5)); // others arrive
                return Err("first fails");
            }
            Ok(5)
        })
    });
    let results: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
    let errors = results.iter().filter(|r| r.is_err()).count();
    assert!(errors >= 1, "{results:?}");
    assert!(
        results
            .iter()
            .all(|r| *r == Err("first fails") || *r == Ok(5))
    );
    // One init for the failure, shared by whoever waited; at most one more
    // for the callers that came after it.
    let ran = inits.load(Ordering::SeqCst);
    assert!(ran == 1 || ran == 2, "{ran} inits");
    assert_eq!(ran == 2, errors < 4, "{results:?}");
    assert_eq!(map.get(&1), (errors < 4).then_some(5));
}

#[test]
fn a_write_during_the_load_wins() {
    let (map, _clock) = manual::<u32, u32>();
    let mut sub = map.subscribe().unwrap();
    // A put of the key while its init runs: the put stands.
    let v = map.get_or_insert_with(1, MINUTE, || {
        map.put(1, 100, MINUTE);
        1
    });
    assert_eq!((v, map.get(&1)), (1, Some(100)));
    // A remove: nothing is stored.
    let v = map.get_or_insert_with(2, MINUTE, || {
        map.remove(&2);
        2
    });
    assert_eq!((v, map.get(&2)), (2, None));
    // A clear: nothing is stored.
    let v = map.get_or_insert_with(3, MINUTE, || {
        map.clear();
        3
    });
    assert_eq!((v, map.get(&3)), (3, None));
    // Writes to other keys do not count.
    let v = map.get_or_insert_with(4, MINUTE, || {
        map.put(5, 5, MINUTE);
        4
    });
    assert_eq!((v, map.get(&4)), (4, Some(4)));
    // Nothing left by a door it should not have.
    while let Ok(e) = sub.try_recv() {
        assert_ne!(e.cause, Cause::Size);
    }
}

#[test]
fn init_may_use_other_keys_but_not_its_own() {
    let (map, _clock) = manual::<u32, u32>();
    let v = map.get_or_insert_with(1, MINUTE, || map.get_or_insert_with(2, MINUTE, || 20) + 1);
    assert_eq!((v, map.get(&2)), (21, Some(20)));
    let r = catch_unwind(AssertUnwindSafe(|| {
        map.get_or_insert_with(3, MINUTE, || map.get_or_insert_with(3, MINUTE, || 3))
    }));
    let payload = r.unwrap_err();
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap();
    assert!(msg.contains("its own key"), "{msg}");
    // The load ended: the key can be loaded again.
    assert_eq!(map.get_or_insert_with(3, MINUTE, || 30), 30);
}

#[test]
fn a_zero_ttl_returns_without_storing_and_a_hit_runs_no_init() {
    let (map, _clock) = manual::<u32, u32>();
    assert_eq!(map.get_or_insert_with(1, Duration::ZERO, || 1), 1);
    assert_eq!(map.get(&1), None);
    map.put(2, 2, MINUTE);
    assert_eq!(map.get_or_insert_with(2, MINUTE, || unreachable!()), 2);
}

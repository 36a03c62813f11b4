//! What broke: `update` and `retain` detected conflicts per shard, not per
//! entry. An `update` whose `f` took 5 ms beside a writer of *other* keys
//! of the shard called `f` hundreds of times and never committed; `retain`
//! whose `f` wrote other keys kept every entry it rejected; and `update`'s
//! `f` ran again on every retry, repeating its side effects (appends in
//! place duplicated). Fixed by running each update as a flight of its key
//! (updates of one key in turn, writes of the key waiting for the one in
//! flight: `f` runs exactly once per call), and by logging which nodes are
//! written while `retain` watches a shard.

use expiremap::{ExpireMap, Update};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, RwLock};
use std::thread;
use std::time::Duration;

const MINUTE: Duration = Duration::from_secs(60);

fn one_shard<V: Clone + Send + Sync + 'static>() -> Arc<ExpireMap<u64, V>> {
    Arc::new(ExpireMap::builder().shards(1).build())
}

/// A writer of other keys beside a slow update: `f` runs once and commits.
#[test]
fn a_slow_update_beside_a_writer_of_other_keys_runs_f_once() {
    let map = one_shard::<u64>();
    let stop = Arc::new(AtomicBool::new(false));
    let (m, s) = (map.clone(), stop.clone());
    let writer = thread::spawn(move || {
        // Bounded, so that a build that retries `f` while the shard
        // changes ends too (and fails the count).
        for k in 1_000..6_000 {
            if s.load(Ordering::Relaxed) {
                break;
            }
            m.put(k, k, MINUTE);
            thread::sleep(Duration::from_micros(200));
        }
    });
    let mut calls = 0;
    let r = map.update(1, |_| {
        calls += 1;
        thread::sleep(Duration::from_millis(5));
        Update::Set(7, MINUTE)
    });
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert_eq!((r, calls, map.get(&1)), (Some(7), 1, Some(7)));
}

/// 4 threads × 500 updates of one key, appending in place to a shared
/// vector, beside a writer of other keys: one append per call, no
/// duplicates, and the counter the updates keep equals the calls.
#[test]
fn updates_of_one_key_run_f_exactly_once_per_call() {
    const THREADS: u64 = 4;
    const EACH: u64 = 500;
    let map = one_shard::<(u64, Arc<RwLock<Vec<u64>>>)>();
    let log = Arc::new(RwLock::new(Vec::new()));
    map.put(0, (0, log.clone()), MINUTE);
    let calls = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (m, s) = (map.clone(), stop.clone());
    let writer = thread::spawn(move || {
        let mut k = 1;
        while !s.load(Ordering::Relaxed) {
            m.put(k, (k, Arc::new(RwLock::new(Vec::new()))), MINUTE);
            k += 1;
        }
    });
    let start = Arc::new(Barrier::new(THREADS as usize));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (m, c, start) = (map.clone(), calls.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                for i in 0..EACH {
                    m.update(0, |seen| {
                        c.fetch_add(1, Ordering::SeqCst);
                        let (n, log) = seen.expect("present").0.clone();
                        log.write().unwrap().push(t * EACH + i);
                        Update::SetKeepTtl((n + 1, log))
                    });
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let total = THREADS * EACH;
    assert_eq!(calls.load(Ordering::SeqCst), total, "f ran once per call");
    let mut appended = log.read().unwrap().clone();
    assert_eq!(appended.len() as u64, total, "one side effect per call");
    appended.sort_unstable();
    appended.dedup();
    assert_eq!(appended.len() as u64, total, "no duplicates");
    assert_eq!(map.get(&0).map(|v| v.0), Some(total), "no update lost");
}

/// `retain` whose `f` writes other keys: the entries it rejects go.
#[test]
fn retain_whose_f_writes_other_keys_applies_its_verdicts() {
    let map = one_shard::<u64>();
    for k in 0..300 {
        map.put(k, k, MINUTE);
    }
    let mut asked = 0;
    map.retain(|&k, _| {
        asked += 1;
        map.put(10_000 + k, k, MINUTE);
        k % 3 != 0
    });
    assert_eq!(asked, 300, "asked once per entry");
    for k in 0..300 {
        assert_eq!(map.contains_key(&k), k % 3 != 0, "key {k}");
    }
}

/// A put of the key racing an update is ordered after its commit: never
/// lost, never overwritten by a commit computed before it.
#[test]
fn a_put_of_the_key_waits_for_the_update_in_flight() {
    let (r, put, now) = crate::common::within(60, || {
        let map = one_shard::<u64>();
        map.put(1, 1, MINUTE);
        let in_f = Arc::new(Barrier::new(2));
        let (m, b) = (map.clone(), in_f.clone());
        let putter = thread::spawn(move || {
            b.wait(); // the update's f is running
            m.put(1, 100, MINUTE)
        });
        let r = map.update(1, |seen| {
            in_f.wait();
            thread::sleep(Duration::from_millis(20)); // the put is waiting
            Update::Set(seen.unwrap().0 + 1, MINUTE)
        });
        (r, putter.join().unwrap(), map.get(&1))
    })
    .unwrap();
    assert_eq!(r, Some(2));
    // The put came after the commit: it replaced the update's value.
    assert_eq!((put, now), (Some(2), Some(100)));
}

/// `f` writing its own key would wait for itself: a clear panic.
#[test]
fn an_update_whose_f_writes_its_own_key_panics() {
    let map = one_shard::<u64>();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        map.update(1, |_| {
            map.put(1, 5, MINUTE);
            Update::Keep
        })
    }));
    let msg = crate::common::panic_message(&*r.unwrap_err());
    assert!(msg.contains("its own key"), "{msg}");
    // The update ended: the key is free again.
    assert_eq!(map.put(1, 6, MINUTE), None);
    assert_eq!(map.update(1, |_| Update::Keep), Some(6));
}

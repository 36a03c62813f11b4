//! A panic in user Hash, Eq, Clone or Drop neither kills the eviction thread
//! nor leaves a shard inconsistent.

use crate::common::{MS, Touchy};
use expiremap::{ExpireMap, ManualClock};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn quiet<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    catch_unwind(AssertUnwindSafe(f))
}

#[test]
fn panicking_hash_and_eq_leave_the_map_consistent() {
    let clock = ManualClock::new();
    let map = ExpireMap::<Touchy, u32>::builder()
        .clock(clock.clone())
        .shards(1)
        .build();
    for i in 0..5 {
        map.put(Touchy(i), i, 10 * MS);
    }
    assert!(quiet(|| map.put(Touchy(13), 13, MS)).is_err());
    assert!(quiet(|| map.get(&Touchy(13))).is_err());
    assert!(quiet(|| map.put(Touchy(7), 7, MS)).is_err());
    assert!(quiet(|| map.get(&Touchy(7))).is_err());
    assert!(quiet(|| map.remove(&Touchy(7))).is_err());
    assert_eq!(map.len(), 5);
    for i in 0..5 {
        assert_eq!(map.get(&Touchy(i)), Some(i));
    }
    assert_eq!(map.remove(&Touchy(2)), Some(2));
    let mut sub = map.subscribe().unwrap();
    clock.advance(12 * MS);
    for _ in 0..4 {
        sub.recv().unwrap();
    }
    assert_eq!(map.len(), 0);
}

/// A value whose Clone panics on demand.
#[derive(Debug)]
struct BadClone(u32);
impl Clone for BadClone {
    fn clone(&self) -> Self {
        assert_ne!(self.0, 0, "clone panic");
        BadClone(self.0)
    }
}

#[test]
fn panicking_clone_in_get_leaves_the_map_usable() {
    let (map, _clock) = crate::common::manual::<u32, BadClone>();
    map.put(1, BadClone(0), MS);
    map.put(2, BadClone(2), MS);
    assert!(quiet(|| map.get(&1)).is_err());
    assert_eq!(map.get(&2).map(|v| v.0), Some(2));
    assert_eq!(map.remove(&1).map(|v| v.0), Some(0));
    map.put(1, BadClone(5), MS);
    assert_eq!(map.get(&1).map(|v| v.0), Some(5));
}

/// A value whose Drop panics, or reports on a channel.
struct Bomb {
    explode: bool,
    report: Mutex<Option<mpsc::Sender<u32>>>,
    id: u32,
}
impl Clone for Bomb {
    fn clone(&self) -> Self {
        Bomb {
            explode: false,
            report: Mutex::new(None),
            id: self.id,
        }
    }
}
impl Drop for Bomb {
    fn drop(&mut self) {
        if let Some(tx) = self.report.lock().unwrap().take() {
            let _ = tx.send(self.id);
        }
        if self.explode && !std::thread::panicking() {
            panic!("drop panic");
        }
    }
}

#[test]
fn panicking_drop_does_not_kill_the_eviction_thread() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, Arc<Bomb>>::builder()
        .clock(clock.clone())
        .build();
    let (tx, rx) = mpsc::channel();
    map.put(
        1,
        Arc::new(Bomb {
            explode: true,
            report: Mutex::new(None),
            id: 1,
        }),
        MS,
    );
    clock.advance(3 * MS); // the thread evicts and drops the bomb
    // Wait for that eviction: otherwise one pass may take both entries, and
    // the second value (in another shard) can be dropped before the first
    // shard is visited, which makes the `len` check below racy.
    let start = std::time::Instant::now();
    while !map.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "first entry never evicted"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    map.put(
        2,
        Arc::new(Bomb {
            explode: false,
            report: Mutex::new(Some(tx)),
            id: 2,
        }),
        MS,
    );
    clock.advance(10 * MS);
    // The thread survived: it evicts and drops the second value too.
    let id = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("eviction thread died");
    assert_eq!(id, 2);
    assert_eq!(map.len(), 0);
}

#[test]
fn a_panicking_drop_does_not_leak_the_rest_of_its_batch() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, Arc<Bomb>>::builder()
        .clock(clock.clone())
        .shards(1)
        .build();
    let (tx, rx) = mpsc::channel();
    let bomb = |id, explode, report| {
        Arc::new(Bomb {
            explode,
            report: Mutex::new(report),
            id,
        })
    };
    // Same deadline, same shard: evicted in one batch, the bomb first.
    map.put(1, bomb(1, true, None), MS);
    map.put(2, bomb(2, false, Some(tx.clone())), MS);
    map.put(3, bomb(3, false, Some(tx)), 50 * MS);
    clock.advance(3 * MS);
    let first = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("value 2 leaked");
    assert_eq!(first, 2);
    clock.advance(60 * MS);
    let second = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("thread died");
    assert_eq!(second, 3);
}

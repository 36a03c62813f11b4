//! What broke: "expired or not" was decided with a time read before the
//! operation waited for its shard lock. `clear` (any clock) and `remove`,
//! `touch` and `put` (a user clock) read the time, then waited behind a slow
//! lock holder while the entry's deadline passed, and then acted as if it
//! were still live: `remove` returned a value 5 ms past its deadline, `clear`
//! let an expired value leave unpublished as `Removed`, `touch` gave an
//! expired entry a new life. Fixed by reading the time after the lock is
//! taken, for every operation and every clock.

use expiremap::{Cause, Clock, ExpireMap, ManualClock, Subscriber, SystemClock, TryRecvError};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

/// A value whose `clone` waits at two barriers when it is the slow one: a
/// `get` of it holds the shard's read lock from the first barrier to the
/// second.
#[derive(Debug)]
struct Value {
    n: u32,
    hold: Option<Arc<Barrier>>,
}

impl Clone for Value {
    fn clone(&self) -> Self {
        if let Some(b) = &self.hold {
            b.wait();
            b.wait();
        }
        Value {
            n: self.n,
            hold: None,
        }
    }
}

type Map = ExpireMap<u32, Value>;

fn value(n: u32) -> Value {
    Value { n, hold: None }
}

fn events(sub: &mut Subscriber<u32, Value>) -> Vec<(u32, u32, Cause)> {
    let mut out = Vec::new();
    loop {
        match sub.try_recv() {
            Ok(e) => out.push((e.key, e.value.n, e.cause)),
            Err(TryRecvError::Empty) => return out,
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// Key 0 holds the slow value; key 1 a value live for `ttl`. While a `get`
/// of key 0 holds the read lock, `op` starts on another thread (and waits
/// for the write lock), then `pass` makes key 1's deadline pass, then the
/// lock is released. Returns `op`'s result.
fn behind_a_slow_reader<C, R>(
    clock: C,
    ttl: Duration,
    pass: impl FnOnce(),
    op: impl FnOnce(&Map) -> R + Send + 'static,
) -> (Arc<Map>, Subscriber<u32, Value>, R)
where
    C: Clock + Clone,
    R: Send + 'static,
{
    let map: Arc<Map> = Arc::new(
        ExpireMap::builder()
            .clock(clock)
            .shards(1)
            .background_eviction(false)
            .build(),
    );
    let sub = map.subscribe().unwrap();
    let hold = Arc::new(Barrier::new(2));
    let slow = Value {
        n: 0,
        hold: Some(hold.clone()),
    };
    map.put(0, slow, Duration::from_secs(3600));
    map.put(1, value(1), ttl);
    let reader = {
        let map = map.clone();
        thread::spawn(move || map.get(&0).map(|v| v.n))
    };
    hold.wait(); // the reader holds the read lock
    let writer = {
        let map = map.clone();
        thread::spawn(move || op(&map))
    };
    // Lets the writer reach the lock before the deadline passes. With the
    // fix the result does not depend on it: the writer reads the time only
    // once it holds the lock, which is after `hold` below.
    thread::sleep(Duration::from_millis(30));
    pass();
    hold.wait(); // release the read lock
    assert_eq!(reader.join().unwrap(), Some(0));
    let r = writer.join().unwrap();
    (map, sub, r)
}

fn on_manual_clock<R: Send + 'static>(
    op: impl FnOnce(&Map) -> R + Send + 'static,
) -> (Arc<Map>, Subscriber<u32, Value>, R) {
    let clock = ManualClock::new();
    let c = clock.clone();
    behind_a_slow_reader(
        clock,
        Duration::from_millis(10),
        move || c.advance(Duration::from_millis(11)),
        op,
    )
}

#[test]
fn remove_after_a_wait_sees_the_deadline_passed() {
    let (map, mut sub, removed) = on_manual_clock(|m| m.remove(&1).map(|v| v.n));
    assert_eq!(removed, None, "remove returned a value past its deadline");
    assert_eq!(events(&mut sub), [(1, 1, Cause::Expired)]);
    assert_eq!(map.len(), 1);
}

#[test]
fn touch_after_a_wait_does_not_revive_an_expired_entry() {
    let (map, mut sub, touched) = on_manual_clock(|m| m.touch(&1, Duration::from_secs(60)));
    assert!(!touched, "touch gave an expired entry a new deadline");
    assert_eq!(map.get(&1).map(|v| v.n), None);
    // The touch is a write of the shard: it may take the due entry itself.
    let by_touch = map.stats().evicted_by_writers;
    assert_eq!(map.evict_expired() as u64 + by_touch, 1);
    assert_eq!(events(&mut sub), [(1, 1, Cause::Expired)]);
}

#[test]
fn put_after_a_wait_reports_the_old_value_as_expired() {
    let (map, mut sub, old) =
        on_manual_clock(|m| m.put(1, value(2), Duration::from_secs(60)).map(|v| v.n));
    assert_eq!(old, None, "an expired value came back as replaced");
    assert_eq!(events(&mut sub), [(1, 1, Cause::Expired)]);
    assert_eq!(map.get(&1).map(|v| v.n), Some(2));
}

#[test]
fn clear_after_a_wait_publishes_the_expired_value() {
    let (map, mut sub, ()) = on_manual_clock(|m| m.clear());
    // Key 1 was past its deadline when `clear` acted: `Expired`, published.
    // Key 0 was live: `Removed`, not published by default.
    assert_eq!(events(&mut sub), [(1, 1, Cause::Expired)]);
    assert!(map.is_empty());
}

/// The issue's own reproduction, on the real clock: a 20 ms entry, `clear`
/// behind a reader for 60 ms. However slow the machine, the entry's deadline
/// has passed when the reader lets go, and that is when `clear` reads the
/// time.
#[test]
fn clear_on_the_system_clock_after_a_wait() {
    let (map, mut sub, ()) = behind_a_slow_reader(
        SystemClock::new(),
        Duration::from_millis(20),
        || thread::sleep(Duration::from_millis(60)),
        |m| m.clear(),
    );
    assert_eq!(events(&mut sub), [(1, 1, Cause::Expired)]);
    assert!(map.is_empty());
}

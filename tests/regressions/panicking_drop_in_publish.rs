//! What broke: when publishing overwrote an old event whose value panics in
//! `Drop`, `send_batch` unwound and the entries already taken out of the
//! shard were dropped with no event and no lag count: values lost on the
//! eviction thread, in `evict_expired`, in `clear` and at shutdown, and
//! `stats().evicted` undercounted. Fixed by finishing every batch and drain
//! before a caught panic goes on (`unwind::Panics`), and by counting each
//! batch before publishing it.
//!
//! Each test counts doors: every value that leaves is received by the one
//! subscriber or counted in its `Lagged(n)`.

use expiremap::{Cause, ExpireMap, ManualClock, Subscriber, TryRecvError};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);

/// A value whose original (the one the map holds and publishes) panics
/// when dropped; clones (what subscribers receive) do not.
#[derive(Debug)]
struct Bomb(bool);

impl Clone for Bomb {
    fn clone(&self) -> Self {
        Bomb(false)
    }
}

impl Drop for Bomb {
    fn drop(&mut self) {
        if self.0 && !std::thread::panicking() {
            panic!("value drop panics");
        }
    }
}

fn map(clock: &ManualClock, background: bool) -> ExpireMap<u32, Bomb> {
    ExpireMap::builder()
        .clock(clock.clone())
        .shards(2)
        .event_capacity(8)
        .background_eviction(background)
        .build()
}

/// Events received and lost to lag until the ring is empty (or closed),
/// counted by cause.
fn drain(sub: &mut Subscriber<u32, Bomb>, cause: Cause) -> u64 {
    let mut n = 0;
    loop {
        match sub.try_recv() {
            Ok(e) => {
                assert_eq!(e.cause, cause);
                n += 1;
            }
            Err(TryRecvError::Lagged(k)) => n += k,
            Err(TryRecvError::Empty | TryRecvError::Closed) => return n,
        }
    }
}

#[test]
fn evict_expired_publishes_every_value_when_a_drop_panics() {
    let clock = ManualClock::new();
    let map = map(&clock, false);
    let mut sub = map.subscribe().unwrap();
    for k in 0..200 {
        map.put(k, Bomb(true), MS);
    }
    clock.advance(5 * MS);
    let r = catch_unwind(AssertUnwindSafe(|| map.evict_expired()));
    assert!(r.is_err(), "the first panic reaches the caller");
    assert_eq!(drain(&mut sub, Cause::Expired), 200);
    assert_eq!(map.stats().evicted, 200);
    assert_eq!(map.len(), 0);
    drop(map);
    // What is left in the ring panics as it is dropped, one at a time.
    assert!(catch_unwind(AssertUnwindSafe(|| drop(sub))).is_err());
}

#[test]
fn the_eviction_thread_publishes_every_value_when_a_drop_panics() {
    let clock = ManualClock::new();
    let map = map(&clock, true);
    let mut sub = map.subscribe().unwrap();
    for k in 0..600 {
        map.put(k, Bomb(true), MS);
    }
    clock.advance(5 * MS);
    let mut seen = 0;
    for _ in 0..60_000 {
        seen += drain(&mut sub, Cause::Expired);
        if seen >= 600 && map.stats().evicted == 600 {
            break;
        }
        std::thread::sleep(MS);
    }
    assert_eq!((seen, map.stats().evicted, map.len()), (600, 600, 0));
    let _ = catch_unwind(AssertUnwindSafe(move || {
        drop(map);
        drop(sub);
    }));
}

#[test]
fn clear_and_shutdown_publish_every_value_when_a_drop_panics() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, Bomb> = ExpireMap::builder()
        .clock(clock.clone())
        .shards(2)
        .event_capacity(8)
        .background_eviction(false)
        .publish_removals(true)
        .build();
    let mut sub = map.subscribe().unwrap();
    for k in 0..100 {
        map.put(k, Bomb(true), Duration::from_secs(60));
    }
    assert!(catch_unwind(AssertUnwindSafe(|| map.clear())).is_err());
    assert_eq!(drain(&mut sub, Cause::Removed), 100);
    assert_eq!(map.len(), 0);
    for k in 0..100 {
        map.put(k, Bomb(true), Duration::from_secs(60));
    }
    assert!(catch_unwind(AssertUnwindSafe(move || drop(map))).is_err());
    assert_eq!(drain(&mut sub, Cause::Shutdown), 100);
    let _ = catch_unwind(AssertUnwindSafe(move || drop(sub)));
}

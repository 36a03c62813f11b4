//! What broke: a clock at `u64::MAX` (a `ManualClock` advanced by
//! `Duration::MAX`). The eviction thread's "nothing planned" was the time
//! `u64::MAX`, which is due at that clock: it made passes in a loop (two
//! million in half a second on an empty map). And a saturated deadline
//! (`u64::MAX`, live forever) kept `next_expiry` at `Some(0)`, so the
//! documented driver loop never ended. Fixed: "nothing planned" is not a
//! time, deadline `u64::MAX` has no eviction time, and everything else is
//! due once the clock reaches `u64::MAX`.

use expiremap::{Cause, Clock, ExpireMap, ManualClock, RecvError, Subscriber};
use std::time::Duration;

fn drain(sub: &mut Subscriber<u32, u32>) -> Vec<(u32, Cause)> {
    let mut out = Vec::new();
    loop {
        match sub.recv() {
            Ok(e) => out.push((e.key, e.cause)),
            Err(RecvError::Closed) => return out,
            Err(e) => panic!("{e:?}"),
        }
    }
}

#[test]
fn the_eviction_thread_rests_at_the_end_of_time() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .build();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, Duration::from_millis(5));
    map.put(2, 2, Duration::MAX);
    clock.advance(Duration::MAX);
    // The thread evicts key 1 (published before `recv` returns) ...
    let e = sub.recv().unwrap();
    assert_eq!((e.key, e.cause), (1, Cause::Expired));
    assert!(e.removed_at() > e.deadline());
    // ... and then plans nothing: key 2 never expires. Each wait below
    // gives a spinning thread time to show itself; a resting one makes no
    // pass however long it is.
    let settled = map.stats().passes;
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(20));
        let passes = map.stats().passes;
        assert!(
            passes <= settled + 1,
            "the thread keeps passing at the end of time: {settled} -> {passes}"
        );
    }
    assert_eq!(map.get(&2), Some(2));
    assert_eq!(map.next_expiry(), None);
    // A put at the end of time saturates too: live forever, never evicted.
    map.put(3, 3, Duration::from_nanos(1));
    assert_eq!(map.get(&3), Some(3));
    drop(map);
    let mut left = drain(&mut sub);
    left.sort_unstable();
    assert_eq!(left, [(2, Cause::Shutdown), (3, Cause::Shutdown)]);
}

#[test]
fn the_driver_loop_ends_with_a_saturated_entry() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .build();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, Duration::MAX);
    map.put(2, 2, Duration::from_secs(1));
    // Deadlines in the clock's last tick, which has no tick after it.
    clock.advance(Duration::from_nanos(u64::MAX - 10_000));
    map.put(3, 3, Duration::from_nanos(5_000));
    let mut rounds = 0;
    while let Some(d) = map.next_expiry() {
        rounds += 1;
        assert!(rounds < 1_000, "next_expiry keeps asking for passes");
        clock.advance(d);
        map.evict_expired();
    }
    assert_eq!(clock.now(), u64::MAX);
    assert_eq!((map.len(), map.get(&1)), (1, Some(1)));
    drop(map);
    let mut left = drain(&mut sub);
    left.sort_unstable();
    assert_eq!(
        left,
        [
            (1, Cause::Shutdown),
            (2, Cause::Expired),
            (3, Cause::Expired)
        ]
    );
}

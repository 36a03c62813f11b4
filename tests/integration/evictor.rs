//! The eviction thread's cost and planning. Real time appears only where the
//! assertion holds however slow the machine is.

use crate::common::MS;
use expiremap::{ExpireMap, ManualClock};
use std::time::Duration;

#[test]
fn an_idle_map_costs_zero_wake_ups() {
    let map: ExpireMap<u32, u32> = ExpireMap::new();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(map.stats().wakeups, 0);
    assert_eq!(map.stats().passes, 0);
}

#[test]
fn a_far_deadline_costs_at_most_the_one_kick() {
    let map: ExpireMap<u32, u32> = ExpireMap::new();
    map.put(1, 1, Duration::from_secs(3600));
    std::thread::sleep(Duration::from_millis(50));
    assert!(map.stats().wakeups <= 1, "{:?}", map.stats());
    assert_eq!(map.stats().passes, 0);
}

#[test]
fn passes_are_at_least_one_interval_apart_in_virtual_time() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .eviction_interval(Duration::from_millis(4))
        .build();
    let mut sub = map.subscribe().unwrap();
    for i in 1..=8 {
        map.put(i, i, MS * i); // one deadline per millisecond
    }
    // Step time 1 ms at a time, then wait for all eight events.
    for _ in 1..=12u32 {
        clock.advance(MS);
    }
    let mut received = Vec::new();
    while received.len() < 8 {
        received.push(sub.recv().unwrap().key);
    }
    received.sort_unstable();
    assert_eq!(received, (1..=8).collect::<Vec<_>>());
    // Events are published inside a pass; the counters land when it ends.
    while map.stats().evicted < 8 {
        std::thread::yield_now();
    }
    let stats = map.stats();
    // 8 deadlines over 8 ms with a 4 ms floor between passes: at most 4 passes.
    assert!(stats.passes <= 4, "{stats:?}");
    assert_eq!(stats.evicted, 8);
}

#[test]
fn evict_expired_works_alongside_the_thread() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .build();
    for i in 0..1000 {
        map.put(i, i, MS);
    }
    clock.advance(3 * MS);
    let by_hand = map.evict_expired();
    // Everything was due: the call took what the thread had not, so the map
    // is empty now, and the two together evicted each entry once.
    assert!(map.is_empty());
    assert!(by_hand <= 1000);
    while map.stats().evicted < 1000 {
        std::thread::yield_now(); // the thread's counter lands after its pass
    }
    assert_eq!(map.stats().evicted, 1000);
}

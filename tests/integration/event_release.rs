//! An event's value leaves the event ring as soon as every subscriber has
//! taken it (or is gone), not when the ring wraps: counted with the strong
//! count of an `Arc` the test keeps a clone of. Single-threaded and driven
//! by a `ManualClock`: every assertion is exact.

use crate::common::{MS, manual};
use expiremap::{Cause, ExpireMap, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

/// A map of `Arc` values, with one entry (key 1) expired and published;
/// returns the map and the test's own clone of the value.
fn one_expired(subscribers: usize) -> (ExpireMap<u32, Arc<String>>, Vec<Sub>, Arc<String>) {
    let (map, clock) = manual::<u32, Arc<String>>();
    let subs = (0..subscribers).map(|_| map.subscribe().unwrap()).collect();
    let probe = Arc::new(String::from("held by a resource"));
    map.put(1, Arc::clone(&probe), MS);
    clock.advance(2 * MS);
    assert_eq!(map.evict_expired(), 1);
    // The test's clone and the event in the ring.
    assert_eq!(Arc::strong_count(&probe), 2);
    (map, subs, probe)
}

type Sub = expiremap::Subscriber<u32, Arc<String>>;

#[test]
fn a_value_is_released_once_the_only_subscriber_received_it() {
    let (_map, mut subs, probe) = one_expired(1);
    let event = subs[0].try_recv().unwrap();
    assert_eq!((event.key, event.cause), (1, Cause::Expired));
    // The subscriber's copy only: the ring let go of its own.
    assert_eq!(Arc::strong_count(&probe), 2);
    drop(event);
    assert_eq!(
        Arc::strong_count(&probe),
        1,
        "the ring still holds the value"
    );
}

#[test]
fn a_removed_value_is_released_once_the_only_subscriber_received_it() {
    let map = ExpireMap::<u32, Arc<String>>::builder()
        .background_eviction(false)
        .publish_removals(true)
        .build();
    let mut sub = map.subscribe().unwrap();
    let probe = Arc::new(String::from("removed"));
    map.put(1, Arc::clone(&probe), Duration::from_secs(60));
    let removed = map.remove(&1).unwrap();
    drop(removed);
    let event = sub.recv().unwrap();
    assert_eq!(event.cause, Cause::Removed);
    drop(event);
    assert_eq!(
        Arc::strong_count(&probe),
        1,
        "the ring still holds the value"
    );
}

#[test]
fn the_slow_subscriber_keeps_the_value_until_it_has_taken_it() {
    let (_map, mut subs, probe) = one_expired(2);
    let (fast, slow) = subs.split_at_mut(1);
    drop(fast[0].try_recv().unwrap());
    assert_eq!(fast[0].try_recv().unwrap_err(), TryRecvError::Empty);
    assert_eq!(
        Arc::strong_count(&probe),
        2,
        "kept for the subscriber that has not taken it"
    );
    let event = slow[0].try_recv().unwrap();
    assert_eq!(event.key, 1);
    drop(event);
    assert_eq!(Arc::strong_count(&probe), 1, "released once both took it");
}

#[test]
fn a_subscriber_that_goes_away_unread_releases_what_only_it_held() {
    let (_map, mut subs, probe) = one_expired(2);
    drop(subs[0].try_recv().unwrap());
    assert_eq!(Arc::strong_count(&probe), 2);
    let idle = subs.pop().unwrap();
    drop(idle);
    assert_eq!(
        Arc::strong_count(&probe),
        1,
        "released with the last holder"
    );
}

#[test]
fn a_subscriber_that_never_reads_keeps_the_value_until_the_ring_wraps() {
    let clock = expiremap::ManualClock::new();
    let map = ExpireMap::<u32, Arc<String>>::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .event_capacity(4)
        .build();
    let _idle = map.subscribe().unwrap();
    let probe = Arc::new(String::from("first"));
    // One event at a time, so that the probe's is the oldest.
    let publish = |k: u32, v: Arc<String>| {
        map.put(k, v, MS);
        clock.advance(2 * MS);
        assert_eq!(map.evict_expired(), 1);
    };
    publish(0, Arc::clone(&probe));
    for k in 1..4 {
        publish(k, Arc::new(k.to_string()));
    }
    assert_eq!(Arc::strong_count(&probe), 2, "kept for the idle subscriber");
    // A fifth event needs the first one's slot: the idle subscriber lags.
    publish(9, Arc::new(String::from("fifth")));
    assert_eq!(Arc::strong_count(&probe), 1, "reused by the fifth event");
}

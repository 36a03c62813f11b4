//! Events: doors, publication rules, background eviction on a ManualClock,
//! lag, registry limits, shutdown notification and Closed.

use crate::common::{MS, manual};
use expiremap::{Cause, Event, ExpireMap, ManualClock, RecvError, SubscribeError, TryRecvError};
use std::time::Duration;

fn drain<K: Clone + Send + Sync, V: Clone + Send + Sync>(
    sub: &mut expiremap::Subscriber<K, V>,
) -> Vec<Event<K, V>> {
    let mut out = Vec::new();
    while let Ok(e) = sub.try_recv() {
        out.push(e);
    }
    out
}

fn with_removals() -> (ExpireMap<u32, u32>, ManualClock) {
    let clock = ManualClock::new();
    let map = ExpireMap::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .publish_removals(true)
        .build();
    (map, clock)
}

#[test]
fn eviction_publishes_expired_with_deadline_and_time() {
    let (map, clock) = manual::<u32, u32>();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 10, 5 * MS);
    clock.advance(7 * MS);
    assert_eq!(map.evict_expired(), 1);
    let e = sub.try_recv().unwrap();
    assert_eq!((e.key, e.value, e.cause), (1, 10, Cause::Expired));
    assert_eq!(e.deadline(), 5 * MS);
    assert_eq!(e.removed_at(), 7 * MS);
    assert_eq!(e.lateness(), 2 * MS);
    assert_eq!(sub.try_recv().unwrap_err(), TryRecvError::Empty);
}

#[test]
fn by_default_removals_and_replacements_are_not_published() {
    let (map, _clock) = manual::<u32, u32>();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, MS);
    assert_eq!(map.put(1, 2, MS), Some(1));
    assert_eq!(map.remove(&1), Some(2));
    map.put(3, 3, MS);
    map.clear();
    assert!(drain(&mut sub).is_empty());
}

#[test]
fn publish_removals_adds_removed_and_replaced() {
    let (map, _clock) = with_removals();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, MS);
    assert_eq!(map.put(1, 2, MS), Some(1));
    assert_eq!(map.remove(&1), Some(2));
    map.put(3, 3, MS);
    map.clear();
    let got: Vec<_> = drain(&mut sub)
        .into_iter()
        .map(|e| (e.key, e.value, e.cause))
        .collect();
    assert_eq!(
        got,
        [
            (1, 1, Cause::Replaced),
            (1, 2, Cause::Removed),
            (3, 3, Cause::Removed)
        ]
    );
}

#[test]
fn expired_values_found_by_remove_put_or_clear_leave_as_expired() {
    let (map, clock) = with_removals();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, MS);
    map.put(2, 2, MS);
    map.put(3, 3, MS);
    clock.advance(2 * MS);
    assert_eq!(map.remove(&1), None);
    assert_eq!(map.put(2, 20, MS), None);
    map.clear(); // 2 is live (new value), 3 is expired
    let got: Vec<_> = drain(&mut sub)
        .into_iter()
        .map(|e| (e.key, e.value, e.cause))
        .collect();
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(got[0], (1, 1, Cause::Expired));
    assert_eq!(got[1], (2, 2, Cause::Expired));
    let mut rest = got[2..].to_vec();
    rest.sort_unstable();
    assert_eq!(rest, [(2, 20, Cause::Removed), (3, 3, Cause::Expired)]);
}

#[test]
fn events_of_one_thread_appear_in_its_operation_order() {
    let (map, clock) = with_removals();
    let mut sub = map.subscribe().unwrap();
    for i in 0..50u32 {
        map.put(i, i, MS);
        if i % 2 == 0 {
            map.remove(&i);
        }
    }
    clock.advance(3 * MS);
    map.evict_expired();
    let got = drain(&mut sub);
    let removed: Vec<u32> = got
        .iter()
        .filter(|e| e.cause == Cause::Removed)
        .map(|e| e.key)
        .collect();
    assert_eq!(removed, (0..50).step_by(2).collect::<Vec<_>>());
    assert_eq!(got.iter().filter(|e| e.cause == Cause::Expired).count(), 25);
}

#[test]
fn background_thread_follows_manual_clock() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .build();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, 10 * MS);
    map.put(2, 2, 20 * MS);
    clock.advance(12 * MS);
    // Blocks until the thread, woken by advance, has evicted key 1.
    let e = sub.recv().unwrap();
    assert_eq!((e.key, e.cause), (1, Cause::Expired));
    assert_eq!(map.get(&2), Some(2));
    clock.advance(10 * MS);
    let e = sub.recv().unwrap();
    assert_eq!((e.key, e.cause), (2, Cause::Expired));
    assert!(e.lateness() <= Duration::from_millis(4) + MS);
}

#[test]
fn an_earlier_put_wakes_the_planning_thread() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .build();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, Duration::from_secs(3600));
    map.put(2, 2, 5 * MS); // earlier than the planned wake-up
    clock.advance(7 * MS);
    let e = sub.recv().unwrap();
    assert_eq!(e.key, 2);
}

#[test]
fn shutdown_publishes_live_entries_then_closes() {
    let (map, clock) = manual::<u32, u32>();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, MS);
    map.put(2, 2, Duration::from_secs(60));
    clock.advance(5 * MS);
    drop(map);
    let mut got: Vec<_> = drain(&mut sub)
        .into_iter()
        .map(|e| (e.key, e.cause))
        .collect();
    got.sort_unstable_by_key(|g| g.0);
    assert_eq!(got, [(1, Cause::Expired), (2, Cause::Shutdown)]);
    assert_eq!(sub.try_recv().unwrap_err(), TryRecvError::Closed);
    assert_eq!(sub.recv().unwrap_err(), RecvError::Closed);
}

#[test]
fn shutdown_notification_can_be_turned_off() {
    let map = ExpireMap::<u32, u32>::builder()
        .clock(ManualClock::new())
        .notify_on_shutdown(false)
        .build();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, Duration::from_secs(60));
    drop(map);
    assert_eq!(sub.recv().unwrap_err(), RecvError::Closed);
}

#[test]
fn background_map_shutdown_notifies_and_closes() {
    let map = ExpireMap::<u32, String>::builder()
        .clock(ManualClock::new())
        .build();
    let mut sub = map.subscribe().unwrap();
    for i in 0..100 {
        map.put(i, i.to_string(), Duration::from_secs(60));
    }
    drop(map);
    let mut n = 0;
    loop {
        match sub.recv() {
            Ok(e) => {
                assert_eq!(e.cause, Cause::Shutdown);
                assert_eq!(e.value, e.key.to_string());
                n += 1;
            }
            Err(RecvError::Closed) => break,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(n, 100);
}

#[test]
fn subscriber_joining_later_sees_only_later_events() {
    let (map, clock) = manual::<u32, u32>();
    let mut early = map.subscribe().unwrap();
    map.put(1, 1, MS);
    clock.advance(2 * MS);
    map.evict_expired();
    let mut late = map.subscribe().unwrap();
    map.put(2, 2, MS);
    clock.advance(2 * MS);
    map.evict_expired();
    assert_eq!(drain(&mut early).len(), 2);
    let l = drain(&mut late);
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].key, 2);
}

#[test]
fn slow_subscriber_is_told_exactly_how_many_it_lost() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .event_capacity(8)
        .build();
    let mut sub = map.subscribe().unwrap();
    for i in 0..20 {
        map.put(i, i, MS);
    }
    clock.advance(2 * MS);
    assert_eq!(map.evict_expired(), 20);
    // A lag is counted in `Stats::events_lost` once it is reported.
    assert_eq!(map.stats().events_lost, 0);
    let mut lost = 0;
    let mut seen = 0;
    loop {
        match sub.try_recv() {
            Ok(_) => seen += 1,
            Err(TryRecvError::Lagged(n)) => lost += n,
            Err(TryRecvError::Empty) => break,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(lost + seen, 20, "lost {lost} seen {seen}");
    assert!(lost >= 12, "at most the capacity survives: lost {lost}");
    assert_eq!(map.stats().events_lost, lost);
    // Every subscriber's losses add up: a second one, 12 events behind.
    let mut late = map.subscribe().unwrap();
    for i in 0..20 {
        map.put(i, i, MS);
    }
    clock.advance(2 * MS);
    assert_eq!(map.evict_expired(), 20);
    assert_eq!(late.try_recv().unwrap_err(), TryRecvError::Lagged(12));
    assert_eq!(map.stats().events_lost, lost + 12);
}

#[test]
fn subscribe_fails_cleanly_when_registry_is_full() {
    let (map, _clock) = manual::<u32, u32>();
    let map = {
        drop(map);
        ExpireMap::<u32, u32>::builder()
            .clock(ManualClock::new())
            .background_eviction(false)
            .max_subscribers(2)
            .build()
    };
    let a = map.subscribe().unwrap();
    let _b = map.subscribe().unwrap();
    let err = map.subscribe().unwrap_err();
    assert_eq!(err, SubscribeError::RegistryFull { max_readers: 2 });
    assert!(!err.to_string().is_empty());
    drop(a);
    assert!(
        map.subscribe().is_ok(),
        "a dropped subscriber frees its slot"
    );
}

#[test]
fn without_subscribers_nothing_is_published_and_values_drop() {
    use std::sync::Arc;
    let token = Arc::new(());
    let (map, clock) = manual::<u32, Arc<()>>();
    for i in 0..10 {
        map.put(i, token.clone(), MS);
    }
    clock.advance(2 * MS);
    map.evict_expired();
    assert_eq!(Arc::strong_count(&token), 1);
}

#[test]
fn subscriber_may_call_back_into_the_map_from_another_thread() {
    let clock = ManualClock::new();
    let map = std::sync::Arc::new(
        ExpireMap::<u32, u32>::builder()
            .clock(clock.clone())
            .publish_removals(true)
            .build(),
    );
    let mut sub = map.subscribe().unwrap();
    let m = map.clone();
    let worker = std::thread::spawn(move || {
        let mut handled = 0;
        while let Ok(e) = sub.recv() {
            // Re-enter the map from the subscriber: get, put, remove, subscribe.
            let _ = m.get(&e.key);
            if e.cause == Cause::Expired && e.key < 1000 {
                m.put(e.key + 1000, e.value, MS);
            }
            let _ = m.remove(&(e.key + 5000));
            let _extra = m.subscribe();
            handled += 1;
            if handled == 10 {
                break;
            }
        }
        handled
    });
    for i in 0..10 {
        map.put(i, i, MS);
    }
    clock.advance(5 * MS);
    assert_eq!(worker.join().unwrap(), 10);
}

#[test]
fn last_handle_dropped_by_a_subscriber_thread() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .build();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, MS);
    map.put(2, 2, Duration::from_secs(60));
    let holder = std::sync::Arc::new(std::sync::Mutex::new(Some(map)));
    let h = holder.clone();
    let t = std::thread::spawn(move || {
        let first = sub.recv().unwrap();
        // Drop the map from the subscriber thread while it holds a subscriber.
        drop(h.lock().unwrap().take());
        let second = sub.recv().unwrap();
        (first.cause, second.cause, sub.recv().unwrap_err())
    });
    clock.advance(3 * MS);
    let (a, b, c) = t.join().unwrap();
    assert_eq!(
        (a, b, c),
        (Cause::Expired, Cause::Shutdown, RecvError::Closed)
    );
}

//! Edges of the capacity bound: weights (0, the whole bound, past it), a
//! weigher that panics, `max_entries(1)` over many shards, idle expiry
//! beside the conditional writes, and the accounting of `len`,
//! `weighted_size` and `stats` after each. Two were bugs once: `try_put`
//! of an overweight value over a held key, and expired entries the bound
//! took not counted as evicted.

use crate::common::within;
use expiremap::{Cause, ExpireIf, ExpireMap, ManualClock, Refused, Subscriber, Update};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

const SEC: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3_600);

/// A map whose values are their weights, bounded by `max` in `shards`
/// shards, on `clock`, driven by hand.
fn weighed(clock: &ManualClock, shards: usize, max: u64) -> ExpireMap<u32, u64> {
    ExpireMap::builder()
        .clock(clock.clone())
        .shards(shards)
        .max_weight(max)
        .weigher(|_, &w: &u64| w)
        .background_eviction(false)
        .event_capacity(1 << 12)
        .build()
}

/// Every event now in `sub`, as (key, value, cause).
fn drain<V: Clone + Send + Sync>(sub: &mut Subscriber<u32, V>) -> Vec<(u32, V, Cause)> {
    std::iter::from_fn(|| sub.try_recv().ok())
        .map(|e| (e.key, e.value, e.cause))
        .collect()
}

// `try_put` of a value heavier than the whole bound over a held key: the
// bound declines the value, so it comes back as `Err(Refused)`,
// unpublished (the docs of `try_put`), and the old value stays. It was
// once published as `Size`, the old value returned as replaced.
#[test]
fn try_put_hands_back_an_overweight_value_over_a_held_key() {
    let clock = ManualClock::new();
    let map = weighed(&clock, 1, 10);
    let mut sub = map.subscribe().unwrap();
    map.put(1, 4, HOUR);
    let r = map.try_put(1, 11, HOUR);
    let events = drain(&mut sub);
    assert_eq!(
        (r, events),
        (Err(Refused { key: 1, value: 11 }), vec![]),
        "the declined value is handed back, nothing published"
    );
    assert_eq!((map.get(&1), map.weighted_size()), (Some(4), 4));
    assert_eq!(map.try_insert(1, 12), Err(Refused { key: 1, value: 12 }));
    assert_eq!(map.get(&1), Some(4));
    assert_eq!(drain(&mut sub), vec![]);
}

// Zero-weight entries cost nothing against `max_weight`: any number is
// held beside an entry of the whole bound, `weighted_size` stays exact,
// and when one grows every value is held or left once (as `Size`);
// removing what is held brings the weight back to 0.
#[test]
fn zero_weights_are_free_and_accounted() {
    let clock = ManualClock::new();
    let map = weighed(&clock, 4, 3);
    let mut sub = map.subscribe().unwrap();
    for k in 0..100 {
        map.put(k, 0, HOUR);
    }
    assert_eq!((map.len(), map.weighted_size()), (100, 0));
    map.put(1000, 3, HOUR); // the whole bound, beside 100 free entries
    assert_eq!((map.len(), map.weighted_size()), (101, 3));
    assert_eq!(map.put(5, 2, HOUR), Some(0));
    assert_eq!(map.get(&5), Some(2));
    let held: Vec<(u32, u64)> = map.iter().collect();
    let left = drain(&mut sub);
    assert!(left.iter().all(|e| e.2 == Cause::Size), "{left:?}");
    assert_eq!(held.len() + left.len(), 101, "every value held or out once");
    assert_eq!(map.weighted_size(), held.iter().map(|e| e.1).sum::<u64>());
    assert_eq!(map.weighted_size(), 2);
    map.put(5, 0, HOUR);
    assert_eq!(map.weighted_size(), 0);
    for (k, _) in held {
        assert!(map.remove(&k).is_some());
    }
    assert_eq!((map.len(), map.weighted_size()), (0, 0));
}

// A plain `put` of a value heavier than the bound over a held key returns
// the old value, publishes the new one as `Size` (and only it), and leaves
// the key absent with its weight given back.
#[test]
fn put_of_an_overweight_value_over_a_held_key_leaves_one_door_each() {
    let clock = ManualClock::new();
    let map = weighed(&clock, 2, 10);
    let mut sub = map.subscribe().unwrap();
    map.put(1, 4, HOUR);
    map.put(2, 5, HOUR);
    assert_eq!(map.put(1, 11, HOUR), Some(4));
    assert_eq!(drain(&mut sub), vec![(1, 11, Cause::Size)]);
    assert_eq!(map.get(&1), None);
    assert_eq!((map.len(), map.weighted_size()), (1, 5));
    assert_eq!(map.stats().size_evicted, 1);
    // The room is there again: a new entry of the rest of the bound fits.
    map.put(3, 5, HOUR);
    assert_eq!((map.len(), map.weighted_size()), (2, 10));
}

// `max_weight(u64::MAX)` with a weigher of `u64::MAX`: the first such
// entry fills the bound exactly; `clear` gives it all back; a `replace`
// with the whole bound over a small entry takes it.
#[test]
fn a_weight_of_u64_max_fills_a_bound_of_u64_max() {
    let clock = ManualClock::new();
    let map = weighed(&clock, 8, u64::MAX);
    map.put(1, u64::MAX, HOUR);
    assert_eq!((map.len(), map.weighted_size()), (1, u64::MAX));
    map.clear();
    assert_eq!((map.len(), map.weighted_size()), (0, 0));
    map.put(2, 1, HOUR);
    assert_eq!(map.replace(&2, u64::MAX, HOUR), Some(1));
    assert_eq!(
        (map.get(&2), map.weighted_size()),
        (Some(u64::MAX), u64::MAX)
    );
    assert_eq!(map.remove(&2), Some(u64::MAX));
    assert_eq!(map.weighted_size(), 0);
}

// A weigher that panics: the panic reaches the caller of `put`, `replace`,
// `put_if_absent`, `update` and a loader, nothing is stored, and the key
// is usable afterwards (no flight left behind, no weight leaked).
#[test]
fn a_panicking_weigher_leaves_the_map_usable() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u64> = ExpireMap::builder()
        .clock(clock.clone())
        .shards(2)
        .max_weight(100)
        .weigher(|_, &w: &u64| {
            assert_ne!(w, 13, "weigher panic");
            w
        })
        .background_eviction(false)
        .build();
    map.put(1, 5, HOUR);
    let m = AssertUnwindSafe(&map);
    assert!(catch_unwind(|| m.put(1, 13, HOUR)).is_err());
    assert!(catch_unwind(|| m.replace(&1, 13, HOUR)).is_err());
    assert!(catch_unwind(|| m.put_if_absent(2, 13, HOUR)).is_err());
    assert!(catch_unwind(|| m.update(1, |_| Update::Set(13, HOUR))).is_err());
    assert!(catch_unwind(|| m.get_or_insert_with(3, HOUR, || 13)).is_err());
    assert_eq!(
        (map.get(&1), map.get(&2), map.get(&3)),
        (Some(5), None, None)
    );
    assert_eq!((map.len(), map.weighted_size()), (1, 5));
    // Every key is free for writes again, on another thread so a hang fails.
    let map = std::sync::Arc::new(map);
    let m = map.clone();
    within(20, move || {
        assert_eq!(m.update(1, |_| Update::Set(6, HOUR)), Some(6));
        assert_eq!(m.get_or_insert_with(3, HOUR, || 7), 7);
        assert_eq!(m.put(2, 8, HOUR), None);
    })
    .unwrap();
    assert_eq!((map.len(), map.weighted_size()), (3, 21));
}

// `max_entries(1)` asked for 64 shards: never more than one entry held,
// every value put is held or left once as `Size`, and after a removal the
// next new key is stored at once.
#[test]
fn max_entries_one_asked_for_many_shards() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = ExpireMap::builder()
        .clock(clock.clone())
        .shards(64)
        .max_entries(1)
        .background_eviction(false)
        .event_capacity(1 << 12)
        .build();
    let mut sub = map.subscribe().unwrap();
    for k in 0..200 {
        map.put(k, k, HOUR);
        map.get(&(k / 2));
        assert_eq!(map.iter().count(), 1, "after key {k}");
        assert_eq!((map.len(), map.weighted_size()), (1, 1));
    }
    let left = drain(&mut sub);
    assert_eq!(left.len(), 199, "every value out once");
    assert!(left.iter().all(|e| e.2 == Cause::Size));
    let (k, v) = map.iter().next().unwrap();
    assert_eq!(map.remove(&k), Some(v));
    assert_eq!((map.len(), map.weighted_size()), (0, 0));
    assert_eq!(map.put(777, 7, HOUR), None);
    assert_eq!(map.get(&777), Some(7), "room was free: stored at once");
}

// A full `max_entries` map: an expired (not yet evicted) entry counts as
// absent for `put_if_absent` (stored, the old value out as `Expired`),
// `replace` (nothing stored, `None`) and `touch`/`expire` (`false`);
// nothing live is pushed out by any of them.
#[test]
fn conditional_writes_over_an_expired_entry_in_a_full_map() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = ExpireMap::builder()
        .clock(clock.clone())
        .shards(4)
        .max_entries(3)
        .background_eviction(false)
        .build();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, SEC);
    map.put(2, 2, HOUR);
    map.put(3, 3, HOUR);
    clock.advance(2 * SEC);
    assert!(!map.touch(&1, HOUR));
    assert!(!map.expire(&1, HOUR, ExpireIf::Later));
    assert_eq!(map.replace(&1, 10, HOUR), None);
    assert_eq!(map.get(&1), None);
    assert_eq!(map.put_if_absent(1, 11, HOUR), None);
    assert_eq!(map.get(&1), Some(11));
    assert_eq!(drain(&mut sub), vec![(1, 1, Cause::Expired)]);
    assert_eq!((map.get(&2), map.get(&3)), (Some(2), Some(3)));
    assert_eq!((map.len(), map.weighted_size()), (3, 3));
}

// Expired entries a full map's put pushes out to make room are "evicted
// because their deadline passed" and counted in `Stats::evicted` (they
// once were not: only the writers' eviction of the same pass counted).
#[test]
fn expired_entries_the_bound_takes_count_as_evicted() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = ExpireMap::builder()
        .clock(clock.clone())
        .shards(1)
        .max_entries(2)
        .background_eviction(false)
        .build();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, SEC);
    map.put(2, 2, SEC);
    clock.advance(2 * SEC);
    map.put(3, 3, HOUR);
    map.put(4, 4, HOUR);
    let left = drain(&mut sub);
    assert_eq!(left.len(), 2);
    assert!(left.iter().all(|e| e.2 == Cause::Expired));
    assert_eq!(map.stats().evicted, 2);
}

// Idle expiry beside the conditional writes: an idle-expired entry (write
// deadline far off) is absent for `put_if_absent` (stored; old out as
// `Expired`), `replace`, `touch`, `expire`, `retain` and `iter`.
#[test]
fn idle_expired_entries_are_absent_for_every_write_and_walk() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = ExpireMap::builder()
        .clock(clock.clone())
        .shards(2)
        .time_to_idle(10 * SEC)
        .max_entries(100)
        .background_eviction(false)
        .build();
    let mut sub = map.subscribe().unwrap();
    for k in 0..4 {
        map.put(k, k, HOUR);
    }
    clock.advance(11 * SEC);
    assert!(!map.touch(&0, HOUR));
    assert!(!map.expire(&0, HOUR, ExpireIf::Always));
    assert_eq!(map.replace(&1, 10, HOUR), None);
    assert_eq!(map.iter().count(), 0);
    let mut shown = 0;
    map.retain(|_, _| {
        shown += 1;
        false
    });
    assert_eq!(shown, 0);
    assert_eq!(map.put_if_absent(2, 20, HOUR), None);
    assert_eq!(map.get(&2), Some(20));
    map.evict_expired();
    let mut left = drain(&mut sub);
    left.sort_unstable();
    assert_eq!(
        left,
        vec![
            (0, 0, Cause::Expired),
            (1, 1, Cause::Expired),
            (2, 2, Cause::Expired),
            (3, 3, Cause::Expired)
        ]
    );
    assert_eq!((map.len(), map.weighted_size()), (1, 1));
}

// `touch` with `Duration::MAX` saturates: the entry never expires (no
// expiry reported, nothing evicted at the end of time), except by idle
// time in a map with idle expiry.
#[test]
fn touch_with_duration_max_saturates() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = ExpireMap::builder()
        .clock(clock.clone())
        .shards(2)
        .max_entries(10)
        .background_eviction(false)
        .build();
    map.put(1, 1, SEC);
    assert!(map.touch(&1, Duration::MAX));
    assert!(map.ttl(&1).unwrap() > Duration::from_secs(100 * 365 * 86_400));
    assert!(map.expire(&1, SEC, ExpireIf::Earlier));
    assert_eq!(map.ttl(&1), Some(SEC));
    assert!(!map.expire(&1, Duration::MAX, ExpireIf::Earlier));
    assert!(map.expire(&1, Duration::MAX, ExpireIf::Later));
    clock.advance(Duration::from_secs(1 << 33));
    assert_eq!(map.evict_expired(), 0);
    assert_eq!(map.get(&1), Some(1));

    let idle: ExpireMap<u32, u32> = ExpireMap::builder()
        .clock(clock.clone())
        .time_to_idle(10 * SEC)
        .background_eviction(false)
        .build();
    idle.put(1, 1, SEC);
    assert!(idle.touch(&1, Duration::MAX));
    assert_eq!(idle.ttl(&1), Some(10 * SEC), "idle-capped");
    clock.advance(11 * SEC);
    assert_eq!(idle.get(&1), None);
}

// Record stats: `get` of an entry past its deadline (held, not evicted)
// is a miss, `peek`, `contains_key` and `ttl` count nothing, and
// `get_many` counts each key.
#[test]
fn stats_count_expired_but_held_entries_as_misses() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = ExpireMap::builder()
        .clock(clock.clone())
        .shards(2)
        .max_entries(10)
        .record_stats(true)
        .background_eviction(false)
        .build();
    map.put(1, 1, SEC);
    map.put(2, 2, HOUR);
    clock.advance(2 * SEC);
    assert_eq!(map.get(&1), None);
    assert_eq!(map.get(&2), Some(2));
    assert_eq!(map.peek(&1), None);
    assert!(!map.contains_key(&1));
    assert_eq!(map.ttl(&2), Some(HOUR - 2 * SEC));
    assert_eq!(map.get_many(&[1, 2, 3]), vec![None, Some(2), None]);
    let s = map.stats();
    assert_eq!((s.hits, s.misses), (2, 3));
    assert_eq!(map.len(), 2, "the expired entry is still held");
}

// Threads race every write of a small weighted map (puts that grow and
// shrink, removals, conditional writes, updates, `retain`, `clear`,
// expiry and eviction): afterwards, with everything removed, no weight is
// left reserved or held, so a new key of the whole bound is stored at once.
#[test]
fn racing_writes_leak_no_weight_from_the_budget() {
    use std::sync::{Arc, Barrier};
    const MAX: u64 = 40;
    let clock = ManualClock::new();
    let map = Arc::new(weighed(&clock, 4, MAX));
    let start = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let (map, start, clock) = (map.clone(), start.clone(), clock.clone());
            std::thread::spawn(move || {
                let mut rng = crate::common::Rng(t + 1);
                start.wait();
                for i in 0..20_000u64 {
                    let k = rng.below(24) as u32;
                    let w = rng.below(MAX + 3);
                    let ttl = if rng.below(4) == 0 { SEC } else { HOUR };
                    match rng.below(14) {
                        0..=3 => drop(map.put(k, w, ttl)),
                        4 => drop(map.remove(&k)),
                        5 => drop(map.replace(&k, w, ttl)),
                        6 => drop(map.put_if_absent(k, w, ttl)),
                        7 => drop(map.update(k, |_| Update::Set(w, ttl))),
                        8 => drop(map.try_put(k, w, ttl)),
                        9 => drop(map.get(&k)),
                        10 if i % 64 == 0 => map.retain(|k, _| k % 3 != 0),
                        11 if i % 512 == 0 => map.clear(),
                        12 => {
                            if t == 0 && i % 16 == 0 {
                                clock.advance(SEC / 2);
                            }
                            map.evict_expired();
                        }
                        _ => drop(map.expire(&k, SEC, ExpireIf::Earlier)),
                    }
                }
            })
        })
        .collect();
    within(120, move || {
        for h in handles {
            h.join().unwrap();
        }
    })
    .unwrap();
    let held: u64 = map.iter().map(|(_, w)| w).sum();
    assert!(held <= MAX);
    assert_eq!(map.weighted_size(), held);
    for k in map.keys() {
        map.remove(&k);
    }
    map.evict_expired();
    clock.advance(2 * HOUR);
    map.evict_expired();
    assert_eq!((map.len(), map.weighted_size()), (0, 0));
    map.put(1000, MAX, HOUR);
    assert_eq!(map.get(&1000), Some(MAX), "the whole budget is free");
}

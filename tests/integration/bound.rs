//! The capacity bound holds for the map as a whole: `n` distinct keys are
//! all held however they hash, any entry up to the bound is admitted, the
//! entries held never pass it, and every value still leaves by exactly one
//! door.

use crate::common::{MS, Rng, within};
use expiremap::{Cause, ExpireMap, ManualClock, Subscriber};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3_600);

/// A bounded map on a manual clock with the default shard count.
fn bounded(n: u64) -> (ExpireMap<u64, u64>, ManualClock) {
    let clock = ManualClock::new();
    let map = ExpireMap::builder()
        .clock(clock.clone())
        .max_entries(n)
        .background_eviction(false)
        .event_capacity(1 << 16)
        .build();
    (map, clock)
}

/// Every event now in `sub`, as (key, cause).
fn drain(sub: &mut Subscriber<u64, u64>) -> Vec<(u64, Cause)> {
    std::iter::from_fn(|| sub.try_recv().ok())
        .map(|e| (e.key, e.cause))
        .collect()
}

#[test]
fn max_entries_holds_exactly_min_of_n_and_the_distinct_keys_put() {
    for n in [7u64, 100, 10_000] {
        let (map, _clock) = bounded(n);
        let mut sub = map.subscribe().unwrap();
        let mut rng = Rng(n);
        for i in 0..n + n / 2 + 3 {
            map.put(rng.next_u64(), i, HOUR);
            if n > 100 && i % 997 != 0 && i != n - 1 && i != n {
                continue;
            }
            // Counted entry by entry (`len` is capped at the bound).
            let held = map.iter().count() as u64;
            assert_eq!(held, (i + 1).min(n), "n = {n}, after {} puts", i + 1);
            assert_eq!(map.len() as u64, held);
        }
        // Nothing read, nothing expired: what did not fit left as `Size`.
        let left = drain(&mut sub);
        assert_eq!(left.len() as u64, n / 2 + 3, "n = {n}");
        assert!(left.iter().all(|&(_, c)| c == Cause::Size), "n = {n}");
        assert_eq!(map.stats().size_evicted, n / 2 + 3);
    }
}

#[test]
fn keys_that_all_land_in_one_shard_still_fill_the_whole_bound() {
    /// Every key hashes to 0: one shard holds all of them.
    #[derive(Clone, Default)]
    struct Zero;
    struct ZeroHasher;
    impl Hasher for ZeroHasher {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, _: &[u8]) {}
    }
    impl BuildHasher for Zero {
        type Hasher = ZeroHasher;
        fn build_hasher(&self) -> ZeroHasher {
            ZeroHasher
        }
    }
    let map = ExpireMap::<u32, u32>::builder()
        .hasher(Zero)
        .shards(8)
        .max_entries(16)
        .background_eviction(false)
        .build();
    for k in 0..16 {
        map.put(k, k, HOUR);
    }
    assert_eq!(map.iter().count(), 16);
    assert!((0..16).all(|k| map.get(&k) == Some(k)));
}

#[test]
fn max_weight_admits_any_entry_up_to_the_bound() {
    const MIB: u64 = 1 << 20;
    let w = 32 * MIB;
    let map = || {
        ExpireMap::<u32, Vec<u8>>::builder()
            .max_weight(w)
            .weigher(|_, v: &Vec<u8>| v.len() as u64)
            .background_eviction(false)
            .build()
    };
    let value = |weight: u64| vec![0u8; weight as usize];
    // Half the budget, and the whole of it, each into an empty map with
    // the default shard count.
    for weight in [w / 2, w] {
        let m = map();
        m.put(1, value(weight), HOUR);
        assert_eq!(m.get(&1).map(|v| v.len() as u64), Some(weight));
        assert_eq!(m.weighted_size(), weight);
    }
    // Into a map holding others: the policy admits it once it was asked
    // for more often than what it displaces (each put counts), and then
    // it holds the whole budget alone.
    let m = map();
    m.put(1, value(w / 2), HOUR);
    m.put(2, value(5 * MIB), HOUR);
    assert_eq!(m.weighted_size(), w / 2 + 5 * MIB);
    let tries = (1..=16)
        .find(|_| {
            m.put(3, value(w), HOUR);
            m.get(&3).is_some()
        })
        .expect("admitted within 16 puts");
    assert_eq!((m.len(), m.weighted_size()), (1, w), "after {tries} puts");
    // Over the bound: refused however often, and the map keeps what it had.
    for _ in 0..3 {
        m.put(4, value(w + 1), HOUR);
    }
    assert_eq!((m.get(&4), m.weighted_size()), (None, w));
    // Refused: 3 until admitted, 4 three times; pushed out: 1 and 2.
    assert_eq!(m.stats().size_evicted, (tries - 1) + 3 + 2);
}

#[test]
fn weights_above_four_gib_add_up() {
    const GIB: u64 = 1 << 30;
    let map = ExpireMap::<u32, u64>::builder()
        .max_weight(20 * GIB)
        // The value is the weight it stands for.
        .weigher(|_, v: &u64| *v)
        .background_eviction(false)
        .build();
    map.put(1, 6 * GIB, HOUR);
    map.put(2, 7 * GIB, HOUR);
    assert_eq!(map.weighted_size(), 13 * GIB);
    map.put(3, 5 * GIB, HOUR);
    assert_eq!(map.weighted_size(), 18 * GIB);
    // 9 GiB more: 18 + 9 > 20, so at least one leaves.
    map.put(4, 9 * GIB, HOUR);
    let held: u64 = map.iter().map(|(_, v)| v).sum();
    assert_eq!(map.weighted_size(), held);
    assert!(held <= 20 * GIB, "{held}");
    // An overwrite that grows makes room too, never passing the bound.
    let k = map.keys().next().unwrap();
    map.put(k, 19 * GIB, HOUR);
    assert!(map.weighted_size() <= 20 * GIB);
    assert_eq!(map.get(&k), Some(19 * GIB));
}

#[test]
fn expired_entries_in_any_shard_make_room_first() {
    let (map, clock) = bounded(64);
    let mut sub = map.subscribe().unwrap();
    for k in 0..32 {
        map.put(k, k, MS);
    }
    for k in 32..64 {
        map.put(k, k, HOUR);
    }
    clock.advance(2 * MS);
    // 32 new keys: each takes the room of an expired one, wherever it is.
    for k in 64..96 {
        map.put(k, k, HOUR);
    }
    let left = drain(&mut sub);
    assert_eq!(left.len(), 32);
    assert!(
        left.iter().all(|&(k, c)| k < 32 && c == Cause::Expired),
        "{left:?}"
    );
    assert!((32..96).all(|k| map.get(&k) == Some(k)));
}

/// Threads put keys (mostly new, some again) into a small bound over 8
/// shards: the map ends holding the bound, and every value put is held,
/// was handed back by its overwrite, or left as `Size`, exactly once
/// (conservation across the cross-shard room making).
#[test]
fn concurrent_puts_keep_the_bound_and_every_value() {
    const THREADS: u64 = 4;
    const PER: u64 = 2_000;
    let map = Arc::new(
        ExpireMap::<u64, u64>::builder()
            .shards(8)
            .max_entries(50)
            .background_eviction(false)
            .event_capacity(1 << 16)
            .build(),
    );
    let mut sub = map.subscribe().unwrap();
    let start = Arc::new(Barrier::new(THREADS as usize));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (map, start) = (map.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let mut rng = Rng(t);
                let mut returned = 0u64;
                for i in 0..PER {
                    // Some keys again (overwrites), most new.
                    let k = t * PER + if rng.below(4) == 0 { i / 2 } else { i };
                    returned += u64::from(map.put(k, t * PER + i, HOUR).is_some());
                }
                returned
            })
        })
        .collect();
    let returned: u64 = within(60, || {
        handles.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
    })
    .expect("the puts end");
    let held: HashMap<u64, u64> = map.iter().collect();
    assert_eq!(held.len(), 50);
    assert_eq!(map.weighted_size(), 50);
    let left = drain(&mut sub);
    assert!(
        left.iter().all(|e| e.1 == Cause::Size),
        "only the bound pushes out"
    );
    assert_eq!(
        held.len() as u64 + left.len() as u64 + returned,
        THREADS * PER,
        "every value exactly once"
    );
}

#[test]
fn refusals_before_the_first_subscriber_are_counted_and_later_ones_published() {
    // `u64` values run no code when dropped: with nobody subscribed yet a
    // refused value is only counted; once a subscriber comes, each one is
    // published as `Size`.
    let clock = ManualClock::new();
    let map: ExpireMap<u64, u64> = ExpireMap::builder()
        .clock(clock)
        .shards(1)
        .max_entries(1)
        .background_eviction(false)
        .build();
    map.put(0, 0, HOUR);
    for _ in 0..3 {
        map.get(&0); // held and asked for: every newcomer below is refused
    }
    for k in 1..=5 {
        assert_eq!(map.put(k, k, HOUR), None);
    }
    assert_eq!(map.stats().size_evicted, 5);
    assert_eq!(map.get(&0), Some(0));
    let mut sub = map.subscribe().unwrap();
    for k in 6..=8 {
        map.put(k, k, HOUR);
    }
    assert_eq!(
        drain(&mut sub),
        vec![(6, Cause::Size), (7, Cause::Size), (8, Cause::Size)]
    );
    assert_eq!(map.stats().size_evicted, 8);
    assert_eq!(map.get(&0), Some(0));
}

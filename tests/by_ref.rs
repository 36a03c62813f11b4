//! The by-reference loaders and `insert` with the map's `time_to_live`.
//! One test binary with a counting allocator: a hit through
//! `get_or_insert_with_by_ref` allocates nothing (its owned-key twin
//! allocates the `String` the caller makes). It counts the test thread's
//! allocations only.

use expiremap::{BuildError, ExpireMap, ManualClock, Update};
use std::time::Duration;

#[path = "common/counting.rs"]
mod counting;
use counting::{Counting, allocations_here};

#[global_allocator]
static GLOBAL: Counting = Counting;

const MINUTE: Duration = Duration::from_secs(60);

/// Allocations made by `f` on this thread.
fn allocations<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let before = allocations_here();
    let r = f();
    (r, allocations_here() - before)
}

#[test]
fn by_ref_loaders_and_insert() {
    let map: ExpireMap<String, u64> = ExpireMap::builder()
        .clock(ManualClock::new())
        .background_eviction(false)
        .build();
    // A miss makes the owned key once, and stores.
    let (v, _) = allocations(|| map.get_or_insert_with_by_ref("key", MINUTE, || 7));
    assert_eq!((v, map.get("key")), (7, Some(7)));
    // Hits allocate nothing, through every by-reference loader.
    let (v, n) = allocations(|| {
        let mut sum = 0;
        for _ in 0..1_000 {
            sum += map.get_or_insert_with_by_ref("key", MINUTE, || unreachable!());
            sum += map
                .try_get_or_insert_with_by_ref("key", MINUTE, || Err::<u64, ()>(()))
                .unwrap();
        }
        sum
    });
    assert_eq!((v, n), (14_000, 0), "a hit allocated");
    // The owned form allocates the key the caller makes, hit or not.
    let (_, n) = allocations(|| map.get_or_insert_with("key".to_string(), MINUTE, || 0));
    assert!(n >= 1);
    // A failing init stores nothing; the error comes back.
    let r = map.try_get_or_insert_with_by_ref("other", MINUTE, || Err::<u64, _>("down"));
    assert_eq!((r, map.get("other")), (Err("down"), None));
    // update by reference.
    let add = |seen: Option<(&u64, Duration)>| match seen {
        None => Update::Set(1, MINUTE),
        Some((n, _)) => Update::SetKeepTtl(n + 1),
    };
    assert_eq!(map.update_by_ref("count", add), Some(1));
    assert_eq!(map.update_by_ref("count", add), Some(2));

    // `insert`: no time_to_live set, so no expiry.
    assert_eq!(map.insert("forever".to_string(), 1), None);
    assert_eq!(map.insert("forever".to_string(), 2), Some(1));
    assert!(map.ttl("forever").unwrap() > Duration::from_secs(100 * 365 * 86_400));

    // With `time_to_live`, `insert` stores for that long; `put` still
    // takes its own.
    let clock = ManualClock::new();
    let map: ExpireMap<&str, u32> = ExpireMap::builder()
        .clock(clock.clone())
        .time_to_live(Duration::from_secs(10))
        .background_eviction(false)
        .build();
    map.insert("a", 1);
    map.put("b", 2, Duration::from_secs(20));
    assert_eq!(map.ttl("a"), Some(Duration::from_secs(10)));
    clock.advance(Duration::from_secs(10));
    assert_eq!(map.get("a"), Some(1), "the deadline is inclusive");
    clock.advance(Duration::from_nanos(1));
    assert_eq!((map.get("a"), map.get("b")), (None, Some(2)));
    // A zero time_to_live is refused.
    let r = ExpireMap::<u32, u32>::builder()
        .time_to_live(Duration::ZERO)
        .try_build();
    assert_eq!(r.err(), Some(BuildError::TimeToLive(Duration::ZERO)));
}

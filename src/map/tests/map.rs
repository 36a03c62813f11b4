//! What a whole map adds to its shards: the default shard count, and a
//! load's flight that leaves its shard's list however the load ends.

#[test]
fn default_shards_are_64_per_core_up_to_256_and_at_least_four_per_core() {
    use crate::map::builder::default_shards;
    let got: Vec<usize> = [0, 1, 2, 3, 16, 64, 65, 128]
        .into_iter()
        .map(default_shards)
        .collect();
    assert_eq!(got, [64, 64, 128, 256, 256, 256, 512, 512]);
    assert_eq!(default_shards(usize::MAX), crate::MAX_SHARDS);
}

/// Flights registered in all of `map`'s shards.
fn flights_held<S: std::hash::BuildHasher>(map: &crate::map::ExpireMap<u64, u64, S>) -> usize {
    map.inner
        .shards
        .iter()
        .map(|s| s.read().flights.len())
        .sum()
}

#[test]
// A whole map starts its eviction thread, which Miri's strict provenance
// cannot run (std's thread spawn); the flight list holds no unsafe code.
#[cfg_attr(miri, ignore)]
fn a_load_leaves_its_shards_flight_list_however_it_ends() {
    use crate::map::ExpireMap;
    use std::time::Duration;
    let min = Duration::from_secs(60);
    let map: ExpireMap<u64, u64> = ExpireMap::builder().shards(1).build();
    // Stored: the store takes the flight out.
    assert_eq!(map.get_or_insert_with(1, min, || 10), 10);
    assert_eq!(flights_held(&map), 0);
    assert_eq!(map.get(&1), Some(10));
    // Touched by a put during `init`: not stored, and the flight is out.
    assert_eq!(
        map.get_or_insert_with(2, min, || {
            assert_eq!(flights_held(&map), 1);
            map.put(2, 20, min);
            21
        }),
        21
    );
    assert_eq!(flights_held(&map), 0);
    assert_eq!(map.get(&2), Some(20));
    // A zero TTL stores nothing; an error; a panic: the guard takes it out.
    assert_eq!(map.get_or_insert_with(3, Duration::ZERO, || 30), 30);
    assert_eq!(
        map.try_get_or_insert_with(4, min, || Err::<u64, _>("down")),
        Err("down")
    );
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        map.get_or_insert_with(5, min, || panic!("init"))
    }));
    assert!(unwound.is_err());
    assert_eq!(flights_held(&map), 0);
    // A value the bound refuses: the refusal settles the load.
    let bounded: ExpireMap<u64, u64> = ExpireMap::builder().shards(1).max_entries(1).build();
    for k in 0..50 {
        bounded.get_or_insert_with(k, min, || k);
        assert_eq!(flights_held(&bounded), 0, "key {k}");
    }
    // A later load of a key runs its own `init` (no flight was left).
    assert_eq!(map.get_or_insert_with(3, min, || 31), 31);
    assert_eq!(flights_held(&map), 0);
}

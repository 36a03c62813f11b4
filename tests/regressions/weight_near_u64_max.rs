//! What broke: a map bounded by `max_weight` near `u64::MAX` never made
//! room. Whether a weight fits was `used.saturating_add(w) <= cap`, which
//! with `cap = u64::MAX` answers "fits" when the sum overflows: the put
//! went round asking for room that it was told was there and never
//! reserved, and was refused, so a key asked for 20 times never displaced
//! a never-read entry of weight `u64::MAX - 5`. Sums of weights are now
//! checked: one that overflows does not fit.

use expiremap::{Cause, ExpireMap};
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3_600);

/// A map bounded by `max_weight(u64::MAX)` whose values are their weights.
fn heaviest() -> ExpireMap<u32, u64> {
    ExpireMap::builder()
        .max_weight(u64::MAX)
        .weigher(|_, &w: &u64| w)
        .background_eviction(false)
        .build()
}

#[test]
fn a_popular_key_displaces_an_entry_of_almost_the_whole_bound() {
    let map = heaviest();
    let mut sub = map.subscribe().unwrap();
    map.put(1, u64::MAX - 5, HOUR);
    assert_eq!(map.weighted_size(), u64::MAX - 5);
    // Each put counts key 2 once; it gets in once it was asked for more
    // often than key 1 (put once, never read).
    let tries = (1..=20)
        .find(|_| {
            map.put(2, 10, HOUR);
            map.get(&2).is_some()
        })
        .expect("admitted within 20 puts");
    assert_eq!((map.get(&1), map.weighted_size()), (None, 10));
    let left: Vec<_> = std::iter::from_fn(|| sub.try_recv().ok())
        .map(|e| (e.key, e.cause))
        .collect();
    let mut want = vec![(2, Cause::Size); tries - 1];
    want.push((1, Cause::Size));
    assert_eq!(left, want, "refused until admitted, then key 1 pushed out");
}

#[test]
fn an_overwrite_that_grows_past_the_sum_makes_room() {
    let map = heaviest();
    map.put(1, u64::MAX - 5, HOUR);
    map.put(2, 5, HOUR);
    assert_eq!(map.weighted_size(), u64::MAX);
    // Key 2 grows by 5: the sum would overflow, so room is made (an
    // overwrite counts as an access; key 1 was never read).
    map.put(2, 10, HOUR);
    assert_eq!((map.get(&1), map.get(&2)), (None, Some(10)));
    assert_eq!(map.weighted_size(), 10);
    // The whole bound, in two entries.
    map.put(3, u64::MAX - 10, HOUR);
    assert_eq!(map.weighted_size(), u64::MAX);
    assert_eq!(map.get(&3), Some(u64::MAX - 10));
}

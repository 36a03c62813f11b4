//! After a burst of large event values read by every subscriber, the
//! memory held returns to what the map itself needs: the event ring keeps no
//! value every subscriber has taken (counting global allocator; one test in
//! this binary, so nothing else allocates while it counts).

use expiremap::{ExpireMap, ManualClock, Subscriber};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[path = "common/counting.rs"]
mod counting;
use counting::{Counting, LIVE};

#[global_allocator]
static GLOBAL: Counting = Counting;

const MS: Duration = Duration::from_millis(1);

/// Values per round: well under the ring's 1,024 events, so no subscriber
/// ever lags.
const ROUND: u32 = 100;

/// Puts `ROUND` values of `bytes` bytes each, expires and evicts them, and
/// has every subscriber receive (and drop) every event.
fn round(
    map: &ExpireMap<u32, Arc<Vec<u8>>>,
    clock: &ManualClock,
    subs: &mut [Subscriber<u32, Arc<Vec<u8>>>],
    bytes: usize,
) {
    for k in 0..ROUND {
        map.put(k, Arc::new(vec![k as u8; bytes]), MS);
    }
    clock.advance(2 * MS);
    assert_eq!(map.evict_expired(), ROUND as usize);
    for sub in subs.iter_mut() {
        for _ in 0..ROUND {
            drop(sub.try_recv().expect("every event is received"));
        }
    }
}

#[test]
fn memory_after_a_burst_read_by_every_subscriber_returns_to_the_maps_own() {
    const MIB: usize = 1 << 20;
    let before = LIVE.load(Ordering::SeqCst);
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, Arc<Vec<u8>>>::builder()
        .clock(clock.clone())
        .shards(4)
        .background_eviction(false)
        .build();
    let mut subs: Vec<_> = (0..2).map(|_| map.subscribe().unwrap()).collect();
    // The map's own: its shards and timer warmed by one round of empty
    // values, the event ring (default 1,024 slots) and the subscribers.
    round(&map, &clock, &mut subs, 0);
    let own = LIVE.load(Ordering::SeqCst) - before;
    // 10^4 values of 1 MiB each, every one read by both subscribers.
    for _ in 0..100 {
        round(&map, &clock, &mut subs, MIB);
    }
    let after = LIVE.load(Ordering::SeqCst) - before;
    println!(
        "own {} KiB, after the burst {} KiB",
        own / 1024,
        after / 1024
    );
    assert!(
        after < 2 * own,
        "after the burst {after} bytes are live, the map's own is {own}"
    );
    drop(subs);
    drop(map);
}

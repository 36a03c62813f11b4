//! What broke: `evict_expired` read the time before taking any shard lock.
//! With two callers at once, the one with the later time moved the wheel on
//! and left due entries on its due list between batches; the one with the
//! earlier time then popped them although they were still live at its time.
//! Release builds published `Expired` events whose removal time was before
//! the deadline (1.5 million of 12.6 million in three seconds); debug builds
//! failed a `debug_assert!` between unlinking the node and removing its
//! table slot, and later lookups read the freed node. Fixed: each batch
//! reads the time under its lock, a shard never evicts at a time below the
//! one its wheel reached, and an entry leaves the table before its node is
//! freed.

use crate::common::Racers;
use expiremap::{Cause, ExpireMap, ManualClock, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn concurrent_eviction_never_publishes_an_early_removal() {
    let clock = ManualClock::new();
    let map = Arc::new(
        ExpireMap::<u64, u64>::builder()
            .clock(clock.clone())
            .shards(2)
            // Room for every event: none may be lost to lag.
            .event_capacity(1 << 18)
            .build(),
    );
    let mut sub = map.subscribe().unwrap();
    let racers = Racers::spawn(&map, 2);
    let puts: u64 = if cfg!(miri) { 200 } else { 200_000 };
    let mut expired = 0u64;
    // Reads what is there; `true` once the stream is closed.
    let mut check = |sub: &mut expiremap::Subscriber<u64, u64>| loop {
        match sub.try_recv() {
            Ok(e) => {
                assert_eq!(e.cause, Cause::Expired);
                assert!(
                    e.removed_at() > e.deadline(),
                    "key {} removed at {:?}, deadline {:?}",
                    e.key,
                    e.removed_at(),
                    e.deadline()
                );
                expired += 1;
            }
            Err(TryRecvError::Empty) => return false,
            Err(TryRecvError::Closed) => return true,
            Err(e) => panic!("{e:?}"),
        }
    };
    for k in 0..puts {
        // TTLs of 0.5 to 20 ms on a clock moving 0.1 ms per put: thousands
        // of entries come due together, many batches per pass.
        let ttl = Duration::from_micros(500 + (k * 7_919) % 19_500);
        assert_eq!(map.put(k, k, ttl), None);
        clock.advance(Duration::from_micros(100));
        if k % 1_024 == 0 {
            check(&mut sub);
        }
    }
    clock.advance(Duration::from_secs(1));
    racers.stop();
    map.evict_expired();
    assert_eq!(map.len(), 0);
    // The eviction thread may still be publishing its last batch: dropping
    // the map joins it, and then the stream closes.
    drop(Arc::into_inner(map).expect("the evictors are gone"));
    assert!(check(&mut sub), "the stream closes once the map is dropped");
    assert_eq!(expired, puts, "every value leaves exactly once, as Expired");
}

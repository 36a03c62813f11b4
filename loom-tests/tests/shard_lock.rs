//! loom models of the shards' read-biased lock (`sync::biased`): a biased
//! `get` racing a `put` that revokes the bias, and reads restoring the
//! bias between two writes. loom's cell tracking fails a model if a
//! write's `&mut` and a read's `&` of a shard ever overlap; under loom one
//! unbiased read restores the bias, so these short models reach biased
//! reads. Each also runs once as an ordinary test.

use expiremap::{ExpireMap, ManualClock};
use expiremap_loom_tests::{model, thread};
use std::sync::Arc;
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

fn map() -> Arc<ExpireMap<u32, u32>> {
    Arc::new(
        ExpireMap::builder()
            .clock(ManualClock::new())
            .shards(1)
            .background_eviction(false)
            .build(),
    )
}

/// A reader biased on the shard's lock (its first read restored the bias)
/// races a put: the put revokes the bias and waits for the biased read, so
/// the read sees the old value or the new one, never a write in progress.
#[test]
fn a_biased_get_races_a_revoking_put() {
    model(|| {
        let map = map();
        map.put(1, 10, HOUR);
        let reader = {
            let map = Arc::clone(&map);
            thread::spawn(move || {
                let first = map.get(&1);
                let second = map.get(&1);
                (first, second)
            })
        };
        map.put(1, 20, HOUR);
        let (first, second) = reader.join().unwrap();
        assert!(matches!(first, Some(10 | 20)), "{first:?}");
        assert!(matches!(second, Some(10 | 20)), "{second:?}");
        assert!(!(first == Some(20) && second == Some(10)), "went back");
        assert_eq!(map.get(&1), Some(20));
    });
}

/// Two readers and two writes: between the writes a read may restore the
/// bias, which the second write revokes again. Every read sees a whole
/// value, and the last write wins.
#[test]
fn reads_restore_the_bias_between_two_writes() {
    model(|| {
        let map = map();
        map.put(1, 1, HOUR);
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let map = Arc::clone(&map);
                thread::spawn(move || {
                    let v = map.get(&1);
                    assert!(matches!(v, Some(1..=3)), "{v:?}");
                })
            })
            .collect();
        map.put(1, 2, HOUR);
        map.get(&1);
        map.put(1, 3, HOUR);
        for r in readers {
            r.join().unwrap();
        }
        assert_eq!(map.get(&1), Some(3));
    });
}

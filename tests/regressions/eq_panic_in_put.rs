//! What broke: when the user's `Eq` panicked during `put`'s probe, the key
//! and value being put (which never entered the map) were dropped by the
//! unwinding while the shard's write lock was still held: user `Drop` under
//! a shard lock, so a `Drop` that used the map deadlocked. Fixed by keeping
//! them in a slot owned by `put` outside the locked block until the probe is
//! over, so the unwinding drops them after the lock guard.

use crate::common::Touchy;
use expiremap::{ExpireMap, ManualClock};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

type Map = ExpireMap<Touchy, Value>;

/// A value that, when dropped, reads the map (`len` takes every shard's
/// read lock). Under the same thread's write lock that never returns.
#[derive(Clone)]
struct Value(Arc<OnceLock<Weak<Map>>>);
impl Drop for Value {
    fn drop(&mut self) {
        if let Some(map) = self.0.get().and_then(Weak::upgrade) {
            let _ = map.len();
        }
    }
}

#[test]
fn key_and_value_are_dropped_outside_the_lock_when_eq_panics_in_put() {
    let slot = Arc::new(OnceLock::new());
    let map: Arc<Map> = Arc::new(
        ExpireMap::builder()
            .clock(ManualClock::new())
            .shards(1)
            .background_eviction(false)
            .build(),
    );
    slot.set(Arc::downgrade(&map)).ok().unwrap();
    map.put(
        Touchy(1),
        Value(Arc::new(OnceLock::new())),
        Duration::from_secs(1),
    );

    // On another thread, so a regression fails the test instead of hanging
    // the suite; the timeout only decides how long a failure takes to show.
    let (tx, rx) = mpsc::channel();
    let writer = Arc::clone(&map);
    std::thread::spawn(move || {
        let put = catch_unwind(AssertUnwindSafe(|| {
            writer.put(Touchy(7), Value(slot), Duration::from_secs(1))
        }));
        let _ = tx.send(put.is_err());
    });
    let panicked = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("deadlocked: the value was dropped under the shard lock");
    assert!(panicked, "Eq should have panicked");
    // The map is intact and usable.
    assert_eq!(map.len(), 1);
    assert!(map.contains_key(&Touchy(1)));
}

//! What broke: `get` and `contains_key` settle liveness from a cheap upper
//! bound on the clock, read before the shard lock. A user `Clock` has no such
//! bound (it was `u64::MAX`), so the exact `Clock::now` was read afterwards,
//! inside the liveness check, while the shard's read lock was held: user
//! code under a shard lock. A clock that called back into the map (or just
//! blocked) could deadlock it. Fixed by reading a user clock's exact time as
//! the bound, before the lock.
//!
//! Later the default clock's read moved under the lock (after a prefetch of
//! the table slot, see `Time::around`), for every operation; a user clock's
//! must stay before it, so `touch` and `remove` are covered here too (`put`
//! was already).

use expiremap::{Clock, ExpireMap, ManualClock};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

type Map = ExpireMap<u32, u32>;

/// A manual clock that, while armed, removes key 2 from the map on every
/// reading: a write lock on the map's only shard. Under a held read lock of
/// that shard, on the same thread, that never returns.
#[derive(Clone)]
struct Reentrant {
    time: ManualClock,
    armed: Arc<AtomicBool>,
    map: Arc<OnceLock<Weak<Map>>>,
}

impl Clock for Reentrant {
    fn now(&self) -> u64 {
        if self.armed.swap(false, Ordering::SeqCst) {
            if let Some(map) = self.map.get().and_then(Weak::upgrade) {
                map.remove(&2);
            }
            self.armed.store(true, Ordering::SeqCst);
        }
        self.time.now()
    }

    fn is_real_time(&self) -> bool {
        false
    }
}

#[test]
fn operations_call_a_user_clock_outside_the_shard_lock() {
    let clock = Reentrant {
        time: ManualClock::new(),
        armed: Arc::new(AtomicBool::new(false)),
        map: Arc::new(OnceLock::new()),
    };
    let map: Arc<Map> = Arc::new(
        ExpireMap::builder()
            .clock(clock.clone())
            .shards(1)
            .background_eviction(false)
            .build(),
    );
    clock.map.set(Arc::downgrade(&map)).ok().unwrap();
    map.put(1, 10, Duration::from_secs(60));
    clock.armed.store(true, Ordering::SeqCst);

    // On another thread, so a regression fails the test instead of hanging
    // the suite; the timeout only decides how long a failure takes to show.
    let (reads_tx, reads) = mpsc::channel();
    let (writes_tx, writes) = mpsc::channel();
    let reader = Arc::clone(&map);
    std::thread::spawn(move || {
        map.put(2, 20, Duration::from_secs(60));
        let got = (reader.get(&1), reader.contains_key(&1), reader.ttl(&1));
        let _ = reads_tx.send(got);
        // The writes too: each reads the clock, and its removal of key 2
        // needs the write lock they take.
        let got = (reader.touch(&1, Duration::from_secs(90)), reader.remove(&1));
        let _ = writes_tx.send(got);
    });
    const DEADLOCK: &str = "deadlocked: the user clock ran under the shard lock";
    let patience = Duration::from_secs(120);
    let (value, contains, ttl) = reads.recv_timeout(patience).expect(DEADLOCK);
    assert_eq!(value, Some(10));
    assert!(contains);
    assert_eq!(ttl, Some(Duration::from_secs(60)));
    let (touched, removed) = writes.recv_timeout(patience).expect(DEADLOCK);
    assert!(touched);
    assert_eq!(removed, Some(10));
}

//! Shutdown: drop joins the eviction thread, never joins from it, and drops
//! every value exactly once.

use crate::common::MS;
use expiremap::{ExpireMap, ManualClock};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// Counts drops.
#[derive(Clone)]
struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn drop_returns_after_every_value_is_dropped_exactly_once() {
    let drops = Arc::new(AtomicUsize::new(0));
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, Counted>::builder()
        .clock(clock.clone())
        .build();
    for i in 0..1000 {
        map.put(i, Counted(drops.clone()), MS * (1 + i % 7));
    }
    clock.advance(3 * MS);
    drop(map);
    assert_eq!(drops.load(Ordering::SeqCst), 1000);
}

#[test]
fn drop_of_an_idle_map_returns() {
    let map: ExpireMap<u32, u32> = ExpireMap::new();
    drop(map);
    let map: ExpireMap<u32, u32> = ExpireMap::new();
    map.put(1, 1, Duration::from_secs(3600));
    drop(map);
}

type SelfMap = Arc<ExpireMap<u32, Arc<Holder>>>;

/// A value that owns the last handle to its own map.
struct Holder {
    map: Mutex<Option<SelfMap>>,
    done: Mutex<Option<mpsc::Sender<String>>>,
}
impl Drop for Holder {
    fn drop(&mut self) {
        let map = self.map.lock().unwrap().take();
        drop(map); // may run ExpireMap::drop on the eviction thread
        let name = std::thread::current().name().unwrap_or("?").to_string();
        if let Some(tx) = self.done.lock().unwrap().take() {
            let _ = tx.send(name);
        }
    }
}

#[test]
fn last_handle_dropped_on_the_eviction_thread_does_not_deadlock() {
    let clock = ManualClock::new();
    let map = Arc::new(
        ExpireMap::<u32, Arc<Holder>>::builder()
            .clock(clock.clone())
            .build(),
    );
    let (tx, rx) = mpsc::channel();
    let holder = Arc::new(Holder {
        map: Mutex::new(Some(map.clone())),
        done: Mutex::new(Some(tx)),
    });
    map.put(1, holder, MS);
    drop(map); // the value now holds the only handle
    clock.advance(5 * MS);
    // Deadlock would make this wait forever; the generous bound is only
    // there to turn a hang into a failure.
    let thread = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("map drop hung");
    assert_eq!(thread, "expiremap-evictor");
}

#[test]
fn map_without_thread_drops_values_at_drop() {
    let drops = Arc::new(AtomicUsize::new(0));
    let map = ExpireMap::<u32, Counted>::builder()
        .background_eviction(false)
        .build();
    for i in 0..10 {
        map.put(i, Counted(drops.clone()), Duration::from_secs(60));
    }
    drop(map);
    assert_eq!(drops.load(Ordering::SeqCst), 10);
}

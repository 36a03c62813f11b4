//! loom models of the map's concurrent protocols: the eviction thread's
//! wake-up, shutdown, remove racing expiry, and the last handle dropped on
//! the eviction thread. Each also runs once as an ordinary test without
//! `--cfg expiremap_loom`.
//!
//! A lost wake-up or a self-join shows up as a deadlock, which loom reports.

use expiremap::{Cause, ExpireMap, ManualClock, RecvError, Subscriber};
use expiremap_loom_tests::{model, thread};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);

fn map(clock: &ManualClock) -> ExpireMap<u32, u32> {
    ExpireMap::builder()
        .clock(clock.clone())
        .shards(1)
        .event_capacity(4)
        .max_subscribers(1)
        .build()
}

fn until_closed(sub: &mut Subscriber<u32, u32>) -> Vec<(u32, Cause)> {
    let mut out = Vec::new();
    loop {
        match sub.recv() {
            Ok(e) => out.push((e.key, e.cause)),
            Err(RecvError::Closed) => return out,
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// A put whose deadline is earlier than the thread's planned wake-up wakes
/// it, whatever the interleaving with the thread's planning: otherwise the
/// thread keeps waiting for the 1 h entry and `recv` never returns.
#[test]
fn earlier_put_wakes_the_planning_thread() {
    model(|| {
        let clock = ManualClock::new();
        let map = map(&clock);
        let mut sub = map.subscribe().unwrap();
        map.put(1, 1, Duration::from_secs(3600));
        map.put(2, 2, MS);
        clock.advance(2 * MS);
        let e = sub.recv().unwrap();
        assert_eq!((e.key, e.cause), (2, Cause::Expired));
        drop(map);
        assert_eq!(until_closed(&mut sub), [(1, Cause::Shutdown)]);
    });
}

/// Dropping the map while another thread moves time (so the eviction thread
/// may be sleeping, waking, or mid-pass): drop returns, the entry is
/// published exactly once, then the stream closes.
#[test]
fn shutdown_races_a_sleeping_or_working_thread() {
    model(|| {
        let clock = ManualClock::new();
        let map = map(&clock);
        let mut sub = map.subscribe().unwrap();
        map.put(1, 1, MS);
        let c = clock.clone();
        let t = thread::spawn(move || c.advance(2 * MS));
        drop(map);
        t.join().unwrap();
        let got = until_closed(&mut sub);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(matches!(got[0], (1, Cause::Expired) | (1, Cause::Shutdown)));
    });
}

/// `remove` racing the eviction of the same entry: exactly one of them gets
/// the value. `remove` returns it, or an `Expired` event carries it.
#[test]
fn remove_races_expiry_exactly_one_winner() {
    model(|| {
        let clock = ManualClock::new();
        let map = Arc::new(map(&clock));
        let mut sub = map.subscribe().unwrap();
        map.put(1, 1, MS);
        let c = clock.clone();
        let t = thread::spawn(move || c.advance(2 * MS));
        let removed = map.remove(&1);
        t.join().unwrap();
        drop(Arc::try_unwrap(map).expect("one handle"));
        let events = until_closed(&mut sub);
        match removed {
            Some(v) => {
                assert_eq!(v, 1);
                assert!(events.is_empty(), "{events:?}");
            }
            None => assert_eq!(events, [(1, Cause::Expired)]),
        }
    });
}

/// A value that holds the last handle to its own map.
struct Holder {
    map: std::sync::Mutex<Option<ExpireMap<u32, Arc<Holder>>>>,
    done: Arc<AtomicBool>,
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.map.lock().unwrap().take());
        self.done.store(true, Ordering::SeqCst);
    }
}

/// The eviction thread drops the value that owns the map: the map's drop runs
/// on the eviction thread itself and must not join it.
#[test]
fn last_handle_dropped_on_the_eviction_thread() {
    model(|| {
        let clock = ManualClock::new();
        let map: ExpireMap<u32, Arc<Holder>> =
            ExpireMap::builder().clock(clock.clone()).shards(1).build();
        let done = Arc::new(AtomicBool::new(false));
        let holder = Arc::new(Holder {
            map: std::sync::Mutex::new(None),
            done: done.clone(),
        });
        map.put(1, holder.clone(), MS);
        *holder.map.lock().unwrap() = Some(map);
        drop(holder); // the map now lives only inside its own value
        clock.advance(2 * MS);
        while !done.load(Ordering::SeqCst) {
            thread::yield_now();
        }
    });
}

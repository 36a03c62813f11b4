//! Refresh ahead: `Builder::refresh_after` and `Builder::refresh_spawner`.
//! A loading call that finds a value older than `d` returns it and reloads
//! the key once; a write during the reload wins; a failed or panicking
//! reload keeps the value; other callers never wait for a reload.

use expiremap::{ExpireMap, Expiry, ManualClock, Update};
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

const SEC: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);
/// Bounds a wait that must not hang; never reached when all is well.
const HANG: Duration = Duration::from_secs(60);

/// A map with a 60 s TTL reloaded after 45 s, on a manual clock.
fn refreshing(clock: &ManualClock) -> ExpireMap<u32, u32> {
    ExpireMap::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .time_to_live(60 * SEC)
        .refresh_after(45 * SEC)
        .build()
}

#[test]
fn a_value_older_than_refresh_after_is_returned_and_reloaded() {
    let clock = ManualClock::new();
    let map = refreshing(&clock);
    assert_eq!(map.get_with(1, || 10), 10);
    clock.advance(45 * SEC);
    // Exactly 45 s old: not older than `refresh_after`.
    assert_eq!(map.get_with(1, || unreachable!()), 10);
    assert_eq!(map.stats().refreshes, 0);
    clock.advance(Duration::from_nanos(1));
    assert_eq!(map.get_with(1, || 11), 10, "the current value, at once");
    assert_eq!(map.get(&1), Some(11), "reloaded");
    assert_eq!(map.ttl(&1), Some(60 * SEC), "with a fresh TTL");
    assert_eq!(map.get_with(1, || unreachable!()), 11);
    let s = map.stats();
    assert_eq!((s.refreshes, s.refresh_failures), (1, 0));
    // Plain reads never refresh.
    clock.advance(50 * SEC);
    assert_eq!(map.get(&1), Some(11));
    assert_eq!(map.stats().refreshes, 1);
}

/// Bulk loads do not refresh (documented on `refresh_after`): a stale live
/// value comes back as it is, and `load` is asked only for the keys that
/// miss.
#[test]
fn bulk_loads_return_stale_values_without_a_reload() {
    let clock = ManualClock::new();
    let map = refreshing(&clock);
    assert_eq!(map.get_with(1, || 10), 10);
    clock.advance(50 * SEC);
    let asked = Mutex::new(Vec::new());
    let got = map.get_many_with(&[1, 2], 60 * SEC, |ks| {
        asked.lock().unwrap().extend_from_slice(ks);
        ks.iter().map(|&k| (k, 100 + k)).collect()
    });
    assert_eq!(got, [10, 102]);
    assert_eq!(*asked.lock().unwrap(), [2]);
    assert_eq!(map.get(&1), Some(10));
    assert_eq!(map.stats().refreshes, 0);
}

#[test]
fn loaders_with_a_ttl_refresh_with_it() {
    let clock = ManualClock::new();
    let map = refreshing(&clock);
    let ttl = 100 * SEC;
    assert_eq!(map.get_or_insert_with(1, ttl, || 10), 10);
    assert_eq!(map.get_or_insert_with_by_ref(&2, ttl, || 20), 20);
    clock.advance(46 * SEC);
    assert_eq!(map.get_or_insert_with(1, ttl, || 11), 10);
    assert_eq!(map.get_or_insert_with_by_ref(&2, ttl, || 21), 20);
    assert_eq!(
        map.try_get_or_insert_with(1, ttl, || Ok::<_, ()>(12)),
        Ok(11)
    );
    assert_eq!((map.get(&1), map.get(&2)), (Some(11), Some(21)));
    assert_eq!(map.ttl(&1), Some(ttl));
    assert_eq!(map.stats().refreshes, 2);
}

#[test]
fn a_write_during_the_reload_wins() {
    let clock = ManualClock::new();
    let map = refreshing(&clock);
    map.get_with(1, || 10);
    clock.advance(46 * SEC);
    let m = map.clone();
    // The reload itself writes the key, as another caller would meanwhile.
    assert_eq!(
        map.get_with(1, move || {
            m.put(1, 99, 60 * SEC);
            11
        }),
        10
    );
    assert_eq!(map.get(&1), Some(99));
    let m = map.clone();
    clock.advance(46 * SEC);
    assert_eq!(
        map.get_with(1, move || {
            m.remove(&1);
            12
        }),
        99
    );
    assert_eq!(map.get(&1), None, "a removal during the reload stands");
}

#[test]
fn a_failed_or_panicking_reload_keeps_the_value_and_a_later_call_retries() {
    let clock = ManualClock::new();
    let map = refreshing(&clock);
    map.get_with(1, || 10);
    clock.advance(46 * SEC);
    let r = map.try_get_with(1, || Err::<u32, _>(std::io::Error::other("down")));
    assert_eq!(r.unwrap(), 10);
    assert_eq!(map.optionally_get_with(1, || None), Some(10));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        map.get_with(1, || panic!("reload panicked"))
    }));
    assert!(
        r.is_err(),
        "a reload run in the caller panics in the caller"
    );
    assert_eq!(map.get(&1), Some(10));
    let s = map.stats();
    assert_eq!((s.refreshes, s.refresh_failures), (3, 3));
    assert_eq!(map.get_with(1, || 11), 10);
    assert_eq!(map.get(&1), Some(11));
    let s = map.stats();
    assert_eq!((s.refreshes, s.refresh_failures), (4, 3));
}

#[test]
fn other_callers_get_the_current_value_while_a_reload_runs() {
    let clock = ManualClock::new();
    let map = refreshing(&clock);
    map.get_with(1, || 10);
    clock.advance(46 * SEC);
    let in_reload = Arc::new(Barrier::new(2));
    let release = Arc::new(Barrier::new(2));
    thread::scope(|s| {
        let (a, b) = (in_reload.clone(), release.clone());
        let reloader = s.spawn(|| {
            map.get_with(1, move || {
                a.wait();
                b.wait();
                11
            })
        });
        in_reload.wait();
        // The reload is running and blocked: these must not wait for it.
        let (tx, rx) = mpsc::channel();
        let m = map.clone();
        s.spawn(move || {
            let got = (
                m.get_with(1, || unreachable!()),
                m.get_or_insert_with(1, 60 * SEC, || unreachable!()),
            );
            tx.send(got).unwrap();
        });
        assert_eq!(
            rx.recv_timeout(HANG),
            Ok((10, 10)),
            "a caller waited for the reload"
        );
        assert_eq!(map.stats().refreshes, 1, "one reload per key");
        release.wait();
        assert_eq!(reloader.join().unwrap(), 10);
    });
    assert_eq!(map.get(&1), Some(11));
}

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The reloads a queueing spawner was handed, for the test to run (or drop).
type Queue = Arc<Mutex<Vec<Task>>>;

/// [`refreshing`] with a spawner that queues each reload.
fn queued(clock: &ManualClock) -> (Queue, ExpireMap<u32, u32>) {
    let queue: Queue = Arc::new(Mutex::new(Vec::new()));
    let q = queue.clone();
    let map = ExpireMap::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .time_to_live(60 * SEC)
        .refresh_after(45 * SEC)
        .refresh_spawner(move |task| q.lock().unwrap().push(task))
        .build();
    (queue, map)
}

fn run(task: Task) {
    use std::task::{Context, Poll, Waker};
    let mut task = task;
    let mut cx = Context::from_waker(Waker::noop());
    assert_eq!(task.as_mut().poll(&mut cx), Poll::Ready(()));
}

#[test]
fn with_a_spawner_the_caller_returns_before_the_reload_runs() {
    let clock = ManualClock::new();
    let (queue, map) = queued(&clock);
    let loads = Arc::new(AtomicUsize::new(0));
    map.get_with(1, || 10);
    clock.advance(46 * SEC);
    for _ in 0..3 {
        let l = loads.clone();
        let v = map.get_with(1, move || {
            l.fetch_add(1, Ordering::SeqCst);
            11
        });
        assert_eq!(v, 10);
    }
    assert_eq!(
        loads.load(Ordering::SeqCst),
        0,
        "nothing ran in the callers"
    );
    let tasks: Vec<_> = queue.lock().unwrap().drain(..).collect();
    assert_eq!(tasks.len(), 1, "one reload for three stale reads");
    tasks.into_iter().for_each(run);
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    assert_eq!(map.get(&1), Some(11));
    // Loaders that take a TTL run the reload in the caller even so.
    clock.advance(46 * SEC);
    assert_eq!(map.get_or_insert_with(1, 60 * SEC, || 12), 11);
    assert_eq!(map.get(&1), Some(12));
    assert!(queue.lock().unwrap().is_empty());
}

#[test]
fn a_reload_the_spawner_drops_ends_its_flight() {
    let clock = ManualClock::new();
    let (queue, map) = queued(&clock);
    map.get_with(1, || 10);
    clock.advance(46 * SEC);
    assert_eq!(map.get_with(1, || 11), 10);
    // The entry expires, and the reload is dropped unpolled: a caller that
    // misses must not wait for it for ever.
    clock.advance(20 * SEC);
    drop(queue.lock().unwrap().drain(..));
    assert_eq!(map.get_with(1, || 12), 12);
    let s = map.stats();
    assert_eq!((s.refreshes, s.refresh_failures), (1, 1));
}

#[test]
fn a_caller_that_misses_during_a_reload_gets_its_value() {
    // The entry expires while its reload runs: a caller that misses waits
    // for the reload (single flight) instead of loading again.
    let clock = ManualClock::new();
    let (queue, map) = queued(&clock);
    map.get_with(1, || 10);
    clock.advance(46 * SEC);
    assert_eq!(map.get_with(1, || 11), 10);
    clock.advance(20 * SEC);
    assert_eq!(map.evict_expired(), 1);
    let m = map.clone();
    let waiter = thread::spawn(move || m.get_with(1, || 99));
    // Run the reload once the waiter is (most likely) parked on it; if the
    // reload comes first, the waiter hits its value: 11 either way.
    thread::sleep(Duration::from_millis(20));
    let tasks: Vec<_> = queue.lock().unwrap().drain(..).collect();
    tasks.into_iter().for_each(run);
    assert_eq!(
        waiter.join().unwrap(),
        11,
        "the waiter took the reload's value"
    );
    assert_eq!(map.get(&1), Some(11));
}

#[test]
fn async_loaders_refresh_on_a_tokio_spawner() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let handle = rt.handle().clone();
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = ExpireMap::builder()
        .clock(clock.clone())
        .time_to_live(60 * SEC)
        .refresh_after(45 * SEC)
        .refresh_spawner(move |task| {
            handle.spawn(task);
        })
        .build();
    rt.block_on(async {
        assert_eq!(map.get_with_async(1, async { 10 }).await, 10);
        clock.advance(46 * SEC);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let reload = async move {
            let _ = rx.await; // released only after the caller returned
            11
        };
        assert_eq!(map.get_with_async(1, reload).await, 10);
        tx.send(()).unwrap();
        let until = tokio::time::Instant::now() + HANG;
        while map.get(&1) != Some(11) {
            assert!(tokio::time::Instant::now() < until, "never reloaded");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    assert_eq!(map.stats().refreshes, 1);
}

#[test]
fn refresh_after_zero_is_rejected() {
    let r = ExpireMap::<u32, u32>::builder()
        .refresh_after(Duration::ZERO)
        .try_build();
    let e = r.unwrap_err();
    assert!(e.to_string().contains("refresh_after"), "{e}");
}

/// A policy that reads the TTL from the value in seconds (0: expired
/// already); it panics for 13.
struct FromValue;

impl Expiry<u32, u32> for FromValue {
    fn expire_after_create(&self, _: &u32, v: &u32) -> Option<Duration> {
        assert_ne!(*v, 13, "unlucky");
        Some(Duration::from_secs(u64::from(*v)))
    }
}

/// A map on `clock` whose TTLs come from [`FromValue`], reloaded after
/// 10 s.
fn from_value(clock: &ManualClock) -> ExpireMap<u32, u32> {
    ExpireMap::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .expire_after(FromValue)
        .refresh_after(10 * SEC)
        .build()
}

#[test]
fn a_reload_is_timed_as_a_new_entry_and_a_zero_expires_the_old_one() {
    let clock = ManualClock::new();
    let map = from_value(&clock);
    let mut events = map.subscribe().unwrap();
    assert_eq!(map.get_with(1, || 30), 30);
    clock.advance(11 * SEC);
    assert_eq!(map.get_with(1, || 40), 30);
    assert_eq!(
        map.ttl(&1),
        Some(40 * SEC),
        "the reload's own TTL, from now"
    );
    clock.advance(11 * SEC);
    // The policy says the reloaded value has expired already: the old one goes.
    assert_eq!(map.get_with(1, || 0), 40);
    assert_eq!(map.get(&1), None);
    let e = events.try_recv().unwrap();
    assert_eq!(
        (e.key, e.value, e.cause),
        (1, 40, expiremap::Cause::Expired)
    );
}

// Pins: an `update` of the key run during its reload wins: the reload's value
// is not stored, the update kept the deadline, and the reload is no failure.
#[test]
fn an_update_during_a_reload_wins() {
    let clock = ManualClock::new();
    let map = refreshing(&clock);
    map.get_with(1, || 10);
    clock.advance(46 * SEC);
    let m = map.clone();
    let got = map.get_with(1, move || {
        assert_eq!(
            m.update(1, |seen| Update::SetKeepTtl(seen.unwrap().0 + 100)),
            Some(110)
        );
        11
    });
    assert_eq!(got, 10);
    assert_eq!(map.get(&1), Some(110));
    assert_eq!(map.ttl(&1), Some(14 * SEC), "the update kept the deadline");
    let s = map.stats();
    assert_eq!((s.refreshes, s.refresh_failures), (1, 0));
}

// Pins: a `clear` during a reload wins: nothing of the reload is stored.
#[test]
fn a_clear_during_a_reload_wins() {
    let clock = ManualClock::new();
    let map = refreshing(&clock);
    map.get_with(1, || 10);
    clock.advance(46 * SEC);
    let m = map.clone();
    assert_eq!(
        map.get_with(1, move || {
            m.clear();
            11
        }),
        10
    );
    assert_eq!(map.get(&1), None);
    assert!(map.is_empty());
}

// Pins: an entry that expires and is evicted while its reload runs is not
// a write: the reload's value is stored, and a later caller hits it.
#[test]
fn a_reload_outliving_its_entry_stores_its_value() {
    let clock = ManualClock::new();
    let map = refreshing(&clock);
    map.get_with(1, || 10);
    clock.advance(46 * SEC);
    let (m, c) = (map.clone(), clock.clone());
    assert_eq!(
        map.get_with(1, move || {
            c.advance(20 * SEC);
            assert_eq!(m.evict_expired(), 1);
            11
        }),
        10
    );
    assert_eq!(map.get_with(1, || unreachable!()), 11);
    assert_eq!(map.ttl(&1), Some(60 * SEC));
}

// Pins: a policy that panics on a reload's value: the panic reaches the
// caller, the old value stays, the reload counts as failed, the flight
// ends (the next call reloads).
#[test]
fn a_policy_panicking_on_a_reload_keeps_the_value() {
    let clock = ManualClock::new();
    let map = from_value(&clock);
    assert_eq!(map.get_with(1, || 100), 100);
    clock.advance(11 * SEC);
    let r = catch_unwind(AssertUnwindSafe(|| map.get_with(1, || 13)));
    assert!(r.is_err());
    assert_eq!(map.get(&1), Some(100));
    assert_eq!(map.get_with(1, || 50), 100);
    assert_eq!(map.ttl(&1), Some(50 * SEC));
    let s = map.stats();
    assert_eq!((s.refreshes, s.refresh_failures), (2, 1));
}

fn poll_once<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> std::task::Poll<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    f.poll(&mut cx)
}

// Pins: an async reload run in the caller whose future is dropped mid-load
// ends its flight, keeps the value, counts as failed; the next call reloads.
#[test]
fn a_cancelled_async_reload_keeps_the_value() {
    let clock = ManualClock::new();
    let map = refreshing(&clock);
    map.get_with(1, || 10);
    clock.advance(46 * SEC);
    {
        let fut =
            map.try_get_or_insert_with_async(1, MINUTE, std::future::pending::<Result<u32, ()>>());
        let mut fut = std::pin::pin!(fut);
        assert!(poll_once(fut.as_mut()).is_pending());
    }
    let s = map.stats();
    assert_eq!((s.refreshes, s.refresh_failures), (1, 1));
    assert_eq!(map.get(&1), Some(10));
    let fut = map.get_or_insert_with_async(1, MINUTE, async { 11 });
    let mut fut = std::pin::pin!(fut);
    assert_eq!(poll_once(fut.as_mut()), std::task::Poll::Ready(10));
    assert_eq!(map.get(&1), Some(11));
}

// Pins, racing: a reload never overwrites a `put` or an `update` that
// raced it (whichever came first), and `stats().refreshes` counts exactly
// the reloads whose loader ran.
#[test]
fn a_reload_racing_put_or_update_never_overwrites_the_write() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Barrier};
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u64> = ExpireMap::builder()
        .clock(clock.clone())
        .shards(1)
        .background_eviction(false)
        .time_to_live(Duration::from_secs(3600))
        .refresh_after(45 * SEC)
        .build();
    map.get_with(1, || 0);
    let inits = Arc::new(AtomicU64::new(0));
    let start = Barrier::new(2);
    let end = Barrier::new(2);
    let rounds = 2000_u64;
    thread::scope(|s| {
        s.spawn(|| {
            for r in 0..rounds {
                start.wait();
                let i = inits.clone();
                map.get_with(1, move || {
                    i.fetch_add(1, Ordering::SeqCst);
                    std::hint::black_box(1_000_000 + r)
                });
                end.wait();
            }
        });
        for r in 0..rounds {
            clock.advance(46 * SEC); // stale again
            start.wait();
            if r % 2 == 0 {
                map.put(1, r, Duration::from_secs(3600));
            } else {
                map.update(1, |_| Update::SetKeepTtl(r));
            }
            end.wait();
            assert_eq!(
                map.get(&1),
                Some(r),
                "round {r}: a reload overwrote the write"
            );
        }
    });
    assert_eq!(map.stats().refreshes, inits.load(Ordering::SeqCst));
    assert_eq!(map.stats().refresh_failures, 0);
}

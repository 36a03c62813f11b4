//! Edges of the loading paths (single flight, refresh ahead, bulk loads,
//! the `Expiry` policy, `update`), four of them bugs once: a bulk load
//! beside an update, `SetKeepTtl` under idle expiry, the default
//! `expire_after_update` under idle expiry, and a policy's write over an
//! expired entry.

use expiremap::{ExpireMap, Expiry, ManualClock, Update};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

const SEC: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);

fn manual<K, V>(clock: &ManualClock) -> expiremap::Builder<K, V>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    ExpireMap::builder()
        .clock(clock.clone())
        .shards(4)
        .background_eviction(false)
}

// A bulk load that meets an update of one of its keys, which ends leaving
// no value (`Update::Keep` of an absent key), still loads that key: it
// once panicked with "got no value" (its `load` had run for the other keys
// before it waited). Whichever comes first, the update's end or the bulk
// call's look, the answer is the same; the sleep makes the call meet the
// update on most runs, and loom-tests/tests/bulk.rs explores both orders.
#[test]
fn a_bulk_load_beside_an_update_that_leaves_no_value_loads_the_key() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = manual(&clock).build();
    let (in_f, f_entered) = mpsc::channel::<()>();
    let (go, release) = mpsc::channel::<()>();
    thread::scope(|s| {
        let m = &map;
        let updater = s.spawn(move || {
            m.update(2, move |seen| {
                assert!(seen.is_none());
                in_f.send(()).unwrap();
                release.recv().unwrap();
                Update::Keep // nothing stored
            })
        });
        f_entered.recv().unwrap();
        let bulk = s.spawn(move || {
            m.get_many_with(&[1, 2], MINUTE, |ks| {
                ks.iter().map(|&k| (k, 10 * k)).collect()
            })
        });
        thread::sleep(Duration::from_millis(20));
        go.send(()).unwrap();
        assert_eq!(updater.join().unwrap(), None);
        assert_eq!(bulk.join().unwrap(), vec![10, 20]);
    });
}

// With time_to_idle, an update's SetKeepTtl commits over an entry that a
// read during `f` kept alive past the idle deadline `f` was shown (it
// once stored nothing and returned None).
#[test]
fn set_keep_ttl_commits_over_an_entry_kept_alive_by_a_read_during_f() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = manual(&clock).time_to_idle(10 * SEC).build();
    map.put(1, 1, 100 * SEC);
    let r = map.update(1, |seen| {
        let (v, left) = seen.expect("live");
        assert_eq!(left, 10 * SEC, "idle-capped time left");
        clock.advance(6 * SEC);
        assert_eq!(map.get(&1), Some(1)); // an access: idle until 16 s
        clock.advance(6 * SEC); // 12 s: past the idle deadline f was shown, live
        assert_eq!(map.ttl(&1), Some(4 * SEC));
        Update::SetKeepTtl(v + 1)
    });
    assert_eq!(map.get(&1), Some(2), "the update was lost");
    assert_eq!(r, Some(2));
}

/// A policy that never expires a new entry and keeps the deadline on
/// update (the trait's defaults).
struct Defaults;
impl Expiry<u32, u32> for Defaults {}

// With time_to_idle, the default expire_after_update ("keeps the entry's
// deadline") keeps an entry without a write deadline so: the policy is
// shown the time to the write deadline, not the idle one (it once turned
// the idle time left into a write deadline).
#[test]
fn an_insert_over_an_entry_with_no_write_deadline_keeps_none_under_idle() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = manual(&clock)
        .time_to_idle(10 * SEC)
        .expire_after(Defaults)
        .build();
    map.insert(1, 1); // no write deadline; idle until 10 s
    clock.advance(3 * SEC);
    assert_eq!(map.insert(1, 2), Some(1)); // idle until 13 s
    for _ in 0..3 {
        clock.advance(5 * SEC);
        assert_eq!(map.get(&1), Some(2), "read every 5 s of a 10 s idle time");
    }
}

/// Every entry lives 1 s (create) or keeps its time (update).
struct OneSecond;
impl Expiry<u32, u32> for OneSecond {
    fn expire_after_create(&self, _: &u32, _: &u32) -> Option<Duration> {
        Some(SEC)
    }
}

// `insert` with a policy over an entry past its deadline but not yet
// evicted times the value as new (debug builds once panicked with
// "attempt to subtract with overflow": the time left was computed before
// liveness was checked).
#[test]
fn insert_with_a_policy_over_an_expired_unevicted_entry() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = manual(&clock).expire_after(OneSecond).build();
    map.insert(1, 1);
    clock.advance(2 * SEC);
    assert_eq!(map.len(), 1, "not evicted yet");
    assert_eq!(map.insert(1, 2), None, "the old value had expired");
    assert_eq!(map.ttl(&1), Some(SEC), "timed as a new entry");
}

/// A map with a 60 s TTL reloaded after 45 s, on a manual clock.
fn refreshing(clock: &ManualClock) -> ExpireMap<u32, u32> {
    manual(clock)
        .time_to_live(60 * SEC)
        .refresh_after(45 * SEC)
        .build()
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

/// Lives as many seconds as the value says; panics for 13.
struct FromValue;
impl Expiry<u32, u32> for FromValue {
    fn expire_after_create(&self, _: &u32, v: &u32) -> Option<Duration> {
        assert_ne!(*v, 13, "unlucky");
        Some(Duration::from_secs(u64::from(*v)))
    }
}

// Pins: a policy that panics on a reload's value: the panic reaches the
// caller, the old value stays, the reload counts as failed, the flight
// ends (the next call reloads).
#[test]
fn a_policy_panicking_on_a_reload_keeps_the_value() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = manual(&clock)
        .expire_after(FromValue)
        .refresh_after(10 * SEC)
        .build();
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

/// Records the `current` each update is shown; entries never expire.
struct Forever(std::sync::Arc<std::sync::Mutex<Vec<Option<Duration>>>>);
impl Expiry<u32, u32> for Forever {
    fn expire_after_create(&self, _: &u32, _: &u32) -> Option<Duration> {
        Some(Duration::MAX)
    }
    fn expire_after_update(&self, _: &u32, _: &u32, current: Option<Duration>) -> Option<Duration> {
        self.0.lock().unwrap().push(current);
        current
    }
}

// Pins: a policy's `Some(Duration::MAX)` saturates like `None` (no
// expiry) through a load and a reload; a later insert is shown `current: None`.
#[test]
fn a_policy_saying_duration_max_means_no_expiry() {
    let clock = ManualClock::new();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let map: ExpireMap<u32, u32> = manual(&clock)
        .expire_after(Forever(seen.clone()))
        .refresh_after(SEC)
        .build();
    assert_eq!(map.get_with(1, || 1), 1);
    clock.advance(Duration::from_secs(1_000_000_000));
    assert_eq!(map.get_with(1, || 2), 1, "stale: reloaded");
    assert_eq!(map.insert(1, 3), Some(2));
    assert_eq!(*seen.lock().unwrap(), [None]);
    assert!(map.ttl(&1).unwrap() > Duration::from_secs(100 * 365 * 86_400));
}

// Pins: at the end of time (clock near and at u64::MAX) loads, a reload,
// bulk loads and updates store and read back (deadlines saturate).
#[test]
fn loading_at_the_end_of_time() {
    let clock = ManualClock::starting_at(u64::MAX - 10);
    let map: ExpireMap<u32, u32> = manual(&clock)
        .time_to_live(MINUTE)
        .refresh_after(Duration::from_nanos(2))
        .build();
    assert_eq!(map.get_with(1, || 1), 1);
    assert_eq!(map.get_or_insert_with(2, SEC, || 2), 2);
    clock.advance(Duration::from_nanos(5));
    assert_eq!(map.get_with(1, || 11), 1, "stale: reloaded");
    assert_eq!(map.get(&1), Some(11));
    clock.advance(Duration::MAX); // u64::MAX
    assert_eq!(
        map.get_many_with(&[1, 2, 3], SEC, |ks| ks.iter().map(|&k| (k, 30)).collect()),
        [11, 2, 30]
    );
    assert_eq!(
        map.update(2, |s| Update::SetKeepTtl(s.unwrap().0 + 20)),
        Some(22)
    );
    assert_eq!(map.get_many(&[1, 2, 3]), [Some(11), Some(22), Some(30)]);
    assert_eq!(map.evict_expired(), 0);
}

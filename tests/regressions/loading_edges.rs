//! Edges of the loading paths (single flight, bulk loads,
//! the `Expiry` policy, `update`), four of them bugs once: a bulk load
//! beside an update, `SetKeepTtl` under idle expiry, the default
//! `expire_after_update` under idle expiry, and a policy's write over an
//! expired entry.

use expiremap::{ExpireMap, Expiry, ManualClock, Update};
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

//! The surface a switching moka or quick_cache user reaches for: the map's
//! own expiry in `insert` and the loaders without a TTL, the `Expiry`
//! policy, `try_get_with`'s shared `Arc<E>`, `optionally_get_with`, the
//! cheap handle, `try_put`/`try_insert`, and `peek`.

use crate::common::MS;
use expiremap::{Cause, ExpireMap, Expiry, ManualClock, Refused, TryRecvError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

const MINUTE: Duration = Duration::from_secs(60);

fn manual_builder<K, V>(clock: &ManualClock) -> expiremap::Builder<K, V>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    ExpireMap::builder()
        .clock(clock.clone())
        .shards(4)
        .background_eviction(false)
}

/// A policy from the value: the value is the TTL in seconds (0: expired
/// already, `u64::MAX`: no expiry), and an update adds `bump` seconds to
/// the time left. Counts its calls.
#[derive(Default)]
struct FromValue {
    creates: AtomicUsize,
    updates: AtomicUsize,
    bump: Option<u64>,
}

fn secs(v: u64) -> Option<Duration> {
    (v != u64::MAX).then(|| Duration::from_secs(v))
}

/// The policy the map holds: a handle to the shared counts.
struct Policy(Arc<FromValue>);

impl Expiry<&'static str, u64> for Policy {
    fn expire_after_create(&self, _: &&'static str, v: &u64) -> Option<Duration> {
        self.0.creates.fetch_add(1, Ordering::SeqCst);
        secs(*v)
    }
    fn expire_after_update(
        &self,
        _: &&'static str,
        v: &u64,
        current: Option<Duration>,
    ) -> Option<Duration> {
        self.0.updates.fetch_add(1, Ordering::SeqCst);
        match self.0.bump {
            Some(b) => current.map(|c| c + Duration::from_secs(b)),
            None if *v == 0 => Some(Duration::ZERO),
            None => current,
        }
    }
}

#[test]
fn loaders_without_a_ttl_use_time_to_live() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = manual_builder(&clock).time_to_live(MINUTE).build();
    assert_eq!(map.get_with(1, || 10), 10);
    assert_eq!(map.get_with_by_ref(&2, || 20), 20);
    assert_eq!(
        map.try_get_with(3, || Ok::<_, std::io::Error>(30)).unwrap(),
        30
    );
    assert_eq!(map.optionally_get_with(4, || Some(40)), Some(40));
    assert_eq!(map.insert(5, 50), None);
    for k in 1..=5 {
        assert_eq!(map.ttl(&k), Some(MINUTE), "key {k}");
    }
    clock.advance(MINUTE + Duration::from_nanos(1));
    for k in 1..=5 {
        assert_eq!(map.get(&k), None, "key {k}");
    }
}

#[test]
fn loaders_without_any_expiry_store_for_ever() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = manual_builder(&clock).build();
    map.get_with(1, || 10);
    clock.advance(Duration::from_secs(100 * 365 * 86_400));
    assert_eq!(map.get(&1), Some(10));
}

#[test]
fn expiry_policy_sets_each_entrys_ttl_from_its_value() {
    let clock = ManualClock::new();
    let policy = Arc::new(FromValue::default());
    let map: ExpireMap<&str, u64> = manual_builder(&clock)
        .time_to_live(MINUTE) // the policy takes its place
        .expire_after(Policy(policy.clone()))
        .build();
    map.insert("five", 5);
    assert_eq!(map.get_with("nine", || 9), 9);
    map.insert("never", u64::MAX);
    assert_eq!(map.ttl("five"), Some(Duration::from_secs(5)));
    assert_eq!(map.ttl("nine"), Some(Duration::from_secs(9)));
    assert!(map.ttl("never").unwrap() > Duration::from_secs(100 * 365 * 86_400));
    assert_eq!(policy.creates.load(Ordering::SeqCst), 3);
    // An update keeps the deadline by default.
    clock.advance(Duration::from_secs(2));
    assert_eq!(map.insert("five", 7), Some(5));
    assert_eq!(policy.updates.load(Ordering::SeqCst), 1);
    assert_eq!(map.ttl("five"), Some(Duration::from_secs(3)));
    // A call with a TTL uses its own.
    map.put("five", 8, MINUTE);
    assert_eq!(map.ttl("five"), Some(MINUTE));
    assert_eq!(map.get_or_insert_with("ten", MINUTE, || 10), 10);
    assert_eq!(map.ttl("ten"), Some(MINUTE));
    assert_eq!(policy.creates.load(Ordering::SeqCst), 3);
}

#[test]
fn expire_after_update_sees_the_time_left() {
    let clock = ManualClock::new();
    let policy = Arc::new(FromValue {
        bump: Some(10),
        ..FromValue::default()
    });
    let map: ExpireMap<&str, u64> = manual_builder(&clock).expire_after(Policy(policy)).build();
    map.insert("a", 5);
    clock.advance(Duration::from_secs(1));
    map.insert("a", 5); // 4 s left, plus 10
    assert_eq!(map.ttl("a"), Some(Duration::from_secs(14)));
}

#[test]
fn a_zero_from_the_policy_stores_nothing_and_expires_the_live_entry() {
    let clock = ManualClock::new();
    let policy = Arc::new(FromValue::default());
    let map: ExpireMap<&str, u64> = manual_builder(&clock).expire_after(Policy(policy)).build();
    let mut events = map.subscribe().unwrap();
    // Created already expired: nothing stored, the loader's value returned.
    assert_eq!(map.insert("a", 0), None);
    assert_eq!(map.get_with("b", || 0), 0);
    assert!(map.is_empty());
    // Over a live entry: it leaves as Expired.
    map.insert("c", 30);
    assert_eq!(map.insert("c", 0), None);
    assert_eq!(map.get("c"), None);
    assert!(map.is_empty());
    let e = events.try_recv().unwrap();
    assert_eq!((e.key, e.value, e.cause), ("c", 30, Cause::Expired));
    assert!(matches!(events.try_recv(), Err(TryRecvError::Empty)));
    // `put` with a zero TTL stays ignored.
    map.insert("d", 30);
    assert_eq!(map.put("d", 1, Duration::ZERO), None);
    assert_eq!(map.get("d"), Some(30));
}

/// A policy that reads the map it belongs to: it runs outside every lock,
/// so this would deadlock if it ran under the shard's.
struct Reentrant(Arc<Mutex<Option<ExpireMap<u32, u32>>>>);

impl Expiry<u32, u32> for Reentrant {
    fn expire_after_create(&self, key: &u32, _: &u32) -> Option<Duration> {
        let map = self.0.lock().unwrap().clone().expect("set");
        assert_eq!(map.get(key), None);
        map.peek(&0).map(|v| Duration::from_secs(u64::from(v)))
    }
    fn expire_after_update(&self, key: &u32, _: &u32, c: Option<Duration>) -> Option<Duration> {
        let map = self.0.lock().unwrap().clone().expect("set");
        assert!(map.get(key).is_some());
        c
    }
}

#[test]
fn the_policy_runs_outside_the_lock_and_may_use_the_map() {
    let clock = ManualClock::new();
    let slot = Arc::new(Mutex::new(None));
    let map: ExpireMap<u32, u32> = manual_builder(&clock)
        .shards(1)
        .expire_after(Reentrant(slot.clone()))
        .build();
    *slot.lock().unwrap() = Some(map.clone());
    map.put(0, 7, MINUTE);
    map.insert(1, 1);
    assert_eq!(map.ttl(&1), Some(Duration::from_secs(7)));
    map.insert(1, 2);
    assert_eq!(map.get_with(2, || 2), 2);
    assert_eq!(map.ttl(&2), Some(Duration::from_secs(7)));
    slot.lock().unwrap().take(); // the policy's handle, so the map can drop
}

struct Panicking;

impl Expiry<u32, u32> for Panicking {
    fn expire_after_create(&self, _: &u32, v: &u32) -> Option<Duration> {
        assert_ne!(*v, 13, "unlucky value");
        Some(MINUTE)
    }
}

#[test]
fn a_panicking_policy_reaches_the_caller_and_stores_nothing() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = manual_builder(&clock).expire_after(Panicking).build();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| map.insert(1, 13)));
    assert!(r.is_err());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| map.get_with(2, || 13)));
    assert!(r.is_err());
    assert!(map.is_empty());
    // The key's flight ended with the panic: the next caller loads.
    assert_eq!(map.get_with(2, || 2), 2);
    assert_eq!(map.insert(1, 1), None);
    assert_eq!(map.len(), 2);
}

#[test]
fn racing_inserts_with_an_update_policy_each_see_the_entry_they_replace() {
    // Every insert adds 1 s to the time left: with the clock stopped, n
    // inserts of one key leave exactly first + (n - 1) seconds, however
    // they race (a policy answer computed from an entry replaced meanwhile
    // is never committed).
    let clock = ManualClock::new();
    let policy = Arc::new(FromValue {
        bump: Some(1),
        ..FromValue::default()
    });
    let map: ExpireMap<&str, u64> = manual_builder(&clock).expire_after(Policy(policy)).build();
    let (threads, each) = (4, 200);
    let start = Barrier::new(threads);
    thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                start.wait();
                for _ in 0..each {
                    map.insert("k", 10);
                }
            });
        }
    });
    let n = (threads * each) as u64;
    assert_eq!(map.ttl("k"), Some(Duration::from_secs(10 + n - 1)));
}

#[test]
fn try_get_with_shares_one_arc_of_a_non_clone_error() {
    let map: ExpireMap<u32, u32> = ExpireMap::new();
    let started = Arc::new(Barrier::new(2));
    let release = Arc::new(Barrier::new(2));
    let loads = Arc::new(AtomicUsize::new(0));
    let (first, second) = thread::scope(|s| {
        let (l, st, r) = (loads.clone(), started.clone(), release.clone());
        let loader = s.spawn(|| {
            map.try_get_with(1, move || {
                l.fetch_add(1, Ordering::SeqCst);
                st.wait();
                r.wait();
                Err(std::io::Error::other("down"))
            })
        });
        started.wait();
        let l = loads.clone();
        let waiter = s.spawn(|| {
            map.try_get_with(1, move || {
                l.fetch_add(1, Ordering::SeqCst);
                Ok::<u32, std::io::Error>(1)
            })
        });
        // Give the waiter time to find the flight (if it comes after the
        // failure it loads its own value, and the assertions below say so).
        thread::sleep(Duration::from_millis(50));
        release.wait();
        (loader.join().unwrap(), waiter.join().unwrap())
    });
    let first = first.unwrap_err();
    assert_eq!(first.to_string(), "down");
    match second {
        Err(e) => {
            assert!(
                Arc::ptr_eq(&first, &e),
                "the waiter shares the loader's Arc"
            );
            assert_eq!(loads.load(Ordering::SeqCst), 1);
        }
        Ok(v) => {
            // The waiter came after the failure: it loaded on its own.
            assert_eq!(v, 1);
            assert_eq!(loads.load(Ordering::SeqCst), 2);
        }
    }
}

#[test]
fn optionally_get_with_hands_none_to_its_waiters() {
    let map: ExpireMap<u32, u32> = ExpireMap::new();
    let started = Arc::new(Barrier::new(2));
    let loads = Arc::new(AtomicUsize::new(0));
    let results = thread::scope(|s| {
        let (l, st) = (loads.clone(), started.clone());
        let loader = s.spawn(|| {
            map.optionally_get_with(1, move || {
                l.fetch_add(1, Ordering::SeqCst);
                st.wait();
                thread::sleep(Duration::from_millis(50));
                None
            })
        });
        started.wait();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let l = loads.clone();
                s.spawn(|| {
                    map.optionally_get_with(1, move || {
                        l.fetch_add(1, Ordering::SeqCst);
                        None
                    })
                })
            })
            .collect();
        let mut r = vec![loader.join().unwrap()];
        r.extend(waiters.into_iter().map(|w| w.join().unwrap()));
        r
    });
    assert_eq!(results, vec![None; 4]);
    assert!(map.is_empty());
    // Every caller got None whether it waited or loaded.
    assert!((1..=4).contains(&loads.load(Ordering::SeqCst)));
    assert_eq!(map.optionally_get_with(1, || Some(1)), Some(1));
    assert_eq!(map.get(&1), Some(1));
}

#[test]
fn async_forms_share_a_flight_on_a_current_thread_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let map: ExpireMap<u32, u32> = ExpireMap::builder().time_to_live(MINUTE).build();
    let loads = Arc::new(AtomicUsize::new(0));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..50 {
            let map = map.clone(); // a cheap handle, no Arc
            let loads = loads.clone();
            tasks.push(tokio::spawn(async move {
                match i % 3 {
                    0 => {
                        map.get_with_async(1, async move {
                            loads.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            7
                        })
                        .await
                    }
                    1 => map
                        .try_get_with_async(1, async move {
                            loads.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            Ok::<_, std::io::Error>(7)
                        })
                        .await
                        .unwrap(),
                    _ => map
                        .optionally_get_with_async(1, async move {
                            loads.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            Some(7)
                        })
                        .await
                        .unwrap(),
                }
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), 7);
        }
        let e = map
            .try_get_with_async(2, async { Err::<u32, _>(std::io::Error::other("x")) })
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "x");
        assert_eq!(map.optionally_get_with_async(3, async { None }).await, None);
    });
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    assert_eq!(map.ttl(&1).map(|t| t <= MINUTE), Some(true));
    assert_eq!(map.len(), 1);
}

#[test]
fn clones_share_one_map_and_the_last_one_shuts_it_down() {
    let map: ExpireMap<u32, u32> = ExpireMap::new();
    let mut events = map.subscribe().unwrap();
    let other = map.clone();
    other.put(1, 1, MINUTE);
    assert_eq!(map.get(&1), Some(1));
    // Dropping one handle on another thread stops nothing.
    thread::spawn(move || drop(other)).join().unwrap();
    map.put(2, 2, 5 * MS);
    let e = events.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(
        (e.key, e.cause),
        (2, Cause::Expired),
        "the thread still evicts"
    );
    let clones: Vec<_> = (0..4).map(|_| map.clone()).collect();
    drop(map);
    assert_eq!(clones[3].get(&1), Some(1));
    drop(clones);
    let e = events.recv().unwrap();
    assert_eq!((e.key, e.value, e.cause), (1, 1, Cause::Shutdown));
    assert!(
        events.recv().is_err(),
        "closed once the last handle is gone"
    );
}

#[test]
fn a_handle_dropped_by_the_eviction_thread_shuts_down_without_joining_itself() {
    // The last handle lives in a value: the eviction thread drops it when
    // the entry expires (nobody subscribed), and must not join itself.
    struct Holds {
        map: Mutex<Option<ExpireMap<u32, Arc<Holds>>>>,
        done: Arc<std::sync::atomic::AtomicBool>,
    }
    impl Drop for Holds {
        fn drop(&mut self) {
            drop(self.map.lock().unwrap().take());
            self.done.store(true, Ordering::SeqCst);
        }
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let map: ExpireMap<u32, Arc<Holds>> = ExpireMap::new();
    let holds = Holds {
        map: Mutex::new(Some(map.clone())),
        done: done.clone(),
    };
    map.put(1, Arc::new(holds), MS);
    drop(map);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !done.load(Ordering::SeqCst) {
        assert!(
            std::time::Instant::now() < deadline,
            "the last handle was never dropped"
        );
        thread::sleep(MS);
    }
}

#[test]
fn try_put_and_try_insert_hand_a_refused_value_back_unpublished() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, String> = manual_builder(&clock).shards(1).max_entries(2).build();
    let mut events = map.subscribe().unwrap();
    assert_eq!(map.try_put(1, "one".into(), MINUTE), Ok(None));
    assert_eq!(map.try_insert(2, "two".into()), Ok(None));
    for _ in 0..4 {
        map.get(&1);
        map.get(&2);
    }
    let refused = map.try_put(3, "three".into(), MINUTE).unwrap_err();
    assert_eq!(
        refused,
        Refused {
            key: 3,
            value: "three".to_string()
        }
    );
    let Refused { key, value } = map.try_insert(4, "four".into()).unwrap_err();
    assert_eq!((key, value.as_str()), (4, "four"));
    assert!(matches!(events.try_recv(), Err(TryRecvError::Empty)));
    assert_eq!(map.stats().size_evicted, 0);
    assert_eq!(map.len(), 2);
    // An overwrite is never refused; a plain put publishes the refusal.
    assert_eq!(map.try_put(1, "uno".into(), MINUTE), Ok(Some("one".into())));
    assert_eq!(map.put(5, "five".into(), MINUTE), None);
    let e = events.try_recv().unwrap();
    assert_eq!((e.key, e.cause), (5, Cause::Size));
    assert_eq!(map.stats().size_evicted, 1);
    // Zero TTL: ignored, as by put.
    assert_eq!(map.try_put(6, "six".into(), Duration::ZERO), Ok(None));
    // An unbounded map never refuses.
    let free: ExpireMap<u32, u32> = manual_builder(&clock).build();
    assert_eq!(free.try_insert(1, 1), Ok(None));
    assert_eq!(free.try_insert(1, 2), Ok(Some(1)));
}

#[test]
fn peek_counts_as_no_access() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = manual_builder(&clock)
        .time_to_idle(Duration::from_secs(10))
        .record_stats(true)
        .build();
    map.put(1, 1, MINUTE);
    clock.advance(Duration::from_secs(9));
    assert_eq!(map.peek(&1), Some(1));
    assert_eq!(map.peek(&2), None);
    let s = map.stats();
    assert_eq!((s.hits, s.misses), (0, 0));
    clock.advance(Duration::from_secs(2)); // idle 11 s: peek refreshed nothing
    assert_eq!(map.peek(&1), None);
    assert_eq!(map.get(&1), None);
}

#[test]
fn peek_is_no_access_for_the_bound_either() {
    // One shard of two: the entry read by `get` survives a newcomer asked
    // for often; the one only peeked at is the victim.
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = manual_builder(&clock).shards(1).max_entries(2).build();
    map.put(1, 1, MINUTE);
    map.put(2, 2, MINUTE);
    for _ in 0..3 {
        map.get(&1);
        map.peek(&2);
    }
    for _ in 0..3 {
        map.put(3, 3, MINUTE);
    }
    assert_eq!(map.peek(&1), Some(1));
    assert_eq!(map.peek(&2), None);
    assert_eq!(map.peek(&3), Some(3));
}

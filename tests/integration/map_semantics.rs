//! The map's single-threaded semantics on a ManualClock: deadlines, overwrite,
//! remove, touch, ttl, zero and huge TTLs, builder errors.

use crate::common::{MS, manual};
use expiremap::{BuildError, Cause, Clock, ExpireIf, ExpireMap, ManualClock, Update};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[test]
fn deadline_is_inclusive() {
    let (map, clock) = manual::<&str, i32>();
    map.put("k", 1, 10 * MS);
    clock.advance(10 * MS);
    assert_eq!(map.get("k"), Some(1));
    assert_eq!(map.ttl("k"), Some(Duration::ZERO));
    clock.advance(Duration::from_nanos(1));
    assert_eq!(map.get("k"), None);
}

#[test]
fn expired_but_not_evicted_is_invisible_to_every_read_but_counted_by_len() {
    let (map, clock) = manual::<u32, u32>();
    map.put(1, 1, MS);
    clock.advance(2 * MS);
    assert_eq!(map.get(&1), None);
    assert_eq!(map.get_with_ttl(&1), None);
    assert_eq!(map.ttl(&1), None);
    assert!(!map.contains_key(&1));
    assert_eq!(map.len(), 1);
    assert!(!map.is_empty());
    assert_eq!(map.evict_expired(), 1);
    assert_eq!(map.len(), 0);
    assert!(map.is_empty());
}

#[test]
fn put_returns_previous_live_value_and_overwrites_deadline() {
    let (map, clock) = manual::<u32, &str>();
    assert_eq!(map.put(1, "a", 100 * MS), None);
    assert_eq!(map.put(1, "b", 5 * MS), Some("a"));
    clock.advance(6 * MS);
    assert_eq!(map.get(&1), None, "the shorter new deadline applies");
    assert_eq!(map.len(), 1);
}

#[test]
fn put_over_expired_entry_returns_none() {
    let (map, clock) = manual::<u32, &str>();
    map.put(1, "old", MS);
    clock.advance(2 * MS);
    assert_eq!(map.put(1, "new", MS), None);
    assert_eq!(map.get(&1), Some("new"));
    assert_eq!(map.len(), 1);
}

#[test]
fn zero_ttl_put_is_ignored() {
    let (map, _clock) = manual::<u32, u32>();
    map.put(1, 1, MS);
    assert_eq!(map.put(1, 2, Duration::ZERO), None);
    assert_eq!(map.get(&1), Some(1));
    assert_eq!(map.put(2, 2, Duration::ZERO), None);
    assert!(!map.contains_key(&2));
    assert_eq!(map.len(), 1);
}

#[test]
fn huge_ttl_saturates_and_never_expires_in_practice() {
    let (map, clock) = manual::<u32, u32>();
    map.put(1, 1, Duration::MAX);
    map.put(2, 2, Duration::from_secs(u64::MAX));
    clock.advance(Duration::from_secs(100 * 365 * 24 * 3600));
    assert_eq!(map.get(&1), Some(1));
    assert_eq!(map.get(&2), Some(2));
    assert_eq!(map.evict_expired(), 0);
    let ttl = map.ttl(&1).unwrap();
    assert!(ttl > Duration::from_secs(400 * 365 * 24 * 3600), "{ttl:?}");
    assert!(map.next_expiry().is_some());
}

#[test]
fn huge_ttl_near_the_end_of_the_clock_saturates() {
    let clock = ManualClock::starting_at(u64::MAX - 1_000);
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .build();
    map.put(1, 1, Duration::from_secs(10));
    assert_eq!(map.ttl(&1), Some(Duration::from_nanos(1_000)));
    clock.advance(Duration::from_nanos(1_000));
    assert_eq!(map.get(&1), Some(1), "deadline u64::MAX is inclusive");
    assert_eq!(map.evict_expired(), 0);
}

#[test]
fn remove_returns_only_live_values() {
    let (map, clock) = manual::<u32, u32>();
    map.put(1, 1, 10 * MS);
    map.put(2, 2, MS);
    clock.advance(2 * MS);
    assert_eq!(map.remove(&1), Some(1));
    assert_eq!(map.remove(&1), None);
    assert_eq!(map.remove(&2), None, "expired: leaves by the Expired door");
    assert_eq!(map.len(), 0);
    assert_eq!(map.remove(&3), None);
}

#[test]
fn get_with_ttl_reads_value_and_remaining_time_together() {
    let (map, clock) = manual::<String, u32>();
    map.put("k".into(), 7, 10 * MS);
    clock.advance(4 * MS);
    assert_eq!(map.get_with_ttl("k"), Some((7, 6 * MS)));
}

#[test]
fn touch_extends_a_live_entry_only() {
    let (map, clock) = manual::<u32, u32>();
    map.put(1, 1, 10 * MS);
    clock.advance(9 * MS);
    assert!(map.touch(&1, 10 * MS));
    clock.advance(9 * MS);
    assert_eq!(map.get(&1), Some(1));
    assert_eq!(map.ttl(&1), Some(MS));
    assert!(!map.touch(&1, Duration::ZERO), "zero TTL touch is ignored");
    assert_eq!(map.ttl(&1), Some(MS));
    clock.advance(2 * MS);
    assert!(!map.touch(&1, 10 * MS), "expired entries are not revived");
    assert!(!map.touch(&2, 10 * MS));
    assert_eq!(map.get(&1), None);
}

#[test]
fn touch_can_shorten_the_deadline() {
    let (map, clock) = manual::<u32, u32>();
    map.put(1, 1, Duration::from_secs(60));
    assert!(map.touch(&1, MS));
    clock.advance(3 * MS);
    assert_eq!(map.get(&1), None);
    assert_eq!(map.evict_expired(), 1);
}

#[test]
fn clear_removes_everything() {
    let (map, _clock) = manual::<u32, u32>();
    for i in 0..100 {
        map.put(i, i, MS * (i + 1));
    }
    assert_eq!(map.len(), 100);
    map.clear();
    assert!(map.is_empty());
    assert_eq!(map.get(&5), None);
    map.put(5, 5, MS);
    assert_eq!(map.get(&5), Some(5));
}

#[test]
fn evict_expired_evicts_exactly_what_is_due() {
    let (map, clock) = manual::<u32, u32>();
    for i in 1..=10u32 {
        map.put(i, i, MS * i);
    }
    clock.advance(5 * MS + MS); // one precision past deadline 5 ms
    assert_eq!(map.evict_expired(), 5);
    assert_eq!(map.len(), 5);
    for i in 1..=5 {
        assert_eq!(map.get(&i), None);
    }
    for i in 6..=10 {
        assert_eq!(map.get(&i), Some(i));
    }
}

#[test]
fn evict_expired_is_never_early() {
    let (map, clock) = manual::<u32, u32>();
    map.put(1, 1, 10 * MS);
    clock.advance(10 * MS);
    assert_eq!(map.evict_expired(), 0, "still live at its deadline");
    clock.advance(Duration::from_nanos(1));
    // Past the deadline: evictable within one precision.
    clock.advance(MS);
    assert_eq!(map.evict_expired(), 1);
}

#[test]
fn one_evict_call_handles_more_than_a_batch() {
    let (map, clock) = manual::<u32, u32>();
    for i in 0..10_000 {
        map.put(i, i, MS);
    }
    clock.advance(3 * MS);
    assert_eq!(map.evict_expired(), 10_000);
    assert!(map.is_empty());
}

#[test]
fn next_expiry_guides_a_manual_driver_to_make_progress() {
    let (map, clock) = manual::<u32, u32>();
    assert_eq!(map.next_expiry(), None);
    let ttls = [3u64, 17, 250, 4_000, 70_000];
    for (i, t) in ttls.iter().enumerate() {
        map.put(i as u32, 0, Duration::from_millis(*t));
    }
    let mut evicted = 0;
    let mut steps = 0;
    while let Some(wait) = map.next_expiry() {
        clock.advance(wait);
        evicted += map.evict_expired();
        steps += 1;
        assert!(steps < 10_000, "no progress");
    }
    assert_eq!(evicted, ttls.len());
    assert!(map.is_empty());
}

#[test]
fn borrowed_key_forms_work() {
    let (map, _clock) = manual::<String, Vec<u8>>();
    map.put("abc".to_string(), vec![1], MS);
    assert_eq!(map.get("abc"), Some(vec![1]));
    assert!(map.contains_key("abc"));
    assert_eq!(map.remove("abc"), Some(vec![1]));
}

#[test]
fn many_keys_across_shards() {
    let (map, clock) = manual::<u64, u64>();
    for i in 0..50_000u64 {
        map.put(i, i * 2, MS * (1 + (i % 100) as u32));
    }
    assert_eq!(map.len(), 50_000);
    for i in (0..50_000u64).step_by(97) {
        assert_eq!(map.get(&i), Some(i * 2));
    }
    clock.advance(50 * MS + MS);
    let evicted = map.evict_expired();
    assert_eq!(evicted, 50_000 / 100 * 50);
}

/// A user clock that goes backward is treated as time standing still.
#[derive(Clone)]
struct Jumpy(Arc<AtomicU64>);
impl Clock for Jumpy {
    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[test]
fn a_clock_going_backward_counts_as_no_time_passing() {
    let t = Arc::new(AtomicU64::new(1_000_000_000));
    let map = ExpireMap::<u32, u32>::builder()
        .clock(Jumpy(t.clone()))
        .background_eviction(false)
        .build();
    map.put(1, 1, 10 * MS);
    t.store(1_020_000_000, Ordering::SeqCst);
    assert_eq!(map.get(&1), None);
    t.store(1_000_000_000, Ordering::SeqCst); // backward
    assert_eq!(map.get(&1), None, "an expired entry stays expired");
    assert_eq!(map.evict_expired(), 1);
}

#[test]
fn builder_rejects_invalid_settings_with_named_errors() {
    let b = || ExpireMap::<u32, u32>::builder().background_eviction(false);
    assert_eq!(
        b().shards(0).try_build().unwrap_err(),
        BuildError::Shards(0)
    );
    assert_eq!(
        b().shards(3).try_build().unwrap_err(),
        BuildError::Shards(3)
    );
    assert_eq!(
        b().shards(1 << 20).try_build().unwrap_err(),
        BuildError::Shards(1 << 20)
    );
    assert_eq!(
        b().eviction_interval(Duration::ZERO)
            .try_build()
            .unwrap_err(),
        BuildError::EvictionInterval(Duration::ZERO)
    );
    assert_eq!(
        b().precision(Duration::from_nanos(1))
            .try_build()
            .unwrap_err(),
        BuildError::Precision(Duration::from_nanos(1))
    );
    assert_eq!(
        b().event_capacity(1000).try_build().unwrap_err(),
        BuildError::EventCapacity(1000)
    );
    assert_eq!(
        b().max_subscribers(0).try_build().unwrap_err(),
        BuildError::MaxSubscribers(0)
    );
    assert_eq!(
        b().max_entries(0).try_build().unwrap_err(),
        BuildError::MaxEntries(0)
    );
    assert_eq!(
        b().max_weight(0).try_build().unwrap_err(),
        BuildError::MaxWeight(0)
    );
    assert_eq!(
        b().weigher(|_, _| 1).try_build().unwrap_err(),
        BuildError::WeigherWithoutMaxWeight
    );
    assert_eq!(
        b().max_entries(5)
            .weigher(|_, _| 1)
            .try_build()
            .unwrap_err(),
        BuildError::WeigherWithoutMaxWeight
    );
    assert_eq!(
        b().max_entries(5).max_weight(5).try_build().unwrap_err(),
        BuildError::TwoBounds
    );
    for (e, name) in [
        (BuildError::MaxEntries(0), "max_entries"),
        (BuildError::MaxWeight(0), "max_weight"),
        (BuildError::WeigherWithoutMaxWeight, "weigher"),
        (BuildError::TwoBounds, "max_weight"),
    ] {
        assert!(e.to_string().contains(name), "{e}");
    }
    // A bound below the shard count lowers it: every key can get in.
    let one = b().shards(64).max_entries(1).build();
    for k in 0..100 {
        one.clear();
        one.put(k, k, Duration::from_secs(60));
        assert_eq!(one.get(&k), Some(k), "key {k} could not get in");
    }
    let msg = b().shards(3).try_build().unwrap_err().to_string();
    assert!(msg.contains("shards") && msg.contains('3'), "{msg}");
    let e: Box<dyn std::error::Error> = Box::new(BuildError::Shards(3));
    assert!(e.to_string().contains("power of two"));
}

#[test]
#[should_panic(expected = "invalid event_capacity: 3")]
fn build_panics_with_the_same_message() {
    let _ = ExpireMap::<u32, u32>::builder().event_capacity(3).build();
}

#[test]
fn defaults_build_and_work() {
    let map: ExpireMap<u32, u32> = ExpireMap::default();
    map.put(1, 1, Duration::from_secs(60));
    assert_eq!(map.get(&1), Some(1));
    assert!(format!("{map:?}").contains("ExpireMap"));
}

#[test]
fn handles_and_errors_have_the_promised_traits() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    fn error<T: std::error::Error + Send + Sync + 'static>() {}
    send::<ExpireMap<String, Vec<u8>>>();
    sync::<ExpireMap<String, Vec<u8>>>();
    send::<expiremap::Subscriber<String, Vec<u8>>>();
    send::<expiremap::Event<String, Vec<u8>>>();
    send::<ManualClock>();
    sync::<ManualClock>();
    error::<BuildError>();
    error::<expiremap::SubscribeError>();
    error::<expiremap::RecvError>();
    error::<expiremap::TryRecvError>();
    error::<expiremap::RecvTimeoutError>();
    let copy = expiremap::Cause::Expired;
    let _again = copy; // Cause is Copy
    assert_eq!(copy, expiremap::Cause::Expired);
}

/// Eight threads `put_if_absent` the same key at once: exactly one stores,
/// and every other gets that one's value back.
#[test]
fn put_if_absent_has_one_winner() {
    for _ in 0..50 {
        let map = std::sync::Arc::new(ExpireMap::<u32, usize>::new());
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let results: Vec<Option<usize>> = (0..8)
            .map(|i| {
                let (map, barrier) = (map.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    map.put_if_absent(7, i, Duration::from_secs(60))
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let winners: Vec<usize> = (0..8).filter(|&i| results[i].is_none()).collect();
        assert_eq!(winners.len(), 1, "{results:?}");
        let w = winners[0];
        assert!(results.iter().flatten().all(|&v| v == w), "{results:?}");
        assert_eq!(map.get(&7), Some(w));
    }
}

/// `expire` conditions at their edges: an equal deadline is neither later
/// nor earlier; an expired entry is never changed.
#[test]
fn expire_conditions_at_the_edges() {
    let (map, clock) = crate::common::manual::<u32, u32>();
    map.put(1, 1, Duration::from_secs(10));
    assert!(!map.expire(&1, Duration::from_secs(10), ExpireIf::Later));
    assert!(!map.expire(&1, Duration::from_secs(10), ExpireIf::Earlier));
    assert!(map.expire(&1, Duration::from_secs(10), ExpireIf::Always));
    assert!(!map.expire(&1, Duration::ZERO, ExpireIf::Always));
    clock.advance(Duration::from_secs(10) + Duration::from_nanos(1));
    assert!(!map.expire(&1, Duration::from_secs(60), ExpireIf::Always));
    assert_eq!(map.get(&1), None);
    // Expired: counts as absent, and the old value leaves as Expired.
    let mut sub = map.subscribe().unwrap();
    assert_eq!(map.put_if_absent(1, 2, Duration::from_secs(60)), None);
    let e = sub.try_recv().unwrap();
    assert_eq!((e.key, e.value, e.cause), (1, 1, Cause::Expired));
    assert_eq!(map.put_if_absent(1, 3, Duration::ZERO), Some(2));
}

/// `update` from 8 threads on one counter: no increment is lost, however
/// the reads and commits interleave (a stale read is retried).
#[test]
fn update_loses_no_increment() {
    let map = Arc::new(ExpireMap::<u32, u64>::new());
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let map = map.clone();
            std::thread::spawn(move || {
                for _ in 0..500 {
                    map.update(1, |seen| match seen {
                        None => Update::Set(1, Duration::from_secs(60)),
                        Some((n, _)) => Update::SetKeepTtl(n + 1),
                    });
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(map.get(&1), Some(4_000));
}

/// `update` keeps the deadline with `SetKeepTtl`, and an entry that expired
/// is shown as absent.
#[test]
fn update_keeps_the_deadline_and_sees_expiry() {
    let (map, clock) = manual::<u32, u32>();
    map.put(1, 1, Duration::from_secs(10));
    clock.advance(Duration::from_secs(4));
    assert_eq!(map.update(1, |_| Update::SetKeepTtl(2)), Some(2));
    assert_eq!(map.ttl(&1), Some(Duration::from_secs(6)));
    clock.advance(Duration::from_secs(7));
    let mut shown = Some(None);
    assert_eq!(
        map.update(1, |seen| {
            shown = Some(seen.map(|(v, _)| *v));
            Update::SetKeepTtl(3)
        }),
        None
    );
    assert_eq!(shown, Some(None), "an expired entry is shown as absent");
    assert_eq!(map.update(1, |_| Update::Remove), None);
    assert_eq!(map.len(), 0);
}

#[test]
fn replace_only_over_a_live_entry() {
    let (map, clock) = manual::<String, u32>();
    let mut sub = map.subscribe().unwrap();
    assert_eq!(map.replace("a", 1, MS), None, "absent");
    assert_eq!(map.get("a"), None);
    map.put("a".into(), 1, MS);
    assert_eq!(map.replace("a", 2, 5 * MS), Some(1));
    assert_eq!(map.ttl("a"), Some(5 * MS), "the new TTL");
    assert_eq!(map.replace("a", 3, Duration::ZERO), None, "zero TTL");
    assert_eq!(map.get("a"), Some(2));
    clock.advance(5 * MS + Duration::from_nanos(1));
    assert_eq!(map.replace("a", 4, MS), None, "expired counts as absent");
    assert_eq!(map.get("a"), None);
    clock.advance(2 * MS); // its timer's tick
    map.evict_expired();
    let e = sub.try_recv().unwrap();
    assert_eq!(
        (e.value, e.cause),
        (2, Cause::Expired),
        "the replaced value expired"
    );
    assert!(
        sub.try_recv().is_err(),
        "4 was never stored: {:?}",
        sub.try_recv()
    );
}

/// A map driven by hand on a `ManualClock`, with `time_to_idle(idle)`.
fn idle_map(idle: Duration) -> (ExpireMap<u32, u32>, ManualClock) {
    let clock = ManualClock::new();
    let map = ExpireMap::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .time_to_idle(idle)
        .build();
    (map, clock)
}

/// Idle expiry at the exact boundary: visible at `last access + d`, gone
/// 1 ns later; `ttl` and `contains_key` are not accesses, `get`,
/// `get_with_ttl` and writes are; the write deadline still bounds it.
#[test]
fn idle_expiry_at_the_exact_boundary() {
    let (map, clock) = idle_map(10 * MS);
    let mut sub = map.subscribe().unwrap();
    let ns = Duration::from_nanos(1);
    map.put(1, 1, 25 * MS);
    assert_eq!(map.ttl(&1), Some(10 * MS), "min(write, access + idle)");
    clock.advance(9 * MS);
    assert_eq!(map.ttl(&1), Some(MS), "ttl is not an access");
    assert!(map.contains_key(&1), "nor is contains_key");
    clock.advance(MS);
    assert_eq!(
        map.get(&1),
        Some(1),
        "at last access + d: live (and accessed)"
    );
    clock.advance(10 * MS);
    assert_eq!(
        map.get_with_ttl(&1),
        Some((1, 5 * MS)),
        "accessed at 10 ms, read at 20 ms: the write deadline (25 ms) binds"
    );
    clock.advance(5 * MS);
    assert_eq!(map.get(&1), Some(1), "at the write deadline");
    clock.advance(ns);
    assert_eq!(map.get(&1), None, "1 ns past the write deadline");

    map.put(2, 2, 60 * MS); // at 25 ms + 1 ns
    clock.advance(10 * MS);
    assert_eq!(map.get(&2), Some(2), "idle exactly d");
    clock.advance(10 * MS);
    assert_eq!(map.ttl(&2), Some(Duration::ZERO));
    clock.advance(ns);
    assert_eq!(map.get(&2), None, "idle d + 1 ns");
    // That read removed it (its value left as `Expired`).
    assert_eq!(map.len(), 1);
    assert_eq!(map.get_with_ttl(&2), None);
    assert!(!map.contains_key(&2));
    assert!(!map.expire(&2, MS, ExpireIf::Always), "gone for expire too");
    clock.advance(2 * MS); // the timers' ticks
    // Key 1 expired by its write deadline: a read leaves it to eviction,
    // this pass's or, should key 1 share key 2's shard, that of the
    // `expire` above (a write to a shard no pass drained for 5 ms takes its
    // due entries).
    map.evict_expired();
    assert_eq!(map.len(), 0);
    let mut got: Vec<_> = std::iter::from_fn(|| sub.try_recv().ok())
        .map(|e| (e.key, e.cause, e.removed_at() > e.deadline()))
        .collect();
    got.sort_unstable_by_key(|g| g.0);
    assert_eq!(got, [(1, Cause::Expired, true), (2, Cause::Expired, true)]);
}

/// The eviction pass finds an entry read since its timer was set: it
/// moves the timer instead of evicting, and evicts at the new deadline.
#[test]
fn eviction_moves_the_timer_of_an_entry_read_since() {
    let (map, clock) = idle_map(10 * MS);
    map.put(1, 1, Duration::from_secs(60));
    for _ in 0..20 {
        clock.advance(8 * MS);
        assert_eq!(map.get(&1), Some(1));
        assert_eq!(map.evict_expired(), 0, "read within d: not evicted");
        assert_eq!(map.len(), 1);
    }
    let next = map.next_expiry().expect("a timer is set");
    assert!(
        next <= 10 * MS + 2 * MS,
        "the timer moved with the reads: {next:?}"
    );
    clock.advance(10 * MS);
    assert_eq!(map.keys().count(), 1, "at the last read + d");
    clock.advance(Duration::from_nanos(1));
    // Iteration reads without removing: the entry is gone from view, held
    // until its timer's tick.
    assert_eq!(map.keys().count(), 0, "1 ns later");
    assert_eq!(map.len(), 1);
    clock.advance(2 * MS); // the timer's tick
    assert_eq!(map.evict_expired(), 1);
    assert!(map.is_empty());
}

#[test]
fn a_zero_time_to_idle_is_rejected() {
    let r = ExpireMap::<u32, u32>::builder()
        .time_to_idle(Duration::ZERO)
        .try_build();
    let e = r.unwrap_err();
    assert_eq!(e, BuildError::TimeToIdle(Duration::ZERO));
    assert!(e.to_string().contains("time_to_idle"), "{e}");
}

/// Exact hit and miss counts over a single-threaded sequence, and what
/// counts: `get`, `get_with_ttl` and loading calls (once each), not `ttl`,
/// `contains_key` or writes. Off by default.
#[test]
fn stats_count_hits_and_misses_exactly() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .record_stats(true)
        .shards(1)
        .max_entries(2)
        .build();
    let hm = |m: &ExpireMap<u32, u32>| (m.stats().hits, m.stats().misses);
    assert_eq!(hm(&map), (0, 0));
    map.put(1, 1, 10 * MS);
    assert_eq!(map.get(&1), Some(1)); // hit
    assert_eq!(map.get(&2), None); // miss
    assert!(map.get_with_ttl(&1).is_some()); // hit
    assert!(map.ttl(&1).is_some() && map.contains_key(&1)); // not counted
    map.put_if_absent(1, 5, MS); // not counted
    assert_eq!(hm(&map), (2, 1));
    assert_eq!(map.get_or_insert_with(2, MS, || 2), 2); // miss (loads)
    assert_eq!(map.get_or_insert_with(2, MS, || 9), 2); // hit
    let _ = map.try_get_or_insert_with(3, MS, || Err::<u32, _>(())); // miss
    assert_eq!(hm(&map), (3, 3));
    clock.advance(10 * MS + Duration::from_nanos(1));
    assert_eq!(map.get(&1), None, "expired: a miss");
    assert_eq!(hm(&map), (3, 4));
    // The bound: a third key pushes one out (or is refused): Size.
    map.put(4, 4, MS);
    map.put(5, 5, MS);
    map.put(6, 6, MS);
    let s = map.stats();
    assert!(s.size_evicted >= 1, "{s:?}");
    // Lateness: evicted 3 ms after its deadline at the earliest. (In a map
    // of its own: the puts above took expired entries to make room, which
    // counts as their eviction, 9 ms late for key 2.)
    let late = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .build();
    late.put(7, 7, MS);
    clock.advance(4 * MS);
    late.evict_expired();
    let s = late.stats();
    assert!(s.evicted == 1 && s.max_lateness >= 3 * MS, "{s:?}");
    assert!(s.max_lateness <= 4 * MS, "{s:?}");

    let off = ExpireMap::<u32, u32>::new();
    off.put(1, 1, MS);
    off.get(&1);
    off.get(&2);
    assert_eq!(hm(&off), (0, 0), "off by default");
}

/// Hits and misses from 4 threads add up exactly.
#[test]
fn stats_from_many_threads_add_up() {
    let map = Arc::new(ExpireMap::<u32, u32>::builder().record_stats(true).build());
    for k in 0..100 {
        map.put(k, k, Duration::from_secs(3600));
    }
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let map = map.clone();
            std::thread::spawn(move || {
                for i in 0..10_000u32 {
                    map.get(&((i * 7 + t) % 200)); // keys 0..100 hit, 100..200 miss
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = map.stats();
    assert_eq!(s.hits + s.misses, 40_000);
    assert_eq!(s.hits, 20_000, "{s:?}");
}

/// `next_expiry` on a map holding only entries that never expire:
/// centuries away (the timer index's own work near the end of the clock's
/// range, where it moves those entries); driving the clock by it evicts
/// nothing and ends after a few rounds.
#[test]
fn next_expiry_with_only_saturated_entries_is_centuries_away() {
    let (map, clock) = manual::<u32, u32>();
    assert_eq!(map.next_expiry(), None, "empty");
    for k in 0..8 {
        map.put(k, k, Duration::MAX);
    }
    let century = Duration::from_secs(100 * 365 * 86_400);
    assert!(map.next_expiry().expect("index work at the end") > century);
    let mut rounds = 0;
    while let Some(d) = map.next_expiry() {
        clock.advance(d);
        assert_eq!(map.evict_expired(), 0);
        rounds += 1;
        assert!(rounds < 100, "the loop ends");
    }
    assert_eq!(map.len(), 8);
    assert_eq!(map.get(&3), Some(3));
}

/// A clock set by hand that counts its reads.
struct Counted {
    t: Arc<AtomicU64>,
    reads: Arc<AtomicU64>,
}

impl Clock for Counted {
    fn now(&self) -> u64 {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.t.load(Ordering::SeqCst)
    }
}

/// A one-shard map on a [`Counted`] clock at time `t0`, driven by hand,
/// publishing removals, bounded to `cap` entries if given; with the
/// clock's time and its count of reads.
fn counted_map(t0: u64, cap: Option<u64>) -> (ExpireMap<u32, u32>, Arc<AtomicU64>, Arc<AtomicU64>) {
    let (t, reads) = (Arc::new(AtomicU64::new(t0)), Arc::new(AtomicU64::new(0)));
    let mut builder = ExpireMap::builder()
        .clock(Counted {
            t: t.clone(),
            reads: reads.clone(),
        })
        .shards(1)
        .background_eviction(false)
        .publish_removals(true);
    if let Some(cap) = cap {
        builder = builder.max_entries(cap);
    }
    (builder.build(), t, reads)
}

/// How many times `f` reads the clock whose reads `reads` counts.
fn reads_by(reads: &AtomicU64, f: impl FnOnce()) -> u64 {
    let before = reads.load(Ordering::SeqCst);
    f();
    reads.load(Ordering::SeqCst) - before
}

#[test]
fn reads_of_a_shard_whose_entries_never_expire_read_no_clock() {
    for bounded in [false, true] {
        let (map, t, reads) = counted_map(5, bounded.then_some(100));
        map.insert(1, 10); // no TTL configured: never expires
        map.put(2, 20, Duration::MAX); // saturates to never
        let all_reads = || {
            assert_eq!(map.get(&1), Some(10));
            assert_eq!(map.get(&3), None);
            assert!(map.contains_key(&2));
            assert_eq!(map.get_many([&1, &2, &3]), [Some(10), Some(20), None]);
        };
        assert_eq!(reads_by(&reads, all_reads), 0, "bounded: {bounded}");

        // One entry with a deadline: reads judge it, and every other, with
        // the clock, exactly.
        map.put(4, 40, 10 * MS);
        assert!(reads_by(&reads, all_reads) > 0, "bounded: {bounded}");
        t.fetch_add(10_000_000, Ordering::SeqCst);
        assert_eq!(map.get(&4), Some(40), "the deadline is inclusive");
        t.fetch_add(1, Ordering::SeqCst);
        assert_eq!(map.get(&4), None);
        assert!(!map.contains_key(&4));
        assert_eq!(map.get_many([&4, &1]), [None, Some(10)]);
        assert_eq!(map.get(&2), Some(20));

        // Emptied, the shard starts over without deadlines.
        map.clear();
        map.insert(1, 11);
        assert_eq!(reads_by(&reads, || assert_eq!(map.get(&1), Some(11))), 0);
    }
}

#[test]
fn writes_of_entries_that_never_expire_read_no_clock_until_a_deadline_or_an_event_needs_it() {
    for bounded in [false, true] {
        let (map, t, reads) = counted_map(7, bounded.then_some(2));
        let writes = || {
            map.insert(1, 10);
            assert_eq!(map.put(2, 20, Duration::MAX), None);
            assert_eq!(map.insert(1, 11), Some(10), "a replaced value is live");
            assert_eq!(map.get_or_insert_with(3, Duration::MAX, || 30), 30);
        };
        assert_eq!(reads_by(&reads, writes), 0, "bounded: {bounded}");
        let held = if bounded { 2 } else { 3 };
        assert_eq!(map.len(), held, "bounded: {bounded}");

        // With a subscriber, what leaves is published with the clock's time,
        // read when the event is.
        let mut sub = map.subscribe().unwrap();
        t.store(9, Ordering::SeqCst);
        assert_eq!(map.insert(1, 12), Some(11));
        let replaced = sub.try_recv().unwrap();
        assert_eq!((replaced.key, replaced.cause), (1, Cause::Replaced));
        assert_eq!(replaced.removed_at(), Duration::from_nanos(9));
        if bounded {
            // Full: the newcomer (never asked for before) is refused.
            map.insert(4, 40);
            let refused = sub.try_recv().unwrap();
            assert_eq!((refused.key, refused.cause), (4, Cause::Size));
            assert_eq!(refused.removed_at(), Duration::from_nanos(9));
        }
        assert!(sub.try_recv().is_err());

        // A deadline in the shard: every write reads the clock again.
        map.put(5, 50, 10 * MS);
        assert!(
            reads_by(&reads, || {
                map.insert(6, 60);
            }) > 0,
            "bounded: {bounded}"
        );
    }
}

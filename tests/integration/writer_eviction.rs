//! Writes share the eviction work: a write that holds its shard's lock,
//! finding that no eviction has run there for longer than the thread
//! promises (one eviction interval plus one precision: the thread is
//! behind), takes a few of its due entries and publishes them as `Expired`
//! after the unlock. Virtual time only; no thread unless a test says so.

use expiremap::{Cause, ExpireMap, ManualClock, Subscriber};
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);
const HOUR: Duration = Duration::from_secs(3600);
/// The most due entries one write takes (`evictor::WRITER_EVICT`).
const PER_WRITE: usize = 8;
/// One timer tick at the default precision of 1 ms: 2^19 ns.
const TICK: u64 = 1 << 19;
/// How long a shard goes without an eviction before its writes take due
/// entries, at the default interval (4 ms) and precision (1 ms): 5 ms in
/// whole ticks, 10 of them.
const LAG: u64 = 10 * TICK;
/// Past the timer tick of a deadline of 10 ms (tick 20, at 10.49 ms), and
/// more than LAG since the map was built: a write takes those entries.
const LATE: Duration = Duration::from_millis(16);

/// One shard, no thread: every eviction is a write's or `evict_expired`'s.
fn one_shard(clock: &ManualClock) -> expiremap::Builder<u32, u32> {
    ExpireMap::builder()
        .clock(clock.clone())
        .shards(1)
        .background_eviction(false)
}

fn drain(sub: &mut Subscriber<u32, u32>) -> Vec<expiremap::Event<u32, u32>> {
    std::iter::from_fn(|| sub.try_recv().ok()).collect()
}

#[test]
fn a_put_takes_its_shards_due_entries_with_their_lateness() {
    let clock = ManualClock::new();
    let map = one_shard(&clock).build();
    let mut sub = map.subscribe().unwrap();
    for k in 0..5 {
        map.put(k, k * 10, MS * 10);
    }
    clock.advance(LATE);
    let at = LATE;
    map.put(100, 1, HOUR);
    let events = drain(&mut sub);
    let keys: Vec<u32> = events.iter().map(|e| e.key).collect();
    assert_eq!(keys, vec![0, 1, 2, 3, 4]);
    for e in &events {
        assert_eq!(e.cause, Cause::Expired);
        assert_eq!(e.value, e.key * 10);
        assert_eq!(e.deadline(), MS * 10);
        assert_eq!(e.removed_at(), at);
        assert_eq!(e.lateness(), LATE - MS * 10);
    }
    let s = map.stats();
    assert_eq!((s.evicted, s.evicted_by_writers), (5, 5));
    assert_eq!(s.max_lateness, LATE - MS * 10);
    assert_eq!(map.len(), 1);
    // Each value left once: nothing is left for a pass.
    assert_eq!(map.evict_expired(), 0);
    assert!(drain(&mut sub).is_empty());
}

#[test]
fn a_write_leaves_due_entries_to_the_thread_until_it_is_a_lag_behind() {
    let clock = ManualClock::new();
    let map = one_shard(&clock).build();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, MS * 10);
    clock.advance(MS * 10);
    // A pass at 10 ms (tick 19) finds nothing due: the entry is live at its
    // deadline. Its timer tick is the first starting after it, tick 20.
    assert_eq!(map.evict_expired(), 0);
    assert_eq!(map.get(&1), Some(1), "live at its deadline");
    // The thread is behind once no eviction has run for LAG: from tick 29.
    let takes_at = 19 * TICK + LAG;
    // Expired (reads no longer see it) and due, and the last pass is less
    // than LAG ago: writes leave it, up to the last nanosecond before.
    clock.advance(Duration::from_nanos(takes_at - 1 - 10_000_000));
    map.put(2, 2, HOUR);
    assert_eq!(map.get(&1), None);
    assert!(drain(&mut sub).is_empty());
    assert_eq!(map.stats().evicted_by_writers, 0);
    // At tick 29 the next write takes it.
    clock.advance(Duration::from_nanos(1));
    map.remove(&2);
    let events = drain(&mut sub);
    let expired: Vec<_> = events
        .iter()
        .filter(|e| e.cause == Cause::Expired)
        .collect();
    assert_eq!(expired.len(), 1, "{events:?}");
    assert_eq!(expired[0].key, 1);
    assert_eq!(expired[0].removed_at(), Duration::from_nanos(takes_at));
    assert_eq!(map.stats().evicted_by_writers, 1);
    assert_eq!(map.stats().max_lateness, expired[0].lateness());
}

#[test]
fn evict_expired_takes_a_due_entry_a_write_leaves() {
    let clock = ManualClock::new();
    let map = one_shard(&clock).build();
    map.put(1, 1, MS * 10);
    clock.advance(MS * 10);
    assert_eq!(map.evict_expired(), 0);
    clock.advance(MS * 2);
    map.put(2, 2, HOUR);
    assert_eq!(map.stats().evicted_by_writers, 0);
    assert_eq!(map.evict_expired(), 1);
    assert_eq!(map.len(), 1);
}

#[test]
fn each_write_takes_a_bounded_batch_and_evict_expired_takes_the_rest() {
    let clock = ManualClock::new();
    let map = one_shard(&clock).build();
    let mut sub = map.subscribe().unwrap();
    for k in 0..100 {
        map.put(k, k, MS * 10);
    }
    clock.advance(LATE);
    map.put(1000, 0, HOUR);
    assert_eq!(map.stats().evicted, PER_WRITE as u64);
    assert_eq!(map.len(), 100 - PER_WRITE + 1);
    assert!(map.expire(&1000, HOUR, expiremap::ExpireIf::Always));
    assert_eq!(map.stats().evicted_by_writers, 2 * PER_WRITE as u64);
    assert_eq!(map.evict_expired(), 100 - 2 * PER_WRITE);
    let s = map.stats();
    assert_eq!(
        (s.evicted, s.evicted_by_writers),
        (100, 2 * PER_WRITE as u64)
    );
    // Every value once, in deadline order (here: insertion order).
    let keys: Vec<u32> = drain(&mut sub).iter().map(|e| e.key).collect();
    assert_eq!(keys, (0..100).collect::<Vec<_>>());
    assert_eq!(map.len(), 1);
}

#[test]
fn a_write_moves_an_idle_entry_that_was_read_instead_of_evicting_it() {
    let clock = ManualClock::new();
    let map = one_shard(&clock).time_to_idle(MS * 10).build();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, HOUR);
    map.put(2, 2, HOUR);
    clock.advance(MS * 10);
    assert_eq!(map.get(&1), Some(1)); // idle until 20 ms now
    clock.advance(MS * 6); // 16 ms: 2 has been idle-expired for the lag
    map.put(3, 3, HOUR);
    let keys: Vec<u32> = drain(&mut sub).iter().map(|e| e.key).collect();
    assert_eq!(keys, vec![2]);
    assert_eq!(map.get(&1), Some(1)); // idle until 26 ms now
    assert_eq!(map.stats().evicted_by_writers, 1);
}

#[test]
fn a_bounded_map_evicts_due_entries_as_expired_not_by_size() {
    let clock = ManualClock::new();
    let map = one_shard(&clock).max_entries(10).build();
    let mut sub = map.subscribe().unwrap();
    for k in 0..5 {
        map.put(k, k, MS * 10);
    }
    clock.advance(LATE);
    map.put(50, 50, HOUR);
    let events = drain(&mut sub);
    assert_eq!(events.len(), 5, "{events:?}");
    assert!(events.iter().all(|e| e.cause == Cause::Expired));
    let s = map.stats();
    assert_eq!((s.size_evicted, s.evicted_by_writers), (0, 5));
    assert_eq!(map.len(), 1);
    // The room they held is free again: ten more fit without a size eviction.
    for k in 100..109 {
        map.put(k, k, HOUR);
    }
    assert_eq!(map.stats().size_evicted, 0);
    assert_eq!(map.len(), 10);
}

#[test]
fn a_conditional_put_and_a_load_take_due_entries_too() {
    let clock = ManualClock::new();
    let map = one_shard(&clock).build();
    for k in 0..3 {
        map.put(k, k, MS * 10);
    }
    clock.advance(LATE);
    assert_eq!(map.put_if_absent(10, 10, HOUR), None);
    assert_eq!(map.stats().evicted_by_writers, 3);
    for k in 0..3 {
        map.put(k, k, MS * 10);
    }
    clock.advance(LATE);
    assert_eq!(map.get_or_insert_with(11, HOUR, || 11), 11);
    assert_eq!(map.stats().evicted_by_writers, 6);
    assert_eq!(map.len(), 2);
}

#[test]
fn a_panicking_drop_of_a_taken_value_costs_the_put_nothing() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static DROPPED: AtomicUsize = AtomicUsize::new(0);
    #[derive(Clone)]
    struct Bomb(bool);
    impl Drop for Bomb {
        fn drop(&mut self) {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            if self.0 {
                panic!("bomb");
            }
        }
    }
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, Bomb>::builder()
        .clock(clock.clone())
        .shards(1)
        .background_eviction(false)
        .build();
    map.put(1, Bomb(false), MS);
    map.put(2, Bomb(true), MS);
    map.put(3, Bomb(false), MS);
    clock.advance(LATE);
    let before = DROPPED.load(Ordering::Relaxed);
    assert!(map.put(4, Bomb(false), HOUR).is_none());
    assert_eq!(DROPPED.load(Ordering::Relaxed) - before, 3);
    assert_eq!(map.stats().evicted_by_writers, 3);
    assert_eq!(map.len(), 1);
}

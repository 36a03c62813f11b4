//! What broke: a full map's put refused its new value (or pushed out a
//! live entry) while another shard held expired entries, against "expired
//! entries go first". Each shard keeps a lower bound of when anything in
//! it can expire, which a full put reads to find expired entries in other
//! shards. A put recorded its write deadline there, not the earlier idle
//! deadline (`time_to_idle`), so another shard's idle-expired entries were
//! not seen; and it recorded the start of the timer tick after the
//! deadline, not the deadline, so entries expired within the last tick
//! (invisible to every read) were not seen either. Only the put's own
//! shard took them. The bound is now each entry's effective deadline
//! (idle-capped at the write; accesses only move it later).

use expiremap::{Builder, Cause, ExpireMap, ManualClock, Subscriber};
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3_600);

/// Shard 1's keys: the map picks a shard from hash bits 40 and up, and
/// [`Identity`] hashes a key to itself, so key `S1 | i` lands in shard 1 of
/// two, and a small key in shard 0.
const S1: u64 = 1 << 40;

/// Hashes a `u64` key to itself.
#[derive(Clone, Copy, Default)]
struct Identity;

struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 keys");
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl BuildHasher for Identity {
    type Hasher = IdentityHasher;
    fn build_hasher(&self) -> IdentityHasher {
        IdentityHasher(0)
    }
}

/// A two-shard map of at most 4 entries on `clock`, driven by hand.
fn two_shards(clock: &ManualClock) -> Builder<u64, u64, Identity> {
    ExpireMap::builder()
        .hasher(Identity)
        .clock(clock.clone())
        .shards(2)
        .max_entries(4)
        .background_eviction(false)
}

/// Puts keys 1 and 2 of shard 1 with `ttl1`, then keys 1 and 2 of shard 0
/// with `ttl0`: the map is full.
fn fill(map: &ExpireMap<u64, u64, Identity>, ttl1: Duration, ttl0: Duration) {
    map.put(S1 | 1, 1, ttl1);
    map.put(S1 | 2, 2, ttl1);
    map.put(1, 1, ttl0);
    map.put(2, 2, ttl0);
}

/// Every event now in `sub`, as (key, cause), sorted.
fn drain(sub: &mut Subscriber<u64, u64>) -> Vec<(u64, Cause)> {
    let mut left: Vec<_> = std::iter::from_fn(|| sub.try_recv().ok())
        .map(|e| (e.key, e.cause))
        .collect();
    left.sort_unstable_by_key(|&(k, _)| k);
    left
}

/// The map holds two live entries in shard 0 and two expired ones in
/// shard 1 (not looked at since, so still held): a new key of shard 0
/// takes the room of one of the expired pair, and neither live entry
/// leaves.
fn put_into_shard_0_takes_an_expired_entry(map: &ExpireMap<u64, u64, Identity>) {
    put_into_shard_0_with_ttl_takes_an_expired_entry(map, HOUR);
}

/// [`put_into_shard_0_takes_an_expired_entry`] with the new key's `ttl`.
fn put_into_shard_0_with_ttl_takes_an_expired_entry(
    map: &ExpireMap<u64, u64, Identity>,
    ttl: Duration,
) {
    let mut sub = map.subscribe().unwrap();
    assert_eq!(map.len(), 4, "full");
    map.put(3, 3, ttl);
    assert_eq!(map.get(&3), Some(3), "the new key is stored");
    assert_eq!((map.get(&1), map.get(&2)), (Some(1), Some(2)));
    let left = drain(&mut sub);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        [S1 | 1, S1 | 2].contains(&left[0].0) && left[0].1 == Cause::Expired,
        "{left:?}"
    );
    assert_eq!(map.len(), 4, "the other expired entry is still held");
}

#[test]
fn another_shards_idle_expired_entries_go_first() {
    let clock = ManualClock::new();
    let map = two_shards(&clock)
        .time_to_idle(Duration::from_secs(1))
        .build();
    map.put(S1 | 1, 1, HOUR);
    map.put(S1 | 2, 2, HOUR);
    clock.advance(Duration::from_millis(600));
    map.put(1, 1, HOUR);
    map.put(2, 2, HOUR);
    // 1.2 s: shard 1's pair is idle since 0 s (gone at 1 s), shard 0's
    // since 0.6 s (live until 1.6 s).
    clock.advance(Duration::from_millis(600));
    put_into_shard_0_takes_an_expired_entry(&map);
}

#[test]
fn another_shards_entries_expired_within_the_last_tick_go_first() {
    let clock = ManualClock::new();
    // The default precision: ticks of 524,288 ns, the first from 0.
    let map = two_shards(&clock).build();
    fill(&map, Duration::from_micros(100), HOUR);
    // Past their deadline, within the tick it lies in: not yet due for
    // eviction, but expired for every read.
    clock.advance(Duration::from_micros(200));
    assert_eq!(map.ttl(&(S1 | 1)), None);
    put_into_shard_0_takes_an_expired_entry(&map);
}

/// Shard 0 never held a deadline, so a put there of an entry that never
/// expires decides nothing by the time in its own shard; it still reads
/// the clock while another shard holds deadlines, and takes the room of
/// that shard's expired entries.
#[test]
fn another_shards_expired_entries_go_first_for_a_key_that_never_expires() {
    let clock = ManualClock::new();
    let map = two_shards(&clock).build();
    fill(&map, Duration::from_millis(1), Duration::MAX);
    clock.advance(Duration::from_millis(2));
    put_into_shard_0_with_ttl_takes_an_expired_entry(&map, Duration::MAX);
}

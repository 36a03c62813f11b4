//! loom models of the bulk loads (`get_many_with`): one load flight per
//! missing key, shared with single-key loaders and other bulk calls, a
//! write during the load winning, and no wait while a call holds flights
//! of its own (so two bulk calls over the same keys never wait for each
//! other in a cycle: loom reports a deadlock if they do).
//! See `../README.md` for what each model checks and how long it takes.

use expiremap::{ExpireMap, ManualClock, Update};
use expiremap_loom_tests::{model, thread};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

/// A hasher that is the same in every execution of a model.
type Fixed = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

type Map = Arc<ExpireMap<u32, u32, Fixed>>;

/// A map of `shards` shards on a manual clock, no eviction thread.
fn map(shards: usize) -> Map {
    Arc::new(
        ExpireMap::builder()
            .hasher(Fixed::default())
            .clock(ManualClock::new())
            .shards(shards)
            .background_eviction(false)
            .build(),
    )
}

/// The first key from 10 up in shard `s` of a two-shard map (the `Fixed`
/// hasher's bits 40.. pick the shard, as the map does).
fn key_in(s: u64) -> u32 {
    (10..)
        .find(|&k: &u32| (Fixed::default().hash_one(k) >> 40) & 1 == s)
        .expect("a key")
}

/// Loads counted per key (std atomics: bookkeeping, read after the joins).
#[derive(Default)]
struct Loads([AtomicU32; 2]);

impl Loads {
    fn count(&self, i: usize) {
        self.0[i].fetch_add(1, Ordering::SeqCst);
    }
    fn of(&self, i: usize) -> u32 {
        self.0[i].load(Ordering::SeqCst)
    }
}

/// A bulk load of keys 1 and 2 races a `get_or_insert_with` of key 1 and a
/// `put` of key 2. Key 1 is loaded exactly once in all (by the bulk load,
/// the single-key waiting for it; or by the single-key load, the bulk call
/// waiting for it after its own load of key 2; or either hits the other's
/// stored value), and both callers get that one value. The put stands
/// whatever the order: before the bulk read (a hit), during the bulk load
/// (it wins over the loaded value, which is only returned), or after (it
/// overwrites).
#[test]
fn a_bulk_load_racing_a_single_load_and_a_put() {
    model(|| {
        let map = map(1);
        let loads = Arc::new(Loads::default());
        let single = {
            let (map, loads) = (map.clone(), loads.clone());
            thread::spawn(move || {
                map.get_or_insert_with(1, HOUR, || {
                    loads.count(0);
                    100
                })
            })
        };
        let put = {
            let map = map.clone();
            thread::spawn(move || map.put(2, 30, HOUR))
        };
        let bulk = map.get_many_with(&[1, 2], HOUR, |ks| {
            for &k in ks {
                loads.count(usize::from(k == 2));
            }
            ks.iter().map(|&k| (k, 10 * k)).collect()
        });
        let single = single.join().unwrap();
        put.join().unwrap();
        assert_eq!(loads.of(0), 1, "key 1 loaded {} times", loads.of(0));
        assert!(bulk[0] == 10 || bulk[0] == 100, "{bulk:?}");
        assert_eq!(single, bulk[0]);
        assert_eq!(map.get(&1), Some(bulk[0]));
        assert!(bulk[1] == 20 || bulk[1] == 30, "{bulk:?}");
        assert_eq!(map.get(&2), Some(30));
    });
}

/// Two bulk calls over the same two keys, which lie in different shards,
/// in opposite orders: each may register one key before the other call
/// registers the other. Neither waits while it holds a flight of its own,
/// so neither waits for ever (a deadlock is a loom report); each key is
/// loaded exactly once, and both calls get the same values.
#[test]
fn two_bulk_loads_of_the_same_keys_never_wait_in_a_cycle() {
    model(|| {
        let map = map(2);
        let (a, b) = (key_in(0), key_in(1));
        let loads = Arc::new(Loads::default());
        let call = |keys: [u32; 2], tag: u32| {
            let (map, loads) = (map.clone(), loads.clone());
            move || {
                map.get_many_with(&keys, HOUR, |ks| {
                    for &k in ks {
                        loads.count(usize::from(k == b));
                    }
                    ks.iter().map(|&k| (k, tag)).collect()
                })
            }
        };
        let other = thread::spawn(call([b, a], 2));
        let mine = call([a, b], 1)();
        let other = other.join().unwrap();
        assert_eq!((loads.of(0), loads.of(1)), (1, 1));
        assert_eq!(mine, [other[1], other[0]]);
        assert_eq!(map.get_many(&[a, b]), [Some(mine[0]), Some(mine[1])]);
    });
}

/// An `update` of key 2 that keeps what it finds (`Update::Keep`) races a bulk
/// load of keys 1 and 2 in one shard. If the update runs first, it leaves
/// key 2 absent. Whichever comes first, the bulk call loads both keys with
/// its one `load` and returns their values: a pass that meets the update
/// registers nothing (key 1's flight, registered first, ends at once) and
/// waits for it, then looks again. (Loading key 1 before waiting left key
/// 2 to nobody once the update ended without a value: a panic.)
#[test]
fn a_bulk_load_meeting_an_update_that_leaves_no_value_loads_the_key() {
    model(|| {
        let map = map(1);
        let update = {
            let map = map.clone();
            thread::spawn(move || map.update(2, |_| Update::Keep))
        };
        let bulk = map.get_many_with(&[1, 2], HOUR, |ks| {
            ks.iter().map(|&k| (k, 10 * k)).collect()
        });
        // `Keep` returns what it saw: nothing, or the bulk load's value.
        let kept = update.join().unwrap();
        assert!(kept.is_none() || kept == Some(20), "{kept:?}");
        assert_eq!(bulk, [10, 20]);
        // An update that begins during the load of key 2 wins over it (the
        // loaded value is returned, not stored).
        assert_eq!(map.get(&1), Some(10));
        let two = map.get(&2);
        assert!(two.is_none() || two == Some(20), "{two:?}");
    });
}

//! Bulk reads and loads: `get_many` reads as a loop of `get`s would (exact,
//! an access, counted), and `get_many_with` and its `try_`/async forms make
//! one `load` call for the missing keys nobody else is loading, share
//! flights with single-key loaders, and end every flight whatever `load`
//! does (returns, leaves keys out, fails, panics, is cancelled).

use crate::common::{MS, Rng, block_on, manual};
use expiremap::{BulkError, Cause, ExpireMap, ManualClock};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::task::{Context, Waker};
use std::thread;
use std::time::Duration;

const MINUTE: Duration = Duration::from_secs(60);
/// How long a stuck waiter takes to fail a test; never reached when the
/// map is right, whatever the machine's speed.
const PATIENCE: Duration = Duration::from_secs(120);

/// A hasher that is the same in every run, so that two maps fed the same
/// operations lay their entries out alike.
type Fixed = BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// A `load` that records the keys it is asked for and makes `10 * k`.
fn recording(calls: &Mutex<Vec<Vec<u32>>>) -> impl FnOnce(&[u32]) -> Vec<(u32, u32)> + '_ {
    move |ks: &[u32]| {
        calls.lock().unwrap().push(ks.to_vec());
        ks.iter().map(|&k| (k, 10 * k)).collect()
    }
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
}

#[test]
fn get_many_answers_in_the_keys_order_exactly_at_the_deadline() {
    let (map, clock) = manual::<u32, u32>();
    map.put(1, 10, 5 * MS);
    map.put(2, 20, 10 * MS);
    map.put(3, 30, MINUTE);
    let keys = [3, 9, 1, 2, 3];
    assert_eq!(
        map.get_many(&keys),
        [Some(30), None, Some(10), Some(20), Some(30)]
    );
    clock.advance(5 * MS); // key 1's deadline: still live (inclusive)
    assert_eq!(
        map.get_many(&keys),
        [Some(30), None, Some(10), Some(20), Some(30)]
    );
    clock.advance(Duration::from_nanos(1));
    assert_eq!(
        map.get_many(&keys),
        [Some(30), None, None, Some(20), Some(30)]
    );
    assert_eq!(map.get_many(&[] as &[u32]), []);
    assert_eq!(map.get_many(Vec::<&u32>::new()), []);
}

#[test]
fn get_many_takes_borrowed_keys_and_any_iterator() {
    let map: ExpireMap<String, usize> = ExpireMap::new();
    for w in ["a", "bb", "ccc"] {
        map.put(w.to_string(), w.len(), MINUTE);
    }
    assert_eq!(map.get_many(["ccc", "x", "a"]), [Some(3), None, Some(1)]);
    let owned: Vec<String> = vec!["bb".into(), "a".into()];
    assert_eq!(map.get_many(&owned), [Some(2), Some(1)]);
    assert_eq!(map.get_many(owned.as_slice()), [Some(2), Some(1)]);
    assert_eq!(
        map.get_many(owned.iter().map(String::as_str)),
        [Some(2), Some(1)]
    );
}

/// More keys than one chunk (1,024) and than one shard holds, in several
/// shards, with every tenth key absent and every seventh expired: with 8
/// shards (long groups a shard, each read under one lock), 128 (a few keys
/// a shard, warmed across shards first) and 1,024 (one key a shard; the
/// keys sorted by shard, not counted), in batches of 2 to 3 n keys.
#[test]
fn get_many_reads_large_batches_over_every_shard() {
    for shards in [8, 128, 1024] {
        let clock = ManualClock::new();
        let map: ExpireMap<u64, u64> = ExpireMap::builder()
            .clock(clock.clone())
            .shards(shards)
            .background_eviction(false)
            .build();
        let n = 5_000_u64;
        for k in (0..n).filter(|k| k % 10 != 0) {
            let ttl = if k % 7 == 0 { MS } else { MINUTE };
            map.put(k, k * 2, ttl);
        }
        clock.advance(2 * MS);
        let mut rng = Rng(7);
        for len in [2, 3, 17, 64, 100, 3 * n] {
            let keys: Vec<u64> = (0..len).map(|_| rng.below(n + 100)).collect();
            let want: Vec<Option<u64>> = keys.iter().map(|k| map.get(k)).collect();
            assert_eq!(map.get_many(&keys), want, "{shards} shards, {len} keys");
            if len == 3 * n {
                assert!(want.iter().any(Option::is_some) && want.iter().any(Option::is_none));
            }
        }
    }
}

/// A hook the clock runs once, at its next reading.
type Hook = Box<dyn FnOnce() + Send>;

/// A clock that runs a hook, once, at the first reading after it is armed.
#[derive(Clone, Default)]
struct Hooked {
    time: ManualClock,
    hook: Arc<Mutex<Option<Hook>>>,
}

impl Hooked {
    fn arm(&self, hook: impl FnOnce() + Send + 'static) {
        *self.hook.lock().unwrap() = Some(Box::new(hook));
    }
}

impl expiremap::Clock for Hooked {
    fn now(&self) -> u64 {
        let hook = self.hook.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        self.time.now()
    }
}

/// Without idle expiry `get_many` reads the clock once, after its locks:
/// a value whose deadline is at or after that reading was live when read;
/// any other is read again, by itself. Here the reading comes after the
/// deadline of every key read with 10 ms, and after a write of key 3 for a
/// minute: each 10 ms key reads as expired (as a `get` then would), key
/// 3 reads as its new value, and the keys held for a minute are unchanged.
/// The hook writes from another thread: were the clock read under a shard
/// lock, the write would wait for it and the test fail after `PATIENCE`.
#[test]
fn get_many_proves_each_value_live_at_its_read_or_reads_it_again() {
    for shards in [1, 8, 128] {
        let clock = Hooked::default();
        let map: ExpireMap<u32, u32> = ExpireMap::builder()
            .clock(clock.clone())
            .shards(shards)
            .background_eviction(false)
            .build();
        let keys: Vec<u32> = (0..80).collect();
        for &k in &keys {
            let ttl = if k < 64 { 10 * MS } else { MINUTE };
            map.put(k, k, ttl);
        }
        let (writer, time) = (map.clone(), clock.time.clone());
        clock.arm(move || {
            time.advance(10 * MS + Duration::from_nanos(1));
            let (done, wrote) = mpsc::channel();
            thread::spawn(move || {
                writer.put(3, 33, MINUTE);
                done.send(()).unwrap();
            });
            wrote
                .recv_timeout(PATIENCE)
                .expect("get_many read the clock under a shard lock");
        });
        let want: Vec<Option<u32>> = keys
            .iter()
            .map(|&k| match k {
                3 => Some(33),
                64.. => Some(k),
                _ => None,
            })
            .collect();
        assert_eq!(map.get_many(&keys), want, "{shards} shards");
        assert!(clock.hook.lock().unwrap().is_none(), "the clock was read");
    }
}

/// The same operations, chosen at random, on two maps with idle expiry, a
/// bound, stats and a subscriber: one reads with `get`, the other with
/// `get_many`. Every answer, the stats, the events and what is held at the
/// end agree: `get_many` is an access for idle expiry and for the bound's
/// policy, and counts, exactly as `get` (an entry found expired by its
/// idle time leaves as `Expired` in both).
#[test]
fn get_many_reads_as_a_loop_of_gets() {
    for (idle, stats, bound) in [
        (true, true, true),
        (false, false, true),
        (false, true, false),
        (true, false, false),
    ] {
        let clock = ManualClock::new();
        let build = || {
            let mut b = ExpireMap::<u32, u32>::builder()
                .hasher(Fixed::default())
                .clock(clock.clone())
                .shards(4)
                .record_stats(stats)
                .background_eviction(false);
            if idle {
                b = b.time_to_idle(30 * MS);
            }
            if bound {
                b = b.max_entries(40);
            }
            b.build()
        };
        let (a, b) = (build(), build());
        let (mut sub_a, mut sub_b) = (a.subscribe().unwrap(), b.subscribe().unwrap());
        let mut rng = Rng(42);
        for step in 0..4_000 {
            match rng.below(10) {
                0..=3 => {
                    let (k, ttl) = (
                        rng.below(80) as u32,
                        (1 + rng.below(100)) * MS.as_nanos() as u64,
                    );
                    let ttl = Duration::from_nanos(ttl);
                    assert_eq!(a.put(k, step, ttl), b.put(k, step, ttl), "step {step}");
                }
                4..=8 => {
                    let keys: Vec<u32> = (0..rng.below(12)).map(|_| rng.below(80) as u32).collect();
                    let one_by_one: Vec<Option<u32>> = keys.iter().map(|k| a.get(k)).collect();
                    assert_eq!(one_by_one, b.get_many(&keys), "step {step}");
                }
                _ => clock.advance(Duration::from_nanos(rng.below(8 * MS.as_nanos() as u64))),
            }
        }
        assert_eq!(a.stats().hits, b.stats().hits);
        assert_eq!(a.stats().misses, b.stats().misses);
        assert_eq!(a.stats().size_evicted, b.stats().size_evicted);
        assert_eq!(a.len(), b.len());
        let held = |m: &ExpireMap<u32, u32, Fixed>| {
            let mut v: Vec<(u32, u32)> = m.iter().collect();
            v.sort_unstable();
            v
        };
        assert_eq!(held(&a), held(&b));
        // Each key's events, in order (a batch confirms its idle-expired
        // keys after its reads, so events of different keys may interleave
        // otherwise than in the loop).
        let events = |s: &mut expiremap::Subscriber<u32, u32>| {
            let mut per_key: HashMap<u32, Vec<(u32, Cause)>> = HashMap::new();
            let all: Vec<(u32, u32, Cause)> = std::iter::from_fn(|| s.try_recv().ok())
                .map(|e| (e.key, e.value, e.cause))
                .collect();
            for &(k, v, c) in &all {
                per_key.entry(k).or_default().push((v, c));
            }
            (all, per_key)
        };
        let ((ea, ka), (_, kb)) = (events(&mut sub_a), events(&mut sub_b));
        assert_eq!(ka, kb);
        if idle {
            assert!(ea.iter().any(|e| e.2 == Cause::Expired));
        }
        if stats {
            assert!(b.stats().hits > 0 && b.stats().misses > 0);
        }
    }
}

/// The case: 50 keys, 40 held, 10 missing: one `load` call, which
/// gets exactly those 10; the 50 values come back in order and the 10 are
/// stored for the TTL given.
#[test]
fn fifty_keys_ten_missing_one_load_of_those_ten() {
    let (map, clock) = manual::<u32, u32>();
    let keys: Vec<u32> = (100..150).collect();
    let missing: Vec<u32> = keys.iter().copied().filter(|k| k % 5 == 0).collect();
    assert_eq!(missing.len(), 10);
    for &k in keys.iter().filter(|k| !missing.contains(k)) {
        map.put(k, 10 * k, MINUTE);
    }
    let calls = Mutex::new(Vec::new());
    let got = map.get_many_with(&keys, 20 * MS, recording(&calls));
    let calls = calls.into_inner().unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(sorted(calls[0].clone()), missing);
    assert_eq!(got, keys.iter().map(|k| 10 * k).collect::<Vec<_>>());
    assert_eq!(map.ttl(&missing[0]), Some(20 * MS));
    clock.advance(20 * MS + Duration::from_nanos(1));
    assert_eq!(map.get_many(&missing), vec![None; 10]);
    assert_eq!(map.get(&keys[1]), Some(10 * keys[1]));
}

#[test]
fn no_load_for_an_empty_slice_or_when_every_key_is_live() {
    let (map, _clock) = manual::<u32, u32>();
    let never = |_: &[u32]| -> Vec<(u32, u32)> { panic!("load called") };
    assert_eq!(map.get_many_with(&[], MINUTE, never), Vec::<u32>::new());
    map.put(1, 1, MINUTE);
    map.put(2, 2, MINUTE);
    assert_eq!(map.get_many_with(&[2, 1, 2], MINUTE, never), [2, 1, 2]);
    let r = map.try_get_many_with(&[], MINUTE, |_| Err::<Vec<(u32, u32)>, _>("called"));
    assert_eq!(r, Ok(vec![]));
}

/// A key given many times is loaded once and its value appears at each
/// of its positions.
#[test]
fn duplicate_keys_are_loaded_once() {
    let (map, _clock) = manual::<u32, u32>();
    map.put(2, 20, MINUTE);
    let calls = Mutex::new(Vec::new());
    let got = map.get_many_with(&[1, 2, 1, 3, 1, 2, 3], MINUTE, recording(&calls));
    assert_eq!(got, [10, 20, 10, 30, 10, 20, 30]);
    let calls = calls.into_inner().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(sorted(calls[0].clone()), [1, 3]);
}

/// A key whose `Hash` sends every key to one value: distinct keys of one
/// hash are loaded (and matched to their values) by `Eq`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Collide(u32);

impl Hash for Collide {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u32(7);
    }
}

#[test]
fn keys_of_one_hash_are_told_apart_by_eq() {
    let map: ExpireMap<Collide, u32> = ExpireMap::builder()
        .clock(ManualClock::new())
        .background_eviction(false)
        .build();
    map.put(Collide(2), 200, MINUTE);
    let keys = [Collide(1), Collide(2), Collide(3), Collide(1)];
    let asked = Mutex::new(Vec::new());
    let got = map.get_many_with(&keys, MINUTE, |ks| {
        asked.lock().unwrap().push(ks.to_vec());
        // In reverse, to check the matching is by key, not by order.
        ks.iter().rev().map(|k| (k.clone(), k.0 * 100)).collect()
    });
    assert_eq!(got, [100, 200, 300, 100]);
    let mut asked = asked.into_inner().unwrap();
    assert_eq!(asked.len(), 1);
    asked[0].sort();
    assert_eq!(asked[0], [Collide(1), Collide(3)]);
    assert_eq!(
        map.get_many(&keys),
        [Some(100), Some(200), Some(300), Some(100)]
    );
}

/// All keys in one shard (a one-shard map), and keys spread over many.
#[test]
fn one_shard_and_many_shards() {
    for shards in [1, 64] {
        let map: ExpireMap<u32, u32> = ExpireMap::builder()
            .clock(ManualClock::new())
            .shards(shards)
            .background_eviction(false)
            .build();
        let keys: Vec<u32> = (0..300).collect();
        for k in (0..300).step_by(3) {
            map.put(k, 10 * k, MINUTE);
        }
        let calls = Mutex::new(Vec::new());
        let got = map.get_many_with(&keys, MINUTE, recording(&calls));
        assert_eq!(got, keys.iter().map(|k| 10 * k).collect::<Vec<_>>());
        let calls = calls.into_inner().unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].len(), 200);
    }
}

/// Pairs for keys `load` was not asked for are dropped, not stored; of two
/// pairs for one key, the first is used.
#[test]
fn extra_pairs_are_ignored_and_the_first_pair_of_a_key_wins() {
    let (map, _clock) = manual::<u32, u32>();
    map.put(2, 20, MINUTE);
    let got = map.get_many_with(&[1, 2], MINUTE, |ks| {
        assert_eq!(ks, [1]);
        vec![(9, 90), (1, 10), (2, 99), (1, 11)]
    });
    assert_eq!(got, [10, 20]);
    assert_eq!(map.get_many(&[1, 2, 9]), [Some(10), Some(20), None]);
    assert_eq!(map.len(), 2);
}

/// `load` leaves a key out: the keys it returned are stored, the call
/// panics naming the key's position (not the key), and a caller of the
/// left-out key loads it itself.
#[test]
fn a_key_load_left_out_panics_or_is_missing_and_stores_the_rest() {
    let (map, _clock) = manual::<u32, u32>();
    let r = catch_unwind(AssertUnwindSafe(|| {
        map.get_many_with(&[5, 6, 7], MINUTE, |ks| {
            ks.iter().filter(|&&k| k != 6).map(|&k| (k, k)).collect()
        })
    }));
    let msg = *r.unwrap_err().downcast::<String>().unwrap();
    assert!(
        msg.contains("keys[1]") && msg.contains("did not return"),
        "{msg}"
    );
    assert_eq!(map.get_many(&[5, 6, 7]), [Some(5), None, Some(7)]);
    assert_eq!(map.get_or_insert_with(6, MINUTE, || 60), 60);

    let r = map.try_get_many_with(&[8, 9, 8], MINUTE, |_| Ok::<_, ()>(vec![(9, 90)]));
    assert_eq!(r, Err(BulkError::Missing { index: 0 }));
    assert_eq!(map.get_many(&[8, 9]), [None, Some(90)]);
    assert_eq!(
        BulkError::<&str>::Missing { index: 0 }.to_string(),
        "bulk load returned no value for keys[0]"
    );
}

/// A write of a key during the load wins: the loaded value is returned
/// but not stored. A zero TTL returns the values and stores nothing.
#[test]
fn a_write_during_the_load_wins_and_a_zero_ttl_stores_nothing() {
    let (map, _clock) = manual::<u32, u32>();
    let got = map.get_many_with(&[1, 2], MINUTE, |ks| {
        map.put(2, 99, MINUTE);
        map.remove(&1);
        ks.iter().map(|&k| (k, 10 * k)).collect()
    });
    assert_eq!(got, [10, 20]);
    assert_eq!(map.get_many(&[1, 2]), [None, Some(99)]);

    let got = map.get_many_with(&[3, 4], Duration::ZERO, |ks| {
        ks.iter().map(|&k| (k, k)).collect()
    });
    assert_eq!(got, [3, 4]);
    assert_eq!(map.get_many(&[3, 4]), [None, None]);
}

#[test]
fn a_failed_load_stores_nothing_and_reaches_the_caller() {
    #[derive(Clone, Debug, PartialEq)]
    struct Down(u32);
    impl std::fmt::Display for Down {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "down {}", self.0)
        }
    }
    impl std::error::Error for Down {}
    let (map, _clock) = manual::<u32, u32>();
    map.put(1, 1, MINUTE);
    let r = map.try_get_many_with(&[1, 2, 3], MINUTE, |ks| {
        assert_eq!(sorted(ks.to_vec()), [2, 3]);
        Err(Down(7))
    });
    let e = r.unwrap_err();
    assert_eq!(e, BulkError::Load(Down(7)));
    assert_eq!(e.to_string(), "bulk load failed: down 7");
    assert!(std::error::Error::source(&e).is_some());
    assert_eq!(map.get_many(&[2, 3]), [None, None]);
    // The flights ended: the keys load again.
    assert_eq!(
        map.try_get_many_with(&[2, 3], MINUTE, |ks| Ok::<_, Down>(
            ks.iter().map(|&k| (k, k)).collect()
        )),
        Ok(vec![2, 3])
    );
}

/// `load` panics: the panic reaches the caller, nothing is stored, and
/// every flight has ended, so callers of those keys load them (without
/// waiting for ever).
#[test]
fn a_panicking_load_ends_every_flight() {
    let (map, _clock) = manual::<u32, u32>();
    let map = Arc::new(map);
    let (tx, rx) = mpsc::channel();
    let r = catch_unwind(AssertUnwindSafe(|| {
        map.get_many_with(&[1, 2, 3], MINUTE, |_| {
            // A caller of key 2 comes while the load runs: it waits for
            // this flight, or comes after it ended; either way it loads.
            let m = map.clone();
            let tx = tx.clone();
            thread::spawn(move || tx.send(m.get_or_insert_with(2, MINUTE, || 22)).unwrap());
            panic!("backend exploded")
        })
    }));
    let msg = *r.unwrap_err().downcast::<&str>().unwrap();
    assert_eq!(msg, "backend exploded");
    assert_eq!(rx.recv_timeout(PATIENCE).expect("a waiter hangs"), 22);
    assert_eq!(map.get(&1), None);
    assert_eq!(map.get_or_insert_with(3, MINUTE, || 33), 33);
}

/// A caller waiting for a key the bulk load returned gets its value: the
/// single-key caller starts inside `load` (so the bulk flight is
/// registered) and is let go only after the load ends.
#[test]
fn waiters_of_the_loaded_keys_get_the_values() {
    let (map, _clock) = manual::<u32, u32>();
    let map = Arc::new(map);
    let inits = Arc::new(AtomicU32::new(0));
    let waiter = Mutex::new(None);
    let got = map.get_many_with(&[1, 2], MINUTE, |ks| {
        let (m, inits) = (map.clone(), inits.clone());
        *waiter.lock().unwrap() = Some(thread::spawn(move || {
            m.get_or_insert_with(2, MINUTE, || {
                inits.fetch_add(1, Ordering::SeqCst);
                0
            })
        }));
        ks.iter().map(|&k| (k, 10 * k)).collect()
    });
    assert_eq!(got, [10, 20]);
    let w = waiter.into_inner().unwrap().unwrap();
    assert_eq!(w.join().unwrap(), 20);
    assert_eq!(inits.load(Ordering::SeqCst), 0);
}

/// A key another caller is loading is not handed to `load`: the bulk call
/// loads the rest, then waits for that key and takes its value.
#[test]
fn a_key_loading_elsewhere_is_waited_for_not_loaded() {
    let (map, _clock) = manual::<u32, u32>();
    let map = Arc::new(map);
    let (started_tx, started) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let other = {
        let map = map.clone();
        thread::spawn(move || {
            map.get_or_insert_with(1, MINUTE, || {
                started_tx.send(()).unwrap();
                release_rx.recv_timeout(PATIENCE).unwrap();
                111
            })
        })
    };
    started.recv_timeout(PATIENCE).unwrap();
    let calls = Mutex::new(Vec::new());
    let got = map.get_many_with(&[1, 2, 3], MINUTE, |ks| {
        calls.lock().unwrap().push(ks.to_vec());
        release.send(()).unwrap();
        ks.iter().map(|&k| (k, 10 * k)).collect()
    });
    assert_eq!(got, [111, 20, 30]);
    assert_eq!(sorted(calls.into_inner().unwrap().concat()), [2, 3]);
    assert_eq!(other.join().unwrap(), 111);
}

/// Every key in flight elsewhere, and that load fails with an error of the
/// bulk call's type: the bulk call gets it without loading. With another
/// error type, the bulk call (whose load is not spent) loads the key.
#[test]
fn a_failure_elsewhere_is_shared_or_loaded_again() {
    for same_type in [true, false] {
        let (map, _clock) = manual::<u32, u32>();
        let map = Arc::new(map);
        let (started_tx, started) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let other = {
            let map = map.clone();
            thread::spawn(move || {
                let init = || {
                    started_tx.send(()).unwrap();
                    release_rx.recv_timeout(PATIENCE).unwrap();
                    Err("down")
                };
                match same_type {
                    true => map
                        .try_get_or_insert_with(1, MINUTE, init)
                        .map_err(|e| e.len()),
                    false => map.try_get_or_insert_with(1, MINUTE, || init().map_err(|e| e.len())),
                }
            })
        };
        started.recv_timeout(PATIENCE).unwrap();
        let map2 = map.clone();
        let bulk = thread::spawn(move || {
            map2.try_get_many_with(&[1], MINUTE, |ks| {
                Ok::<_, &str>(ks.iter().map(|&k| (k, 7)).collect())
            })
        });
        // The bulk call waits (or has not looked yet); let the load fail.
        release.send(()).unwrap();
        assert_eq!(other.join().unwrap(), Err(4));
        let r = bulk.join().unwrap();
        match same_type {
            // Waited and shared the error, or came after it and loaded.
            true => assert!(
                r == Err(BulkError::Load("down")) || r == Ok(vec![7]),
                "{r:?}"
            ),
            false => assert_eq!(r, Ok(vec![7])),
        }
    }
}

/// Two threads' `get_many_with` over overlapping key sets, many rounds:
/// each key is loaded exactly once in all, and both see the same values.
#[test]
fn overlapping_bulk_loads_load_each_key_once() {
    let map: Arc<ExpireMap<u32, u32>> = Arc::new(
        ExpireMap::builder()
            .clock(ManualClock::new())
            .shards(4)
            .background_eviction(false)
            .build(),
    );
    let loads: Arc<Mutex<HashMap<u32, u32>>> = Arc::default();
    let round = 64_u32;
    for r in 0..200_u32 {
        let base = r * round;
        let barrier = Arc::new(Barrier::new(2));
        let caller = |keys: Vec<u32>| {
            let (map, loads, barrier) = (map.clone(), loads.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let got = map.get_many_with(&keys, MINUTE, |ks| {
                    let mut l = loads.lock().unwrap();
                    for &k in ks {
                        *l.entry(k).or_default() += 1;
                    }
                    ks.iter().map(|&k| (k, k + 1)).collect()
                });
                (keys, got)
            })
        };
        // Interleaved sets: a's are the even offsets and the middle third,
        // b's the odd ones and the same middle third, in another order.
        let a: Vec<u32> = (0..round)
            .filter(|i| i % 2 == 0 || (20..44).contains(i))
            .map(|i| base + i)
            .collect();
        let b: Vec<u32> = (0..round)
            .rev()
            .filter(|i| i % 2 == 1 || (20..44).contains(i))
            .map(|i| base + i)
            .collect();
        for h in [caller(a), caller(b)] {
            let (keys, got) = h.join().unwrap();
            assert_eq!(got, keys.iter().map(|k| k + 1).collect::<Vec<_>>());
        }
    }
    let loads = loads.lock().unwrap();
    assert_eq!(loads.len(), (200 * round) as usize);
    assert!(loads.values().all(|&n| n == 1), "a key loaded twice");
}

/// A `load` that asks the map for a key it is loading would wait for
/// itself: it panics instead, and the flights end.
#[test]
fn a_load_asking_for_its_own_key_panics_instead_of_hanging() {
    let (map, _clock) = manual::<u32, u32>();
    let r = catch_unwind(AssertUnwindSafe(|| {
        map.get_many_with(&[1, 2], MINUTE, |_| {
            let v = map.get_or_insert_with(2, MINUTE, || 0);
            vec![(1, v), (2, v)]
        })
    }));
    let msg = *r.unwrap_err().downcast::<String>().unwrap();
    assert!(msg.contains("its own key"), "{msg}");
    assert_eq!(
        map.get_many_with(&[1, 2], MINUTE, |ks| ks.iter().map(|&k| (k, k)).collect()),
        [1, 2]
    );
}

/// An entry found expired by its idle time is loaded again, and its old
/// value leaves as `Expired`, as a `get` would have it.
#[test]
fn an_idle_expired_entry_is_loaded_again() {
    let clock = ManualClock::new();
    let map: ExpireMap<u32, u32> = ExpireMap::builder()
        .clock(clock.clone())
        .time_to_idle(10 * MS)
        .record_stats(true)
        .background_eviction(false)
        .build();
    let mut sub = map.subscribe().unwrap();
    map.put(1, 1, MINUTE);
    map.put(2, 2, MINUTE);
    clock.advance(8 * MS);
    assert_eq!(map.get_many(&[2]), [Some(2)]); // an access: 2 lives on
    clock.advance(4 * MS);
    let got = map.get_many_with(&[1, 2], MINUTE, |ks| {
        assert_eq!(ks, [1]);
        vec![(1, 100)]
    });
    assert_eq!(got, [100, 2]);
    let e = sub.try_recv().unwrap();
    assert_eq!((e.key, e.value, e.cause), (1, 1, Cause::Expired));
    let s = map.stats();
    assert_eq!((s.hits, s.misses), (2, 1));
}

#[test]
fn async_bulk_loads_once_and_shares_failures() {
    let (map, _clock) = manual::<u32, u32>();
    map.put(2, 20, MINUTE);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let load = |ks: &[u32]| {
        calls.lock().unwrap().push(ks.to_vec());
        let ks = ks.to_vec();
        async move { ks.into_iter().map(|k| (k, 10 * k)).collect() }
    };
    let got = block_on(map.get_many_with_async(&[1, 2, 3, 1], MINUTE, load));
    assert_eq!(got, [10, 20, 30, 10]);
    assert_eq!(calls.lock().unwrap().len(), 1);
    let r = block_on(map.try_get_many_with_async(&[4, 1], MINUTE, |_| async {
        Err::<Vec<(u32, u32)>, _>(5_u8)
    }));
    assert_eq!(r, Err(BulkError::Load(5)));
    let r =
        block_on(map.try_get_many_with_async(&[4, 1], MINUTE, |_| async { Ok::<_, u8>(vec![]) }));
    assert_eq!(r, Err(BulkError::Missing { index: 0 }));
}

/// Dropping an async bulk call while its `load` runs ends its flights: a
/// caller of one of its keys loads it, and nothing of the dropped load is
/// stored.
#[test]
fn a_cancelled_async_bulk_load_hands_its_keys_over() {
    let (map, _clock) = manual::<u32, u32>();
    {
        let mut fut =
            std::pin::pin!(map.get_many_with_async(&[1, 2], MINUTE, |_| std::future::pending()));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(fut.as_mut().poll(&mut cx).is_pending());
    }
    assert_eq!(map.get_or_insert_with(1, MINUTE, || 11), 11);
    assert_eq!(map.get_many(&[1, 2]), [Some(11), None]);
}

/// Many async bulk callers on a current-thread runtime with overlapping
/// keys and a load that yields: each key is loaded once, and no thread
/// parks (a parked worker would stop the runtime).
#[test]
fn async_bulk_callers_share_loads_on_one_thread() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let map: Arc<ExpireMap<u32, u32>> = Arc::new(ExpireMap::new());
    let loads = Arc::new(Mutex::new(HashMap::<u32, u32>::new()));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..16_u32 {
            let (map, loads) = (map.clone(), loads.clone());
            tasks.push(tokio::spawn(async move {
                let keys: Vec<u32> = (t..t + 8).collect();
                let got = map
                    .get_many_with_async(&keys, MINUTE, |ks| {
                        let ks = ks.to_vec();
                        let loads = loads.clone();
                        async move {
                            tokio::task::yield_now().await;
                            let mut l = loads.lock().unwrap();
                            for &k in &ks {
                                *l.entry(k).or_default() += 1;
                            }
                            ks.into_iter().map(|k| (k, k * 3)).collect()
                        }
                    })
                    .await;
                assert_eq!(got, keys.iter().map(|k| k * 3).collect::<Vec<_>>());
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let loads = loads.lock().unwrap();
    assert_eq!(loads.len(), 23);
    assert!(loads.values().all(|&n| n == 1));
}

#[test]
fn bulk_reads_count_as_gets_in_stats() {
    let map: ExpireMap<u32, u32> = ExpireMap::builder().record_stats(true).build();
    map.put(1, 1, MINUTE);
    assert_eq!(map.get_many(&[1, 2, 1]), [Some(1), None, Some(1)]);
    let s = map.stats();
    assert_eq!((s.hits, s.misses), (2, 1));
    map.get_many_with(&[1, 3], MINUTE, |ks| ks.iter().map(|&k| (k, k)).collect());
    let s = map.stats();
    assert_eq!((s.hits, s.misses), (3, 2));
}

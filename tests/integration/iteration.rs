//! `iter`, `keys` and `retain`:
//!
//! * against a shadow model on a `ManualClock`: `iter` yields exactly the
//!   live entries, each once; `retain` asks `f` about exactly the live
//!   entries, removes exactly those it rejects, and every value leaves by
//!   the door the model says (compared event by event);
//! * writes inside the loop body and inside `f`, to the same key and shard:
//!   no deadlock, entries unchanged throughout are yielded exactly once, and
//!   an entry changed between `f`'s verdict and the removal is kept;
//! * iteration and `retain` while other threads write, expire and evict:
//!   no deadlock, and every value put leaves by exactly one door or is
//!   still held;
//! * a panic in `f` (or in a `Clone` under the read lock) loses nothing and
//!   leaves the map usable.
//!
//! Nothing here depends on wall-clock timing.

use crate::common::seed;
use expiremap::{Cause, Clock, ExpireMap, ManualClock, Subscriber, TryRecvError};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// The map's timer tick for the default precision (1 ms): the largest power
/// of two nanoseconds not above it.
const SHIFT: u32 = 19;

/// A seeded xorshift64 generator.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn scaled(release: usize) -> usize {
    if cfg!(debug_assertions) {
        release / 10
    } else {
        release
    }
}

fn now(clock: &ManualClock) -> u64 {
    clock.now()
}

/// Whether eviction at `now` takes an entry with `deadline` (its timer tick,
/// the first after the deadline, has been reached).
fn evictable(deadline: u64, now: u64) -> bool {
    (deadline >> SHIFT) < now >> SHIFT
}

/// Events received so far (none lost).
fn events(sub: &mut Subscriber<u64, u64>) -> Vec<(u64, u64, Cause)> {
    let mut out = Vec::new();
    loop {
        match sub.try_recv() {
            Ok(e) => out.push((e.key, e.value, e.cause)),
            Err(TryRecvError::Empty | TryRecvError::Closed) => return out,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
}

/// What a shadow map holds for a key.
#[derive(Clone, Copy, Debug)]
struct Entry {
    value: u64,
    deadline: u64,
}

/// The model's live entries at `t`, sorted.
fn live_in(model: &HashMap<u64, Entry>, t: u64) -> Vec<(u64, u64)> {
    let mut live: Vec<(u64, u64)> = model
        .iter()
        .filter(|(_, e)| t <= e.deadline)
        .map(|(&k, e)| (k, e.value))
        .collect();
    live.sort_unstable();
    live
}

/// `f`'s verdict in the shadow test: a function of the key, the value and
/// a per-call salt, so that `retain` calls differ.
fn keeps(salt: u64, key: u64, value: u64) -> bool {
    let x = (key ^ value.rotate_left(17) ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 61) != 0 // rejects about one in eight
}

/// A write takes up to 16 due entries of its shard (`Stats::evicted_by_writers`
/// counts them): after each write, finds them among the events (an
/// `Expired` event of a key whose model entry has that value and is
/// evictable at `t`), moves them from the model to `want`, and keeps every
/// event drained in `got`.
#[allow(clippy::too_many_arguments)]
fn writers_took(
    map: &ExpireMap<u64, u64>,
    sub: &mut Subscriber<u64, u64>,
    model: &mut HashMap<u64, Entry>,
    want: &mut Vec<(u64, u64, Cause)>,
    got: &mut Vec<(u64, u64, Cause)>,
    taken: &mut u64,
    t: u64,
    ctx: &str,
) {
    let now_taken = map.stats().evicted_by_writers;
    if now_taken == *taken {
        return;
    }
    let mut found = 0;
    for (k, v, cause) in events(sub) {
        if cause == Cause::Expired
            && model
                .get(&k)
                .is_some_and(|e| e.value == v && evictable(e.deadline, t))
        {
            model.remove(&k);
            want.push((k, v, cause));
            found += 1;
        }
        got.push((k, v, cause));
    }
    assert_eq!(found, now_taken - *taken, "{ctx}: entries writers took");
    assert!(found <= 16, "{ctx}: one write took {found}");
    *taken = now_taken;
}

/// One seeded run. With `idle` (ns), the map has that time to idle; the
/// run reads nothing between writes (`iter`, `keys` and `retain` are no
/// accesses), so an entry's deadline is `put time + min(ttl, idle)`.
fn shadow(seed: u64, ops: usize, idle: Option<u64>) {
    println!(
        "iteration shadow: seed={seed} ops={ops} idle={idle:?} \
         (rerun with EXPIREMAP_SEED={seed})"
    );
    let mut rng = XorShift::new(seed);
    let clock = ManualClock::starting_at(rng.below(1 << 40));
    let mut builder = ExpireMap::<u64, u64>::builder()
        .clock(clock.clone())
        .shards(1 << rng.below(4))
        .background_eviction(false)
        .publish_removals(true)
        .event_capacity(1 << 20);
    if let Some(d) = idle {
        builder = builder.time_to_idle(Duration::from_nanos(d));
    }
    let map = builder.build();
    let mut sub = map.subscribe().unwrap();
    let mut model: HashMap<u64, Entry> = HashMap::new();
    let mut want: Vec<(u64, u64, Cause)> = Vec::new();
    // Enough keys that shards take several spans.
    let keys = 1 + rng.below(1_500);
    let mut serial = 0u64;
    let (mut got, mut taken) = (Vec::new(), 0u64);
    let leave = |want: &mut Vec<_>, key, old: Entry, t, live_cause| {
        let cause = if t <= old.deadline {
            live_cause
        } else {
            Cause::Expired
        };
        want.push((key, old.value, cause));
    };
    for step in 0..ops {
        let ctx = format!("seed {seed} step {step}");
        let t = now(&clock);
        let key = rng.below(keys);
        match rng.below(100) {
            0..=54 => {
                serial += 1;
                let ttl = 1 + rng.below(40_000_000);
                let live = model.get(&key).filter(|e| t <= e.deadline).map(|e| e.value);
                assert_eq!(
                    map.put(key, serial, Duration::from_nanos(ttl)),
                    live,
                    "{ctx}"
                );
                let new = Entry {
                    value: serial,
                    deadline: t + idle.map_or(ttl, |d| ttl.min(d)),
                };
                if let Some(old) = model.insert(key, new) {
                    leave(&mut want, key, old, t, Cause::Replaced);
                }
                let m = (&mut model, &mut want, &mut got, &mut taken);
                writers_took(&map, &mut sub, m.0, m.1, m.2, m.3, t, &ctx);
            }
            55..=69 => {
                let live = model.get(&key).filter(|e| t <= e.deadline).map(|e| e.value);
                assert_eq!(map.remove(&key), live, "{ctx}");
                if let Some(old) = model.remove(&key) {
                    leave(&mut want, key, old, t, Cause::Removed);
                }
                let m = (&mut model, &mut want, &mut got, &mut taken);
                writers_took(&map, &mut sub, m.0, m.1, m.2, m.3, t, &ctx);
            }
            70..=84 => clock.advance(Duration::from_nanos(rng.below(2_000_000))),
            85..=88 => {
                let n = map.evict_expired();
                let before = model.len();
                model.retain(|&k, e| {
                    let due = evictable(e.deadline, t);
                    if due {
                        want.push((k, e.value, Cause::Expired));
                    }
                    !due
                });
                assert_eq!(n, before - model.len(), "{ctx}: evict_expired");
            }
            89..=95 => {
                let mut got: Vec<(u64, u64)> = map.iter().collect();
                got.sort_unstable();
                let live = live_in(&model, t);
                assert_eq!(got, live, "{ctx}: iter");
                let mut keys: Vec<u64> = map.keys().collect();
                keys.sort_unstable();
                let live_keys: Vec<u64> = live.iter().map(|&(k, _)| k).collect();
                assert_eq!(keys, live_keys, "{ctx}: keys");
            }
            _ => {
                let salt = rng.next();
                let mut asked = Vec::new();
                map.retain(|&k, &v| {
                    asked.push((k, v));
                    keeps(salt, k, v)
                });
                asked.sort_unstable();
                let live = live_in(&model, t);
                assert_eq!(asked, live, "{ctx}: retain asks about each live entry once");
                for (k, v) in live {
                    if !keeps(salt, k, v) {
                        let old = model.remove(&k).unwrap();
                        leave(&mut want, k, old, t, Cause::Removed);
                    }
                }
                assert_eq!(map.len(), model.len(), "{ctx}: len after retain");
            }
        }
    }
    // Everything still held leaves at shutdown, by the door the model says.
    let t = now(&clock);
    for (k, e) in model.drain() {
        leave(&mut want, k, e, t, Cause::Shutdown);
    }
    drop(map);
    got.extend(events(&mut sub));
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got.len(), want.len(), "seed {seed}: event count");
    assert_eq!(got, want, "seed {seed}: every value by its door");
}

#[test]
fn shadow_iter_and_retain_match_the_model() {
    let base = seed(0x17E4);
    for i in 0..4 {
        shadow(base.wrapping_add(i), scaled(40_000), None);
    }
}

/// The same with a time to idle of 1 ns to 40 ms, so that idle expiry
/// decides some deadlines and the TTL others.
#[test]
fn shadow_with_idle_expiry() {
    let base = seed(0x1D1E);
    for i in 0..4 {
        let idle = 1 + XorShift::new(base ^ i).below(40_000_000);
        shadow(base.wrapping_add(i), scaled(20_000), Some(idle));
    }
}

/// A small manual map with one shard (so every key shares it) and removals
/// published.
fn one_shard() -> (ExpireMap<u64, u64>, ManualClock, Subscriber<u64, u64>) {
    let clock = ManualClock::new();
    let map = ExpireMap::builder()
        .clock(clock.clone())
        .shards(1)
        .background_eviction(false)
        .publish_removals(true)
        .event_capacity(1 << 16)
        .build();
    let sub = map.subscribe().unwrap();
    (map, clock, sub)
}

/// The loop body writes to the map (the key it was shown, others in the
/// same shard, new keys) and moves time: no deadlock; every entry the body
/// never touched and that stays live is yielded exactly once; nothing is
/// yielded that was not live in the map at some point of the iteration.
#[test]
fn loop_body_may_write_to_the_same_key_and_shard() {
    let base = seed(0xB0D7);
    for round in 0..8u64 {
        let mut rng = XorShift::new(base.wrapping_add(round));
        let (map, clock, _sub) = one_shard();
        let n = 600;
        let mut serial = 0;
        // Every (key, value) the map held while the iteration ran.
        let mut ever: BTreeSet<(u64, u64)> = BTreeSet::new();
        for k in 0..n {
            serial += 1;
            map.put(k, serial, Duration::from_millis(50 + rng.below(100)));
            ever.insert((k, serial));
        }
        let start = now(&clock);
        let mut touched = BTreeSet::new();
        let mut yielded: BTreeMap<(u64, u64), u32> = BTreeMap::new();
        for (k, v) in &map {
            *yielded.entry((k, v)).or_default() += 1;
            assert_eq!(k, k % (2 * n), "a key the test put");
            match rng.below(6) {
                0 => {
                    // Overwrite the key just shown.
                    serial += 1;
                    map.put(k, serial, Duration::from_millis(100));
                    ever.insert((k, serial));
                    touched.insert(k);
                }
                1 => {
                    // Remove another key of the shard, or put it again.
                    let other = rng.below(2 * n);
                    if rng.below(2) == 0 {
                        map.remove(&other);
                    } else {
                        serial += 1;
                        map.put(other, serial, Duration::from_millis(100));
                        ever.insert((other, serial));
                    }
                    touched.insert(other);
                }
                2 => {
                    assert!(map.get(&k).is_some() || touched.contains(&k));
                    map.touch(&k, Duration::from_millis(200));
                    touched.insert(k);
                }
                3 => clock.advance(Duration::from_micros(rng.below(200))),
                _ => {}
            }
        }
        let end = now(&clock);
        assert!(end - start < 50_000_000, "the first deadline stays ahead");
        for (&(k, v), &count) in &yielded {
            assert!(ever.contains(&(k, v)), "yielded {k}={v}, never held");
            if !touched.contains(&k) {
                assert_eq!(count, 1, "untouched {k} yielded {count} times");
            }
        }
        // Every key put before and untouched since (all live: the shortest
        // TTL is 50 ms) was yielded.
        let seen: BTreeSet<u64> = yielded.keys().map(|&(k, _)| k).collect();
        for k in (0..n).filter(|k| !touched.contains(k)) {
            assert!(seen.contains(&k), "untouched live {k} not yielded");
        }
        assert_eq!(yielded.values().filter(|&&c| c != 1).count(), 0);
    }
}

/// An entry `f` rejects but overwrites (with the same TTL on a clock that
/// has not moved: the same deadline) is kept with its new value; one `f`
/// rejects after writing to *another* key of the shard is removed at once
/// (conflicts are per entry); reads and removals of the key shown work
/// from inside `f`.
#[test]
fn retain_keeps_what_changed_after_the_verdict() {
    let (map, _clock, mut sub) = one_shard();
    let ttl = Duration::from_secs(10);
    for k in 0..10 {
        map.put(k, k, ttl);
    }
    let mut calls: HashMap<u64, u32> = HashMap::new();
    map.retain(|&k, &v| {
        *calls.entry(k).or_default() += 1;
        match k {
            // Rejected, then overwritten with the same deadline (the clock
            // has not moved): the stale verdict does not remove the new
            // value; `f`, asked again, keeps it.
            0 if v == 0 => {
                assert_eq!(map.put(0, 100, ttl), Some(0));
                false
            }
            0 => {
                assert_eq!(v, 100, "asked again about what the entry holds now");
                true
            }
            // A write to another key of the shard: the verdict stands.
            1 => {
                if calls[&1] == 1 {
                    map.put(100, 100, ttl);
                }
                false
            }
            // Removed by `f` itself: nothing left to remove.
            2 => {
                assert_eq!(map.remove(&2), Some(2));
                false
            }
            // Read from inside `f`: kept.
            3 => map.get(&3) == Some(3),
            // Rejected as it is: removed.
            4 | 5 => false,
            _ => true,
        }
    });
    assert_eq!(map.get(&0), Some(100), "changed after the verdict: kept");
    assert_eq!(map.get(&1), None);
    assert_eq!(map.get(&2), None);
    assert_eq!(map.get(&3), Some(3));
    assert_eq!(map.get(&4), None);
    assert_eq!(map.get(&100), Some(100));
    assert_eq!(calls[&0], 2, "asked again about the overwritten entry");
    assert_eq!(
        calls[&1], 1,
        "a write to another key is no change of this one"
    );
    let mut removed: Vec<(u64, u64)> = events(&mut sub)
        .into_iter()
        .filter(|e| e.2 == Cause::Removed)
        .map(|e| (e.0, e.1))
        .collect();
    removed.sort_unstable();
    assert_eq!(removed, [(1, 1), (2, 2), (4, 4), (5, 5)]);
    let mut keys: Vec<u64> = map.keys().collect();
    keys.sort_unstable();
    assert_eq!(keys, [0, 3, 6, 7, 8, 9, 100]);
}

/// An `f` that overwrites the entry it is shown every time it is called
/// never gets its rejection through: after `RETAIN_TRIES` the entry is
/// kept, and `f` was asked that many times.
#[test]
fn retain_gives_up_on_an_entry_that_never_stops_changing() {
    let (map, _clock, _sub) = one_shard();
    map.put(1, 0, Duration::from_secs(10));
    let mut calls = 0;
    map.retain(|_, _| {
        calls += 1;
        map.put(1, calls, Duration::from_secs(10));
        false
    });
    assert_eq!(map.get(&1), Some(8), "kept, with f's last write");
    assert_eq!(calls, 8, "asked RETAIN_TRIES times");
}

/// An entry that expires between `f`'s verdict and the removal leaves as
/// `Expired`, not `Removed`; entries already expired are not shown to `f`.
#[test]
fn retain_hands_an_entry_that_expired_meanwhile_to_expired() {
    let (map, clock, mut sub) = one_shard();
    map.put(1, 10, Duration::from_millis(1));
    map.put(2, 20, Duration::from_millis(5));
    map.put(3, 30, Duration::from_millis(1));
    clock.advance(Duration::from_millis(2)); // 1 and 3 expire
    map.put(3, 31, Duration::from_millis(100)); // 30 leaves as Expired
    let mut shown = Vec::new();
    map.retain(|&k, _| {
        shown.push(k);
        if k == 2 {
            clock.advance(Duration::from_millis(10)); // 2 expires now
        }
        false
    });
    shown.sort_unstable();
    assert_eq!(shown, [2, 3]);
    let mut ev = events(&mut sub);
    ev.sort_unstable();
    assert_eq!(
        ev,
        [
            (2, 20, Cause::Expired),
            (3, 30, Cause::Expired),
            (3, 31, Cause::Removed)
        ]
    );
    assert_eq!(map.len(), 1, "1 waits for eviction");
    assert_eq!(map.iter().count(), 0);
}

/// A value that counts its live copies, and can be told to panic in
/// `clone`.
#[derive(Debug)]
struct Tracked {
    id: u64,
    live: Arc<AtomicI64>,
    panic_on_clone: Arc<AtomicBool>,
}

impl Tracked {
    fn new(id: u64, live: &Arc<AtomicI64>, panic_on_clone: &Arc<AtomicBool>) -> Self {
        live.fetch_add(1, Ordering::SeqCst);
        Self {
            id,
            live: live.clone(),
            panic_on_clone: panic_on_clone.clone(),
        }
    }
}

impl Clone for Tracked {
    fn clone(&self) -> Self {
        if self.panic_on_clone.swap(false, Ordering::SeqCst) {
            panic!("clone panic");
        }
        Tracked::new(self.id, &self.live, &self.panic_on_clone)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A panic in `f` reaches the caller; what was removed before it left by
/// `Removed`, everything else is still held, nothing is lost or doubled,
/// and the map works on (iteration, retain, writes, drop counts).
#[test]
fn a_panic_in_f_loses_nothing_and_leaves_the_map_usable() {
    let live = Arc::new(AtomicI64::new(0));
    let flag = Arc::new(AtomicBool::new(false));
    let clock = ManualClock::new();
    let map = ExpireMap::<u64, Tracked>::builder()
        .clock(clock.clone())
        .shards(4)
        .background_eviction(false)
        .publish_removals(true)
        .event_capacity(1 << 12)
        .build();
    let mut sub = map.subscribe().unwrap();
    let n = 1_000;
    for k in 0..n {
        map.put(k, Tracked::new(k, &live, &flag), Duration::from_secs(60));
    }
    let mut calls = 0;
    let r = catch_unwind(AssertUnwindSafe(|| {
        map.retain(|&k, _| {
            calls += 1;
            assert!(calls != 700, "f panics");
            k % 2 == 1
        })
    }));
    assert!(r.is_err());
    let mut removed = BTreeSet::new();
    while let Ok(e) = sub.try_recv() {
        assert_eq!(e.cause, Cause::Removed);
        assert_eq!(e.key, e.value.id);
        assert_eq!(e.key % 2, 0, "only rejected entries leave");
        assert!(removed.insert(e.key), "{} left twice", e.key);
    }
    assert!(!removed.is_empty(), "spans before the panic were removed");
    let held: BTreeSet<u64> = map.keys().collect();
    assert_eq!(held.len() + removed.len(), n as usize, "each key once");
    assert!(held.is_disjoint(&removed));
    for (k, v) in map.iter() {
        assert_eq!(k, v.id);
    }

    // A `Clone` that panics under the read lock: the iterator's caller
    // sees the panic, and the same iterator then goes on with nothing
    // yielded twice.
    let mut it = map.keys();
    let mut first: Vec<u64> = it.by_ref().take(10).collect();
    let mut vals = map.iter();
    flag.store(true, Ordering::SeqCst);
    assert!(catch_unwind(AssertUnwindSafe(|| vals.next())).is_err());
    let mut after: Vec<u64> = vals
        .map(|(k, v)| {
            assert_eq!(k, v.id);
            k
        })
        .collect();
    after.sort_unstable();
    after.dedup();
    assert_eq!(
        after.len(),
        held.len(),
        "a panicked span is read again whole"
    );
    first.extend(it);
    first.sort_unstable();
    assert_eq!(first, held.iter().copied().collect::<Vec<_>>());

    // Still usable.
    map.put(
        5_000,
        Tracked::new(5_000, &live, &flag),
        Duration::from_secs(1),
    );
    map.retain(|_, _| false);
    assert!(map.is_empty());
    drop(map);
    drop(sub);
    assert_eq!(live.load(Ordering::SeqCst), 0, "every copy dropped once");
}

/// Iteration and `retain` race writers, expiry and eviction on a shared
/// `ManualClock`: nothing deadlocks, iterators see each value at most once
/// per pass and only with its own key, and every value put leaves by
/// exactly one door (all are published) or is still held at shutdown.
#[test]
fn iteration_and_retain_while_others_write_conserve_every_value() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u64, u64>::builder()
        .clock(clock.clone())
        .shards(4)
        .publish_removals(true)
        .event_capacity(1 << 20)
        .build();
    let mut sub = map.subscribe().unwrap();
    let keys = 400u64;
    let writers = 3u64;
    let ops = scaled(40_000) as u64;
    // A value encodes its key: `id * keys + key`.
    let next_id = AtomicU64::new(1);
    let stop = AtomicBool::new(false);
    let mut returned: Vec<u64> = Vec::new();
    let mut retain_rounds = 0;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..writers)
            .map(|t| {
                let (map, next_id) = (&map, &next_id);
                s.spawn(move || {
                    let mut rng = XorShift::new(seed(0xC0) + t);
                    let mut mine = Vec::new();
                    for _ in 0..ops {
                        let key = rng.below(keys);
                        if rng.below(4) == 0 {
                            mine.extend(map.remove(&key));
                        } else {
                            let id = next_id.fetch_add(1, Ordering::SeqCst);
                            let ttl = Duration::from_micros(1 + rng.below(3_000));
                            mine.extend(map.put(key, id * keys + key, ttl));
                        }
                    }
                    mine
                })
            })
            .collect();
        let driver = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                clock.advance(Duration::from_micros(100));
                map.evict_expired();
                std::thread::yield_now();
            }
        });
        let iterator = s.spawn(|| {
            let mut passes = 0;
            while !stop.load(Ordering::Relaxed) || passes < 3 {
                let mut seen = BTreeSet::new();
                for (k, v) in &map {
                    assert_eq!(v % keys, k, "a value under another key");
                    assert!(seen.insert(v), "value {v} yielded twice in one pass");
                    // The body uses the map, the same key included.
                    let _ = map.get(&k);
                }
                passes += 1;
            }
            passes
        });
        let retainer = s.spawn(|| {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) || rounds < 3 {
                map.retain(|&k, &v| {
                    assert_eq!(v % keys, k);
                    let _ = map.contains_key(&k);
                    (v / keys) % 5 != 0
                });
                rounds += 1;
            }
            rounds
        });
        for h in handles {
            returned.extend(h.join().unwrap());
        }
        stop.store(true, Ordering::Relaxed);
        driver.join().unwrap();
        assert!(iterator.join().unwrap() >= 3);
        retain_rounds = retainer.join().unwrap();
    });
    assert!(retain_rounds >= 3);
    // With nobody else writing, a retain removes every rejected entry (a
    // fresh put of every key makes sure there are some), and expiry takes
    // the rest: every door is used whatever the threads' timing was.
    for key in 0..keys {
        let id = next_id.fetch_add(1, Ordering::SeqCst);
        returned.extend(map.put(key, id * keys + key, Duration::from_secs(1)));
    }
    map.retain(|_, &v| (v / keys) % 5 != 0);
    for (_, v) in map.iter() {
        assert_ne!(
            (v / keys) % 5,
            0,
            "a rejected entry survived a quiet retain"
        );
    }
    assert_eq!(map.len(), (keys - keys / 5) as usize);
    clock.advance(Duration::from_secs(2));
    map.evict_expired();
    drop(map);
    let mut by_cause: HashMap<Cause, Vec<u64>> = HashMap::new();
    loop {
        match sub.try_recv() {
            Ok(e) => {
                assert_eq!(e.value % keys, e.key);
                by_cause.entry(e.cause).or_default().push(e.value);
            }
            Err(TryRecvError::Closed) => break,
            Err(e) => panic!("lost events: {e:?}"),
        }
    }
    let take = |c| by_cause.get(&c).cloned().unwrap_or_default();
    let removed = take(Cause::Removed);
    assert!(!removed.is_empty() && !take(Cause::Expired).is_empty());
    // Every returned value was published as Removed or Replaced; the other
    // Removed events are retain's, each of a value `f` rejected.
    let mut returned_sorted = returned.clone();
    returned_sorted.sort_unstable();
    let mut published: Vec<u64> = removed
        .iter()
        .chain(&take(Cause::Replaced))
        .copied()
        .collect();
    published.sort_unstable();
    let mut by_retain = Vec::new();
    let mut r = returned_sorted.iter().peekable();
    for &v in &published {
        if r.peek() == Some(&&v) {
            r.next();
        } else {
            by_retain.push(v);
        }
    }
    assert_eq!(r.next(), None, "a returned value was not published");
    assert!(!by_retain.is_empty(), "retain removed something");
    for v in &by_retain {
        assert_eq!((v / keys) % 5, 0, "retain removed {v}, which f kept");
        assert!(removed.contains(v), "retain's removals leave as Removed");
    }
    // Conservation: every value put left by exactly one door.
    let mut all: Vec<u64> = by_cause.values().flatten().copied().collect();
    let total = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), total, "a value left by two doors");
    let put = next_id.load(Ordering::SeqCst) - 1;
    assert_eq!(total as u64, put, "every value put is accounted for once");
}

/// With `time_to_idle`, iteration and `retain` judge liveness by the
/// effective deadline (`min(write deadline, last access + idle)`), and
/// neither counts as an access.
#[test]
fn idle_expiry_decides_what_is_live_and_iteration_is_no_access() {
    let ms = Duration::from_millis;
    let clock = ManualClock::new();
    let map = ExpireMap::<&str, u32>::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .publish_removals(true)
        .time_to_idle(ms(10))
        .build();
    let mut sub = map.subscribe().unwrap();
    for (k, v) in [("a", 1), ("b", 2), ("c", 3)] {
        map.put(k, v, Duration::from_secs(3600));
    }
    clock.advance(ms(8));
    assert_eq!(map.get("a"), Some(1)); // idle until 18 ms
    assert_eq!(map.get("c"), Some(3)); // idle until 18 ms
    clock.advance(ms(4)); // 12 ms: "b" idle since 0, expired
    let mut seen: Vec<(&str, u32)> = map.iter().collect();
    seen.sort_unstable();
    assert_eq!(seen, [("a", 1), ("c", 3)]);
    let mut shown = Vec::new();
    map.retain(|&k, _| {
        shown.push(k);
        k != "c"
    });
    shown.sort_unstable();
    assert_eq!(shown, ["a", "c"], "an idle-expired entry is not shown to f");
    let e = sub.try_recv().unwrap();
    assert_eq!((e.key, e.value, e.cause), ("c", 3, Cause::Removed));
    // Neither the iteration nor `retain` was an access: "a" is idle from
    // 8 ms and gone after 18 ms.
    clock.advance(ms(6)); // 18 ms
    assert_eq!(map.keys().collect::<Vec<_>>(), ["a"]);
    clock.advance(Duration::from_nanos(1));
    assert_eq!(map.iter().count(), 0);
    assert_eq!(map.len(), 2, "a and b wait for eviction");
}

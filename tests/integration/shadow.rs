//! Shadow-map tests (the ExpireMap seed's method, made exact):
//!
//! * single-threaded on a `ManualClock`: 1,000,000 seeded random operations
//!   (release builds), every result and every event compared with a plain
//!   model;
//! * multi-threaded on the real clock (see `common/shadow_mt.rs`);
//! * expiration: put, wait for the events, `len() == 0`;
//! * conservation: every value put leaves by exactly one door.

#[path = "../common/shadow_mt.rs"]
mod shadow_mt;

use crate::common::{Racers, Rng, seed};
use expiremap::{
    Cause, ExpireIf, ExpireMap, ManualClock, Subscriber, SystemClock, TryRecvError, Update,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const P: u64 = 1_000_000; // default precision, ns
/// The map's timer tick for the default precision: the largest power of two
/// nanoseconds not above 1 ms.
const SHIFT: u32 = 19;

#[derive(Clone, Copy, Debug)]
struct Model {
    value: u64,
    /// The deadline the last write set.
    deadline: u64,
    /// The last access (write or reading hit), and the time to idle
    /// (`u64::MAX`: none).
    access: u64,
    idle: u64,
}

/// The model's map. Its hasher is fixed, so that the order it iterates in
/// (which picks the clock advances) is the same in every run of a seed.
type Models =
    HashMap<u64, Model, std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>>;

impl Model {
    /// The effective deadline: live while `t <= until()`.
    fn until(&self) -> u64 {
        self.deadline.min(self.access.saturating_add(self.idle))
    }
}

/// Whether eviction at `now` takes an entry with `deadline`: its timer tick,
/// the first tick after the deadline, has been reached.
/// At the clock's last instant, `u64::MAX`, every deadline but `u64::MAX`
/// (saturated: live forever) is due, the last tick's included.
fn evictable(deadline: u64, now: u64) -> bool {
    (deadline >> SHIFT) < now >> SHIFT || (now == u64::MAX && deadline < u64::MAX)
}

/// What a store of `value` for `key` until `deadline` at time `t` does to
/// the model: the old value, if any, leaves as `Replaced` if it was live,
/// else as `Expired`.
fn store(
    model: &mut Models,
    events: &mut Vec<(u64, u64, Cause)>,
    (key, value, deadline, t): (u64, u64, u64, u64),
    idle: u64,
) {
    let new = Model {
        value,
        deadline,
        access: t,
        idle,
    };
    if let Some(old) = model.insert(key, new) {
        let cause = if t <= old.until() {
            Cause::Replaced
        } else {
            Cause::Expired
        };
        events.push((key, old.value, cause));
    }
}

/// What a removal of `key` at time `t` does to the model: the value, if
/// any, leaves as `Removed` if it was live, else as `Expired`.
fn remove(model: &mut Models, events: &mut Vec<(u64, u64, Cause)>, key: u64, t: u64) {
    if let Some(old) = model.remove(&key) {
        let cause = if t <= old.until() {
            Cause::Removed
        } else {
            Cause::Expired
        };
        events.push((key, old.value, cause));
    }
}

/// What a read at time `t` does to an entry expired by its idle time alone
/// (its write deadline not passed): it removes it, and the value leaves as
/// `Expired` (see `Builder::time_to_idle`).
fn read_expired(model: &mut Models, events: &mut Vec<(u64, u64, Cause)>, key: u64, t: u64) {
    if model
        .get(&key)
        .is_some_and(|m| t > m.until() && t <= m.deadline)
    {
        let old = model.remove(&key).expect("just seen");
        events.push((key, old.value, Cause::Expired));
    }
}

/// The events received so far; checks that no `Expired` event left at or
/// before its deadline.
fn events(sub: &mut Subscriber<u64, u64>) -> Vec<(u64, u64, Cause)> {
    let mut out = Vec::new();
    loop {
        match sub.try_recv() {
            Ok(e) => {
                if e.cause == Cause::Expired {
                    assert!(e.removed_at() > e.deadline(), "evicted early: {e:?}");
                }
                out.push((e.key, e.value, e.cause));
            }
            Err(TryRecvError::Empty) => return out,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
}

fn single_threaded(seed: u64, ops: usize) {
    single_threaded_with(seed, ops, ahash::RandomState::new(), 0, 40, 0, None, None);
}

/// A hasher whose hashes share few values in their low 32 bits (the bits a
/// shard's table works from) while the bits that pick the shard vary: long
/// probe clusters, wrap-around and backward-shift deletion on every path
/// (put, overwrite, remove, touch, eviction).
#[derive(Clone, Copy)]
struct Colliding {
    /// Distinct low-32-bit values.
    low: u64,
}

impl std::hash::BuildHasher for Colliding {
    type Hasher = CollidingHasher;
    fn build_hasher(&self) -> CollidingHasher {
        CollidingHasher {
            low: self.low,
            h: 0,
        }
    }
}

struct CollidingHasher {
    low: u64,
    h: u64,
}

impl std::hash::Hasher for CollidingHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.h = (self.h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3);
        }
    }
    fn finish(&self) -> u64 {
        (self.h & !0xFFFF_FFFF) | (self.h % self.low)
    }
}

/// One seeded run; the clock starts `rng.below(1 << spread)` ns after
/// `origin` (an origin near `u64::MAX` runs into the end of time).
///
/// With `evictors > 0` the background thread runs and that many threads
/// call `evict_expired` in a loop, racing the driven operations. Every
/// result is still exact (no read depends on whether an expired entry was
/// evicted yet) and every value still leaves by the door the model says (an
/// expired value leaves as `Expired` whoever takes it); only when eviction
/// happens is open, so events are compared as a whole at the end, and
/// `evict_expired`'s count, `len` and `next_expiry` are checked for what
/// holds under the race.
///
/// With a `bound`, the map is built with `max_entries(bound)`. Which entries
/// its policy pushes out is not modelled: the model learns it from the
/// events (every entry of another key that left during an operation left
/// by `Size`, or by `Expired` if past its deadline; a refused new value
/// leaves by `Size`), and checks everything else exactly, and `len()`
/// against the bound after every operation.
// Each argument is one axis the runs below vary.
#[allow(clippy::too_many_arguments)]
fn single_threaded_with<S>(
    seed: u64,
    ops: usize,
    hasher: S,
    origin: u64,
    spread: u32,
    evictors: usize,
    bound: Option<u64>,
    idle: Option<u64>,
) where
    S: std::hash::BuildHasher + Send + Sync + 'static,
{
    println!(
        "shadow single-threaded: seed={seed} ops={ops} evictors={evictors} \
         (rerun with EXPIREMAP_SEED={seed})"
    );
    let racing = evictors > 0;
    assert!(!(racing && bound.is_some()), "one or the other");
    let mut rng = Rng(seed);
    let clock = ManualClock::starting_at(origin.saturating_add(rng.below(1 << spread)));
    let mut builder = ExpireMap::<u64, u64>::builder()
        .hasher(hasher)
        .clock(clock.clone())
        .background_eviction(racing)
        .publish_removals(true)
        .event_capacity(1 << 20)
        .shards(1 << rng.below(4));
    if let Some(n) = bound {
        builder = builder.max_entries(n);
    }
    if let Some(d) = idle {
        builder = builder.time_to_idle(Duration::from_nanos(d));
    }
    let idle = idle.unwrap_or(u64::MAX);
    let map = Arc::new(builder.build());
    let mut sub = map.subscribe().unwrap();
    let racers = Racers::spawn(&map, evictors);
    // In a race, every event seen and every event the model expects.
    let (mut seen, mut owed) = (Vec::new(), Vec::new());
    let mut model = Models::default();
    let keys = 1 + rng.below(300);
    let mut serial = 0u64;
    let now = || clock_now(&clock);

    for step in 0..ops {
        let ctx = format!("seed {seed} step {step}");
        let key = rng.below(keys);
        let t = now();
        let live = model.get(&key).filter(|m| t <= m.until()).copied();
        // A read that counts as an access: the model's entry was read at `t`.
        let accessed = |model: &mut Models| {
            if let Some(m) = model.get_mut(&key).filter(|m| t <= m.until()) {
                m.access = t;
            }
        };
        let ttl = match rng.below(40) {
            0 => Duration::ZERO,
            1 => Duration::MAX,
            2 => Duration::from_millis(rng.below(50)),
            _ => Duration::from_nanos(1 + rng.below(60 * P)),
        };
        let ttl_ns = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
        let mut expected_events = Vec::new();
        // The model's side of a store of this step's `serial` for `key`.
        macro_rules! stored {
            ($deadline:expr) => {
                store(
                    &mut model,
                    &mut expected_events,
                    (key, serial, $deadline, t),
                    idle,
                )
            };
        }
        match rng.below(100) {
            0..=4 => {
                // put_if_absent: stores only over an absent or expired entry.
                serial += 1;
                let r = map.put_if_absent(key, serial, ttl);
                assert_eq!(r, live.map(|m| m.value), "{ctx}: put_if_absent");
                if ttl.is_zero() {
                    // Only a read, then.
                    read_expired(&mut model, &mut expected_events, key, t);
                } else if live.is_none() {
                    let deadline = t.saturating_add(ttl_ns);
                    stored!(deadline);
                }
            }
            5..=29 => {
                serial += 1;
                let r = map.put(key, serial, ttl);
                if ttl.is_zero() {
                    assert_eq!(r, None, "{ctx}: zero-ttl put");
                } else {
                    assert_eq!(r, live.map(|m| m.value), "{ctx}: put");
                    let deadline = t.saturating_add(ttl_ns);
                    stored!(deadline);
                }
            }
            30..=44 => {
                assert_eq!(map.get(&key), live.map(|m| m.value), "{ctx}: get");
                accessed(&mut model);
                read_expired(&mut model, &mut expected_events, key, t);
            }
            45..=49 => {
                // get_or_insert_with, or try_ with an init that may fail: a
                // hit returns the live value and runs no init; a miss loads,
                // and stores unless the TTL is zero or the init failed.
                serial += 1;
                let mut ran = false;
                let try_ = rng.below(2) == 1;
                let fails = try_ && rng.below(3) == 0;
                let r = if !try_ {
                    Ok(map.get_or_insert_with(key, ttl, || {
                        ran = true;
                        serial
                    }))
                } else {
                    map.try_get_or_insert_with(key, ttl, || {
                        ran = true;
                        if fails { Err("failed") } else { Ok(serial) }
                    })
                };
                assert_eq!(ran, live.is_none(), "{ctx}: init ran on a hit");
                accessed(&mut model);
                read_expired(&mut model, &mut expected_events, key, t);
                let failed = ran && fails;
                let want = match live {
                    Some(m) => Ok(m.value),
                    None if failed => Err("failed"),
                    None => Ok(serial),
                };
                assert_eq!(r, want, "{ctx}: get_or_insert_with");
                if live.is_none() && !ttl.is_zero() && !failed {
                    let deadline = t.saturating_add(ttl_ns);
                    stored!(deadline);
                }
            }
            50..=52 => {
                // An access: the time left counts from this read.
                accessed(&mut model);
                read_expired(&mut model, &mut expected_events, key, t);
                let now_live = model.get(&key).filter(|m| t <= m.until());
                assert_eq!(
                    map.get_with_ttl(&key),
                    now_live.map(|m| (m.value, Duration::from_nanos(m.until() - t))),
                    "{ctx}: get_with_ttl"
                );
            }
            53..=54 => {
                // replace: only over a live entry; the old value is
                // returned (and published as `Replaced`).
                serial += 1;
                let r = map.replace(&key, serial, ttl);
                if ttl.is_zero() {
                    assert_eq!(r, None, "{ctx}: zero-ttl replace");
                } else {
                    assert_eq!(r, live.map(|m| m.value), "{ctx}: replace");
                    if live.is_some() {
                        let deadline = t.saturating_add(ttl_ns);
                        stored!(deadline);
                    }
                }
            }
            55..=59 => {
                assert_eq!(
                    map.ttl(&key),
                    live.map(|m| Duration::from_nanos(m.until() - t)),
                    "{ctx}: ttl"
                );
                read_expired(&mut model, &mut expected_events, key, t);
            }
            60..=61 => {
                assert_eq!(
                    map.contains_key(&key),
                    live.is_some(),
                    "{ctx}: contains_key"
                );
                read_expired(&mut model, &mut expected_events, key, t);
            }
            62 => {
                // update: shown the live entry exactly; keep, remove, set or
                // set keeping the deadline.
                serial += 1;
                let choice = rng.below(4);
                let mut shown = None;
                let r = map.update(key, |seen| {
                    shown = Some(seen.map(|(v, left)| (*v, left)));
                    match choice {
                        0 => Update::Keep,
                        1 => Update::Remove,
                        2 => Update::Set(serial, ttl),
                        _ => Update::SetKeepTtl(serial),
                    }
                });
                let want_shown = live.map(|m| (m.value, Duration::from_nanos(m.until() - t)));
                assert_eq!(shown, Some(want_shown), "{ctx}: update showed");
                read_expired(&mut model, &mut expected_events, key, t);
                let (want, new) = match (choice, live) {
                    (0, l) => (l.map(|m| m.value), None),
                    (1, _) => (None, None),
                    (2, _) if ttl.is_zero() => (live.map(|m| m.value), None),
                    (2, _) => (Some(serial), Some(t.saturating_add(ttl_ns))),
                    (_, Some(m)) => (Some(serial), Some(m.deadline)),
                    (_, None) => (None, None),
                };
                assert_eq!(r, want, "{ctx}: update");
                match (choice, new) {
                    (_, Some(deadline)) => {
                        stored!(deadline);
                    }
                    (1, _) => remove(&mut model, &mut expected_events, key, t),
                    _ => {}
                }
            }
            63..=71 => {
                let r = map.remove(&key);
                assert_eq!(r, live.map(|m| m.value), "{ctx}: remove");
                remove(&mut model, &mut expected_events, key, t);
            }
            72..=77 => {
                // touch, or expire with a condition.
                let new = t.saturating_add(ttl_ns);
                let (r, holds) = match rng.below(4) {
                    0 => (map.touch(&key, ttl), true),
                    1 => (map.expire(&key, ttl, ExpireIf::Always), true),
                    2 => (
                        map.expire(&key, ttl, ExpireIf::Later),
                        live.is_some_and(|m| new > m.until()),
                    ),
                    _ => (
                        map.expire(&key, ttl, ExpireIf::Earlier),
                        live.is_some_and(|m| new < m.until()),
                    ),
                };
                let should = live.is_some() && !ttl.is_zero() && holds;
                assert_eq!(r, should, "{ctx}: touch/expire");
                if should {
                    model.get_mut(&key).unwrap().deadline = new;
                }
            }
            78..=89 => {
                let by = match rng.below(6) {
                    // Rarely, to the end of time.
                    0 if rng.below(5_000) == 0 => u64::MAX,
                    0 => 0,
                    1 => 1,
                    2 => {
                        // exactly to, or just past, some entry's deadline
                        let d = model
                            .values()
                            .nth(rng.below(model.len() as u64 + 1) as usize);
                        d.map_or(0, |m| m.until().saturating_sub(t) + rng.below(2))
                            .min(1 << 40)
                    }
                    _ => rng.below(20 * P),
                };
                clock.advance(Duration::from_nanos(by));
            }
            90..=96 => {
                let due: Vec<u64> = model
                    .iter()
                    .filter(|(_, m)| evictable(m.until(), t))
                    .map(|(&k, _)| k)
                    .collect();
                let n = map.evict_expired();
                if racing {
                    // The racers may have taken some; the model keeps them
                    // (they leave as `Expired` whoever takes them).
                    assert!(n <= due.len(), "{ctx}: evicted {n} of {} due", due.len());
                    continue;
                }
                assert_eq!(n, due.len(), "{ctx}: evict_expired count");
                let mut got = events(&mut sub);
                let mut want: Vec<_> = due
                    .iter()
                    .map(|k| (*k, model.remove(k).unwrap().value, Cause::Expired))
                    .collect();
                got.sort_unstable();
                want.sort_unstable();
                assert_eq!(got, want, "{ctx}: evicted set");
            }
            97 if racing => {
                // What holds in a race: nothing held means no work.
                if map.is_empty() {
                    assert_eq!(map.next_expiry(), None, "{ctx}: empty map has work");
                }
            }
            97 => {
                // next_expiry is a hint no later than the first eviction
                // tick; `None` only when nothing held will ever expire.
                let first = model
                    .values()
                    .filter(|m| m.until() < u64::MAX)
                    .map(|m| {
                        let tick = (m.until() >> SHIFT) + 1;
                        if tick > u64::MAX >> SHIFT {
                            u64::MAX
                        } else {
                            tick << SHIFT
                        }
                    })
                    .min();
                match (map.next_expiry(), first) {
                    (None, None) => {}
                    (Some(w), Some(f)) => assert!(
                        w.as_nanos() as u64 <= f.saturating_sub(t),
                        "{ctx}: next_expiry {w:?} later than {f} - {t}"
                    ),
                    // Work on saturated entries (moving them down the
                    // wheel) may still be planned; never at the end of time.
                    (Some(_), None) => assert!(
                        !model.is_empty() && t < u64::MAX,
                        "{ctx}: next_expiry with nothing to expire"
                    ),
                    (a, b) => panic!("{ctx}: next_expiry {a:?} vs model {b:?}"),
                }
            }
            98 => {
                if rng.below(20) == 0 {
                    map.clear();
                    let mut want: Vec<_> = model
                        .drain()
                        .map(|(k, m)| {
                            (
                                k,
                                m.value,
                                if t <= m.until() {
                                    Cause::Removed
                                } else {
                                    Cause::Expired
                                },
                            )
                        })
                        .collect();
                    if racing {
                        owed.append(&mut want);
                        continue;
                    }
                    let mut got = events(&mut sub);
                    got.sort_unstable();
                    want.sort_unstable();
                    assert_eq!(got, want, "{ctx}: clear");
                }
            }
            _ if racing => {
                // Held: at least the live entries, at most the model's.
                let live = model.values().filter(|m| t <= m.until()).count();
                let len = map.len();
                assert!(live <= len && len <= model.len(), "{ctx}: len {len}");
            }
            _ => assert_eq!(map.len(), model.len(), "{ctx}: len"),
        }
        if racing {
            owed.append(&mut expected_events);
            seen.append(&mut events(&mut sub));
        } else if let Some(n) = bound {
            let mut own = Vec::new();
            for (k, v, cause) in events(&mut sub) {
                // This key's own (an expired value of it that the model
                // does not expect was taken from the due entries, below).
                if k == key && (cause != Cause::Expired || expected_events.contains(&(k, v, cause)))
                {
                    own.push((k, v, cause));
                    continue;
                }
                // Pushed out to make room for this operation's key, or taken
                // by its write from the shard's due entries.
                let m = model
                    .remove(&k)
                    .unwrap_or_else(|| panic!("{ctx}: {k} left twice"));
                assert_eq!(m.value, v, "{ctx}: key {k}");
                match cause {
                    Cause::Expired => assert!(t > m.until(), "{ctx}: {k} not expired"),
                    Cause::Size => assert!(t <= m.until(), "{ctx}: {k} expired, left as Size"),
                    c => panic!("{ctx}: {k} left by {c:?}"),
                }
            }
            // This put's own value, refused.
            if let Some(at) = own.iter().position(|&e| e == (key, serial, Cause::Size)) {
                own.remove(at);
                assert_eq!(model.remove(&key).map(|m| m.value), Some(serial), "{ctx}");
            }
            assert_eq!(own, expected_events, "{ctx}: events");
            let len = map.len();
            assert!(len as u64 <= n, "{ctx}: len {len} over the bound {n}");
            assert_eq!(len, model.len(), "{ctx}: len");
        } else {
            let mut own = Vec::new();
            for (k, v, cause) in events(&mut sub) {
                if expected_events.get(own.len()) == Some(&(k, v, cause)) {
                    own.push((k, v, cause));
                    continue;
                }
                // Taken by this operation's write from its shard's due
                // entries (the thread was behind: here there is none).
                // Which ones is not modelled (the lag and the batch are
                // `tests/integration/writer_eviction.rs`'s); that each was due is.
                let m = model
                    .remove(&k)
                    .unwrap_or_else(|| panic!("{ctx}: {k} left twice"));
                assert_eq!((m.value, cause), (v, Cause::Expired), "{ctx}: key {k}");
                assert!(evictable(m.until(), t), "{ctx}: {k} taken before its tick");
            }
            assert_eq!(own, expected_events, "{ctx}: events");
        }
    }
    racers.stop();
    if !racing {
        assert_eq!(map.len(), model.len(), "seed {seed}: final len");
    }
    drop(Arc::into_inner(map).expect("the racers are gone"));
    let mut rest = events_until_closed(&mut sub);
    let t = now();
    let mut want: Vec<_> = model
        .iter()
        .map(|(&k, m)| {
            (
                k,
                m.value,
                if t <= m.until() {
                    Cause::Shutdown
                } else {
                    Cause::Expired
                },
            )
        })
        .collect();
    // An entry the model holds past its deadline leaves as `Expired`,
    // whether a racer took it or the shutdown did.
    rest.append(&mut seen);
    want.append(&mut owed);
    rest.sort_unstable();
    want.sort_unstable();
    assert_eq!(rest, want, "seed {seed}: every event, by door");
}

fn clock_now(c: &ManualClock) -> u64 {
    use expiremap::Clock;
    c.now()
}

fn events_until_closed(sub: &mut Subscriber<u64, u64>) -> Vec<(u64, u64, Cause)> {
    let mut out = Vec::new();
    loop {
        match sub.try_recv() {
            Ok(e) => out.push((e.key, e.value, e.cause)),
            Err(TryRecvError::Closed) => return out,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
}

/// An operation count: `release` in a release build, a tenth of it in a
/// debug build, and that divided by `EXPIREMAP_TEST_DIVISOR` if set (CI's
/// ThreadSanitizer step sets 5: there every operation costs tens of times
/// more, a panic in `Drop` ~4 ms, and the races it looks for need threads
/// meeting, not long runs).
fn scaled(release: usize) -> usize {
    let n = if cfg!(debug_assertions) {
        release / 10
    } else {
        release
    };
    let divisor = std::env::var("EXPIREMAP_TEST_DIVISOR")
        .ok()
        .and_then(|d| d.parse::<usize>().ok())
        .filter(|&d| d > 0)
        .unwrap_or(1);
    n / divisor
}

#[test]
fn shadow_single_threaded_one_million_ops() {
    let base = seed(0x00C0_FFEE);
    // Several independent runs (different key counts and shard counts),
    // one million operations in all.
    for i in 0..4 {
        single_threaded(base.wrapping_add(i), scaled(250_000));
    }
}

/// The same exact model with hashes that collide in the bits the shard
/// tables use: 1, 3 and 16 distinct values.
#[test]
fn shadow_single_threaded_colliding_hashes() {
    let base = seed(0x0BAD_5EED);
    for (i, low) in [1, 3, 16].into_iter().enumerate() {
        single_threaded_with(
            base.wrapping_add(i as u64),
            scaled(50_000),
            Colliding { low },
            0,
            40,
            0,
            None,
            None,
        );
    }
}

/// The same model at the end of the clock's range: the clock starts 1 to
/// 17 s before `u64::MAX` and runs into it, TTLs saturate to deadlines that
/// never expire, and the last tick (which has no tick after it) is due only
/// at `u64::MAX`.
#[test]
fn shadow_single_threaded_at_the_end_of_time() {
    let base = seed(0x0E1D);
    for i in 0..4 {
        let spread = 30 + 2 * i as u32;
        single_threaded_with(
            base.wrapping_add(i),
            scaled(50_000),
            ahash::RandomState::new(),
            u64::MAX - (1 << spread) - (1 << 30),
            spread,
            0,
            None,
            None,
        );
    }
}

/// The exact model while two threads call `evict_expired` in a loop and
/// the background thread runs: every result exact, every value by the
/// model's door. Two runs also go to the end of time.
#[test]
fn shadow_single_threaded_with_racing_evictors() {
    let base = seed(0x0E71C7);
    for i in 0..4u64 {
        let (origin, spread) = if i < 2 {
            (0, 40)
        } else {
            (u64::MAX - (1 << 33) - (1 << 30), 33)
        };
        single_threaded_with(
            base.wrapping_add(i),
            scaled(100_000),
            ahash::RandomState::new(),
            origin,
            spread,
            2,
            None,
            None,
        );
    }
}

/// The exact model with `max_entries`: bounds of 1 (every new key competes
/// with the one held), 7, and 60 over up to 300 keys.
#[test]
fn shadow_single_threaded_bounded() {
    let base = seed(0xB0_07D5);
    for (i, bound) in [1, 7, 60, 60].into_iter().enumerate() {
        single_threaded_with(
            base.wrapping_add(i as u64),
            scaled(100_000),
            ahash::RandomState::new(),
            0,
            40,
            0,
            Some(bound),
            None,
        );
    }
}

/// The exact model with `time_to_idle`: every read that counts as an
/// access moves the model's effective deadline, and reads, eviction and
/// every door follow `min(write deadline, last access + idle)`. Idle times
/// from 1 ns to 60 ms, unbounded and bounded, at the end of time, and with
/// racing evictors (whose timers must move, not evict, entries read since).
#[test]
fn shadow_single_threaded_idle() {
    let base = seed(0x1D1E);
    let idle = |i: u64| [1, 700, 3 * P, 20 * P, 60 * P][i as usize % 5];
    for i in 0..5u64 {
        let bound = (i % 2 == 1).then_some(7 + 20 * i);
        single_threaded_with(
            base.wrapping_add(i),
            scaled(60_000),
            ahash::RandomState::new(),
            0,
            40,
            0,
            bound,
            Some(idle(i)),
        );
    }
    single_threaded_with(
        base.wrapping_add(10),
        scaled(40_000),
        ahash::RandomState::new(),
        u64::MAX - (1 << 33) - (1 << 30),
        33,
        0,
        None,
        Some(idle(3)),
    );
    for i in 0..2u64 {
        single_threaded_with(
            base.wrapping_add(20 + i),
            scaled(60_000),
            ahash::RandomState::new(),
            0,
            40,
            2,
            None,
            Some(idle(2 + i)),
        );
    }
}

#[test]
fn shadow_multi_threaded_real_clock() {
    let s = shadow_mt::run(&shadow_mt::Params {
        keys: 2_000,
        ops: scaled(400_000) as u64,
        threads: 4,
        max_ttl_ms: 5,
        seed: seed(7),
        evictors: 2,
        progress: false,
    });
    assert_eq!(s.mismatches, 0, "mismatches: {:#?}", s.first_mismatches);
    assert!(s.events > 0);
}

#[test]
fn expiration_on_the_real_clock_empties_the_map() {
    // No sleeps: wait for the events themselves, then check len().
    let map = ExpireMap::<u64, u64>::builder()
        .clock(SystemClock::new())
        .event_capacity(1 << 14)
        .build();
    let mut sub = map.subscribe().unwrap();
    let n = 10_000;
    for i in 0..n {
        map.put(i, i, Duration::from_millis(1 + i % 20));
    }
    let mut seen = HashSet::new();
    while seen.len() < n as usize {
        let e = sub.recv().expect("event");
        assert_eq!(e.cause, Cause::Expired);
        assert!(e.removed_at() > e.deadline(), "evicted early: {e:?}");
        assert!(seen.insert(e.key), "key {} evicted twice", e.key);
    }
    assert_eq!(map.len(), 0);
    assert!(map.is_empty());
}

#[test]
fn expiration_on_a_manual_clock_empties_the_map() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u64, u64>::builder()
        .clock(clock.clone())
        .build();
    let mut sub = map.subscribe().unwrap();
    for i in 0..1000 {
        map.put(i, i, Duration::from_millis(1 + i % 50));
    }
    clock.advance(Duration::from_millis(60));
    for _ in 0..1000 {
        assert_eq!(sub.recv().unwrap().cause, Cause::Expired);
    }
    assert_eq!(map.len(), 0);
}

/// A value that counts its live instances. With `bomb`, its `Drop` panics
/// (after counting): the originals of some values are made so, their
/// clones never are.
#[derive(Debug)]
struct Tracked {
    id: u64,
    live: Arc<AtomicI64>,
    bomb: bool,
}
impl Tracked {
    fn new(id: u64, live: &Arc<AtomicI64>) -> Self {
        Self::with_bomb(id, live, false)
    }
    fn with_bomb(id: u64, live: &Arc<AtomicI64>, bomb: bool) -> Self {
        live.fetch_add(1, Ordering::SeqCst);
        Tracked {
            id,
            live: live.clone(),
            bomb,
        }
    }
}
impl Clone for Tracked {
    fn clone(&self) -> Self {
        Tracked::new(self.id, &self.live)
    }
}
impl Drop for Tracked {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
        if self.bomb && !std::thread::panicking() {
            panic!("value drop panics");
        }
    }
}

/// Drops `v`, catching the panic of a bomb.
fn drop_quietly<T>(v: T) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(v)));
}

#[test]
fn conservation_every_value_leaves_by_exactly_one_door() {
    conservation(None, false, None, false);
}

/// The same with a third of the values panicking in `Drop`, in every door:
/// returned and dropped by the caller, published (and overwritten in a
/// small ring, so that publishing drops old originals), refused or pushed
/// out by the bound, ignored (zero TTL), held at shutdown. Every value
/// still leaves by exactly one door, counted exactly (the ring carries only
/// values that left by it, so the subscriber's lag counts exactly the
/// values it did not see), and the drop counts balance.
#[test]
fn conservation_with_values_that_panic_in_drop() {
    conservation(None, false, None, true);
    conservation(Some(64), false, None, true);
}

/// The same with `get_or_insert_with` and failing `try_get_or_insert_with`
/// loads racing the puts and removes of 4 threads over 40 keys: a loaded
/// value is stored at most once (and only if no write touched its key),
/// every put's exactly once. Once without and once with idle expiry.
#[test]
fn conservation_with_loads_racing_puts_and_removes() {
    conservation(None, true, None, false);
    conservation(Some(16), true, Some(Duration::from_micros(700)), false);
}

/// The same with `max_entries(64)` over 500 keys: `Size` is a door too, and
/// `len()` stays within the bound whenever it is read.
#[test]
fn conservation_with_a_bound() {
    conservation(Some(64), false, None, false);
}

fn conservation(bound: Option<u64>, loads: bool, idle: Option<Duration>, bombs: bool) {
    let live = Arc::new(AtomicI64::new(0));
    let clock = ManualClock::new();
    // With bombs, a small ring: publications overwrite old events (whose
    // originals panic in `Drop`), and the subscriber's lag is counted.
    let mut builder = ExpireMap::<u64, Tracked>::builder()
        .clock(clock.clone())
        .publish_removals(!bombs)
        .event_capacity(if bombs { 1 << 8 } else { 1 << 20 });
    if let Some(n) = bound {
        builder = builder.max_entries(n);
    }
    if let Some(d) = idle {
        builder = builder.time_to_idle(d);
    }
    let map = Arc::new(builder.build());
    let mut sub = map.subscribe().unwrap();
    let next_id = Arc::new(AtomicU64::new(0));
    // Ids made by a load's `init`: stored at most once.
    let loaded = Arc::new(Mutex::new(HashSet::new()));
    let keys = if loads { 40 } else { 500 };
    let returned = Arc::new(Mutex::new(Vec::new()));
    let threads = 4;
    let ops = scaled(50_000) as u64;
    // Operations done by all workers: the driver paces time by it, so that
    // however the threads are scheduled, time moves while values are held.
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (map, live, next_id, returned, loaded, done) = (
                map.clone(),
                live.clone(),
                next_id.clone(),
                returned.clone(),
                loaded.clone(),
                done.clone(),
            );
            std::thread::spawn(move || {
                let mut rng = Rng(seed(99) + t);
                let mut mine = Vec::new();
                let mut my_loads = Vec::new();
                for _ in 0..ops {
                    done.fetch_add(1, Ordering::Relaxed);
                    let key = rng.below(keys);
                    if loads && rng.below(3) == 0 {
                        let ttl = Duration::from_micros(1 + rng.below(3_000));
                        let fail = rng.below(4) == 0;
                        let r = map.try_get_or_insert_with(key, ttl, || {
                            if fail {
                                return Err(());
                            }
                            let id = next_id.fetch_add(1, Ordering::SeqCst);
                            my_loads.push(id);
                            Ok(Tracked::with_bomb(id, &live, bombs && id % 3 == 0))
                        });
                        // An error comes from a failing init: this call's,
                        // or the one of the load it waited for (shared).
                        drop_quietly(r);
                        continue;
                    }
                    if rng.below(3) == 0 {
                        if let Some(v) = map.remove(&key) {
                            mine.push(v.id);
                            drop_quietly(v);
                        }
                    } else {
                        let id = next_id.fetch_add(1, Ordering::SeqCst);
                        let ttl = Duration::from_micros(rng.below(3_000)); // some zero
                        let value = Tracked::with_bomb(id, &live, bombs && id % 3 == 0);
                        if ttl.is_zero() {
                            // ignored: the value never enters the map (and
                            // a bomb goes off inside `put`)
                            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                map.put(key, value, ttl)
                            }));
                            assert!(r.is_err() || r.unwrap().is_none());
                            returned.lock().unwrap().push(u64::MAX - id);
                            continue;
                        }
                        if let Some(v) = map.put(key, value, ttl) {
                            mine.push(v.id);
                            drop_quietly(v);
                        }
                    }
                }
                returned.lock().unwrap().extend(mine);
                loaded.lock().unwrap().extend(my_loads);
            })
        })
        .collect();
    // Expiry races the workers: a driver thread advances virtual time, and
    // at the end to `u64::MAX`, where every value still held leaves as
    // `Expired` unless its TTL saturated; two more threads call
    // `evict_expired` in a loop beside the background thread. Round `r`
    // starts once the workers have made `r / 200` of their operations.
    let driver = {
        let clock = clock.clone();
        let map = map.clone();
        std::thread::spawn(move || {
            for round in 0..200 {
                while done.load(Ordering::Relaxed) < round * threads * ops / 200 {
                    std::thread::yield_now();
                }
                let by = if round == 190 {
                    Duration::MAX
                } else {
                    Duration::from_micros(500)
                };
                clock.advance(by);
                let len = map.len();
                assert!(
                    bound.is_none_or(|n| len as u64 <= n),
                    "len {len} over {bound:?}"
                );
                if len % 7 == 0 {
                    drop_quietly(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                        || map.evict_expired(),
                    )));
                }
                std::thread::yield_now();
            }
        })
    };
    let racers = Racers::spawn_with(&map, 2, bombs);
    for w in workers {
        w.join().unwrap();
    }
    driver.join().unwrap();
    racers.stop();
    let map = Arc::try_unwrap(map).expect("only handle");
    drop_quietly(map);

    let mut by_cause: HashMap<Cause, Vec<u64>> = HashMap::new();
    let mut lagged = 0;
    loop {
        match sub.recv() {
            Ok(e) => {
                if e.cause == Cause::Expired {
                    assert!(e.removed_at() > e.deadline(), "evicted early: {e:?}");
                }
                by_cause.entry(e.cause).or_default().push(e.value.id);
            }
            Err(expiremap::RecvError::Closed) => break,
            Err(expiremap::RecvError::Lagged(n)) if bombs => lagged += n as usize,
            Err(e) => panic!("lagged or other: {e:?}"),
        }
    }
    if bombs {
        // Events lost to lag are counted, not seen: conservation is then
        // checked by count, and each door seen is still exclusive.
        assert!(!loads, "loads are counted by the exact accounting only");
        conservation_by_count(&by_cause, lagged, &returned, &next_id);
        drop(by_cause);
        drop_quietly(sub);
        assert_eq!(live.load(Ordering::SeqCst), 0, "drop counts balance");
        return;
    }
    let mut returned = Arc::try_unwrap(returned).unwrap().into_inner().unwrap();
    let ignored = returned.iter().filter(|&&x| x > u64::MAX / 2).count();
    returned.retain(|&x| x < u64::MAX / 2);
    let take = |c| by_cause.get(&c).cloned().unwrap_or_default();
    let (expired, shutdown, size) = (
        take(Cause::Expired),
        take(Cause::Shutdown),
        take(Cause::Size),
    );
    assert_eq!(bound.is_some(), !size.is_empty(), "Size only with a bound");
    let (mut removed_ev, mut returned_sorted) = (take(Cause::Removed), returned.clone());
    removed_ev.extend(take(Cause::Replaced));
    removed_ev.sort_unstable();
    returned_sorted.sort_unstable();
    assert_eq!(
        removed_ev, returned_sorted,
        "Removed/Replaced events match returns"
    );
    let mut all: Vec<u64> = returned
        .iter()
        .chain(&expired)
        .chain(&shutdown)
        .chain(&size)
        .copied()
        .collect();
    let total = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), total, "some value left by two doors");
    let loaded = Arc::try_unwrap(loaded).unwrap().into_inner().unwrap();
    let stored_loads = all.iter().filter(|id| loaded.contains(id)).count();
    assert_eq!(loads, stored_loads > 0, "loaded values stored");
    let made = next_id.load(Ordering::SeqCst) as usize;
    assert_eq!(
        total - stored_loads + ignored + loaded.len(),
        made,
        "every value put is accounted for exactly once"
    );
    assert!(
        !expired.is_empty() && !returned.is_empty(),
        "all doors exercised"
    );
    drop(by_cause);
    drop(sub);
    assert_eq!(live.load(Ordering::SeqCst), 0, "drop counts balance");
}

/// The accounting of `conservation` when the subscriber lagged (no loads,
/// no notices of returned values: every event carries a value that left
/// by it): every value made was returned, ignored, or published (seen, or
/// counted in the lag), and no value seen left by two doors.
fn conservation_by_count(
    by_cause: &HashMap<Cause, Vec<u64>>,
    lagged: usize,
    returned: &Arc<Mutex<Vec<u64>>>,
    next_id: &Arc<AtomicU64>,
) {
    let returned = returned.lock().unwrap().clone();
    let ignored = returned.iter().filter(|&&x| x > u64::MAX / 2).count();
    let returned: Vec<u64> = returned.into_iter().filter(|&x| x < u64::MAX / 2).collect();
    assert!(!by_cause.contains_key(&Cause::Removed) && !by_cause.contains_key(&Cause::Replaced));
    let published: Vec<u64> = by_cause.values().flatten().copied().collect();
    let mut seen: Vec<u64> = published.iter().chain(&returned).copied().collect();
    let n = seen.len();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), n, "some value left by two doors");
    let made = next_id.load(Ordering::SeqCst) as usize;
    assert_eq!(
        published.len() + lagged + returned.len() + ignored,
        made,
        "every value made left by exactly one door ({lagged} lagged)"
    );
    assert!(
        !returned.is_empty() && !published.is_empty(),
        "doors exercised"
    );
}

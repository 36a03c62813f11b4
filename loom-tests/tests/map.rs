//! loom models of the map's concurrent protocols: the eviction thread's
//! wake-up, shutdown, remove racing expiry, the last handle dropped on the
//! eviction thread, the last of two clones dropped on two threads, two `evict_expired` callers racing a `remove`, a write evicting due entries racing the pass, the
//! capacity bound under concurrent puts and eviction, the map-wide bound
//! taking room from another shard,
//! `get_or_insert_with`'s hand-off to waiters, refresh ahead's reload racing
//! a put and the entry's expiry, racing reads recording
//! their accesses for idle expiry, reads and updates at an entry's
//! idle deadline, updates of one key running `f` once each and ordered
//! against puts of the key, and `retain`'s per-entry conflict detection.
//! Each also runs once as an
//! ordinary test without `--cfg expiremap_loom`.
//!
//! A lost wake-up or a self-join shows up as a deadlock, which loom reports.

use expiremap::{
    Cause, Clock, ExpireMap, ManualClock, RecvError, Subscriber, TryRecvError, Update,
};
use expiremap_loom_tests::{model, model_with_preemptions, thread};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);

fn map(clock: &ManualClock) -> ExpireMap<u32, u32> {
    ExpireMap::builder()
        .clock(clock.clone())
        .shards(1)
        .event_capacity(4)
        .max_subscribers(1)
        .build()
}

fn until_closed(sub: &mut Subscriber<u32, u32>) -> Vec<(u32, Cause)> {
    let mut out = Vec::new();
    loop {
        match sub.recv() {
            Ok(e) => out.push((e.key, e.cause)),
            Err(RecvError::Closed) => return out,
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// A put whose deadline is earlier than the thread's planned wake-up wakes
/// it, whatever the interleaving with the thread's planning: otherwise the
/// thread keeps waiting for the 1 h entry and `recv` never returns.
#[test]
fn earlier_put_wakes_the_planning_thread() {
    model(|| {
        let clock = ManualClock::new();
        let map = map(&clock);
        let mut sub = map.subscribe().unwrap();
        map.put(1, 1, Duration::from_secs(3600));
        map.put(2, 2, MS);
        clock.advance(2 * MS);
        let e = sub.recv().unwrap();
        assert_eq!((e.key, e.cause), (2, Cause::Expired));
        drop(map);
        assert_eq!(until_closed(&mut sub), [(1, Cause::Shutdown)]);
    });
}

/// Dropping the map while another thread moves time (so the eviction thread
/// may be sleeping, waking, or mid-pass): drop returns, the entry is
/// published exactly once, then the stream closes.
#[test]
fn shutdown_races_a_sleeping_or_working_thread() {
    model(|| {
        let clock = ManualClock::new();
        let map = map(&clock);
        let mut sub = map.subscribe().unwrap();
        map.put(1, 1, MS);
        let c = clock.clone();
        let t = thread::spawn(move || c.advance(2 * MS));
        drop(map);
        t.join().unwrap();
        let got = until_closed(&mut sub);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(matches!(got[0], (1, Cause::Expired) | (1, Cause::Shutdown)));
    });
}

/// `remove` racing the eviction of the same entry: exactly one of them gets
/// the value. `remove` returns it, or an `Expired` event carries it.
#[test]
fn remove_races_expiry_exactly_one_winner() {
    model(|| {
        let clock = ManualClock::new();
        let map = Arc::new(map(&clock));
        let mut sub = map.subscribe().unwrap();
        map.put(1, 1, MS);
        let c = clock.clone();
        let t = thread::spawn(move || c.advance(2 * MS));
        let removed = map.remove(&1);
        t.join().unwrap();
        drop(Arc::try_unwrap(map).expect("one handle"));
        let events = until_closed(&mut sub);
        match removed {
            Some(v) => {
                assert_eq!(v, 1);
                assert!(events.is_empty(), "{events:?}");
            }
            None => assert_eq!(events, [(1, Cause::Expired)]),
        }
    });
}

/// A value that holds the last handle to its own map.
struct Holder {
    map: std::sync::Mutex<Option<ExpireMap<u32, Arc<Holder>>>>,
    done: Arc<AtomicBool>,
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.map.lock().unwrap().take());
        self.done.store(true, Ordering::SeqCst);
    }
}

/// The eviction thread drops the value that owns the map: the map's drop runs
/// on the eviction thread itself and must not join it.
#[test]
fn last_handle_dropped_on_the_eviction_thread() {
    model(|| {
        let clock = ManualClock::new();
        let map: ExpireMap<u32, Arc<Holder>> =
            ExpireMap::builder().clock(clock.clone()).shards(1).build();
        let done = Arc::new(AtomicBool::new(false));
        let holder = Arc::new(Holder {
            map: std::sync::Mutex::new(None),
            done: done.clone(),
        });
        map.put(1, holder.clone(), MS);
        *holder.map.lock().unwrap() = Some(map);
        drop(holder); // the map now lives only inside its own value
        clock.advance(2 * MS);
        while !done.load(Ordering::SeqCst) {
            thread::yield_now();
        }
    });
}

/// Two handles of one map (`ExpireMap: Clone`) dropped on two threads at
/// once, one of them after a put: whichever drop comes last shuts the map
/// down exactly once. Both entries are published once as `Shutdown`, then
/// the stream closes; a shutdown lost or run twice, or a join that never
/// returns, fails the model.
#[test]
fn the_last_of_two_handles_shuts_the_map_down_once() {
    model(|| {
        let clock = ManualClock::new();
        let map = map(&clock);
        let mut sub = map.subscribe().unwrap();
        map.put(1, 1, Duration::from_secs(3600));
        let other = map.clone();
        let t = thread::spawn(move || {
            other.put(2, 2, Duration::from_secs(3600));
            drop(other);
        });
        drop(map);
        t.join().unwrap();
        let mut got = until_closed(&mut sub);
        got.sort_by_key(|e| e.0);
        assert_eq!(got, [(1, Cause::Shutdown), (2, Cause::Shutdown)]);
    });
}

/// Two `evict_expired` passes at different times race a `remove` of an entry
/// that comes due between them. Key 1 is due before either pass starts; key 2
/// comes due when thread B advances the clock; key 3 lives for an hour.
/// Every value leaves exactly once: by `remove`, by an `Expired` event, or
/// (still held) by `Shutdown`. `remove` returns key 2's value only if no
/// `Expired` event carries it. Every `Expired` event was removed after its
/// deadline, and the two passes' counts add up to the `Expired` events they
/// published (all of them, except key 2's when `remove` found it expired).
///
/// All three ends for key 2 are reached: `remove` returns it, `remove` finds
/// it expired and publishes it, or a pass evicts it first. Under loom a pass
/// evicts one entry per lock hold, so B can leave key 2 on the due list
/// between its batches and A take it: with a time read before the lock (the
/// bug this model guards against), A published key 2 as removed at 1.5 ms,
/// before its 2 ms deadline (found with three preemptions, not two).
#[test]
fn two_eviction_passes_race_a_remove() {
    // A's read, B's batch, A's pass, B's next batch: three preemptions.
    model_with_preemptions(3, || {
        let clock = ManualClock::new();
        let map = Arc::new(
            ExpireMap::<u32, u32>::builder()
                .clock(clock.clone())
                .shards(1)
                .background_eviction(false)
                .event_capacity(4)
                .max_subscribers(1)
                .build(),
        );
        let mut sub = map.subscribe().unwrap();
        map.put(1, 1, MS);
        map.put(2, 2, 2 * MS);
        map.put(3, 3, Duration::from_secs(3600));
        // 1.5 ms: key 1 is past its deadline (and its tick), key 2 is live.
        clock.advance(MS / 2 * 3);
        let a = {
            let map = map.clone();
            thread::spawn(move || map.evict_expired())
        };
        let b = {
            let (map, clock) = (map.clone(), clock.clone());
            thread::spawn(move || {
                // 2.5 ms: key 2 is due too.
                clock.advance(MS);
                map.evict_expired()
            })
        };
        let removed = map.remove(&2);
        // `remove` may also take a due entry as a write (issue 36): key 1,
        // or key 2 once its tick has passed; counted as the writers'.
        let evicted =
            a.join().unwrap() + b.join().unwrap() + map.stats().evicted_by_writers as usize;

        // Everything published so far: the passes' events and, if `remove`
        // found key 2 expired, its event.
        let mut expired = Vec::new();
        loop {
            match sub.try_recv() {
                Ok(e) => {
                    assert_eq!(e.cause, Cause::Expired, "key {}", e.key);
                    assert!(
                        e.removed_at() > e.deadline(),
                        "key {} removed at {:?}, deadline {:?}",
                        e.key,
                        e.removed_at(),
                        e.deadline()
                    );
                    assert!(e.removed_at() <= Duration::from_nanos(clock.now()));
                    assert_eq!(e.value, e.key);
                    expired.push(e.key);
                }
                Err(TryRecvError::Empty) => break,
                Err(e) => panic!("{e:?}"),
            }
        }
        expired.sort_unstable();
        // Key 1 was due before both passes; key 2 leaves by exactly one door.
        match removed {
            Some(v) => {
                assert_eq!(v, 2);
                assert_eq!(expired, [1], "remove won, yet key 2 expired");
            }
            None => assert_eq!(expired, [1, 2]),
        }
        // Only key 2's event can come from `remove` (door `Expired`); every
        // other one is counted by the pass that published it.
        let by_remove = expired.len().checked_sub(evicted);
        assert!(
            by_remove == Some(0) || (by_remove == Some(1) && removed.is_none()),
            "passes evicted {evicted}, events {expired:?}, removed {removed:?}"
        );
        assert_eq!((map.len(), map.get(&3)), (1, Some(3)));

        drop(Arc::try_unwrap(map).expect("one handle"));
        assert_eq!(until_closed(&mut sub), [(3, Cause::Shutdown)]);
    });
}

/// The capacity bound under concurrent puts and eviction: a map bounded to
/// one entry holds key 1 (expired), and two threads put keys 2 and 3 while a
/// third runs `evict_expired`. However they interleave, the map never holds
/// more than one entry, key 1 leaves as `Expired` (taken by the eviction
/// or by a put making room), and of keys 2 and 3 one stays (then leaves at
/// `Shutdown`) and the other leaves as `Size`: every value exactly once.
#[test]
fn the_bound_holds_under_concurrent_puts_and_eviction() {
    model(|| {
        let clock = ManualClock::new();
        let map = Arc::new(
            ExpireMap::<u32, u32>::builder()
                // A fixed hasher: the admission sketch follows the hashes,
                // and a loom model must do the same in every execution.
                .hasher(Fixed::default())
                .clock(clock.clone())
                .shards(1)
                .max_entries(1)
                .background_eviction(false)
                .event_capacity(8)
                .max_subscribers(1)
                .build(),
        );
        let mut sub = map.subscribe().unwrap();
        map.put(1, 10, MS);
        clock.advance(2 * MS);
        let put = |k: u32| {
            let map = map.clone();
            thread::spawn(move || {
                assert_eq!(map.put(k, k * 10, Duration::from_secs(3600)), None);
                assert!(map.len() <= 1);
            })
        };
        let (a, b) = (put(2), put(3));
        let c = {
            let map = map.clone();
            thread::spawn(move || map.evict_expired())
        };
        a.join().unwrap();
        b.join().unwrap();
        c.join().unwrap();
        assert_eq!(map.len(), 1);
        drop(Arc::try_unwrap(map).expect("one handle"));
        let mut left = until_closed(&mut sub);
        left.sort_unstable();
        assert_eq!(left.len(), 3, "{left:?}");
        assert_eq!(left[0], (1, Cause::Expired));
        let causes = [left[1].1, left[2].1];
        assert!(
            causes == [Cause::Shutdown, Cause::Size] || causes == [Cause::Size, Cause::Shutdown],
            "{left:?}"
        );
    });
}

/// The map-wide bound across two shards: `max_entries(2)` holds keys `a`
/// and `b` of shard 0, both expired. One thread puts `e` (shard 0), which
/// makes room in its own shard; another puts `c` (shard 1, empty), which
/// must take its room from shard 0 with its own lock released
/// (`room_elsewhere`), expired entries first. However they interleave
/// (either may take the room the other made, and go again), both puts
/// are stored, `a` and `b` leave as `Expired`, and the map holds exactly
/// two entries.
#[test]
fn the_map_wide_bound_takes_room_from_another_shard() {
    let [a, b, e] = keys_in(0);
    let [c] = keys_in(1);
    model(move || {
        let clock = ManualClock::new();
        let map = Arc::new(
            two_shards(&clock)
                .max_entries(2)
                .event_capacity(8)
                .max_subscribers(1)
                .build(),
        );
        let mut sub = map.subscribe().unwrap();
        map.put(a, a, MS);
        map.put(b, b, MS);
        clock.advance(2 * MS);
        let put = |k: u32| {
            let map = map.clone();
            thread::spawn(move || assert_eq!(map.put(k, k, Duration::from_secs(3600)), None))
        };
        let (t1, t2) = (put(e), put(c));
        t1.join().unwrap();
        t2.join().unwrap();
        assert_eq!(map.iter().count(), 2, "{:?}", map.stats());
        assert_eq!((map.get(&c), map.get(&e)), (Some(c), Some(e)));
        drop(Arc::try_unwrap(map).expect("one handle"));
        let mut left = until_closed(&mut sub);
        left.sort_unstable();
        let mut want = vec![
            (a, Cause::Expired),
            (b, Cause::Expired),
            (c, Cause::Shutdown),
            (e, Cause::Shutdown),
        ];
        want.sort_unstable();
        assert_eq!(left, want);
    });
}

/// A full map's puts in two shards at once, each making room in its own
/// shard, where the weight freed is not the weight needed. `max_weight(4)`
/// holds `a` (weight 3, shard 0) and `c` (1, shard 1), both expired. The
/// put of `b` (1, shard 0) frees 3, passes 1 to `b` under its shard's lock
/// and gives 2 back to the budget; the put of `d` (3, shard 1) frees 1 and
/// needs 2 more from the budget, or from shard 0 if it comes first.
/// However they interleave, both are stored, and no weight is lost: once
/// they are removed, the whole bound fits again.
#[test]
fn puts_in_two_full_shards_each_keep_the_room_they_make() {
    let [a, b, e] = keys_in(0);
    let [c, d] = keys_in(1);
    model(move || {
        let clock = ManualClock::new();
        let map = Arc::new(
            two_shards(&clock)
                .max_weight(4)
                .weigher(move |&k, _| if k == a || k == d || k == e { 3 } else { 1 })
                .build(),
        );
        map.put(a, a, MS);
        map.put(c, c, MS);
        assert_eq!(map.weighted_size(), 4);
        clock.advance(2 * MS);
        let put = |k: u32| {
            let map = map.clone();
            thread::spawn(move || assert_eq!(map.put(k, k, Duration::from_secs(3600)), None))
        };
        let (t1, t2) = (put(b), put(d));
        t1.join().unwrap();
        t2.join().unwrap();
        assert_eq!((map.get(&b), map.get(&d)), (Some(b), Some(d)));
        assert_eq!(map.weighted_size(), 4);
        map.remove(&b);
        map.remove(&d);
        map.put(e, e, Duration::from_secs(3600));
        map.put(c, c, Duration::from_secs(3600));
        assert_eq!((map.get(&e), map.get(&c)), (Some(e), Some(c)));
    });
}

/// The map-wide bound's `due_min` word (a time no shard's `due` is below,
/// read by every put that makes room) against a put that lowers a `due`.
/// `max_entries(3)` holds `a`, `e` (shard 0) and `c` (shard 1), all live
/// for an hour; `due_min` is stale (an expired `x` of shard 1 was taken
/// since), so a full put scans every `due` and may raise the word. One
/// thread overwrites `a` to expire in a millisecond, lowering shard 0's
/// `due`; another puts `d` into shard 1 (refused by admission), scanning
/// and raising. However they interleave, the word never ends up past
/// `a`'s time: once `a` has expired, a put of `f` into shard 1 finds it
/// and takes its room instead of losing to `c`.
#[test]
fn a_scan_never_raises_the_due_word_past_a_lowered_due() {
    let [a, e] = keys_in(0);
    let [c, x, d, f] = keys_in(1);
    let hour = Duration::from_secs(3600);
    model(move || {
        let clock = ManualClock::new();
        let map = Arc::new(two_shards(&clock).max_entries(3).build());
        map.put(a, a, hour);
        map.put(c, c, hour);
        map.put(x, x, MS);
        clock.advance(3 * MS);
        // Full: `e` takes the room of the expired `x` from shard 1.
        map.put(e, e, hour);
        assert_eq!((map.get(&x), map.get(&e)), (None, Some(e)));
        let lower = {
            let map = map.clone();
            thread::spawn(move || map.put(a, a, MS))
        };
        let scan = {
            let map = map.clone();
            thread::spawn(move || map.put(d, d, hour))
        };
        assert_eq!(lower.join().unwrap(), Some(a));
        assert_eq!(scan.join().unwrap(), None);
        clock.advance(3 * MS);
        map.put(f, f, hour);
        assert_eq!((map.get(&a), map.get(&f)), (None, Some(f)));
        assert_eq!(map.get(&c), Some(c));
    });
}

/// A hasher that is the same in every execution of a model.
type Fixed = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// The first `N` keys from 10 up that land in shard `s` of a map built by
/// [`two_shards`] (the `Fixed` hasher's bits 40.. pick the shard, as
/// `Inner::shard` does).
fn keys_in<const N: usize>(s: u64) -> [u32; N] {
    use std::hash::BuildHasher;
    let mut keys = (10..).filter(move |&k: &u32| (Fixed::default().hash_one(k) >> 40) & 1 == s);
    std::array::from_fn(|_| keys.next().expect("keys enough"))
}

/// A two-shard map over `clock`: the `Fixed` hasher, no eviction thread.
fn two_shards(clock: &ManualClock) -> expiremap::Builder<u32, u32, Fixed> {
    ExpireMap::builder()
        .hasher(Fixed::default())
        .clock(clock.clone())
        .shards(2)
        .background_eviction(false)
}

fn loading_map() -> Arc<ExpireMap<u32, u32, Fixed>> {
    Arc::new(
        ExpireMap::builder()
            .hasher(Fixed::default())
            .clock(ManualClock::new())
            .shards(1)
            .background_eviction(false)
            .build(),
    )
}

/// Two callers of `get_or_insert_with` for one key race a `put` of it. At
/// most one `init` runs (the other caller waits and takes its value, or
/// hits), a caller gets a loaded value or the put's, and the put stands at
/// the end whatever the order: before the loads (they hit it), during one
/// (it wins over the loaded value) or after (it overwrites).
#[test]
fn a_load_racing_a_put_and_a_waiter() {
    model(|| {
        let map = loading_map();
        let inits = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let load = |v: u32| {
            let (map, inits) = (map.clone(), inits.clone());
            thread::spawn(move || {
                map.get_or_insert_with(1, Duration::from_secs(3600), || {
                    inits.fetch_add(1, Ordering::SeqCst);
                    v
                })
            })
        };
        let (a, b) = (load(10), load(20));
        map.put(1, 30, Duration::from_secs(3600));
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert!(inits.load(Ordering::SeqCst) <= 1, "{a} {b}");
        // Each got the one loaded value or the put's.
        for v in [a, b] {
            assert!([10, 20, 30].contains(&v), "{a} {b}");
        }
        assert!(a == b || a == 30 || b == 30, "two loaded values: {a} {b}");
        assert_eq!(map.get(&1), Some(30));
    });
}

/// The loader's `init` panics while another caller waits: the waiter is
/// woken and runs its own `init`, whose value is stored; the panic reaches
/// only its own caller.
#[test]
fn a_panicking_load_hands_over_to_the_waiter() {
    model(|| {
        let map = loading_map();
        let first = {
            let map = map.clone();
            thread::spawn(move || {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    map.get_or_insert_with(1, Duration::from_secs(3600), || panic!("init failed"))
                }))
                .ok()
            })
        };
        let second = map.get_or_insert_with(1, Duration::from_secs(3600), || 20);
        let first = first.join().unwrap();
        assert_eq!(second, 20);
        // The first caller panicked, or waited on the second's load.
        assert!(first.is_none() || first == Some(20), "{first:?}");
        assert_eq!(map.get(&1), Some(20));
    });
}

/// Two callers of one cold key, no other writer: exactly one `init` runs,
/// and the other caller either waited for it and got its value, or came
/// after and hit it.
#[test]
fn a_successful_load_hands_its_value_to_the_waiter() {
    model(|| {
        let map = loading_map();
        let inits = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let other = {
            let (map, inits) = (map.clone(), inits.clone());
            thread::spawn(move || {
                map.get_or_insert_with(1, Duration::from_secs(3600), || {
                    inits.fetch_add(1, Ordering::SeqCst);
                    10
                })
            })
        };
        let mine = map.get_or_insert_with(1, Duration::from_secs(3600), || {
            inits.fetch_add(1, Ordering::SeqCst);
            20
        });
        let other = other.join().unwrap();
        assert_eq!(inits.load(Ordering::SeqCst), 1, "{mine} {other}");
        assert_eq!(mine, other);
        assert_eq!(map.get(&1), Some(mine));
    });
}

/// The loader's `init` fails while another caller waits: nothing is
/// stored for it, and the error reaches its caller and the waiter (same
/// error type: it shares the error instead of running `init` again). A
/// caller of another error type waits too, then loads its own value. Each
/// outcome is one of those, whatever the interleaving.
#[test]
fn a_failing_load_is_shared_with_the_waiter() {
    model(|| {
        let map = loading_map();
        let first = {
            let map = map.clone();
            thread::spawn(move || {
                map.try_get_or_insert_with(1, Duration::from_secs(3600), || Err::<u32, _>("down"))
            })
        };
        let second = map.try_get_or_insert_with(1, Duration::from_secs(3600), || Ok::<_, &str>(20));
        let first = first.join().unwrap();
        match second {
            // The second waited for the failing load: both have its error,
            // nothing stored.
            Err(e) => {
                assert_eq!((e, first), ("down", Err("down")));
                assert_eq!(map.get(&1), None);
            }
            // The second loaded (first, or after the failure ended): the
            // first failed, or waited for that load and took its value.
            Ok(v) => {
                assert_eq!(v, 20);
                assert!(first == Err("down") || first == Ok(20), "{first:?}");
                assert_eq!(map.get(&1), Some(20));
            }
        }
        // A waiter of another error type never takes the error: it loads.
        let third = {
            let map = map.clone();
            thread::spawn(move || {
                map.try_get_or_insert_with(2, Duration::from_secs(3600), || Err::<u32, _>("down"))
            })
        };
        let fourth = map.try_get_or_insert_with(2, Duration::from_secs(3600), || Ok::<_, u8>(4));
        assert_eq!(fourth, Ok(4));
        assert!(matches!(third.join().unwrap(), Err("down") | Ok(4)));
    });
}

type IdleMap = Arc<ExpireMap<u32, u32, Fixed>>;

/// The race of the idle-expiry models: a one-shard map with
/// `time_to_idle(10 ms)` holds key 1 (`value`, written at 0 for an hour);
/// with the clock at `at`, one thread calls `get(&1)` while another moves
/// the clock 2 ms on and then calls `late`. Returns the map, its clock,
/// and both results.
fn idle_race<T: Send + 'static>(
    value: u32,
    at: Duration,
    late: impl FnOnce(&IdleMap) -> T + Send + 'static,
) -> (IdleMap, ManualClock, Option<u32>, T) {
    let clock = ManualClock::new();
    let map: IdleMap = Arc::new(
        ExpireMap::builder()
            .hasher(Fixed::default())
            .clock(clock.clone())
            .shards(1)
            .background_eviction(false)
            .time_to_idle(10 * MS)
            .build(),
    );
    map.put(1, value, Duration::from_secs(3600));
    clock.advance(at);
    let early = {
        let map = map.clone();
        thread::spawn(move || map.get(&1))
    };
    let late = {
        let (map, clock) = (map.clone(), clock.clone());
        thread::spawn(move || {
            clock.advance(2 * MS);
            late(&map)
        })
    };
    let (early, late) = (early.join().unwrap(), late.join().unwrap());
    (map, clock, early, late)
}

/// Two reads of one entry in a map with idle expiry race, one of them after
/// the clock moved: each records its access under the read lock (a
/// compare-and-swap that only raises the last access), so the later time
/// is kept whatever the interleaving. The entry is then live exactly until
/// that access plus the time to idle: a lost or overwritten access would
/// end it earlier. `contains_key` checks without recording an access.
#[test]
fn racing_accesses_keep_the_latest() {
    model(|| {
        let (map, clock, a, b) = idle_race(1, 5 * MS, |map| map.get(&1));
        assert_eq!((a, b), (Some(1), Some(1)));
        // The last access was at 7 ms.
        clock.advance(10 * MS);
        assert!(map.contains_key(&1), "the later access was lost");
        clock.advance(Duration::from_nanos(1));
        assert!(
            !map.contains_key(&1),
            "an access later than 7 ms was recorded"
        );
    });
}

/// A `get` that read the clock just before an entry's idle deadline races
/// a read just after it. The second read must not report the entry gone
/// while the first one's access keeps it alive: a read that sees the entry
/// idle-expired confirms that under the write lock (after every read in
/// flight has recorded its access) and only then answers `None`, removing
/// it. So whichever way they interleave, an entry reported gone stays gone.
#[test]
fn a_read_at_the_idle_deadline_never_revives_an_entry_reported_gone() {
    model(|| {
        let (map, _clock, early, late) = idle_race(1, 9 * MS, |map| map.contains_key(&1));
        // The clock is at 11 ms: the entry lives on only through an access
        // at 9 ms, and then every read agrees with the late one.
        if !late {
            assert!(!map.contains_key(&1), "an entry reported gone came back");
        }
        if early.is_none() {
            assert!(!late, "the early read saw it gone, the late one live");
        }
    });
}

/// `update` racing a `get` at the entry's idle deadline: `update` is shown
/// the entry as absent only once that is confirmed under the write lock, so
/// it never replaces a value that the racing read kept alive. If the read
/// got the value (its access extends the entry's life), the counter goes
/// on from it.
#[test]
fn an_update_at_the_idle_deadline_never_replaces_a_value_a_read_kept() {
    model(|| {
        let (map, _clock, read, counted) = idle_race(5, 9 * MS, |map| {
            map.update(1, |seen| match seen {
                None => expiremap::Update::Set(1, Duration::from_secs(3600)),
                Some((n, _)) => expiremap::Update::Set(n + 1, Duration::from_secs(3600)),
            })
        });
        if read == Some(5) {
            assert_eq!(
                counted,
                Some(6),
                "the update missed the value the read kept"
            );
        }
        assert_eq!(map.get(&1), counted);
    });
}

/// Two updates of one key, each adding one: `f` runs exactly once per
/// call (two runs in all), and neither increment is lost, whatever the
/// interleaving (the second waits for the first's flight to end).
#[test]
fn two_updates_of_one_key_run_f_once_each() {
    model(|| {
        let map = loading_map();
        map.put(1, 0, Duration::from_secs(3600));
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let add = || {
            let (map, calls) = (map.clone(), calls.clone());
            thread::spawn(move || {
                map.update(1, |seen| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Update::SetKeepTtl(seen.map_or(0, |(v, _)| *v) + 1)
                })
            })
        };
        let (a, b) = (add(), add());
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert_eq!(calls.load(Ordering::SeqCst), 2, "{a:?} {b:?}");
        let mut got = [a, b];
        got.sort_unstable();
        assert_eq!(got, [Some(1), Some(2)]);
        assert_eq!(map.get(&1), Some(2));
    });
}

/// A put of the key racing an update: the put lands before the update's
/// read (the update adds one to it) or after its commit (it stands), never
/// between them, where the commit would overwrite it with a value made
/// from the one before; and `f` runs once.
#[test]
fn a_put_racing_an_update_is_ordered_around_it() {
    model(|| {
        let map = loading_map();
        map.put(1, 1, Duration::from_secs(3600));
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let updater = {
            let (map, calls) = (map.clone(), calls.clone());
            thread::spawn(move || {
                map.update(1, |seen| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Update::Set(seen.map_or(0, |(v, _)| *v) + 1, Duration::from_secs(3600))
                })
            })
        };
        map.put(1, 100, Duration::from_secs(3600));
        let updated = updater.join().unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let now = map.get(&1);
        assert!(
            (updated, now) == (Some(101), Some(101)) || (updated, now) == (Some(2), Some(100)),
            "{updated:?} {now:?}"
        );
    });
}

/// `retain` rejecting value 1 of key 1 while another thread puts 10 there:
/// the verdict on 1 is never applied to 10 (the write is logged for the
/// node `retain` watches, and `f` is asked again), so 10 stays whatever
/// the interleaving.
#[test]
fn retain_never_applies_a_verdict_to_a_value_it_was_not_shown() {
    model(|| {
        let map = loading_map();
        map.put(1, 1, Duration::from_secs(3600));
        let writer = {
            let map = map.clone();
            thread::spawn(move || map.put(1, 10, Duration::from_secs(3600)))
        };
        map.retain(|_, &v| v != 1);
        writer.join().unwrap();
        assert_eq!(map.get(&1), Some(10));
    });
}

/// `retain` rejecting key 1 while another thread writes key 2 of the same
/// shard: conflicts are per entry, so the verdict on 1 is applied.
#[test]
fn retain_applies_its_verdict_beside_a_write_of_another_key() {
    model(|| {
        let map = loading_map();
        map.put(1, 1, Duration::from_secs(3600));
        let writer = {
            let map = map.clone();
            thread::spawn(move || map.put(2, 20, Duration::from_secs(3600)))
        };
        let mut asked = 0;
        map.retain(|&k, _| {
            asked += 1;
            k != 1
        });
        writer.join().unwrap();
        assert_eq!((map.get(&1), map.get(&2)), (None, Some(20)));
        // Key 2 may have been shown too, if it was put before the walk.
        assert!(asked <= 2, "{asked}");
    });
}

/// A map over `clock` whose values are reloaded after 45 s of a 60 s TTL
/// (refresh ahead), with one shard and no eviction thread.
fn refreshing_map(clock: &ManualClock) -> ExpireMap<u32, u32, Fixed> {
    ExpireMap::builder()
        .hasher(Fixed::default())
        .clock(clock.clone())
        .shards(1)
        .background_eviction(false)
        .time_to_live(Duration::from_secs(60))
        .refresh_after(Duration::from_secs(45))
        .build()
}

/// A reload racing a `put` of its key. The caller that found the stale
/// value gets it (1); the put stands at the end whatever the order: before
/// the reload began (the entry is fresh again, nothing reloads), during it
/// (the reload's value loses), or after it (it overwrites).
#[test]
fn a_reload_racing_a_put_never_overwrites_it() {
    model(|| {
        let clock = ManualClock::new();
        let map = refreshing_map(&clock);
        map.get_with(1, || 1);
        clock.advance(Duration::from_secs(46));
        let writer = {
            let map = map.clone();
            thread::spawn(move || map.put(1, 3, Duration::from_secs(60)))
        };
        let got = map.get_with(1, || 2);
        writer.join().unwrap();
        assert!(got == 1 || got == 3, "{got}");
        assert_eq!(map.get(&1), Some(3));
    });
}

/// A reload racing the entry's expiry and eviction, and a caller that then
/// misses. Whatever the order, the key is loaded at most once more than
/// the reload (the miss waits for the reload's flight, hits its value, or
/// loads before the reload could start, which then finds a fresh value and
/// does not run), and that caller gets what the map holds at the end.
#[test]
fn a_reload_racing_expiry_hands_its_value_to_the_next_miss() {
    model(|| {
        let clock = ManualClock::new();
        let map = refreshing_map(&clock);
        map.get_with(1, || 1);
        clock.advance(Duration::from_secs(46));
        let loads = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let missing = {
            let (map, clock, loads) = (map.clone(), clock.clone(), loads.clone());
            thread::spawn(move || {
                clock.advance(Duration::from_secs(20));
                map.evict_expired();
                map.get_with(1, move || {
                    loads.fetch_add(1, Ordering::SeqCst);
                    9
                })
            })
        };
        let l = loads.clone();
        let found = map.get_with(1, move || {
            l.fetch_add(1, Ordering::SeqCst);
            2
        });
        let missed = missing.join().unwrap();
        assert!(found == 1 || found == 9 || found == 2, "{found}");
        assert!(loads.load(Ordering::SeqCst) <= 2);
        assert_eq!(map.get(&1), Some(missed), "found {found}");
        if missed == 2 {
            assert_eq!(
                loads.load(Ordering::SeqCst),
                1,
                "the miss waited for the reload"
            );
        }
    });
}

/// A write takes due entries of its shard (issue 36) while the eviction
/// thread passes the same shard: keys 1 and 2 come due when another thread
/// advances the clock (which wakes the eviction thread), and a put of key 3
/// races the pass. Whoever takes an entry takes it out of the shard under
/// the lock, so each value leaves exactly once: `Expired` (by the put or
/// by the thread, never before its deadline) or, if neither reached it
/// before the drop, `Shutdown`; and the counts add up.
#[test]
fn a_writer_evicting_races_the_eviction_pass() {
    model(|| {
        let clock = ManualClock::new();
        let map = Arc::new(map(&clock));
        let mut sub = map.subscribe().unwrap();
        map.put(1, 1, MS);
        map.put(2, 2, MS);
        let c = clock.clone();
        let t = thread::spawn(move || c.advance(2 * MS));
        map.put(3, 3, Duration::from_secs(3600));
        t.join().unwrap();
        let map = Arc::try_unwrap(map).expect("one handle");
        let stats_before_drop = map.stats();
        let mut events = Vec::new();
        loop {
            match sub.try_recv() {
                Ok(e) => {
                    assert_eq!(e.cause, Cause::Expired, "key {}", e.key);
                    assert!(e.removed_at() > e.deadline(), "key {} early", e.key);
                    events.push(e.key);
                }
                Err(TryRecvError::Empty) => break,
                Err(e) => panic!("{e:?}"),
            }
        }
        // One entry per write under loom (`WRITER_EVICT`).
        assert!(stats_before_drop.evicted_by_writers <= 1);
        drop(map);
        let rest = until_closed(&mut sub);
        let mut all: Vec<u32> = events.clone();
        all.extend(rest.iter().map(|&(k, _)| k));
        all.sort_unstable();
        assert_eq!(all, [1, 2, 3], "expired {events:?}, then {rest:?}");
        assert!(rest.contains(&(3, Cause::Shutdown)), "{rest:?}");
    });
}

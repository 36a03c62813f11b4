//! Two caches on separate connections stand for two machines: what one
//! writes, the other's near copy drops; TTLs set in Redis bound near copies;
//! the staleness bound holds under concurrent writes.

use crate::common::{Server, eventually};
use expiremap_redis::NearCache;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const HOUR: Duration = Duration::from_secs(3600);

/// A cache whose staleness bound (an hour) never stops near hits during a
/// test: what these tests check is the invalidations, on any machine
/// however slow. The bound itself is tested with a short one.
fn cache(s: &Server) -> NearCache<String, u64> {
    NearCache::builder(s.url())
        .prefix("t:")
        .max_entries(1000)
        .staleness_bound(HOUR)
        .build()
        .expect("connect")
}

#[test]
fn a_write_in_one_drops_the_near_copy_in_the_other() {
    let s = Server::start();
    let (a, b) = (cache(&s), cache(&s));
    let k = "k".to_string();
    assert_eq!(b.get(&k).unwrap(), None);
    a.put(k.clone(), 1, HOUR).unwrap();
    assert_eq!(a.peek_near(&k), Some(1)); // the writer keeps its near copy
    assert_eq!(b.get(&k).unwrap(), Some(1));
    assert_eq!(b.peek_near(&k), Some(1));

    a.put(k.clone(), 2, HOUR).unwrap();
    eventually("b's near copy of 1 dropped", || {
        (b.peek_near(&k) != Some(1)).then_some(())
    });
    assert_eq!(b.get(&k).unwrap(), Some(2));
    assert_eq!(a.peek_near(&k), Some(2)); // NOLOOP: a's own write kept

    a.remove(&k).unwrap();
    eventually("b's near copy of 2 dropped", || {
        (b.peek_near(&k).is_none()).then_some(())
    });
    assert_eq!(b.get(&k).unwrap(), None);

    // Another program's write (not a NearCache) invalidates too.
    b.put(k.clone(), 3, HOUR).unwrap();
    assert_eq!(a.get(&k).unwrap(), Some(3));
    let mut raw = s.raw();
    let _: () = redis::cmd("DEL")
        .arg(b"t:\x01k".as_slice())
        .query(&mut raw)
        .unwrap();
    eventually("both near copies dropped after a raw DEL", || {
        (a.peek_near(&k).is_none() && b.peek_near(&k).is_none()).then_some(())
    });
    assert_eq!((a.get(&k).unwrap(), b.get(&k).unwrap()), (None, None));
}

#[test]
fn a_get_after_the_bound_never_sees_the_replaced_value() {
    // The documented bound: a get that starts more than S after a write
    // completed never returns the value that write replaced. Checked for
    // every read of a reader racing a writer in another "machine". Holds
    // however slow the machine is (the bound is enforced by the reader's
    // own clock), so this test has no timing to miss.
    let s = Server::start();
    let a = cache(&s);
    let b: NearCache<String, u64> = NearCache::builder(s.url())
        .prefix("t:")
        .staleness_bound(Duration::from_millis(20))
        .build()
        .unwrap();
    let bound = b.staleness_bound();
    let k = "counter".to_string();
    a.put(k.clone(), 0, HOUR).unwrap();
    // done[i] = when the put of value i completed.
    let done = Arc::new(Mutex::new(vec![Instant::now()]));
    let stop = Arc::new(AtomicBool::new(false));
    std::thread::scope(|sc| {
        let writer = sc.spawn(|| {
            for i in 1..=300u64 {
                a.put(k.clone(), i, HOUR).unwrap();
                done.lock().unwrap().push(Instant::now());
                std::thread::sleep(Duration::from_micros(300));
            }
            stop.store(true, Ordering::Release);
        });
        while !stop.load(Ordering::Acquire) {
            let start = Instant::now();
            let must_see = {
                let d = done.lock().unwrap();
                d.iter().rposition(|t| *t + bound < start).unwrap_or(0) as u64
            };
            // With S = 20 ms, a slow machine may leave a ping unanswered
            // that long, and the connection is closed: an error is no stale
            // value, so the read is only skipped.
            let v = match b.get(&k) {
                Ok(v) => v.expect("the key is never removed"),
                Err(e) if e.is_connection() => continue,
                Err(e) => panic!("{e}"),
            };
            assert!(
                v >= must_see,
                "read {v}, but {must_see} was written more than {bound:?} before the read began"
            );
        }
        writer.join().unwrap();
    });
    // The bound speaks of reads that start more than S after the write:
    // one that starts sooner may still see 299.
    let last = *done.lock().unwrap().last().unwrap();
    std::thread::sleep(
        (last + bound + Duration::from_millis(1)).saturating_duration_since(Instant::now()),
    );
    assert_eq!(eventually("a read", || b.get(&k).ok()), Some(300));
}

#[test]
fn redis_ttl_bounds_the_near_copy() {
    let s = Server::start();
    let (a, b) = (cache(&s), cache(&s));
    // Assertions on TTLs hold however slow the machine is: a near copy that
    // is still there has less left than its Redis key had.
    let k = "short".to_string();
    a.put(k.clone(), 7, Duration::from_millis(300)).unwrap();
    let short = |t: Option<Duration>| t.is_none_or(|t| t < Duration::from_millis(300));
    assert!(short(a.near_ttl(&k)));
    let v = b.get(&k).unwrap();
    assert!(v == Some(7) || v.is_none(), "{v:?}");
    assert!(
        short(b.near_ttl(&k)),
        "near copy lives {:?}",
        b.near_ttl(&k)
    );

    // A TTL set in Redis by another program: the near copy is dropped (the
    // EXPIRE is a write) and the next one is bounded by it.
    let k2 = "long".to_string();
    a.put(k2.clone(), 8, HOUR).unwrap();
    assert_eq!(b.get(&k2).unwrap(), Some(8));
    assert!(b.near_ttl(&k2).unwrap() <= Duration::from_secs(60)); // the cap
    let mut raw = s.raw();
    let _: () = redis::cmd("PEXPIRE")
        .arg(b"t:\x04long".as_slice())
        .arg(200)
        .query(&mut raw)
        .unwrap();
    eventually("b's near copy dropped by PEXPIRE", || {
        b.peek_near(&k2).is_none().then_some(())
    });
    let v = b.get(&k2).unwrap();
    assert!(v == Some(8) || v.is_none(), "{v:?}");
    assert!(
        b.near_ttl(&k2)
            .is_none_or(|t| t <= Duration::from_millis(200))
    );

    // Once Redis no longer has the key, no near copy shows it.
    eventually("the key expired in redis", || {
        let v: Option<Vec<u8>> = redis::cmd("GET")
            .arg(b"t:\x04long".as_slice())
            .query(&mut raw)
            .unwrap();
        v.is_none().then_some(())
    });
    assert_eq!(b.peek_near(&k2), None);
    assert_eq!(b.get(&k2).unwrap(), None);
    assert_eq!(a.get(&k2).unwrap(), None);
}

#[test]
fn the_cap_bounds_the_near_copy() {
    let s = Server::start();
    let a: NearCache<String, u64> = NearCache::builder(s.url())
        .prefix("t:")
        .staleness_bound(HOUR)
        .max_near_ttl(Duration::from_millis(100))
        .build()
        .unwrap();
    let k = "k".to_string();
    let capped = |t: Option<Duration>| t.is_none_or(|t| t <= Duration::from_millis(100));
    a.put(k.clone(), 1, HOUR).unwrap();
    assert!(capped(a.near_ttl(&k)));
    let mut raw = s.raw();
    let _: () = redis::cmd("SET")
        .arg(b"t:\x01x".as_slice())
        .arg(b"\x05".as_slice())
        .query(&mut raw)
        .unwrap(); // no TTL in Redis: the cap alone
    assert_eq!(a.get(&"x".to_string()).unwrap(), Some(5));
    assert!(capped(a.near_ttl(&"x".to_string())));
}

#[test]
fn flushall_drops_every_near_copy() {
    let s = Server::start();
    let (a, b) = (cache(&s), cache(&s));
    for i in 0..10 {
        a.put(i.to_string(), i, HOUR).unwrap();
        assert_eq!(b.get(&i.to_string()).unwrap(), Some(i));
    }
    let mut raw = s.raw();
    let _: () = redis::cmd("FLUSHALL").query(&mut raw).unwrap();
    eventually("near copies dropped", || {
        (a.near_len() == 0 && b.near_len() == 0).then_some(())
    });
    assert_eq!(b.get(&"3".to_string()).unwrap(), None);
}

#[test]
fn racing_writers_in_two_caches_converge_to_redis() {
    // Two threads per cache put, remove, load and read 16 shared keys at
    // random. Once every write has completed and the staleness bound has
    // passed, both caches must read exactly what Redis holds.
    let s = Server::start();
    let open = || -> NearCache<String, u64> {
        NearCache::builder(s.url())
            .prefix("t:")
            .max_entries(8) // fewer than the keys: the bound pushes copies out too
            .staleness_bound(Duration::from_millis(50))
            .build()
            .unwrap()
    };
    let (a, b) = (open(), open());
    std::thread::scope(|sc| {
        for (t, c) in [&a, &b, &a, &b].into_iter().enumerate() {
            sc.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                for _ in 0..1500 {
                    let r = next();
                    let k = (r % 16).to_string();
                    // A connection closed by a late ping (S = 50 ms on a
                    // slow machine) fails calls; a failed write may or may
                    // not have reached Redis, which the check below allows.
                    let failed = match (r >> 8) % 8 {
                        0 | 1 => c.put(k, r >> 16, HOUR).err(),
                        2 => c.remove(&k).err(),
                        3 => c.get_or_insert_with(k, HOUR, || r >> 16).err(),
                        _ => c.get(&k).err(),
                    };
                    if let Some(e) = failed {
                        assert!(e.is_connection(), "{e}");
                    }
                }
            });
        }
    });
    std::thread::sleep(a.staleness_bound() + Duration::from_millis(1));
    let mut raw = s.raw();
    for i in 0..16 {
        let k = i.to_string();
        let name = [b"t:".as_slice(), &[k.len() as u8], k.as_bytes()].concat(); // postcard: length, bytes
        let held: Option<Vec<u8>> = redis::cmd("GET").arg(name).query(&mut raw).unwrap();
        let va = eventually("a read in a", || a.get(&k).ok());
        let vb = eventually("a read in b", || b.get(&k).ok());
        let expect = held.map(|bytes| postcard::from_bytes::<u64>(&bytes).unwrap());
        assert_eq!((va, vb), (expect, expect), "key {k}");
    }
}

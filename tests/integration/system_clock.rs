//! The map on the real clock (`SystemClock`), whose lookups settle most
//! deadlines with a cheap upper bound on the time instead of an exact read.
//! Asserts only what holds however slow the machine is: an entry read after
//! its deadline (by `Instant`, the same `CLOCK_MONOTONIC`) is never
//! returned, and one read well inside its TTL always is.

use expiremap::ExpireMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Puts keys with TTLs of 50 µs .. 3 ms, then reads each until well after its
/// deadline; any read that started after the deadline must miss.
fn check_thread(map: &ExpireMap<u64, u64>, thread: u64) -> (u64, u64) {
    let (mut hits_after, mut reads_after) = (0, 0);
    for round in 0..300u64 {
        let key = thread << 32 | round;
        let ttl = Duration::from_micros(50 + (round * 7_919) % 3_000);
        map.put(key, round, ttl);
        // The deadline is at most this instant plus the TTL.
        let put_done = Instant::now();
        loop {
            let started = Instant::now();
            let got = map.get(&key);
            let present = map.contains_key(&key);
            if started > put_done + ttl {
                reads_after += 1;
                hits_after += u64::from(got.is_some() || present);
                break;
            }
        }
    }
    (hits_after, reads_after)
}

#[test]
fn no_read_after_the_deadline_returns_the_value() {
    let map = Arc::new(ExpireMap::<u64, u64>::new());
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let map = map.clone();
            std::thread::spawn(move || check_thread(&map, t))
        })
        .collect();
    for t in threads {
        let (hits_after, reads_after) = t.join().unwrap();
        assert_eq!(reads_after, 300);
        assert_eq!(hits_after, 0, "a value was returned after its deadline");
    }
}

#[test]
fn reads_inside_a_long_ttl_always_hit() {
    let map = ExpireMap::<u64, u64>::new();
    for k in 0..10_000 {
        map.put(k, k, Duration::from_secs(3_600));
    }
    // Long enough for the bound to calibrate and be used.
    let until = Instant::now() + Duration::from_millis(20);
    let mut rounds = 0;
    while Instant::now() < until || rounds < 3 {
        for k in 0..10_000 {
            assert_eq!(map.get(&k), Some(k));
            assert!(map.contains_key(&k));
        }
        rounds += 1;
    }
}

//! What broke: `iter()`, `keys()` and `retain` walked each shard's slab up
//! to its length at every step, so a loop body (or `f`) that put a new key
//! per entry, or a thread putting beside a slow loop, kept the walk going
//! for ever: it chased the nodes appended behind it. Fixed by ending each
//! shard's walk at the slab length it found when it reached the shard.

use crate::common::{manual, within};
use expiremap::ExpireMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const MINUTE: Duration = Duration::from_secs(60);

fn one_shard() -> ExpireMap<u64, u64> {
    ExpireMap::builder()
        .shards(1)
        .background_eviction(false)
        .build()
}

#[test]
fn a_loop_body_that_puts_new_keys_ends() {
    let steps = within(60, || {
        let map = one_shard();
        for k in 0..1_000 {
            map.put(k, k, MINUTE);
        }
        let mut steps = 0u64;
        for (next, _) in (1_000_000..).zip(&map) {
            steps += 1;
            map.put(next, next, MINUTE);
            if steps > 10_000 {
                break;
            }
        }
        steps
    })
    .unwrap();
    assert_eq!(
        steps, 1_000,
        "one step per entry present when the walk began"
    );
}

#[test]
fn retain_whose_f_puts_new_keys_ends() {
    let asked = within(60, || {
        let map = one_shard();
        for k in 0..1_000 {
            map.put(k, k, MINUTE);
        }
        let mut asked = 0u64;
        let mut next = 1_000_000;
        map.retain(|_, _| {
            asked += 1;
            if asked <= 10_000 {
                map.put(next, next, MINUTE);
                next += 1;
            }
            true
        });
        asked
    })
    .unwrap();
    assert_eq!(asked, 1_000);
}

/// A slow loop beside a thread that never stops putting: the walk ends.
#[test]
fn a_slow_walk_beside_a_putting_thread_ends() {
    let map = Arc::new(one_shard());
    for k in 0..300 {
        map.put(k, k, MINUTE);
    }
    let (walking, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (m, w, s) = (map.clone(), walking.clone(), stop.clone());
    let putter = std::thread::spawn(move || {
        while !w.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        let mut k = 1_000_000;
        while !s.load(Ordering::Relaxed) {
            m.put(k, k, MINUTE);
            k += 1;
        }
    });
    let (m, w) = (map.clone(), walking.clone());
    let r = within(120, move || {
        let mut n = 0u64;
        for _ in m.iter() {
            // The putter starts once the walk has reached the shard.
            w.store(true, Ordering::Release);
            n += 1;
            std::thread::sleep(Duration::from_micros(20));
            if n > 20_000 {
                break;
            }
        }
        n
    });
    stop.store(true, Ordering::Relaxed);
    walking.store(true, Ordering::Release);
    putter.join().unwrap();
    // The putter's keys all went to nodes past the 300 the walk found.
    assert_eq!(r.unwrap(), 300, "the walk chased the putter");
}

/// Entries present throughout are still yielded exactly once.
#[test]
fn a_bounded_walk_still_yields_every_entry_present_throughout() {
    let (map, _clock) = manual::<u64, u64>();
    for k in 0..500 {
        map.put(k, k, MINUTE);
    }
    let mut seen: Vec<u64> = Vec::new();
    for (k, _) in &map {
        if k < 500 {
            seen.push(k);
        }
        map.put(k + 10_000, 0, MINUTE);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..500).collect::<Vec<_>>());
}

//! Shard-level tests: random operations on one shard with `validate()` (table
//! and wheel agree, every timer tick matches its entry's deadline) after each.

use super::shard::{Door, PutOutcome, Shard};
use std::collections::HashMap;

const P: u64 = 1_000;

fn h(k: u64) -> u64 {
    // A poor hash on purpose: many collisions exercise Eq-by-index removal.
    k % 7
}

#[test]
fn shard_random_ops_keep_table_and_wheel_consistent() {
    let mut s: Shard<u64, u64> = Shard::new(P, 0);
    let mut model: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut x = 0x1234_5678_u64;
    let mut rnd = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut now = 0u64;
    let mut out = Vec::new();
    for step in 0..if cfg!(miri) { 500 } else { 50_000 } {
        let k = rnd(64);
        match rnd(10) {
            0..=3 => {
                let d = now + 1 + rnd(20 * P);
                match s.put(h(k), k, step, d, now) {
                    PutOutcome::Inserted => assert!(!model.contains_key(&k)),
                    PutOutcome::Overwrote(r) => {
                        let (v, old) = model[&k];
                        assert_eq!(r.value, v);
                        let door = if now <= old {
                            Door::Replaced
                        } else {
                            Door::Expired
                        };
                        assert_eq!(r.door, door);
                    }
                }
                model.insert(k, (step, d));
            }
            4 => {
                let r = s.remove(h(k), &k, now);
                assert_eq!(r.map(|r| r.value), model.remove(&k).map(|m| m.0));
            }
            5 => {
                let d = now + 1 + rnd(5 * P);
                let live = model.get(&k).is_some_and(|m| now <= m.1);
                assert_eq!(s.touch(h(k), &k, d, now), live);
                if live {
                    model.get_mut(&k).unwrap().1 = d;
                }
            }
            6 | 7 => now += rnd(3 * P),
            8 => {
                while s.evict(now, 3, &mut out) {}
                for r in out.drain(..) {
                    let (v, d) = model.remove(&r.key).expect("evicted a key not held");
                    assert_eq!(r.value, v);
                    assert!(d < now, "evicted early");
                }
                for (_, d) in model.values() {
                    assert!((d / P + 1) > now / P, "a due entry was left");
                }
            }
            _ => {
                let got = s.get(h(k), &k, now).map(|e| e.value);
                let want = model.get(&k).filter(|m| now <= m.1).map(|m| m.0);
                assert_eq!(got, want);
            }
        }
        s.validate();
        assert_eq!(s.len(), model.len());
    }
}

#[test]
fn take_all_leaves_an_empty_shard_and_drains_everything() {
    let mut s: Shard<u64, u64> = Shard::new(P, 0);
    for k in 0..100 {
        s.put(h(k), k, k, 10 * P, 0);
    }
    let taken = s.take_all(5);
    s.validate();
    assert_eq!(s.len(), 0);
    let mut n = 0;
    taken.drain(|_| n += 1);
    assert_eq!(n, 100);
}

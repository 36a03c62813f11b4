//! The model test: random operations on wheels of every `R` against a
//! `BTreeMap` model, `validate()` after each mutation.

use super::*;
use std::collections::{BTreeMap, HashMap};

struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random tick offset over every magnitude: small, one bit, huge.
fn jump(rng: &mut SplitMix64) -> u64 {
    match rng.below(8) {
        0 => 0,
        1 => 1,
        2 => rng.below(16),
        3 => rng.below(1 << 12),
        4 => 1 << rng.below(64),
        5 => (1u64 << rng.below(64)).wrapping_sub(1),
        6 => rng.next() >> rng.below(64),
        _ => rng.below(1 << 30),
    }
}

fn model_run<const R: u32>(seed: u64, ops: usize) {
    println!("timer model: R={R} seed={seed} ops={ops} (rerun with EXPIREMAP_SEED={seed})");
    let mut rng = SplitMix64(seed);
    let mut done = 0;
    let mut episode = 0;
    while done < ops {
        // Fresh wheel per episode: an advance to near u64::MAX ends the
        // interesting part of an episode (every later deadline is due).
        let len = (2_000 + rng.below(8_000) as usize).min(ops - done);
        model_episode::<R>(&mut rng, seed, episode, len);
        done += len;
        episode += 1;
    }
}

fn model_episode<const R: u32>(rng: &mut SplitMix64, seed: u64, episode: usize, ops: usize) {
    let start = match rng.below(8) {
        0 => u64::MAX - rng.below(1 << 20),
        1 => 0,
        _ => rng.below(1 << 40),
    };
    let mut w: TimerWheel<u64, R> = TimerWheel::with_level_bits(start);
    // Reference: pending (deadline, serial) -> id, and serial -> (id, deadline).
    let mut by_deadline: BTreeMap<(u64, u64), TimerId> = BTreeMap::new();
    let mut pending: HashMap<u64, (TimerId, u64)> = HashMap::new();
    let mut serials: Vec<u64> = Vec::new();
    let mut dead: Vec<TimerId> = Vec::new();
    let mut serial = 0u64;
    let mut now = start;
    let cap = 1 + rng.below(256);

    for step in 0..ops {
        let ctx = || format!("seed {seed} episode {episode} step {step}");
        if rng.below(4) == 0 {
            // Walking ahead (as the map's passes do) changes nothing seen.
            let budget = [1, 2, 5, usize::MAX][rng.below(4) as usize];
            if rng.below(2) == 0 {
                w.precascade(budget);
            } else {
                w.precascade2(budget);
            }
        }
        let op = rng.below(100);
        let full = pending.len() as u64 >= cap;
        match op {
            0..=34 if !full => {
                let d = match rng.below(10) {
                    0 => now.saturating_sub(jump(rng)),
                    1 => u64::MAX - rng.below(4),
                    _ => now.saturating_add(jump(rng)),
                };
                serial += 1;
                let id = w.insert(d, serial);
                by_deadline.insert((d, serial), id);
                pending.insert(serial, (id, d));
                serials.push(serial);
            }
            0..=44 => {
                // cancel: a live timer, or a stale id
                if !serials.is_empty() && rng.below(4) != 0 {
                    let i = rng.below(serials.len() as u64) as usize;
                    let s = serials.swap_remove(i);
                    let (id, d) = pending.remove(&s).unwrap();
                    by_deadline.remove(&(d, s));
                    assert_eq!(w.cancel(id), Some(s), "{}", ctx());
                    dead.push(id);
                } else if let Some(&id) = dead.get(rng.below(dead.len() as u64 + 1) as usize) {
                    if w.get(id).is_none() {
                        assert_eq!(w.cancel(id), None, "{}", ctx());
                    }
                }
            }
            45..=59 => {
                if serials.is_empty() {
                    continue;
                }
                let s = serials[rng.below(serials.len() as u64) as usize];
                let (id, old) = pending[&s];
                let d = match rng.below(4) {
                    0 => now.saturating_sub(jump(rng)),
                    1 => old.saturating_sub(jump(rng)),
                    _ => now.saturating_add(jump(rng)),
                };
                assert!(w.reschedule(id, d), "{}", ctx());
                by_deadline.remove(&(old, s));
                by_deadline.insert((d, s), id);
                pending.insert(s, (id, d));
                if let Some(&stale) = dead.last() {
                    if w.get(stale).is_none() {
                        assert!(!w.reschedule(stale, d), "{}", ctx());
                    }
                }
            }
            _ => {
                let pick = rng.below(by_deadline.len() as u64 + 1) as usize;
                let some_deadline = by_deadline.keys().nth(pick).map_or(now, |k| k.0);
                let target = match rng.below(64) {
                    0..=7 => now.saturating_sub(jump(rng)), // backward: a no-op
                    8..=23 => w.next_wakeup().unwrap_or(now),
                    24..=39 => some_deadline.saturating_add(rng.below(3)).saturating_sub(1),
                    40 => u64::MAX - rng.below(8),
                    _ => now.saturating_add(jump(rng)),
                };
                // next_wakeup contract
                match w.next_wakeup() {
                    None => assert!(pending.is_empty(), "{}", ctx()),
                    Some(t) => {
                        let earliest = by_deadline.keys().next().unwrap().0;
                        if earliest <= now {
                            assert_eq!(t, now, "{}", ctx());
                        } else {
                            assert!(t > now && t <= earliest, "{}", ctx());
                        }
                    }
                }
                let limit = if rng.below(4) == 0 {
                    1 + rng.below(3) as usize
                } else {
                    usize::MAX
                };
                let mut fired = Vec::new();
                let mut more = w.advance_at_most(target, limit, |id, s| fired.push((id, s)));
                w.validate();
                while more {
                    more = w.advance_at_most(target, limit, |id, s| fired.push((id, s)));
                }
                now = now.max(target);
                assert_eq!(w.now(), now, "{}", ctx());
                let mut expected: Vec<u64> = Vec::new();
                while let Some((&(d, s), _)) = by_deadline.first_key_value() {
                    if d > now {
                        break;
                    }
                    by_deadline.pop_first();
                    pending.remove(&s);
                    expected.push(s);
                }
                let mut got: Vec<u64> = fired.iter().map(|&(_, s)| s).collect();
                got.sort_unstable();
                expected.sort_unstable();
                assert_eq!(got, expected, "{}: fired set differs", ctx());
                dead.extend(fired.into_iter().map(|(id, _)| id));
                serials.retain(|s| pending.contains_key(s));
                if dead.len() > 512 {
                    dead.drain(..256);
                }
            }
        }
        w.validate();
        assert_eq!(w.len(), pending.len(), "{}", ctx());
    }
    let mut rest = Vec::new();
    w.drain(|_, s| rest.push(s));
    rest.sort_unstable();
    let mut expected: Vec<u64> = pending.keys().copied().collect();
    expected.sort_unstable();
    assert_eq!(rest, expected, "seed {seed} episode {episode}: drain");
}

fn model_seed() -> u64 {
    std::env::var("EXPIREMAP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x005E_ED0F_71AE)
}

/// Operations per model run: 1,000,000 for the default R in release builds,
/// fewer in debug builds and under Miri.
fn model_ops(release: usize) -> usize {
    if cfg!(miri) {
        2_000
    } else if cfg!(debug_assertions) {
        release / 20
    } else {
        release
    }
}

#[test]
fn model_default_r_one_million_ops() {
    model_run::<{ DEFAULT_LEVEL_BITS }>(model_seed(), model_ops(1_000_000));
}

#[test]
fn model_r1_hitime() {
    model_run::<1>(model_seed() ^ 1, model_ops(300_000));
}

#[test]
fn model_r6() {
    model_run::<6>(model_seed() ^ 6, model_ops(300_000));
}

#[test]
fn model_r2_r3_r5() {
    model_run::<2>(model_seed() ^ 2, model_ops(100_000));
    model_run::<3>(model_seed() ^ 3, model_ops(100_000));
    model_run::<5>(model_seed() ^ 5, model_ops(100_000));
}

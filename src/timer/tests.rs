//! Unit, edge and model tests of the timer wheel. `validate()` runs after
//! every mutation in the model test.

use super::*;
use std::collections::{BTreeMap, HashMap};

/// Advances and returns the fired payloads, validating before and after.
fn fire<T, const R: u32>(w: &mut TimerWheel<T, R>, now: u64) -> Vec<T> {
    w.validate();
    let mut out = Vec::new();
    w.advance(now, |_, v| out.push(v));
    w.validate();
    out
}

/// Checks that a timer at `deadline` inserted at `start` fires exactly at its
/// deadline: not at `deadline - 1`, yes at `deadline`.
fn fires_exactly_at<const R: u32>(start: u64, deadline: u64) {
    let mut w: TimerWheel<u64, R> = TimerWheel::with_level_bits(start);
    w.insert(deadline, deadline);
    w.validate();
    if deadline > start {
        assert!(
            fire(&mut w, deadline - 1).is_empty(),
            "R={R} start={start} deadline={deadline} fired early"
        );
    }
    assert_eq!(
        fire(&mut w, deadline),
        [deadline],
        "R={R} start={start} deadline={deadline}"
    );
    assert!(w.is_empty());
}

fn boundary_case(offset: i64) {
    for k in 1..64u32 {
        let d = (1u64 << k).wrapping_add_signed(offset);
        fires_exactly_at::<1>(0, d);
        fires_exactly_at::<{ DEFAULT_LEVEL_BITS }>(0, d);
        fires_exactly_at::<6>(0, d);
        // Same boundary relative to a non-zero start.
        let start: u64 = 12_345;
        if let Some(d2) = start.checked_add(d) {
            fires_exactly_at::<1>(start, d2);
            fires_exactly_at::<6>(start, d2);
        }
    }
}

#[test]
fn bin_boundary_minus_one() {
    boundary_case(-1);
}

#[test]
fn bin_boundary_exact() {
    boundary_case(0);
}

#[test]
fn bin_boundary_plus_one() {
    boundary_case(1);
}

#[test]
fn level_boundaries_for_each_r() {
    fn run<const R: u32>() {
        for level in 0..TimerWheel::<u64, R>::LEVELS as u32 {
            let shift = level * R;
            if shift >= 64 {
                break;
            }
            let base = 1u64 << shift;
            for d in [base - 1, base, base + 1, base.saturating_mul(3)] {
                if d > 0 {
                    fires_exactly_at::<R>(0, d);
                }
            }
        }
    }
    run::<1>();
    run::<2>();
    run::<3>();
    run::<4>();
    run::<5>();
    run::<6>();
}

#[test]
fn new_wheel_is_empty() {
    let w: TimerWheel<()> = TimerWheel::new(7);
    assert!(w.is_empty());
    assert_eq!(w.len(), 0);
    assert_eq!(w.now(), 7);
    assert_eq!(w.next_wakeup(), None);
    w.validate();
}

#[test]
fn advance_one_before_deadline_does_not_fire() {
    let mut w = TimerWheel::new(0);
    w.insert(100, 'a');
    assert!(fire(&mut w, 99).is_empty());
    assert_eq!(w.len(), 1);
    assert_eq!(fire(&mut w, 100), ['a']);
}

#[test]
fn deadline_equal_to_now_fires_at_next_advance() {
    let mut w = TimerWheel::new(50);
    w.insert(50, 1);
    assert_eq!(w.next_wakeup(), Some(50));
    assert_eq!(fire(&mut w, 50), [1]);
}

#[test]
fn deadline_in_the_past_fires_at_next_advance() {
    let mut w = TimerWheel::new(1000);
    w.insert(3, 'p');
    w.insert(0, 'z');
    assert_eq!(fire(&mut w, 1000), ['p', 'z']);
}

#[test]
fn advance_by_zero_fires_only_what_is_due() {
    let mut w = TimerWheel::new(10);
    w.insert(10, 'd');
    w.insert(11, 'n');
    assert_eq!(fire(&mut w, 10), ['d']);
    assert!(fire(&mut w, 10).is_empty());
    assert_eq!(w.len(), 1);
}

#[test]
fn advance_by_one_tick_at_a_time() {
    let mut w = TimerWheel::new(0);
    for d in 1..=200u64 {
        w.insert(d, d);
    }
    for now in 1..=200u64 {
        assert_eq!(fire(&mut w, now), [now], "tick {now}");
    }
    assert!(w.is_empty());
}

#[test]
fn huge_jump_fires_everything_due_and_nothing_else() {
    let mut w = TimerWheel::new(0);
    let ds = [
        1u64,
        17,
        1 << 20,
        1 << 40,
        (1 << 62) + 5,
        u64::MAX - 1,
        u64::MAX,
    ];
    for &d in &ds {
        w.insert(d, d);
    }
    let mut got = fire(&mut w, u64::MAX - 1);
    got.sort_unstable();
    assert_eq!(got, &ds[..ds.len() - 1]);
    assert_eq!(fire(&mut w, u64::MAX), [u64::MAX]);
}

/// Regression: old hitime code moved `last` back on an earlier `now` and then
/// fired timers early.
#[test]
fn backward_advance_is_a_no_op() {
    let mut w = TimerWheel::new(1000);
    w.insert(1500, 'x');
    assert!(fire(&mut w, 10).is_empty());
    assert_eq!(w.now(), 1000);
    assert!(fire(&mut w, 1499).is_empty());
    assert_eq!(fire(&mut w, 1500), ['x']);
}

#[test]
fn backward_advance_does_not_fire_early_later() {
    let mut w = TimerWheel::new(1 << 20);
    w.insert((1 << 20) + 3, 'y');
    fire(&mut w, 0);
    fire(&mut w, 5);
    assert!(fire(&mut w, (1 << 20) + 2).is_empty());
    assert_eq!(fire(&mut w, (1 << 20) + 3), ['y']);
}

#[test]
fn u64_max_deadline_stays_pending_until_max() {
    let mut w = TimerWheel::new(0);
    w.insert(u64::MAX, ());
    assert!(fire(&mut w, u64::MAX - 1).is_empty());
    assert_eq!(w.len(), 1);
    assert_eq!(fire(&mut w, u64::MAX).len(), 1);
}

#[test]
fn wheel_starting_at_u64_max_treats_everything_as_due() {
    let mut w = TimerWheel::new(u64::MAX);
    w.insert(u64::MAX, 1);
    w.insert(0, 2);
    assert_eq!(w.next_wakeup(), Some(u64::MAX));
    assert_eq!(fire(&mut w, u64::MAX), [1, 2]);
    assert_eq!(fire(&mut w, 0), Vec::<i32>::new());
}

#[test]
fn deadlines_near_max_fire_in_order() {
    let mut w = TimerWheel::new(u64::MAX - 100);
    for d in (u64::MAX - 10..=u64::MAX).rev() {
        w.insert(d, d);
    }
    let mut now = w.now();
    let mut order = Vec::new();
    while let Some(t) = w.next_wakeup() {
        assert!(t >= now);
        now = t;
        order.extend(fire(&mut w, t));
    }
    assert_eq!(order, (u64::MAX - 10..=u64::MAX).collect::<Vec<_>>());
}

#[test]
fn stale_id_after_fire_is_not_found_by_cancel() {
    let mut w = TimerWheel::new(0);
    let id = w.insert(5, 'a');
    fire(&mut w, 5);
    assert_eq!(w.cancel(id), None);
    assert_eq!(w.get(id), None);
}

#[test]
fn stale_id_after_fire_is_not_found_by_reschedule() {
    let mut w = TimerWheel::new(0);
    let id = w.insert(5, 'a');
    fire(&mut w, 5);
    assert!(!w.reschedule(id, 10));
    assert!(w.is_empty());
}

#[test]
fn cancel_returns_payload_and_it_never_fires() {
    let mut w = TimerWheel::new(0);
    let id = w.insert(5, String::from("x"));
    assert_eq!(w.cancel(id).as_deref(), Some("x"));
    assert!(fire(&mut w, 100).is_empty());
}

#[test]
fn cancel_twice_is_none() {
    let mut w = TimerWheel::new(0);
    let id = w.insert(5, 1);
    assert_eq!(w.cancel(id), Some(1));
    assert_eq!(w.cancel(id), None);
    w.validate();
}

#[test]
fn due_but_unfired_timer_can_be_cancelled() {
    let mut w = TimerWheel::new(0);
    let a = w.insert(1, 'a');
    let b = w.insert(2, 'b');
    // Move both to the due list but fire only one.
    let mut out = Vec::new();
    assert!(w.advance_at_most(10, 1, |_, v| out.push(v)));
    assert_eq!(out, ['a']);
    assert_eq!(w.cancel(a), None);
    assert_eq!(w.cancel(b), Some('b'));
    w.validate();
    assert!(!w.advance_at_most(10, 1, |_, v| out.push(v)));
    assert_eq!(out, ['a']);
}

#[test]
fn reused_slot_makes_old_id_stale() {
    let mut w = TimerWheel::new(0);
    let old = w.insert(5, "old");
    w.cancel(old);
    let new = w.insert(7, "new");
    assert_eq!(old.index(), new.index(), "slot should be reused");
    assert_ne!(old, new);
    assert_eq!(w.cancel(old), None);
    assert!(!w.reschedule(old, 1));
    assert_eq!(w.deadline(new), Some(7));
    assert_eq!(fire(&mut w, 7), ["new"]);
}

#[test]
fn stale_id_never_touches_a_newer_timer_in_the_slot() {
    let mut w = TimerWheel::new(0);
    let old = w.insert(1, 1);
    fire(&mut w, 1);
    let new = w.insert(50, 2);
    assert_eq!(old.index(), new.index());
    assert_eq!(w.get(old), None);
    assert_eq!(w.get_mut(old), None);
    assert_eq!(w.deadline(old), None);
    assert_eq!(w.get(new), Some(&2));
}

#[test]
fn reschedule_earlier() {
    let mut w = TimerWheel::new(0);
    let id = w.insert(1 << 30, 'e');
    assert!(w.reschedule(id, 10));
    assert_eq!(w.deadline(id), Some(10));
    assert!(fire(&mut w, 9).is_empty());
    assert_eq!(fire(&mut w, 10), ['e']);
}

#[test]
fn reschedule_later() {
    let mut w = TimerWheel::new(0);
    let id = w.insert(10, 'l');
    assert!(w.reschedule(id, 1 << 30));
    assert!(fire(&mut w, 10).is_empty());
    assert!(fire(&mut w, (1 << 30) - 1).is_empty());
    assert_eq!(fire(&mut w, 1 << 30), ['l']);
}

#[test]
fn reschedule_into_the_past_fires_at_next_advance() {
    let mut w = TimerWheel::new(100);
    let id = w.insert(500, 'p');
    assert!(w.reschedule(id, 3));
    assert_eq!(w.next_wakeup(), Some(100));
    assert_eq!(fire(&mut w, 100), ['p']);
}

#[test]
fn reschedule_due_timer_back_into_the_future() {
    let mut w = TimerWheel::new(0);
    let a = w.insert(1, 'a');
    w.insert(1, 'b');
    let mut out = Vec::new();
    w.advance_at_most(5, 1, |_, v| out.push(v));
    // 'b' is due but unfired: push it out again.
    let b = w.id_at(a.index() + 1).unwrap();
    assert!(w.reschedule(b, 8));
    w.validate();
    assert!(fire(&mut w, 7).is_empty());
    assert_eq!(fire(&mut w, 8), ['b']);
}

#[test]
fn reschedule_to_same_deadline_keeps_it() {
    let mut w = TimerWheel::new(0);
    let id = w.insert(64, 's');
    assert!(w.reschedule(id, 64));
    assert_eq!(fire(&mut w, 64), ['s']);
}

#[test]
fn next_wakeup_none_when_empty() {
    let mut w = TimerWheel::new(0);
    let id = w.insert(3, ());
    w.cancel(id);
    assert_eq!(w.next_wakeup(), None);
}

#[test]
fn next_wakeup_is_now_when_something_is_due() {
    let mut w = TimerWheel::new(40);
    w.insert(100, ());
    w.insert(39, ());
    assert_eq!(w.next_wakeup(), Some(40));
}

#[test]
fn next_wakeup_lies_between_now_and_earliest_deadline() {
    let mut w = TimerWheel::new(1_000);
    for d in [5_000u64, 1_001, 77_777, 1 << 33] {
        w.insert(d, d);
    }
    let t = w.next_wakeup().unwrap();
    assert!(t > 1_000 && t <= 1_001);
    fire(&mut w, 1_001);
    let t = w.next_wakeup().unwrap();
    assert!(t > 1_001 && t <= 5_000, "{t}");
}

#[test]
fn driving_only_by_next_wakeup_fires_each_timer_at_its_deadline() {
    let mut w = TimerWheel::new(3);
    let ds = [4u64, 9, 9, 100, 1 << 20, (1 << 20) + 1, 1 << 45, u64::MAX];
    for &d in &ds {
        w.insert(d, d);
    }
    let mut fired = Vec::new();
    while let Some(t) = w.next_wakeup() {
        w.advance(t, |_, d| {
            assert_eq!(d, t, "fired at {t}, deadline {d}");
            fired.push(d);
        });
        w.validate();
    }
    assert_eq!(fired, ds);
}

#[test]
fn drain_fires_everything_and_empties() {
    let mut w = TimerWheel::new(0);
    for d in [5u64, 1 << 50, u64::MAX, 0] {
        w.insert(d, d);
    }
    let mut out = Vec::new();
    w.drain(|_, d| out.push(d));
    w.validate();
    assert_eq!(out, [0, 5, 1 << 50, u64::MAX]);
    assert!(w.is_empty());
    assert_eq!(w.next_wakeup(), None);
}

#[test]
fn drain_on_empty_wheel_fires_nothing() {
    let mut w: TimerWheel<u8> = TimerWheel::new(9);
    let mut n = 0;
    w.drain(|_, _| n += 1);
    assert_eq!(n, 0);
    w.validate();
}

#[test]
fn wheel_is_usable_after_drain() {
    let mut w = TimerWheel::new(0);
    let old = w.insert(10, 1);
    w.drain(|_, _| {});
    assert_eq!(w.cancel(old), None);
    w.insert(20, 2);
    assert_eq!(fire(&mut w, 20), [2]);
}

#[test]
fn same_deadline_fires_first_in_first_out() {
    let mut w = TimerWheel::new(0);
    for i in 0..10 {
        w.insert(1 << 12, i);
    }
    assert_eq!(fire(&mut w, 1 << 12), (0..10).collect::<Vec<_>>());
}

#[test]
fn fires_sorted_across_bins() {
    let mut w = TimerWheel::new(0);
    let ds = [1u64 << 40, 3, 1 << 9, 70, 1 << 20];
    for &d in &ds {
        w.insert(d, d);
    }
    let mut sorted = ds;
    sorted.sort_unstable();
    assert_eq!(fire(&mut w, u64::MAX), sorted);
}

#[test]
fn len_tracks_insert_cancel_and_fire() {
    let mut w = TimerWheel::new(0);
    let a = w.insert(1, ());
    w.insert(2, ());
    w.insert(3, ());
    assert_eq!(w.len(), 3);
    w.cancel(a);
    assert_eq!(w.len(), 2);
    fire(&mut w, 2);
    assert_eq!(w.len(), 1);
    fire(&mut w, 3);
    assert!(w.is_empty());
}

#[test]
fn get_and_get_mut_reach_the_payload() {
    let mut w = TimerWheel::new(0);
    let id = w.insert(9, vec![1]);
    w.get_mut(id).unwrap().push(2);
    assert_eq!(w.get(id), Some(&vec![1, 2]));
    assert_eq!(fire(&mut w, 9), [vec![1, 2]]);
}

#[test]
fn id_at_recovers_the_handle_of_a_pending_timer() {
    let mut w = TimerWheel::new(0);
    let id = w.insert(9, 'i');
    assert_eq!(w.id_at(id.index()), Some(id));
    assert_eq!(w.id_at(id.index() + 1), None);
    assert_eq!(w.get_at(id.index()), Some(&'i'));
    w.cancel(id);
    assert_eq!(w.id_at(id.index()), None);
    assert_eq!(w.get_at(id.index()), None);
}

#[test]
fn advance_at_most_bounds_the_work_per_call() {
    let mut w = TimerWheel::new(0);
    for d in 1..=10u64 {
        w.insert(d, d);
    }
    let mut out = Vec::new();
    assert!(w.advance_at_most(100, 4, |_, d| out.push(d)));
    assert_eq!(out, [1, 2, 3, 4]);
    assert!(w.advance_at_most(100, 4, |_, d| out.push(d)));
    assert!(!w.advance_at_most(100, 4, |_, d| out.push(d)));
    assert_eq!(out, (1..=10).collect::<Vec<_>>());
    assert!(!w.advance_at_most(100, 0, |_, _| unreachable!()));
}

#[test]
fn crowded_slot_is_redistributed_without_loss() {
    let mut w: TimerWheel<u64, 1> = TimerWheel::with_level_bits(0);
    // All in hitime bin 20 relative to 0.
    for i in 0..1000u64 {
        w.insert((1 << 20) + i * 37, i);
    }
    assert!(fire(&mut w, 1 << 20).len() == 1);
    let rest = fire(&mut w, (1 << 20) + 999 * 37);
    assert_eq!(rest, (1..1000).collect::<Vec<_>>());
}

#[test]
fn r1_places_timers_in_hitime_bins() {
    let mut w: TimerWheel<(), 1> = TimerWheel::with_level_bits(0b1010_0000);
    let id = w.insert(0b1100_0000, ());
    // msb(0b1100_0000 ^ 0b1010_0000) = 6: bin 6, digit 1 (list ids
    // count from 1, after the due list's 0).
    assert_eq!(w.lists.list_for(0b1100_0000), 1 + 6 * 2 + 1);
    assert_eq!(w.deadline(id), Some(0b1100_0000));
    assert_eq!(w.next_wakeup(), Some(0b1100_0000));
}

#[test]
fn next_wakeup_is_exact_for_r1_top_bin() {
    let mut w: TimerWheel<(), 1> = TimerWheel::with_level_bits(0);
    w.insert(u64::MAX, ());
    assert_eq!(w.next_wakeup(), Some(1 << 63));
}

#[test]
fn r6_top_level_is_partial_and_works() {
    let mut w: TimerWheel<u64, 6> = TimerWheel::with_level_bits(0);
    w.insert(15 << 60, 1);
    w.insert(u64::MAX, 2);
    assert_eq!(w.next_wakeup(), Some(15 << 60));
    assert_eq!(fire(&mut w, 15 << 60), [1]);
    assert_eq!(fire(&mut w, u64::MAX), [2]);
}

#[test]
fn node_costs_24_bytes_plus_payload() {
    assert_eq!(std::mem::size_of::<Node<[u64; 4]>>(), 56);
    assert_eq!(std::mem::size_of::<Node<u64>>(), 32);
}

#[test]
fn debug_output_names_the_state() {
    let mut w = TimerWheel::new(5);
    w.insert(9, ());
    let s = format!("{w:?}");
    assert!(s.contains("now: 5") && s.contains("len: 1"), "{s}");
}

#[test]
fn every_payload_is_dropped_exactly_once() {
    use std::rc::Rc;
    let token = Rc::new(());
    {
        let mut w = TimerWheel::new(0);
        let a = w.insert(1, token.clone());
        w.insert(2, token.clone());
        w.insert(3, token.clone());
        w.insert(u64::MAX, token.clone());
        drop(w.cancel(a));
        fire(&mut w, 2);
        assert_eq!(Rc::strong_count(&token), 3);
    } // the wheel drops the two still pending
    assert_eq!(Rc::strong_count(&token), 1);
}

// ---- model test ----------------------------------------------------------

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

/// The next level-1 slot's timers walked ahead of time, a few at a time:
/// nothing fires early, the crossing fires exactly what is due, and
/// `next_wakeup` keeps to its contract while they sit in the second bank.
#[test]
fn walking_ahead_then_crossing_fires_exactly_what_is_due() {
    let mut w: TimerWheel<u64, 6> = TimerWheel::with_level_bits(10);
    for d in [128, 129, 150, 191, 192, 300, 5000] {
        w.insert(d, d);
    }
    assert_eq!(fire(&mut w, 64), Vec::<u64>::new());
    // 128, 129, 150 and 191 are on the list the crossing of 128 would walk.
    assert!(w.precascade(2), "two walked, two left");
    w.validate();
    assert!(!w.precascade(usize::MAX));
    w.validate();
    assert_eq!(w.next_wakeup(), Some(128));
    // Linked meanwhile: straight to its place ahead.
    w.insert(130, 130);
    w.validate();
    assert_eq!(fire(&mut w, 127), Vec::<u64>::new());
    assert_eq!(w.next_wakeup(), Some(128));
    assert_eq!(fire(&mut w, 128), [128]);
    assert_eq!(fire(&mut w, 150), [129, 130, 150]);
    assert_eq!(w.next_wakeup(), Some(191));
    assert_eq!(fire(&mut w, 300), [191, 192, 300]);
    assert_eq!(fire(&mut w, u64::MAX), [5000]);
}

/// Walking ahead of a crossing that also moves the level-2 digit: walked
/// timers go to the second bank and to level-1 lists, which are empty in
/// the last level-1 slot before it; a cancel and a reschedule find them.
#[test]
fn walking_ahead_of_a_level_2_crossing() {
    let mut w: TimerWheel<u64, 6> = TimerWheel::with_level_bits(10);
    let mut ids = vec![];
    for d in [4096, 4100, 4200, 8000, 9000] {
        ids.push(w.insert(d, d));
    }
    // Level-1 digit 63: the next crossing is 4096, a level-2 one.
    assert_eq!(fire(&mut w, 63 * 64 + 10), Vec::<u64>::new());
    w.insert(4090, 4090);
    assert!(w.precascade(1));
    assert!(!w.precascade(usize::MAX));
    w.validate();
    assert_eq!(w.next_wakeup(), Some(4090));
    assert_eq!(w.cancel(ids[1]), Some(4100), "in the second bank");
    assert!(w.reschedule(ids[2], 4300), "on a level-1 list ahead");
    w.validate();
    assert_eq!(fire(&mut w, 4095), [4090]);
    assert_eq!(w.next_wakeup(), Some(4096));
    assert_eq!(fire(&mut w, 4096), [4096]);
    assert_eq!(
        fire(&mut w, 4300),
        [4200],
        "its payload, at its new deadline"
    );
    assert_eq!(fire(&mut w, 8000), [8000]);
    assert!(w.next_wakeup().is_some_and(|t| t > 8000 && t <= 9000));
    assert_eq!(fire(&mut w, 9000), [9000]);
    assert!(w.is_empty());
}

/// A wheel whose only timers went straight to the second bank (no other
/// list ever linked) drains them and fires them at the crossing.
#[test]
fn a_wheel_with_only_timers_ahead_drains_and_fires_them() {
    let mut w: TimerWheel<u64, 6> = TimerWheel::with_level_bits(10);
    w.insert(64, 64);
    w.insert(70, 70);
    let mut drained = vec![];
    w.drain(|_, v| drained.push(v));
    assert_eq!(drained, [64, 70]);
    let mut w2: TimerWheel<u64, 6> = TimerWheel::with_level_bits(10);
    w2.insert(70, 70);
    w2.insert(64, 64);
    assert_eq!(w2.next_wakeup(), Some(64));
    assert_eq!(fire(&mut w2, 64), [64]);
    assert_eq!(fire(&mut w2, 70), [70]);
}

/// The next level-2 slot's timers walked ahead of time into the second
/// bank of level 1 (and levels 2 up), then either moved into place when
/// time enters the last level-1 slot before it, or put back for a move
/// past it in one step: either way every timer fires exactly at its
/// deadline.
#[test]
fn walking_ahead_of_the_next_level_2_slot_then_crossing_it() {
    for jump in [false, true] {
        let mut w: TimerWheel<u64, 6> = TimerWheel::with_level_bits(10);
        for d in [8192, 8193, 8256, 9096, 12287, 12288, 70_000] {
            w.insert(d, d);
        }
        // Linked before 8192's list became the next level-2 slot's (at
        // 4096), so they wait there to be walked.
        assert_eq!(fire(&mut w, 4096), Vec::<u64>::new());
        assert!(w.precascade2(2));
        w.validate();
        assert!(!w.precascade2(usize::MAX));
        w.validate();
        assert_eq!(w.next_wakeup(), Some(8192));
        w.insert(8196, 8196); // straight to the bank's digit 0
        w.validate();
        if !jump {
            for t in (4160..8192).step_by(64) {
                assert_eq!(fire(&mut w, t), Vec::<u64>::new(), "at {t}");
                w.precascade(3);
                w.precascade2(3);
                w.validate();
            }
            assert_eq!(w.next_wakeup(), Some(8192));
        }
        assert_eq!(fire(&mut w, 8192), [8192], "jump {jump}");
        assert_eq!(fire(&mut w, 8256), [8193, 8196, 8256]);
        assert_eq!(fire(&mut w, 12287), [9096, 12287]);
        assert_eq!(fire(&mut w, 12288), [12288]);
        assert_eq!(fire(&mut w, u64::MAX), [70_000]);
    }
}

//! Unit, edge and model tests of the timer wheel. `validate()` runs after
//! every mutation in the model test (`model`); walking ahead has its own
//! (`ahead`).

use super::*;

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

mod ahead;
mod model;

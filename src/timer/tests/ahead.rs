//! Walking ahead (`Lists`, "Walking ahead"): the next slots' timers moved
//! a few at a time before their crossing, which then fires exactly what is
//! due.

use super::*;

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

//! One shard's table and timer wheel under random operations (plain and
//! with idle expiry), checked against a model with `validate()` after each;
//! and the shard's time: ticks, phases, the end of time, eviction at the
//! exact deadline, and when writes take due entries.

use super::*;

#[test]
fn shard_random_ops_keep_table_and_wheel_consistent() {
    // A non-zero phase (see `shard::phase`), which must change nothing.
    let mut s: Shard<u64, u64> = Shard::new(SHIFT, 37, 0);
    let mut model: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut rnd = xorshift(0x1234_5678_u64);
    let mut now = 0u64;
    let mut out = Vec::new();
    for step in 0..if cfg!(miri) { 500 } else { 50_000 } {
        let k = rnd(64);
        match rnd(11) {
            0..=3 => {
                let d = now + 1 + rnd(20 * P);
                match s.put_owned(h(k), k, step, d, now) {
                    PutOutcome::Inserted => assert!(!model.contains_key(&k)),
                    PutOutcome::NoRoom { .. } => panic!("a shard alone always has room"),
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
                    PutOutcome::Refused => unreachable!("unbounded"),
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
                assert_eq!(
                    s.touch(h(k), &k, d, now, crate::map::ExpireIf::Always)
                        .is_some(),
                    live
                );
                if live {
                    model.get_mut(&k).unwrap().1 = d;
                }
            }
            6 | 7 => now += rnd(3 * P),
            8 => {
                while s.evict(now, 3, &mut out).0 {}
                for r in out.drain(..) {
                    let (v, d) = model.remove(&r.key).expect("evicted a key not held");
                    assert_eq!(r.value, v);
                    assert!(d < now, "evicted early");
                }
                for (_, d) in model.values() {
                    assert!((d / P + 1) > now / P, "a due entry was left");
                }
            }
            9 => {
                // One lock hold's worth, as the eviction thread does between
                // other threads' operations: it may leave due entries behind,
                // which the operations that follow must handle (removed,
                // touched or overwritten while on the due list).
                //
                // Half the time with an older reading of the clock, as a
                // caller of `evict_expired` that waited for the lock while
                // another moved the wheel on: it must still evict only what
                // is past its deadline at the time it reports, which is
                // never after `now`.
                let seen = if rnd(2) == 0 {
                    now
                } else {
                    now.saturating_sub(rnd(4 * P))
                };
                let (_, at) = s.evict(seen, 1 + rnd(3) as usize, &mut out);
                // And a hold's walk ahead of time, which evicts nothing.
                s.precascade(1 + rnd(3) as usize, &mut (rnd(3) as usize));
                assert!(
                    seen <= at && at <= now,
                    "evicted at {at}, read {seen}, now {now}"
                );
                for r in out.drain(..) {
                    let (v, d) = model.remove(&r.key).expect("evicted a key not held");
                    assert_eq!(r.value, v);
                    assert!(d < at, "evicted before its deadline");
                }
            }
            _ => {
                let got = s.get(h(k), &k).filter(|&(_, d)| now <= d).map(|(v, _)| *v);
                let want = model.get(&k).filter(|m| now <= m.1).map(|m| m.0);
                assert_eq!(got, want);
            }
        }
        if validates(step) {
            s.validate();
        }
        assert_eq!(s.len(), model.len());
        let floor = s.deadline_floor();
        assert!(model.values().all(|m| floor <= m.1), "floor {floor}");
    }
}

/// `deadline_floor`, the map's `due` for a shard: every held deadline is at
/// or after it, and it is exact while the wheel's next list is short.
#[test]
fn the_deadline_floor_is_exact_for_a_short_next_list() {
    let mut s: Shard<u64, u64> = Shard::new(SHIFT, 3, 0);
    assert_eq!(s.deadline_floor(), u64::MAX, "empty");
    s.put_owned(h(1), 1, 1, u64::MAX, 0);
    assert_eq!(s.deadline_floor(), u64::MAX, "nothing ever expires");
    s.put_owned(h(2), 2, 2, 5 * P + 7, 0);
    s.put_owned(h(3), 3, 3, 5 * P + 3, 0);
    s.put_owned(h(4), 4, 4, 20 * P, 0);
    assert_eq!(s.deadline_floor(), 5 * P + 3, "the earliest deadline");
    // A next list too long to read: the start of the tick its deadlines
    // lie in.
    for k in 10..50 {
        s.put_owned(h(k), k, k, 5 * P + 9, 0);
    }
    assert_eq!(s.deadline_floor(), 5 * P);
    // Entries due on the wheel: 0 until they are evicted.
    let mut out = Vec::new();
    assert!(s.evict(6 * P, 1, &mut out).0);
    assert_eq!(s.deadline_floor(), 0);
    while s.evict(6 * P, usize::MAX, &mut out).0 {}
    assert_eq!(s.deadline_floor(), 20 * P);
    // On a list of a higher level of the wheel (re-placed when time
    // enters its slot): still the deadline.
    s.remove(h(4), &4, 6 * P);
    s.put_owned(h(5), 5, 5, 900 * P + 1, 6 * P);
    assert_eq!(s.deadline_floor(), 900 * P + 1);
}

#[test]
fn take_all_leaves_an_empty_shard_and_drains_everything() {
    let mut s: Shard<u64, u64> = Shard::new(SHIFT, 0, 0);
    for k in 0..100 {
        s.put_owned(h(k), k, k, 10 * P, 0);
    }
    let taken = s.take_all(5);
    s.validate();
    assert_eq!(s.len(), 0);
    let mut n = 0;
    taken.drain(|_| n += 1);
    assert_eq!(n, 100);
}

#[test]
fn tick_shift_rounds_precision_down_to_a_power_of_two() {
    use crate::map::store::shard::tick_shift;
    assert_eq!(tick_shift(1_000_000), 19); // 1 ms -> 524,288 ns
    assert_eq!(tick_shift(1 << 20), 20);
    assert_eq!(tick_shift((1 << 20) - 1), 19);
    assert_eq!(tick_shift(1_000), 9);
    assert_eq!(tick_shift(2), 1);
    assert_eq!(
        tick_shift(1),
        1,
        "never below 1, so tick_for cannot overflow"
    );
    assert_eq!(tick_shift(3_600_000_000_000), 41);
}

/// Regression (two `evict_expired` calls at once): a caller whose time was
/// read before another caller moved the wheel on popped entries from the
/// due list that were still live at its time. In debug builds the
/// `debug_assert!` on the deadline fired between popping the node and
/// removing its table slot, so the unwinding left the table pointing at a
/// vacant node (later lookups read freed memory); in release builds the
/// event's removal time was before the deadline.
#[test]
fn an_older_time_never_evicts_a_live_entry() {
    let mut s: Shard<u64, u64> = Shard::new(SHIFT, 0, 0);
    for k in 0..100 {
        s.put_owned(h(k), k, k, (k + 1) * P, 0);
    }
    let mut out = Vec::new();
    // The later caller moves the wheel to 50 ticks, one entry per batch.
    let (more, at) = s.evict(50 * P, 1, &mut out);
    assert!(more && at == 50 * P);
    // The earlier caller, with a time read before the later one's.
    let (more, at) = s.evict(10 * P, usize::MAX, &mut out);
    assert!(!more);
    assert_eq!(at, 50 * P, "evicts at the time the wheel reached");
    assert_eq!(out.len(), 49);
    for r in &out {
        assert!(r.deadline < at, "deadline {} evicted at {at}", r.deadline);
    }
    s.validate();
}

/// Regression (a clock at `u64::MAX`): deadline `u64::MAX` (saturated) is
/// live forever, and everything else is due once the clock reaches
/// `u64::MAX`, including deadlines in the last tick, which has no tick after
/// it. The wheel then reports no further work, so a driver loop of
/// `next_expiry` and `evict_expired` ends instead of spinning.
#[test]
fn the_end_of_time_evicts_all_but_saturated_deadlines() {
    let last_tick_start = (u64::MAX >> SHIFT) << SHIFT;
    let deadlines = [
        5 * P,
        last_tick_start - 1,
        last_tick_start,
        u64::MAX - 1,
        u64::MAX,
    ];
    let mut s: Shard<u64, u64> = Shard::new(SHIFT, 37, 0);
    for (k, &d) in deadlines.iter().enumerate() {
        s.put_owned(h(k as u64), k as u64, k as u64, d, 0);
    }
    let mut out = Vec::new();
    let mut wakeups = 0;
    while let Some(at) = s.next_wakeup() {
        wakeups += 1;
        assert!(wakeups < 1_000, "the wheel keeps asking for passes");
        let (_, when) = s.evict(at, usize::MAX, &mut out);
        assert!(when >= at);
        s.validate();
    }
    let mut gone: Vec<u64> = out.iter().map(|r| r.deadline).collect();
    gone.sort_unstable();
    assert_eq!(gone, &deadlines[..4]);
    assert_eq!(s.len(), 1, "the saturated deadline stays");
    assert_eq!(s.get(h(4), &4), Some((&4, u64::MAX)));
    // Nothing more happens at the end of time.
    assert!(!s.evict(u64::MAX, usize::MAX, &mut out).0);
    assert_eq!((out.len(), s.next_wakeup()), (4, None));
}

#[test]
fn time_of_saturates_instead_of_wrapping() {
    let s: Shard<u64, u64> = Shard::new(19, 0, 0);
    assert_eq!(s.time_of(3), 3 << 19);
    assert_eq!(s.time_of(s.tick_for(u64::MAX)), u64::MAX);
    // A saturated deadline never expires: its tick is past every tick the
    // clock reaches, even at u64::MAX, which reaches the tick after the last.
    assert_eq!(s.tick_for(u64::MAX), (u64::MAX >> 19) + 2);
    assert_eq!(s.tick_for(u64::MAX - 1), (u64::MAX >> 19) + 1);
    assert_eq!(s.evictable_at(u64::MAX), None);
    assert_eq!(s.evictable_at(u64::MAX - 1), Some(u64::MAX));
    // Never early: the tick of a deadline starts strictly after it.
    for d in [0u64, 1, (1 << 19) - 1, 1 << 19, 12_345_678_901] {
        assert!(s.time_of(s.tick_for(d)) > d);
        assert!(s.time_of(s.tick_for(d)) - d <= 1 << 19);
    }
}

#[test]
fn get_returns_the_exact_deadline() {
    let mut s: Shard<u64, u64> = Shard::new(SHIFT, 0, 0);
    s.put_owned(h(1), 1, 10, 12_345, 0);
    assert_eq!(s.get(h(1), &1), Some((&10, 12_345)));
}

#[test]
fn phases_spread_the_shards_over_the_slots_of_levels_one_to_five() {
    use crate::map::store::shard::phase;
    const REPEAT: u64 = 1 + 64 + 4096 + 262_144 + 16_777_216;
    // 16 shards: 4 ticks apart over the 64 ticks of a level-1 slot, 260
    // apart over the 4,096 of a level-2 slot, and so on to level 5.
    let p: Vec<u64> = (0..16).map(|i| phase(i, 16)).collect();
    assert_eq!(p, (0..16).map(|i| 4 * i * REPEAT).collect::<Vec<u64>>());
    for level in 1..=5u32 {
        let span = 64u64.pow(level);
        let mut at: Vec<u64> = p.iter().map(|x| x % span).collect();
        at.sort_unstable();
        at.dedup();
        assert_eq!(at.len(), 16, "level {level}: shards share a boundary");
        // Evenly enough: no two boundaries (around the circle) closer than
        // half the even spacing.
        let wrap = at[0] + span - at[15];
        let gap = at.windows(2).map(|w| w[1] - w[0]).chain([wrap]).min();
        assert!(gap.unwrap() >= span / 32, "level {level}: {at:?}");
    }
    assert_eq!(phase(0, 1), 0);
    assert_eq!(phase(3, 4), 48 * REPEAT);
    // More shards than slots: neighbours share a phase.
    assert_eq!(phase(1, 128), 0);
    assert_eq!(phase(127, 128), 63 * REPEAT);
    // Far below the 2^62 that `Shard::new` allows.
    assert!(phase(63, 64) < 1 << 31);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "arithmetic and safe list moves, ~20k evict+validate calls: too slow under Miri"
)]
fn a_phased_shard_evicts_exactly_like_an_unphased_one() {
    // The phase renumbers ticks; it must not move a single eviction. Each
    // deadline is evicted at the first multiple of 2^SHIFT after it, never
    // earlier, whatever the phase.
    for phase in [0u64, 1, 17, 63, 63 * 0x104_1041, u64::MAX >> 3] {
        let mut s: Shard<u64, u64> = Shard::new(SHIFT, phase, 0);
        let deadlines = [
            1u64,
            P - 1,
            P,
            P + 1,
            3 * P - 5,
            64 * P,
            64 * P - 1,
            200 * P + 9,
        ];
        for (k, &d) in deadlines.iter().enumerate() {
            s.put_owned(h(k as u64), k as u64, k as u64, d, 0);
            assert_eq!(s.time_of(s.tick_for(d)), (d / P + 1) * P);
        }
        let mut out = Vec::new();
        let mut gone = vec![None; deadlines.len()];
        let mut now = 0;
        while now <= 210 * P {
            s.evict(now, usize::MAX, &mut out);
            for r in out.drain(..) {
                gone[r.key as usize] = Some(now);
            }
            s.validate();
            now += 1 + now % 97; // uneven steps
        }
        for (k, &d) in deadlines.iter().enumerate() {
            let t = gone[k].unwrap_or_else(|| panic!("phase {phase}: {d} never evicted"));
            let boundary = (d / P + 1) * P;
            assert!(
                t >= boundary,
                "phase {phase}: {d} evicted at {t}, before {boundary}"
            );
            assert!(t - boundary <= 97, "phase {phase}: {d} evicted late at {t}");
        }
    }
}

/// An overwrite whose new deadline belongs on the entry's current wheel list
/// changes the deadline in place (no relinking). Eviction must follow the
/// new deadline either way: never at the old one if it moved later, never
/// late if it moved earlier.
#[test]
fn a_deadline_changed_in_place_is_evicted_at_the_new_deadline() {
    let mut s: Shard<u64, u64> = Shard::new(SHIFT, 0, 0);
    // Ticks 71, 101, 121 and 127 all belong on level 1, slot 1 at time 0.
    let at = |ticks: u64| ticks * P;
    assert!(matches!(
        s.put_owned(h(1), 1, 10, at(100) + 5, 0),
        PutOutcome::Inserted
    ));
    assert!(matches!(
        s.put_owned(h(2), 2, 20, at(126), 0),
        PutOutcome::Inserted
    ));
    assert!(matches!(
        s.put_owned(h(1), 1, 11, at(120), 0),
        PutOutcome::Overwrote(_)
    ));
    assert!(matches!(
        s.put_owned(h(2), 2, 21, at(70), 0),
        PutOutcome::Overwrote(_)
    ));
    s.validate();
    let mut out = Vec::new();
    let mut evict_at = |s: &mut Shard<u64, u64>, now: u64| {
        out.clear();
        while s.evict(now, 16, &mut out).0 {}
        s.validate();
        out.iter().map(|r| (r.key, r.deadline)).collect::<Vec<_>>()
    };
    assert_eq!(evict_at(&mut s, at(72)), [(2, at(70))]);
    assert_eq!(evict_at(&mut s, at(110)), [], "evicted at the old deadline");
    assert_eq!(s.get(h(1), &1), Some((&11, at(120))));
    assert_eq!(evict_at(&mut s, at(122)), [(1, at(120))]);
    assert_eq!(s.len(), 0);
}

#[test]
fn a_wheel_allocates_its_list_heads_when_the_first_entry_arrives() {
    let mut s: Shard<u64, u64> = Shard::new(19, 0, 0);
    // Nothing linked: every query answers from the empty heads.
    assert_eq!(s.next_wakeup(), None);
    let mut out = Vec::new();
    assert!(!s.evict(u64::MAX - 1, usize::MAX, &mut out).0);
    assert!(out.is_empty());
    assert!(matches!(
        s.put_owned(h(1), 1, 1, 5 << 19, 0),
        PutOutcome::Inserted
    ));
    assert!(s.next_wakeup().is_some());
    assert!(!s.evict(6 << 19, usize::MAX, &mut out).0);
    assert_eq!(out.len(), 1);
}

/// Writes take due entries from `writer_lag` ticks after the last eviction
/// that left none due: an eviction that stops at its batch limit (a pass
/// working through a backlog a batch at a time) does not hold them off,
/// and one that drains the shard does.
#[test]
fn only_an_eviction_that_drains_the_shard_holds_writers_off() {
    const LAG: u64 = 10;
    let mut s: Shard<u64, u64> = Shard::new(SHIFT, 0, 0).writer_lag(LAG);
    for k in 0..40 {
        s.put_owned(h(k), k, k, P - 1, 0);
    }
    assert!(!s.writers_evict(LAG * P - 1));
    assert!(s.writers_evict(LAG * P));
    // Well past the lag, a batch that leaves entries due.
    let mut out = Vec::new();
    let late = 30 * P;
    assert!(s.evict(late, 16, &mut out).0);
    assert_eq!(out.len(), 16);
    assert!(s.writers_evict(late), "a backlog is left: writers help");
    // The batch that drains it holds them off for the lag from then.
    assert!(!s.evict(late, 64, &mut out).0);
    assert_eq!(out.len(), 40);
    assert!(!s.writers_evict(late));
    assert!(!s.writers_evict((30 + LAG) * P - 1));
    assert!(s.writers_evict((30 + LAG) * P));
}

/// The random shard test with idle expiry: reads record accesses under a
/// shared reference, eviction moves the timers of entries read since, and
/// every door uses the effective deadline `min(write, access + idle)`.
#[test]
fn an_idle_shard_evicts_at_the_effective_deadline() {
    const IDLE: u64 = 3 * P;
    let mut s: Shard<u64, u64> = Shard::new(SHIFT, 5, 0).idle(IDLE);
    // key -> (value, write deadline, last access)
    let mut model: HashMap<u64, (u64, u64, u64)> = HashMap::new();
    let until = |m: &(u64, u64, u64)| m.1.min(m.2 + IDLE);
    let mut rnd = xorshift(0x1D1E_5EED);
    let mut now = 0u64;
    let mut out = Vec::new();
    for step in 0..if cfg!(miri) { 400 } else { 50_000 } {
        let k = rnd(32);
        match rnd(10) {
            0..=2 => {
                let d = now + 1 + rnd(20 * P);
                match s.put_owned(h(k), k, step, d, now) {
                    PutOutcome::Inserted => assert!(!model.contains_key(&k)),
                    PutOutcome::NoRoom { .. } => panic!("a shard alone always has room"),
                    PutOutcome::Overwrote(r) => {
                        let m = model[&k];
                        let door = if now <= until(&m) {
                            Door::Replaced
                        } else {
                            Door::Expired
                        };
                        assert_eq!((r.value, r.door), (m.0, door));
                    }
                    PutOutcome::Refused => unreachable!("unbounded"),
                }
                model.insert(k, (step, d, now));
            }
            3 => {
                let r = s.remove(h(k), &k, now);
                assert_eq!(r.map(|r| r.value), model.remove(&k).map(|m| m.0));
            }
            4 => {
                // expire: sets the write deadline, not an access.
                let d = now + 1 + rnd(5 * P);
                let live = model.get(&k).is_some_and(|m| now <= until(m));
                let done = s.touch(h(k), &k, d, now, crate::map::ExpireIf::Always);
                assert_eq!(done.is_some(), live);
                if live {
                    model.get_mut(&k).unwrap().1 = d;
                }
            }
            5 | 6 => now += rnd(2 * P),
            7 => {
                while s.evict(now, 2, &mut out).0 {}
                for r in out.drain(..) {
                    let m = model.remove(&r.key).expect("evicted a key not held");
                    assert_eq!(r.value, m.0);
                    assert!(until(&m) < now, "evicted early");
                }
                for m in model.values() {
                    assert!((until(m) / P + 1) > now / P, "a due entry was left");
                }
            }
            _ => {
                // A read that counts as an access.
                let got = s
                    .get_from(s.start(h(k)), h(k), &k)
                    .and_then(|f| f.access(now).then(|| (*f.value, f.deadline_after(now))));
                let want = model.get_mut(&k).filter(|m| now <= until(m)).map(|m| {
                    m.2 = now;
                    (m.0, until(m))
                });
                assert_eq!(got, want, "step {step}");
            }
        }
        if validates(step) {
            s.validate();
        }
        assert_eq!(s.len(), model.len());
        let floor = s.deadline_floor();
        assert!(model.values().all(|m| floor <= until(m)), "floor {floor}");
    }
}

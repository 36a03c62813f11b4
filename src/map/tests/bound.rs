//! A bounded shard: random operations with weights against a model,
//! expired entries first, TinyLFU admission, weights, and the room a put
//! makes in its own shard kept for it.

use super::*;

/// A bounded shard under random puts (with weights), overwrites, removes,
/// evictions and time: after every step the shard is consistent, holds no
/// more than its bound, and holds exactly what the model says; every value
/// that left did so once, by the door the model expects.
#[test]
fn bounded_shard_random_ops_keep_the_bound_and_every_value() {
    for (weighted, cap) in [(false, 1), (false, 17), (true, 40)] {
        let mut s: Shard<u64, u64> = Shard::new(SHIFT, 5, 0).bounded(cap, weighted);
        // key -> (value, deadline, weight)
        let mut model: HashMap<u64, (u64, u64, u64)> = HashMap::new();
        let mut rnd = xorshift(0x9E37_79B9_u64 ^ cap);
        let mut now = 0u64;
        let mut serial = 0u64;
        let mut out = Vec::new();
        for step in 0..if cfg!(miri) { 80 } else { 30_000 } {
            let k = rnd(64);
            match rnd(10) {
                0..=5 => {
                    serial += 1;
                    let d = now + 1 + rnd(20 * P);
                    let w = if weighted { rnd(12) } else { 1 };
                    let outcome = loop {
                        // As the map tells it: no entry expires before the
                        // floor, so none has expired while it is not past
                        // (then a new key never counted is refused at once).
                        let due_here = s.deadline_floor() < now;
                        match s.put_bounded(
                            k,
                            &mut Some((k, serial)),
                            d,
                            now,
                            w,
                            &mut out,
                            due_here,
                            alone,
                        ) {
                            // The only way a shard alone runs short: an
                            // overwrite that must grow found its own entry
                            // due, and evicted it to make room. The map
                            // tries again; so does the model.
                            PutOutcome::NoRoom { .. } => {
                                let own = out.iter().find(|r| r.key == k);
                                let own = own.expect("its own entry left");
                                assert_eq!(own.door, Door::Expired, "step {step}");
                                for r in out.drain(..) {
                                    assert!(r.door != Door::Expired || now > r.deadline);
                                    let held = model.remove(&r.key).expect("left twice");
                                    assert_eq!(held.0, r.value, "step {step}");
                                }
                            }
                            outcome => break outcome,
                        }
                    };
                    let refused = matches!(outcome, PutOutcome::Refused);
                    match outcome {
                        PutOutcome::Inserted => assert!(!model.contains_key(&k)),
                        PutOutcome::NoRoom { .. } => unreachable!(),
                        PutOutcome::Overwrote(old) => {
                            let (v, od, _) = model[&k];
                            assert_eq!(old.value, v);
                            let door = if now <= od {
                                Door::Replaced
                            } else {
                                Door::Expired
                            };
                            assert_eq!(old.door, door, "step {step}");
                        }
                        // Expired entries make room before the policy
                        // refuses anything: none is left.
                        PutOutcome::Refused => {
                            let gone = |key: &u64| out.iter().any(|r| r.key == *key);
                            let expired =
                                |(key, m): (&u64, &(u64, u64, u64))| now > m.1 && !gone(key);
                            assert!(!model.iter().any(expired), "step {step}");
                        }
                    }
                    if !refused {
                        model.insert(k, (serial, d, w));
                    }
                }
                6 => {
                    let r = s.remove(k, &k, now);
                    assert_eq!(r.map(|r| r.value), model.remove(&k).map(|m| m.0));
                }
                7 => now += rnd(3 * P),
                _ => {
                    s.evict(now, 1 + rnd(4) as usize, &mut out);
                }
            }
            // Everything that left, by its door.
            for r in out.drain(..) {
                match r.door {
                    Door::Expired => assert!(now > r.deadline, "step {step}: early Expired"),
                    Door::Size => {}
                    d => panic!("step {step}: unexpected door {d:?}"),
                }
                if r.key == k && r.value == serial && model.get(&k).is_none_or(|m| m.0 != serial) {
                    continue; // the new value, refused
                }
                let held = model.remove(&r.key).expect("left twice, or never held");
                assert_eq!(held.0, r.value, "step {step}");
            }
            if validates(step) {
                s.validate();
            }
            let (used, bound) = s.usage().unwrap();
            assert!(used <= bound);
            let expect: u64 = model.values().map(|m| m.2).sum();
            assert_eq!(used, expect, "step {step}: weight held");
            for (key, m) in &model {
                assert_eq!(s.get(*key, key).map(|(v, _)| *v), Some(m.0), "step {step}");
            }
        }
    }
}

/// A full bounded shard makes room with expired entries first, even ones
/// its wheel has not reached yet.
#[test]
fn a_full_shard_evicts_expired_entries_first() {
    let mut s: Shard<u64, u64> = Shard::new(SHIFT, 0, 0).bounded(3, false);
    let mut out = Vec::new();
    s.put_bounded(1, &mut Some((1, 1)), 100 * P, 0, 1, &mut out, true, alone);
    s.put_bounded(2, &mut Some((2, 2)), 5 * P, 0, 1, &mut out, true, alone); // expires first
    s.put_bounded(3, &mut Some((3, 3)), 100 * P, 0, 1, &mut out, true, alone);
    // Past key 2's deadline, but within its timer tick.
    let now = 5 * P + 1;
    let r = s.put_bounded(4, &mut Some((4, 4)), 100 * P, now, 1, &mut out, true, alone);
    assert!(matches!(r, PutOutcome::Inserted));
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].key, out[0].door), (2, Door::Expired));
    s.validate();
}

/// TinyLFU admission: a new key the sketch has seen less often than the
/// victim is refused (`Size`), until it has been asked for more often.
#[test]
fn admission_refuses_a_rarer_newcomer_until_it_is_asked_for_more() {
    let mut s: Shard<u64, u64> = Shard::new(SHIFT, 0, 0).bounded(2, false);
    let mut out = Vec::new();
    for _ in 0..3 {
        s.put_bounded(1, &mut Some((1, 1)), P, 0, 1, &mut out, true, alone);
        s.put_bounded(2, &mut Some((2, 2)), P, 0, 1, &mut out, true, alone);
    }
    assert!(out.is_empty());
    let mut tries = 0;
    loop {
        tries += 1;
        match s.put_bounded(3, &mut Some((3, 3)), P, 0, 1, &mut out, true, alone) {
            PutOutcome::Refused => {
                let r = out.pop().unwrap();
                assert_eq!((r.key, r.door), (3, Door::Size));
                assert!(out.is_empty());
            }
            PutOutcome::Inserted => break,
            PutOutcome::Overwrote(_) | PutOutcome::NoRoom { .. } => unreachable!(),
        }
        assert!(tries < 10);
    }
    // Keys 1 and 2: one put each counted in the sketch, then two overwrites
    // raised their access counts, which the hand folds into the sketch as
    // it passes: 3. Key 3 is judged by its count before the put in hand (a
    // victim's last access is credited only when the hand passes it): it is
    // refused while that count (0, 1, 2, 3) is not above 3, and admitted on
    // its fifth put, counted 4 times before.
    assert_eq!(tries, 5);
    let r = out.pop().unwrap();
    assert_eq!(r.door, Door::Size);
    assert!(r.key == 1 || r.key == 2);
    s.validate();
}

/// Weights: an entry heavier than the bound is refused; a lighter one
/// pushes out as many as it needs; an overwrite pushes out others only if
/// its weight grew, and never itself unless it alone is over the bound.
#[test]
fn weights_decide_what_fits() {
    let mut s: Shard<u64, u64> = Shard::new(SHIFT, 0, 0).bounded(10, true);
    let mut out = Vec::new();
    let put = |s: &mut Shard<u64, u64>, k: u64, w: u64, out: &mut Vec<_>| {
        s.put_bounded(k, &mut Some((k, k)), 100 * P, 0, w, out, true, alone)
    };
    assert!(matches!(put(&mut s, 1, 11, &mut out), PutOutcome::Refused));
    assert_eq!(
        out.drain(..).map(|r| (r.key, r.door)).collect::<Vec<_>>(),
        [(1, Door::Size)]
    );
    for k in 1..=3 {
        assert!(matches!(put(&mut s, k, 3, &mut out), PutOutcome::Inserted));
    }
    // Shrinking or keeping a weight pushes nothing out.
    assert!(matches!(
        put(&mut s, 2, 2, &mut out),
        PutOutcome::Overwrote(_)
    ));
    assert!(out.is_empty());
    assert_eq!(s.usage(), Some((8, 10)));
    // Growing key 2 to 9 makes 15: keys 1 and 3 go, key 2 stays.
    assert!(matches!(
        put(&mut s, 2, 9, &mut out),
        PutOutcome::Overwrote(_)
    ));
    let mut gone: Vec<_> = out.drain(..).map(|r| (r.key, r.door)).collect();
    gone.sort_unstable_by_key(|g| g.0);
    assert_eq!(gone, [(1, Door::Size), (3, Door::Size)]);
    assert_eq!(s.usage(), Some((9, 10)));
    // Growing past the bound alone: the new value leaves itself.
    assert!(matches!(
        put(&mut s, 2, 12, &mut out),
        PutOutcome::Overwrote(_)
    ));
    let gone: Vec<_> = out.drain(..).map(|r| (r.key, r.value, r.door)).collect();
    assert_eq!(gone, [(2, 2, Door::Size)]);
    assert_eq!((s.len(), s.usage()), (0, Some((0, 10))));
    s.validate();
}

/// Room a put makes in its own shard passes to the new entry without going
/// through the map's budget (the kept room); what it freed beyond its need
/// is given back, and what the kept room lacks is reserved in the budget:
/// the budget counts exactly what the shard holds.
#[test]
fn room_made_in_the_own_shard_is_kept_for_the_put() {
    let budget = crate::sync::Arc::new(crate::map::policy::Budget::new(10));
    let mut s: Shard<u64, u64> = Shard::new(SHIFT, 0, 0).bounded_by(budget.clone(), 10, true);
    let mut out = Vec::new();
    let mut put = |s: &mut Shard<u64, u64>, k: u64, until: u64, now: u64, w: u64| {
        let outcome = s.put_bounded(k, &mut Some((k, k)), until, now, w, &mut out, true, alone);
        assert!(matches!(outcome, PutOutcome::Inserted));
        let gone: Vec<_> = out.drain(..).map(|r| (r.key, r.door)).collect();
        gone
    };
    // Two entries that expire at P fill the budget.
    assert!(put(&mut s, 1, P, 0, 4).is_empty());
    assert!(put(&mut s, 2, P, 0, 6).is_empty());
    assert_eq!(budget.used(), 10);
    // At 2P a put of weight 3 evicts one of them (4 or 6) and takes 3 of it.
    let gone = put(&mut s, 3, 100 * P, 2 * P, 3);
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].1, Door::Expired);
    let left = if gone[0].0 == 1 { 6 } else { 4 };
    assert_eq!(s.usage(), Some((3 + left, 10)));
    assert_eq!(budget.used(), 3 + left, "the rest went back");
    // A put of weight 5: the other expired entry (`left`) leaves; with
    // what is free in the budget it covers 5 (6 alone does; 4 needs 1 of
    // the 3 free).
    let gone = put(&mut s, 4, 100 * P, 2 * P, 5);
    assert_eq!(gone.len(), 1);
    assert_eq!(s.usage(), Some((8, 10)));
    assert_eq!(budget.used(), 8);
    s.validate();
}

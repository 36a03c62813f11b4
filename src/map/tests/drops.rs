//! Every value a shard holds is dropped exactly once, whichever way it
//! leaves, also when a `Drop` panics on the way.

use super::*;

/// Counts live instances, so a test can check that every value is dropped
/// exactly once (a double drop would go negative, a leak stay positive).
struct Tracked {
    live: std::rc::Rc<std::cell::Cell<i64>>,
    panic_on_drop: bool,
    _name: String,
}

impl Tracked {
    fn new(live: &std::rc::Rc<std::cell::Cell<i64>>, panic_on_drop: bool) -> Self {
        live.set(live.get() + 1);
        Tracked {
            live: live.clone(),
            panic_on_drop,
            _name: format!("value {}", live.get()),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.live.set(self.live.get() - 1);
        assert!(!self.panic_on_drop, "Tracked: panic on drop, as asked");
    }
}

#[test]
fn every_value_is_dropped_exactly_once_whichever_way_it_leaves() {
    let live = std::rc::Rc::new(std::cell::Cell::new(0));
    let mut s: Shard<String, Tracked> = Shard::new(SHIFT, 0, 0);
    let mut out = Vec::new();
    for k in 0..if cfg!(miri) { 40 } else { 200 } {
        let key = format!("k{k}");
        s.put_owned(
            h(k),
            key.clone(),
            Tracked::new(&live, false),
            (k + 1) * P,
            0,
        );
        if k % 3 == 0 {
            // Overwrite: the old value comes back to the caller.
            let r = s.put_owned(
                h(k),
                key.clone(),
                Tracked::new(&live, false),
                (k + 2) * P,
                0,
            );
            assert!(matches!(r, PutOutcome::Overwrote(_)));
        }
        if k % 5 == 0 {
            assert!(s.remove(h(k), key.as_str(), 0).is_some());
        }
    }
    s.validate();
    while s.evict(50 * P, 7, &mut out).0 {}
    s.validate();
    assert!(!out.is_empty());
    out.clear();
    // Reuse vacant nodes, then drop the shard with entries still inside.
    for k in 0..30u64 {
        s.put_owned(
            h(k),
            format!("again{k}"),
            Tracked::new(&live, false),
            500 * P,
            50 * P,
        );
    }
    s.validate();
    assert!(live.get() > 0);
    drop(s);
    assert_eq!(live.get(), 0, "values leaked or dropped twice");
}

/// A shard holding keys 0..20 with tracked values; the value of key
/// `panicky` (if any) panics when dropped.
fn tracked_shard(
    live: &std::rc::Rc<std::cell::Cell<i64>>,
    panicky: Option<u64>,
) -> Shard<u64, Tracked> {
    let mut s = Shard::new(SHIFT, 0, 0);
    for k in 0..20u64 {
        s.put_owned(
            h(k),
            k,
            Tracked::new(live, Some(k) == panicky),
            P * (k + 1),
            0,
        );
    }
    s
}

#[test]
fn a_panicking_drop_inside_a_shard_drop_still_drops_the_others() {
    let live = std::rc::Rc::new(std::cell::Cell::new(0));
    let s = tracked_shard(&live, Some(7));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(s)));
    assert!(r.is_err());
    assert_eq!(live.get(), 0, "the other 19 values must still be dropped");
}

#[test]
fn a_drain_cut_short_by_a_panic_leaves_the_rest_to_drop() {
    let live = std::rc::Rc::new(std::cell::Cell::new(0));
    let s = tracked_shard(&live, None);
    let mut seen = 0;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        s.drain(|e| {
            seen += 1;
            assert!(seen < 5, "stop draining");
            drop(e);
        })
    }));
    assert!(r.is_err());
    assert_eq!(seen, 5);
    assert_eq!(live.get(), 0);
}

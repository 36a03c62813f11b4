//! What broke: two loads waiting on each other hung for ever. Thread 1's
//! `init` for key 1 loaded key 2 while thread 2's `init` for key 2 loaded
//! key 1: both parked on condition variables with no way out. Fixed by a
//! process-wide graph of waits: the caller whose wait would close a cycle
//! panics, naming the threads, and the other goes on.

use crate::common::{panic_message, within};
use expiremap::{ExpireMap, Update};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

const MINUTE: Duration = Duration::from_secs(60);

/// Each of two threads loads one key whose `init` loads the other's key,
/// once both `init`s run. Exactly one panics (the second to wait), the
/// other completes with the value its own nested load made.
#[test]
fn two_loads_waiting_on_each_other_end_with_one_clear_panic() {
    let outcome = within(60, || {
        let map = Arc::new(ExpireMap::<u32, u32>::new());
        let both_loading = Arc::new(Barrier::new(2));
        let run = |mine: u32, other: u32| {
            let (map, both) = (map.clone(), both_loading.clone());
            thread::spawn(move || {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    map.get_or_insert_with(mine, MINUTE, || {
                        both.wait();
                        map.get_or_insert_with(other, MINUTE, || other * 10) + mine
                    })
                }))
                .map_err(|p| panic_message(&*p))
            })
        };
        let (a, b) = (run(1, 2), run(2, 1));
        (a.join().unwrap(), b.join().unwrap())
    })
    .expect("the test itself");
    let (a, b) = outcome;
    let panics: Vec<&String> = [&a, &b]
        .into_iter()
        .filter_map(|r| r.as_ref().err())
        .collect();
    assert_eq!(
        panics.len(),
        1,
        "exactly one side sees the cycle: {a:?} {b:?}"
    );
    assert!(panics[0].contains("cycle"), "{}", panics[0]);
    // The survivor loaded the other key itself after the panicking load
    // ended: 1 + 20 or 2 + 10.
    let done = a.or(b).unwrap();
    assert!(done == 21 || done == 12, "{done}");
}

/// An update's `f` that loads a key whose `init` updates the first key:
/// the same cycle through an update, on one thread, panics at once.
#[test]
fn an_update_whose_f_waits_for_itself_panics() {
    let r = within(60, || {
        let map = ExpireMap::<u32, u32>::new();
        map.update(1, |_| {
            map.get_or_insert_with(2, MINUTE, || {
                map.update(1, |_| Update::Keep);
                2
            });
            Update::Keep
        })
    });
    let msg = panic_message(&*r.unwrap_err());
    assert!(msg.contains("its own key"), "{msg}");
}

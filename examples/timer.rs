//! The XOR-order timer index on its own: insert, cancel, reschedule, and the
//! order in which timers fire as time advances to each `next_wakeup()`.
//!
//! ```text
//! cargo run --example timer
//! ```

use expiremap::timer::TimerWheel;

fn main() {
    // Ticks are whatever the caller chooses; here, milliseconds.
    let mut wheel = TimerWheel::new(0);
    let tasks = [
        (1_500, "flush log"),
        (30, "retry request"),
        (60_000, "rotate keys"),
        (30, "ping peer"), // same deadline: first in, first out
        (250, "refresh cache"),
        (7, "ack"),
    ];
    let mut ids = Vec::new();
    for (deadline, name) in tasks {
        ids.push(wheel.insert(deadline, name));
        println!("insert {name:<14} deadline {deadline:>6} ms");
    }
    // Cancel one, move one earlier.
    let cancelled = wheel.cancel(ids[2]);
    println!(
        "cancel {:?}; cancelling again finds {:?}",
        cancelled,
        wheel.cancel(ids[2])
    );
    wheel.reschedule(ids[0], 100);
    println!("reschedule 'flush log' to 100 ms\n");

    // Drive the wheel only by its own wake-up hint: every timer fires at
    // exactly its deadline, in order.
    while let Some(t) = wheel.next_wakeup() {
        wheel.advance(t, |_, name| println!("t = {t:>4} ms  fire {name}"));
    }
    assert!(wheel.is_empty());
    println!("\nall fired; pending = {}", wheel.len());
}

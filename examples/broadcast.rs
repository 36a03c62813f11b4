//! One writer, three readers that keep up (given a scheduler that lets them
//! run), and one slow reader that lags.
//!
//! ```sh
//! cargo run --example broadcast
//! ```
//!
//! The writer never waits for the slow reader. That reader is told exactly
//! how many messages it lost (`Lagged(n)`), then continues from the oldest
//! message still held. Every reader accounts for every message:
//! received + lost == sent. The program ends when the writer is dropped and
//! every reader has drained the ring, in well under a second.

use expiremap::broadcast::{RecvError, RecvTimeoutError, Sender, TryRecvError};
use std::thread;
use std::time::Duration;

const MESSAGES: u64 = 4_000;
/// Room for the readers that keep up to be descheduled for a while without
/// losing anything; the slow reader still falls far behind.
const CAPACITY: usize = 1024;

#[derive(Clone, Debug)]
struct Event {
    seq: u64,
    payload: [u8; 16],
}

/// What one reader saw.
struct Tally {
    name: &'static str,
    received: u64,
    lost: u64,
    lag_reports: Vec<u64>,
}

impl Tally {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            received: 0,
            lost: 0,
            lag_reports: Vec::new(),
        }
    }

    fn got(&mut self, e: &Event, last: &mut Option<u64>) {
        assert!(last.is_none_or(|l| l < e.seq), "messages arrive in order");
        assert_eq!(e.payload[0], e.seq as u8);
        *last = Some(e.seq);
        self.received += 1;
    }

    fn lagged(&mut self, n: u64) {
        self.lost += n;
        self.lag_reports.push(n);
    }
}

fn main() {
    let tx = Sender::<Event>::new(CAPACITY, 8).expect("valid settings");

    // Reader 1: blocking `recv`.
    let mut rx = tx.subscribe().expect("registry has room");
    let blocking = thread::spawn(move || {
        let (mut t, mut last) = (Tally::new("recv"), None);
        loop {
            match rx.recv() {
                Ok(e) => t.got(&e, &mut last),
                Err(RecvError::Lagged(n)) => t.lagged(n),
                Err(RecvError::Closed) => return t,
            }
        }
    });

    // Reader 2: batches of up to 64, one activation per batch.
    let mut rx = tx.subscribe().expect("registry has room");
    let batching = thread::spawn(move || {
        let (mut t, mut last) = (Tally::new("try_recv_batch"), None);
        let mut batch = Vec::with_capacity(64);
        loop {
            batch.clear();
            match rx.try_recv_batch(&mut batch, 64) {
                Ok(_) => batch.iter().for_each(|e| t.got(e, &mut last)),
                Err(TryRecvError::Lagged(n)) => t.lagged(n),
                Err(TryRecvError::Empty) => thread::yield_now(),
                Err(TryRecvError::Closed) => return t,
            }
        }
    });

    // Reader 3: `recv_timeout`, doing other work when nothing comes.
    let mut rx = tx.subscribe().expect("registry has room");
    let timed = thread::spawn(move || {
        let (mut t, mut last) = (Tally::new("recv_timeout"), None);
        loop {
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(e) => t.got(&e, &mut last),
                Err(RecvTimeoutError::Lagged(n)) => t.lagged(n),
                Err(RecvTimeoutError::Timeout) => {} // idle work would go here
                Err(RecvTimeoutError::Closed) => return t,
            }
        }
    });

    // The slow reader: 2 ms of "work" for every 100 messages it handles.
    let mut rx = tx.subscribe().expect("registry has room");
    let slow = thread::spawn(move || {
        let (mut t, mut last) = (Tally::new("slow"), None);
        loop {
            match rx.recv() {
                Ok(e) => {
                    t.got(&e, &mut last);
                    if t.received % 100 == 1 {
                        thread::sleep(Duration::from_millis(2));
                    }
                }
                Err(RecvError::Lagged(n)) => {
                    println!("slow reader: lagged, lost {n} messages");
                    t.lagged(n);
                }
                Err(RecvError::Closed) => return t,
            }
        }
    });

    println!(
        "writer: {} receivers, capacity {}, sending {MESSAGES} events",
        tx.receiver_count(),
        tx.capacity()
    );
    for seq in 0..MESSAGES {
        tx.send(Event {
            seq,
            payload: [seq as u8; 16],
        });
        if seq % 64 == 63 {
            // Bursts: the readers that keep up stay within capacity.
            thread::sleep(Duration::from_micros(200));
        }
    }
    drop(tx); // readers drain what is left, then see Closed

    for handle in [blocking, batching, timed, slow] {
        let t = handle.join().expect("reader thread");
        assert_eq!(
            t.received + t.lost,
            MESSAGES,
            "{}: every message accounted for",
            t.name
        );
        println!(
            "{:>15}: received {:>4}, lost {:>4} in {} lag report(s)",
            t.name,
            t.received,
            t.lost,
            t.lag_reports.len()
        );
    }
}

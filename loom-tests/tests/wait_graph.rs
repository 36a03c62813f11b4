//! loom model of the handshake between a flight's end and a waiter
//! entering the process-wide graph of waits (`src/map/load/flight.rs`, `graph`).
//! The graph itself runs on `sync::unmodeled` primitives, which loom does
//! not see, so this model copies the handshake onto loom's: a flight's
//! `graph` word (bits `OVER`, `LINKED`), the graph's mutex, and the links
//! with their `over` flags.
//!
//! What must hold: once the flight has ended, no link to it is left
//! unmarked. An unmarked link to an ended flight would let a later walk
//! of the graph take a wait that is already ending for part of a cycle,
//! and panic for nothing. See `../README.md`.

use expiremap_loom_tests::{model, thread};

#[cfg(expiremap_loom)]
use loom::sync::atomic::{AtomicU8, Ordering};
#[cfg(expiremap_loom)]
use loom::sync::{Arc, Mutex};
#[cfg(not(expiremap_loom))]
use std::sync::atomic::{AtomicU8, Ordering};
#[cfg(not(expiremap_loom))]
use std::sync::{Arc, Mutex};

const OVER: u8 = 1;
const LINKED: u8 = 2;

/// One flight's word and the graph's links to it (`true`: marked over).
struct Shared {
    word: AtomicU8,
    links: Mutex<Vec<bool>>,
}

impl Shared {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            word: AtomicU8::new(0),
            links: Mutex::new(Vec::new()),
        })
    }

    /// `FlightGuard::drop`: sets `OVER`; if a waiter linked first, marks
    /// every link to the flight under the graph's mutex.
    fn end(&self) {
        let before = self.word.fetch_or(OVER, Ordering::AcqRel);
        if before & LINKED != 0 {
            for over in self.links.lock().unwrap().iter_mut() {
                *over = true;
            }
        }
    }

    /// `graph::Edge::enter`: under the graph's mutex, sets `LINKED`; links
    /// (unmarked) unless the flight had ended. Returns whether it linked.
    fn enter(&self) -> bool {
        let mut links = self.links.lock().unwrap();
        let before = self.word.fetch_or(LINKED, Ordering::AcqRel);
        if before & OVER != 0 {
            return false;
        }
        links.push(false);
        true
    }
}

/// A flight ends while two waiters enter the graph for it: afterwards
/// every link is marked over, whatever the interleaving.
#[test]
fn a_flight_ending_while_waiters_link_leaves_no_link_unmarked() {
    model(|| {
        let shared = Shared::new();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let shared = shared.clone();
                thread::spawn(move || shared.enter())
            })
            .collect();
        shared.end();
        let linked = waiters
            .into_iter()
            .map(|w| w.join().unwrap())
            .filter(|&l| l)
            .count();
        let links = shared.links.lock().unwrap();
        assert_eq!(links.len(), linked);
        assert!(
            links.iter().all(|&over| over),
            "a link to an ended flight is unmarked"
        );
    });
}

/// A waiter that enters after the end has been seen links nothing.
#[test]
fn a_waiter_after_the_end_links_nothing() {
    model(|| {
        let shared = Shared::new();
        let ender = {
            let shared = shared.clone();
            thread::spawn(move || shared.end())
        };
        ender.join().unwrap();
        assert!(!shared.enter());
        assert!(shared.links.lock().unwrap().is_empty());
    });
}

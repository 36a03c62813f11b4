//! loom models of `expiremap::broadcast`: publish, read, cleanup, reclaim,
//! suspend, join, drop and park/notify. Each model is tiny (capacity 1 or 2, at most
//! three messages) so that `LOOM_MAX_PREEMPTIONS=2` explores it in seconds;
//! loom's `UnsafeCell` tracking turns any read of a freed or half-written
//! slot into a failure, and a lost wake-up into a deadlock report.
//! See `../README.md` for what each model checks and how long it takes.

use expiremap::broadcast::{RecvError, Sender, TryRecvError};
use expiremap_loom_tests::{model, model_with_at_most_preemptions, thread};
use std::sync::Arc as StdArc;
use std::sync::atomic::{AtomicIsize, Ordering::SeqCst};

/// Receives until `Closed`; returns the messages and the total lag.
fn recv_all<T: Clone + Send + Sync>(rx: &mut expiremap::broadcast::Receiver<T>) -> (Vec<T>, u64) {
    let (mut got, mut lost) = (Vec::new(), 0);
    loop {
        match rx.recv() {
            Ok(v) => got.push(v),
            Err(RecvError::Lagged(n)) => lost += n,
            Err(RecvError::Closed) => return (got, lost),
        }
    }
}

/// A message that counts its live copies (std atomics: bookkeeping only,
/// not part of the protocol under test).
#[derive(Debug)]
struct Msg {
    id: u32,
    live: StdArc<AtomicIsize>,
}

impl Msg {
    fn new(id: u32, live: &StdArc<AtomicIsize>) -> Self {
        live.fetch_add(1, SeqCst);
        Self {
            id,
            live: live.clone(),
        }
    }
}

impl Clone for Msg {
    fn clone(&self) -> Self {
        Self::new(self.id, &self.live)
    }
}

impl Drop for Msg {
    fn drop(&mut self) {
        self.live.fetch_sub(1, SeqCst);
    }
}

/// 1 writer, 1 reader: delivered in order, then Closed.
#[test]
fn one_writer_one_reader_in_order() {
    model(|| {
        let tx = Sender::new(2, 1).unwrap();
        let mut rx = tx.subscribe().unwrap();
        let w = thread::spawn(move || {
            tx.send(1u32);
            tx.send(2);
        });
        assert_eq!(recv_all(&mut rx), (vec![1, 2], 0));
        w.join().unwrap();
    });
}

/// 1 writer, 2 readers: each sees everything, in order. Explored with at
/// most one preemption: at two it takes ~13 minutes (each receive now
/// runs the reclaim steps), and the two-reader races of reclaim are
/// explored at two by `the_last_of_two_concurrent_readers_drops_the_message`
/// and `a_reader_leaving_races_a_reader_receiving`.
#[test]
fn one_writer_two_readers_each_see_everything() {
    model_with_at_most_preemptions(1, || {
        let tx = Sender::new(2, 2).unwrap();
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let mut rx = tx.subscribe().unwrap();
                thread::spawn(move || recv_all(&mut rx))
            })
            .collect();
        tx.send(1u32);
        tx.send(2);
        drop(tx);
        for r in readers {
            assert_eq!(r.join().unwrap(), (vec![1, 2], 0));
        }
    });
}

/// 2 writers publishing concurrently into a ring of 1: the second to
/// reserve waits for the first to publish (cleanup never frees an unpublished
/// message) and then frees it from the idle reader, which sees exactly one
/// lost message and the other writer's value.
#[test]
fn two_writers_publish_concurrently() {
    model(|| {
        let tx = Sender::new(1, 1).unwrap();
        let mut rx = tx.subscribe().unwrap();
        let writers: Vec<_> = [10u32, 20]
            .into_iter()
            .map(|v| {
                let tx = tx.clone();
                thread::spawn(move || tx.send(v))
            })
            .collect();
        drop(tx);
        for w in writers {
            w.join().unwrap();
        }
        let (got, lost) = recv_all(&mut rx);
        assert_eq!(lost, 1);
        assert!(got == [10] || got == [20], "{got:?}");
    });
}

/// The seed's Pin 3: a reader joins while a writer's cleanup scans the
/// registry. It never reads a freed slot (loom's cell tracking), never goes
/// back, and the message published last is never lost by anyone.
#[test]
fn reader_joins_while_cleanup_runs() {
    model(|| {
        let live = StdArc::new(AtomicIsize::new(0));
        let tx = Sender::<Msg>::new(1, 2).unwrap();
        let mut steady = tx.subscribe().unwrap();
        let joiner = {
            let tx = tx.clone();
            thread::spawn(move || {
                let mut rx = tx.subscribe().unwrap();
                drop(tx);
                let (got, lost) = recv_all(&mut rx);
                let ids: Vec<u32> = got.iter().map(|m| m.id).collect();
                (ids, lost)
            })
        };
        tx.send(Msg::new(1, &live));
        tx.send(Msg::new(2, &live));
        drop(tx);
        let (ids, lost) = joiner.join().unwrap();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
        assert!(ids.len() as u64 + lost <= 2);
        // Joined before 2 was published => it receives 2.
        assert!(
            ids.last() == Some(&2) || (ids.is_empty() && lost == 0),
            "{ids:?} {lost}"
        );
        let (got, lost) = recv_all(&mut steady);
        assert_eq!((got.len(), lost), (1, 1));
        assert_eq!(got[0].id, 2);
        drop((got, steady));
        assert_eq!(live.load(SeqCst), 0, "every message dropped exactly once");
    });
}

/// Resume (CAS SUSPENDED|s -> s) racing cleanup's forced advance (CAS
/// SUSPENDED|s -> SUSPENDED|needed): the reader either reads a message or
/// reports exactly the messages it lost; the total is exact.
#[test]
fn resume_races_forced_advance_with_exact_lag() {
    model(|| {
        let tx = Sender::new(1, 1).unwrap();
        let mut rx = tx.subscribe().unwrap();
        let w = thread::spawn(move || {
            for i in 1..=3u32 {
                tx.send(i);
            }
        });
        let (got, lost) = recv_all(&mut rx);
        w.join().unwrap();
        assert_eq!(got.len() as u64 + lost, 3, "got {got:?}, lost {lost}");
        assert!(got.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(got.last(), Some(&3));
    });
}

/// A reader dropped while a writer publishes and cleans up: its slot is
/// freed for reuse, nothing is read after free, and drops balance.
#[test]
fn reader_dropped_mid_publish() {
    model(|| {
        let live = StdArc::new(AtomicIsize::new(0));
        let tx = Sender::new(1, 1).unwrap();
        let mut rx = tx.subscribe().unwrap();
        let r = thread::spawn(move || {
            let got = rx.try_recv().ok().map(|m: Msg| m.id);
            drop(rx);
            got
        });
        tx.send(Msg::new(1, &live));
        tx.send(Msg::new(2, &live));
        let got = r.join().unwrap();
        assert!(matches!(got, None | Some(1) | Some(2)), "{got:?}");
        assert_eq!(tx.receiver_count(), 0);
        let mut again = tx.subscribe().expect("the dropped reader's slot is free");
        tx.send(Msg::new(3, &live));
        assert_eq!(again.try_recv().map(|m| m.id), Ok(3));
        drop((tx, again));
        assert_eq!(live.load(SeqCst), 0);
    });
}

/// The last writer drops while the reader blocks in `recv`: the reader gets
/// the message, then `Closed`, never hangs (a missed close would deadlock).
#[test]
fn last_writer_dropped_while_reader_blocks() {
    model(|| {
        let tx = Sender::new(2, 1).unwrap();
        let mut rx = tx.subscribe().unwrap();
        let r = thread::spawn(move || (rx.recv(), rx.recv()));
        tx.send(1u32);
        drop(tx);
        assert_eq!(r.join().unwrap(), (Ok(1), Err(RecvError::Closed)));
    });
}

/// Park/notify: a sender stays alive, so only the publish can wake the
/// parked reader. A lost wake-up is a deadlock, which loom reports.
#[test]
fn blocking_recv_no_lost_wakeup() {
    model(|| {
        let tx = Sender::new(2, 1).unwrap();
        let mut rx = tx.subscribe().unwrap();
        let r = thread::spawn(move || rx.recv());
        let w = {
            let tx = tx.clone();
            thread::spawn(move || tx.send(7u32))
        };
        w.join().unwrap();
        assert_eq!(r.join().unwrap(), Ok(7));
        drop(tx);
    });
}

/// `send_batch` defers the wake-up of a parked reader to the end of the
/// batch: the reader, parked at any point, still receives both messages, and
/// the sender's later drop closes the stream. A lost deferred wake-up is a
/// loom deadlock.
#[test]
fn batch_send_defers_the_wakeup_but_never_loses_it() {
    model(|| {
        let tx = Sender::new(2, 1).unwrap();
        let mut rx = tx.subscribe().unwrap();
        let r = thread::spawn(move || {
            let a = rx.recv();
            let b = rx.recv();
            (a, b, rx)
        });
        tx.send_batch([1u32, 2]);
        let (a, b, mut rx) = r.join().unwrap();
        assert_eq!((a, b), (Ok(1), Ok(2)));
        drop(tx);
        assert_eq!(rx.recv(), Err(RecvError::Closed));
    });
}

/// A reader holding a message in place (`RecvRef`) while a writer needs its
/// slot: the writer waits for it (the one allowed wait) and never writes
/// under the reader.
#[test]
fn writer_waits_for_reader_mid_copy() {
    model(|| {
        let tx = Sender::new(1, 1).unwrap();
        let mut rx = tx.subscribe().unwrap();
        tx.send(String::from("a"));
        let r = thread::spawn(move || {
            let first = rx.try_recv_ref().map(|m| m.clone());
            (first, rx)
        });
        tx.send(String::from("b"));
        let (first, mut rx) = r.join().unwrap();
        match first {
            Ok(a) => {
                assert_eq!(a, "a");
                assert_eq!(rx.try_recv().as_deref(), Ok("b"));
            }
            Err(e) => {
                assert_eq!(e, TryRecvError::Lagged(1));
                assert_eq!(rx.try_recv().as_deref(), Ok("b"));
            }
        }
    });
}

// ----- reclaim: a message leaves the ring once every reader has passed it --

/// Two readers receive the one message concurrently and stay registered:
/// once both have returned, the ring's copy is dropped, exactly once,
/// whichever of them passed it last and however their reclaim runs
/// interleave (a run in progress rescans for a move it missed, `AGAIN`).
#[test]
fn the_last_of_two_concurrent_readers_drops_the_message() {
    model(|| {
        let live = StdArc::new(AtomicIsize::new(0));
        let tx = Sender::new(2, 2).unwrap();
        let readers: Vec<_> = (0..2).map(|_| tx.subscribe().unwrap()).collect();
        tx.send(Msg::new(1, &live));
        let threads: Vec<_> = readers
            .into_iter()
            .map(|mut rx| {
                thread::spawn(move || {
                    let id = rx.try_recv().map(|m| m.id);
                    (id, rx) // stays registered
                })
            })
            .collect();
        let readers: Vec<_> = threads
            .into_iter()
            .map(|t| {
                let (id, rx) = t.join().unwrap();
                assert_eq!(id, Ok(1));
                rx
            })
            .collect();
        assert_eq!(live.load(SeqCst), 0, "both passed it: dropped");
        drop((tx, readers));
        assert_eq!(live.load(SeqCst), 0);
    });
}

/// A reader that keeps up on a ring of 1 races a writer sending three
/// messages: the reader's reclaim and the writer clearing a full ring
/// claim slots from the same `clear_gen`, so each message is taken out
/// exactly once and never under a reader (loom's cell tracking) or a
/// writer. When the reader has seen `Closed`, every message is dropped
/// although it is still registered.
#[test]
fn reclaim_races_a_writer_clearing_a_full_ring() {
    model(|| {
        let live = StdArc::new(AtomicIsize::new(0));
        let tx = Sender::new(1, 1).unwrap();
        let mut rx = tx.subscribe().unwrap();
        let l = live.clone();
        let w = thread::spawn(move || {
            for id in 1..=3 {
                tx.send(Msg::new(id, &l));
            }
        });
        let (got, lost) = recv_all(&mut rx);
        w.join().unwrap();
        let ids: Vec<u32> = got.iter().map(|m| m.id).collect();
        assert_eq!(ids.len() as u64 + lost, 3, "{ids:?} lost {lost}");
        assert_eq!(ids.last(), Some(&3));
        drop(got);
        assert_eq!(live.load(SeqCst), 0, "every message left the ring");
        drop(rx);
    });
}

/// One reader receives while the other leaves without reading: the
/// message is dropped once both are past it (the leaver by leaving), and
/// the reader that stays can still receive the next one.
#[test]
fn a_reader_leaving_races_a_reader_receiving() {
    model(|| {
        let live = StdArc::new(AtomicIsize::new(0));
        let tx = Sender::new(2, 2).unwrap();
        let mut stays = tx.subscribe().unwrap();
        let leaves = tx.subscribe().unwrap();
        tx.send(Msg::new(1, &live));
        let t = thread::spawn(move || drop(leaves));
        assert_eq!(stays.try_recv().map(|m| m.id), Ok(1));
        t.join().unwrap();
        assert_eq!(live.load(SeqCst), 0, "both are past it: dropped");
        tx.send(Msg::new(2, &live));
        assert_eq!(stays.try_recv().map(|m| m.id), Ok(2));
        assert_eq!(live.load(SeqCst), 0);
    });
}

/// A reader joins while a message is published and another reader's
/// reclaim run scans (skipping empty registry slots, edge J). The joiner
/// starts before the message or after it, never at a freed one: if it
/// starts before, the run keeps the message for it (loom's cell tracking
/// catches a take under its read). Once both have passed it and the joiner
/// has received again (a run that saw the joiner's old counter kept the
/// message; the join left `PENDING` for that receive), it is gone.
#[test]
fn a_reader_joins_while_a_reclaim_run_scans() {
    model(|| {
        let live = StdArc::new(AtomicIsize::new(0));
        let tx = StdArc::new(Sender::new(2, 2).unwrap());
        let mut a = tx.subscribe().unwrap();
        let (t2, l2) = (tx.clone(), live.clone());
        let w = thread::spawn(move || t2.send(Msg::new(1, &l2)));
        let t3 = tx.clone();
        let j = thread::spawn(move || {
            let mut rx = t3.subscribe().unwrap();
            let got = rx.try_recv().map(|m| m.id);
            (got, rx)
        });
        assert_eq!(a.recv().map(|m| m.id), Ok(1));
        w.join().unwrap();
        let (got, mut joiner) = j.join().unwrap();
        match got {
            Ok(1) | Err(TryRecvError::Empty) => {}
            other => panic!("the joiner got {other:?}"),
        }
        if got.is_err() {
            // It started before the message only if the publish came
            // after its join; then the message is still there for it.
            match joiner.try_recv().map(|m| m.id) {
                Ok(1) | Err(TryRecvError::Empty) => {}
                other => panic!("then {other:?}"),
            }
        }
        assert_eq!(live.load(SeqCst), 0, "both passed it: dropped");
        drop((a, joiner));
    });
}

//! Unit tests of the broadcast area. Every test asserts exact outcomes; none
//! depends on wall-clock timing to pass.

use super::ring::SUSPENDED;
use super::*;
use crate::sync::Ordering;
use crate::sync::{AtomicUsize, thread};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

/// Scales iteration counts down under Miri.
fn n(full: u64, miri: u64) -> u64 {
    if cfg!(miri) { miri } else { full }
}

/// A message that counts how many copies are alive.
#[derive(Debug)]
struct Counted {
    id: u64,
    live: Arc<AtomicUsize>,
}

impl Counted {
    fn new(id: u64, live: &Arc<AtomicUsize>) -> Self {
        live.fetch_add(1, Ordering::SeqCst);
        Self {
            id,
            live: Arc::clone(live),
        }
    }
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        Self::new(self.id, &self.live)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

fn drain<T: Clone + Send + Sync>(rx: &mut Receiver<T>) -> Vec<Result<T, TryRecvError>> {
    let mut out = Vec::new();
    loop {
        match rx.try_recv() {
            Err(TryRecvError::Empty) | Err(TryRecvError::Closed) => return out,
            r => out.push(r),
        }
    }
}

#[test]
fn build_errors_name_the_setting() {
    for cap in [0, 3, 6, 1000] {
        assert_eq!(
            Sender::<u8>::new(cap, 1).unwrap_err(),
            BuildError::EventCapacity(cap)
        );
    }
    assert_eq!(
        Sender::<u8>::new(4, 0).unwrap_err(),
        BuildError::MaxSubscribers(0)
    );
    assert!(
        BuildError::EventCapacity(3)
            .to_string()
            .contains("capacity")
    );
    assert!(
        BuildError::MaxSubscribers(0)
            .to_string()
            .contains("max_readers")
    );
    let tx = Sender::<u8>::new(1, 1).unwrap();
    assert_eq!(tx.capacity(), 1);
}

#[test]
fn traits_of_public_types() {
    fn err<E: std::error::Error + Clone + Copy + PartialEq + Eq + Send + Sync + 'static>() {}
    // The crate's one `BuildError` holds a `String` (a spawn failure):
    // `Clone`, not `Copy`.
    fn build_err<E: std::error::Error + Clone + PartialEq + Eq + Send + Sync + 'static>() {}
    build_err::<BuildError>();
    err::<SubscribeError>();
    err::<RecvError>();
    err::<TryRecvError>();
    err::<RecvTimeoutError>();
    fn send_sync<X: Send + Sync>() {}
    fn send<X: Send>() {}
    send_sync::<Sender<String>>();
    send::<Receiver<String>>();
}

#[test]
fn in_order_no_lag_within_capacity() {
    let tx = Sender::new(4, 2).unwrap();
    let mut rx = tx.subscribe().unwrap();
    // Many rounds of exactly `capacity` unread messages: never a lag.
    for round in 0..n(100, 5) {
        for i in 0..4 {
            tx.send(round * 4 + i);
        }
        let got: Vec<_> = (0..4).map(|_| rx.try_recv().unwrap()).collect();
        assert_eq!(got, (round * 4..round * 4 + 4).collect::<Vec<_>>());
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    }
}

#[test]
fn exact_lag_then_catch_up_then_lag_again() {
    let tx = Sender::new(4, 2).unwrap();
    let mut rx = tx.subscribe().unwrap();
    for i in 0..10 {
        tx.send(i);
    }
    // 10 sent into 4 slots: 0..6 freed.
    assert_eq!(rx.try_recv(), Err(TryRecvError::Lagged(6)));
    assert_eq!(
        drain(&mut rx),
        vec![Ok(6), Ok(7), Ok(8), Ok(9)],
        "continues from the oldest message still held"
    );
    // Caught up: keeping within capacity loses nothing.
    for i in 10..14 {
        tx.send(i);
    }
    assert_eq!(drain(&mut rx), vec![Ok(10), Ok(11), Ok(12), Ok(13)]);
    // Lag again, by exactly one.
    for i in 14..19 {
        tx.send(i);
    }
    assert_eq!(rx.recv(), Err(RecvError::Lagged(1)));
    assert_eq!(rx.recv(), Ok(15));
    // A partial read in between still counts exactly.
    for i in 19..25 {
        tx.send(i);
    }
    // Held: 21..25 (16..21 freed, 5 of which rx had not read).
    assert_eq!(rx.try_recv(), Err(TryRecvError::Lagged(5)));
    assert_eq!(drain(&mut rx), vec![Ok(21), Ok(22), Ok(23), Ok(24)]);
}

#[test]
fn capacity_one() {
    let tx = Sender::new(1, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    tx.send('a');
    assert_eq!(rx.try_recv(), Ok('a'));
    tx.send('b');
    tx.send('c');
    assert_eq!(rx.try_recv(), Err(TryRecvError::Lagged(1)));
    assert_eq!(rx.try_recv(), Ok('c'));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.send('d');
    drop(tx);
    assert_eq!(rx.try_recv(), Ok('d'));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Closed));
}

#[test]
fn capacity_two() {
    let tx = Sender::new(2, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    tx.send(1);
    tx.send(2);
    assert_eq!(drain(&mut rx), vec![Ok(1), Ok(2)]);
    for i in 3..8 {
        tx.send(i);
    }
    assert_eq!(rx.try_recv(), Err(TryRecvError::Lagged(3)));
    assert_eq!(drain(&mut rx), vec![Ok(6), Ok(7)]);
}

#[test]
fn two_readers_each_see_everything_in_order() {
    let tx = Sender::new(8, 4).unwrap();
    let mut a = tx.subscribe().unwrap();
    let mut b = tx.subscribe().unwrap();
    for i in 0..8 {
        tx.send(i);
    }
    let all: Vec<_> = (0..8).map(Ok).collect();
    assert_eq!(drain(&mut a), all);
    assert_eq!(drain(&mut b), all);
}

#[test]
fn new_reader_starts_at_next_message() {
    let tx = Sender::new(8, 2).unwrap();
    tx.send(1);
    tx.send(2);
    let mut rx = tx.subscribe().unwrap();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.send(3);
    assert_eq!(drain(&mut rx), vec![Ok(3)]);
}

#[test]
fn registry_full_and_slot_reuse() {
    let tx = Sender::<u32>::new(4, 2).unwrap();
    assert_eq!(tx.receiver_count(), 0);
    let a = tx.subscribe().unwrap();
    let b = tx.subscribe().unwrap();
    assert_eq!(tx.receiver_count(), 2);
    assert_eq!(
        tx.subscribe().unwrap_err(),
        SubscribeError::RegistryFull { max_readers: 2 }
    );
    assert!(tx.subscribe().unwrap_err().to_string().contains("full"));
    let freed = a.slot;
    drop(a);
    assert_eq!(tx.receiver_count(), 1);
    tx.send(7);
    let mut c = tx.subscribe().unwrap();
    assert_eq!(c.slot, freed, "the dropped reader's slot is reused");
    assert_eq!(c.try_recv(), Err(TryRecvError::Empty), "starts after 7");
    tx.send(8);
    assert_eq!(c.try_recv(), Ok(8));
    drop(b);
    drop(c);
    assert_eq!(tx.receiver_count(), 0);
}

#[test]
fn reused_slot_does_not_inherit_old_position() {
    // The old occupant stops at 0; cleanup moves the empty slot on; the new
    // occupant starts at the head, never behind what was freed.
    let tx = Sender::new(2, 1).unwrap();
    let old = tx.subscribe().unwrap();
    for i in 0..5 {
        tx.send(i);
    }
    drop(old);
    for i in 5..9 {
        tx.send(i);
    }
    let mut rx = tx.subscribe().unwrap();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.send(9);
    tx.send(10);
    assert_eq!(drain(&mut rx), vec![Ok(9), Ok(10)]);
}

#[test]
fn closed_only_after_drain() {
    let tx = Sender::new(4, 1).unwrap();
    let tx2 = tx.clone();
    let mut rx = tx.subscribe().unwrap();
    tx.send(1);
    drop(tx);
    assert_eq!(rx.try_recv(), Ok(1));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty), "a clone remains");
    tx2.send(2);
    tx2.send(3);
    drop(tx2);
    assert_eq!(rx.recv(), Ok(2));
    assert_eq!(rx.recv_timeout(Duration::from_secs(3600)), Ok(3));
    assert_eq!(rx.recv(), Err(RecvError::Closed));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Closed));
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(3600)),
        Err(RecvTimeoutError::Closed)
    );
    assert_eq!(
        rx.try_recv_batch(&mut Vec::new(), 4),
        Err(TryRecvError::Closed)
    );
}

#[test]
fn closed_reports_lag_first() {
    let tx = Sender::new(2, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    for i in 0..5 {
        tx.send(i);
    }
    drop(tx);
    assert_eq!(rx.recv(), Err(RecvError::Lagged(3)));
    assert_eq!(rx.recv(), Ok(3));
    assert_eq!(rx.recv(), Ok(4));
    assert_eq!(rx.recv(), Err(RecvError::Closed));
}

#[test]
fn drop_counts_balance() {
    let live = Arc::new(AtomicUsize::new(0));
    {
        let tx = Sender::new(4, 4).unwrap();
        let mut a = tx.subscribe().unwrap();
        let mut b = tx.subscribe().unwrap();
        for i in 0..n(50, 10) {
            tx.send(Counted::new(i, &live));
            if i % 3 == 0 {
                drop(a.try_recv());
            }
        }
        // The ring holds exactly `capacity` originals; b's lag is exact.
        assert_eq!(live.load(Ordering::SeqCst), 4);
        let total = n(50, 10);
        assert_eq!(b.try_recv().unwrap_err(), TryRecvError::Lagged(total - 4));
        let got: Vec<u64> = (0..4).map(|_| b.try_recv().unwrap().id).collect();
        assert_eq!(got, (total - 4..total).collect::<Vec<_>>());
        assert_eq!(live.load(Ordering::SeqCst), 4, "a has not passed them");
        // `a` lagged or not, depending on `n`: drain it with batches.
        let mut batch = Vec::new();
        while !matches!(a.try_recv_batch(&mut batch, 10), Err(TryRecvError::Empty)) {}
        assert_eq!(batch.len(), 4);
        drop(batch);
        assert_eq!(live.load(Ordering::SeqCst), 0, "both passed every one");
        drop(tx);
    }
    assert_eq!(live.load(Ordering::SeqCst), 0, "every message dropped once");
}

#[test]
fn drop_with_only_receivers_or_only_sender() {
    let live = Arc::new(AtomicUsize::new(0));
    let tx = Sender::new(2, 1).unwrap();
    let rx = tx.subscribe().unwrap();
    tx.send(Counted::new(1, &live));
    drop(tx);
    assert_eq!(live.load(Ordering::SeqCst), 1);
    drop(rx);
    assert_eq!(live.load(Ordering::SeqCst), 0);

    let tx = Sender::new(2, 1).unwrap();
    for i in 0..5 {
        tx.send(Counted::new(i, &live)); // nobody reads: cleanup frees
    }
    assert_eq!(live.load(Ordering::SeqCst), 2);
    drop(tx);
    assert_eq!(live.load(Ordering::SeqCst), 0);
}

#[test]
fn batch_receive() {
    let tx = Sender::new(8, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    let mut out = Vec::new();
    assert_eq!(rx.try_recv_batch(&mut out, 4), Err(TryRecvError::Empty));
    assert_eq!(rx.try_recv_batch(&mut out, 0), Ok(0));
    for i in 0..6 {
        tx.send(i);
    }
    assert_eq!(rx.try_recv_batch(&mut out, 4), Ok(4));
    assert_eq!(rx.try_recv_batch(&mut out, 4), Ok(2));
    assert_eq!(out, [0, 1, 2, 3, 4, 5]);
    for i in 6..20 {
        tx.send(i);
    }
    assert_eq!(
        rx.try_recv_batch(&mut out, 100),
        Err(TryRecvError::Lagged(6))
    );
    out.clear();
    assert_eq!(rx.try_recv_batch(&mut out, 100), Ok(8));
    assert_eq!(out, (12..20).collect::<Vec<_>>());
}

#[test]
fn recv_ref_reads_in_place() {
    let tx = Sender::new(2, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    assert!(matches!(rx.try_recv_ref(), Err(TryRecvError::Empty)));
    tx.send(String::from("x"));
    tx.send(String::from("y"));
    {
        let r = rx.try_recv_ref().unwrap();
        assert_eq!(*r, "x");
        assert_eq!(format!("{r:?}"), "RecvRef(\"x\")");
    }
    assert_eq!(rx.try_recv().unwrap(), "y");
    drop(tx);
    assert!(matches!(rx.try_recv_ref(), Err(TryRecvError::Closed)));
}

#[test]
fn suspended_between_receives() {
    // The checked bit: outside a receive the reader's counter is suspended,
    // so cleanup may move it; inside, the `Active` token is the only way to
    // read (see the compile_fail doc test for the public side).
    let tx = Sender::new(2, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    let counter = |rx: &Receiver<u32>| rx.inner.counter(rx.slot).load(Ordering::SeqCst);
    assert_ne!(counter(&rx) & SUSPENDED, 0);
    tx.send(1);
    {
        let r = rx.try_recv_ref().unwrap();
        let c = r.active.rx.inner.counter(r.active.rx.slot);
        assert_eq!(c.load(Ordering::SeqCst) & SUSPENDED, 0, "active while held");
    }
    assert_ne!(counter(&rx) & SUSPENDED, 0);
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    assert_ne!(counter(&rx) & SUSPENDED, 0);
}

#[test]
fn no_slot_index_jump_at_generation_wrap() {
    for cap in [1usize, 2, 4, 8] {
        let origin = u64::MAX - cap as u64; // wraps after `cap + 1` messages
        let tx = Sender::with_start_generation(cap, 1, origin).unwrap();
        let mut rx = tx.subscribe().unwrap();
        let total = 4 * cap as u64;
        let mut prev = None;
        for seq in 0..total {
            let idx = tx.inner.slot_index(seq);
            assert_eq!(idx, (origin.wrapping_add(seq) % cap as u64) as usize);
            if let Some(p) = prev {
                assert_eq!(idx, (p + 1) % cap, "slot index jumped at seq {seq}");
            }
            prev = Some(idx);
            tx.send(seq);
            assert_eq!(rx.try_recv(), Ok(seq));
        }
        // Lag across the wrap is exact too.
        for seq in total..total + cap as u64 + 3 {
            tx.send(seq);
        }
        assert_eq!(rx.try_recv(), Err(TryRecvError::Lagged(3)));
        let got: Vec<_> = drain(&mut rx).into_iter().map(Result::unwrap).collect();
        assert_eq!(got, (total + 3..total + cap as u64 + 3).collect::<Vec<_>>());
    }
}

#[test]
fn writer_panic_leaves_a_tombstone() {
    let live = Arc::new(AtomicUsize::new(0));
    let tx = Sender::new(4, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    tx.send(Counted::new(0, &live));
    let r = catch_unwind(AssertUnwindSafe(|| {
        tx.send_with(|| panic!("writer dies between reserve and publish"));
    }));
    assert!(r.is_err());
    // The ring is not wedged: later sends publish, readers skip the tombstone.
    tx.send(Counted::new(2, &live));
    let ids: Vec<u64> = drain(&mut rx).into_iter().map(|r| r.unwrap().id).collect();
    assert_eq!(ids, [0, 2]);
    // A lag over a tombstone counts its generation.
    let _ = catch_unwind(AssertUnwindSafe(|| tx.send_with(|| panic!("again"))));
    for i in 3..7 {
        tx.send(Counted::new(i, &live));
    }
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Lagged(1));
    let ids: Vec<u64> = drain(&mut rx).into_iter().map(|r| r.unwrap().id).collect();
    assert_eq!(ids, [3, 4, 5, 6]);
    drop((tx, rx));
    assert_eq!(live.load(Ordering::SeqCst), 0);
}

#[test]
fn writer_panic_on_another_thread_does_not_wedge_other_writers() {
    let tx = Sender::new(2, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    let tx2 = tx.clone();
    let h = thread::spawn(move || tx2.send_with(|| panic!("boom")));
    assert!(h.join().is_err());
    tx.send(1u32);
    assert_eq!(rx.recv(), Ok(1));
}

#[derive(Debug, PartialEq, Eq)]
struct PanicOnClone(u32);

impl Clone for PanicOnClone {
    fn clone(&self) -> Self {
        if self.0 == 13 {
            panic!("clone of 13");
        }
        Self(self.0)
    }
}

#[test]
fn reader_panic_in_clone_suspends_it() {
    let tx = Sender::new(1, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    tx.send(PanicOnClone(13));
    let r = catch_unwind(AssertUnwindSafe(|| rx.try_recv()));
    assert!(r.is_err());
    // The reader is suspended again: the writer frees 13 without waiting.
    tx.send(PanicOnClone(14));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Lagged(1)));
    assert_eq!(rx.try_recv(), Ok(PanicOnClone(14)));
}

#[test]
fn recv_timeout_times_out_when_nothing_is_sent() {
    let tx = Sender::<u32>::new(4, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(20)),
        Err(RecvTimeoutError::Timeout)
    );
    assert_eq!(
        rx.recv_timeout(Duration::ZERO),
        Err(RecvTimeoutError::Timeout)
    );
    tx.send(5);
    assert_eq!(rx.recv_timeout(Duration::ZERO), Ok(5));
}

#[test]
fn blocking_recv_is_woken_by_a_send_from_another_thread() {
    let tx = Sender::new(4, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    let h = thread::spawn(move || {
        let first = rx.recv();
        let second = rx.recv();
        (first, second)
    });
    // Whether the reader parks before or after these sends, it must get both
    // and then Closed; a lost wake-up would hang the join.
    tx.send(1u32);
    tx.send(2u32);
    let (a, b) = h.join().unwrap();
    assert_eq!((a, b), (Ok(1), Ok(2)));
}

#[test]
fn blocking_recv_is_woken_by_the_last_sender_leaving() {
    let tx = Sender::<u32>::new(4, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    let h = thread::spawn(move || rx.recv());
    drop(tx);
    assert_eq!(h.join().unwrap(), Err(RecvError::Closed));
}

/// Many writers and readers on real threads. Each reader checks that every
/// writer's messages arrive in order and that received + lagged accounts for
/// every message exactly; drop counts balance.
#[test]
fn threads_account_for_every_message() {
    let writers = 3u64;
    let per_writer = n(20_000, 60);
    let live = Arc::new(AtomicUsize::new(0));
    let tx = Sender::new(8, 4).unwrap();
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let mut rx = tx.subscribe().unwrap();
            thread::spawn(move || {
                let mut last = vec![None::<u64>; writers as usize];
                let (mut got, mut lost) = (0u64, 0u64);
                let mut batch = Vec::new();
                loop {
                    let step = if r == 0 {
                        rx.recv().map(|m: Counted| vec![m]).map_err(|e| match e {
                            RecvError::Lagged(n) => TryRecvError::Lagged(n),
                            RecvError::Closed => TryRecvError::Closed,
                        })
                    } else if r == 1 {
                        batch.clear();
                        rx.try_recv_batch(&mut batch, 5)
                            .map(|_| std::mem::take(&mut batch))
                    } else {
                        rx.recv_timeout(Duration::from_millis(1))
                            .map(|m| vec![m])
                            .or_else(|e| match e {
                                RecvTimeoutError::Timeout => Ok(vec![]),
                                RecvTimeoutError::Lagged(n) => Err(TryRecvError::Lagged(n)),
                                RecvTimeoutError::Closed => Err(TryRecvError::Closed),
                            })
                    };
                    match step {
                        Ok(msgs) => {
                            for m in msgs {
                                let (w, i) = (m.id / per_writer, m.id % per_writer);
                                let slot = &mut last[w as usize];
                                assert!(slot.is_none_or(|p| p < i), "out of order");
                                *slot = Some(i);
                                got += 1;
                            }
                        }
                        Err(TryRecvError::Lagged(n)) => lost += n,
                        Err(TryRecvError::Closed) => return got + lost,
                        Err(TryRecvError::Empty) => thread::yield_now(),
                    }
                }
            })
        })
        .collect();
    let senders: Vec<_> = (0..writers)
        .map(|w| {
            let tx = tx.clone();
            let live = Arc::clone(&live);
            thread::spawn(move || {
                for i in 0..per_writer {
                    tx.send(Counted::new(w * per_writer + i, &live));
                }
            })
        })
        .collect();
    drop(tx);
    for s in senders {
        s.join().unwrap();
    }
    for r in readers {
        assert_eq!(r.join().unwrap(), writers * per_writer);
    }
    assert_eq!(live.load(Ordering::SeqCst), 0);
}

/// Readers that join and leave while writers run: no use-after-free (Miri),
/// each joined reader's accounting is exact from where it started.
#[test]
fn readers_join_and_leave_under_load() {
    let total = n(20_000, 80);
    let tx = Sender::new(4, 2).unwrap();
    let joiner = {
        let tx = tx.clone();
        thread::spawn(move || {
            for _ in 0..n(200, 5) {
                if let Ok(mut rx) = tx.subscribe() {
                    for _ in 0..3 {
                        let _ = rx.try_recv();
                    }
                }
            }
        })
    };
    let mut steady = tx.subscribe().unwrap();
    let writer = thread::spawn(move || {
        for i in 0..total {
            tx.send(i);
        }
    });
    let (mut got, mut lost, mut last) = (0, 0, None);
    loop {
        match steady.recv() {
            Ok(i) => {
                assert!(last.is_none_or(|p| p < i));
                last = Some(i);
                got += 1;
            }
            Err(RecvError::Lagged(n)) => lost += n,
            Err(RecvError::Closed) => break,
        }
    }
    writer.join().unwrap();
    joiner.join().unwrap();
    assert_eq!(got + lost, total);
}

#[test]
fn send_batch_delivers_in_order_with_exact_lag() {
    let live = Arc::new(AtomicUsize::new(0));
    {
        let tx = Sender::new(4, 1).unwrap();
        let mut rx = tx.subscribe().unwrap();
        tx.send_batch((0..3).map(|i| Counted::new(i, &live)));
        let got: Vec<u64> = drain(&mut rx).into_iter().map(|r| r.unwrap().id).collect();
        assert_eq!(got, [0, 1, 2]);
        // Ten more into a ring of four: the reader lost exactly six.
        tx.send_batch((3..13).map(|i| Counted::new(i, &live)));
        assert_eq!(rx.try_recv().map(|c| c.id), Err(TryRecvError::Lagged(6)));
        let rest: Vec<u64> = drain(&mut rx).into_iter().map(|r| r.unwrap().id).collect();
        assert_eq!(rest, [9, 10, 11, 12]);
        tx.send_batch(std::iter::empty());
        assert_eq!(rx.try_recv().map(|c| c.id), Err(TryRecvError::Empty));
    }
    assert_eq!(live.load(Ordering::SeqCst), 0, "drops balance");
}

#[test]
fn send_batch_wakes_a_parked_reader_once_for_the_batch() {
    let tx = Sender::new(8, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    let reader = std::thread::spawn(move || (rx.recv(), rx.recv(), rx.recv()));
    std::thread::sleep(std::time::Duration::from_millis(20)); // likely parked by now
    tx.send_batch([1u8, 2, 3]);
    assert_eq!(reader.join().unwrap(), (Ok(1), Ok(2), Ok(3)));
}

/// A message whose original (not its clones) panics when dropped.
struct Bomb(bool);
impl Clone for Bomb {
    fn clone(&self) -> Self {
        Bomb(false)
    }
}
impl Drop for Bomb {
    fn drop(&mut self) {
        if self.0 && !std::thread::panicking() {
            panic!("message drop panics");
        }
    }
}

#[test]
fn a_panicking_drop_mid_batch_still_delivers_the_owed_wakeup() {
    let tx = Sender::new(1, 2).unwrap();
    let mut rx = tx.subscribe().unwrap();
    // A receiver that never reads keeps the bomb in the ring after `rx`
    // took it, so the writer that reuses the slot is the one to drop it.
    let _idle = tx.subscribe().unwrap();
    tx.send(Bomb(true));
    let reader = std::thread::spawn(move || {
        let first = rx.recv().map(|b| b.0);
        // Parks (very likely) until the batch below publishes.
        let second = rx.recv().map(|b| b.0);
        (first, second)
    });
    std::thread::sleep(std::time::Duration::from_millis(20));
    // Reusing the only slot drops the bomb after publishing Bomb(false):
    // the panic unwinds out of send_batch, which must still wake the reader.
    let r = catch_unwind(AssertUnwindSafe(|| tx.send_batch([Bomb(false)])));
    assert!(r.is_err(), "the old message's drop panicked");
    assert_eq!(reader.join().unwrap(), (Ok(false), Ok(false)));
}

/// Overwriting messages whose `Drop` panics does not cut a batch short:
/// every message is sent, every displaced one dropped, and the first panic
/// reaches the sender at the end.
#[test]
fn a_panicking_drop_mid_batch_still_sends_the_rest() {
    let tx = Sender::new(2, 1).unwrap();
    tx.send(Bomb(true));
    tx.send(Bomb(true));
    let mut rx = tx.subscribe().unwrap();
    let r = catch_unwind(AssertUnwindSafe(|| {
        tx.send_batch([Bomb(false), Bomb(false), Bomb(false), Bomb(false)])
    }));
    assert!(r.is_err(), "the old messages' drops panicked");
    // All four were sent: two still in the ring, the reader two behind.
    assert_eq!(rx.try_recv().map(|b| b.0), Err(TryRecvError::Lagged(2)));
    assert_eq!(rx.try_recv().map(|b| b.0), Ok(false));
    assert_eq!(rx.try_recv().map(|b| b.0), Ok(false));
    assert_eq!(rx.try_recv().map(|b| b.0), Err(TryRecvError::Empty));
}

// ----- reclaim: a message leaves the ring once every receiver passed it ---

/// Copies alive of messages counted by `live`, less `outside` held by the
/// test: what the ring itself still holds.
fn in_ring(live: &Arc<AtomicUsize>, outside: usize) -> usize {
    live.load(Ordering::SeqCst) - outside
}

#[test]
fn the_receive_that_passes_a_message_last_drops_it() {
    let live = Arc::new(AtomicUsize::new(0));
    let tx = Sender::new(8, 3).unwrap();
    let mut a = tx.subscribe().unwrap();
    let mut b = tx.subscribe().unwrap();
    tx.send(Counted::new(1, &live));
    tx.send(Counted::new(2, &live));
    assert_eq!(in_ring(&live, 0), 2);
    drop(a.try_recv().unwrap());
    assert_eq!(in_ring(&live, 0), 2, "b has not taken 1");
    drop(b.try_recv().unwrap());
    assert_eq!(in_ring(&live, 0), 1, "both passed 1");
    // A receiver joining now starts after 2, so it holds nothing back.
    let _late = tx.subscribe().unwrap();
    let two = b.try_recv().unwrap();
    assert_eq!(in_ring(&live, 1), 1, "a has not taken 2");
    drop(a.try_recv().unwrap());
    assert_eq!(in_ring(&live, 1), 0, "both passed 2");
    drop(two);
}

#[test]
fn a_batch_a_borrow_and_a_lag_each_release_what_they_passed() {
    let live = Arc::new(AtomicUsize::new(0));
    let tx = Sender::new(4, 2).unwrap();
    let mut rx = tx.subscribe().unwrap();
    for id in 0..3 {
        tx.send(Counted::new(id, &live));
    }
    let mut out = Vec::new();
    assert_eq!(rx.try_recv_batch(&mut out, 2), Ok(2));
    assert_eq!(in_ring(&live, 2), 1, "the batch released 0 and 1");
    drop(out);
    {
        let r = rx.try_recv_ref().unwrap();
        assert_eq!(r.id, 2);
        assert_eq!(in_ring(&live, 0), 1, "held while borrowed");
    }
    assert_eq!(in_ring(&live, 0), 0, "released with the guard");
    // A second receiver that never reads keeps messages, and a lag moves
    // `rx` past messages the writer freed: 5..=8 stay for `idle` until the
    // ring wraps on them.
    let idle = tx.subscribe().unwrap();
    for id in 3..9 {
        tx.send(Counted::new(id, &live));
    }
    assert_eq!(in_ring(&live, 0), 4, "the writer cleared what it reused");
    assert_eq!(rx.try_recv_batch(&mut Vec::new(), 0), Ok(0));
    let got: Vec<u64> = drain(&mut rx)
        .into_iter()
        .map(|r| r.map(|m| m.id).unwrap_or(99))
        .collect();
    assert_eq!(got, [99, 5, 6, 7, 8], "Lagged (as 99), then 5..=8");
    assert_eq!(
        in_ring(&live, 0),
        4,
        "kept for the receiver that never reads"
    );
    drop(idle);
    assert_eq!(in_ring(&live, 0), 0, "released when it left");
}

#[test]
fn a_panicking_drop_in_a_receive_waits_for_the_receivers_drop() {
    let tx = Sender::new(4, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    tx.send(Bomb(true));
    tx.send(Bomb(true));
    // Each receive drops the original it passed; the panic does not cost
    // the receive its message.
    assert!(!rx.try_recv().unwrap().0);
    assert!(!rx.recv().unwrap().0);
    assert_eq!(rx.try_recv().map(|b| b.0), Err(TryRecvError::Empty));
    tx.send(Bomb(false));
    assert!(!rx.try_recv().unwrap().0, "the ring goes on");
    let r = catch_unwind(AssertUnwindSafe(move || drop(rx)));
    assert!(
        r.is_err(),
        "the first panic is resumed by the receiver's drop"
    );
    // The sender sees nothing of it.
    tx.send(Bomb(false));
}

/// A message whose original sends one more message on its own area when
/// dropped (as a value pruning a tree from its `Drop` does).
struct Cascade(Option<Sender<Cascade>>);

impl Clone for Cascade {
    fn clone(&self) -> Self {
        Cascade(None)
    }
}

impl Drop for Cascade {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            tx.send(Cascade(None));
        }
    }
}

#[test]
fn a_drop_run_by_a_receive_may_send_on_the_same_area() {
    for capacity in [1, 2] {
        let tx = Sender::new(capacity, 1).unwrap();
        let mut rx = tx.subscribe().unwrap();
        tx.send(Cascade(Some(tx.clone())));
        assert!(rx.try_recv().is_ok());
        // Its original was dropped by that receive, and sent this one.
        assert!(rx.try_recv().is_ok(), "capacity {capacity}");
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    }
}

//! Unit tests of the async receive (`poll_recv`, `recv_async`, `Stream`),
//! driven by hand: a waker that counts its wake-ups and a minimal
//! thread-parking `block_on`. No runtime, no wall-clock timing. Small enough
//! for Miri.

use super::*;
use crate::sync::thread;
use std::pin::pin;
use std::sync::Arc as StdArc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::task::{Context, Poll};
use std::task::{Wake, Waker};

/// A waker that counts how often it was woken.
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: StdArc<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// A counting waker and its counter. `StdArc::strong_count(&count) == 1`
/// means nobody (the ring) holds a clone of the waker any more.
fn counting() -> (StdArc<Count>, Waker) {
    let count = StdArc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(StdArc::clone(&count));
    (count, waker)
}

fn wakes(c: &StdArc<Count>) -> usize {
    c.0.load(SeqCst)
}

/// Wakes the thread that runs [`block_on`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: StdArc<Self>) {
        self.0.unpark();
    }
}

/// The smallest executor: polls `f` on this thread, parking it between
/// polls until the waker unparks it (spurious unparks only cost a poll).
fn block_on<F: Future>(f: F) -> F::Output {
    let waker = Waker::from(StdArc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[test]
fn pending_until_a_publish_wakes_it_once() {
    let tx = Sender::new(4, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    let (count, waker) = counting();
    let mut cx = Context::from_waker(&waker);
    {
        let mut recv = pin!(rx.recv_async());
        assert!(recv.as_mut().poll(&mut cx).is_pending());
        assert!(
            recv.as_mut().poll(&mut cx).is_pending(),
            "a re-poll stays asleep"
        );
        assert_eq!(tx.inner.sleepers(), (true, 1, 0));
        tx.send(1u32);
        tx.send(2);
        assert_eq!(
            wakes(&count),
            1,
            "the first publish wakes; the second pays nothing"
        );
        assert_eq!(tx.inner.sleepers(), (false, 0, 0));
        assert_eq!(
            StdArc::strong_count(&count),
            2,
            "the ring dropped its clone"
        );
        assert_eq!(recv.as_mut().poll(&mut cx), Poll::Ready(Ok(1)));
    }
    assert_eq!(block_on(rx.recv_async()), Ok(2));
}

#[test]
fn ready_at_once_registers_nothing() {
    let tx = Sender::new(4, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    tx.send(5u8);
    let (count, waker) = counting();
    let mut cx = Context::from_waker(&waker);
    assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Ok(5)));
    assert_eq!(tx.inner.sleepers(), (false, 0, 0));
    assert_eq!(StdArc::strong_count(&count), 2);
}

#[test]
fn the_last_sender_leaving_wakes_it_with_closed() {
    let tx = Sender::<u32>::new(4, 1).unwrap();
    let tx2 = tx.clone();
    let mut rx = tx.subscribe().unwrap();
    let (count, waker) = counting();
    let mut cx = Context::from_waker(&waker);
    let mut recv = pin!(rx.recv_async());
    assert!(recv.as_mut().poll(&mut cx).is_pending());
    tx.send(9);
    assert_eq!(recv.as_mut().poll(&mut cx), Poll::Ready(Ok(9)));
    // A fresh receive on the same future, asleep again.
    assert!(recv.as_mut().poll(&mut cx).is_pending());
    drop(tx);
    assert_eq!(wakes(&count), 1, "a sender remains: no wake");
    drop(tx2);
    assert_eq!(wakes(&count), 2, "the last sender wakes it");
    assert_eq!(
        recv.as_mut().poll(&mut cx),
        Poll::Ready(Err(RecvError::Closed))
    );
    assert_eq!(
        recv.as_mut().poll(&mut cx),
        Poll::Ready(Err(RecvError::Closed))
    );
}

#[test]
fn lagged_is_exact_while_asleep() {
    let tx = Sender::new(4, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    let (count, waker) = counting();
    let mut cx = Context::from_waker(&waker);
    assert!(rx.poll_recv(&mut cx).is_pending());
    for i in 0..10u32 {
        tx.send(i);
    }
    assert_eq!(wakes(&count), 1);
    assert_eq!(
        rx.poll_recv(&mut cx),
        Poll::Ready(Err(RecvError::Lagged(6)))
    );
    for i in 6..10 {
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Ok(i)));
    }
    assert!(rx.poll_recv(&mut cx).is_pending());
}

/// Two readers asleep; one gives its receive up (the future dropped while
/// registered). Its waker leaves the ring, the other is still woken, and a
/// new receive of the first gets the message it did not take.
#[test]
fn a_dropped_future_leaves_the_ring_consistent() {
    let tx = Sender::new(4, 2).unwrap();
    let mut a = tx.subscribe().unwrap();
    let mut b = tx.subscribe().unwrap();
    let (ca, wa) = counting();
    let (cb, wb) = counting();
    let mut fa = Box::pin(a.recv_async());
    assert!(fa.as_mut().poll(&mut Context::from_waker(&wa)).is_pending());
    assert!(b.poll_recv(&mut Context::from_waker(&wb)).is_pending());
    assert_eq!(tx.inner.sleepers(), (true, 2, 0));
    drop(fa);
    assert_eq!(StdArc::strong_count(&ca), 2, "no dangling waker");
    assert_eq!(tx.inner.sleepers(), (true, 1, 0), "b still asleep");
    tx.send(1u32);
    assert_eq!((wakes(&ca), wakes(&cb)), (0, 1));
    assert_eq!(
        b.poll_recv(&mut Context::from_waker(&wb)),
        Poll::Ready(Ok(1))
    );
    assert_eq!(block_on(a.recv_async()), Ok(1), "nothing lost");
    // The last sleeper giving up clears WAITING: no wake-up left to pay.
    let mut fa = Box::pin(a.recv_async());
    assert!(fa.as_mut().poll(&mut Context::from_waker(&wa)).is_pending());
    assert_eq!(tx.inner.sleepers(), (true, 1, 0));
    drop(fa);
    assert_eq!(tx.inner.sleepers(), (false, 0, 0));
    drop((a, b));
    assert_eq!(
        (StdArc::strong_count(&ca), StdArc::strong_count(&cb)),
        (2, 2)
    );
}

#[test]
fn a_receiver_dropped_while_registered_frees_its_place() {
    let tx = Sender::new(4, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    let (count, waker) = counting();
    assert!(rx.poll_recv(&mut Context::from_waker(&waker)).is_pending());
    drop(rx);
    assert_eq!(StdArc::strong_count(&count), 2);
    assert_eq!(tx.inner.sleepers(), (false, 0, 0));
    let mut again = tx.subscribe().expect("the slot is free");
    tx.send(3u8);
    assert_eq!(wakes(&count), 0);
    assert_eq!(block_on(again.recv_async()), Ok(3));
}

#[test]
fn a_repoll_with_another_waker_replaces_the_first() {
    let tx = Sender::new(4, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    let (c1, w1) = counting();
    let (c2, w2) = counting();
    assert!(rx.poll_recv(&mut Context::from_waker(&w1)).is_pending());
    assert!(rx.poll_recv(&mut Context::from_waker(&w2)).is_pending());
    assert_eq!(StdArc::strong_count(&c1), 2, "the first waker was dropped");
    tx.send(1u8);
    assert_eq!((wakes(&c1), wakes(&c2)), (0, 1));
}

/// More sleepers than one notify takes per lock hold, plus a parked thread:
/// one publish wakes each exactly once.
#[test]
fn one_publish_wakes_every_sleeper() {
    let n = 2 * ring::WAKE_BATCH + 3;
    let tx = Sender::new(4, n + 1).unwrap();
    let mut rxs: Vec<_> = (0..n).map(|_| tx.subscribe().unwrap()).collect();
    let counts: Vec<_> = rxs
        .iter_mut()
        .map(|rx| {
            let (c, w) = counting();
            assert!(rx.poll_recv(&mut Context::from_waker(&w)).is_pending());
            c
        })
        .collect();
    let mut blocking = tx.subscribe().unwrap();
    let parked = thread::spawn(move || blocking.recv());
    while tx.inner.sleepers().2 == 0 {
        thread::yield_now(); // until the thread is parked
    }
    tx.send(7u32);
    assert!(counts.iter().all(|c| wakes(c) == 1));
    assert_eq!(parked.join().unwrap(), Ok(7));
    for rx in &mut rxs {
        assert_eq!(rx.try_recv(), Ok(7));
    }
    assert_eq!(tx.inner.sleepers(), (false, 0, 0));
}

/// A task on another thread, run by the parking `block_on`, receives every
/// message in order while the writer publishes; then `Closed`.
#[test]
fn block_on_another_thread_receives_everything() {
    let total = if cfg!(miri) { 20 } else { 2000 };
    let tx = Sender::new(8, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    let reader = thread::spawn(move || {
        block_on(async {
            let (mut got, mut lost, mut last) = (0u64, 0u64, None);
            loop {
                match rx.recv_async().await {
                    Ok(v) => {
                        assert!(last < Some(v), "in order");
                        last = Some(v);
                        got += 1;
                    }
                    Err(RecvError::Lagged(n)) => lost += n,
                    Err(RecvError::Closed) => return (got, lost, last),
                }
            }
        })
    });
    for i in 0..total {
        tx.send(i);
    }
    drop(tx);
    let (got, lost, last) = reader.join().unwrap();
    assert_eq!(
        got + lost,
        total,
        "received + lagged accounts for every message"
    );
    assert_eq!(last, Some(total - 1), "the last message is never lost");
}

#[cfg(feature = "stream")]
#[test]
fn the_stream_surfaces_lag_and_ends_on_close() {
    use futures_core::Stream;
    use std::pin::Pin;
    let tx = Sender::new(2, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    let (count, waker) = counting();
    let mut cx = Context::from_waker(&waker);
    assert_eq!(Pin::new(&mut rx).poll_next(&mut cx), Poll::Pending);
    for i in 0..5u8 {
        tx.send(i);
    }
    assert_eq!(wakes(&count), 1);
    let mut next = || Pin::new(&mut rx).poll_next(&mut cx);
    assert_eq!(next(), Poll::Ready(Some(Err(Lagged(3)))));
    assert_eq!(next(), Poll::Ready(Some(Ok(3))));
    assert_eq!(next(), Poll::Ready(Some(Ok(4))));
    assert_eq!(next(), Poll::Pending);
    drop(tx);
    assert_eq!(wakes(&count), 2);
    assert_eq!(next(), Poll::Ready(None));
    assert_eq!(next(), Poll::Ready(None), "stays ended");
}

/// An async receive, like a blocking one, drops the message it was the
/// last to pass.
#[test]
fn an_async_receive_releases_the_message_it_passed_last() {
    let tx = Sender::new(4, 1).unwrap();
    let mut rx = tx.subscribe().unwrap();
    let value = StdArc::new(7u32);
    tx.send(StdArc::clone(&value));
    assert_eq!(StdArc::strong_count(&value), 2);
    let got = block_on(rx.recv_async()).unwrap();
    assert_eq!(StdArc::strong_count(&value), 2, "the receiver's copy only");
    drop(got);
    assert_eq!(StdArc::strong_count(&value), 1);
}

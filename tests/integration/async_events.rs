//! The async receive of a map's events: `Subscriber::recv_async` on tokio
//! and on a hand-driven executor (the `Stream` impl: `tests/stream.rs`).
//! Time is a `ManualClock`; nothing depends on wall-clock timing to pass
//! (the one timer only gives a receive up while nothing is published).

use crate::common::{MS, let_others_run, manual, runtime, with_eviction_thread};
use expiremap::{Cause, ExpireMap, ManualClock, RecvError, Subscriber};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

/// A waker that counts its wake-ups: the hand-driven executor.
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
}

#[test]
fn an_expired_event_arrives_while_the_task_sleeps() {
    let (map, clock) = with_eviction_thread(64);
    let mut sub = map.subscribe().unwrap();
    map.put(1, 10, 5 * MS);
    runtime().block_on(async {
        let task = tokio::spawn(async move { sub.recv_async().await });
        let_others_run().await;
        assert!(!task.is_finished(), "nothing expired yet: the task sleeps");
        // The eviction thread, not this one, publishes and wakes the task.
        clock.advance(6 * MS);
        let e = task.await.unwrap().unwrap();
        assert_eq!((e.key, e.value, e.cause), (1, 10, Cause::Expired));
        assert_eq!(e.deadline(), 5 * MS);
    });
}

#[test]
fn hand_polled_the_eviction_wakes_the_task_once() {
    let (map, clock) = manual::<u32, u32>();
    let mut sub = map.subscribe().unwrap();
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(Arc::clone(&count));
    let mut cx = Context::from_waker(&waker);
    let mut recv = pin!(sub.recv_async());
    assert!(recv.as_mut().poll(&mut cx).is_pending());
    map.put(1, 10, MS);
    map.put(2, 20, MS);
    assert_eq!(count.0.load(SeqCst), 0, "a put publishes nothing");
    clock.advance(2 * MS);
    assert_eq!(map.evict_expired(), 2);
    assert_eq!(count.0.load(SeqCst), 1, "woken once for both events");
    match recv.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(e)) => assert_eq!(e.cause, Cause::Expired),
        other => panic!("expected an event, got {other:?}"),
    }
}

#[test]
fn lagged_is_exact() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .event_capacity(4)
        .build();
    let mut sub = map.subscribe().unwrap();
    for k in 0..10 {
        map.put(k, k, MS);
    }
    runtime().block_on(async move {
        let task = tokio::spawn(async move {
            let lag = sub.recv_async().await;
            let mut keys = Vec::new();
            for _ in 0..4 {
                keys.push(sub.recv_async().await.unwrap().key);
            }
            (lag, keys, sub)
        });
        let_others_run().await;
        assert!(!task.is_finished());
        // All ten are published before the task runs again.
        clock.advance(2 * MS);
        assert_eq!(map.evict_expired(), 10);
        let (lag, mut keys, mut sub) = task.await.unwrap();
        assert_eq!(lag, Err(RecvError::Lagged(6)));
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), 4, "the four events the ring still held");
        drop(map);
        assert_eq!(sub.recv_async().await, Err(RecvError::Closed));
    });
}

#[test]
fn closed_after_the_map_is_dropped() {
    let (map, _clock) = with_eviction_thread(64);
    let mut sub = map.subscribe().unwrap();
    map.put(1, 10, Duration::from_secs(3600));
    runtime().block_on(async move {
        let task = tokio::spawn(async move {
            let shutdown = sub.recv_async().await;
            (shutdown, sub.recv_async().await)
        });
        let_others_run().await;
        assert!(!task.is_finished());
        drop(map); // live entries leave as Shutdown, then the stream closes
        let (shutdown, closed) = task.await.unwrap();
        let e = shutdown.unwrap();
        assert_eq!((e.key, e.value, e.cause), (1, 10, Cause::Shutdown));
        assert_eq!(closed, Err(RecvError::Closed));
    });
}

/// A receive given up while asleep (its future dropped by a timeout) leaves
/// the ring consistent: another sleeping task is still woken, and a new
/// receive of the first subscriber gets the event it never took.
#[test]
fn a_dropped_future_leaves_the_ring_consistent() {
    let (map, clock) = manual::<u32, u32>();
    let mut a = map.subscribe().unwrap();
    let mut b = map.subscribe().unwrap();
    runtime().block_on(async {
        let b_task = tokio::spawn(async move { b.recv_async().await });
        // Nothing is published while this timer runs, so it always fires:
        // the future is dropped while its waker is registered.
        let gave_up = tokio::time::timeout(MS, a.recv_async()).await;
        assert!(gave_up.is_err());
        map.put(7, 70, MS);
        clock.advance(2 * MS);
        assert_eq!(map.evict_expired(), 1);
        assert_eq!(b_task.await.unwrap().unwrap().key, 7);
        assert_eq!(a.recv_async().await.unwrap().key, 7, "nothing lost");
    });
    drop(map);
    assert_eq!(a.try_recv(), Err(expiremap::TryRecvError::Closed));
}

/// Writers on threads put short-lived entries while the eviction thread
/// follows the clock; a task on tokio receives every value exactly once
/// (as `Expired`, or `Shutdown` when the map drops) and then `Closed`.
#[test]
fn every_value_arrives_once_while_threads_put() {
    let (writers, per_writer) = (3u32, if cfg!(miri) { 20 } else { 500 });
    let (map, clock) = with_eviction_thread(1 << 14);
    let map = Arc::new(map);
    let sub = map.subscribe().unwrap();
    let consumer = std::thread::spawn(move || runtime().block_on(receive_all(sub)));
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let (map, clock) = (Arc::clone(&map), clock.clone());
            std::thread::spawn(move || {
                for i in 0..per_writer {
                    map.put(
                        w * per_writer + i,
                        i,
                        Duration::from_micros(1 + u64::from(i % 7)),
                    );
                    if i % 50 == 0 {
                        clock.advance(Duration::from_micros(10));
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    drop(Arc::into_inner(map).expect("the only handle"));
    let (mut keys, lagged) = consumer.join().unwrap();
    assert_eq!(lagged, 0, "the ring is larger than all the events");
    keys.sort_unstable();
    let expected: Vec<u32> = (0..writers * per_writer).collect();
    assert_eq!(keys, expected, "each value exactly once");
}

/// Receives until `Closed`: the keys and the total lag.
async fn receive_all(mut sub: Subscriber<u32, u32>) -> (Vec<u32>, u64) {
    let (mut keys, mut lagged) = (Vec::new(), 0);
    loop {
        match sub.recv_async().await {
            Ok(e) => {
                assert!(matches!(e.cause, Cause::Expired | Cause::Shutdown));
                keys.push(e.key);
            }
            Err(RecvError::Lagged(n)) => lagged += n,
            Err(RecvError::Closed) => return (keys, lagged),
        }
    }
}

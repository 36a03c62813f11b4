//! loom models of the async receive's waker hand-off
//! (`expiremap::broadcast`'s "Async receives: the waker protocol"): a
//! publish or close racing a task going to sleep, and a receive given up
//! while registered; and of async loads beside other callers of their
//! key: a cancelled loader handing over, a waker registered as a load
//! completes, and an `update` (with a `put` behind it) going first past a
//! load in flight. A lost wake-up is a deadlock report from loom's
//! `block_on`, or a failed assertion on a hand-made waker's flag.
//! See `../README.md` for what each model checks and how long it takes.

use expiremap::broadcast::{RecvError, Sender};
use expiremap_loom_tests::{block_on, model, thread};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::task::{Context, Poll, Wake, Waker};

/// A waker that raises a flag (std atomics: bookkeeping outside the
/// protocol under test; the model reads it only after joining the threads).
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, SeqCst);
    }
}

fn flag() -> (Arc<Flag>, Waker) {
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(Arc::clone(&flag));
    (flag, waker)
}

/// A task sleeps in `recv_async` while another thread publishes. A sender
/// stays alive, so only the publish can wake it.
#[test]
fn publish_races_a_task_going_to_sleep() {
    model(|| {
        let tx = Sender::new(2, 1).unwrap();
        let mut rx = tx.subscribe().unwrap();
        let reader = thread::spawn(move || block_on(rx.recv_async()));
        let writer = {
            let tx = tx.clone();
            thread::spawn(move || tx.send(7u32))
        };
        writer.join().unwrap();
        assert_eq!(reader.join().unwrap(), Ok(7));
        drop(tx);
    });
}

/// The same race, polled by hand once: if the poll returned `Pending`, the
/// publish (finished by the join) must have woken the waker, and the next
/// poll gets the message. Afterwards the ring holds no clone of the waker.
#[test]
fn hand_polled_task_is_woken_by_the_racing_publish() {
    model(|| {
        let tx = Sender::new(2, 1).unwrap();
        let mut rx = tx.subscribe().unwrap();
        let (flag, waker) = flag();
        let reader = thread::spawn(move || {
            let first = rx.poll_recv(&mut Context::from_waker(&waker));
            (first, rx, waker)
        });
        let writer = {
            let tx = tx.clone();
            thread::spawn(move || tx.send(7u32))
        };
        writer.join().unwrap();
        let (first, mut rx, waker) = reader.join().unwrap();
        match first {
            Poll::Ready(r) => assert_eq!(r, Ok(7)),
            Poll::Pending => {
                assert!(flag.0.load(SeqCst), "lost wake-up");
                let again = rx.poll_recv(&mut Context::from_waker(&waker));
                assert_eq!(again, Poll::Ready(Ok(7)));
            }
        }
        assert_eq!(Arc::strong_count(&flag), 2, "the ring kept a waker");
        drop(tx);
    });
}

/// The last sender leaves while a task goes to sleep: it is woken and sees
/// the message, then `Closed`, never hangs.
#[test]
fn close_races_a_task_going_to_sleep() {
    model(|| {
        let tx = Sender::new(2, 1).unwrap();
        let mut rx = tx.subscribe().unwrap();
        let reader = thread::spawn(move || {
            block_on(async {
                let first = rx.recv_async().await;
                (first, rx.recv_async().await)
            })
        });
        tx.send(1u32);
        drop(tx);
        assert_eq!(reader.join().unwrap(), (Ok(1), Err(RecvError::Closed)));
    });
}

/// Reader A polls once and drops its future (registered or not) while a
/// publish runs; reader B sleeps in `recv_async`. B is still woken; A's
/// dropped future left no waker in the ring, and a new receive of A gets
/// the message it had not taken.
#[test]
fn a_future_dropped_while_a_publish_runs() {
    model(|| {
        let tx = Sender::new(2, 2).unwrap();
        let mut a = tx.subscribe().unwrap();
        let mut b = tx.subscribe().unwrap();
        let (flag, waker) = flag();
        let reader_a = thread::spawn(move || {
            let first = {
                let mut recv = pin!(a.recv_async());
                recv.as_mut().poll(&mut Context::from_waker(&waker))
            }; // dropped here, possibly registered
            (first, a)
        });
        let writer = {
            let tx = tx.clone();
            thread::spawn(move || tx.send(1u32))
        };
        assert_eq!(block_on(b.recv_async()), Ok(1));
        writer.join().unwrap();
        let (first, mut a) = reader_a.join().unwrap();
        match first {
            Poll::Ready(r) => assert_eq!(r, Ok(1)),
            Poll::Pending => assert_eq!(block_on(a.recv_async()), Ok(1), "nothing lost"),
        }
        assert_eq!(Arc::strong_count(&flag), 1, "no dangling waker");
        drop(tx);
        assert_eq!(block_on(a.recv_async()), Err(RecvError::Closed));
    });
}

/// Reader A goes to sleep and gives its receive up while reader B goes to
/// sleep, with nothing published yet. Afterwards the ring holds no clone of
/// A's waker, B is still registered (A's give-up must not clear `WAITING`
/// under B), so the publish wakes B and only B; A's new receive gets it.
#[test]
fn a_future_dropped_while_another_goes_to_sleep() {
    model(|| {
        let tx = Sender::new(2, 2).unwrap();
        let mut a = tx.subscribe().unwrap();
        let mut b = tx.subscribe().unwrap();
        let (flag_a, waker_a) = flag();
        let (flag_b, waker_b) = flag();
        let reader_a = thread::spawn(move || {
            {
                let mut recv = pin!(a.recv_async());
                let first = recv.as_mut().poll(&mut Context::from_waker(&waker_a));
                assert!(first.is_pending());
            } // dropped while registered
            a
        });
        let reader_b = thread::spawn(move || {
            let first = b.poll_recv(&mut Context::from_waker(&waker_b));
            assert!(first.is_pending());
            b
        });
        let mut a = reader_a.join().unwrap();
        let mut b = reader_b.join().unwrap();
        assert_eq!(Arc::strong_count(&flag_a), 1, "no dangling waker");
        tx.send(1u32);
        assert!(flag_b.0.load(SeqCst), "B, still asleep, is woken");
        assert!(!flag_a.0.load(SeqCst), "A gave up: not woken");
        assert_eq!(block_on(b.recv_async()), Ok(1));
        assert_eq!(block_on(a.recv_async()), Ok(1), "nothing lost");
    });
}

/// A one-shard map on a manual clock with a fixed hasher, for the async
/// loading models.
fn loading_map() -> Arc<expiremap::ExpireMap<u32, u32, Fixed>> {
    Arc::new(
        expiremap::ExpireMap::builder()
            .hasher(Fixed::default())
            .clock(expiremap::ManualClock::new())
            .shards(1)
            .background_eviction(false)
            .build(),
    )
}

/// A hasher that is the same in every execution of a model.
type Fixed = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);

/// An async loader is polled once (its `init` pending for ever) and then
/// dropped (cancelled) while another thread's async caller of the same key
/// waits or arrives: that caller must load itself (it is woken by the
/// cancellation, or finds the key free), and its value is stored. A lost
/// wake-up is a deadlock in `block_on`.
#[test]
fn a_cancelled_async_loader_hands_over_to_a_waiter() {
    model(|| {
        let map = loading_map();
        let other = {
            let map = map.clone();
            thread::spawn(move || block_on(map.get_or_insert_with_async(1, HOUR, async { 2 })))
        };
        {
            let (flag, waker) = flag();
            let mut load = pin!(map.get_or_insert_with_async(1, HOUR, std::future::pending()));
            let first = load.as_mut().poll(&mut Context::from_waker(&waker));
            // Loading (pending for ever), or waiting for the other's load.
            if first.is_ready() {
                assert_eq!(first, Poll::Ready(2));
            } else if flag.0.load(SeqCst) {
                // Woken: the other's load ended; the next poll has its value.
                assert_eq!(
                    load.as_mut().poll(&mut Context::from_waker(&waker)),
                    Poll::Ready(2)
                );
            }
            // Dropped here: a load of ours, if any, is cancelled.
        }
        assert_eq!(other.join().unwrap(), 2);
        assert_eq!(map.get(&1), Some(2));
    });
}

/// A blocking loader completes while an async caller registers its waker:
/// the async caller is woken (or sees the value at once), and gets the
/// loaded value; `init` runs once.
#[test]
fn a_waker_registered_as_the_load_completes_is_woken() {
    model(|| {
        let map = loading_map();
        let inits = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let loader = {
            let (map, inits) = (map.clone(), inits.clone());
            thread::spawn(move || {
                map.get_or_insert_with(1, HOUR, || {
                    inits.fetch_add(1, SeqCst);
                    5
                })
            })
        };
        let v = block_on(map.get_or_insert_with_async(1, HOUR, async {
            inits.fetch_add(1, SeqCst);
            5
        }));
        assert_eq!((v, loader.join().unwrap()), (5, 5));
        assert_eq!(inits.load(SeqCst), 1);
    });
}

/// An `init` that is pending on its first poll and done on its second,
/// with `value`: polled by hand, it stays in flight until the model lets
/// it finish.
async fn second_poll(value: u32) -> u32 {
    let mut polled = false;
    std::future::poll_fn(|_| {
        if std::mem::replace(&mut polled, true) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    value
}

/// An `update` of a key races an async load of it, polled once by the
/// model's thread, whose `init` can only finish when that thread polls it
/// again after the update returned. The update never waits for the load
/// (it would wait for ever: loom reports the deadlock): it goes first and
/// its value stands; the load returns its own value (not stored), or the
/// update's if it came second.
#[test]
fn an_update_goes_first_past_an_async_load_of_its_key() {
    model(|| {
        let map = loading_map();
        let updater = {
            let map = map.clone();
            thread::spawn(move || {
                map.update(1, |seen| {
                    assert_eq!(seen, None, "nothing stored before");
                    expiremap::Update::Set(2, HOUR)
                })
            })
        };
        let mut cx = Context::from_waker(Waker::noop());
        let mut load = pin!(map.get_or_insert_with_async(1, HOUR, second_poll(1)));
        let first = load.as_mut().poll(&mut cx);
        assert_eq!(updater.join().unwrap(), Some(2));
        let loaded = match first {
            Poll::Ready(v) => v,
            Poll::Pending => match load.as_mut().poll(&mut cx) {
                Poll::Ready(v) => v,
                Poll::Pending => panic!("the update is over and init can finish"),
            },
        };
        assert!(loaded == 1 || loaded == 2, "{loaded}");
        assert_eq!(map.get(&1), Some(2), "the update's value stands");
    });
}

/// A key has an async load in flight (its `init` pending for ever) when an
/// `update` adding one races a `put` of 100: the update registers beside
/// the load, and the put waits for the update (it does not stop at marking
/// the load): it lands before the update's read (101 held) or after its
/// commit (100 held), never in between. The load's value is never stored.
#[test]
fn a_put_waits_for_an_update_running_beside_a_load() {
    model(|| {
        let map = loading_map();
        let mut cx = Context::from_waker(Waker::noop());
        let mut load = pin!(map.get_or_insert_with_async(1, HOUR, std::future::pending()));
        assert!(load.as_mut().poll(&mut cx).is_pending(), "loading");
        let updater = {
            let map = map.clone();
            thread::spawn(move || {
                map.update(1, |seen| {
                    expiremap::Update::Set(seen.map_or(0, |(v, _)| *v) + 1, HOUR)
                })
            })
        };
        map.put(1, 100, HOUR);
        let updated = updater.join().unwrap();
        let held = map.get(&1);
        assert!(
            (updated, held) == (Some(101), Some(101)) || (updated, held) == (Some(1), Some(100)),
            "{updated:?} {held:?}"
        );
    });
}

//! The async loaders: one flight per key shared with blocking callers, no
//! thread parked for an async caller, cancellation handing the load over,
//! writes during a load winning, failing loads shared, panicking `init`s.
//! On tokio's multi-thread and current-thread runtimes and on a
//! hand-written executor.

use crate::common::{panic_message, within};
use expiremap::ExpireMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

const MINUTE: Duration = Duration::from_secs(60);

type Map = Arc<ExpireMap<u32, u32>>;

fn map() -> Map {
    Arc::new(ExpireMap::new())
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap()
}

/// 100 tasks of one cold key on a current-thread runtime: one `init`
/// (which yields to the runtime while it loads), everyone gets its value.
#[test]
fn a_hundred_tasks_of_one_key_on_a_current_thread_runtime() {
    for rt in [current_thread(), multi_thread()] {
        let (map, inits) = (map(), Arc::new(AtomicU32::new(0)));
        let values = rt.block_on(async {
            let tasks: Vec<_> = (0..100)
                .map(|_| {
                    let (map, inits) = (map.clone(), inits.clone());
                    tokio::spawn(async move {
                        map.get_or_insert_with_async(1, MINUTE, async {
                            inits.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            7
                        })
                        .await
                    })
                })
                .collect();
            let mut values = Vec::new();
            for t in tasks {
                values.push(t.await.unwrap());
            }
            values
        });
        assert!(values.iter().all(|&v| v == 7));
        assert_eq!(inits.load(Ordering::SeqCst), 1);
        assert_eq!(map.get(&1), Some(7));
    }
}

/// A blocking caller and async callers of one key share one flight,
/// whichever comes first.
#[test]
fn blocking_and_async_callers_share_one_flight() {
    let rt = multi_thread();
    for blocking_first in [true, false] {
        let (map, inits) = (map(), Arc::new(AtomicU32::new(0)));
        // Met by the first loader's `init` and by whoever goes second.
        let started = Arc::new(Barrier::new(2));
        let blocking = {
            let (map, inits, started) = (map.clone(), inits.clone(), started.clone());
            std::thread::spawn(move || {
                if !blocking_first {
                    started.wait(); // the async load is running
                }
                map.get_or_insert_with(1, MINUTE, || {
                    inits.fetch_add(1, Ordering::SeqCst);
                    if blocking_first {
                        started.wait();
                    }
                    std::thread::sleep(Duration::from_millis(30));
                    1
                })
            })
        };
        if blocking_first {
            started.wait(); // the blocking load is running
        }
        let async_values = rt.block_on(async {
            let tasks: Vec<_> = (0..8)
                .map(|_| {
                    let (map, inits, started) = (map.clone(), inits.clone(), started.clone());
                    tokio::spawn(async move {
                        map.get_or_insert_with_async(1, MINUTE, async move {
                            inits.fetch_add(1, Ordering::SeqCst);
                            if !blocking_first {
                                tokio::task::spawn_blocking(move || started.wait())
                                    .await
                                    .unwrap();
                            }
                            tokio::time::sleep(Duration::from_millis(30)).await;
                            2
                        })
                        .await
                    })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        });
        let b = blocking.join().unwrap();
        assert_eq!(inits.load(Ordering::SeqCst), 1, "one flight");
        let want = if blocking_first { 1 } else { 2 };
        assert_eq!(b, want);
        assert!(async_values.iter().all(|&v| v == want), "{async_values:?}");
    }
}

/// Dropping the loading future hands the load over: the waiter loads,
/// and nothing of the cancelled `init` is stored.
#[test]
fn a_cancelled_load_hands_over_to_a_waiter() {
    for rt in [current_thread(), multi_thread()] {
        let (map, inits) = (map(), Arc::new(AtomicU32::new(0)));
        let (v, stored) = rt.block_on(async {
            let loading = {
                let (map, inits) = (map.clone(), inits.clone());
                tokio::spawn(async move {
                    let load = map.get_or_insert_with_async(1, MINUTE, async {
                        inits.fetch_add(1, Ordering::SeqCst);
                        std::future::pending::<u32>().await
                    });
                    tokio::time::timeout(Duration::from_millis(50), load).await
                })
            };
            tokio::time::sleep(Duration::from_millis(10)).await; // loading
            let waiter = {
                let (map, inits) = (map.clone(), inits.clone());
                tokio::spawn(async move {
                    map.get_or_insert_with_async(1, MINUTE, async {
                        inits.fetch_add(1, Ordering::SeqCst);
                        5
                    })
                    .await
                })
            };
            assert!(loading.await.unwrap().is_err(), "timed out");
            (waiter.await.unwrap(), map.get(&1))
        });
        assert_eq!((v, stored), (5, Some(5)));
        assert_eq!(inits.load(Ordering::SeqCst), 2, "the waiter loaded");
    }
}

/// A write of the key during an async load wins; a zero TTL stores nothing.
#[test]
fn a_write_during_an_async_load_wins() {
    let rt = current_thread();
    let map = map();
    let v = rt.block_on(map.get_or_insert_with_async(1, MINUTE, async {
        map.put(1, 100, MINUTE);
        1
    }));
    assert_eq!((v, map.get(&1)), (1, Some(100)));
    let v = rt.block_on(map.get_or_insert_with_async(2, Duration::ZERO, async { 2 }));
    assert_eq!((v, map.get(&2)), (2, None));
}

/// 16 callers of a failing key, blocking and async: one `init`, every
/// caller gets its error. A caller with another error type loads itself.
#[test]
fn a_failing_load_is_shared_with_its_waiters() {
    // Blocking: the loader fails once all 16 are in.
    let (map, inits) = (map(), Arc::new(AtomicU32::new(0)));
    let gate = Arc::new(Barrier::new(16));
    let callers: Vec<_> = (0..16)
        .map(|_| {
            let (map, inits, gate) = (map.clone(), inits.clone(), gate.clone());
            std::thread::spawn(move || {
                gate.wait();
                map.try_get_or_insert_with(1, MINUTE, || {
                    inits.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100)); // all wait
                    Err::<u32, String>("down".to_string())
                })
            })
        })
        .collect();
    for c in callers {
        assert_eq!(c.join().unwrap(), Err("down".to_string()));
    }
    assert_eq!(inits.load(Ordering::SeqCst), 1, "one init for 16 callers");
    assert_eq!(map.get(&1), None);

    // Async, with one waiter of another error type, which loads itself.
    let rt = multi_thread();
    let inits = Arc::new(AtomicU32::new(0));
    let (same, other) = rt.block_on(async {
        let loader = {
            let (map, inits) = (map.clone(), inits.clone());
            tokio::spawn(async move {
                map.try_get_or_insert_with_async(2, MINUTE, async {
                    inits.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Err::<u32, &str>("down")
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let same: Vec<_> = (0..8)
            .map(|_| {
                let map = map.clone();
                tokio::spawn(async move {
                    map.try_get_or_insert_with_async(2, MINUTE, async { Ok::<u32, &str>(9) })
                        .await
                })
            })
            .collect();
        let other = {
            let map = map.clone();
            tokio::spawn(async move {
                map.try_get_or_insert_with_async(2, MINUTE, async { Ok::<u32, u8>(3) })
                    .await
            })
        };
        assert_eq!(loader.await.unwrap(), Err("down"));
        let mut out = Vec::new();
        for t in same {
            out.push(t.await.unwrap());
        }
        (out, other.await.unwrap())
    });
    assert!(same.iter().all(|r| *r == Err("down")), "{same:?}");
    assert_eq!(other, Ok(3), "another error type loads itself");
    assert_eq!(inits.load(Ordering::SeqCst), 1);
}

/// A panicking async `init`: its caller sees the panic, a waiter loads.
#[test]
fn a_panicking_async_init_hands_over_to_a_waiter() {
    let rt = multi_thread();
    let map = map();
    let (first, second) = rt.block_on(async {
        let first = {
            let map = map.clone();
            tokio::spawn(async move {
                map.get_or_insert_with_async(1, MINUTE, async {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    panic!("init failed")
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let second = {
            let map = map.clone();
            tokio::spawn(async move { map.get_or_insert_with_async(1, MINUTE, async { 4 }).await })
        };
        (first.await, second.await.unwrap())
    });
    let p = first.unwrap_err().into_panic();
    assert_eq!(panic_message(&*p), "init failed");
    assert_eq!((second, map.get(&1)), (4, Some(4)));
}

/// A hand-written executor: a thread that parks until woken. A blocking
/// loader on another thread; the async waiter's thread parks in the
/// executor (not in the map) and is woken by the load's end.
#[test]
fn a_hand_written_executor_is_woken_by_the_load() {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    fn block_on<F: Future>(f: F) -> F::Output {
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut f = Box::pin(f);
        loop {
            if let Poll::Ready(v) = Pin::as_mut(&mut f).poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    }
    let r = within(60, || {
        let map = map();
        let loading = Arc::new(Barrier::new(2));
        let loader = {
            let (map, loading) = (map.clone(), loading.clone());
            std::thread::spawn(move || {
                map.get_or_insert_with(1, MINUTE, || {
                    loading.wait();
                    std::thread::sleep(Duration::from_millis(30));
                    11
                })
            })
        };
        loading.wait();
        let v = block_on(map.get_or_insert_with_async(1, MINUTE, async { 0 }));
        (v, loader.join().unwrap())
    });
    assert_eq!(r.unwrap(), (11, 11));
}

/// Runs `f`, which must panic, naming a wait for itself, within 60 s (a
/// hang fails the test instead of hanging it).
fn panics_waiting_for_itself(f: impl FnOnce() + Send + 'static) {
    let p = within(60, f).expect_err("asked for its own key: a panic");
    let msg = panic_message(&*p);
    assert!(msg.contains("its own key"), "{msg}");
}

/// An async load whose `init` awaits a load of its own key panics (it
/// would wait for itself; no thread runs an async load, so this is told
/// by the thread polling the `init`), and the key loads afterwards.
#[test]
fn an_async_init_awaiting_its_own_key_panics() {
    let m = map();
    let m2 = m.clone();
    panics_waiting_for_itself(move || {
        current_thread().block_on(m2.get_or_insert_with_async(1, MINUTE, async {
            m2.get_or_insert_with_async(1, MINUTE, async { 2 }).await
        }));
    });
    let m3 = m.clone();
    let v = within(60, move || {
        current_thread().block_on(m3.get_with_async(1, async { 3 }))
    });
    assert_eq!(v.expect("no hang"), 3);
}

/// The same with a blocking loader of its own key inside the `init`'s
/// future, and with the map's expiry policy asking for the key while the
/// async load's value is stored.
#[test]
fn an_async_load_asking_for_its_own_key_from_blocking_code_panics() {
    let m = map();
    let m2 = m.clone();
    panics_waiting_for_itself(move || {
        current_thread().block_on(
            m2.get_or_insert_with_async(1, MINUTE, async {
                m2.get_or_insert_with(1, MINUTE, || 2)
            }),
        );
    });

    struct AsksTheMap(Arc<std::sync::OnceLock<ExpireMap<u32, u32>>>);
    impl expiremap::Expiry<u32, u32> for AsksTheMap {
        fn expire_after_create(&self, key: &u32, _: &u32) -> Option<Duration> {
            let map = self.0.get().expect("set");
            Some(Duration::from_secs(u64::from(map.get_with(*key, || 7))))
        }
    }
    let cell = Arc::new(std::sync::OnceLock::new());
    let policed: ExpireMap<u32, u32> = ExpireMap::builder()
        .background_eviction(false)
        .expire_after(AsksTheMap(cell.clone()))
        .build();
    assert!(cell.set(policed.clone()).is_ok(), "set once");
    let p2 = policed.clone();
    panics_waiting_for_itself(move || {
        current_thread().block_on(p2.get_with_async(1, async { 2 }));
    });
    // Nothing was stored. (The policy's handle keeps this map alive; it
    // has no eviction thread to leave behind.)
    assert_eq!(policed.get(&1), None);
}

/// Two async loads of one key joined in one task are no wait for itself:
/// the second waits for the first, which completes; one `init` runs.
#[test]
fn two_async_loads_of_one_key_joined_in_one_task_share_the_load() {
    let m = map();
    let runs = AtomicU32::new(0);
    let (a, b) = current_thread().block_on(async {
        tokio::join!(
            m.get_or_insert_with_async(1, MINUTE, async {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                10
            }),
            m.get_or_insert_with_async(1, MINUTE, async {
                runs.fetch_add(1, Ordering::SeqCst);
                20
            }),
        )
    });
    assert_eq!((a, b), (10, 10));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The same for an async bulk load whose `load` future asks for one of
/// the keys it loads.
#[test]
fn an_async_bulk_load_asking_for_one_of_its_keys_panics() {
    let m = map();
    panics_waiting_for_itself(move || {
        let inner = m.clone();
        current_thread().block_on(m.get_many_with_async(&[1, 2], MINUTE, move |ks| {
            let ks = ks.to_vec();
            async move {
                let v = inner.get_with_async(2, async { 0 }).await;
                ks.iter().map(|&k| (k, v)).collect()
            }
        }));
    });
}

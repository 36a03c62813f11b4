//! What broke: `update` parked its thread while a load of the same key ran
//! (it waited for any flight of its key). With an async load on a
//! current-thread tokio runtime that was a deadlock: the load's task could
//! never run again to finish. On a multi-thread runtime it blocked a
//! worker for the whole load, and beside a blocking load it waited out the
//! loader's `init`. Fixed: an update is a write of its key, and loads lose
//! to writes: it marks the load touched (its value is then returned to its
//! callers, not stored) and goes on without waiting. A write waits only for
//! an update of its key in flight, whose `f` runs on a thread.

use crate::common::within;
use expiremap::{ExpireMap, Update};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Duration;

const MINUTE: Duration = Duration::from_secs(60);

/// An async load of key 1 waits for a message that only the task calling
/// `update` sends, after the update returns, on a current-thread runtime.
#[test]
fn an_update_beside_an_async_load_completes_on_a_current_thread_runtime() {
    let outcome = within(60, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let map = Arc::new(ExpireMap::<u32, u32>::new());
            let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
            let loading = Arc::new(AtomicBool::new(false));
            let load = tokio::spawn({
                let (map, loading) = (map.clone(), loading.clone());
                async move {
                    let init = async move {
                        loading.store(true, Ordering::SeqCst);
                        rx.await.unwrap()
                    };
                    map.get_or_insert_with_async(1, MINUTE, init).await
                }
            });
            while !loading.load(Ordering::SeqCst) {
                tokio::task::yield_now().await;
            }
            let updated = map.update(1, |seen| {
                assert_eq!(seen, None, "the load stored nothing yet");
                Update::Set(2, MINUTE)
            });
            tx.send(1).unwrap();
            let loaded = load.await.unwrap();
            (updated, loaded, map.get(&1))
        })
    })
    .expect("no panic");
    // The load's callers get its value; the update's stands.
    assert_eq!(outcome, (Some(2), 1, Some(2)));
}

/// A blocking load of key 1 whose `init` waits until the update returned.
#[test]
fn an_update_does_not_wait_out_a_blocking_load() {
    let outcome = within(60, || {
        let map = Arc::new(ExpireMap::<u32, u32>::new());
        let (loading_tx, loading) = mpsc::channel();
        let (go, go_rx) = mpsc::channel::<()>();
        let loader = {
            let map = map.clone();
            thread::spawn(move || {
                map.get_or_insert_with(1, MINUTE, || {
                    loading_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    1
                })
            })
        };
        loading.recv().unwrap();
        let updated = map.update(1, |_| Update::Set(2, MINUTE));
        go.send(()).unwrap();
        (updated, loader.join().unwrap(), map.get(&1))
    })
    .expect("no panic");
    assert_eq!(outcome, (Some(2), 1, Some(2)));
}

/// A load's `init` that updates its own key: the update goes first (it
/// used to wait for the load, that is for itself, and panic), and the
/// loaded value is returned, not stored.
#[test]
fn an_init_that_updates_its_own_key_lets_the_update_stand() {
    let map = ExpireMap::<u32, u32>::new();
    let loaded = map.get_or_insert_with(1, MINUTE, || {
        assert_eq!(map.update(1, |_| Update::Set(2, MINUTE)), Some(2));
        1
    });
    assert_eq!((loaded, map.get(&1)), (1, Some(2)));
}

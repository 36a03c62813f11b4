//! The async API (`get_async`, `put_async`, `remove_async`,
//! `get_or_insert_with_async`, `try_get_or_insert_with_async`) on tokio's
//! multi-thread and current-thread runtimes, with a stalled server that
//! must not block the other tasks.

use crate::common::{PATIENCE, Server};
use expiremap_redis::{Error, NearCache};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

fn cache(s: &Server, prefix: &str) -> NearCache<String, u64> {
    NearCache::builder(s.url())
        .prefix(prefix)
        .staleness_bound(HOUR)
        .call_timeout(Duration::from_secs(1))
        .build()
        .expect("connect")
}

/// Polls `f` once with a waker that does nothing.
fn poll_once<F: Future>(f: F) -> Poll<F::Output> {
    let mut f = pin!(f);
    f.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_remove_on_multi_thread_and_a_near_hit_is_ready_at_once() {
    let s = Server::start();
    let a = cache(&s, "as:");
    let k = "k".to_string();
    a.put_async(k.clone(), 1, HOUR).await.unwrap();
    // A near hit needs no reply: ready on the first poll.
    assert!(matches!(
        poll_once(a.get_async(&k)),
        Poll::Ready(Ok(Some(1)))
    ));
    assert_eq!(a.remove_async(&k).await.unwrap(), Some(1));
    assert_eq!(a.get_async(&k).await.unwrap(), None);
    assert_eq!(a.peek_near(&k), None);

    // A write by another cache reaches this one's near copy.
    let b = cache(&s, "as:");
    b.put_async(k.clone(), 2, HOUR).await.unwrap();
    assert_eq!(a.get_async(&k).await.unwrap(), Some(2));
    b.put_async(k.clone(), 3, HOUR).await.unwrap();
    let t0 = std::time::Instant::now();
    while a.peek_near(&k).is_some() {
        assert!(t0.elapsed() < PATIENCE, "no invalidation");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(a.get_async(&k).await.unwrap(), Some(3));

    // Many tasks at once, each awaiting its own reply.
    let a = Arc::new(a);
    let tasks: Vec<_> = (0..64u64)
        .map(|i| {
            let a = Arc::clone(&a);
            tokio::spawn(async move {
                let k = format!("t{i}");
                a.put_async(k.clone(), i, HOUR).await.unwrap();
                a.remove_async(&k).await.unwrap()
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap(), Some(i as u64));
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_stalled_server_does_not_block_the_other_tasks_on_current_thread() {
    let s = Server::start();
    let a = cache(&s, "st:");
    let hot = "hot".to_string();
    a.put_async(hot.clone(), 7, HOUR).await.unwrap();

    s.signal("-STOP");
    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = {
        let ticks = Arc::clone(&ticks);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // The miss waits for a reply that does not come: the runtime's one
    // thread goes on running the ticker meanwhile, and the call ends with
    // a timeout after the call timeout (1 s).
    let before = ticks.load(Ordering::Relaxed);
    let e = a.get_async(&"cold".to_string()).await.unwrap_err();
    assert!(e.is_timeout(), "{e}");
    assert!(
        ticks.load(Ordering::Relaxed) > before,
        "the ticker never ran while the get waited"
    );
    // The near copy stays served (the staleness bound here is an hour).
    assert_eq!(a.get_async(&hot).await.unwrap(), Some(7));

    // A call made while stalled gets its reply once the server resumes.
    let waiting = {
        let k = "cold".to_string();
        let put = a.put_async(k.clone(), 9, HOUR);
        let resume = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            s.signal("-CONT");
        };
        let (r, ()) = tokio::join!(put, resume);
        r
    };
    waiting.unwrap();
    assert_eq!(a.get_async(&"cold".to_string()).await.unwrap(), Some(9));
    ticker.abort();
}

#[tokio::test(flavor = "current_thread")]
async fn a_killed_server_fails_awaited_calls() {
    let mut s = Server::start();
    let a = cache(&s, "kd:");
    s.kill();
    let k = "k".to_string();
    let t0 = std::time::Instant::now();
    loop {
        match a.get_async(&k).await {
            Err(e) if e.is_connection() => break,
            r => {
                assert!(t0.elapsed() < PATIENCE, "no connection error: {r:?}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    s.restart();
    let t0 = std::time::Instant::now();
    while a.put_async(k.clone(), 1, HOUR).await.is_err() {
        assert!(t0.elapsed() < PATIENCE, "no recovery");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(a.get_async(&k).await.unwrap(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_or_insert_with_async_runs_one_init_per_key() {
    let s = Server::start();
    let a = Arc::new(cache(&s, "gi:"));
    let runs = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (a, runs) = (Arc::clone(&a), Arc::clone(&runs));
            tokio::spawn(async move {
                a.get_or_insert_with_async("k".to_string(), HOUR, async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    42
                })
                .await
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), 42);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Stored in Redis: another cache reads it.
    let b = cache(&s, "gi:");
    assert_eq!(b.get_async(&"k".to_string()).await.unwrap(), Some(42));
    // A value in Redis is returned without running init.
    let v = a
        .get_or_insert_with_async("k".to_string(), HOUR, async { unreachable!() })
        .await
        .unwrap();
    assert_eq!(v, 42);
}

#[derive(Clone, Debug, PartialEq)]
enum AppError {
    Cache(String),
    Backend,
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Cache(e.to_string())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn try_get_or_insert_with_async_shares_the_error_and_stores_nothing() {
    let s = Server::start();
    let a = cache(&s, "te:");
    let runs = AtomicU64::new(0);
    let load = || {
        a.try_get_or_insert_with_async("k".to_string(), HOUR, async {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            Err::<u64, _>(AppError::Backend)
        })
    };
    let (r1, r2, r3) = tokio::join!(load(), load(), load());
    for r in [r1, r2, r3] {
        assert_eq!(r, Err(AppError::Backend));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(a.get_async(&"k".to_string()).await.unwrap(), None);
}

#[tokio::test(flavor = "current_thread")]
async fn a_dropped_leader_hands_the_load_to_a_waiter() {
    let s = Server::start();
    let a = cache(&s, "dl:");
    let k = "k".to_string();
    // The leader's init never ends; the leader is dropped after 50 ms.
    let leader = tokio::time::timeout(
        Duration::from_millis(50),
        a.get_or_insert_with_async(k.clone(), HOUR, std::future::pending()),
    );
    let waiter = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        a.get_or_insert_with_async(k.clone(), HOUR, async { 5 })
            .await
    };
    let (l, w) = tokio::join!(leader, waiter);
    assert_eq!(w.unwrap(), 5);
    // The leader timed out (or, on a machine so slow that the waiter led
    // first, read the waiter's value).
    assert!(matches!(l, Err(_) | Ok(Ok(5))), "{l:?}");
    // Stored in Redis, and near.
    assert_eq!(a.get_async(&k).await.unwrap(), Some(5));
    assert_eq!(a.peek_near(&k), Some(5));
}

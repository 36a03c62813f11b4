//! Edges: lease takes cut short (a call timeout, a dropped future; both
//! once left the lease held for its TTL), a loader that panics or
//! re-enters, a stalled server under a large write, TTL and timeout edges
//! (a `call_timeout` of `Duration::MAX` once panicked every call), and keys
//! whose bytes are hostile to lease names, a stalled server under a large
//! write (which once blocked the caller's thread under the link's mutex)
//! and under near reads. No timing is asserted: deadlines only bound
//! hangs.

use crate::common::{Server, eventually, within};
use expiremap_redis::{Error, NearCache};
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

type Cache = NearCache<String, u64>;

fn leased(s: &Server, prefix: &str, call_timeout: Duration) -> Cache {
    NearCache::builder(s.url())
        .prefix(prefix)
        .staleness_bound(HOUR)
        .lease_ttl(HOUR)
        .call_timeout(call_timeout)
        .build()
        .expect("connect")
}

/// `INFO clients`'s `blocked_clients` (a client held by `CLIENT PAUSE`
/// counts).
fn blocked_clients(raw: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("clients").query(raw).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .map_or(0, |n| n.trim().parse().unwrap())
}

fn pause_writes(raw: &mut redis::Connection) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(120_000)
        .arg("WRITE")
        .query(raw)
        .unwrap();
}

fn unpause(raw: &mut redis::Connection) {
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(raw).unwrap();
}

/// The keys under `prefix` in Redis that hold a lease (a hash, until the
/// load stores its value over it).
fn leases(raw: &mut redis::Connection, prefix: &str) -> Vec<Vec<u8>> {
    let names: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(raw)
        .unwrap();
    names
        .into_iter()
        .filter(|n| {
            let t: String = redis::cmd("TYPE").arg(n).query(raw).unwrap();
            t == "hash"
        })
        .collect()
}

/// Another process loads `k` with `value`: within PATIENCE, as no lease
/// is held by anyone alive (the lease TTL is an hour).
fn other_process_loads(s: &Server, prefix: &str, value: u64) -> u64 {
    let b = leased(s, prefix, HOUR);
    within("another process loads the key", move || {
        b.get_or_insert_with("k".to_string(), HOUR, || value)
            .unwrap()
    })
}

// Pins: a get_or_insert_with whose lease take times out (a failover's write
// pause) does not leave its lease held for the lease TTL.
#[test]
fn a_lease_take_that_times_out_gives_the_lease_back() {
    let s = Server::start();
    let a = Arc::new(leased(&s, "lto:", Duration::from_millis(300)));
    let mut raw = s.raw();
    pause_writes(&mut raw);
    // The miss's read is EVAL_RO (answered in the pause); the lease take is
    // a script that may write: held by the pause until the call times out.
    let a2 = Arc::clone(&a);
    let r = within("the load's call timeout", move || {
        a2.get_or_insert_with("k".to_string(), HOUR, || 1)
    });
    let e = r.unwrap_err();
    assert!(e.is_timeout(), "{e}");
    assert!(
        blocked_clients(&mut raw) >= 1,
        "the lease take was not held"
    );
    unpause(&mut raw);
    // A round trip after the lease take on A's connection: it has run.
    assert_eq!(a.get(&"other".to_string()).unwrap(), None);
    // The failed call gave its lease back (a release sent after the take,
    // on the same link): another process loads at once, not after the
    // lease TTL (an hour).
    assert_eq!(other_process_loads(&s, "lto:", 2), 2);
    assert!(leases(&mut raw, "lto:").is_empty());
}

// Pins: a get_or_insert_with_async future dropped while its lease take is in
// flight gives the lease back (the docs: "whose future is dropped, gives
// the lease back").
#[test]
fn a_future_dropped_while_its_lease_take_is_in_flight_gives_the_lease_back() {
    let s = Server::start();
    let a = leased(&s, "ldr:", HOUR);
    let mut raw = s.raw();
    pause_writes(&mut raw);
    {
        let mut fut = pin!(a.get_or_insert_with_async("k".to_string(), HOUR, async { 1 }));
        let mut cx = Context::from_waker(Waker::noop());
        // Poll until the lease take is sent and held by the pause (the
        // read before it is answered: EVAL_RO).
        eventually("the lease take is held by the pause", || {
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            (blocked_clients(&mut raw) >= 1).then_some(())
        });
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        // Dropped here, as by a `tokio::time::timeout` or a cancelled task.
    }
    unpause(&mut raw);
    assert_eq!(a.get(&"other".to_string()).unwrap(), None);
    assert_eq!(other_process_loads(&s, "ldr:", 2), 2);
}

// Pins: a get_or_insert_with whose init panics gives its lease back at once (another process loads without waiting the lease TTL) and the cache lives on.
#[test]
fn a_panicking_loader_gives_its_lease_back() {
    let s = Server::start();
    let a = Arc::new(leased(&s, "lp:", HOUR));
    let a2 = Arc::clone(&a);
    let r = within("a panicking load", move || {
        catch_unwind(AssertUnwindSafe(|| {
            a2.get_or_insert_with("k".to_string(), HOUR, || panic!("the loader panics"))
        }))
    });
    assert!(r.is_err(), "the loader's panic reaches its caller");
    assert_eq!(other_process_loads(&s, "lp:", 2), 2);
    // The panicking process reads the other's value and loads again fine.
    assert_eq!(a.get(&"k".to_string()).unwrap(), Some(2));
    assert_eq!(
        a.get_or_insert_with("j".to_string(), HOUR, || 3).unwrap(),
        3
    );
    let mut raw = s.raw();
    eventually("no lease left", || {
        leases(&mut raw, "lp:").is_empty().then_some(())
    });
}

// Pins: an async loader whose init panics gives its lease back too.
#[test]
fn a_panicking_async_loader_gives_its_lease_back() {
    let s = Server::start();
    let a = Arc::new(leased(&s, "lpa:", HOUR));
    let a2 = Arc::clone(&a);
    let r = within("a panicking async load", move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let a3 = Arc::clone(&a2);
        rt.block_on(async move {
            tokio::spawn(async move {
                a3.get_or_insert_with_async("k".to_string(), HOUR, async {
                    panic!("the async loader panics")
                })
                .await
            })
            .await
        })
    });
    assert!(r.is_err_and(|e| e.is_panic()));
    assert_eq!(other_process_loads(&s, "lpa:", 2), 2);
    assert_eq!(a.get(&"k".to_string()).unwrap(), Some(2));
}

// Pins: a loader that asks the cache for its own key panics (as documented) rather than waiting for itself, and its lease is given back.
#[test]
fn a_loader_that_reenters_its_own_key_panics_and_gives_its_lease_back() {
    let s = Server::start();
    let a = Arc::new(leased(&s, "lre:", HOUR));
    let a2 = Arc::clone(&a);
    let r = within("a re-entrant load", move || {
        let inner = Arc::clone(&a2);
        catch_unwind(AssertUnwindSafe(|| {
            a2.get_or_insert_with("k".to_string(), HOUR, || {
                inner
                    .get_or_insert_with("k".to_string(), HOUR, || 7)
                    .unwrap_or(8)
            })
        }))
    });
    assert!(r.is_err(), "the re-entrant load returned {r:?}");
    assert_eq!(other_process_loads(&s, "lre:", 2), 2);
}

// Pins: an async put of a value larger than the socket buffers, to a stalled server, must not block the executor thread (the docs: a stalled server holds up only the tasks that wait on it).
#[test]
fn a_large_put_async_to_a_stalled_server_does_not_block_the_executor() {
    let s = Server::start();
    let c: Arc<NearCache<String, Vec<u8>>> = Arc::new(
        NearCache::builder(s.url())
            .prefix("big:")
            .staleness_bound(HOUR)
            .call_timeout(HOUR)
            .build()
            .unwrap(),
    );
    c.put("near".to_string(), vec![1], HOUR).unwrap();
    s.signal("-STOP");
    let c2 = Arc::clone(&c);
    let r = within("a near hit beside a large put_async", move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let c3 = Arc::clone(&c2);
            // 64 MiB: far more than the loopback socket buffers hold.
            let _big = tokio::spawn(async move {
                c3.put_async("big".to_string(), vec![7u8; 64 << 20], HOUR)
                    .await
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            c2.get_async(&"near".to_string()).await
        })
    });
    s.signal("-CONT");
    assert_eq!(r.unwrap(), Some(vec![1]));
}

// Pins: a call timeout of Duration::MAX ("no timeout") is refused by build or works; it must not make every call panic.
#[test]
fn a_call_timeout_of_duration_max_does_not_panic_calls() {
    let s = Server::start();
    let built = NearCache::<String, u64>::builder(s.url())
        .prefix("ctm:")
        .call_timeout(Duration::MAX)
        .build();
    let c = match built {
        Err(Error::Config(_)) => return,
        Err(e) => panic!("build: {e}"),
        Ok(c) => Arc::new(c),
    };
    let c2 = Arc::clone(&c);
    let r = within("calls with an unbounded call timeout", move || {
        catch_unwind(AssertUnwindSafe(|| {
            c2.put("k".to_string(), 1, HOUR).unwrap();
            c2.remove(&"k".to_string()).unwrap();
            c2.get(&"k".to_string()).unwrap()
        }))
    });
    assert!(matches!(r, Ok(None)), "a call panicked: {r:?}");
}

// Pins: TTL edges: a sub-millisecond put lands for 1 ms and leaves no near copy; Duration::MAX TTLs (put, load, lease TTL, near cap) are clamped, not errors or panics.
#[test]
fn ttl_edges_sub_millisecond_and_unbounded() {
    let s = Server::start();
    let mut raw = s.raw();
    let c: Cache = NearCache::builder(s.url())
        .prefix("tt:")
        .staleness_bound(HOUR)
        .max_near_ttl(Duration::MAX)
        .lease_ttl(Duration::MAX)
        .build()
        .unwrap();
    let (tiny, huge, plain, loaded) = (
        "tiny".to_string(),
        "huge".to_string(),
        "plain".to_string(),
        "loaded".to_string(),
    );
    c.put(tiny.clone(), 1, Duration::from_nanos(1)).unwrap();
    assert_eq!(
        c.peek_near(&tiny),
        None,
        "a near copy outlives its 1 ns TTL"
    );
    eventually("the 1 ns key expires in Redis", || {
        (c.get(&tiny).unwrap().is_none()).then_some(())
    });
    c.put(huge.clone(), 2, Duration::MAX).unwrap();
    assert_eq!(c.peek_near(&huge), Some(2));
    assert_eq!(c.get(&huge).unwrap(), Some(2));
    let pttl: i64 = redis::cmd("PTTL")
        .arg(b"tt:\x04huge".as_slice())
        .query(&mut raw)
        .unwrap();
    assert!(pttl > 1 << 40, "PTTL {pttl}");
    assert_eq!(
        c.get_or_insert_with(loaded.clone(), Duration::MAX, || 3)
            .unwrap(),
        3
    );
    assert_eq!(c.peek_near(&loaded), Some(3));
    // A key without a Redis TTL, kept near for the (unbounded) cap, and
    // still invalidated by another client's write.
    let _: () = redis::cmd("SET")
        .arg(b"tt:\x05plain".as_slice())
        .arg(b"\x04".as_slice())
        .query(&mut raw)
        .unwrap();
    assert_eq!(c.get(&plain).unwrap(), Some(4));
    assert_eq!(c.peek_near(&plain), Some(4));
    assert!(c.near_ttl(&plain).is_some_and(|t| t > HOUR));
    let _: () = redis::cmd("SET")
        .arg(b"tt:\x05plain".as_slice())
        .arg(b"\x05".as_slice())
        .query(&mut raw)
        .unwrap();
    eventually("the copy invalidated", || {
        c.peek_near(&plain).is_none().then_some(())
    });
    assert_eq!(c.get(&plain).unwrap(), Some(5));
}

/// Keys whose bytes are hostile to lease names and hash tags: braces
/// (which the lease and staging names must keep in the key's slot),
/// protocol bytes, NUL, and a long key.
fn hostile_keys() -> Vec<String> {
    vec![
        "{".into(),
        "}".into(),
        "}{".into(),
        "{}".into(),
        "{}x{y}".into(),
        "a{b}c".into(),
        "x:lease".into(),
        "\r\n*1\r\n$4\r\nPING\r\n".into(),
        "\0\0".into(),
        "é{ü".into(),
        format!("{{{}", "z".repeat(4096)),
    ]
}

// Pins: hostile key bytes (braces, CRLF, NUL, a ":lease" suffix, long) through put/get/remove, fleet-wide loading and another process's invalidation, under a prefix with an unclosed brace.
#[test]
fn hostile_keys_and_a_braced_prefix_load_invalidate_and_void_leases() {
    let s = Server::start();
    for prefix in ["hk:", "hk{"] {
        let a = Arc::new(leased(&s, prefix, HOUR));
        let b = leased(&s, prefix, HOUR);
        let loads = Arc::new(AtomicU64::new(0));
        for (i, k) in hostile_keys().into_iter().enumerate() {
            let i = i as u64;
            let n = Arc::clone(&loads);
            assert_eq!(
                a.get_or_insert_with(k.clone(), HOUR, || {
                    n.fetch_add(1, Ordering::SeqCst);
                    i
                })
                .unwrap(),
                i
            );
            assert_eq!(b.get(&k).unwrap(), Some(i), "{prefix} {k:?}");
            assert_eq!(b.get_or_insert_with(k.clone(), HOUR, || 1000).unwrap(), i);
            a.put(k.clone(), i + 100, HOUR).unwrap();
            eventually("b's copy invalidated", || {
                (b.peek_near(&k) != Some(i)).then_some(())
            });
            assert_eq!(b.get(&k).unwrap(), Some(i + 100));
            // A slow load racing a remove never lands.
            assert_eq!(b.remove(&k).unwrap(), Some(i + 100));
            eventually("a's copy invalidated", || {
                a.peek_near(&k).is_none().then_some(())
            });
            let (started_tx, started) = std::sync::mpsc::channel();
            let (go, go_rx) = std::sync::mpsc::channel::<()>();
            let (a2, k2) = (Arc::clone(&a), k.clone());
            let loader = thread::spawn(move || {
                a2.get_or_insert_with(k2, HOUR, || {
                    started_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    i + 200
                })
                .unwrap()
            });
            within("the load starts", move || started.recv().unwrap());
            assert_eq!(b.remove(&k).unwrap(), None);
            go.send(()).unwrap();
            assert_eq!(loader.join().unwrap(), i + 200);
            assert_eq!(
                b.get(&k).unwrap(),
                None,
                "{prefix} {k:?}: stale load landed"
            );
            assert_eq!(a.get(&k).unwrap(), None);
        }
        assert_eq!(loads.load(Ordering::SeqCst), hostile_keys().len() as u64);
        let mut raw = s.raw();
        assert!(leases(&mut raw, prefix).is_empty(), "{prefix}");
        drop(a);
    }
}

/// How many `EVAL`s (lease takes, stores' stages, releases, removes) the
/// server has run.
fn evals(raw: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(raw).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_eval:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

// Pins: an async waiter and a blocking holder in the same process (separate single flights): the holder's failed load wakes the waiter (its RELEASE is echoed to its own connection), which loads without waiting the lease TTL.
#[test]
fn an_async_waiter_on_a_blocking_holder_of_its_own_process_takes_over_a_failed_load() {
    let s = Server::start();
    let mut raw = s.raw();
    let a = Arc::new(leased(&s, "sp:", HOUR));
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let a2 = Arc::clone(&a);
    let holder = thread::spawn(move || {
        a2.try_get_or_insert_with("k".to_string(), HOUR, || {
            started_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            Err(Error::Config("the database is down".into()))
        })
    });
    within("the holder takes the lease", move || {
        started.recv().unwrap()
    });
    let before = evals(&mut raw);
    let a3 = Arc::clone(&a);
    let got = within("the async waiter takes over", move || {
        let mut fut = pin!(a3.get_or_insert_with_async("k".to_string(), HOUR, async { 2 }));
        let mut cx = Context::from_waker(Waker::noop());
        // Until its lease take has run (and found the lease held)...
        eventually("the waiter's lease take", || {
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            (evals(&mut raw) > before).then_some(())
        });
        for _ in 0..20 {
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            thread::sleep(Duration::from_millis(2));
        }
        // ...then the holder fails, and the waiter loads.
        go.send(()).unwrap();
        eventually("the waiter's load", || match fut.as_mut().poll(&mut cx) {
            Poll::Ready(r) => Some(r.unwrap()),
            Poll::Pending => None,
        })
    });
    assert!(holder.join().unwrap().is_err());
    assert_eq!(got, 2);
    assert_eq!(a.get(&"k".to_string()).unwrap(), Some(2));
}

// Pins: values with protocol-looking, empty and large bytes round-trip through put, fleet-wide loading, remove and another process's invalidation.
#[test]
fn hostile_values_round_trip_and_invalidate() {
    let s = Server::start();
    let a: NearCache<u32, Vec<u8>> = NearCache::builder(s.url())
        .prefix("hv:")
        .staleness_bound(HOUR)
        .build()
        .unwrap();
    let b: NearCache<u32, Vec<u8>> = NearCache::builder(s.url())
        .prefix("hv:")
        .staleness_bound(HOUR)
        .build()
        .unwrap();
    let values: Vec<Vec<u8>> = vec![
        vec![],
        b"\r\n".to_vec(),
        b"$-1\r\n".to_vec(),
        b"*2\r\n$4\r\nPING\r\n>3\r\n".to_vec(),
        vec![0; 3],
        (0..=255).collect(),
        vec![0xff; 4 << 20],
    ];
    for (i, v) in values.iter().enumerate() {
        let k = i as u32;
        assert_eq!(a.get_or_insert_with(k, HOUR, || v.clone()).unwrap(), *v);
        assert_eq!(b.get(&k).unwrap().as_ref(), Some(v));
        a.put(k, v.iter().rev().copied().collect(), HOUR).unwrap();
        eventually("b's copy invalidated", || {
            (b.peek_near(&k).as_ref() != Some(v) || v.iter().eq(v.iter().rev())).then_some(())
        });
        let rev: Vec<u8> = v.iter().rev().copied().collect();
        assert_eq!(b.get(&k).unwrap(), Some(rev.clone()));
        assert_eq!(b.remove(&k).unwrap(), Some(rev));
        eventually("a's copy invalidated", || {
            a.peek_near(&k).is_none().then_some(())
        });
        assert_eq!(a.get(&k).unwrap(), None);
    }
}

// Pins: a zero-sized value type (encoded as an empty Redis string, which Lua finds truthy) is a value, not a miss, through get, loading and remove.
#[test]
fn a_zero_sized_value_is_a_value_not_a_miss() {
    let s = Server::start();
    let a: NearCache<String, ()> = NearCache::builder(s.url())
        .prefix("zs:")
        .staleness_bound(HOUR)
        .lease_ttl(HOUR)
        .build()
        .unwrap();
    let b: NearCache<String, ()> = NearCache::builder(s.url())
        .prefix("zs:")
        .staleness_bound(HOUR)
        .lease_ttl(HOUR)
        .build()
        .unwrap();
    let k = "k".to_string();
    let loads = AtomicU64::new(0);
    a.get_or_insert_with(k.clone(), HOUR, || {
        loads.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    assert_eq!(b.get(&k).unwrap(), Some(()));
    b.get_or_insert_with(k.clone(), HOUR, || {
        loads.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    assert_eq!(b.remove(&k).unwrap(), Some(()));
    assert_eq!(b.remove(&k).unwrap(), None);
    eventually("a's copy invalidated", || {
        a.peek_near(&k).is_none().then_some(())
    });
    assert_eq!(a.get(&k).unwrap(), None);
}

// Pins: "a call waits at most its call timeout": a put larger than the socket buffers, to a stalled server, must fail with a timeout, even where the connect timeout is longer.
#[test]
fn a_large_put_to_a_stalled_server_times_out_with_the_call_timeout() {
    let s = Server::start();
    let c: Arc<NearCache<String, Vec<u8>>> = Arc::new(
        NearCache::builder(s.url())
            .prefix("bs:")
            .staleness_bound(HOUR)
            .call_timeout(Duration::from_millis(200))
            .connect_timeout(HOUR)
            .build()
            .unwrap(),
    );
    s.signal("-STOP");
    let c2 = Arc::clone(&c);
    // 64 MiB: far more than the loopback socket buffers hold.
    let put = within("a large put to a stalled server", move || {
        c2.put("big".to_string(), vec![7u8; 64 << 20], HOUR)
    });
    s.signal("-CONT");
    let e = put.unwrap_err();
    assert!(e.is_timeout(), "{e}");
}

// Pins: during a stall of the server (SIGSTOP), near reads serve the near
// copy while the staleness bound allows, then fail at once with a timeout
// (they once waited for the server, up to the call timeout: an hour here,
// so a read that waits holds the loop until the server is continued).
// Another key's read, with no near copy, goes to the server and waits.
#[test]
fn near_reads_during_a_stall_serve_within_the_bound_then_fail_fast() {
    let s = Server::start();
    let c: Arc<Cache> = Arc::new(
        NearCache::builder(s.url())
            .prefix("st:")
            .staleness_bound(Duration::from_millis(200))
            .call_timeout(HOUR)
            .build()
            .unwrap(),
    );
    c.put("near".to_string(), 1, HOUR).unwrap();
    s.signal("-STOP");
    let c2 = Arc::clone(&c);
    let (hits, timeouts) = within("near reads during a stall", move || {
        let (mut hits, mut timeouts) = (0, 0);
        // Until the reads have failed fast for a while: past the bound.
        while timeouts < 1000 {
            match c2.get(&"near".to_string()) {
                Ok(Some(1)) => hits += 1,
                Err(e) if e.is_timeout() => {
                    assert!(e.to_string().contains("stalled"), "{e}");
                    timeouts += 1;
                }
                other => panic!("{other:?}"),
            }
        }
        (hits, timeouts)
    });
    // A read of a key without a near copy waits for the server.
    let c3 = Arc::clone(&c);
    let other = thread::spawn(move || c3.get(&"other".to_string()));
    thread::sleep(Duration::from_millis(100));
    assert!(!other.is_finished(), "a miss waits for the server");
    s.signal("-CONT");
    assert_eq!(other.join().unwrap().unwrap(), None);
    assert_eq!(timeouts, 1000, "{hits} near hits first");
    eventually("near hits again", || {
        (c.get(&"near".to_string()).ok() == Some(Some(1))
            && c.peek_near(&"near".to_string()).is_some())
        .then_some(())
    });
}

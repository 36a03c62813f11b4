//! A killed and restarted server, and a frozen one: errors while down, then
//! recovery, and never a near copy from before the loss.

use crate::common::{Server, eventually, within};
use expiremap_redis::{Error, NearCache};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HOUR: Duration = Duration::from_secs(3600);

/// A cache whose pings never time out (a slow machine cannot close its
/// connection by answering late); these tests break connections on purpose.
fn cache(s: &Server) -> NearCache<String, u64> {
    cache_with(s, HOUR)
}

fn cache_with(s: &Server, staleness: Duration) -> NearCache<String, u64> {
    NearCache::builder(s.url())
        .prefix("f:")
        .staleness_bound(staleness)
        .build()
        .expect("connect")
}

#[test]
fn killed_and_restarted_server_errors_then_recovers_without_stale_reads() {
    let mut s = Server::start();
    let (a, b) = (cache(&s), cache(&s));
    let k = "k".to_string();
    a.put(k.clone(), 1, HOUR).unwrap();
    assert_eq!(b.get(&k).unwrap(), Some(1));
    assert!(b.near_ttl(&k).is_some()); // held (served while pings are answered)

    s.kill();
    // Both notice the loss: calls fail with a connection error and the near
    // copies are gone (invalidations may have been missed).
    for c in [&a, &b] {
        let e = eventually("a connection error", || c.get(&k).err());
        assert!(e.is_connection(), "{e}");
        assert!(matches!(e, Error::Connection(_)));
        assert_eq!(c.peek_near(&k), None);
    }
    // While down, every call fails fast; none returns the old value.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(50) {
        assert!(b.get(&k).is_err());
        assert!(a.put(k.clone(), 2, HOUR).is_err());
    }

    // The new server is empty (no persistence): a cache that served its old
    // near copy would read 1 here.
    s.restart();
    for c in [&a, &b] {
        let v = eventually("recovery", || c.get(&k).ok());
        assert_eq!(v, None);
        assert!(c.is_connected());
        assert!(c.connections() >= 2);
    }
    a.put(k.clone(), 3, HOUR).unwrap();
    assert_eq!(b.get(&k).unwrap(), Some(3));
    // Tracking was set up again: b's new near copy is invalidated by a.
    a.put(k.clone(), 4, HOUR).unwrap();
    eventually("invalidation after recovery", || {
        (b.peek_near(&k) != Some(3)).then_some(())
    });
    assert_eq!(b.get(&k).unwrap(), Some(4));
}

#[test]
fn frozen_server_stops_near_hits_within_the_bound_then_recovers() {
    let s = Server::start();
    // Pings every 25 ms, so that a frozen server is noticed soon.
    let a = cache_with(&s, Duration::from_millis(100));
    let k = "k".to_string();
    a.put(k.clone(), 1, HOUR).unwrap();
    assert!(a.near_ttl(&k).is_some());

    // SIGSTOP: the sockets stay open, nothing answers. Pings go unanswered,
    // so after the staleness bound near copies are no longer served, and the
    // connection is closed.
    s.signal("-STOP");
    // (No upper bound on how long that takes is asserted: a slow machine
    // may be slow. The bound itself is tested in coherence.rs.)
    eventually("near hits stop", || a.peek_near(&k).is_none().then_some(()));
    // A read of the near-held key fails at once (the server is stalled),
    // and, once the ping is overdue, the connection is closed.
    let e = eventually("calls fail", || a.get(&k).err());
    assert!(e.is_connection(), "{e}");
    eventually("the connection closes", || {
        (!a.is_connected()).then_some(())
    });
    s.signal("-CONT");
    let v = eventually("recovery", || a.get(&k).ok());
    assert_eq!(v, Some(1)); // same server, same data
    assert!(a.connections() >= 2);
}

#[test]
fn build_fails_when_nothing_listens() {
    let s = Server::start();
    let url = s.url();
    drop(s);
    let r = NearCache::<String, u64>::builder(url)
        .connect_timeout(Duration::from_millis(200))
        .build();
    assert!(matches!(r, Err(Error::Connection(_))), "{r:?}");
}

#[test]
fn a_server_that_never_answers_is_a_timeout_that_names_it() {
    // A listener that never accepts nor answers: the kernel completes the
    // TCP handshake (the backlog), then nothing comes back, whether the
    // cache waits for `HELLO`'s reply, a TLS handshake or `CLUSTER SLOTS`.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let t = Duration::from_millis(300);
    let check = |what: &str, r: Result<NearCache<String, u64>, Error>| {
        let e = r.expect_err(what);
        let m = e.to_string();
        assert!(e.is_timeout() && e.is_connection(), "{what}: {m}");
        assert!(m.contains(&format!("127.0.0.1:{port}")), "{what}: {m}");
        assert!(m.contains("300ms") && m.contains("timeout"), "{what}: {m}");
    };
    let url = format!("redis://127.0.0.1:{port}");
    let r = NearCache::builder(url.clone()).connect_timeout(t).build();
    check("redis://", r);
    let r = NearCache::builder(format!("rediss://127.0.0.1:{port}"))
        .connect_timeout(t)
        .build();
    check("rediss://", r);
    let r = NearCache::cluster_builder([url]).connect_timeout(t).build();
    check("cluster", r);
}

#[test]
fn killed_connections_miss_no_write_made_while_they_were_down() {
    // The server lives on, but the caches' connections are killed (as an
    // operator's CLIENT KILL, or a proxy restart, would): a write made while
    // they are down sends them no invalidation. After reconnecting they
    // must read it, not their old near copies.
    let s = Server::start();
    let (a, b) = (cache(&s), cache(&s));
    let k = "k".to_string();
    a.put(k.clone(), 1, HOUR).unwrap();
    assert_eq!(b.get(&k).unwrap(), Some(1));
    let mut raw = s.raw();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut raw)
        .unwrap();
    assert!(killed >= 2, "killed {killed} connections");
    // postcard(2u64) = [2]; the key is "f:" + postcard("k") = "f:\x01k".
    let _: () = redis::cmd("SET")
        .arg(b"f:\x01k".as_slice())
        .arg(b"\x02".as_slice())
        .query(&mut raw)
        .unwrap();
    for c in [&a, &b] {
        eventually("reconnected", || (c.connections() >= 2).then_some(()));
        let v = eventually("a read after reconnecting", || c.get(&k).ok());
        assert_eq!(v, Some(2));
    }
}

#[test]
fn a_write_pause_does_not_hold_up_reads() {
    // CLIENT PAUSE ... WRITE (failovers use it) holds up writes, not reads:
    // a miss's fetch must be a read-only script, answered during the pause,
    // not a plain EVAL that waits it out (and makes the pings behind it
    // late). The pause outlasts PATIENCE: a fetch that waited it out fails
    // the test.
    let s = Server::start();
    let c = Arc::new(
        NearCache::<String, u64>::builder(s.url())
            .prefix("w:")
            .staleness_bound(HOUR)
            .call_timeout(HOUR)
            .build()
            .unwrap(),
    );
    c.put("k".into(), 1, HOUR).unwrap();
    let mut raw = s.raw();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(120_000)
        .arg("WRITE")
        .query(&mut raw)
        .unwrap();
    let other: NearCache<String, u64> = NearCache::builder(s.url())
        .prefix("w:")
        .staleness_bound(HOUR)
        .build()
        .unwrap();
    let c2 = Arc::clone(&c);
    let missing = within("a miss during a write pause", move || {
        c2.get(&"missing".to_string())
    });
    assert_eq!(missing.unwrap(), None);
    assert_eq!(other.get(&"k".to_string()).unwrap(), Some(1)); // a miss that finds a value
    assert_eq!(other.peek_near(&"k".to_string()), Some(1));
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut raw).unwrap();
    assert_eq!(c.connections(), 1);
}

#[test]
fn calls_say_why_the_cache_cannot_reconnect() {
    // A password rotation: the cache's connection is dropped and its
    // attempts to reconnect with the old password fail. Calls must say so
    // (WRONGPASS), not only "reconnecting".
    let s = Server::start_with(&["--requirepass", "old"]);
    let url = |pw: &str| format!("redis://:{pw}@127.0.0.1:{}", s.port);
    let c: NearCache<String, u64> = NearCache::builder(url("old"))
        .prefix("r:")
        .staleness_bound(HOUR)
        .build()
        .unwrap();
    c.put("k".into(), 1, HOUR).unwrap();
    assert!(c.last_connect_error().is_none());
    let mut raw = redis::Client::open(url("old"))
        .and_then(|cl| cl.get_connection())
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("new")
        .query(&mut raw)
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut raw)
        .unwrap();
    let e = eventually("a call that names WRONGPASS", || {
        c.get(&"k".to_string())
            .err()
            .filter(|e| e.to_string().contains("WRONGPASS"))
    });
    assert!(e.is_connection(), "{e}");
    // The cause is the error's source, too.
    let io = std::error::Error::source(&e).expect("an io::Error");
    assert!(std::error::Error::source(io).is_some(), "{e}");
    match c.last_connect_error() {
        Some(Error::Server(m)) => assert!(m.contains("WRONGPASS"), "{m}"),
        other => panic!("expected the server's refusal, got {other:?}"),
    }
    // The password is put back: the cache recovers on its own.
    let mut raw = redis::Client::open(url("new"))
        .and_then(|cl| cl.get_connection())
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("old")
        .query(&mut raw)
        .unwrap();
    let v = eventually("recovery", || c.get(&"k".to_string()).ok());
    assert_eq!(v, Some(1));
    assert!(c.last_connect_error().is_none());
}

#[test]
fn a_call_on_a_frozen_server_times_out_and_the_connection_stays() {
    // The staleness bound (an hour) says nothing of how long a call may
    // wait: the call timeout does.
    let s = Server::start();
    let c = Arc::new(
        NearCache::<String, u64>::builder(s.url())
            .prefix("z:")
            .staleness_bound(HOUR)
            .call_timeout(Duration::from_millis(200))
            .build()
            .unwrap(),
    );
    c.put("k".into(), 1, HOUR).unwrap();
    s.signal("-STOP");
    let c2 = Arc::clone(&c);
    let r = within("a call on a frozen server", move || {
        c2.get(&"missing".to_string())
    });
    s.signal("-CONT");
    let e = r.unwrap_err();
    assert!(e.is_timeout() && e.is_connection(), "{e}");
    // The message says which server, and after how long.
    let m = e.to_string();
    assert!(m.contains(&format!("127.0.0.1:{}", s.port)), "{m}");
    assert!(m.contains("200ms"), "{m}");
    // A timed-out call costs neither the connection nor the near copies.
    let v = eventually("answers again", || c.get(&"missing".to_string()).ok());
    assert_eq!(v, None);
    assert_eq!(c.peek_near(&"k".to_string()), Some(1));
    assert_eq!(c.connections(), 1);
}

#[test]
fn a_stall_longer_than_the_bound_stops_near_hits_but_keeps_the_connection() {
    // The server stalls for 1 s, ten times the staleness bound: near hits
    // stop (the bound), but a call made during the stall gets its reply
    // when the server wakes (it is within its call timeout), and the
    // connection and the near copies survive.
    let s = Server::start();
    let c = Arc::new(
        NearCache::<String, u64>::builder(s.url())
            .prefix("y:")
            .staleness_bound(Duration::from_millis(100))
            .call_timeout(crate::common::PATIENCE * 2)
            .build()
            .unwrap(),
    );
    c.put("k".into(), 1, HOUR).unwrap();
    // Written by another cache: c holds no near copy of it, so its read
    // during the stall waits for the server (a near-held key's fails fast:
    // edges.rs).
    let other = NearCache::<String, u64>::builder(s.url())
        .prefix("y:")
        .build()
        .unwrap();
    other.put("j".into(), 2, HOUR).unwrap();
    s.signal("-STOP");
    eventually("near hits stop", || {
        c.peek_near(&"k".to_string()).is_none().then_some(())
    });
    let c2 = Arc::clone(&c);
    let during = std::thread::spawn(move || c2.get(&"j".to_string()));
    std::thread::sleep(Duration::from_secs(1));
    s.signal("-CONT");
    assert_eq!(during.join().unwrap().unwrap(), Some(2));
    eventually("near hits again", || {
        (c.peek_near(&"k".to_string()) == Some(1)).then_some(())
    });
    assert_eq!(c.connections(), 1);
}

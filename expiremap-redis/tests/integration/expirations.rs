//! `redis_expirations`: keys that expire in Redis, reported by name.
//!
//! The tests never wait for Redis's background sweep: after a key's
//! deadline, any lookup of it (`EXISTS` here) deletes it and sends its
//! `expired` event before the lookup's reply. So once `EXISTS` says 0, the
//! event is on its way to every subscriber, behind every earlier one.

use crate::common::{PATIENCE, Server, eventually};
use expiremap_redis::broadcast::{Receiver, RecvError, RecvTimeoutError};
use expiremap_redis::{Error, NearCache};
use std::collections::BTreeMap;
use std::time::Duration;

const EVENTS: &[&str] = &["--notify-keyspace-events", "Ex"];
/// Staleness bound of the caches: their pings never time out, so a slow
/// machine cannot close a connection by answering late.
const HOUR: Duration = Duration::from_secs(3600);

fn watcher(s: &Server) -> NearCache<String, u64> {
    NearCache::builder(s.url())
        .staleness_bound(HOUR)
        .prefix("e:")
        .redis_expirations(true)
        .build()
        .unwrap()
}

/// Waits until Redis has deleted `name` (a lookup after the deadline
/// deletes it, firing its event).
fn expired(raw: &mut redis::Connection, name: &[u8]) {
    eventually("the key expired in Redis", || {
        let n: i64 = redis::cmd("EXISTS").arg(name).query(raw).unwrap();
        (n == 0).then_some(())
    });
}

/// A 1 ms key under the prefix, written by another program, waited out: a
/// marker that every expiration before it has been sent.
fn sentinel(raw: &mut redis::Connection) -> String {
    // "e:" + postcard("end") (length 3, then the bytes).
    let name = b"e:\x03end";
    let _: () = redis::cmd("SET")
        .arg(name.as_slice())
        .arg(b"\x00".as_slice())
        .arg("PX")
        .arg(1)
        .query(raw)
        .unwrap();
    expired(raw, name);
    "end".to_string()
}

/// Everything `rx` receives up to and including `last`, with the lag it
/// reports on the way.
fn until(rx: &mut Receiver<String>, last: &str) -> (Vec<String>, u64) {
    let (mut got, mut lagged) = (Vec::new(), 0);
    loop {
        match rx.recv_timeout(PATIENCE) {
            Ok(k) => {
                let done = k == last;
                got.push(k);
                if done {
                    return (got, lagged);
                }
            }
            Err(RecvTimeoutError::Lagged(n)) => lagged += n,
            Err(e) => panic!("waiting for {last:?}: {e:?} after {got:?}"),
        }
    }
}

#[test]
fn keys_expired_in_redis_are_reported_once_each_and_only_ours() {
    let s = Server::start_with(EVENTS);
    let writer: NearCache<String, u64> = NearCache::builder(s.url())
        .staleness_bound(HOUR)
        .prefix("e:")
        .build()
        .unwrap();
    let w = watcher(&s);
    let mut rx = w.subscribe_expirations().unwrap();
    let mut raw = s.raw();
    let ms = Duration::from_millis(1);
    for k in ["a", "b", "c"] {
        writer.put(k.to_string(), 1, ms).unwrap();
    }
    // Not reported: another prefix, a name under ours that is not a key, a
    // key deleted rather than expired, and a key that has not expired.
    for (name, px) in [
        (b"other:\x01a".as_slice(), Some(1)),
        (b"e:\xff".as_slice(), Some(1)),
        (b"e:\x01d".as_slice(), None),
        (b"e:\x01f".as_slice(), Some(3_600_000)),
    ] {
        let mut set = redis::cmd("SET");
        set.arg(name).arg(b"\x00".as_slice());
        if let Some(px) = px {
            set.arg("PX").arg(px);
        }
        let _: () = set.query(&mut raw).unwrap();
    }
    let _: i64 = redis::cmd("DEL")
        .arg(b"e:\x01d".as_slice())
        .query(&mut raw)
        .unwrap();
    for name in [
        b"e:\x01a".as_slice(),
        b"e:\x01b",
        b"e:\x01c",
        b"other:\x01a",
        b"e:\xff",
    ] {
        expired(&mut raw, name);
    }
    let end = sentinel(&mut raw);
    let (mut got, lagged) = until(&mut rx, &end);
    assert_eq!(lagged, 0);
    assert_eq!(got.pop().as_deref(), Some("end"));
    got.sort();
    assert_eq!(got, ["a", "b", "c"]);
    // A second reader and the writer's cache see nothing of this: the
    // writer did not ask, and a reader starts from when it subscribed.
    assert!(matches!(
        writer.subscribe_expirations(),
        Err(Error::Config(_))
    ));
    let mut late = w.subscribe_expirations().unwrap();
    let end = sentinel(&mut raw);
    assert_eq!(until(&mut late, &end), (vec![end.clone()], 0));
    assert_eq!(until(&mut rx, &end), (vec![end], 0));
}

#[test]
fn a_reader_that_falls_behind_is_told_exactly_how_many_it_missed() {
    let s = Server::start_with(EVENTS);
    let w = watcher(&s);
    let mut rx = w.subscribe_expirations().unwrap();
    // A second reader, to know when all have been published.
    let mut probe = w.subscribe_expirations().unwrap();
    let mut raw = s.raw();
    const N: usize = 1500; // more than the ring's 1,024
    let names: Vec<Vec<u8>> = (0..N)
        .map(|i| {
            let k = format!("k{i}");
            let mut name = b"e:".to_vec();
            name.push(k.len() as u8);
            name.extend_from_slice(k.as_bytes());
            name
        })
        .collect();
    let mut pipe = redis::pipe();
    for name in &names {
        pipe.cmd("SET")
            .arg(name.as_slice())
            .arg(b"\x00".as_slice())
            .arg("PX")
            .arg(1)
            .ignore();
    }
    let _: () = pipe.query(&mut raw).unwrap();
    for name in &names {
        expired(&mut raw, name);
    }
    let end = sentinel(&mut raw);
    until(&mut probe, &end);
    // Everything was published before `rx` reads anything.
    let (got, lagged) = until(&mut rx, &end);
    assert!(got.len() <= 1024, "more than the ring holds");
    assert!(lagged > 0, "{N} keys fit a ring of 1,024");
    assert_eq!(
        got.len() as u64 + lagged,
        N as u64 + 1,
        "every expiration received or counted"
    );
    let mut seen = BTreeMap::new();
    for k in &got {
        *seen.entry(k).or_insert(0) += 1;
    }
    assert!(seen.values().all(|&n| n == 1), "a key reported twice");
}

#[test]
fn build_checks_that_the_server_sends_expired_events() {
    // Default settings: no key events.
    let s = Server::start();
    match NearCache::<String, u64>::builder(s.url())
        .staleness_bound(HOUR)
        .redis_expirations(true)
        .build()
    {
        Err(Error::Config(m)) => assert!(m.contains("notify-keyspace-events"), "{m}"),
        other => panic!("expected a configuration error, got {:?}", other.err()),
    }
    // Key events but not expirations, then expirations through `A`.
    let mut raw = s.raw();
    for (flags, ok) in [("Eg", false), ("KEA", true), ("xE", true)] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg(flags)
            .query(&mut raw)
            .unwrap();
        let r = NearCache::<String, u64>::builder(s.url())
            .staleness_bound(HOUR)
            .redis_expirations(true)
            .build();
        assert_eq!(r.is_ok(), ok, "{flags}: {:?}", r.err());
    }
    // Without the option, the server's settings do not matter, and there is
    // nothing to subscribe to.
    let plain = NearCache::<String, u64>::builder(s.url())
        .staleness_bound(HOUR)
        .build()
        .unwrap();
    assert!(matches!(
        plain.subscribe_expirations(),
        Err(Error::Config(_))
    ));
}

#[test]
fn a_server_that_refuses_config_is_trusted() {
    let s = Server::start_with(&[
        "--notify-keyspace-events",
        "Ex",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    let w = watcher(&s);
    let mut rx = w.subscribe_expirations().unwrap();
    let end = sentinel(&mut s.raw());
    assert_eq!(until(&mut rx, &end), (vec![end], 0));
}

#[test]
fn the_events_connection_is_its_own_and_comes_back_after_a_kill() {
    let s = Server::start_with(EVENTS);
    // No late ping can close the data connection (`HOUR`), so it is
    // reconnected only if the kill hit it.
    let w = watcher(&s);
    let mut rx = w.subscribe_expirations().unwrap();
    let mut raw = s.raw();
    // The subscribed connection is a pub/sub client; the data connection
    // is not, and lives on.
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut raw)
        .unwrap();
    assert_eq!(killed, 1, "one subscribed connection");
    assert_eq!(w.get(&"absent".to_string()).unwrap(), None, "a round trip");
    assert_eq!(w.connections(), 1, "the data connection was not touched");
    // Events sent before the events' connection is back are lost; once it
    // is, every expiration is reported again.
    let end = eventually("expirations reported again", || {
        let end = sentinel(&mut raw);
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(k) => Some(k),
            Err(RecvTimeoutError::Timeout) => None,
            Err(e) => panic!("{e:?}"),
        }
        .filter(|k| *k == end)
    });
    assert_eq!(end, "end");
    // The reader outlives the connections; only the cache's drop closes it.
    drop(w);
    assert!(matches!(rx.recv(), Err(RecvError::Closed)));
}

#[test]
fn a_refused_subscribe_fails_build_and_nothing_else() {
    let s = Server::start_with(EVENTS);
    let mut raw = s.raw();
    // A user with every command and key but no pub/sub channel.
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("nochan")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("+@all")
        .arg("resetchannels")
        .query(&mut raw)
        .unwrap();
    let url = format!("redis://nochan:pw@127.0.0.1:{}", s.port);
    match NearCache::<String, u64>::builder(url.as_str())
        .staleness_bound(HOUR)
        .redis_expirations(true)
        .build()
    {
        Err(Error::Server(m)) => assert!(m.contains("SUBSCRIBE"), "{m}"),
        other => panic!("expected the server's refusal, got {:?}", other.err()),
    }
    let plain = NearCache::<String, u64>::builder(url.as_str())
        .staleness_bound(HOUR)
        .build()
        .unwrap();
    plain.put("k".into(), 1, Duration::from_secs(60)).unwrap();
    assert_eq!(plain.get(&"k".to_string()).unwrap(), Some(1));
}

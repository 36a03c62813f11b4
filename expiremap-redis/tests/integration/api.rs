//! The calls one by one: codec errors, loading, events, configuration.

use crate::common::{Server, eventually};
use expiremap_redis::{Cause, Error, NearCache};
use serde::{Deserialize, Serialize};
use std::sync::Barrier;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

#[test]
fn structured_keys_and_values_round_trip() {
    #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
    struct User {
        tenant: u32,
        name: String,
    }
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    struct Profile {
        age: u8,
        tags: Vec<String>,
    }
    let s = Server::start();
    let a: NearCache<User, Profile> = NearCache::builder(s.url())
        .staleness_bound(HOUR)
        .prefix("u:")
        .build()
        .unwrap();
    let b: NearCache<User, Profile> = NearCache::builder(s.url())
        .staleness_bound(HOUR)
        .prefix("u:")
        .build()
        .unwrap();
    let k = User {
        tenant: 7,
        name: "ann".into(),
    };
    let v = Profile {
        age: 30,
        tags: vec!["x".into()],
    };
    a.put(k.clone(), v.clone(), HOUR).unwrap();
    assert_eq!(b.get(&k).unwrap(), Some(v.clone()));
    assert_eq!(b.remove(&k).unwrap(), Some(v));
    assert_eq!(b.remove(&k).unwrap(), None);
    eventually("a's copy dropped", || {
        a.peek_near(&k).is_none().then_some(())
    });
    assert_eq!(a.get(&k).unwrap(), None);
}

#[test]
fn codec_errors_are_typed() {
    let s = Server::start();
    let strings: NearCache<String, String> = NearCache::builder(s.url())
        .staleness_bound(HOUR)
        .prefix("c:")
        .build()
        .unwrap();
    let numbers: NearCache<String, u64> = NearCache::builder(s.url())
        .staleness_bound(HOUR)
        .prefix("c:")
        .build()
        .unwrap();
    strings.put("k".into(), "hello".into(), HOUR).unwrap();
    // "hello" is a length 5 and five bytes: a u64 of 5 with bytes left over.
    match numbers.get(&"k".to_string()) {
        Err(Error::Codec(e)) => assert!(!e.encoding && e.part == "value", "{e}"),
        other => panic!("expected a codec error, got {other:?}"),
    }
    // Garbage written by another program.
    let mut raw = s.raw();
    let _: () = redis::cmd("SET")
        .arg(b"c:\x01g".as_slice())
        .arg(b"\xff\xff\xff".as_slice())
        .query(&mut raw)
        .unwrap();
    let e = numbers.get(&"g".to_string()).unwrap_err();
    assert!(matches!(e, Error::Codec(_)), "{e}");
    assert!(std::error::Error::source(&e).is_some());
    assert_eq!(numbers.peek_near(&"g".to_string()), None);

    // A value whose Serialize fails: nothing is sent.
    #[derive(Clone, Debug)]
    struct Refuses;
    impl Serialize for Refuses {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("refused"))
        }
    }
    impl<'de> Deserialize<'de> for Refuses {
        fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
            Ok(Refuses)
        }
    }
    let r: NearCache<String, Refuses> = NearCache::builder(s.url())
        .staleness_bound(HOUR)
        .prefix("c:")
        .build()
        .unwrap();
    match r.put("z".into(), Refuses, HOUR) {
        Err(Error::Codec(e)) => assert!(e.encoding && e.part == "value", "{e}"),
        other => panic!("expected a codec error, got {other:?}"),
    }
    // A server error reply is typed too: the key holds a list.
    let _: () = redis::cmd("RPUSH")
        .arg(b"c:\x01l".as_slice())
        .arg(1)
        .query(&mut raw)
        .unwrap();
    let e = numbers.get(&"l".to_string()).unwrap_err();
    assert!(matches!(e, Error::Server(_)), "{e}");
}

#[test]
fn get_or_insert_with_loads_once_per_key() {
    let s = Server::start();
    let a: NearCache<String, u64> = NearCache::builder(s.url())
        .staleness_bound(HOUR)
        .prefix("l:")
        .build()
        .unwrap();
    let calls = AtomicU32::new(0);
    let start = Barrier::new(8);
    std::thread::scope(|sc| {
        for _ in 0..8 {
            sc.spawn(|| {
                start.wait();
                let v = a
                    .get_or_insert_with("k".into(), HOUR, || {
                        calls.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(50));
                        42
                    })
                    .unwrap();
                assert_eq!(v, 42);
            });
        }
    });
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Stored in Redis: another cache finds it without loading.
    let b: NearCache<String, u64> = NearCache::builder(s.url())
        .staleness_bound(HOUR)
        .prefix("l:")
        .build()
        .unwrap();
    let v = b
        .get_or_insert_with("k".into(), HOUR, || unreachable!())
        .unwrap();
    assert_eq!(v, 42);

    // A failing init: its error, nothing stored, the next caller loads.
    #[derive(Clone, Debug, PartialEq)]
    enum MyError {
        Backend,
        Cache(String),
    }
    impl From<Error> for MyError {
        fn from(e: Error) -> Self {
            MyError::Cache(e.to_string())
        }
    }
    let r = a.try_get_or_insert_with("f".into(), HOUR, || Err(MyError::Backend));
    assert_eq!(r, Err(MyError::Backend));
    assert_eq!(a.get(&"f".to_string()).unwrap(), None);
    let r = a.try_get_or_insert_with("f".into(), HOUR, || Ok::<_, MyError>(5));
    assert_eq!(r, Ok(5));
    assert_eq!(b.get(&"f".to_string()).unwrap(), Some(5));
}

#[test]
fn subscribers_see_near_copies_leave() {
    let s = Server::start();
    let a: NearCache<String, u64> = NearCache::builder(s.url())
        .staleness_bound(HOUR)
        .prefix("e:")
        .build()
        .unwrap();
    let b: NearCache<String, u64> = NearCache::builder(s.url())
        .staleness_bound(HOUR)
        .prefix("e:")
        .publish_removals(true)
        .build()
        .unwrap();
    let mut events = b.subscribe().unwrap();
    a.put("k".into(), 1, HOUR).unwrap();
    assert_eq!(b.get(&"k".to_string()).unwrap(), Some(1));
    a.put("k".into(), 2, HOUR).unwrap(); // invalidates b's copy
    let e = events.recv_timeout(crate::common::PATIENCE).unwrap();
    assert_eq!((e.key.as_str(), e.value, e.cause), ("k", 1, Cause::Removed));
    // A near copy that reaches its deadline (the Redis TTL) is Expired. On a
    // machine so slow that the key is gone before b reads it, try longer.
    let mut ttl = Duration::from_millis(20);
    loop {
        a.put("t".into(), 3, ttl).unwrap();
        if b.get(&"t".to_string()).unwrap() == Some(3) && b.peek_near(&"t".to_string()).is_some() {
            break;
        }
        ttl *= 2;
    }
    let e = events.recv_timeout(crate::common::PATIENCE).unwrap();
    assert_eq!((e.key.as_str(), e.value, e.cause), ("t", 3, Cause::Expired));
}

#[test]
fn bad_settings_are_config_errors() {
    let s = Server::start();
    let r = NearCache::<u32, u32>::builder(s.url())
        .staleness_bound(HOUR)
        .prefix("")
        .build();
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    let r = NearCache::<u32, u32>::builder("redis+unix:///tmp/x.sock").build();
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    let r = NearCache::<u32, u32>::builder(s.url())
        .staleness_bound(HOUR)
        .staleness_bound(Duration::from_millis(1))
        .build();
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    let r = NearCache::<u32, u32>::builder(s.url())
        .staleness_bound(HOUR)
        .max_entries(0)
        .build();
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    // Zero TTL: ignored, as in ExpireMap.
    let c = NearCache::<u32, u32>::builder(s.url())
        .staleness_bound(HOUR)
        .build()
        .unwrap();
    c.put(1, 1, Duration::ZERO).unwrap();
    assert_eq!(c.get(&1).unwrap(), None);
}

#[test]
fn password_and_database_from_the_url() {
    let s = Server::start_with(&["--requirepass", "s3cret"]);
    let url = format!("redis://:s3cret@127.0.0.1:{}/3", s.port);
    let a: NearCache<String, u64> = NearCache::builder(url.as_str())
        .staleness_bound(HOUR)
        .prefix("p:")
        .build()
        .unwrap();
    let b: NearCache<String, u64> = NearCache::builder(url.as_str())
        .staleness_bound(HOUR)
        .prefix("p:")
        .build()
        .unwrap();
    a.put("k".into(), 1, HOUR).unwrap();
    assert_eq!(b.get(&"k".to_string()).unwrap(), Some(1));
    a.put("k".into(), 2, HOUR).unwrap();
    eventually("invalidation", || {
        (b.peek_near(&"k".to_string()) != Some(1)).then_some(())
    });
    assert_eq!(b.get(&"k".to_string()).unwrap(), Some(2));
    // The value is in database 3, not 0.
    let mut raw = redis::Client::open(format!("redis://:s3cret@127.0.0.1:{}/0", s.port))
        .and_then(|c| c.get_connection())
        .unwrap();
    let n: i64 = redis::cmd("DBSIZE").query(&mut raw).unwrap();
    assert_eq!(n, 0);

    let wrong = format!("redis://:nope@127.0.0.1:{}", s.port);
    let r = NearCache::<String, u64>::builder(wrong).build();
    assert!(matches!(r, Err(Error::Server(_))), "{r:?}");
    let none = format!("redis://127.0.0.1:{}", s.port);
    let r = NearCache::<String, u64>::builder(none).build();
    assert!(matches!(r, Err(Error::Server(_))), "{r:?}");
}

#[test]
fn secrets_stay_out_of_debug_and_errors_and_zero_timeouts_are_config_errors() {
    let b = NearCache::<String, u64>::builder("redis://user:hunter2@127.0.0.1:1/0");
    let shown = format!("{b:?}");
    assert!(
        !shown.contains("hunter2") && shown.contains("127.0.0.1"),
        "{shown}"
    );
    let e = NearCache::<String, u64>::builder("redis://user:hunter2@127.0.0.1:notaport")
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert!(!e.to_string().contains("hunter2"), "{e}");
    assert!(!format!("{e:?}").contains("hunter2"), "{e:?}");

    let s = Server::start();
    let r = NearCache::<String, u64>::builder(s.url())
        .connect_timeout(Duration::ZERO)
        .build();
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    let r = NearCache::<String, u64>::builder(s.url())
        .call_timeout(Duration::ZERO)
        .build();
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
}

#[test]
fn query_string_secrets_stay_out_of_debug_and_errors() {
    // A password can come in the query string (`redis+unix://...?pass=`,
    // the `redis` crate's form for Unix sockets), not only before an `@`;
    // and an `@` inside such a password must not let its tail through.
    let urls = [
        "redis+unix:///tmp/expiremap-test.sock?pass=hunter2",
        "unix:///tmp/expiremap-test.sock?db=1&user=alice&pass=hunter2",
        "redis+unix:///tmp/expiremap-test.sock?db=notanumber&pass=hunter2",
        "redis+unix:///tmp/expiremap-test.sock?pass=hun@ter2",
        "redis://127.0.0.1:1/0?password=hunter2",
        "redis://alice:hunter2@127.0.0.1:notaport?pass=hunter2",
        "redis://:hun?ter2@127.0.0.1:1",
    ];
    let leaks = |shown: &str| {
        ["hunter2", "hun", "ter2", "alice"]
            .iter()
            .any(|s| shown.contains(s))
    };
    for url in urls {
        let b = NearCache::<String, u64>::builder(url);
        let shown = format!("{b:?}");
        assert!(!leaks(&shown), "{url}: {shown}");
        // A configuration error, or (the TCP URL) a refused connection.
        let e = b.build().unwrap_err();
        assert!(!leaks(&e.to_string()), "{url}: {e}");
        assert!(!leaks(&format!("{e:?}")), "{url}: {e:?}");
        let b = NearCache::<String, u64>::cluster_builder(["redis://127.0.0.1:1", url]);
        let shown = format!("{b:?}");
        assert!(!leaks(&shown), "{url}: {shown}");
        let e = b.build().unwrap_err();
        assert!(!leaks(&e.to_string()), "{url}: {e}");
        assert!(!leaks(&format!("{e:?}")), "{url}: {e:?}");
    }
    // What is not secret stays readable.
    let shown = format!(
        "{:?}",
        NearCache::<String, u64>::builder("unix:///tmp/expiremap-test.sock?db=3&pass=hunter2")
    );
    assert!(
        shown.contains("/tmp/expiremap-test.sock") && shown.contains("db=3"),
        "{shown}"
    );
}

#[test]
fn remove_of_an_undecodable_value_says_the_key_was_deleted() {
    let s = Server::start();
    let c: NearCache<String, u64> = NearCache::builder(s.url())
        .staleness_bound(HOUR)
        .prefix("d:")
        .build()
        .unwrap();
    let mut raw = s.raw();
    let _: () = redis::cmd("SET")
        .arg(b"d:\x01g".as_slice())
        .arg(b"\xff\xff\xff".as_slice())
        .query(&mut raw)
        .unwrap();
    match c.remove(&"g".to_string()) {
        Err(Error::Codec(e)) => {
            assert!(!e.encoding && e.message.contains("deleted"), "{e}")
        }
        other => panic!("expected a codec error, got {other:?}"),
    }
    let n: i64 = redis::cmd("EXISTS")
        .arg(b"d:\x01g".as_slice())
        .query(&mut raw)
        .unwrap();
    assert_eq!(n, 0);
}

#[test]
fn overlapping_prefixes_on_one_server_are_refused() {
    let s = Server::start();
    let other = Server::start();
    let build = |s: &Server, p: &str| {
        NearCache::<String, u64>::builder(s.url())
            .staleness_bound(HOUR)
            .prefix(p)
            .build()
    };
    let a = build(&s, "a").unwrap();
    // "a" + postcard of a 98-byte string (length byte b'b') is "ab" + ...
    for p in ["ab", "abc"] {
        match build(&s, p) {
            Err(Error::Config(m)) => assert!(m.contains("overlaps"), "{m}"),
            other => panic!("{p}: expected a config error, got {other:?}"),
        }
    }
    let a2 = build(&s, "a").unwrap(); // the same prefix: the same data
    let _b = build(&other, "ab").unwrap(); // another server
    let _c = build(&s, "b").unwrap();
    drop((a, a2));
    let _ab = build(&s, "ab").unwrap(); // "a" is gone
    assert!(matches!(build(&s, "a"), Err(Error::Config(_))));
}

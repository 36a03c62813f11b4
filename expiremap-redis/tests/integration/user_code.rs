//! User code on the cache's threads: a `Deserialize` that panics, and keys
//! whose encoding does not decode back to them. Neither may make a call
//! wait for ever, nor leave a near copy that invalidations cannot find.

use crate::common::{Server, eventually, within};
use expiremap_redis::{Error, NearCache};
use serde::{Deserialize, Deserializer, Serialize};
use std::sync::Arc;
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

/// A number whose `Deserialize` panics on 13.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
struct Touchy(u32);

impl<'de> Deserialize<'de> for Touchy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u32::deserialize(d)?;
        assert_ne!(n, 13, "Touchy cannot stand 13");
        Ok(Touchy(n))
    }
}

fn cache<K: expiremap_redis::CacheKey, V: expiremap_redis::CacheValue>(
    s: &Server,
    prefix: &str,
) -> Arc<NearCache<K, V>> {
    Arc::new(
        NearCache::builder(s.url())
            .prefix(prefix)
            .staleness_bound(HOUR)
            .build()
            .expect("connect"),
    )
}

#[test]
fn a_value_whose_deserialize_panics_is_a_codec_error_and_the_cache_lives_on() {
    let s = Server::start();
    let a = cache::<String, Touchy>(&s, "v:");
    let b = cache::<String, Touchy>(&s, "v:");
    a.put("bad".into(), Touchy(13), HOUR).unwrap(); // encoding runs no Deserialize
    a.put("good".into(), Touchy(1), HOUR).unwrap();

    // b's reader decodes the value: the panic is the call's codec error.
    let b2 = Arc::clone(&b);
    match within("get of a value whose Deserialize panics", move || {
        b2.get(&"bad".to_string())
    }) {
        Err(Error::Codec(e)) => {
            assert!(!e.encoding && e.message.contains("panicked"), "{e}")
        }
        other => panic!("expected a codec error, got {other:?}"),
    }
    assert_eq!(b.peek_near(&"bad".to_string()), None);
    // Every later call is answered, on the same connection.
    for _ in 0..3 {
        let b2 = Arc::clone(&b);
        let v = within("a later get", move || b2.get(&"good".to_string()));
        assert_eq!(v.unwrap(), Some(Touchy(1)));
        let b2 = Arc::clone(&b);
        let r = within("a later remove", move || b2.remove(&"bad".to_string()));
        assert!(matches!(r, Err(Error::Codec(_)) | Ok(None)), "{r:?}");
    }
    assert!(b.is_connected());
    assert_eq!(b.connections(), 1);
    // Invalidations still arrive.
    assert_eq!(b.peek_near(&"good".to_string()), Some(Touchy(1)));
    a.put("good".into(), Touchy(2), HOUR).unwrap();
    eventually("b's copy of good invalidated", || {
        (b.peek_near(&"good".to_string()) != Some(Touchy(1))).then_some(())
    });
}

#[test]
fn a_key_name_whose_deserialize_panics_in_an_invalidation_is_skipped() {
    let s = Server::start();
    let a = cache::<Touchy, u64>(&s, "k:");
    let b = cache::<Touchy, u64>(&s, "k:");
    a.put(Touchy(1), 1, HOUR).unwrap();
    assert_eq!(b.get(&Touchy(1)).unwrap(), Some(1));
    // Another program writes the key named postcard(13) under the prefix:
    // b's reader decodes that name when the invalidation comes.
    let mut raw = s.raw();
    let _: () = redis::cmd("SET")
        .arg(b"k:\x0d".as_slice())
        .arg(b"\x01".as_slice())
        .query(&mut raw)
        .unwrap();
    // Then a real change of a key b holds: b must see it. (a's reader
    // decodes the name too: every call is bounded.)
    let a2 = Arc::clone(&a);
    within("a put after the panicking name", move || {
        a2.put(Touchy(1), 2, HOUR)
    })
    .unwrap();
    eventually("b's copy of 1 invalidated after the panicking name", || {
        (b.peek_near(&Touchy(1)) != Some(1)).then_some(())
    });
    let b2 = Arc::clone(&b);
    assert_eq!(
        within("get after", move || b2.get(&Touchy(1))).unwrap(),
        Some(2)
    );
    assert!(b.is_connected());
}

/// What a key that does not round-trip must do: fail before anything is
/// sent or kept, with a codec error about the key that says why.
fn refused<K: expiremap_redis::CacheKey + std::fmt::Debug>(c: &NearCache<K, u64>, k: K) {
    for r in [
        c.put(k.clone(), 1, HOUR).map(|_| None),
        c.get(&k),
        c.remove(&k),
        c.get_or_insert_with(k.clone(), HOUR, || 1).map(Some),
    ] {
        match r {
            Err(Error::Codec(e)) => assert!(
                e.encoding && e.part == "key" && e.message.contains("round-trip"),
                "{e}"
            ),
            other => panic!("{k:?}: expected a codec error, got {other:?}"),
        }
    }
    assert_eq!(c.near_len(), 0, "{k:?}: a near copy was kept");
}

#[test]
fn keys_that_do_not_round_trip_are_refused_before_any_near_copy() {
    let s = Server::start();

    // Untagged enum: postcard cannot decode it at all.
    #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(untagged)]
    enum Id {
        Num(u64),
        Name(String),
    }
    let c = cache::<Id, u64>(&s, "u:");
    refused(&c, Id::Num(1));
    refused(&c, Id::Name("x".into()));

    // Internally tagged enum: the same.
    #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(tag = "t")]
    enum Tagged {
        A { n: u32 },
    }
    let c = cache::<Tagged, u64>(&s, "i:");
    refused(&c, Tagged::A { n: 1 });

    // skip_serializing_if: a skipped field leaves bytes that decode short.
    #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
    struct Opt {
        id: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tag: Option<u32>,
    }
    let c = cache::<Opt, u64>(&s, "o:");
    refused(&c, Opt { id: 1, tag: None });
    // ...while the same type's keys that do round-trip work, and see
    // another cache's writes.
    let d = cache::<Opt, u64>(&s, "o:");
    let k = Opt {
        id: 1,
        tag: Some(2),
    };
    c.put(k.clone(), 1, HOUR).unwrap();
    assert_eq!(d.get(&k).unwrap(), Some(1));
    c.put(k.clone(), 2, HOUR).unwrap();
    eventually("d's copy invalidated", || {
        (d.peek_near(&k) != Some(1)).then_some(())
    });

    // #[serde(skip)]: decodes, but to another key.
    #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
    struct Skips {
        id: u32,
        #[serde(skip)]
        memo: u32,
    }
    let c = cache::<Skips, u64>(&s, "s:");
    refused(&c, Skips { id: 1, memo: 7 });
    c.put(Skips { id: 1, memo: 0 }, 1, HOUR).unwrap();
}

/// A key whose `Hash` panics for 13, but only on the cache's reader thread
/// (where a reply's near copy is stored): any user code there, not only a
/// `Deserialize`, may panic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct HashPanics(u32);

impl std::hash::Hash for HashPanics {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let on_reader = std::thread::current().name() == Some("expiremap-redis-reader");
        assert!(!(on_reader && self.0 == 13), "HashPanics: 13 on the reader");
        self.0.hash(h);
    }
}

#[test]
fn any_panic_on_the_reader_fails_the_call_and_the_cache_reconnects() {
    let s = Server::start();
    let c = cache::<HashPanics, u64>(&s, "p:");
    c.put(HashPanics(1), 1, HOUR).unwrap();
    let mut raw = s.raw();
    let _: () = redis::cmd("SET")
        .arg(b"p:\x0d".as_slice())
        .arg(b"\x07".as_slice())
        .query(&mut raw)
        .unwrap();
    // The reader stores the near copy of 13, hashes it and panics: the call
    // fails (it is not left waiting), and the cache reconnects.
    let c2 = Arc::clone(&c);
    let r = within("a get whose store panics on the reader", move || {
        c2.get(&HashPanics(13))
    });
    assert!(r.as_ref().is_err_and(Error::is_connection), "{r:?}");
    for i in 0..3 {
        let c2 = Arc::clone(&c);
        let v = within("a later get", move || {
            let t0 = std::time::Instant::now();
            loop {
                // Not held near: a round trip each time.
                match c2.get(&HashPanics(2)) {
                    Ok(v) => break v,
                    Err(e) if e.is_connection() && t0.elapsed() < crate::common::PATIENCE => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(e) => panic!("get {i}: {e}"),
                }
            }
        });
        assert_eq!(v, None);
    }
    assert!(c.connections() >= 2, "{}", c.connections());
    assert!(c.is_connected());
}

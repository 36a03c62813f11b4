//! `rediss://`: two caches over TLS to a `redis-server --tls-port` with a
//! throwaway CA (made by the test with `openssl`), coherent as over TCP.
#![cfg(feature = "tls")]

use crate::common::{Server, eventually};
use expiremap_redis::{Error, NearCache};
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

#[test]
fn two_caches_over_tls_see_each_others_writes() {
    let s = Server::start_tls();
    let ca = s.ca_pem.clone().unwrap();
    assert!(s.url().starts_with("rediss://"));
    let cache = |bound: Duration| {
        NearCache::<String, Vec<u8>>::builder(s.url())
            .prefix("tls:")
            .tls_ca_pem(&ca)
            .staleness_bound(bound)
            .build()
            .expect("connect over TLS")
    };
    let (a, b) = (cache(HOUR), cache(HOUR));
    let k = "k".to_string();
    a.put(k.clone(), vec![1], HOUR).unwrap();
    assert_eq!(b.get(&k).unwrap(), Some(vec![1]));
    assert_eq!(b.peek_near(&k), Some(vec![1]));
    a.put(k.clone(), vec![2], HOUR).unwrap();
    eventually("b's copy invalidated over TLS", || {
        (b.peek_near(&k) != Some(vec![1])).then_some(())
    });
    assert_eq!(b.get(&k).unwrap(), Some(vec![2]));
    // A value larger than a TLS record (16 KiB) both ways.
    let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    b.put("big".into(), big.clone(), HOUR).unwrap();
    assert_eq!(a.get(&"big".to_string()).unwrap(), Some(big));

    // The staleness bound holds over TLS too: with a short bound, a get
    // after it never returns the replaced value (the connection may be
    // slow to answer pings on a loaded machine: an error is no stale read).
    let c = cache(Duration::from_millis(50));
    a.put(k.clone(), vec![3], HOUR).unwrap();
    let _ = c.get(&k);
    a.put(k.clone(), vec![4], HOUR).unwrap();
    std::thread::sleep(c.staleness_bound() + Duration::from_millis(1));
    if let Ok(v) = c.get(&k) {
        assert_eq!(v, Some(vec![4]));
    }

    // Expired-key events come over TLS as well.
    let w: NearCache<String, Vec<u8>> = NearCache::builder(s.url())
        .prefix("tls:")
        .tls_ca_pem(&ca)
        .staleness_bound(HOUR)
        .redis_expirations(true)
        .build()
        .unwrap();
    let mut expired = w.subscribe_expirations().unwrap();
    a.put("e".into(), vec![5], Duration::from_millis(20))
        .unwrap();
    let key = expired
        .recv_timeout(crate::common::PATIENCE)
        .expect("an expiration");
    assert_eq!(key, "e");
}

#[test]
fn tls_checks_the_server_certificate() {
    let s = Server::start_tls();
    // Not signed by a root of webpki-roots: refused.
    let r = NearCache::<String, u64>::builder(s.url())
        .connect_timeout(Duration::from_secs(10))
        .build();
    match r {
        Err(Error::Connection(e)) => assert!(e.to_string().contains("TLS"), "{e}"),
        other => panic!("expected a TLS error, got {other:?}"),
    }
    // Certificate checks cannot be turned off.
    let r = NearCache::<String, u64>::builder(format!("{}/#insecure", s.url())).build();
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    // Not a PEM certificate.
    let r = NearCache::<String, u64>::builder(s.url())
        .tls_ca_pem("nonsense")
        .build();
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    // A CA for a plain TCP URL is a mistake.
    let r = NearCache::<String, u64>::builder("redis://127.0.0.1:1")
        .tls_ca_pem(s.ca_pem.as_ref().unwrap())
        .build();
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
}

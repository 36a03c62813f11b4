//! The `metrics` feature (`.ci/redis.sh` runs it): a scripted workload
//! against a real `redis-server`, and the exact series a named cache
//! publishes, read back from `metrics-util`'s debugging recorder
//! (installed for one thread only, so the other tests run beside it and
//! the cache's threads publish nowhere). Counts only: no timing is
//! asserted (timeouts only bound hangs).
#![cfg(feature = "metrics")]

use crate::common::{Server, eventually, within};
use expiremap_redis::NearCache;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::collections::BTreeMap;
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

type Cache = NearCache<String, u64>;

fn cache(s: &Server, name: Option<&'static str>) -> Cache {
    let b = NearCache::builder(s.url())
        .prefix("m:")
        .staleness_bound(HOUR);
    match name {
        Some(name) => b.metrics(name),
        None => b,
    }
    .build()
    .expect("connect")
}

/// A series as `name{label="value",...}` (labels sorted) and its value: a
/// counter's count, a gauge's value, or a histogram's number of
/// observations.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    Count(u64),
    Gauge(f64),
    Observed(usize),
}

/// Runs `f` with a debugging recorder as this thread's recorder; returns
/// every series it was handed.
fn recorded(f: impl FnOnce()) -> BTreeMap<String, Value> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    ::metrics::with_local_recorder(&recorder, f);
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}=\"{}\"", l.key(), l.value()))
                .collect();
            labels.sort();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            let value = match value {
                DebugValue::Counter(n) => Value::Count(n),
                DebugValue::Gauge(g) => Value::Gauge(g.0),
                DebugValue::Histogram(h) => Value::Observed(h.len()),
            };
            (name, value)
        })
        .collect()
}

/// The count of `series` (`name{labels}`) in what `c` publishes now.
fn count(c: &Cache, series: &str) -> Option<u64> {
    match recorded(|| c.publish_metrics()).get(series) {
        Some(Value::Count(n)) => Some(*n),
        _ => None,
    }
}

/// Every series of the Redis tier, and the near map's reads and size.
#[test]
fn a_scripted_workload_publishes_exact_counts() {
    use Value::{Count, Gauge, Observed};
    let s = Server::start();
    // `a` is the process watched; `b`, unnamed, another process of the
    // fleet on the same keys.
    let a = Arc::new(cache(&s, Some("users")));
    let b = Arc::new(cache(&s, None));
    let k = |k: &str| k.to_string();
    let got = recorded(|| {
        // A put (a call), two near hits, a miss that asks Redis (a call).
        a.put(k("a"), 1, HOUR).unwrap();
        assert_eq!(a.get(&k("a")).unwrap(), Some(1));
        assert_eq!(a.get(&k("a")).unwrap(), Some(1));
        assert_eq!(a.get(&k("nope")).unwrap(), None);
        // Another program writes a hash under the prefix: an invalidation
        // (of a key `a` holds no copy of), then a call that fails
        // (`WRONGTYPE`), which is no timeout. The invalidation was pushed
        // before the reply: it is counted by the time `get` returns.
        let mut raw = s.raw();
        let _: () = redis::cmd("HSET")
            .arg(b"m:\x01w")
            .arg("f")
            .arg("v")
            .query(&mut raw)
            .unwrap();
        let e = a.get(&k("w")).unwrap_err();
        assert!(!e.is_timeout(), "{e}");
        // The other process writes `a`: its near copy in `a` is dropped
        // (an invalidation), and the next read asks Redis (a call).
        b.put(k("a"), 2, HOUR).unwrap();
        eventually("a's copy dropped", || (a.near_len() == 0).then_some(()));
        assert_eq!(a.get(&k("a")).unwrap(), Some(2));

        // A lease wait and takeover: `b` takes the lease of `h` (an
        // invalidation in `a`) and holds it until told to fail; `a` asks
        // (its GET, and a lease take that finds it held: a wait); once `a`
        // waits, `b`'s load fails and gives the lease back (an
        // invalidation, which wakes `a`), and `a` takes it (a takeover,
        // and its own script's write of `h` comes back as an
        // invalidation), loads and stores (two calls).
        let (started_tx, started) = mpsc::channel();
        let (fail, fail_rx) = mpsc::channel::<()>();
        let holder = {
            let b = Arc::clone(&b);
            thread::spawn(move || {
                b.try_get_or_insert_with(k("h"), HOUR, || {
                    started_tx.send(()).unwrap();
                    fail_rx.recv().unwrap();
                    Err(expiremap_redis::Error::Config(
                        "the database is down".into(),
                    ))
                })
            })
        };
        within("the held load starts", move || started.recv().unwrap());
        // Told to fail once `a` waits (seen in its published count, on
        // this helper thread's own recorder).
        let watcher = {
            let a = Arc::clone(&a);
            thread::spawn(move || {
                eventually("a waits for the lease", || {
                    (count(&a, "cache_lease_waits_total{cache=\"users\"}") == Some(1)).then_some(())
                });
                fail.send(()).unwrap();
            })
        };
        assert_eq!(a.get_or_insert_with(k("h"), HOUR, || 7).unwrap(), 7);
        watcher.join().unwrap();
        assert!(holder.join().unwrap().is_err());
        // The loaded value's near copy: a hit.
        assert_eq!(a.get(&k("h")).unwrap(), Some(7));

        // The server drops every connection but the raw one: `a`
        // reconnects (its near copies dropped), and reads from Redis (a
        // call).
        let _: u64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query(&mut raw)
            .unwrap();
        eventually("a reconnects", || (a.connections() == 2).then_some(()));
        assert_eq!(a.near_len(), 0);
        assert_eq!(a.get(&k("a")).unwrap(), Some(2));

        a.publish_metrics();
        // An unnamed cache publishes nothing.
        b.publish_metrics();
    });
    let redis_tier: BTreeMap<String, Value> = got
        .iter()
        .filter(|(name, _)| {
            [
                "cache_redis_",
                "cache_invalidations",
                "cache_reconnects",
                "cache_lease_",
            ]
            .iter()
            .any(|p| name.starts_with(p))
        })
        .map(|(n, v)| (n.clone(), *v))
        .collect();
    let want: BTreeMap<String, Value> = [
        // put, get nope, get w (WRONGTYPE), get a, get h, lease (held),
        // lease (taken), store, get a after the reconnect.
        (
            "cache_redis_calls_total{cache=\"users\",result=\"ok\"}",
            Count(8),
        ),
        (
            "cache_redis_calls_total{cache=\"users\",result=\"error\"}",
            Count(1),
        ),
        (
            "cache_redis_calls_total{cache=\"users\",result=\"timeout\"}",
            Count(0),
        ),
        // Every call was made on this thread.
        (
            "cache_redis_call_duration_seconds{cache=\"users\"}",
            Observed(9),
        ),
        // w, a, h's lease taken by b, h's lease given back, and h's
        // lease taken by a (the take is a script, whose writes Redis
        // sends back to its own connection, `NOLOOP` or not).
        ("cache_invalidations_total{cache=\"users\"}", Count(5)),
        ("cache_reconnects_total{cache=\"users\"}", Count(1)),
        ("cache_lease_waits_total{cache=\"users\"}", Count(1)),
        ("cache_lease_takeovers_total{cache=\"users\"}", Count(1)),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v))
    .collect();
    assert_eq!(redis_tier, want);
    // The near map's own series (the core crate's), under the same name:
    // hits are the near hits (two of `a`, one of `h`).
    assert_eq!(
        got.get("cache_gets_total{cache=\"users\",result=\"hit\"}"),
        Some(&Count(3))
    );
    assert_eq!(got.get("cache_size{cache=\"users\"}"), Some(&Gauge(1.0)));
    assert!(
        got.keys().all(|n| n.contains("cache=\"users\"")),
        "only the named cache publishes: {got:#?}"
    );
}

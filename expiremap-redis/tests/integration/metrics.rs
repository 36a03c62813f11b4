//! The `metrics` feature (`.ci/redis.sh` runs it): a scripted workload
//! against a real `redis-server`, and the exact series a named cache
//! publishes, read back from `metrics-util`'s debugging recorder. Most
//! tests install it for one thread only (so the other tests run beside
//! them); what a cache's own threads publish goes to the process's global
//! recorder, which [`global`] installs and only
//! `the_supervisor_publishes_without_being_asked` reads (each cache here
//! has a name of its own, and a test reads only its own series). Counts
//! only: no timing is asserted (timeouts only bound hangs).
#![cfg(feature = "metrics")]

use crate::common::{Server, eventually, within};
use expiremap_redis::NearCache;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, mpsc};
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
    series(&snapshotter)
}

/// The process's global recorder, installed by the first call: where a
/// thread without a recorder of its own publishes (a cache's supervisor,
/// its near map's eviction thread).
fn global() -> &'static Snapshotter {
    static GLOBAL: OnceLock<Snapshotter> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        ::metrics::set_global_recorder(recorder).expect("no other global recorder");
        snapshotter
    })
}

/// What `snapshotter` was handed since its last snapshot (a counter's
/// value is the largest total published since then, 0 if none was), as
/// [`recorded`] names it.
fn series(snapshotter: &Snapshotter) -> BTreeMap<String, Value> {
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

/// The Redis tier's counters are published by the cache's supervisor
/// thread (and the near map's by its eviction thread) with no call to
/// `publish_metrics`, and again as they grow: read from the global
/// recorder, which only those threads publish this cache's counts to.
/// How soon is not asserted (at least once a second on any machine that
/// keeps up; the wait here is far longer).
#[test]
fn the_supervisor_publishes_without_being_asked() {
    let global = global();
    let s = Server::start();
    let c = cache(&s, Some("supervised"));
    let k = |k: &str| k.to_string();
    // Two calls (a put, and a miss that asks Redis) and a near hit.
    c.put(k("a"), 1, HOUR).unwrap();
    assert_eq!(c.get(&k("a")).unwrap(), Some(1));
    assert_eq!(c.get(&k("nope")).unwrap(), None);
    let calls = "cache_redis_calls_total{cache=\"supervised\",result=\"ok\"}";
    let hits = "cache_gets_total{cache=\"supervised\",result=\"hit\"}";
    // Each snapshot takes what was published since the last one: a count
    // seen is a publication made after the calls above.
    let mut near_hits = None;
    eventually("the supervisor publishes 2 calls", || {
        let got = series(global);
        if let Some(Value::Count(n)) = got.get(hits) {
            near_hits = near_hits.max(Some(*n));
        }
        (got.get(calls) == Some(&Value::Count(2))).then_some(())
    });
    // The near map's series too, by its own thread.
    eventually("the near map's hit is published", || {
        if let Some(Value::Count(n)) = series(global).get(hits) {
            near_hits = near_hits.max(Some(*n));
        }
        (near_hits == Some(1)).then_some(())
    });
    // Not once only: a third call is in a later publication.
    assert_eq!(c.get(&k("nope")).unwrap(), None);
    eventually("the supervisor publishes the third call", || {
        (series(global).get(calls) == Some(&Value::Count(3))).then_some(())
    });
    drop(c);
}

/// Whether the process `pid` is stopped (`T` in `/proc/<pid>/stat`): the
/// `SIGSTOP` has taken effect, the server answers nothing more.
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| Some(s.rsplit_once(')')?.1.trim_start().starts_with('T')))
        .unwrap_or(false)
}

/// A call that the server never answers in time is counted with
/// `result="timeout"` (not `error`): a miss (no near copy) while the
/// server is stopped, with a short call timeout. The staleness bound is
/// an hour, so that the stall is not noticed by the pings (which would
/// close the connection) while the call waits.
#[test]
fn a_call_to_a_stalled_server_is_counted_as_a_timeout() {
    use Value::{Count, Observed};
    let s = Server::start();
    let c: Cache = NearCache::builder(s.url())
        .prefix("m:")
        .staleness_bound(HOUR)
        .call_timeout(Duration::from_millis(200))
        .metrics("stalled")
        .build()
        .expect("connect");
    let k = |k: &str| k.to_string();
    let got = recorded(|| {
        c.put(k("a"), 1, HOUR).unwrap();
        s.signal("-STOP");
        eventually("the server stops", || stopped(s.pid()).then_some(()));
        let r = c.get(&k("nope"));
        s.signal("-CONT");
        let e = r.unwrap_err();
        assert!(e.is_timeout(), "{e}");
        c.publish_metrics();
    });
    let calls = |result: &str| {
        got.get(&format!(
            "cache_redis_calls_total{{cache=\"stalled\",result=\"{result}\"}}"
        ))
        .copied()
    };
    assert_eq!(
        (calls("ok"), calls("error"), calls("timeout")),
        (Some(Count(1)), Some(Count(0)), Some(Count(1))),
        "{got:#?}"
    );
    assert_eq!(
        got.get("cache_redis_call_duration_seconds{cache=\"stalled\"}"),
        Some(&Observed(2))
    );
}

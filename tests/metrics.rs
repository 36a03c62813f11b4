//! The `metrics` feature (`.ci/test.sh` runs it): a scripted workload on a
//! virtual clock, and the exact series it publishes, read back from
//! `metrics-util`'s debugging recorder (installed for this thread only, so
//! the tests run in parallel and the eviction thread publishes nowhere).
#![cfg(feature = "metrics")]

mod common;

use common::block_on;
use expiremap::{ExpireMap, ManualClock, TryRecvError};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::collections::BTreeMap;
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);
const MINUTE: Duration = Duration::from_secs(60);

/// A series as `name{label="value",...}` (labels sorted), and its value:
/// a counter's count, a gauge's value, or a histogram's observations.
#[derive(Debug, PartialEq)]
enum Value {
    Count(u64),
    Gauge(f64),
    Observed(Vec<f64>),
}

/// Runs `f` with a debugging recorder as this thread's recorder; returns
/// every series it was handed.
fn recorded(f: impl FnOnce()) -> BTreeMap<String, Value> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, f);
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
                DebugValue::Histogram(h) => Value::Observed(h.into_iter().map(|v| v.0).collect()),
            };
            (name, value)
        })
        .collect()
}

fn series(list: &[(&str, Value)]) -> BTreeMap<String, Value> {
    list.iter()
        .map(|(k, v)| {
            let v = match v {
                Value::Count(n) => Value::Count(*n),
                Value::Gauge(g) => Value::Gauge(*g),
                Value::Observed(o) => Value::Observed(o.clone()),
            };
            (k.to_string(), v)
        })
        .collect()
}

#[test]
fn a_scripted_workload_publishes_exact_counts() {
    use Value::{Count, Gauge, Observed};
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .max_entries(4)
        .event_capacity(2)
        .refresh_after(Duration::from_secs(30))
        .metrics("users")
        .build();
    let mut events = map.subscribe().unwrap();
    let got = recorded(|| {
        // 3 puts; 2 hits and 1 miss.
        map.put(1, 10, MINUTE);
        map.put(2, 20, MS);
        map.put(3, 30, MINUTE);
        assert_eq!(map.get(&1), Some(10));
        assert_eq!(map.get(&9), None);
        assert_eq!(map.get(&1), Some(10));
        // Key 2 expires and is evicted 1 ms late (an `Expired` event).
        clock.advance(2 * MS);
        assert_eq!(map.evict_expired(), 1);
        // One explicit removal.
        assert_eq!(map.remove(&3), Some(30));
        // A load that takes 250 ms and one that fails after 500 ms: two
        // misses; the first stores its value (a put).
        let v = map.get_or_insert_with(4, MINUTE, || {
            clock.advance(250 * MS);
            40
        });
        assert_eq!(v, 40);
        let r = map.try_get_or_insert_with(5, MINUTE, || {
            clock.advance(500 * MS);
            Err("down")
        });
        assert_eq!(r, Err("down"));
        // Four new keys into a map of two entries bounded at four: two go
        // (refused or pushed out: two `Size` events).
        for k in 10..14 {
            map.put(k, k, MINUTE);
        }
        // The subscriber, two events behind a ring of two, lost one.
        assert_eq!(events.try_recv().unwrap_err(), TryRecvError::Lagged(1));
        map.publish_metrics();
    });
    assert_eq!(map.len(), 4);
    let s = map.stats();
    assert_eq!(s.size_evicted, 2, "{s:?}");
    assert_eq!(s.events_lost, 1, "{s:?}");
    let want = series(&[
        ("cache_gets_total{cache=\"users\",result=\"hit\"}", Count(2)),
        (
            "cache_gets_total{cache=\"users\",result=\"miss\"}",
            Count(3),
        ),
        // The one load that stored its value; plain puts are not counted
        // (Micrometer's meaning for Caffeine).
        ("cache_puts_total{cache=\"users\"}", Count(1)),
        (
            "cache_evictions_total{cache=\"users\",cause=\"expired\"}",
            Count(1),
        ),
        (
            "cache_evictions_total{cache=\"users\",cause=\"size\"}",
            Count(2),
        ),
        (
            "cache_evictions_total{cache=\"users\",cause=\"removed\"}",
            Count(1),
        ),
        ("cache_size{cache=\"users\"}", Gauge(4.0)),
        ("cache_weighted_size{cache=\"users\"}", Gauge(4.0)),
        (
            "cache_eviction_lateness_max_seconds{cache=\"users\"}",
            Gauge(0.001),
        ),
        ("cache_reloads_total{cache=\"users\"}", Count(0)),
        ("cache_reload_failures_total{cache=\"users\"}", Count(0)),
        ("cache_events_lost_total{cache=\"users\"}", Count(1)),
        (
            "cache_load_duration_seconds{cache=\"users\",result=\"success\"}",
            Observed(vec![0.25]),
        ),
        (
            "cache_load_duration_seconds{cache=\"users\",result=\"failure\"}",
            Observed(vec![0.5]),
        ),
    ]);
    assert_eq!(got, want);
}

#[test]
fn reloads_and_their_failures_are_counted_and_timed() {
    use Value::{Count, Observed};
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .refresh_after(Duration::from_secs(30))
        .metrics("rates")
        .build();
    let got = recorded(|| {
        map.put(1, 10, MINUTE);
        map.put(2, 20, MINUTE);
        clock.advance(Duration::from_secs(31));
        // Stale: each call returns the current value and reloads it here.
        let v = map.get_or_insert_with(1, MINUTE, || {
            clock.advance(100 * MS);
            11
        });
        assert_eq!(v, 10);
        let r = map.try_get_or_insert_with(2, MINUTE, || {
            clock.advance(200 * MS);
            Err("down")
        });
        assert_eq!(r, Ok(20));
        assert_eq!(map.get(&1), Some(11));
        map.publish_metrics();
    });
    let pick = |name: &str| {
        got.get(name)
            .unwrap_or_else(|| panic!("no {name} in {got:#?}"))
    };
    assert_eq!(pick("cache_reloads_total{cache=\"rates\"}"), &Count(2));
    assert_eq!(
        pick("cache_reload_failures_total{cache=\"rates\"}"),
        &Count(1)
    );
    assert_eq!(
        pick("cache_load_duration_seconds{cache=\"rates\",result=\"success\"}"),
        &Observed(vec![0.1])
    );
    assert_eq!(
        pick("cache_load_duration_seconds{cache=\"rates\",result=\"failure\"}"),
        &Observed(vec![0.2])
    );
    // Two stale hits and a fresh one; the reload that stored its value
    // (the failed one stored nothing; plain puts are not counted).
    assert_eq!(
        pick("cache_gets_total{cache=\"rates\",result=\"hit\"}"),
        &Count(3)
    );
    assert_eq!(pick("cache_puts_total{cache=\"rates\"}"), &Count(1));
}

#[test]
fn a_panicking_loader_is_a_failed_load() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .metrics("p")
        .build();
    let got = recorded(|| {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            map.get_or_insert_with(1, MINUTE, || {
                clock.advance(3 * MS);
                panic!("loader broke")
            })
        }));
        assert!(r.is_err());
    });
    let key = "cache_load_duration_seconds{cache=\"p\",result=\"failure\"}";
    assert_eq!(got.get(key), Some(&Value::Observed(vec![0.003])));
    assert_eq!(got.len(), 1, "{got:#?}");
}

#[test]
fn a_map_without_a_name_publishes_nothing() {
    let map = ExpireMap::<u32, u32>::builder()
        .background_eviction(false)
        .build();
    let got = recorded(|| {
        map.put(1, 1, MINUTE);
        map.get(&1);
        map.get_or_insert_with(2, MINUTE, || 2);
        map.publish_metrics();
    });
    assert!(got.is_empty(), "{got:#?}");
    assert_eq!(map.stats().hits, 0, "no name: record_stats stays off");
}

#[test]
fn the_last_handle_publishes_at_drop() {
    let map = ExpireMap::<u32, u32>::builder()
        .clock(ManualClock::new())
        .metrics("gone")
        .build();
    let other = map.clone();
    let got = recorded(|| {
        map.put(1, 1, MINUTE);
        map.get(&1);
        drop(map);
        other.get_or_insert_with(2, MINUTE, || 2);
        drop(other);
    });
    assert_eq!(
        got.get("cache_gets_total{cache=\"gone\",result=\"hit\"}"),
        Some(&Value::Count(1))
    );
    assert_eq!(
        got.get("cache_puts_total{cache=\"gone\"}"),
        Some(&Value::Count(1))
    );
    // Published before the last entries left at shutdown.
    assert_eq!(
        got.get("cache_size{cache=\"gone\"}"),
        Some(&Value::Gauge(2.0))
    );
}

/// Async loads are watched as the blocking ones are: timed by outcome,
/// and a stored value counted as a put. Polled on this thread (the
/// recorder is this thread's).
#[test]
fn async_loads_are_timed_and_counted() {
    use Value::{Count, Observed};
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .metrics("async")
        .build();
    let got = recorded(|| {
        block_on(async {
            let v = map
                .get_or_insert_with_async(1, MINUTE, async {
                    clock.advance(40 * MS);
                    10
                })
                .await;
            assert_eq!(v, 10);
            let r = map
                .try_get_or_insert_with_async(2, MINUTE, async {
                    clock.advance(60 * MS);
                    Err("down")
                })
                .await;
            assert!(r.is_err());
            let many = map
                .get_many_with_async(&[3, 4], MINUTE, |keys: &[u32]| {
                    let pairs: Vec<(u32, u32)> = keys.iter().map(|&k| (k, k * 10)).collect();
                    let clock = clock.clone();
                    async move {
                        clock.advance(80 * MS);
                        pairs
                    }
                })
                .await;
            assert_eq!(many, [30, 40]);
        });
        map.publish_metrics();
    });
    let pick = |name: &str| {
        got.get(name)
            .unwrap_or_else(|| panic!("no {name} in {got:#?}"))
    };
    assert_eq!(
        pick("cache_load_duration_seconds{cache=\"async\",result=\"success\"}"),
        &Observed(vec![0.04, 0.08])
    );
    assert_eq!(
        pick("cache_load_duration_seconds{cache=\"async\",result=\"failure\"}"),
        &Observed(vec![0.06])
    );
    // The single load and the bulk load stored values: one put each.
    assert_eq!(pick("cache_puts_total{cache=\"async\"}"), &Count(2));
}

/// The one test that installs a global recorder (the others' local ones
/// take precedence on their threads): what the eviction thread publishes.
#[test]
fn the_eviction_thread_publishes_each_second_without_an_early_pass() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let hits = |snapshotter: &metrics_util::debugging::Snapshotter| {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .find_map(|(k, _, _, v)| {
                let key = k.key();
                let ours = key.name() == "cache_gets_total"
                    && key
                        .labels()
                        .any(|l| l.key() == "cache" && l.value() == "thread")
                    && key
                        .labels()
                        .any(|l| l.key() == "result" && l.value() == "hit");
                match v {
                    DebugValue::Counter(n) if ours => Some(n),
                    _ => None,
                }
            })
    };
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .metrics("thread")
        .build();
    map.put(1, 1, 2 * Duration::from_secs(1));
    assert_eq!(map.get(&1), Some(1));
    clock.advance(Duration::from_secs(1));
    // The thread publishes on its own (it was told the time changed).
    let published = std::thread::scope(|s| {
        s.spawn(|| {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                if let Some(n) = hits(&snapshotter) {
                    return n;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "nothing published in 60 s"
                );
                std::thread::sleep(MS);
            }
        })
        .join()
        .unwrap()
    });
    assert_eq!(published, 1);
    // Publishing made no pass: the entry is due only at 2 s.
    assert_eq!(map.stats().passes, 0);
    assert_eq!(map.len(), 1);
}

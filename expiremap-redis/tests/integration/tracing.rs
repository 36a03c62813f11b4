//! The `tracing` feature (`.ci/redis.sh` runs it): a span around each load
//! with its outcome and duration, one around a lease wait, `warn` events
//! for a failed load and a failed call, nothing for a near hit, against a
//! real `redis-server`; and the `warn` events of a cache's own threads
//! (a reconnect, a slot-table change), each naming the node. A subscriber
//! of our own records what it is handed on the test's thread
//! (`with_default`); the events of the cache's threads go to a global one
//! ([`watch`]), which keeps only the warnings that name a node a test
//! watches (each test's servers have ports of their own). No timing is
//! asserted.
#![cfg(feature = "tracing")]

use crate::common::cluster::Cluster;
use crate::common::{Server, eventually, within};
use expiremap_redis::NearCache;
use std::sync::{Arc, Mutex, Once, mpsc};
use std::thread;
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

const HOUR: Duration = Duration::from_secs(3600);

type Cache = NearCache<String, u64>;

/// A span's name and its fields as `name=value`, in recording order.
#[derive(Debug, Default)]
struct Seen {
    spans: Vec<(String, Vec<String>)>,
    /// Each event: its level, fields, and the span it was in (an index
    /// into `spans`).
    events: Vec<(Level, Vec<String>, Option<usize>)>,
    current: Vec<usize>,
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Seen>>);

struct Fields<'a>(&'a mut Vec<String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push(format!("{}={:?}", field.name(), value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push(format!("{}={}", field.name(), value));
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut seen = self.0.lock().unwrap();
        let mut fields = Vec::new();
        span.record(&mut Fields(&mut fields));
        seen.spans
            .push((span.metadata().name().to_string(), fields));
        Id::from_u64(seen.spans.len() as u64)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut seen = self.0.lock().unwrap();
        let i = span.into_u64() as usize - 1;
        values.record(&mut Fields(&mut seen.spans[i].1));
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut seen = self.0.lock().unwrap();
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        let inside = seen.current.last().copied();
        seen.events
            .push((*event.metadata().level(), fields, inside));
    }
    fn enter(&self, span: &Id) {
        self.0
            .lock()
            .unwrap()
            .current
            .push(span.into_u64() as usize - 1);
    }
    fn exit(&self, _: &Id) {
        self.0.lock().unwrap().current.pop();
    }
}

impl Recorder {
    /// The number of spans and events seen so far.
    fn counts(&self) -> (usize, usize) {
        let seen = self.0.lock().unwrap();
        (seen.spans.len(), seen.events.len())
    }
}

fn cache(s: &Server) -> Cache {
    NearCache::builder(s.url())
        .prefix("t:")
        .staleness_bound(HOUR)
        .build()
        .expect("connect")
}

#[test]
fn loads_and_lease_waits_have_spans_failures_warn_and_near_hits_are_silent() {
    let s = Server::start();
    let a = Arc::new(cache(&s));
    let b = Arc::new(cache(&s));
    let k = |k: &str| k.to_string();
    let recorder = Recorder::default();
    // A second dispatcher, alive for the whole test: with only one in the
    // process, `tracing` asks the subscriber of the thread that first
    // reaches a call site whether it is of interest (here a thread without
    // one: a cache's, another test's, `b`'s holder) and keeps "never".
    let _second = tracing::Dispatch::new(Recorder::default());
    tracing::subscriber::with_default(recorder.clone(), || {
        // A put and near hits: nothing.
        a.put(k("a"), 1, HOUR).unwrap();
        assert_eq!(a.get(&k("a")).unwrap(), Some(1));
        assert_eq!(a.get_or_insert_with(k("a"), HOUR, || 0).unwrap(), 1);
        assert_eq!(recorder.counts(), (0, 0));

        // A load: the core's span, and ours inside it.
        assert_eq!(a.get_or_insert_with(k("x"), HOUR, || 5).unwrap(), 5);
        assert_eq!(recorder.counts(), (2, 0));

        // A failed load: both spans say so, each with a warning inside.
        let r = a.try_get_or_insert_with(k("f"), HOUR, || {
            Err(expiremap_redis::Error::Config("down".into()))
        });
        assert!(r.is_err());
        assert_eq!(recorder.counts(), (4, 2));

        // A lease wait: `b` holds the lease of `h` until `a` waits (its
        // span seen), then fails and gives it back; `a` takes it and loads.
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
        let watcher = {
            let recorder = recorder.clone();
            thread::spawn(move || {
                eventually("a waits for the lease", || {
                    let seen = recorder.0.lock().unwrap();
                    seen.spans
                        .iter()
                        .any(|(n, _)| n == "expiremap_redis.lease_wait")
                        .then_some(())
                });
                fail.send(()).unwrap();
            })
        };
        assert_eq!(a.get_or_insert_with(k("h"), HOUR, || 7).unwrap(), 7);
        watcher.join().unwrap();
        assert!(holder.join().unwrap().is_err());
        assert_eq!(recorder.counts(), (7, 2));

        // A failed call (`WRONGTYPE`): a warning naming the server.
        let _: () = redis::cmd("HSET")
            .arg(b"t:\x01w")
            .arg("f")
            .arg("v")
            .query(&mut s.raw())
            .unwrap();
        assert!(a.get(&k("w")).is_err());
    });
    let seen = recorder.0.lock().unwrap();
    let names: Vec<&str> = seen.spans.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "expiremap.load",
            "expiremap_redis.load",
            "expiremap.load",
            "expiremap_redis.load",
            "expiremap.load",
            "expiremap_redis.load",
            "expiremap_redis.lease_wait",
        ],
        "{seen:#?}"
    );
    let has = |i: usize, f: &str| seen.spans[i].1.iter().any(|s| s == f);
    let field = |i: usize, name: &str| {
        seen.spans[i]
            .1
            .iter()
            .find(|s| s.starts_with(&format!("{name}=")))
            .cloned()
    };
    for i in [1, 3, 5] {
        assert!(has(i, "leased=true"), "{seen:#?}");
        assert!(field(i, "key_hash").is_some() && field(i, "duration_us").is_some());
    }
    assert!(has(1, "outcome=success") && has(5, "outcome=success"));
    assert!(has(3, "outcome=failure"));
    // The wait is inside `h`'s load, and names the same key.
    assert_eq!(field(6, "key_hash"), field(5, "key_hash"));
    assert_ne!(field(1, "key_hash"), field(5, "key_hash"));
    assert!(field(6, "patience_ms").is_some());
    // Warnings: the failed load (inside our span, then inside the core's)
    // and the failed call (in no span), naming the server.
    let warns: Vec<_> = seen.events.iter().collect();
    assert_eq!(warns.len(), 3, "{seen:#?}");
    assert!(warns.iter().all(|(l, _, _)| *l == Level::WARN));
    assert_eq!(
        (warns[0].2, warns[1].2, warns[2].2),
        (Some(3), Some(2), None)
    );
    let call = warns[2].1.join(" ");
    assert!(
        call.contains("a call failed")
            && call.contains("result=error")
            && call.contains(&format!(
                "node=server 127.0.0.1:{}",
                s.url().rsplit(':').next().unwrap()
            )),
        "{call}"
    );
}

/// The global subscriber: `warn` (and `error`) events from any thread, kept
/// when a field names a node that a test watches; spans and other events
/// are not of interest (so the other tests' loads cost nothing here).
struct Warnings;

/// The nodes watched (`127.0.0.1:<port>`) and each warning kept: its
/// fields as `name=value` (the text as `message=...`).
static WATCHED: Mutex<Vec<String>> = Mutex::new(Vec::new());
static WARNED: Mutex<Vec<Vec<String>>> = Mutex::new(Vec::new());

impl Subscriber for Warnings {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.is_event() && *m.level() <= Level::WARN
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        let watched = WATCHED.lock().unwrap();
        if fields
            .iter()
            .any(|f| watched.iter().any(|w| f.contains(w.as_str())))
        {
            WARNED.lock().unwrap().push(fields);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Keeps the warnings that name `127.0.0.1:<port>` for each port (the
/// global subscriber installed by the first call).
fn watch(ports: &[u16]) {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        tracing::subscriber::set_global_default(Warnings).expect("no other global subscriber")
    });
    let mut watched = WATCHED.lock().unwrap();
    watched.extend(ports.iter().map(|p| format!("127.0.0.1:{p}")));
}

/// The warnings kept so far with a field that contains `what`.
fn warned(what: &str) -> Vec<Vec<String>> {
    WARNED
        .lock()
        .unwrap()
        .iter()
        .filter(|fields| fields.iter().any(|f| f.contains(what)))
        .cloned()
        .collect()
}

/// The text of a warning (its `message` field).
fn message(fields: &[String]) -> &str {
    fields
        .iter()
        .find_map(|f| f.strip_prefix("message="))
        .unwrap_or("")
}

/// A connection the server drops (`CLIENT KILL`): the supervisor warns
/// that it was lost, then that it reconnected, each naming the server.
#[test]
fn a_reconnect_warns_naming_the_server() {
    let s = Server::start();
    watch(&[s.port]);
    let node = format!("node=server 127.0.0.1:{}", s.port);
    let a = cache(&s);
    a.put("k".to_string(), 1, HOUR).unwrap();
    assert_eq!(a.get(&"k".to_string()).unwrap(), Some(1));
    // The first connection is no reconnect.
    assert_eq!(warned(&node), Vec::<Vec<String>>::new());
    let _: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut s.raw())
        .unwrap();
    let seen = eventually("a reconnect is reported", || {
        let seen = warned(&node);
        seen.iter()
            .any(|w| message(w) == "expiremap-redis: reconnected")
            .then_some(seen)
    });
    let texts: Vec<&str> = seen.iter().map(|w| message(w)).collect();
    assert_eq!(
        texts,
        [
            "expiremap-redis: the connection was lost; near copies dropped, reconnecting",
            "expiremap-redis: reconnected",
        ],
        "{seen:#?}"
    );
    // Each names the server (by the field that `warned` matched).
    assert!(seen.iter().all(|w| w.contains(&node)), "{seen:#?}");
    assert_eq!(a.get(&"k".to_string()).unwrap(), Some(1));
}

/// A slot moved to another primary (`CLUSTER SETSLOT`, as a reshard does
/// for a slot with no keys): the cache's slot-table reader warns that the
/// table changed, naming the node whose table it took.
#[test]
fn a_slot_table_change_warns_naming_the_node() {
    let c = Cluster::start(3);
    let ports: Vec<u16> = c.nodes.iter().map(|n| n.port).collect();
    watch(&ports);
    let a: Cache = NearCache::cluster_builder(c.urls())
        .prefix("t:")
        .staleness_bound(HOUR)
        .build()
        .expect("a cluster cache");
    a.put("k".to_string(), 1, HOUR).unwrap();
    let changed = "message=expiremap-redis: the slot table changed; near copies dropped";
    // The table read at the start is no change.
    assert_eq!(warned(changed), Vec::<Vec<String>>::new());
    let slot = c.slots_of(0, 0)[0];
    let from = c.owner(0, slot);
    let to = (from + 1) % 3;
    c.start_migration(slot, from, to);
    c.finish_migration(slot, to);
    let seen = eventually("the change is reported", || {
        let seen = warned(changed);
        (!seen.is_empty()).then_some(seen)
    });
    for w in &seen {
        let by = w.iter().find_map(|f| f.strip_prefix("by=cluster node "));
        assert!(
            by.is_some_and(|by| ports.iter().any(|p| by == format!("127.0.0.1:{p}"))),
            "{seen:#?}"
        );
        assert!(w.iter().any(|f| f.starts_with("ranges=")), "{seen:#?}");
    }
    assert_eq!(c.owner(to, slot), to);
    assert_eq!(a.get(&"k".to_string()).unwrap(), Some(1));
}

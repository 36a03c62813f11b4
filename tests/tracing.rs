//! The `tracing` feature (`.ci/test.sh` runs it): a span around each load
//! and reload with its outcome and duration, a `warn` event for a failed
//! one, nothing for a hit. A subscriber of our own records what it is
//! handed (for this thread only: `with_default`).
#![cfg(feature = "tracing")]

use expiremap::{ExpireMap, ManualClock};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

const MINUTE: Duration = Duration::from_secs(60);

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

#[test]
fn loads_have_spans_failures_warn_and_hits_are_silent() {
    let clock = ManualClock::new();
    let map = ExpireMap::<u32, u32>::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .refresh_after(Duration::from_secs(30))
        .build();
    let recorder = Recorder::default();
    tracing::subscriber::with_default(recorder.clone(), || {
        map.put(1, 10, MINUTE);
        assert_eq!(map.get(&1), Some(10)); // a hit: nothing
        assert_eq!(map.get_or_insert_with(1, MINUTE, || 0), 10); // a hit
        let v = map.get_or_insert_with(2, MINUTE, || {
            clock.advance(Duration::from_millis(7));
            20
        });
        assert_eq!(v, 20);
        let r = map.try_get_or_insert_with(3, MINUTE, || Err("down"));
        assert_eq!(r, Err("down"));
        clock.advance(Duration::from_secs(31));
        assert_eq!(map.get_or_insert_with(1, MINUTE, || 11), 10); // a reload
        let many = map.get_many_with(&[4, 5], MINUTE, |ks| ks.iter().map(|&k| (k, k)).collect());
        assert_eq!(many, [4, 5]);
    });
    let seen = recorder.0.lock().unwrap();
    let spans: Vec<_> = seen.spans.iter().collect();
    assert_eq!(spans.len(), 4, "{seen:#?}");
    assert!(spans.iter().all(|(name, _)| name == "expiremap.load"));
    let has = |i: usize, f: &str| spans[i].1.iter().any(|s| s == f);
    assert!(has(0, "kind=load") && has(0, "outcome=success") && has(0, "duration_us=7000"));
    assert!(has(1, "kind=load") && has(1, "outcome=failure"));
    assert!(has(2, "kind=reload") && has(2, "outcome=success"));
    assert!(has(3, "kind=bulk") && has(3, "keys=2") && has(3, "outcome=success"));
    assert!(
        spans[..3]
            .iter()
            .all(|(_, f)| f.iter().any(|s| s.starts_with("key_hash=")))
    );
    // One warning, inside the failed load's span.
    assert_eq!(seen.events.len(), 1, "{seen:#?}");
    let (level, fields, inside) = &seen.events[0];
    assert_eq!((*level, *inside), (Level::WARN, Some(1)));
    assert!(fields.iter().any(|f| f == "outcome=failure"), "{fields:?}");
}

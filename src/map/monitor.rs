//! Monitoring: what the cargo features `metrics` and `tracing` add (see
//! "Monitoring" in the crate docs for the names a user sees).
//!
//! # Ground rules
//!
//! * **Nothing published from `get` or `put`, and nothing added to
//!   them.** The series come from the counters the map keeps anyway
//!   ([`Stats`](super::Stats), `len`, the weighted size) and from counts
//!   kept off those paths (values removed, loads stored): by the eviction
//!   thread at least once a second, when the last handle is dropped, and
//!   on [`ExpireMap::publish_metrics`]. A `get` counts what `record_stats`
//!   counts; a `put` runs the same instructions as without the feature.
//! * **`cache_puts_total` counts loads that stored a value**, the meaning
//!   Micrometer's Caffeine binder gives it (Caffeine counts no puts, so
//!   the binder reports its load count): a loader, reload or bulk loader
//!   that returned its value(s), once per run. A plain `put` is not
//!   counted, which is what keeps the put path as it is.
//! * **No lock held while the recorder runs.** The recorder is user code:
//!   [`Inner::publish`] reads every count first (each shard's read lock in
//!   turn, released before the next), then calls it.
//! * **Loads are timed only when someone asks.** A load's two clock reads
//!   (around its `init`) happen only if the map has a metrics name or the
//!   load's span is enabled; its duration is recorded when `init` returns,
//!   with no lock held.
//!
//! [`ExpireMap::publish_metrics`]: super::ExpireMap::publish_metrics

use super::Inner;
#[cfg(any(feature = "metrics", feature = "tracing"))]
use crate::clock::Time;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;

/// The least often the eviction thread publishes a map's metrics: once a
/// second, the scrape interval of the most eager dashboards.
#[cfg(feature = "metrics")]
pub(super) const PUBLISH_EVERY: u64 = 1_000_000_000;

/// A map's metrics name (the `cache` label) and the counts only metrics
/// need.
#[cfg(feature = "metrics")]
#[derive(Debug)]
pub(crate) struct Metrics {
    pub(super) name: metrics::SharedString,
    /// Values that left by the `Removed` door (`remove`, `clear`,
    /// `retain`, an `update` that removes).
    pub(super) removed: crate::sync::AtomicU64,
    /// Loader runs that returned their value(s) and stored them: the
    /// `cache_puts_total` series (see the module docs).
    pub(super) loaded: crate::sync::AtomicU64,
    /// When the map was built (clock ns).
    pub(super) built: u64,
}

#[cfg(feature = "metrics")]
impl Metrics {
    pub(super) fn new(name: metrics::SharedString, built: u64) -> Self {
        Self {
            name,
            removed: crate::sync::AtomicU64::new(0),
            loaded: crate::sync::AtomicU64::new(0),
            built,
        }
    }
}

/// What a load ran: one key's loader, a refresh-ahead reload, or a bulk
/// loader of several keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LoadKind {
    Load,
    Reload,
    Bulk,
}

impl LoadKind {
    #[cfg(feature = "tracing")]
    fn name(self) -> &'static str {
        match self {
            LoadKind::Load => "load",
            LoadKind::Reload => "reload",
            LoadKind::Bulk => "bulk",
        }
    }
}

/// Watches one run of a loader: started before `init` runs, ended with its
/// outcome ([`end`](Self::end)); dropped without an end (`init` panicked,
/// or its future was dropped), it records a failure, so the recorder and
/// the subscriber also run while `init`'s panic unwinds (a panic of theirs
/// then aborts, as any panic in a `Drop` during unwinding does). Without
/// the features it is empty and every method does nothing.
pub(super) struct LoadWatch<'a> {
    #[cfg(any(feature = "metrics", feature = "tracing"))]
    clock: &'a Time,
    #[cfg(feature = "metrics")]
    metrics: Option<&'a Metrics>,
    /// When `init` started (clock ns), if anyone wants the duration.
    #[cfg(any(feature = "metrics", feature = "tracing"))]
    start: Option<u64>,
    #[cfg(feature = "tracing")]
    span: tracing::Span,
    #[cfg(any(feature = "metrics", feature = "tracing"))]
    ended: bool,
    _map: PhantomData<&'a ()>,
}

impl<K, V, S> Inner<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// Starts watching a load of `kind`: of the key whose hash is `hash`,
    /// or (bulk) of `keys` keys.
    #[allow(unused_variables)] // without the features nothing is watched
    pub(super) fn load_watch(&self, kind: LoadKind, hash: u64, keys: usize) -> LoadWatch<'_> {
        #[cfg(feature = "tracing")]
        let span = {
            let span = tracing::debug_span!(
                "expiremap.load",
                kind = kind.name(),
                key_hash = tracing::field::Empty,
                keys = tracing::field::Empty,
                outcome = tracing::field::Empty,
                duration_us = tracing::field::Empty,
            );
            if kind == LoadKind::Bulk {
                span.record("keys", keys);
            } else {
                span.record("key_hash", hash);
            }
            span
        };
        #[cfg(any(feature = "metrics", feature = "tracing"))]
        let timed = {
            #[cfg(feature = "metrics")]
            let timed = self.metrics.is_some();
            #[cfg(not(feature = "metrics"))]
            let timed = false;
            #[cfg(feature = "tracing")]
            let timed = timed || !span.is_disabled();
            timed
        };
        LoadWatch {
            #[cfg(any(feature = "metrics", feature = "tracing"))]
            clock: &self.clock,
            #[cfg(feature = "metrics")]
            metrics: self.metrics.as_ref(),
            #[cfg(any(feature = "metrics", feature = "tracing"))]
            start: timed.then(|| self.clock.now()),
            #[cfg(feature = "tracing")]
            span,
            #[cfg(any(feature = "metrics", feature = "tracing"))]
            ended: false,
            _map: PhantomData,
        }
    }
}

impl LoadWatch<'_> {
    /// Runs the loader `f` (inside the load's span).
    #[inline]
    pub(super) fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        #[cfg(feature = "tracing")]
        let _entered = self.span.enter();
        f()
    }

    /// Awaits the loader's future `f` (inside the load's span).
    pub(super) async fn run_async<F: std::future::Future>(&self, f: F) -> F::Output {
        #[cfg(feature = "tracing")]
        {
            use tracing::Instrument;
            f.instrument(self.span.clone()).await
        }
        #[cfg(not(feature = "tracing"))]
        f.await
    }

    /// The loader returned: a value (`ok`) or an error (or `None`).
    #[allow(unused_variables, unused_mut)] // without the features nothing is recorded
    pub(super) fn end(mut self, ok: bool) {
        #[cfg(any(feature = "metrics", feature = "tracing"))]
        self.record(if ok { "success" } else { "failure" });
    }

    #[cfg(any(feature = "metrics", feature = "tracing"))]
    fn record(&mut self, outcome: &'static str) {
        self.ended = true;
        let took = self
            .start
            .map(|start| std::time::Duration::from_nanos(self.clock.now().saturating_sub(start)));
        #[cfg(feature = "metrics")]
        if let (Some(m), Some(took)) = (self.metrics, took) {
            let result = if outcome == "success" {
                m.loaded.fetch_add(1, crate::sync::Ordering::Relaxed);
                "success"
            } else {
                "failure"
            };
            metrics::histogram!(
                "cache_load_duration_seconds",
                "cache" => m.name.clone(),
                "result" => result
            )
            .record(took.as_secs_f64());
        }
        #[cfg(feature = "tracing")]
        {
            self.span.record("outcome", outcome);
            if let Some(took) = took {
                self.span.record("duration_us", took.as_micros() as u64);
            }
            if outcome != "success" {
                let _entered = self.span.enter();
                tracing::warn!(outcome, "expiremap: a load failed");
            }
        }
    }
}

impl Drop for LoadWatch<'_> {
    fn drop(&mut self) {
        #[cfg(any(feature = "metrics", feature = "tracing"))]
        if !self.ended {
            // `init` panicked (its caller gets the panic), or its future
            // was dropped before it ended.
            self.record(if std::thread::panicking() {
                "panicked"
            } else {
                "cancelled"
            });
        }
    }
}

impl std::fmt::Debug for LoadWatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadWatch").finish_non_exhaustive()
    }
}

/// Publishing: every series from the map's counters, with no lock held
/// while the recorder runs.
#[cfg(feature = "metrics")]
impl<K, V, S> Inner<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// Publishes every series of the map to the recorder in force on this
    /// thread (`metrics::with_local_recorder`'s, else the global one), if
    /// the map has a metrics name. Counters are published as absolute
    /// values (the running totals), gauges set.
    pub(super) fn publish(&self) {
        use crate::sync::Ordering;
        use metrics::{counter, gauge};
        let Some(m) = &self.metrics else {
            return;
        };
        // Every count first, each shard lock released before the next...
        let s = self.stats();
        let puts = m.loaded.load(Ordering::Relaxed);
        let size = self.len() as f64;
        let weighted = self.weighted_size() as f64;
        let removed = m.removed.load(Ordering::Relaxed);
        // ...then the recorder, with no lock held.
        describe();
        let cache = || m.name.clone();
        counter!("cache_gets_total", "cache" => cache(), "result" => "hit").absolute(s.hits);
        counter!("cache_gets_total", "cache" => cache(), "result" => "miss").absolute(s.misses);
        counter!("cache_puts_total", "cache" => cache()).absolute(puts);
        for (cause, n) in [
            ("expired", s.evicted),
            ("size", s.size_evicted),
            ("removed", removed),
        ] {
            counter!("cache_evictions_total", "cache" => cache(), "cause" => cause).absolute(n);
        }
        gauge!("cache_size", "cache" => cache()).set(size);
        gauge!("cache_weighted_size", "cache" => cache()).set(weighted);
        gauge!("cache_eviction_lateness_max_seconds", "cache" => cache())
            .set(s.max_lateness.as_secs_f64());
        counter!("cache_reloads_total", "cache" => cache()).absolute(s.refreshes);
        counter!("cache_reload_failures_total", "cache" => cache()).absolute(s.refresh_failures);
        counter!("cache_events_lost_total", "cache" => cache()).absolute(s.events_lost);
    }
}

/// The series' help texts (for the exporters that render them).
#[cfg(feature = "metrics")]
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "cache_gets_total",
        "Reads: result=hit found a live value, miss did not"
    );
    describe_counter!(
        "cache_puts_total",
        "Loads that stored their value (Micrometer's meaning for Caffeine); plain puts are not counted"
    );
    describe_counter!(
        "cache_evictions_total",
        "Values that left: cause=expired (deadline), size (bound), removed (explicit)"
    );
    describe_gauge!(
        "cache_size",
        "Entries held, expired ones not yet evicted included"
    );
    describe_gauge!("cache_weighted_size", "What the entries held weigh");
    describe_gauge!(
        "cache_eviction_lateness_max_seconds",
        Unit::Seconds,
        "The latest any eviction of an expired entry came after its deadline"
    );
    describe_counter!("cache_reloads_total", "Reloads started by refresh ahead");
    describe_counter!("cache_reload_failures_total", "Reloads that failed");
    describe_counter!(
        "cache_events_lost_total",
        "Events subscribers lost by falling a ring behind"
    );
    describe_histogram!(
        "cache_load_duration_seconds",
        Unit::Seconds,
        "Time a loader took: result=success returned a value, failure did not"
    );
}

//! Monitoring: what the cargo features `metrics` and `tracing` add (see
//! "Monitoring" in the crate docs for the names a user sees).
//!
//! # Ground rules (the core crate's)
//!
//! * **Nothing on the hit paths.** A near hit reads no counter of ours and
//!   writes none. The Redis tier's counts ([`Counters`]) are kept where a
//!   network round trip or a server push already happens (a call's end, an
//!   invalidation, a reconnect, a lease wait): a relaxed atomic add beside
//!   a round trip. The near map's own series come from the core crate.
//! * **Published from the counts, not from calls.** Counters are
//!   published as running totals by a link's supervisor thread at least
//!   once a second, by [`NearCache::publish_metrics`], and when the cache
//!   is dropped. A call's duration is the one thing recorded as it
//!   happens, and only in a cache with a metrics name (two clock reads).
//! * **No lock of ours held while the recorder or a subscriber runs.**
//!
//! [`NearCache::publish_metrics`]: crate::NearCache::publish_metrics

use crate::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The least often a supervisor publishes the Redis tier's counters: once
/// a second (the core crate's eviction thread does the same for the near
/// map).
#[cfg(feature = "metrics")]
const PUBLISH_EVERY_NS: u64 = 1_000_000_000;

/// The Redis tier's counts of a cache, shared by its links (through their
/// [`Config`](crate::connect::Config)) and the cache.
#[derive(Debug)]
pub(crate) struct Counters {
    /// Calls that ended with a reply (`ok`), with an error that is no
    /// timeout (`error`), with a timeout (`timeout`).
    calls: [AtomicU64; 3],
    /// Keys the server told us were written elsewhere (a flush counts one).
    pub(crate) invalidations: AtomicU64,
    /// Connections made after one was lost.
    pub(crate) reconnects: AtomicU64,
    /// Waits for a lease held elsewhere.
    pub(crate) lease_waits: AtomicU64,
    /// Leases taken after waiting (the holder's value never came: it
    /// failed, or its lease lapsed).
    pub(crate) lease_takeovers: AtomicU64,
    /// The `cache` label, from `Builder::metrics`.
    #[cfg(feature = "metrics")]
    name: Option<metrics::SharedString>,
    /// When the counters were last published (ns since `epoch`).
    #[cfg(feature = "metrics")]
    published: AtomicU64,
    #[cfg(feature = "metrics")]
    epoch: Instant,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            calls: Default::default(),
            invalidations: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            lease_waits: AtomicU64::new(0),
            lease_takeovers: AtomicU64::new(0),
            #[cfg(feature = "metrics")]
            name: None,
            #[cfg(feature = "metrics")]
            published: AtomicU64::new(0),
            #[cfg(feature = "metrics")]
            epoch: Instant::now(),
        }
    }
}

/// How a call ended, as the `result` label says it.
#[cfg(any(feature = "metrics", feature = "tracing"))]
const RESULTS: [&str; 3] = ["ok", "error", "timeout"];

impl Counters {
    /// Counters labelled `cache = name`.
    #[cfg(feature = "metrics")]
    pub(crate) fn named(name: metrics::SharedString) -> Self {
        Self {
            name: Some(name),
            ..Self::default()
        }
    }

    /// Adds one to `c`.
    #[inline]
    pub(crate) fn add(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// When a call starts: the time, if its duration is recorded (only in
    /// a cache with a metrics name).
    #[inline]
    pub(crate) fn call_started(&self) -> Option<Instant> {
        #[cfg(feature = "metrics")]
        if self.name.is_some() {
            return Some(Instant::now());
        }
        None
    }

    /// A call (a command and its redirects) ended with `r`: counted by
    /// outcome, timed if `started`, and a `warn` event if it failed (its
    /// error names the node). A key or value that does not encode ends it
    /// before anything is sent: no call, not counted.
    #[allow(unused_variables)] // without `metrics`, `started` is always None
    pub(crate) fn call_ended<T>(&self, r: &Result<T, Error>, started: Option<Instant>) {
        let i = match r {
            Err(Error::Codec(c)) if c.encoding => return,
            Ok(_) => 0,
            Err(e) if e.is_timeout() => 2,
            Err(_) => 1,
        };
        Self::add(&self.calls[i]);
        #[cfg(feature = "metrics")]
        if let (Some(name), Some(started)) = (&self.name, started) {
            metrics::histogram!("cache_redis_call_duration_seconds", "cache" => name.clone())
                .record(started.elapsed().as_secs_f64());
        }
        #[cfg(feature = "tracing")]
        if let Err(e) = r {
            tracing::warn!(
                result = RESULTS[i],
                node = e.node(),
                error = %e,
                "expiremap-redis: a call failed"
            );
        }
    }

    /// Calls ended so far, by outcome (`ok`, `error`, `timeout`).
    #[cfg(feature = "metrics")]
    pub(crate) fn calls(&self) -> [u64; 3] {
        [0, 1, 2].map(|i| self.calls[i].load(Ordering::Relaxed))
    }
}

/// Publishing (the `metrics` feature).
#[cfg(feature = "metrics")]
impl Counters {
    /// Publishes if the last publication is a second old or more (and the
    /// cache has a name): from a supervisor's loop, with no lock held.
    /// Several supervisors (a cluster's) publish once between them.
    pub(crate) fn publish_due(&self) {
        if self.name.is_none() {
            return;
        }
        let now = self.epoch.elapsed().as_nanos() as u64;
        let last = self.published.load(Ordering::Relaxed);
        if now.saturating_sub(last) < PUBLISH_EVERY_NS {
            return;
        }
        if self
            .published
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.publish();
        }
    }

    /// Publishes every counter (running totals) to the recorder in force
    /// on this thread, if the cache has a name.
    pub(crate) fn publish(&self) {
        use metrics::counter;
        let Some(name) = &self.name else { return };
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let calls = self.calls();
        describe();
        for (result, n) in RESULTS.into_iter().zip(calls) {
            counter!("cache_redis_calls_total", "cache" => name.clone(), "result" => result)
                .absolute(n);
        }
        for (series, c) in [
            ("cache_invalidations_total", &self.invalidations),
            ("cache_reconnects_total", &self.reconnects),
            ("cache_lease_waits_total", &self.lease_waits),
            ("cache_lease_takeovers_total", &self.lease_takeovers),
        ] {
            counter!(series, "cache" => name.clone()).absolute(load(c));
        }
    }
}

/// The series' help texts (for the exporters that render them).
#[cfg(feature = "metrics")]
fn describe() {
    use metrics::{Unit, describe_counter, describe_histogram};
    describe_counter!(
        "cache_redis_calls_total",
        "Calls to Redis (redirects followed): result=ok got a reply, error an error, timeout none in time"
    );
    describe_histogram!(
        "cache_redis_call_duration_seconds",
        Unit::Seconds,
        "How long each call to Redis took, redirects included"
    );
    describe_counter!(
        "cache_invalidations_total",
        "Keys the server said were written elsewhere (a flush counts one)"
    );
    describe_counter!(
        "cache_reconnects_total",
        "Connections made after one was lost"
    );
    describe_counter!(
        "cache_lease_waits_total",
        "Waits for a load's lease held by another process"
    );
    describe_counter!(
        "cache_lease_takeovers_total",
        "Leases taken after a wait: the holder's value never came"
    );
}

/// The `debug` span `expiremap_redis.load` of a leader's load (the
/// `tracing` feature): the key's hash (of its Redis name, so equal across
/// the fleet), whether it is leased, and when it ends its outcome and
/// duration, with a `warn` event inside it for a load that failed.
/// Dropped without an [`end`](Self::end) (the loader panicked, or the
/// load's future was dropped), it records that. Without the feature it is
/// empty.
pub(crate) struct LoadSpan {
    #[cfg(feature = "tracing")]
    span: tracing::Span,
    /// When the load started, if the span is enabled.
    #[cfg(feature = "tracing")]
    start: Option<Instant>,
}

impl LoadSpan {
    /// Opens the span of a load of the key named `name()` in Redis
    /// (called only if the span is enabled); `leased`: with a lease.
    #[allow(unused_variables)]
    #[inline]
    pub(crate) fn new(name: impl FnOnce() -> Option<Vec<u8>>, leased: bool) -> Self {
        #[cfg(feature = "tracing")]
        {
            let span = tracing::debug_span!(
                "expiremap_redis.load",
                key_hash = tracing::field::Empty,
                leased,
                outcome = tracing::field::Empty,
                duration_us = tracing::field::Empty,
            );
            let start = (!span.is_disabled()).then(|| {
                if let Some(name) = name() {
                    span.record("key_hash", name_hash(&name));
                }
                Instant::now()
            });
            Self { span, start }
        }
        #[cfg(not(feature = "tracing"))]
        Self {}
    }

    /// Runs `f` inside the span.
    #[inline]
    pub(crate) fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        #[cfg(feature = "tracing")]
        let _entered = self.span.enter();
        f()
    }

    /// Awaits `f` inside the span.
    pub(crate) async fn run_async<F: std::future::Future>(&self, f: F) -> F::Output {
        #[cfg(feature = "tracing")]
        {
            use tracing::Instrument;
            f.instrument(self.span.clone()).await
        }
        #[cfg(not(feature = "tracing"))]
        f.await
    }

    /// The load ended: with a value (`ok`) or an error.
    #[allow(unused_variables, unused_mut)]
    pub(crate) fn end(mut self, ok: bool) {
        #[cfg(feature = "tracing")]
        self.record(if ok { "success" } else { "failure" });
    }

    #[cfg(feature = "tracing")]
    fn record(&mut self, outcome: &'static str) {
        let Some(start) = self.start.take() else {
            return;
        };
        self.span.record("outcome", outcome);
        self.span
            .record("duration_us", start.elapsed().as_micros() as u64);
        if outcome != "success" {
            let _entered = self.span.enter();
            tracing::warn!(outcome, "expiremap-redis: a load failed");
        }
    }
}

impl Drop for LoadSpan {
    fn drop(&mut self) {
        #[cfg(feature = "tracing")]
        self.record(if std::thread::panicking() {
            "panicked"
        } else {
            "cancelled"
        });
    }
}

impl std::fmt::Debug for LoadSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadSpan").finish_non_exhaustive()
    }
}

/// The `debug` span `expiremap_redis.lease_wait` of one wait for a lease
/// held elsewhere (`waited_ms` is how long the wait may last).
#[cfg(feature = "tracing")]
pub(crate) fn lease_wait_span(name: &[u8], patience: std::time::Duration) -> tracing::Span {
    let span = tracing::debug_span!(
        "expiremap_redis.lease_wait",
        key_hash = tracing::field::Empty,
        patience_ms = patience.as_millis() as u64,
    );
    if !span.is_disabled() {
        span.record("key_hash", name_hash(name));
    }
    span
}

/// A hash of a key's Redis name that every process of the same build
/// computes alike (`DefaultHasher::new` has fixed keys), so a wait in one
/// process and the load in another show the same `key_hash`.
#[cfg(feature = "tracing")]
fn name_hash(name: &[u8]) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    name.hash(&mut h);
    h.finish()
}

//! The settings of a cache ([`Builder`]) and `build`, which checks them,
//! connects and starts the cache's threads.

use crate::cluster::{Cluster, Links};
use crate::connect::{self, Config};
use crate::expirations::Expirations;
use crate::link::Shared;
use crate::prefix::PrefixClaim;
#[cfg(feature = "tls")]
use crate::wire;
use crate::{CacheKey, CacheValue, Error, NearCache, nonblocking};
use expiremap::{DEFAULT_EVENT_CAPACITY, DEFAULT_MAX_SUBSCRIBERS, ExpireMap, broadcast};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The lease TTL of [`Builder::lease_ttl`] by default: 10 s, the lease
/// life of memcache's leases (Nishtala et al., NSDI 2013): longer than
/// most loads (a database query, a remote call), so a hot key is loaded
/// once, and short enough that a crashed loader holds the fleet up for
/// seconds, not minutes.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// Settings of a [`NearCache`], from [`NearCache::builder`].
pub struct Builder<K, V> {
    url: String,
    /// From [`NearCache::cluster_builder`]: the seed nodes' URLs.
    seeds: Option<Vec<String>>,
    prefix: Option<Vec<u8>>,
    max_entries: Option<u64>,
    max_near_ttl: Option<Duration>,
    staleness: Option<Duration>,
    connect_timeout: Option<Duration>,
    call_timeout: Option<Duration>,
    tls_ca_pem: Option<Vec<u8>>,
    publish_removals: bool,
    redis_expirations: bool,
    /// `None`: off; the default is [`DEFAULT_LEASE_TTL`].
    lease_ttl: Option<Duration>,
    /// From [`Builder::metrics`]: the `cache` label.
    #[cfg(feature = "metrics")]
    metrics: Option<metrics::SharedString>,
    _types: std::marker::PhantomData<fn() -> (K, V)>,
}

impl<K: CacheKey, V: CacheValue> Builder<K, V> {
    /// The namespace of the cache's keys in Redis (default `"expiremap:"`).
    /// Caches that share data must use the same prefix and the same key and
    /// value types. It must not be empty, and caches of different data on
    /// the same server must not have prefixes of which one starts the other
    /// (`"a"` and `"ab"`): their keys could alias. `build` refuses such a
    /// prefix where it can see the other, in a live cache of this process
    /// on the same server (`host:port/db`); across processes it cannot.
    pub fn prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        self.prefix = Some(prefix.as_ref().to_vec());
        self
    }

    /// Bounds the number of near copies (default: unbounded). Redis holds
    /// the data; the bound only limits this process's memory.
    pub fn max_entries(mut self, n: u64) -> Self {
        self.max_entries = Some(n);
        self
    }

    /// The longest a near copy may live, whatever its Redis TTL (default
    /// 60 s). Also the life of a near copy of a key without a Redis TTL.
    pub fn max_near_ttl(mut self, cap: Duration) -> Self {
        self.max_near_ttl = Some(cap);
        self
    }

    /// The staleness bound `S` (default 500 ms, at least 4 ms): a `get` that
    /// starts more than `S` after a write completed never returns the
    /// value it replaced. The cache pings every `S / 4`.
    pub fn staleness_bound(mut self, s: Duration) -> Self {
        self.staleness = Some(s);
        self
    }

    /// How long each step of connecting (the TCP connect, the TLS
    /// handshake, each reply of the handshake) may wait for the server
    /// (default 1 s, not zero). A server that does not answer in time is
    /// an [`Error::Connection`] of kind
    /// [`TimedOut`](std::io::ErrorKind::TimedOut) ([`Error::is_timeout`])
    /// that names the server and the step, with this timeout.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = Some(d);
        self
    }

    /// How long a call waits for its reply (default 2 s, not zero): then it
    /// fails with an [`Error::Connection`] of kind
    /// [`TimedOut`](std::io::ErrorKind::TimedOut) ([`Error::is_timeout`]),
    /// and a write may still be applied by the server. Also how long a
    /// ping may go unanswered, if longer than the staleness bound, before
    /// the connection is taken for dead and closed (dropping every near
    /// copy): a server stall shorter than both stops near hits after the
    /// staleness bound, but keeps the connection, and the calls that wait
    /// less than this get their replies.
    pub fn call_timeout(mut self, d: Duration) -> Self {
        self.call_timeout = Some(d);
        self
    }

    /// For `rediss://` (TLS) servers: trust the CA certificates in `pem`
    /// (one or more `-----BEGIN CERTIFICATE-----` blocks) instead of the
    /// bundled Mozilla roots (`webpki-roots`), for a private CA as managed
    /// services and self-run servers often use. The server's certificate
    /// must name the URL's host (a DNS name, or an IP address in its
    /// `subjectAltName`). Needs the `tls` feature (on by default).
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_ca_pem(mut self, pem: impl AsRef<[u8]>) -> Self {
        self.tls_ca_pem = Some(pem.as_ref().to_vec());
        self
    }

    /// Also publish `Removed` and `Replaced` events of near copies
    /// (invalidations, removes, overwrites) to subscribers.
    pub fn publish_removals(mut self, on: bool) -> Self {
        self.publish_removals = on;
        self
    }

    /// Also report the keys under the prefix that expire in Redis, through
    /// [`NearCache::subscribe_expirations`] (see the crate docs,
    /// *Expirations in Redis*). The server must be set to send `expired`
    /// key events (`notify-keyspace-events` with `E` and `x`): `build`
    /// checks that where the server lets it read its configuration, and
    /// fails with [`Error::Config`] if not.
    pub fn redis_expirations(mut self, on: bool) -> Self {
        self.redis_expirations = on;
        self
    }

    /// Fleet-wide loading (on by default): `get_or_insert_with` and its
    /// kin take a lease in Redis before they load a missing key, so that
    /// one process in the fleet loads it while the others wait for its
    /// value (see the crate docs, *Fleet-wide loading*). `false` loads
    /// once per process, as a plain cache-aside does.
    pub fn leases(mut self, on: bool) -> Self {
        self.lease_ttl = on.then(|| self.lease_ttl.unwrap_or(DEFAULT_LEASE_TTL));
        self
    }

    /// How long a lease lasts (default 10 s, at least 1 ms; turns leases
    /// on): the longest a crashed or stuck loader holds the others up, and
    /// the longest a load may take before another process loads too (its
    /// value is then only returned, not stored). Make it a few times your
    /// slowest load (its p99.9), and no longer than you would have the
    /// fleet wait for a dead loader.
    pub fn lease_ttl(mut self, d: Duration) -> Self {
        self.lease_ttl = Some(d);
        self
    }

    /// Publishes the cache's series through the [`metrics`] facade, with
    /// `name` as their `cache` label (feature `metrics`; see "Monitoring"
    /// in the crate docs): the near map's (hits and misses of near
    /// copies, their count, evictions: the core crate's
    /// `expiremap::Builder::metrics`, which this names too) and the Redis
    /// tier's (calls by outcome and their durations, invalidations
    /// received, reconnects, lease waits and takeovers).
    ///
    /// They are published from counts the cache keeps, never from a near
    /// hit: at least once a second by the cache's threads, when the cache
    /// is dropped, and on [`NearCache::publish_metrics`]. A call to Redis
    /// is timed (two clock reads) only in a cache with a metrics name.
    ///
    /// ```no_run
    /// use expiremap_redis::NearCache;
    ///
    /// let users = NearCache::<u64, String>::builder("redis://127.0.0.1:6379")
    ///     .metrics("users")
    ///     .build()?;
    /// users.publish_metrics(); // to the recorder installed, if any
    /// # Ok::<(), expiremap_redis::Error>(())
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics(mut self, name: impl Into<metrics::SharedString>) -> Self {
        self.metrics = Some(name.into());
        self
    }

    /// Connects (once, on this thread: an unreachable server is an error
    /// here), sets up tracking and starts the cache's threads. Settings are
    /// checked before connecting:
    ///
    /// ```
    /// use expiremap_redis::{Error, NearCache};
    ///
    /// let r = NearCache::<String, u64>::builder("redis://127.0.0.1:6379")
    ///     .prefix("")
    ///     .build();
    /// assert!(matches!(r, Err(Error::Config(_))));
    /// let r = NearCache::<String, u64>::builder("not a url").build();
    /// assert!(matches!(r, Err(Error::Config(_))));
    /// ```
    pub fn build(self) -> Result<NearCache<K, V>, Error> {
        if self.seeds.as_ref().is_some_and(Vec::is_empty) {
            return Err(Error::Config(
                "the cluster builder needs at least one seed node".into(),
            ));
        }
        let mut cfg = Config::from_url(&self.url)?;
        #[cfg(feature = "tls")]
        if cfg.tls {
            cfg.tls_config = Some(wire::client_config(self.tls_ca_pem.as_deref())?);
        }
        if !cfg.tls && self.tls_ca_pem.is_some() {
            return Err(Error::Config(
                "tls_ca_pem is for rediss:// (TLS) URLs".into(),
            ));
        }
        if let Some(p) = self.prefix {
            if p.is_empty() {
                return Err(Error::Config("the key prefix must not be empty".into()));
            }
            cfg.prefix = p;
        }
        if let Some(s) = self.staleness {
            if s < Duration::from_millis(4) {
                return Err(Error::Config(format!(
                    "staleness_bound({s:?}) is below 4 ms"
                )));
            }
            cfg.staleness = s;
        }
        if self.lease_ttl.is_some_and(|d| d < Duration::from_millis(1)) {
            return Err(Error::Config(format!(
                "lease_ttl({:?}) is below 1 ms",
                self.lease_ttl.unwrap_or_default()
            )));
        }
        if let Some(c) = self.max_near_ttl {
            cfg.max_near_ttl = c;
        }
        for (name, t, slot) in [
            (
                "connect_timeout",
                self.connect_timeout,
                &mut cfg.connect_timeout,
            ),
            ("call_timeout", self.call_timeout, &mut cfg.call_timeout),
        ] {
            match t {
                Some(t) if t.is_zero() => {
                    return Err(Error::Config(format!("{name} must not be zero")));
                }
                Some(t) => *slot = t,
                None => {}
            }
        }
        let server = match &self.seeds {
            Some(seeds) => {
                if self.redis_expirations {
                    return Err(Error::Config(
                        "redis_expirations is not supported over a Redis Cluster yet".into(),
                    ));
                }
                if cfg.db != 0 {
                    return Err(Error::Config(
                        "a Redis Cluster has only database 0 (no /db in the seed URLs)".into(),
                    ));
                }
                cfg.cluster = true;
                let mut addrs: Vec<String> = seeds.iter().map(|u| connect::redact(u)).collect();
                addrs.sort();
                format!("cluster {}", addrs.join(" "))
            }
            None => format!("{}:{}/{}", cfg.host, cfg.port, cfg.db),
        };
        let claim = PrefixClaim::take(server, &cfg.prefix)?;

        let mut near = ExpireMap::<K, V>::builder().publish_removals(self.publish_removals);
        if let Some(n) = self.max_entries {
            near = near.max_entries(n);
        }
        #[cfg(feature = "metrics")]
        if let Some(name) = self.metrics {
            near = near.metrics(name.clone());
            cfg.monitor = Arc::new(crate::monitor::Counters::named(name));
        }
        let monitor = Arc::clone(&cfg.monitor);
        let near = Arc::new(near.try_build().map_err(|e| Error::Config(e.to_string()))?);
        let waiters = Arc::clone(&cfg.waiters);
        let events_cfg = cfg.clone();
        let (prefix, staleness) = (cfg.prefix.clone(), cfg.staleness);
        let links = match &self.seeds {
            Some(seeds) => {
                let mut addrs = Vec::new();
                for u in seeds {
                    let c = Config::from_url(u)?;
                    addrs.push((c.host, c.port));
                }
                Links::Cluster(Cluster::start(cfg, addrs, Arc::clone(&near))?)
            }
            None => {
                let node = cfg.node();
                let link = Arc::new(Shared::new(Arc::clone(&near), cfg));
                let supervisor = link.start().map_err(|e| e.at(&node))?;
                Links::One {
                    link,
                    supervisor: Mutex::new(Some(supervisor)),
                }
            }
        };
        let mut cache = NearCache {
            links,
            near,
            prefix,
            staleness,
            expirations: None,
            flights: nonblocking::Flights::new(),
            lease_ttl: self.lease_ttl,
            waiters,
            monitor,
            _prefix: claim,
        };
        if self.redis_expirations {
            // On an error, dropping `cache` closes its data connection.
            let ring = broadcast::Sender::new(DEFAULT_EVENT_CAPACITY, DEFAULT_MAX_SUBSCRIBERS)
                .map_err(|e| Error::Config(e.to_string()))?;
            let node = events_cfg.node();
            cache.expirations =
                Some(Expirations::start(events_cfg, ring).map_err(|e| e.at(&node))?);
        }
        Ok(cache)
    }
}

impl<K, V> fmt::Debug for Builder<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("url", &connect::redact(&self.url))
            .field(
                "seeds",
                &self
                    .seeds
                    .as_ref()
                    .map(|s| s.iter().map(|u| connect::redact(u)).collect::<Vec<_>>()),
            )
            .field("prefix", &self.prefix)
            .field("max_entries", &self.max_entries)
            .field("max_near_ttl", &self.max_near_ttl)
            .field("staleness", &self.staleness)
            .field("redis_expirations", &self.redis_expirations)
            .field("lease_ttl", &self.lease_ttl)
            .field("metrics", &self.metrics_name())
            .finish_non_exhaustive()
    }
}

impl<K, V> Builder<K, V> {
    /// The metrics name, for `Debug`.
    fn metrics_name(&self) -> Option<&str> {
        #[cfg(feature = "metrics")]
        return self.metrics.as_deref();
        #[cfg(not(feature = "metrics"))]
        None
    }

    /// The settings of [`NearCache::builder`] (`seeds: None`) and
    /// [`NearCache::cluster_builder`], all at their defaults.
    pub(crate) fn new(url: String, seeds: Option<Vec<String>>) -> Self {
        Builder {
            url,
            seeds,
            prefix: None,
            max_entries: None,
            max_near_ttl: None,
            staleness: None,
            connect_timeout: None,
            call_timeout: None,
            tls_ca_pem: None,
            publish_removals: false,
            redis_expirations: false,
            lease_ttl: Some(DEFAULT_LEASE_TTL),
            #[cfg(feature = "metrics")]
            metrics: None,
            _types: std::marker::PhantomData,
        }
    }
}

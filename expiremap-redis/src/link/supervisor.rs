//! The link's supervisor thread: it connects and handshakes, starts the
//! reader, pings every `staleness / 4`, closes a connection whose ping
//! goes unanswered, writes what callers' sends left, and reconnects after
//! a loss (see the ground rules in [`crate::link`]).

use super::{Conn, Fresh, MAX_BACKOFF, OnDrop, Shared, lock, nanos};
use crate::codec::{CacheKey, CacheValue};
use crate::connect::{cluster_enabled, dial, handshake, hello, server_major};
use crate::error::Error;
use crate::monitor::Counters;
use crate::op::Op;
use crate::reply;
use expiremap::Clock;
use redis::{Parser, Value};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Waker;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

impl<K: CacheKey, V: CacheValue> Shared<K, V> {
    /// Connects and handshakes: RESP3, credentials, database, tracking.
    fn connect(&self) -> Result<Fresh, Error> {
        let cfg = &self.cfg;
        let (mut read, write) = dial(cfg)?;
        let mut cmds = vec![("HELLO", hello(cfg))];
        if cfg.db != 0 {
            cmds.push(("SELECT", redis::cmd("SELECT").arg(cfg.db).clone()));
        }
        cmds.push((
            "CLIENT TRACKING",
            redis::cmd("CLIENT")
                .arg("TRACKING")
                .arg("ON")
                .arg("BCAST")
                .arg("PREFIX")
                .arg(&cfg.prefix[..])
                .arg("NOLOOP")
                .clone(),
        ));
        // A cluster node would answer `MOVED` for the keys of other nodes'
        // slots: refuse it here, at `build` (a server that refuses `INFO`
        // is trusted).
        cmds.push(("INFO", redis::cmd("INFO").arg("cluster").clone()));
        // Whether this user may run `MULTI` (a lease holder's store is a
        // `MULTI`/`EXEC`, else one script; see `lease`): a refused `MULTI`
        // would let the commands after it run alone, and its `EXEC` fail
        // after they wrote.
        // (`DISCARD` ends a transaction whose `EXEC` was refused.)
        cmds.push(("MULTI", redis::cmd("MULTI")));
        cmds.push(("EXEC", redis::cmd("EXEC")));
        cmds.push(("DISCARD", redis::cmd("DISCARD")));
        let tracking_sent = self.clock.now();
        let mut parser = Parser::new();
        // Tracking is on only once its reply is in: no push comes before.
        let replies = handshake(
            &mut read,
            &write,
            &mut parser,
            &cmds,
            &["INFO", "MULTI", "EXEC", "DISCARD"],
            |_| {},
        )?;
        let [.., info, multi, exec, _] = &replies[..] else {
            unreachable!("a reply per command")
        };
        if !cfg.cluster && cluster_enabled(info) {
            return Err(Error::Config(format!(
                "{}:{} is a Redis Cluster node (cluster_enabled:1): NearCache::builder is for \
                 one server (it would get MOVED for the keys of other nodes); use \
                 NearCache::cluster_builder with the cluster's seed nodes",
                cfg.host, cfg.port
            )));
        }
        Ok(Fresh {
            read,
            write,
            parser,
            tracking_sent,
            eval_ro: server_major(&replies[0]).is_some_and(|v| v >= 7),
            multi: ![multi, exec]
                .iter()
                .any(|r| matches!(r, Value::ServerError(_))),
        })
    }

    /// Makes `fresh` the live connection and starts its reader.
    fn install(self: &Arc<Self>, fresh: Fresh) -> Result<JoinHandle<()>, Error> {
        let now = self.clock.now();
        self.eval_ro.store(fresh.eval_ro, Ordering::Relaxed);
        self.multi.store(fresh.multi, Ordering::Relaxed);
        *lock(&self.last_error) = None;
        *self.link() = Some(Conn {
            stream: Arc::new(fresh.write),
            pending: VecDeque::new(),
            ping_sent: None,
            last_ping: now,
        });
        // Counted before `connects`, which callers watch for a reconnect.
        if self.connects.load(Ordering::Relaxed) > 0 {
            Counters::add(&self.cfg.monitor.reconnects);
        }
        self.connects.fetch_add(1, Ordering::Relaxed);
        self.fresh_until.store(
            fresh
                .tracking_sent
                .saturating_add(nanos(self.cfg.staleness)),
            Ordering::Release,
        );
        let me = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name("expiremap-redis-reader".into())
            .spawn(move || me.read_loop(fresh.read, fresh.parser));
        match spawned {
            Ok(h) => Ok(h),
            Err(e) => {
                self.fresh_until.store(0, Ordering::Release);
                self.lower_floor();
                *self.link() = None;
                Err(Error::io(e))
            }
        }
    }

    /// Sends a ping when one is due; closes a connection whose ping went
    /// unanswered for [`Config::dead_after`].
    fn heartbeat(&self) {
        self.cfg.waiters.expire(Instant::now());
        let now = self.clock.now();
        let mut link = self.link();
        let Some(conn) = link.as_mut() else { return };
        let wall = Instant::now();
        let wakers: Vec<Waker> = conn
            .pending
            .iter()
            .filter_map(|op| op.expire(wall))
            .collect();
        if !wakers.is_empty() {
            drop(link);
            wakers.into_iter().for_each(Waker::wake);
            link = self.link();
        }
        let Some(conn) = link.as_mut() else { return };
        match conn.ping_sent {
            Some(sent) if now.saturating_sub(sent) > nanos(self.cfg.dead_after()) => {
                conn.stream.shutdown();
            }
            Some(_) => {}
            None if now.saturating_sub(conn.last_ping) >= nanos(self.cfg.ping_every()) => {
                conn.pending.push_back(Op::Ping { sent: now });
                conn.ping_sent = Some(now);
                conn.last_ping = now;
                self.ping_out.store(now, Ordering::Release);
                self.send(conn, b"*1\r\n$4\r\nPING\r\n");
            }
            None => {}
        }
    }

    /// Connects (on this thread: an unreachable server is an error here)
    /// and starts the supervisor, which installs the connection; returns
    /// once it has, so that the first call does not find the link
    /// "reconnecting".
    pub(crate) fn start(self: &Arc<Self>) -> Result<JoinHandle<()>, Error> {
        let first = self.connect()?;
        let supervisor = self.spawn(Some(first))?;
        while self.connects.load(Ordering::Acquire) == 0 && !supervisor.is_finished() {
            thread::yield_now();
        }
        Ok(supervisor)
    }

    /// Starts the supervisor, which installs `first` or, if `None`,
    /// connects on its own thread (and reconnects while it cannot): a
    /// cluster's links, which no caller waits for unless it chooses to
    /// ([`first_attempt`](Self::first_attempt)).
    pub(crate) fn spawn(self: &Arc<Self>, first: Option<Fresh>) -> Result<JoinHandle<()>, Error> {
        let me = Arc::clone(self);
        thread::Builder::new()
            .name("expiremap-redis-supervisor".into())
            .spawn(move || me.supervise(first))
            .map_err(Error::io)
    }

    /// The supervisor thread: connects if need be, pings, and reconnects
    /// after a loss.
    fn supervise(self: Arc<Self>, first: Option<Fresh>) {
        let _ = self.supervisor.set(thread::current());
        // However it ends: no caller waits on a first attempt for ever.
        let _waiters = OnDrop(|| drop(std::mem::take(&mut *lock(&self.first))));
        let mut reader = first.and_then(|f| self.install(f).ok());
        if reader.is_some() {
            self.attempted();
        }
        let mut backoff = Duration::from_millis(10);
        while !self.closing.load(Ordering::Acquire) {
            // No lock held: the recorder runs here.
            #[cfg(feature = "metrics")]
            self.cfg.monitor.publish_due();
            if self.connected() {
                self.heartbeat();
                let tick = self.cfg.ping_every().min(reply::TICK_MAX);
                // What callers' sends left: written as the socket takes
                // it, waiting for it here (never under the link's mutex).
                let stream = self.link().as_ref().map(|c| Arc::clone(&c.stream));
                match stream.map(|s| (s.flush(), s)) {
                    Some((Ok(false), s)) => s.writable(tick),
                    Some((Err(_), s)) => s.shutdown(),
                    _ => thread::park_timeout(tick),
                }
                continue;
            }
            if let Some(h) = reader.take() {
                let _ = h.join();
                #[cfg(feature = "tracing")]
                tracing::warn!(
                    node = %self.cfg.node(),
                    "expiremap-redis: the connection was lost; near copies dropped, reconnecting"
                );
            }
            match self.connect().and_then(|f| self.install(f)) {
                Ok(h) => {
                    reader = Some(h);
                    backoff = Duration::from_millis(10);
                    #[cfg(feature = "tracing")]
                    if self.connects.load(Ordering::Relaxed) > 1 {
                        tracing::warn!(node = %self.cfg.node(), "expiremap-redis: reconnected");
                    }
                    self.attempted();
                }
                Err(e) => {
                    #[cfg(feature = "tracing")]
                    tracing::warn!(
                        node = %self.cfg.node(),
                        error = %e,
                        retry_in_ms = backoff.as_millis() as u64,
                        "expiremap-redis: a connect attempt failed"
                    );
                    *lock(&self.last_error) = Some(e);
                    self.attempted();
                    thread::park_timeout(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        if let Some(conn) = self.link().as_ref() {
            conn.stream.shutdown();
        }
        if let Some(h) = reader.take() {
            let _ = h.join();
        }
    }
}

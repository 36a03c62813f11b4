//! Where a cache's commands go ([`Links`]): one server's link, or a
//! cluster's, by the key's slot; a call's tries, the redirects it follows
//! (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`; a command over several keys
//! switched to its one-key form in a slot in migration), and the node
//! named in its errors. The slot table they route by is [`Cluster`]'s.

use super::{Cluster, MAX_REDIRECTS, lock, read};
use crate::codec::{self, CacheKey, CacheValue};
use crate::error::Error;
use crate::link::Shared;
use crate::monitor::Counters;
use crate::op::{Hop, Redirected};
use crate::reply::Receiver;
use crate::slots::{Redirect, slot};
use std::io;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

/// Where a cache's commands go.
pub(crate) enum Links<K, V> {
    One {
        link: Arc<Shared<K, V>>,
        supervisor: Mutex<Option<JoinHandle<()>>>,
    },
    Cluster(Arc<Cluster<K, V>>),
}

impl<K: CacheKey, V: CacheValue> Links<K, V> {
    /// `true` if near copies may be served now: the link, or every link
    /// of a cluster, is fresh.
    #[inline]
    pub(crate) fn fresh(&self) -> bool {
        match self {
            Links::One { link, .. } => link.fresh(),
            Links::Cluster(c) => c.all_fresh(),
        }
    }

    /// The Redis tier's counters (shared by every link of the cache).
    fn counters(&self) -> &Counters {
        match self {
            Links::One { link, .. } => &link.cfg.monitor,
            Links::Cluster(c) => &c.base.monitor,
        }
    }

    /// The link for `key`'s first try.
    fn first(&self, key: &K, prefix: &[u8]) -> Result<Arc<Shared<K, V>>, Error> {
        match self {
            Links::One { link, .. } => Ok(Arc::clone(link)),
            Links::Cluster(c) => {
                let name = codec::redis_key(prefix, key)?;
                c.route(slot(&name))
            }
        }
    }

    /// Sends with `send` (given the link, and how: [`Hop`]) and waits for
    /// the reply, following a cluster's redirects. A link whose first
    /// attempt to connect has not ended is waited for first (see
    /// [`Shared::first_attempt`]); if it ends without a connection, the
    /// call fails with its error. A link retired by a new slot table before
    /// the call was sent on it is routed again (each such try counts as a
    /// redirect). Errors about a server name it.
    pub(crate) fn run<T>(
        &self,
        key: &K,
        prefix: &[u8],
        send: impl Fn(&Shared<K, V>, Hop) -> Result<Receiver<T>, Error>,
    ) -> Result<T, Error> {
        self.run_with(key, prefix, false, send)
    }

    /// [`run`](Self::run) for a command over several keys of the key's
    /// slot (a lease holder's `MULTI`), which `send` also has in a one-key
    /// form ([`Hop::single`]): a node that refuses it because the slot is
    /// in migration (`ASK`, `TRYAGAIN`) gets the one-key form, which then
    /// follows its own redirects.
    pub(crate) fn run_multi<T>(
        &self,
        key: &K,
        prefix: &[u8],
        send: impl Fn(&Shared<K, V>, Hop) -> Result<Receiver<T>, Error>,
    ) -> Result<T, Error> {
        self.run_with(key, prefix, true, send)
    }

    /// The one place every call (but a lease's release, which waits for
    /// nothing) ends: counted by outcome, and timed in a cache with a
    /// metrics name.
    fn run_with<T>(
        &self,
        key: &K,
        prefix: &[u8],
        multi: bool,
        send: impl Fn(&Shared<K, V>, Hop) -> Result<Receiver<T>, Error>,
    ) -> Result<T, Error> {
        let counters = self.counters();
        let started = counters.call_started();
        let r = self.run_tries(key, prefix, multi, send);
        counters.call_ended(&r, started);
        r
    }

    fn run_tries<T>(
        &self,
        key: &K,
        prefix: &[u8],
        multi: bool,
        send: impl Fn(&Shared<K, V>, Hop) -> Result<Receiver<T>, Error>,
    ) -> Result<T, Error> {
        let mut link = self.first(key, prefix)?;
        let start = first_hop(&link);
        let mut hop = start;
        let mut last = None;
        for _ in 0..MAX_REDIRECTS {
            if let Some(first) = link.first_attempt() {
                let _ = first.wait();
                if !usable(&link)? {
                    (link, hop) = (self.first(key, prefix)?, start);
                    continue;
                }
            }
            let r = match send(&link, hop) {
                // Retired by a new slot table since it was routed: nothing
                // was sent; route again.
                Err(_) if link.closed() => {
                    (link, hop) = (self.first(key, prefix)?, start);
                    continue;
                }
                sent => sent.and_then(Receiver::wait),
            }
            .map_err(|e| self.at(e, &link));
            match self.redirected(r, link, hop, multi) {
                ControlFlow::Continue((next, e)) => ((link, hop), last) = (next, Some(e)),
                ControlFlow::Break(done) => return done,
            }
        }
        Err(too_many(last))
    }

    /// Gives up the lease `token` holds on `key`, waiting for nothing: its
    /// reply is applied and dropped by the reader, which follows a
    /// redirect in it (a slot that moved, or is moving, since the lease
    /// was taken) by sending the release on, to the node named.
    pub(crate) fn release(&self, key: &K, prefix: &[u8], token: &str) {
        match self {
            Links::One { link, .. } => {
                let _ = link.release(key, token, Hop::default(), None);
            }
            Links::Cluster(c) => {
                if let Ok(link) = self.first(key, prefix) {
                    let follow = Follow {
                        cluster: Arc::downgrade(c),
                        key: key.clone(),
                        token: token.to_string(),
                        left: MAX_REDIRECTS,
                    };
                    follow.send(&link, Hop::default());
                }
            }
        }
    }

    /// [`run`](Self::run), awaiting the replies.
    pub(crate) async fn run_async<T>(
        &self,
        key: &K,
        prefix: &[u8],
        send: impl Fn(&Shared<K, V>, Hop) -> Result<Receiver<T>, Error>,
    ) -> Result<T, Error> {
        self.run_with_async(key, prefix, false, send).await
    }

    /// [`run_multi`](Self::run_multi), awaiting the replies.
    pub(crate) async fn run_multi_async<T>(
        &self,
        key: &K,
        prefix: &[u8],
        send: impl Fn(&Shared<K, V>, Hop) -> Result<Receiver<T>, Error>,
    ) -> Result<T, Error> {
        self.run_with_async(key, prefix, true, send).await
    }

    /// [`run_with`](Self::run_with), awaiting the replies. A call whose
    /// future is dropped before it ends is not counted.
    async fn run_with_async<T>(
        &self,
        key: &K,
        prefix: &[u8],
        multi: bool,
        send: impl Fn(&Shared<K, V>, Hop) -> Result<Receiver<T>, Error>,
    ) -> Result<T, Error> {
        let counters = self.counters();
        let started = counters.call_started();
        let r = self.run_tries_async(key, prefix, multi, send).await;
        counters.call_ended(&r, started);
        r
    }

    async fn run_tries_async<T>(
        &self,
        key: &K,
        prefix: &[u8],
        multi: bool,
        send: impl Fn(&Shared<K, V>, Hop) -> Result<Receiver<T>, Error>,
    ) -> Result<T, Error> {
        let mut link = self.first(key, prefix)?;
        let start = first_hop(&link);
        let mut hop = start;
        let mut last = None;
        for _ in 0..MAX_REDIRECTS {
            if let Some(first) = link.first_attempt() {
                let _ = first.await;
                if !usable(&link)? {
                    (link, hop) = (self.first(key, prefix)?, start);
                    continue;
                }
            }
            let r = match send(&link, hop) {
                Ok(rx) => rx.await,
                Err(_) if link.closed() => {
                    (link, hop) = (self.first(key, prefix)?, start);
                    continue;
                }
                Err(e) => Err(e),
            }
            .map_err(|e| self.at(e, &link));
            match self.redirected(r, link, hop, multi) {
                ControlFlow::Continue((next, e)) => ((link, hop), last) = (next, Some(e)),
                ControlFlow::Break(done) => return done,
            }
        }
        Err(too_many(last))
    }

    /// What one try's result leads to: `Break` ends the call with that
    /// result (a reply, or an error that is no redirect); `Continue` is a
    /// cluster's redirect: the link to try next and how, with the error
    /// that led there. `link` gave `r` (sent as `hop`; a redirect without
    /// a host means its node); `multi`: the call has a one-key form.
    ///
    /// * `MOVED`: the slot's new node (the table is updated and read
    ///   again); `ASK`: the node named, with `ASKING` first.
    /// * A command over several keys refused because its slot is in
    ///   migration (`ASK`, or `TRYAGAIN` where the node holds some of the
    ///   keys): its one-key form, to the same node.
    /// * `CLUSTERDOWN` (a node removed from the cluster, which answers
    ///   that it serves no slot; or a cluster that lost a slot's primary):
    ///   another primary, which answers `MOVED` to the slot's node if it
    ///   knows one, and the table is read again.
    fn redirected<T>(
        &self,
        r: Result<T, Error>,
        link: Arc<Shared<K, V>>,
        hop: Hop,
        multi: bool,
    ) -> ControlFlow<Result<T, Error>, (Retry<K, V>, Error)> {
        let (Links::Cluster(c), Err(e)) = (self, &r) else {
            return ControlFlow::Break(r);
        };
        let one_key = Hop {
            asking: false,
            single: true,
            ..hop
        };
        if let Some(red) = Redirect::parse(e, &link.cfg.host) {
            if red.ask && multi && !hop.single {
                return ControlFlow::Continue(((link, one_key), r.err().unwrap()));
            }
            return match c.follow(&red) {
                Ok(next) => {
                    let hop = Hop {
                        asking: red.ask,
                        single: red.ask && hop.single,
                        ..hop
                    };
                    ControlFlow::Continue(((next, hop), r.err().unwrap()))
                }
                Err(e) => ControlFlow::Break(Err(e)),
            };
        }
        let Error::Server(m) = e else {
            return ControlFlow::Break(r);
        };
        if says(m, "TRYAGAIN") && multi && !hop.single {
            return ControlFlow::Continue(((link, one_key), r.err().unwrap()));
        }
        if says(m, "CLUSTERDOWN") {
            c.kick();
            if let Some(next) = c.other_than(&link) {
                let hop = Hop {
                    asking: false,
                    single: false,
                    ..hop
                };
                return ControlFlow::Continue(((next, hop), r.err().unwrap()));
            }
        }
        ControlFlow::Break(r)
    }

    /// A call's error, naming the server it is about: a connection error,
    /// and a server's error reply or unexpected reply (a cluster's
    /// redirect is kept as the server wrote it, to be followed).
    fn at(&self, e: Error, link: &Shared<K, V>) -> Error {
        match e {
            Error::Connection(_) | Error::Protocol(_) => e.at(&link.cfg.node()),
            Error::Server(_) if Redirect::parse(&e, "").is_none() => e.at(&link.cfg.node()),
            e => e,
        }
    }

    /// The error of a near read of `key` whose server is stalled (see
    /// [`Shared::stalled`]): a timeout that names the node, if it is.
    pub(crate) fn stalled(&self, key: &K, prefix: &[u8]) -> Option<Error> {
        let link = self.first(key, prefix).ok()?;
        let waited = link.stalled()?;
        Some(
            Error::connection(
                io::ErrorKind::TimedOut,
                &format!(
                    "no answer to a ping for {waited:?}: the near copy is past the staleness \
                     bound ({:?}), and the server is stalled",
                    link.cfg.staleness
                ),
            )
            .at(&link.cfg.node()),
        )
    }

    /// `true` while every link has a connection.
    pub(crate) fn connected(&self) -> bool {
        self.each(|l| l.connected()).into_iter().all(|c| c)
    }

    /// The first reconnecting link's last failed attempt, naming its
    /// server.
    pub(crate) fn last_error(&self) -> Option<Error> {
        self.each(|l| l.last_error().map(|e| e.at(&l.cfg.node())))
            .into_iter()
            .flatten()
            .next()
    }

    /// Over a cluster: why the last read of the slot table gave no table
    /// to trust, until one does.
    pub(crate) fn table_error(&self) -> Option<Error> {
        match self {
            Links::One { .. } => None,
            Links::Cluster(c) => lock(&c.table_error).clone(),
        }
    }

    /// Connections made by all links.
    pub(crate) fn connects(&self) -> u64 {
        self.each(|l| l.connects.load(Ordering::Relaxed))
            .into_iter()
            .sum()
    }

    fn each<T>(&self, f: impl Fn(&Shared<K, V>) -> T) -> Vec<T> {
        match self {
            Links::One { link, .. } => vec![f(link)],
            Links::Cluster(c) => {
                let links: Vec<_> = read(&c.table)
                    .nodes
                    .iter()
                    .map(|n| Arc::clone(&n.link))
                    .collect();
                links.iter().map(|l| f(l)).collect()
            }
        }
    }
}

impl<K, V> Links<K, V> {
    /// Stops every link and joins the threads.
    pub(crate) fn close(&self) {
        match self {
            Links::One { link, supervisor } => {
                link.close();
                let h = lock(supervisor).take();
                if let Some(h) = h {
                    let _ = h.join();
                }
            }
            Links::Cluster(c) => c.close_all(),
        }
    }
}

/// How a call's first try is sent on `link`: its deadline is the call
/// timeout from now, shared by its redirects.
fn first_hop<K, V>(link: &Shared<K, V>) -> Hop {
    Hop {
        deadline: Some(crate::reply::far(Instant::now(), link.cfg.call_timeout)),
        ..Hop::default()
    }
}

/// After the end of `link`'s first attempt to connect: `true` if it is
/// connected, `false` if it was retired with no attempt failed (route the
/// call again), or the failed attempt's error, naming the node.
fn usable<K: CacheKey, V: CacheValue>(link: &Shared<K, V>) -> Result<bool, Error> {
    match link.settled() {
        Ok(()) => Ok(true),
        Err(Some(e)) => Err(e.at(&link.cfg.node())),
        Err(None) => Ok(false),
    }
}

/// The link a redirected call tries next, and how.
type Retry<K, V> = (Arc<Shared<K, V>>, Hop);

/// `true` if the server's error in `message` (after what names the node
/// and the step: `cluster node h:p: put (SET): TRYAGAIN ...`) has `code`.
fn says(message: &str, code: &str) -> bool {
    message.split(": ").any(|part| part.starts_with(code))
}

/// The error of a call that ran out of redirects: a `CLUSTERDOWN` that
/// every node tried gave (the cluster is down) as the server wrote it.
fn too_many(last: Option<Error>) -> Error {
    if let Some(Error::Server(m)) = &last
        && says(m, "CLUSTERDOWN")
    {
        return last.unwrap();
    }
    let last = last.map_or_else(String::new, |e| format!("; the last: {e}"));
    Error::Protocol(format!(
        "more than {MAX_REDIRECTS} cluster redirects (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) for one \
         call{last}"
    ))
}

/// A posted lease release and what it takes to send it on after a
/// redirect (see [`Links::release`]), on the reader that applies its reply.
struct Follow<K, V> {
    cluster: Weak<Cluster<K, V>>,
    key: K,
    token: String,
    /// Redirects it may still follow.
    left: usize,
}

impl<K: CacheKey, V: CacheValue> Follow<K, V> {
    /// Sends the release on `link`; a redirect in its reply sends it on.
    fn send(self, link: &Shared<K, V>, hop: Hop) {
        let (key, token) = (self.key.clone(), self.token.clone());
        let host = link.cfg.host.clone();
        let next: Option<Redirected> = (self.left > 0).then(|| {
            Box::new(move |e: &Error| {
                let Some(c) = self.cluster.upgrade() else {
                    return;
                };
                let Some(red) = Redirect::parse(e, &host) else {
                    return;
                };
                if let Ok(link) = c.follow(&red) {
                    let hop = Hop {
                        asking: red.ask,
                        single: true,
                        deadline: None,
                    };
                    Follow {
                        left: self.left - 1,
                        ..self
                    }
                    .send(&link, hop);
                }
            }) as Redirected
        });
        let _ = link.release(&key, &token, hop, next);
    }
}

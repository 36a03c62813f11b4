//! The links of a cache: one server, or the primaries of a Redis Cluster.
//!
//! # Over a cluster
//!
//! * One [`Shared`] link per primary, each exactly the single-server link
//!   (RESP3, `CLIENT TRACKING ON BCAST PREFIX <prefix> NOLOOP`, its reader,
//!   its pings, its reconnects), all storing into one near map. A key's
//!   commands go to the primary of its slot (CRC16 of the Redis key, or of
//!   its `{hash tag}`, mod 16384), so its replies and the invalidations of
//!   its writes come on the same connection, in order, as on one server.
//! * The slot table comes from `CLUSTER SLOTS`, asked on a connection of
//!   its own (kept open, moved to another node when it fails): at build,
//!   every second, and at once after a `MOVED`. A `MOVED` also points the slot at its new primary at once;
//!   an `ASK` (a slot in migration) resends the one command with `ASKING`
//!   to the node named. A primary not linked yet is linked (connected on
//!   the calling thread) when a redirect or a refresh names it.
//! * When the slot table changes, every near copy is dropped (a copy's
//!   invalidations come from the node that held its key). When a node's
//!   link is lost, its reader drops every near copy, as on one server.
//! * A near copy is served only while *every* link is fresh (a ping sent
//!   less than the staleness bound ago answered): then every invalidation
//!   that any known primary sent before that was applied, whichever link
//!   stored the copy (a reply to an `ASK` comes from a node that does not
//!   own the slot in the table yet). A key leaves a primary by `MIGRATE`,
//!   which deletes it there: that primary's invalidation drops the copy
//!   before the key can be written elsewhere, also on a primary this cache
//!   has not linked yet. Checking only the link of the key's slot would
//!   keep near hits of the other nodes' keys while one node stalls, but a
//!   copy stored from an `ASK` or by a reply that raced a change of the
//!   table would then be checked against a link that does not carry its
//!   invalidations; that is not done.
//!
//! Why not the `redis` crate's cluster support: its sync `ClusterConnection`
//! reads replies on the calling thread and cannot hand a tracking push to
//! our reader in order with the replies (the same reason the single-server
//! link is ours), and its `cluster-async` needs an async runtime (tokio or
//! smol) that this crate does not bring. What a cluster adds over one server
//! here is slot routing (CRC16, a few lines) and the slot table.

use crate::connect::{self, Config};
use crate::error::Error;
use crate::link::Shared;
use crate::reply::Receiver;
use crate::wire::{ReadHalf, WriteHalf};
use crate::{CacheKey, CacheValue, codec};
use expiremap::{Clock, ExpireMap, SystemClock};
use redis::{Parser, Value};
use std::io;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;

/// Redirects followed by one call before it fails.
const MAX_REDIRECTS: usize = 5;

/// How often the slot table is asked for when nothing prompts it.
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// CRC16/XMODEM, as Redis Cluster uses it.
pub(crate) fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot of a Redis key: of its hash tag (the bytes between the first
/// `{` and the next `}`, if not empty), else of the whole key.
pub(crate) fn slot(name: &[u8]) -> u16 {
    let tagged = name.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &name[open + 1..];
        let len = rest.iter().position(|&b| b == b'}')?;
        (len > 0).then(|| &rest[..len])
    });
    crc16(tagged.unwrap_or(name)) % SLOTS as u16
}

/// A redirect in a server error: `MOVED <slot> <host>:<port>` or `ASK ...`.
struct Redirect {
    ask: bool,
    slot: u16,
    addr: (String, u16),
}

impl Redirect {
    fn parse(e: &Error) -> Option<Redirect> {
        let Error::Server(m) = e else { return None };
        let mut words = m.split_whitespace();
        let ask = match words.next()? {
            "MOVED" => false,
            "ASK" => true,
            _ => return None,
        };
        let slot = words.next()?.parse().ok()?;
        let (host, port) = words.next()?.rsplit_once(':')?;
        Some(Redirect {
            ask,
            slot,
            addr: (host.to_string(), port.parse().ok()?),
        })
    }
}

/// A primary's link and its supervisor thread.
struct Node<K, V> {
    addr: (String, u16),
    link: Arc<Shared<K, V>>,
    supervisor: Option<JoinHandle<()>>,
}

impl<K, V> Node<K, V> {
    fn stop(mut self) {
        self.link.close();
        if let Some(h) = self.supervisor.take() {
            let _ = h.join();
        }
    }
}

/// The slot table: the node of each slot (an index in `nodes`).
struct Table<K, V> {
    slots: Vec<Option<usize>>,
    nodes: Vec<Node<K, V>>,
}

/// A cache's view of a cluster.
pub(crate) struct Cluster<K, V> {
    /// The settings every node's link starts from (host and port replaced).
    base: Config,
    seeds: Vec<(String, u16)>,
    near: Arc<ExpireMap<K, V>>,
    /// The clock of every link.
    clock: SystemClock,
    /// Read on every call (and on a near hit while some link is stale).
    table: RwLock<Table<K, V>>,
    /// Serializes the linking of new nodes (connects run outside `table`).
    linking: Mutex<()>,
    closing: AtomicBool,
    refresher: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(PoisonError::into_inner)
}

/// A node's address.
type Addr = (String, u16);

/// Slots `first..=last` and their primary.
type Range = (u16, u16, Addr);

/// The slot ranges and their primaries in a `CLUSTER SLOTS` reply; a node
/// named with an empty host is at `asked`'s host.
fn parse_slots(reply: &Value, asked: &str) -> Result<Vec<Range>, Error> {
    let bad = || Error::Protocol(format!("CLUSTER SLOTS answered {reply:?}"));
    let Value::Array(ranges) = reply else {
        return Err(bad());
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let mut out = Vec::new();
    for r in ranges {
        let Value::Array(f) = r else {
            return Err(bad());
        };
        let (Some(Value::Int(a)), Some(Value::Int(b)), Some(Value::Array(primary))) =
            (f.first(), f.get(1), f.get(2))
        else {
            return Err(bad());
        };
        let host = primary.first().and_then(text).ok_or_else(bad)?;
        let host = if host.is_empty() || host == "?" {
            asked.to_string()
        } else {
            host
        };
        let Some(Value::Int(port)) = primary.get(1) else {
            return Err(bad());
        };
        let (a, b, port) = (
            u16::try_from(*a).map_err(|_| bad())?,
            u16::try_from(*b).map_err(|_| bad())?,
            u16::try_from(*port).map_err(|_| bad())?,
        );
        if a > b || usize::from(b) >= SLOTS {
            return Err(bad());
        }
        out.push((a, b, (host, port)));
    }
    Ok(out)
}

/// The connection on which the slot table is asked for (kept open between
/// refreshes; no tracking, so nothing but replies comes on it).
struct SlotsConn {
    read: ReadHalf,
    write: WriteHalf,
    parser: Parser,
    timeout: Duration,
}

impl SlotsConn {
    /// Connects to `addr` and asks for the slot table.
    fn open(base: &Config, addr: &Addr) -> Result<(SlotsConn, Vec<Range>), Error> {
        let mut cfg = base.clone();
        (cfg.host, cfg.port) = addr.clone();
        let (mut read, write) = connect::dial(&cfg)?;
        let cmds = [
            ("HELLO", connect::hello(&cfg)),
            ("CLUSTER SLOTS", redis::cmd("CLUSTER").arg("SLOTS").clone()),
        ];
        let mut parser = Parser::new();
        let replies = connect::handshake(&mut read, &write, &mut parser, &cmds, &[], |_| {})
            .map_err(|e| match e {
                Error::Server(m) if m.contains("cluster support disabled") => {
                    Error::Config(format!(
                        "{}:{} is not a Redis Cluster node: use NearCache::builder for one server",
                        addr.0, addr.1
                    ))
                }
                e => e,
            })?;
        let ranges = parse_slots(&replies[1], &addr.0)?;
        let timeout = cfg.connect_timeout;
        let conn = SlotsConn {
            read,
            write,
            parser,
            timeout,
        };
        Ok((conn, ranges))
    }

    /// Asks for the slot table again, waiting at most the connect timeout
    /// (as for the handshake): a stalled node holds the refresher, and a
    /// cache's drop, no longer than that.
    fn ask(&mut self, asked: &str) -> Result<Vec<Range>, Error> {
        self.read
            .tcp()
            .set_read_timeout(Some(self.timeout))
            .map_err(Error::io)?;
        self.write
            .send(b"*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n")
            .map_err(Error::io)?;
        let reply = self.parser.parse_value(&mut self.read).map_err(|e| {
            if e.is_timeout() {
                connect::no_answer("waiting for the reply to CLUSTER SLOTS", Some(self.timeout))
            } else {
                Error::connection(io::ErrorKind::InvalidData, &e.to_string())
            }
        })?;
        match reply {
            Value::ServerError(e) => Err(Error::Server(format!("CLUSTER SLOTS: {e:?}"))),
            reply => parse_slots(&reply, asked),
        }
    }
}

impl Drop for SlotsConn {
    fn drop(&mut self) {
        self.write.shutdown();
    }
}

impl<K: CacheKey, V: CacheValue> Cluster<K, V> {
    /// Asks the seeds (in order, the first that answers) for the slot
    /// table, links every primary, and starts the refresher.
    pub(crate) fn start(
        base: Config,
        seeds: Vec<(String, u16)>,
        near: Arc<ExpireMap<K, V>>,
    ) -> Result<Arc<Self>, Error> {
        let mut last = Error::Config("the cluster builder needs at least one seed node".into());
        let mut ranges = None;
        for s in &seeds {
            match SlotsConn::open(&base, s) {
                Ok((_, r)) => {
                    ranges = Some(r);
                    break;
                }
                Err(e @ Error::Config(_)) => return Err(e),
                Err(e) => last = e.at(&format!("cluster node {}:{}", s.0, s.1)),
            }
        }
        let ranges = ranges.ok_or(last)?;
        let c = Arc::new(Cluster {
            base,
            seeds,
            near,
            clock: SystemClock::new(),
            table: RwLock::new(Table {
                slots: vec![None; SLOTS],
                nodes: Vec::new(),
            }),
            linking: Mutex::new(()),
            closing: AtomicBool::new(false),
            refresher: Mutex::new(None),
        });
        // On an error, dropping `c`... would leave the linked nodes' threads:
        // stop them first.
        if let Err(e) = c.apply(&ranges, true) {
            c.close_all();
            return Err(e);
        }
        let me = Arc::clone(&c);
        let h = thread::Builder::new()
            .name("expiremap-redis-cluster".into())
            .spawn(move || me.refresh_loop())
            .map_err(|e| {
                c.close_all();
                Error::io(e)
            })?;
        *lock(&c.refresher) = Some(h);
        Ok(c)
    }

    /// The link to the node at `addr`, linking it first if need be (on this
    /// thread, no lock of the table held while it connects).
    fn node(&self, addr: &(String, u16)) -> Result<(usize, Arc<Shared<K, V>>), Error> {
        let find = |t: &Table<K, V>| {
            t.nodes
                .iter()
                .position(|n| n.addr == *addr)
                .map(|i| (i, Arc::clone(&t.nodes[i].link)))
        };
        if let Some(found) = find(&read(&self.table)) {
            return Ok(found);
        }
        let _one = lock(&self.linking);
        if let Some(found) = find(&read(&self.table)) {
            return Ok(found);
        }
        let mut cfg = self.base.clone();
        (cfg.host, cfg.port) = addr.clone();
        let link = Arc::new(Shared::with_clock(Arc::clone(&self.near), cfg, self.clock));
        let supervisor = link.start()?;
        let mut t = write(&self.table);
        t.nodes.push(Node {
            addr: addr.clone(),
            link: Arc::clone(&link),
            supervisor: Some(supervisor),
        });
        Ok((t.nodes.len() - 1, link))
    }

    /// Makes `ranges` the slot table. Links the primaries not linked yet
    /// (`strict`: a node that cannot be linked is an error; otherwise its
    /// slots stay unmapped until a later refresh), stops the links to nodes
    /// that own no slot any more, and drops every near copy if any slot
    /// changed hands.
    fn apply(&self, ranges: &[Range], strict: bool) -> Result<(), Error> {
        let mut slots = vec![None; SLOTS];
        for (a, b, addr) in ranges {
            let i = match self.node(addr) {
                Ok((i, _)) => Some(i),
                Err(e) if strict => return Err(e),
                Err(_) => None,
            };
            for s in *a..=*b {
                slots[usize::from(s)] = i;
            }
        }
        let (changed, idle) = {
            let mut t = write(&self.table);
            let changed = t.slots != slots;
            t.slots = slots;
            // Links to nodes without slots are stopped; indices shift, so
            // the table is rebuilt around the nodes kept.
            let used: Vec<bool> = (0..t.nodes.len())
                .map(|i| t.slots.contains(&Some(i)))
                .collect();
            let mut idle = Vec::new();
            if used.iter().any(|u| !u) {
                let mut remap = vec![None; t.nodes.len()];
                let mut kept = Vec::new();
                for (i, n) in std::mem::take(&mut t.nodes).into_iter().enumerate() {
                    if used[i] {
                        remap[i] = Some(kept.len());
                        kept.push(n);
                    } else {
                        idle.push(n);
                    }
                }
                t.nodes = kept;
                for s in t.slots.iter_mut() {
                    *s = s.and_then(|i| remap[i]);
                }
            }
            (changed, idle)
        };
        for n in idle {
            n.stop();
        }
        if changed {
            self.near.clear();
        }
        Ok(())
    }

    /// Asks for the slot table on `conn` (the node last asked), or, if
    /// that fails, on a new connection to a node (known ones first, then
    /// the seeds), and applies it.
    fn refresh(&self, conn: &mut Option<(SlotsConn, Addr)>) {
        if let Some((c, addr)) = conn.as_mut() {
            match c.ask(&addr.0) {
                Ok(r) => {
                    let _ = self.apply(&r, false);
                    return;
                }
                Err(_) => *conn = None,
            }
        }
        let mut addrs: Vec<Addr> = read(&self.table)
            .nodes
            .iter()
            .map(|n| n.addr.clone())
            .collect();
        addrs.extend(self.seeds.iter().cloned());
        for a in addrs {
            if let Ok((c, r)) = SlotsConn::open(&self.base, &a) {
                *conn = Some((c, a));
                let _ = self.apply(&r, false);
                return;
            }
        }
    }

    fn refresh_loop(self: Arc<Self>) {
        let mut conn = None;
        while !self.closing.load(Ordering::Acquire) {
            thread::park_timeout(REFRESH_EVERY);
            if self.closing.load(Ordering::Acquire) {
                break;
            }
            self.refresh(&mut conn);
        }
    }

    /// Asks the refresher for a new slot table now.
    fn kick(&self) {
        if let Some(h) = lock(&self.refresher).as_ref() {
            h.thread().unpark();
        }
    }

    /// The link of `slot`'s primary.
    fn route(&self, slot: u16) -> Result<Arc<Shared<K, V>>, Error> {
        let t = read(&self.table);
        match t.slots[usize::from(slot)] {
            Some(i) => Ok(Arc::clone(&t.nodes[i].link)),
            None => {
                drop(t);
                self.kick();
                Err(Error::connection(
                    io::ErrorKind::NotConnected,
                    &format!("no primary of the cluster is linked for slot {slot}"),
                ))
            }
        }
    }

    /// Follows a redirect: the link of its node (and, for `MOVED`, the slot
    /// is pointed at it, and a refresh is asked for).
    fn follow(&self, r: &Redirect) -> Result<Arc<Shared<K, V>>, Error> {
        let (_, link) = self.node(&r.addr)?;
        if !r.ask {
            let mut t = write(&self.table);
            // By address: a refresh may have renumbered the nodes.
            if let Some(i) = t.nodes.iter().position(|n| n.addr == r.addr) {
                t.slots[usize::from(r.slot)] = Some(i);
            }
            drop(t);
            self.near.clear();
            self.kick();
        }
        Ok(link)
    }

    /// `true` if every node's link is fresh.
    fn all_fresh(&self) -> bool {
        let now = self.clock.now();
        let t = read(&self.table);
        !t.nodes.is_empty() && t.nodes.iter().all(|n| n.link.fresh_at(now))
    }
}

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

    /// Sends with `send` (given the link, and whether to send `ASKING`
    /// first) and waits for the reply, following a cluster's redirects.
    /// Connection errors name their server.
    pub(crate) fn run<T>(
        &self,
        key: &K,
        prefix: &[u8],
        send: impl Fn(&Shared<K, V>, bool) -> Result<Receiver<T>, Error>,
    ) -> Result<T, Error> {
        let mut link = self.first(key, prefix)?;
        let mut asking = false;
        for _ in 0..MAX_REDIRECTS {
            let r = send(&link, asking)
                .and_then(Receiver::wait)
                .map_err(|e| self.at(e, &link));
            match self.redirected(r) {
                ControlFlow::Continue(next) => (link, asking) = next,
                ControlFlow::Break(done) => return done,
            }
        }
        Err(too_many())
    }

    /// [`run`](Self::run), awaiting the replies.
    pub(crate) async fn run_async<T>(
        &self,
        key: &K,
        prefix: &[u8],
        send: impl Fn(&Shared<K, V>, bool) -> Result<Receiver<T>, Error>,
    ) -> Result<T, Error> {
        let mut link = self.first(key, prefix)?;
        let mut asking = false;
        for _ in 0..MAX_REDIRECTS {
            let r = match send(&link, asking) {
                Ok(rx) => rx.await,
                Err(e) => Err(e),
            }
            .map_err(|e| self.at(e, &link));
            match self.redirected(r) {
                ControlFlow::Continue(next) => (link, asking) = next,
                ControlFlow::Break(done) => return done,
            }
        }
        Err(too_many())
    }

    /// What one try's result leads to: `Break` ends the call with that
    /// result (a reply, or an error that is no redirect); `Continue` is a
    /// cluster's redirect: the link to try next and whether to send ASKING
    /// first.
    fn redirected<T>(&self, r: Result<T, Error>) -> ControlFlow<Result<T, Error>, Retry<K, V>> {
        match (self, r) {
            (Links::Cluster(c), Err(e)) => match Redirect::parse(&e) {
                Some(red) => match c.follow(&red) {
                    Ok(link) => ControlFlow::Continue((link, red.ask)),
                    Err(e) => ControlFlow::Break(Err(e)),
                },
                None => ControlFlow::Break(Err(e)),
            },
            (_, r) => ControlFlow::Break(r),
        }
    }

    /// A call's connection error, naming the server it is about.
    fn at(&self, e: Error, link: &Shared<K, V>) -> Error {
        match e {
            Error::Connection(_) => e.at(&link.cfg.node()),
            e => e,
        }
    }

    /// `true` while every link has a connection.
    pub(crate) fn connected(&self) -> bool {
        self.each(|l| l.connected()).into_iter().all(|c| c)
    }

    /// The first reconnecting link's last failed attempt.
    pub(crate) fn last_error(&self) -> Option<Error> {
        self.each(|l| l.last_error()).into_iter().flatten().next()
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

impl<K, V> Cluster<K, V> {
    fn close_all(&self) {
        self.closing.store(true, Ordering::Release);
        let h = lock(&self.refresher).take();
        if let Some(h) = h {
            h.thread().unpark();
            let _ = h.join();
        }
        let nodes = std::mem::take(&mut write(&self.table).nodes);
        for n in nodes {
            n.stop();
        }
    }
}

/// The link a redirected call tries next, and whether to send ASKING first.
type Retry<K, V> = (Arc<Shared<K, V>>, bool);

fn too_many() -> Error {
    Error::Protocol(format!(
        "more than {MAX_REDIRECTS} cluster redirects (MOVED/ASK) for one call"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_and_slots_match_redis() {
        // The check value of CRC16/XMODEM, and the Redis Cluster spec's.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        // Hash tags: the first {...} with something inside.
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }

    #[test]
    fn redirects_parse() {
        let r = Redirect::parse(&Error::Server("MOVED 3999 127.0.0.1:6381".into())).unwrap();
        assert!(!r.ask);
        assert_eq!((r.slot, r.addr), (3999, ("127.0.0.1".to_string(), 6381)));
        let r = Redirect::parse(&Error::Server("ASK 1 ::1:7000".into())).unwrap();
        assert!(r.ask);
        assert_eq!(r.addr, ("::1".to_string(), 7000));
        assert!(Redirect::parse(&Error::Server("WRONGTYPE x".into())).is_none());
    }
}

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
//! * The slot table comes from `CLUSTER SLOTS` ([`crate::slots`]), asked on
//!   a connection of its own (kept open, moved to another node when it
//!   fails or is contradicted): at build, every second, and at once after
//!   a `MOVED`. A `MOVED` also points the slot at its new primary at once;
//!   an `ASK` (a slot in migration) resends the one command with `ASKING`
//!   to the node named.
//! * Which answer is taken: at build, the first seed's that maps some
//!   slot. Then an answer equal to the table in use confirms it; one that
//!   differs is taken only if another node (a linked primary, else a
//!   seed) answers the same, or if no other node answers. Otherwise the
//!   table stays and the other node is asked first from then on: a node
//!   removed from the cluster by `redis-cli --cluster del-node` (reset to
//!   an empty table, it keeps running) or one that is behind is left, and
//!   one that was ahead is confirmed by a later read. An empty table is
//!   never taken (it would leave no slot served). A read that gives no
//!   table to trust (no node answers, two nodes and the table in use all
//!   differ, only an empty table) keeps the table in use; its error is
//!   kept until a read succeeds (`NearCache::last_slot_table_error`, and
//!   the error of a call that finds no primary for its slot).
//! * Linking a primary never connects on the caller's thread nor under a
//!   lock: the link's own supervisor thread connects (and reconnects while
//!   it cannot). A call to a link whose first attempt has not ended waits
//!   for it (parked, or awaiting: a stalled node holds up only the calls
//!   that wait on it), at most `FIRST_ATTEMPT_WAIT` connect timeouts, then
//!   fails with the attempt's error, naming the node. `build` waits for
//!   every primary's first attempt (in parallel); one that cannot be
//!   reached is no error there: its slots' calls fail, naming it, while its
//!   link keeps trying.
//! * When the slot table changes, every near copy is dropped (a copy's
//!   invalidations come from the node that held its key). A link to a
//!   node left without slots is stopped once no call waits on it (at most
//!   the call timeout later), so the calls sent there before the change
//!   get their replies (a `MOVED`, followed) rather than a lost
//!   connection. When a node's
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
//!
//! This file holds [`Cluster`], the slot table and the links to the
//! primaries; `links` holds [`Links`], where a call's tries go and the
//! redirects they follow.

use crate::codec::{CacheKey, CacheValue};
use crate::connect::Config;
use crate::error::Error;
use crate::link::{Floor, Shared};
use crate::reply::Receiver;
use crate::slots::{Addr, Range, Redirect, SLOTS, SlotsConn, label};
use expiremap::{Clock, ExpireMap, SystemClock};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

mod links;

pub(crate) use links::Links;

/// Redirects followed by one call before it fails.
const MAX_REDIRECTS: usize = 5;

/// How often the slot table is asked for when nothing prompts it.
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// A primary's link and its supervisor thread.
struct Node<K, V> {
    addr: Addr,
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

/// The connection the slot table is read on, and its node.
type Asked = Option<(SlotsConn, Addr)>;

/// A cache's view of a cluster.
pub(crate) struct Cluster<K, V> {
    /// The settings every node's link starts from (host and port replaced).
    base: Config,
    seeds: Vec<Addr>,
    near: Arc<ExpireMap<K, V>>,
    /// The clock of every link.
    clock: SystemClock,
    /// Read on every call (and on a near hit when `floor` says recount).
    table: RwLock<Table<K, V>>,
    /// The least `fresh_until` of the links, cached for near hits.
    floor: Arc<Floor>,
    /// Serializes the linking of new nodes (no connect runs under it: a
    /// link connects on its own thread).
    linking: Mutex<()>,
    /// Why the last read of the slot table gave no table to trust; `None`
    /// since one did.
    table_error: Mutex<Option<Error>>,
    /// Links to nodes that lost their slots, with a deadline: stopped
    /// once no call waits on them (their replies, a `MOVED` or the value,
    /// are still applied), or at the deadline (the call timeout).
    retiring: Mutex<Vec<(Node<K, V>, Instant)>>,
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

/// The error of a read that gave only an empty slot table.
fn empty(addr: &Addr) -> Error {
    Error::Protocol(format!(
        "{}: answered an empty slot table (a node removed from its cluster, or no slot \
         assigned yet); not taken",
        label(addr)
    ))
}

impl<K: CacheKey, V: CacheValue> Cluster<K, V> {
    /// Asks the seeds (in order, the first that answers with some slot)
    /// for the slot table, links every primary (waiting for their first
    /// attempts to connect, in parallel) and starts the refresher.
    pub(crate) fn start(
        base: Config,
        seeds: Vec<Addr>,
        near: Arc<ExpireMap<K, V>>,
    ) -> Result<Arc<Self>, Error> {
        let mut last = Error::Config("the cluster builder needs at least one seed node".into());
        let mut first = None;
        for s in &seeds {
            match SlotsConn::open(&base, s) {
                Ok((_, r)) if r.is_empty() => last = empty(s),
                Ok((conn, r)) => {
                    first = Some(((conn, s.clone()), r));
                    break;
                }
                Err(e @ Error::Config(_)) => return Err(e),
                Err(e) => last = e,
            }
        }
        let (asked, ranges) = first.ok_or(last)?;
        let c = Arc::new(Cluster {
            base,
            seeds,
            near,
            clock: SystemClock::new(),
            table: RwLock::new(Table {
                slots: vec![None; SLOTS],
                nodes: Vec::new(),
            }),
            floor: Arc::default(),
            linking: Mutex::new(()),
            table_error: Mutex::new(None),
            closing: AtomicBool::new(false),
            retiring: Mutex::new(Vec::new()),
            refresher: Mutex::new(None),
        });
        // On an error, dropping `c` would leave the linked nodes' threads:
        // stop them first.
        if let Err(e) = c.apply(&ranges) {
            c.close_all();
            return Err(e);
        }
        let firsts: Vec<Receiver<()>> = read(&c.table)
            .nodes
            .iter()
            .filter_map(|n| n.link.first_attempt())
            .collect();
        for f in firsts {
            let _ = f.wait();
        }
        let me = Arc::clone(&c);
        let h = thread::Builder::new()
            .name("expiremap-redis-cluster".into())
            .spawn(move || me.refresh_loop(Some(asked)))
            .map_err(|e| {
                c.close_all();
                Error::io(e)
            })?;
        *lock(&c.refresher) = Some(h);
        Ok(c)
    }

    /// The link to the node at `addr`, linking it first if need be (its
    /// supervisor thread connects: nothing here waits for the network).
    fn node(&self, addr: &Addr) -> Result<(usize, Arc<Shared<K, V>>), Error> {
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
        // A redirect followed by a reader while the cache closes links no
        // node that nothing would stop: `close_all` sets `closing`, then
        // takes the nodes under `linking`.
        if self.closing.load(Ordering::Acquire) {
            return Err(Error::connection(
                io::ErrorKind::NotConnected,
                "the cache is closing",
            ));
        }
        let mut cfg = self.base.clone();
        (cfg.host, cfg.port) = addr.clone();
        let link = Arc::new(Shared::with_clock(
            Arc::clone(&self.near),
            cfg,
            self.clock,
            Some(Arc::clone(&self.floor)),
        ));
        let supervisor = link.spawn(None)?;
        let mut t = write(&self.table);
        t.nodes.push(Node {
            addr: addr.clone(),
            link: Arc::clone(&link),
            supervisor: Some(supervisor),
        });
        let i = t.nodes.len() - 1;
        drop(t);
        self.floor.lower();
        Ok((i, link))
    }

    /// The table in use, as normalized ranges (see
    /// [`crate::slots::parse_slots`]).
    fn ranges(&self) -> Vec<Range> {
        let t = read(&self.table);
        let mut out: Vec<Range> = Vec::new();
        for (s, owner) in t.slots.iter().enumerate() {
            let Some(i) = *owner else { continue };
            let s = s as u16;
            match out.last_mut() {
                Some(last) if last.2 == t.nodes[i].addr && last.1 + 1 == s => last.1 = s,
                _ => out.push((s, s, t.nodes[i].addr.clone())),
            }
        }
        out
    }

    /// Makes `ranges` the slot table: links the primaries not linked yet,
    /// retires the links to nodes that own no slot any more (stopped once
    /// no call waits on them: a call sent there before the change gets its
    /// reply, often a `MOVED`, instead of a lost connection), and drops
    /// every near copy if any slot changed hands.
    fn apply(&self, ranges: &[Range]) -> Result<bool, Error> {
        let mut slots = vec![None; SLOTS];
        for (a, b, addr) in ranges {
            let (i, _) = self.node(addr)?;
            for s in *a..=*b {
                slots[usize::from(s)] = Some(i);
            }
        }
        let (changed, idle) = {
            let mut t = write(&self.table);
            let changed = t.slots != slots;
            t.slots = slots;
            // Links to nodes without slots are retired; indices shift, so
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
        self.floor.lower();
        let deadline = crate::reply::far(Instant::now(), self.base.call_timeout);
        lock(&self.retiring).extend(idle.into_iter().map(|n| (n, deadline)));
        self.retire(false);
        if changed {
            self.near.clear();
        }
        Ok(changed)
    }

    /// A slot table: from `asked`'s node if it answers, else from the first
    /// node that does (linked primaries, then the seeds; never `except`),
    /// whose connection `asked` then holds. Returns who answered. A node
    /// that answers an empty table (one removed from the cluster, reset by
    /// `del-node`, keeps running) is passed over: it is not asked first
    /// again, and it neither gives nor contradicts a table.
    fn answer(
        &self,
        asked: &mut Asked,
        except: Option<&Addr>,
    ) -> Result<(Addr, Vec<Range>), Error> {
        let mut last = None;
        let mut tried: Vec<Addr> = Vec::new();
        if let Some((conn, addr)) = asked.as_mut() {
            tried.push(addr.clone());
            match conn.ask(addr) {
                Ok(r) if !r.is_empty() => return Ok((addr.clone(), r)),
                Ok(_) => last = Some(empty(addr)),
                Err(e) => last = Some(e),
            }
            *asked = None;
        }
        let mut addrs: Vec<Addr> = read(&self.table)
            .nodes
            .iter()
            .map(|n| n.addr.clone())
            .collect();
        addrs.extend(self.seeds.iter().cloned());
        for a in addrs {
            if Some(&a) == except || tried.contains(&a) {
                continue;
            }
            tried.push(a.clone());
            match SlotsConn::open(&self.base, &a) {
                Ok((_, r)) if r.is_empty() => last = Some(empty(&a)),
                Ok((conn, r)) => {
                    *asked = Some((conn, a.clone()));
                    return Ok((a, r));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            Error::Config("no other node of the cluster is known to ask for its slot table".into())
        }))
    }

    /// Reads the slot table and takes it if it is to be trusted (see the
    /// module docs, *Which answer is taken*); keeps the error of a read
    /// that gave none.
    fn refresh(&self, asked: &mut Asked) {
        let r = self.read_table(asked);
        *lock(&self.table_error) = r.err();
    }

    fn read_table(&self, asked: &mut Asked) -> Result<(), Error> {
        let (by, answer) = self.answer(asked, None)?;
        let current = self.ranges();
        if answer == current {
            return Ok(());
        }
        // A change, or a node that is wrong: ask another.
        let mut other = None;
        match self.answer(&mut other, Some(&by)) {
            Ok((_, second)) if second == answer => {}
            // The answer is not confirmed: the other node is asked first
            // from now on (a node that is wrong is not asked again, one
            // that was ahead will be confirmed by the next read).
            Ok((other_by, second)) => {
                *asked = other;
                if second == current {
                    return Ok(());
                }
                return Err(Error::Protocol(format!(
                    "{} and {} answer different slot tables (a change under way?); the table \
                     in use is kept until two nodes agree",
                    label(&by),
                    label(&other_by)
                )));
            }
            // No other node answers: the one that did is enough.
            Err(_) => {}
        }
        let changed = self.apply(&answer)?;
        #[cfg(feature = "tracing")]
        if changed {
            tracing::warn!(
                by = %label(&by),
                ranges = answer.len(),
                "expiremap-redis: the slot table changed; near copies dropped"
            );
        }
        let _ = changed;
        Ok(())
    }

    fn refresh_loop(self: Arc<Self>, mut asked: Asked) {
        while !self.closing.load(Ordering::Acquire) {
            thread::park_timeout(REFRESH_EVERY);
            if self.closing.load(Ordering::Acquire) {
                break;
            }
            self.refresh(&mut asked);
            self.retire(false);
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
                let why = match &*lock(&self.table_error) {
                    Some(e) => format!(" (the slot table could not be read: {e})"),
                    None => String::new(),
                };
                Err(Error::connection(
                    io::ErrorKind::NotConnected,
                    &format!("no primary of the cluster is linked for slot {slot}{why}"),
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

    /// A primary's link other than `link`, if there is one: the next in
    /// the table after it.
    fn other_than(&self, link: &Arc<Shared<K, V>>) -> Option<Arc<Shared<K, V>>> {
        let t = read(&self.table);
        let n = t.nodes.len();
        let at = t
            .nodes
            .iter()
            .position(|x| Arc::ptr_eq(&x.link, link))
            .unwrap_or(n);
        (1..=n)
            .map(|i| &t.nodes[(at + i) % n.max(1)])
            .find(|x| !Arc::ptr_eq(&x.link, link))
            .map(|x| Arc::clone(&x.link))
    }

    /// `true` if every node's link is fresh: one atomic load while the
    /// cached least `fresh_until` of the links allows (see [`Floor`]).
    #[inline]
    fn all_fresh(&self) -> bool {
        let now = self.clock.now();
        now <= self.floor.min.load(Ordering::SeqCst) || self.recount(now)
    }

    /// Counts the least `fresh_until` of the links again, under the
    /// table's read lock, and caches it unless a lowering raced the count.
    #[cold]
    fn recount(&self, now: u64) -> bool {
        let lowered = self.floor.lowerings.load(Ordering::SeqCst);
        let min = {
            let t = read(&self.table);
            t.nodes
                .iter()
                .map(|n| n.link.fresh_until())
                .min()
                .unwrap_or(0)
        };
        self.floor.min.store(min, Ordering::SeqCst);
        if self.floor.lowerings.load(Ordering::SeqCst) != lowered {
            self.floor.min.store(0, Ordering::SeqCst);
        }
        now <= min && min != 0
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
        let nodes = {
            let _one = lock(&self.linking);
            std::mem::take(&mut write(&self.table).nodes)
        };
        self.floor.lower();
        for n in nodes {
            n.stop();
        }
        self.retire(true);
    }

    /// Stops the retiring links that no call waits on, or past their
    /// deadline (`all`: every one), outside the lock.
    fn retire(&self, all: bool) {
        let now = Instant::now();
        let done: Vec<Node<K, V>> = {
            let mut r = lock(&self.retiring);
            let (done, kept) = std::mem::take(&mut *r)
                .into_iter()
                .partition(|(n, at)| all || now >= *at || n.link.quiet());
            *r = kept;
            done.into_iter().map(|(n, _)| n).collect()
        };
        for n in done {
            n.stop();
        }
    }
}

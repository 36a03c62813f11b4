//! The data connection of a cache, its reader and its supervisor.
//!
//! # Ground rules
//!
//! * One TCP connection per cache, in RESP3, with `CLIENT TRACKING ON BCAST
//!   PREFIX <prefix> NOLOOP`. Every command of the cache goes through it, and
//!   the server's invalidation pushes come back on it, in the order in which
//!   the server produced them relative to the replies.
//! * Callers write a command and push its [`Op`] on `pending` under the
//!   `link` mutex (so the queue order is the wire order), then wait for their
//!   reply in a slot of their own ([`crate::reply`]), with no lock held:
//!   parked (the blocking calls) or awaiting (the async ones, woken by the
//!   reader, or by the supervisor at their call timeout).
//! * The *reader* thread is the only writer of the near map (puts, removes,
//!   clears), and it applies replies and pushes one by one in wire order. A
//!   reply's value is stored in the near map only by the reader, before it
//!   reads the next message: an invalidation that the server sent after that
//!   reply is applied after the store, and one it sent before is applied
//!   before the value is read. No stored value can outlive an invalidation
//!   of it that reached this connection.
//! * `NOLOOP`: the server does not send us invalidations for our own writes
//!   (they arrive as replies and the reader stores their values instead), so
//!   a `put` leaves a near copy that lasts.
//! * The *supervisor* thread pings every `staleness / 4`. A `PONG` for a
//!   ping sent at `t` proves that every invalidation the server produced
//!   before it read that ping has been applied, so the reader raises
//!   `fresh_until` to `t + staleness`, and near copies are served only while
//!   the clock is at or below it. Freshness is not liveness: a late ping
//!   only stops near hits; the connection is closed when a ping has gone
//!   unanswered for the longer of `staleness` and the call timeout, and a
//!   caller stops waiting after the call timeout (its op stays queued, and
//!   its reply, if it comes, is applied like any other).
//! * User code (`Deserialize`, `Hash`, `Clone`...) runs on the reader. The
//!   codec turns a panic or a too deep value into a codec error; any other
//!   panic ends the reader, and its cleanup runs all the same (a drop
//!   guard): pending calls fail, the connection closes, the supervisor
//!   reconnects.
//! * The server's `expired` key events (`redis_expirations`) come on a
//!   connection of their own ([`crate::expirations`]), never on this one.
//! * A lost connection: the reader lowers `fresh_until` to 0, takes the
//!   connection out of `link` (new calls fail at once, with the last
//!   failed attempt's cause once there is one), fails every pending call,
//!   clears the near map and ends. The supervisor joins it before it
//!   connects again, so a new connection starts with an empty near map.
//! * The stream is plain TCP or TLS ([`crate::wire`]); nothing here depends
//!   on which.

use crate::codec::{self, CacheKey, CacheValue};
use crate::connect::{Config, cluster_enabled, dial, handshake, hello, server_major};
use crate::error::Error;
use crate::monitor::Counters;
use crate::op::{self, Hop, Op, Reply};
use crate::reply::{self, Receiver};
use crate::script::{self, FETCH, LEASE, Leased, RELEASE, STAGE, STORE, staging_of};
use crate::wire::{ReadHalf, WriteHalf};
use expiremap::{Clock, ExpireMap, SystemClock};
use redis::{Parser, PushKind, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::VecDeque;
use std::fmt;
use std::hash::Hash;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::Waker;
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

/// Redis keeps deadlines in whole milliseconds of its clock, read when the
/// command runs: the server may expire a key up to 1 ms before `sent + ttl`
/// (and `ExpireMap::put` reads its own clock a little after ours). A near
/// copy's life is cut by this much, so that it ends before the earliest
/// instant the server could drop the key.
const SLACK: Duration = Duration::from_millis(2);

/// Largest `PX` we send (about 35,000 years): the server refuses a deadline
/// past `i64::MAX` ms.
pub(crate) const MAX_PX_MS: u128 = 1 << 50;

/// How many connect timeouts a call waits at most for the first attempt
/// of a link to end (a connect is a TCP connect, maybe a TLS handshake,
/// and the handshake's replies, each bounded by the connect timeout).
const FIRST_ATTEMPT_WAIT: u32 = 4;

/// Most time between two attempts to reconnect.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// The live connection: its write half and the calls waiting on it.
pub(crate) struct Conn<K, V> {
    /// Shared with the supervisor, which writes what callers' sends left
    /// (see [`crate::wire`]) without the link's mutex.
    stream: Arc<WriteHalf>,
    pub(crate) pending: VecDeque<Op<K, V>>,
    /// When the ping in flight was sent.
    ping_sent: Option<u64>,
    last_ping: u64,
}

/// A cluster's cache of the least `fresh_until` of its links, so that a
/// near hit reads one atomic instead of every link under the table's lock
/// (a shared write on every hit). Raised only by
/// [`Cluster`](crate::cluster)'s recount; lowered to 0 (recount at the next
/// hit) whenever a link's `fresh_until` drops or the table changes. `lowerings`
/// counts the lowerings: a recount that raced one does not stand.
#[derive(Debug, Default)]
pub(crate) struct Floor {
    pub(crate) min: AtomicU64,
    pub(crate) lowerings: AtomicU64,
}

impl Floor {
    /// A link's `fresh_until` dropped, or the links changed: recount.
    pub(crate) fn lower(&self) {
        self.lowerings.fetch_add(1, Ordering::SeqCst);
        self.min.store(0, Ordering::SeqCst);
    }
}

/// What the cache handle, the reader and the supervisor share.
pub(crate) struct Shared<K, V> {
    /// The near map (one per cache, shared by the links to the nodes of
    /// a cluster).
    pub(crate) near: Arc<ExpireMap<K, V>>,
    pub(crate) clock: SystemClock,
    pub(crate) cfg: Config,
    /// Near copies may be served while `clock.now() <= fresh_until`.
    fresh_until: AtomicU64,
    /// A cluster's cached least `fresh_until` of its links, lowered
    /// whenever this link's drops (see [`Floor`]).
    floor: Option<Arc<Floor>>,
    /// When the ping in flight was sent (0: none), for a reader of
    /// [`stalled`](Self::stalled) without the link's mutex.
    ping_out: AtomicU64,
    link: Mutex<Option<Conn<K, V>>>,
    closing: AtomicBool,
    supervisor: OnceLock<Thread>,
    /// Connections made so far (the first included).
    pub(crate) connects: AtomicU64,
    /// Why the last attempt to reconnect failed, while the cache is down.
    last_error: Mutex<Option<Error>>,
    /// Attempts to connect that have ended, well or not.
    attempts: AtomicU64,
    /// Calls waiting for the end of the first attempt (a cluster's node
    /// linked by a redirect); woken, with no lock held, when it ends.
    first: Mutex<Vec<reply::Sender<()>>>,
    /// The server has `EVAL_RO` (read at each connection, from `HELLO`).
    eval_ro: AtomicBool,
    /// The server lets this user run `MULTI` (tried at each connection).
    multi: AtomicBool,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Why a call finds no connection: the cache is reconnecting, and, once an
/// attempt has failed, why it failed (the error's `source`).
#[derive(Debug)]
struct Reconnecting(Option<Error>);

impl fmt::Display for Reconnecting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => write!(f, "not connected (the cache is reconnecting)"),
            Some(e) => write!(
                f,
                "not connected (the cache is reconnecting; the last attempt failed: {e})"
            ),
        }
    }
}

impl std::error::Error for Reconnecting {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.as_ref().map(|e| e as _)
    }
}

fn down(cause: Option<Error>) -> Error {
    Error::Connection(Arc::new(io::Error::new(
        io::ErrorKind::NotConnected,
        Reconnecting(cause),
    )))
}

/// A handshaken connection: the stream, its parser (which may already hold
/// bytes past the handshake's replies), when tracking was asked for, and
/// whether the server has `EVAL_RO`.
pub(crate) struct Fresh {
    read: ReadHalf,
    write: WriteHalf,
    parser: Parser,
    tracking_sent: u64,
    eval_ro: bool,
    multi: bool,
}

impl<K, V> Shared<K, V>
where
    K: Hash + Eq + Clone + Serialize + DeserializeOwned + Send + Sync + 'static,
    V: Clone + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    pub(crate) fn new(near: Arc<ExpireMap<K, V>>, cfg: Config) -> Self {
        Self::with_clock(near, cfg, SystemClock::new(), None)
    }

    /// With the clock of the cache's other links (a cluster compares their
    /// freshness at one reading of it) and their [`Floor`].
    pub(crate) fn with_clock(
        near: Arc<ExpireMap<K, V>>,
        cfg: Config,
        clock: SystemClock,
        floor: Option<Arc<Floor>>,
    ) -> Self {
        Shared {
            near,
            clock,
            cfg,
            fresh_until: AtomicU64::new(0),
            floor,
            ping_out: AtomicU64::new(0),
            link: Mutex::new(None),
            closing: AtomicBool::new(false),
            supervisor: OnceLock::new(),
            connects: AtomicU64::new(0),
            last_error: Mutex::new(None),
            attempts: AtomicU64::new(0),
            first: Mutex::new(Vec::new()),
            eval_ro: AtomicBool::new(false),
            multi: AtomicBool::new(true),
        }
    }

    /// The error of a call that finds no connection.
    fn down(&self) -> Error {
        down(lock(&self.last_error).clone())
    }

    /// If no attempt to connect has ended yet: the end of the first (a
    /// reply of `()`, or an error once [`FIRST_ATTEMPT_WAIT`] connect
    /// timeouts have passed or the link is closed), for a call to wait on,
    /// parked or awaiting, before it uses the link.
    pub(crate) fn first_attempt(&self) -> Option<Receiver<()>> {
        if self.attempts.load(Ordering::Acquire) > 0 {
            return None;
        }
        let mut first = lock(&self.first);
        // Counted under this lock by `attempted`: no waiter is missed.
        if self.attempts.load(Ordering::Acquire) > 0 {
            return None;
        }
        let (tx, rx) = reply::channel(self.cfg.connect_timeout.saturating_mul(FIRST_ATTEMPT_WAIT));
        first.push(tx);
        Some(rx)
    }

    /// An attempt to connect has ended: wakes those waiting for the first.
    fn attempted(&self) {
        let waiting = {
            let mut first = lock(&self.first);
            self.attempts.fetch_add(1, Ordering::AcqRel);
            std::mem::take(&mut *first)
        };
        for tx in waiting {
            tx.send(Ok(()));
        }
    }

    /// After a first attempt to connect: `Ok` while connected; else the
    /// failed attempt's error, or `None` if the link was closed (retired)
    /// with no attempt failed.
    pub(crate) fn settled(&self) -> Result<(), Option<Error>> {
        if self.connected() {
            return Ok(());
        }
        // The guard is dropped before `down` takes the lock again (a
        // guard in a `match`'s scrutinee would live through its arms).
        let last = lock(&self.last_error).clone();
        match last {
            Some(e) => Err(Some(e)),
            None if self.closed() => Err(None),
            None => Err(Some(self.down())),
        }
    }

    /// Why the last attempt to connect failed, while the cache is down.
    pub(crate) fn last_error(&self) -> Option<Error> {
        if self.connected() {
            return None;
        }
        lock(&self.last_error).clone()
    }

    /// `true` while near copies may be served: the last answered ping was
    /// sent less than the staleness bound ago.
    #[inline]
    pub(crate) fn fresh(&self) -> bool {
        self.fresh_at(self.clock.now())
    }

    /// Until when near copies may be served (see
    /// [`fresh_at`](Self::fresh_at)).
    pub(crate) fn fresh_until(&self) -> u64 {
        self.fresh_until.load(Ordering::Acquire)
    }

    fn lower_floor(&self) {
        if let Some(f) = &self.floor {
            f.lower();
        }
    }

    /// [`fresh`](Self::fresh) at `now`, a reading of this link's clock.
    #[inline]
    pub(crate) fn fresh_at(&self, now: u64) -> bool {
        now <= self.fresh_until.load(Ordering::Acquire)
    }

    pub(crate) fn connected(&self) -> bool {
        self.link().is_some()
    }

    /// If the server has left a ping unanswered for longer than the ping
    /// interval (a quarter of the staleness bound; a server that answers
    /// at all answers far sooner): for how long.
    pub(crate) fn stalled(&self) -> Option<Duration> {
        let out = self.ping_out.load(Ordering::Acquire);
        if out == 0 {
            return None;
        }
        let waited = self.clock.now().saturating_sub(out);
        (waited > nanos(self.cfg.ping_every())).then(|| Duration::from_nanos(waited))
    }

    /// `true` if the server let this user run `MULTI` when it connected.
    pub(crate) fn multi(&self) -> bool {
        self.multi.load(Ordering::Relaxed)
    }

    // ---- calls ----

    /// Writes `cmd` and queues the op `make` builds (given the send time and
    /// the reply's sender); the caller waits on the receiver (parked or
    /// awaiting), at most the call timeout. A call that times out leaves
    /// its op queued: the reply, if it comes, is applied (and its near copy
    /// stored) as any other.
    pub(crate) fn call<T>(
        &self,
        cmd: &[u8],
        hop: Hop,
        make: impl FnOnce(u64, Reply<T>) -> Op<K, V>,
    ) -> Result<Receiver<T>, Error> {
        self.call_after(cmd, hop, 0, make)
    }

    /// [`call`](Self::call) for `skipped + 1` commands (`MULTI`...`EXEC`).
    pub(crate) fn call_after<T>(
        &self,
        cmd: &[u8],
        hop: Hop,
        skipped: usize,
        make: impl FnOnce(u64, Reply<T>) -> Op<K, V>,
    ) -> Result<Receiver<T>, Error> {
        let asking = hop.asking;
        let (tx, rx) = match hop.deadline {
            Some(at) => reply::channel_until(at, self.cfg.call_timeout),
            None => reply::channel(self.cfg.call_timeout),
        };
        let mut link = self.link();
        let Some(conn) = link.as_mut() else {
            drop(link);
            return Err(self.down());
        };
        let sent = self.clock.now();
        let mut done = true;
        if asking {
            conn.pending.push_back(Op::Asking);
            done &= self.send(conn, b"*1\r\n$6\r\nASKING\r\n");
        }
        conn.pending.extend((0..skipped).map(|_| Op::Asking));
        conn.pending.push_back(make(sent, tx));
        done &= self.send(conn, cmd);
        drop(link);
        if !done {
            // The supervisor writes the rest when the socket takes it.
            self.kick();
        }
        Ok(rx)
    }

    /// Queues `bytes` on the connection, writing what the socket takes now
    /// (never waiting); `false` if some is left for the supervisor. A
    /// failed write shuts the connection down: the reader sees it and
    /// fails every pending op.
    fn send(&self, conn: &Conn<K, V>, bytes: &[u8]) -> bool {
        match conn.stream.send(bytes) {
            Ok(done) => done,
            Err(_) => {
                conn.stream.shutdown();
                true
            }
        }
    }

    /// Wakes the supervisor.
    fn kick(&self) {
        if let Some(t) = self.supervisor.get() {
            t.unpark();
        }
    }

    /// The value of `key` in Redis (value and remaining TTL in one script),
    /// leaving a near copy.
    pub(crate) fn fetch(&self, key: &K, hop: Hop) -> Result<Receiver<Option<V>>, Error> {
        let name = codec::redis_key(&self.cfg.prefix, key)?;
        let eval = if self.eval_ro.load(Ordering::Relaxed) {
            "EVAL_RO"
        } else {
            "EVAL"
        };
        let cmd = redis::cmd(eval)
            .arg(FETCH)
            .arg(1)
            .arg(name)
            .get_packed_command();
        self.call(&cmd, hop, |sent, tx| Op::Fetch {
            key: key.clone(),
            sent,
            tx,
        })
    }

    /// `SET name value PX ttl [NX]`; `Ok(false)` only if `NX` declined. A
    /// plain `SET` replaces a lease held on the key too (see `lease`): one
    /// key, one command, whatever the slot's state.
    pub(crate) fn set(
        &self,
        key: K,
        value: V,
        ttl: Duration,
        nx: bool,
        hop: Hop,
    ) -> Result<Receiver<bool>, Error> {
        let name = codec::redis_key(&self.cfg.prefix, &key)?;
        let bytes = codec::encode_value(&value)?;
        let ms = ttl.as_nanos().div_ceil(1_000_000).clamp(1, MAX_PX_MS);
        let mut set = redis::cmd("SET");
        set.arg(&name).arg(bytes).arg("PX").arg(ms as u64);
        let step = if nx {
            set.arg("NX");
            op::PUT_NX
        } else {
            op::PUT
        };
        self.call(&set.get_packed_command(), hop, |sent, tx| Op::Set {
            key,
            value,
            ttl,
            sent,
            tx,
            step,
            aborted: None,
        })
    }

    /// [`script::REMOVE`]: `GETDEL name`, or the lease held on it deleted.
    pub(crate) fn del(&self, key: &K, hop: Hop) -> Result<Receiver<Option<V>>, Error> {
        let name = codec::redis_key(&self.cfg.prefix, key)?;
        let cmd = redis::cmd("EVAL")
            .arg(script::REMOVE)
            .arg(1)
            .arg(name)
            .get_packed_command();
        self.call(&cmd, hop, |_, tx| Op::Del {
            key: key.clone(),
            tx,
        })
    }

    // ---- the reader's side ----

    /// Stores a near copy whose Redis key had `ttl` left (`None`: no
    /// expiry) when the command was sent at `sent`.
    pub(crate) fn store(&self, key: K, value: V, sent: u64, ttl: Option<Duration>) {
        let elapsed = Duration::from_nanos(self.clock.now().saturating_sub(sent));
        let left = match ttl {
            Some(t) => t.saturating_sub(elapsed + SLACK),
            None => Duration::MAX,
        }
        .min(self.cfg.max_near_ttl);
        if left.is_zero() {
            self.near.remove(&key);
        } else {
            self.near.put(key, value, left);
        }
    }

    fn invalidate(&self, data: Vec<Value>) {
        match data.into_iter().next() {
            Some(Value::Array(names) | Value::Set(names)) => {
                for name in names {
                    if let Value::BulkString(name) = &name {
                        self.cfg.waiters.wake(name);
                    }
                    if let Value::BulkString(name) = name
                        && let Some(k) = codec::key_of::<K>(&self.cfg.prefix, &name)
                    {
                        Counters::add(&self.cfg.monitor.invalidations);
                        self.near.remove(&k);
                    }
                }
            }
            // A null list: the server flushed its databases.
            _ => {
                Counters::add(&self.cfg.monitor.invalidations);
                self.near.clear();
                self.cfg.waiters.wake_all();
            }
        }
    }

    fn apply(&self, op: Op<K, V>, reply: Value) {
        if let Value::ServerError(e) = reply {
            if let Some(k) = op.key() {
                self.near.remove(k);
            }
            return match op {
                // A command of a `MULTI` not queued: its `EXEC` fails with this.
                Op::Asking => self.queue_refused(&e),
                Op::Set {
                    aborted: Some(first),
                    tx,
                    ..
                } => tx.send(Err(first)),
                op => {
                    let e = op::at_step(&e, op.step());
                    op.fail(e);
                }
            };
        }
        match op {
            Op::Asking => {}
            Op::Ping { sent } => {
                let until = sent.saturating_add(nanos(self.cfg.staleness));
                self.fresh_until.fetch_max(until, Ordering::AcqRel);
            }
            Op::Fetch { key, sent, tx } => {
                let r = self.fetched(key, sent, reply);
                tx.send(r);
            }
            Op::Lease { key, sent, tx } => {
                let r = self.leased(key, sent, reply);
                tx.send(r);
            }
            Op::Release { tx, .. } => tx.send(Ok(())),
            Op::Set {
                key,
                value,
                ttl,
                sent,
                tx,
                step,
                ..
            } => {
                let r = op::written(reply, step);
                match r {
                    Ok(true) => {
                        self.wake_key(&key);
                        self.store(key, value, sent, Some(ttl));
                    }
                    Ok(false) => {}
                    Err(_) => drop(self.near.remove(&key)),
                }
                tx.send(r);
            }
            Op::Del { key, tx } => {
                self.near.remove(&key);
                self.wake_key(&key);
                let r = match reply {
                    Value::Nil | Value::Boolean(false) => Ok(None),
                    Value::BulkString(b) => codec::decode_value(&b).map(Some).map_err(|mut e| {
                        e.message.push_str(" (the key was deleted all the same)");
                        Error::from(e)
                    }),
                    other => Err(Error::Protocol(format!("GETDEL answered {other:?}"))),
                };
                tx.send(r);
            }
        }
    }

    /// The reader thread: applies replies and pushes until the connection
    /// ends, then cleans up (also if it ends in a panic of user code).
    fn read_loop(self: Arc<Self>, mut stream: ReadHalf, mut parser: Parser) {
        let _cleanup = OnDrop(|| self.reader_ended());
        loop {
            let value = match parser.parse_value(&mut stream) {
                Ok(v) => v,
                Err(_) => break,
            };
            match value {
                Value::Push {
                    kind: PushKind::Invalidate,
                    data,
                } => self.invalidate(data),
                Value::Push { .. } => {}
                reply => {
                    let op = {
                        let mut link = self.link();
                        let Some(conn) = link.as_mut() else { break };
                        let op = conn.pending.pop_front();
                        if let Some(Op::Ping { .. }) = op {
                            conn.ping_sent = None;
                            self.ping_out.store(0, Ordering::Release);
                        }
                        op
                    };
                    match op {
                        Some(op) => self.apply(op, reply),
                        // A reply nobody asked for: the stream is out of step.
                        None => break,
                    }
                }
            }
        }
    }

    /// After the reader's last message: the connection is lost.
    fn reader_ended(&self) {
        self.fresh_until.store(0, Ordering::Release);
        self.lower_floor();
        self.ping_out.store(0, Ordering::Release);
        let conn = self.link().take();
        if let Some(conn) = conn {
            conn.stream.shutdown();
            for op in conn.pending {
                op.fail(reply::lost());
            }
        }
        // Invalidations may have been missed from the moment the connection
        // broke: no near copy survives it, and lease waits look again.
        self.near.clear();
        self.cfg.waiters.wake_all();
        if let Some(t) = self.supervisor.get() {
            t.unpark();
        }
    }

    // ---- the supervisor's side ----

    /// Connects and handshakes: RESP3, credentials, database, tracking.
    pub(crate) fn connect(&self) -> Result<Fresh, Error> {
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

impl<K: CacheKey, V: CacheValue> Shared<K, V> {
    /// The first `MULTI` op waiting after a refused command keeps its
    /// error, naming the op's step.
    pub(crate) fn queue_refused(&self, e: &redis::ServerError) {
        if let Some(conn) = self.link().as_mut()
            && let Some(Op::Set { aborted, step, .. }) = conn
                .pending
                .iter_mut()
                .find(|op| matches!(op, Op::Set { .. }))
        {
            aborted.get_or_insert_with(|| op::at_step(e, step));
        }
    }

    /// The reply of a miss's read (the value and its PTTL), keeping a near
    /// copy; also the value of [`LEASE`]'s reply.
    pub(crate) fn fetched(&self, key: K, sent: u64, reply: Value) -> Result<Option<V>, Error> {
        let bad = |what: &Value| Error::Protocol(format!("fetch script answered {what:?}"));
        let Value::Array(items) = &reply else {
            self.near.remove(&key);
            return Err(bad(&reply));
        };
        let (value, pttl) = match items.as_slice() {
            [v, Value::Int(pttl)] => (v, *pttl),
            _ => {
                self.near.remove(&key);
                return Err(bad(&reply));
            }
        };
        match value {
            Value::BulkString(bytes) => match codec::decode_value::<V>(bytes) {
                Ok(v) => {
                    let ttl = match pttl {
                        -1 => None,
                        ms if ms >= 0 => Some(Duration::from_millis(ms as u64)),
                        // Gone between GET and PTTL cannot happen in a script;
                        // keep no copy if it does.
                        _ => Some(Duration::ZERO),
                    };
                    self.store(key, v.clone(), sent, ttl);
                    Ok(Some(v))
                }
                Err(e) => {
                    self.near.remove(&key);
                    Err(e.into())
                }
            },
            Value::Nil | Value::Boolean(false) => {
                self.near.remove(&key);
                Ok(None)
            }
            _ => {
                self.near.remove(&key);
                Err(bad(&reply))
            }
        }
    }

    /// Wakes the lease waits on `key` (after our own write of it, of which
    /// `NOLOOP` sends us no invalidation).
    pub(crate) fn wake_key(&self, key: &K) {
        if self.cfg.waiters.active()
            && let Ok(name) = codec::redis_key(&self.cfg.prefix, key)
        {
            self.cfg.waiters.wake(&name);
        }
    }

    /// [`LEASE`] with `token`, for `lease_ttl`.
    pub(crate) fn lease(
        &self,
        key: &K,
        token: &str,
        lease_ttl: Duration,
        hop: Hop,
    ) -> Result<Receiver<Leased<V>>, Error> {
        let name = codec::redis_key(&self.cfg.prefix, key)?;
        let ms = lease_ttl.as_millis().clamp(1, MAX_PX_MS) as u64;
        let cmd = redis::cmd("EVAL")
            .arg(LEASE)
            .arg(1)
            .arg(name)
            .arg(token)
            .arg(ms)
            .get_packed_command();
        self.call(&cmd, hop, |sent, tx| Op::Lease {
            key: key.clone(),
            sent,
            tx,
        })
    }

    /// The holder's store: `value` lands only while `token` holds the
    /// lease; `Ok(false)` if the lease was void. A `MULTI` of [`STAGE`]
    /// and `RENAME staging key`, whose write of the key `NOLOOP` keeps from
    /// echoing (see the module docs); [`STORE`], on the key alone, in a
    /// slot in migration (`hop.single`) or where the server refuses
    /// `MULTI` to this user.
    pub(crate) fn store_leased(
        &self,
        key: K,
        value: V,
        ttl: Duration,
        token: &str,
        hop: Hop,
    ) -> Result<Receiver<bool>, Error> {
        let name = codec::redis_key(&self.cfg.prefix, &key)?;
        let bytes = codec::encode_value(&value)?;
        let ms = ttl.as_nanos().div_ceil(1_000_000).clamp(1, MAX_PX_MS) as u64;
        let (cmd, skipped, step) = if hop.single || !self.multi() {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(STORE).arg(1).arg(name);
            cmd.arg(token).arg(bytes).arg(ms);
            (cmd.get_packed_command(), 0, op::LEASE_STORE_ONE)
        } else {
            let staging = staging_of(&name, token);
            let mut stage = redis::cmd("EVAL");
            stage.arg(STAGE).arg(2).arg(&name).arg(&staging);
            stage.arg(token).arg(bytes).arg(ms);
            let rename = redis::cmd("RENAME").arg(staging).arg(name).clone();
            (op::transaction(&[&stage, &rename]), 3, op::LEASE_STORE)
        };
        self.call_after(&cmd, hop, skipped, |sent, tx| Op::Set {
            key,
            value,
            ttl,
            sent,
            tx,
            step,
            aborted: None,
        })
    }

    /// [`RELEASE`]: gives up the lease `token` holds, if it still does. A
    /// redirect in its reply is handed to `redirected` (by the reader).
    pub(crate) fn release(
        &self,
        key: &K,
        token: &str,
        hop: Hop,
        redirected: Option<op::Redirected>,
    ) -> Result<Receiver<()>, Error> {
        let name = codec::redis_key(&self.cfg.prefix, key)?;
        let cmd = redis::cmd("EVAL")
            .arg(RELEASE)
            .arg(1)
            .arg(name)
            .arg(token)
            .get_packed_command();
        self.call(&cmd, hop, |_, tx| Op::Release { tx, redirected })
    }

    /// The reply of [`LEASE`].
    pub(crate) fn leased(&self, key: K, sent: u64, reply: Value) -> Result<Leased<V>, Error> {
        if let Value::Array(items) = &reply
            && let [Value::Nil | Value::Boolean(false), Value::Int(n)] = items.as_slice()
        {
            return Ok(match *n {
                -3 => Leased::Mine,
                ms if ms >= 0 => Leased::Held(Some(Duration::from_millis(ms as u64))),
                _ => Leased::Held(None),
            });
        }
        Ok(match self.fetched(key, sent, reply)? {
            Some(v) => Leased::Value(v),
            None => Leased::Held(None),
        })
    }
}

impl<K, V> Shared<K, V> {
    pub(crate) fn link(&self) -> MutexGuard<'_, Option<Conn<K, V>>> {
        self.link.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `true` once the link is closed (it will not connect again).
    pub(crate) fn closed(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// `true` if no call waits on this link (pings aside).
    pub(crate) fn quiet(&self) -> bool {
        self.link().as_ref().is_none_or(|c| {
            c.pending
                .iter()
                .all(|op| matches!(op, Op::Ping { .. } | Op::Asking))
        })
    }

    /// Stops the supervisor (which stops the reader); the caller joins it.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        if let Some(conn) = self.link().as_ref() {
            conn.stream.shutdown();
        }
        if let Some(t) = self.supervisor.get() {
            t.unpark();
        }
    }
}

/// Runs its closure when dropped: the reader's cleanup runs however the
/// reader ends, also in a panic of user code, so that the pending calls
/// fail and the supervisor reconnects instead of leaving them waiting.
struct OnDrop<F: FnMut()>(F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;

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
//!
//! # Rooms
//!
//! This file holds [`Shared`]'s state and the queuing of a call
//! ([`Shared::call`]). Beside it: `command`, the commands of the cache's
//! calls (the lease's included); `reader`, the reader thread that applies
//! replies and invalidations; `supervisor`, the thread that connects,
//! pings and reconnects.

use crate::connect::Config;
use crate::error::Error;
use crate::op::{Hop, Op, Reply};
use crate::reply::{self, Receiver};
use crate::wire::{ReadHalf, WriteHalf};
use expiremap::{Clock, ExpireMap, SystemClock};
use redis::Parser;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::VecDeque;
use std::fmt;
use std::hash::Hash;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::Thread;
use std::time::Duration;

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

mod command;
mod reader;
mod supervisor;
#[cfg(test)]
mod tests;

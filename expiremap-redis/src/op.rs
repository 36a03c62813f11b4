//! The commands in flight on a link ([`Op`]), the step of a call each one
//! is (named in its errors), and what a write's reply means.
//!
//! A link queues one op per reply it expects, in the order it wrote the
//! commands; its reader pops them in that order and applies each reply
//! ([`crate::link`]).

use crate::connect::server_error;
use crate::error::Error;
use crate::reply;
use crate::script::Leased;
use crate::slots::Redirect;
use redis::Value;
use std::task::Waker;
use std::time::{Duration, Instant};

pub(crate) type Reply<T> = reply::Sender<T>;

/// The step of a `put` (`SET`, which also voids a lease on the key).
pub(crate) const PUT: &str = "put (SET)";
/// The step of a load's store without leases.
pub(crate) const PUT_NX: &str = "store of a load (SET NX)";
/// The step of a lease holder's store.
pub(crate) const LEASE_STORE: &str = "lease store (MULTI/EXEC)";
/// The step of a lease holder's store on the key alone (a Cluster slot in
/// migration, or a user without `MULTI`).
pub(crate) const LEASE_STORE_ONE: &str = "lease store (script)";

/// How one try of a call is sent.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Hop {
    /// After an `ASK`: `ASKING` first.
    pub(crate) asking: bool,
    /// The slot is in migration: a command over several keys (a lease
    /// holder's `MULTI`) is sent in its one-key form, which follows its
    /// own redirects (a node refuses commands over keys it holds only in
    /// part: `ASK`, then `TRYAGAIN` on the other node).
    pub(crate) single: bool,
    /// When the call gives up waiting (its call timeout from when it
    /// began, shared by its redirects); `None`: the call timeout from now.
    pub(crate) deadline: Option<Instant>,
}

/// What the reader does with a redirect in a posted call's reply (a
/// lease's release, which nobody waits for): sends it on.
pub(crate) type Redirected = Box<dyn FnOnce(&Error) + Send>;

/// A command in flight, waiting for its reply.
pub(crate) enum Op<K, V> {
    Fetch {
        key: K,
        sent: u64,
        tx: Reply<Option<V>>,
    },
    Set {
        key: K,
        value: V,
        ttl: Duration,
        sent: u64,
        tx: Reply<bool>,
        /// Which write this is ([`PUT`], [`LEASE_STORE`]...).
        step: &'static str,
        /// In a `MULTI`: the error of a command the server refused to
        /// queue (a cluster's `MOVED`), which the `EXECABORT` stands for.
        aborted: Option<Error>,
    },
    Del {
        key: K,
        tx: Reply<Option<V>>,
    },
    /// [`crate::script::LEASE`]: the value, or the lease, or how long it is
    /// held.
    Lease {
        key: K,
        sent: u64,
        tx: Reply<Leased<V>>,
    },
    /// [`crate::script::RELEASE`].
    Release {
        tx: Reply<()>,
        /// Follows a redirect in its reply.
        redirected: Option<Redirected>,
    },
    Ping {
        sent: u64,
    },
    /// `ASKING`, sent before a command redirected by an `ASK` (a cluster's
    /// slot in migration), or a command of a `MULTI` before its `EXEC`;
    /// its reply is dropped.
    Asking,
}

impl<K, V> Op<K, V> {
    pub(crate) fn key(&self) -> Option<&K> {
        match self {
            Op::Fetch { key, .. }
            | Op::Set { key, .. }
            | Op::Del { key, .. }
            | Op::Lease { key, .. } => Some(key),
            Op::Ping { .. } | Op::Asking | Op::Release { .. } => None,
        }
    }

    /// The step of its call, for its errors.
    pub(crate) fn step(&self) -> &'static str {
        match self {
            Op::Fetch { .. } => "read (script)",
            Op::Set { step, .. } => step,
            Op::Del { .. } => "remove (script)",
            Op::Lease { .. } => "lease take (script)",
            Op::Release { .. } => "lease release (script)",
            Op::Ping { .. } => "PING",
            Op::Asking => "ASKING",
        }
    }

    pub(crate) fn fail(self, e: Error) {
        match self {
            Op::Fetch { tx, .. } | Op::Del { tx, .. } => tx.send(Err(e)),
            Op::Set { tx, .. } => tx.send(Err(e)),
            Op::Lease { tx, .. } => tx.send(Err(e)),
            Op::Release { tx, redirected } => match (redirected, Redirect::parse(&e, "")) {
                (Some(follow), Some(_)) => follow(&e),
                _ => tx.send(Err(e)),
            },
            Op::Ping { .. } | Op::Asking => {}
        }
    }

    /// The waker of an awaited call past its deadline (see
    /// [`reply::Sender::expire`]).
    pub(crate) fn expire(&self, now: Instant) -> Option<Waker> {
        match self {
            Op::Fetch { tx, .. } | Op::Del { tx, .. } => tx.expire(now),
            Op::Set { tx, .. } => tx.expire(now),
            Op::Lease { tx, .. } => tx.expire(now),
            Op::Release { tx, .. } => tx.expire(now),
            Op::Ping { .. } | Op::Asking => None,
        }
    }
}

/// `commands` packed as one transaction: `MULTI`, each of them, `EXEC`.
/// Its reply is `EXEC`'s, after one `QUEUED` (or a refusal) per command.
pub(crate) fn transaction(commands: &[&redis::Cmd]) -> Vec<u8> {
    let mut packed = redis::cmd("MULTI").get_packed_command();
    for c in commands {
        packed.extend(c.get_packed_command());
    }
    packed.extend(redis::cmd("EXEC").get_packed_command());
    packed
}

/// A server's error reply to the command of `step`, naming the step
/// (`lease take (script): NOPERM ...`); a cluster's redirect (`MOVED`,
/// `ASK`) is kept as the server wrote it, for it to be followed. The
/// link's node is named by the caller's side ([`crate::cluster::Links`]).
pub(crate) fn at_step(e: &redis::ServerError, step: &str) -> Error {
    let e = Error::Server(server_error(e));
    match &e {
        Error::Server(m) if Redirect::parse(&e, "").is_none() => {
            Error::Server(format!("{step}: {m}"))
        }
        _ => e,
    }
}

/// What the reply to a write of `step` says: `Ok(true)` stored,
/// `Ok(false)` declined (`SET NX` found a value; a lease holder's lease
/// was void).
pub(crate) fn written(reply: Value, step: &str) -> Result<bool, Error> {
    match reply {
        // `SET`; the one-script store.
        Value::Okay | Value::Int(1) => Ok(true),
        Value::SimpleString(s) if s == "OK" => Ok(true),
        Value::Nil | Value::Int(0) => Ok(false),
        Value::Array(items) => match items.as_slice() {
            // `EXEC` of a put: `[OK, n]`; of a holder's store: `[1, OK]`,
            // or `[0, no such key]` (STAGE wrote nothing for the RENAME).
            [Value::Okay, Value::Int(_)] | [Value::Int(1), Value::Okay] => Ok(true),
            [Value::Int(0), Value::ServerError(_)] => Ok(false),
            items => match items.iter().find_map(|v| match v {
                Value::ServerError(e) => Some(e),
                _ => None,
            }) {
                Some(e) => Err(at_step(e, step)),
                None => Err(Error::Protocol(format!("{step} answered {items:?}"))),
            },
        },
        other => Err(Error::Protocol(format!("{step} answered {other:?}"))),
    }
}

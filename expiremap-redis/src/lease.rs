//! Fleet-wide loading: memcache-style leases in Redis.
//!
//! # Protocol
//!
//! * The lease of a key is held *in the key itself*: while a loader holds
//!   it, the key is a hash `{lease: <token>}` with a TTL of `lease_ttl`
//!   (a value is a string, so the two never mix up). Every step below is a
//!   command or a script on that one key, so it is atomic where the key
//!   is, and in a Cluster slot in migration it follows its own redirect
//!   (`ASK`) to wherever the key is: the key and its lease migrate
//!   together, and no command names a key the node lacks (`TRYAGAIN`).
//! * A loader's miss runs [`LEASE`]: the value if there is one, else it
//!   takes the lease (the hash, on a missing key) or says how long the
//!   holder's lease has left. One script, one round trip, on the key's
//!   node. A plain read (`get`) of a key that holds a lease finds no value.
//! * A caller that finds the lease held waits, registered in [`Waiters`]
//!   *before* it sent [`LEASE`], for an invalidation of the key (the
//!   holder's write, a `put`, a `remove`, a released or expired lease: all
//!   are writes of the key), which the connection's reader hands to
//!   [`Waiters::wake`], or for the lease's remaining time, whichever comes
//!   first; then it runs [`LEASE`] again (see *Why no wake-up is lost*).
//! * The holder stores with one `MULTI`/`EXEC` ([`Shared::store_leased`]):
//!   [`STAGE`] checks that the key still holds its token and writes the
//!   value under a staging name of its own ([`staging_of`]), then a plain
//!   `RENAME` moves it onto the key, replacing the lease; if the lease was
//!   void, [`STAGE`] wrote nothing and the `RENAME` fails (`no such key`):
//!   refused. A `put` is a plain `SET` of the key and a `remove` deletes
//!   it ([`REMOVE`]): either replaces a lease held on it, in the one
//!   command that writes, so a load that raced them is refused, and a load
//!   taken after them finds the value (or the removal's successor load).
//!   A holder whose load fails releases its lease ([`RELEASE`], by token).
//! * Why the holder's write is not a plain script: Redis sends a script's
//!   writes back to its own connection as invalidations, `NOLOOP` or not
//!   (Redis 7.0: a script's writes are the script client's, not the
//!   caller's), which would drop the near copy the write just made, so
//!   the next read would go to Redis. A command of a `MULTI`/`EXEC` is the
//!   caller's own: `NOLOOP` holds for the `RENAME` onto the key, and the
//!   near copy stays; only the staging name's invalidation comes back, and
//!   it names no key. The holder's near copy is then as any `put`'s. A
//!   `remove`'s script does echo its key: it dropped that copy anyway.
//! * The holder's `MULTI` names two keys of the slot (the key and its
//!   staging name). Where a node refuses it because the slot is in
//!   migration (`ASK`, or `TRYAGAIN` where it holds only the key), and
//!   where the server refuses `MULTI` to this user (tried at each
//!   connection), the holder stores with the one-key script [`STORE`]
//!   instead, which follows the key like every other step; its echo drops
//!   the holder's near copy (the next read goes to Redis).
//! * A release that meets a redirect (the slot moved, or is moving, since
//!   the lease was taken) is sent on by the reader that reads the
//!   redirect, to the node named, so the lease ends where it is rather
//!   than lapsing at its TTL.
//!
//! # Why no wake-up is lost
//!
//! A waiter `W` (a caller that found the lease held) is ended by a wake
//! from the reader `R` of the key's link, or by its deadline. The claim:
//! once [`LEASE`] has answered "held", the write that ends that lease
//! wakes `W`, and without that write `W` waits at most the lease's time
//! left (and a millisecond).
//!
//! 1. **Register, then send.** `W` puts a fresh [`Wait`] on the key's name
//!    and the lease's in the [`Waiters`] table (under the table's mutex,
//!    raising `count` before it releases it), and only then sends
//!    [`LEASE`]: under the link's mutex it writes the command and queues
//!    its op (`Shared::call`). Every retry registers a new `Wait` before
//!    its own [`LEASE`]; a wake of an earlier round never counts for it.
//! 2. **The reply orders the reader after the registration.** `R` pops
//!    `W`'s op under the link's mutex when [`LEASE`]'s reply comes, after
//!    `W` released that mutex: `W`'s registration happens-before
//!    everything `R` does from then on.
//! 3. **The ending write is read after that reply.** "Held" means the
//!    key held the lease when [`LEASE`] ran. Whatever ends it (the holder's
//!    store, a `put`, a `remove`, a release, the lease's expiry or
//!    eviction, a flush) runs on the server after that, and the server
//!    sends its invalidation after [`LEASE`]'s reply on the one
//!    connection, in order. `R` applies pushes and replies one by one, so
//!    it reads that invalidation after the pop of 2 and calls
//!    [`Waiters::wake`] with the name: it loads `count` (non-zero: 1 and
//!    2) and takes the table's mutex, where `W`'s `Wait` is. This
//!    process's own writes of the key are not echoed where they are plain
//!    commands (`NOLOOP`: a `put`'s `SET`, the holder's `RENAME`); for
//!    every own write `R` wakes the key's name itself when it applies the
//!    reply (`Shared::wake_key`), which also comes after [`LEASE`]'s
//!    reply. On a Cluster, the key's writes and [`LEASE`] go to the node
//!    of its slot, on one link; a write that lands elsewhere while the
//!    slot moves ends the wait only by step 5. An invalidation sent before
//!    [`LEASE`] ran only wakes `W` early: it runs [`LEASE`] again.
//! 4. **The wake reaches the sleeper.** [`Wait`]'s wake stores `woken`
//!    (release), then takes the stored waker under the wait's mutex, then
//!    unparks `W`'s thread and wakes the waker. A blocking `W`
//!    ([`Registered::block`]) tests `woken` (acquire) before every park,
//!    and an unpark that comes first makes the next park return at once.
//!    An async `W` ([`Until`]) tests `woken` and stores its waker under
//!    the wait's mutex: if the poll takes the mutex first, the wake finds
//!    its waker; if the wake does, the poll finds `woken`.
//! 5. **Without an ending write**: a blocking `W` parks at most until its
//!    deadline (the lease's time left, [`patience`]); an async `W` has
//!    its deadline set before its first poll, and every link's supervisor
//!    calls [`Waiters::expire`] each tick, which wakes the waits past
//!    theirs. A lost connection (`Shared::reader_ended`) and a flush wake
//!    every wait: their invalidations may have been missed.
//!
//! The wait machinery ([`crate::waiters`]) is written against a small
//! shim; `loom-tests/tests/lease.rs` runs that very file over loom's
//! primitives (register, send, pop and wake, for blocking and async
//! waiters, a lost connection, and a wake racing a deregistration), with
//! a clock that never reaches a deadline, so that a lost wake-up is a
//! deadlock report. The network is not modelled: steps 2 and 3 stand for
//! it, as the link's queue of ops under its mutex.
//!
//! # This room
//!
//! The load under a lease ([`Loader::load_leased`], and [`Release`]): what
//! a cache's loader runs, over the cache's links ([`Links`]). The scripts
//! and names are the ops' ([`crate::script`]); the lease's commands on one
//! link and their replies are the link's ([`Shared::lease`],
//! [`Shared::store_leased`], [`Shared::release`]); the waits are
//! [`crate::waiters`].

use crate::cluster::Links;
use crate::codec::{self, CacheKey, CacheValue};
use crate::error::Error;
use crate::monitor::Counters;
use crate::script::{Leased, token};
use crate::waiters::Waiters;
use std::time::Duration;

#[cfg(doc)]
use crate::link::Shared;
#[cfg(doc)]
use crate::script::{LEASE, RELEASE, REMOVE, STAGE, STORE, staging_of};
#[cfg(doc)]
use crate::waiters::{Registered, Until, Wait};

/// What a load under a lease works with: the cache's links, its key
/// prefix in Redis, its lease waits and its counts.
pub(crate) struct Loader<'a, K, V> {
    pub(crate) links: &'a Links<K, V>,
    pub(crate) prefix: &'a [u8],
    pub(crate) waiters: &'a Waiters,
    pub(crate) monitor: &'a Counters,
}

impl<K: CacheKey, V: CacheValue> Loader<'_, K, V> {
    /// The load of a missing key under a lease (see the module docs):
    /// `init` runs only in the lease's holder, anywhere in the fleet.
    pub(crate) fn load_leased<E: From<Error>>(
        &self,
        key: &K,
        ttl: Duration,
        lease_ttl: Duration,
        init: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E> {
        // The Redis name the wait listens on: the key's, which holds the
        // lease while it is loaded.
        let name = codec::redis_key(self.prefix, key).map_err(Error::from)?;
        let token = token();
        // Gives the lease back if `init` fails or panics, or the value is
        // not stored; and if a take fails: one that timed out may still
        // take the lease when the server gets to it, and the release,
        // sent after it on the same link, then ends it (by this token
        // only).
        let mut release = Release {
            links: self.links,
            prefix: self.prefix,
            key,
            token: &token,
            armed: false,
        };
        let mut waited = false;
        loop {
            let wait = self.waiters.register(name.clone());
            release.armed = true;
            let found = self.links.run(key, self.prefix, |l, hop| {
                l.lease(key, &token, lease_ttl, hop)
            })?;
            release.armed = matches!(found, Leased::Mine);
            match found {
                Leased::Value(v) => return Ok(v),
                Leased::Mine => {
                    // Taken after a wait: the holder's value never came.
                    if waited {
                        Counters::add(&self.monitor.lease_takeovers);
                    }
                    break;
                }
                Leased::Held(left) => {
                    Counters::add(&self.monitor.lease_waits);
                    waited = true;
                    let patience = patience(left, lease_ttl);
                    #[cfg(feature = "tracing")]
                    let _span = crate::monitor::lease_wait_span(&name, patience).entered();
                    wait.block(patience);
                }
            }
        }
        let v = init()?;
        if !ttl.is_zero() {
            self.links.run_multi(key, self.prefix, |l, hop| {
                l.store_leased(key.clone(), v.clone(), ttl, &token, hop)
            })?;
            // Stored (which ended the lease) or refused (it was void).
            release.armed = false;
        }
        Ok(v)
    }
}

/// Gives a held lease back when dropped, unless disarmed (the store ended
/// it): sent without waiting, errors ignored (the lease lapses at its TTL
/// all the same). Also when a loader's `init` panics or its future is
/// dropped.
pub(crate) struct Release<'a, K: CacheKey, V: CacheValue> {
    pub(crate) links: &'a Links<K, V>,
    pub(crate) prefix: &'a [u8],
    pub(crate) key: &'a K,
    pub(crate) token: &'a str,
    pub(crate) armed: bool,
}

impl<K: CacheKey, V: CacheValue> Drop for Release<'_, K, V> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.links.release(self.key, self.prefix, self.token);
    }
}

/// The wait after a [`Leased::Held`]: the lease's time left and a
/// millisecond (the server counts whole ms), or the whole lease TTL.
pub(crate) fn patience(held: Option<Duration>, lease_ttl: Duration) -> Duration {
    held.map_or(lease_ttl, |d| d + Duration::from_millis(1))
}

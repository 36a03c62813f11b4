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
//! The wait machinery ([`wait`]) is written against a small shim
//! ([`sync`]); `loom-tests/tests/lease.rs` runs that very file over loom's
//! primitives (register, send, pop and wake, for blocking and async
//! waiters, a lost connection, and a wake racing a deregistration), with
//! a clock that never reaches a deadline, so that a lost wake-up is a
//! deadlock report. The network is not modelled: steps 2 and 3 stand for
//! it, as the link's queue of ops under its mutex.

use crate::error::Error;
use crate::link::{self, Shared};
use crate::monitor::Counters;
use crate::op::{self, Hop, Op};
use crate::reply::Receiver;
use crate::slots::{crc16, crc16_from, slot};

/// Slots of a Redis Cluster, as a CRC16's modulus.
const SLOTS: u16 = crate::slots::SLOTS as u16;
use crate::{CacheKey, CacheValue, NearCache, codec};
use redis::Value;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

mod wait;

pub(crate) use wait::Waiters;
#[cfg(doc)]
use wait::{Registered, Until, Wait};

/// What [`wait`] runs on: `std` here, loom's primitives in its loom model.
mod sync {
    pub(super) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    pub(super) use std::sync::{Arc, Mutex, MutexGuard};
    pub(super) use std::thread::{Thread, current, park_timeout};
    pub(super) use std::time::Instant;
    /// The table's hasher (a fixed one in the model, which must replay).
    pub(super) type NameHasher = std::hash::RandomState;
}

/// `KEYS[1]` the key; `ARGV[1]` a token, `ARGV[2]` the lease TTL in ms.
/// Answers `{value, pttl}` if the key has a value; `{false, -3}` if the
/// lease is this token's (taken now: the key was missing, and now holds
/// the lease, a hash `{lease: token}` with the lease TTL); else `{false,
/// pttl of the lease}`. A key of another type is an error.
pub(crate) const LEASE: &str = "local t = redis.call('TYPE', KEYS[1]).ok \
if t == 'string' then return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])} end \
if t == 'none' then redis.call('HSET', KEYS[1], 'lease', ARGV[1]) \
redis.call('PEXPIRE', KEYS[1], ARGV[2]) return {false, -3} end \
local l = t == 'hash' and redis.call('HGET', KEYS[1], 'lease') \
if not l then return redis.error_reply('WRONGTYPE the key holds neither a value nor a lease') end \
if l == ARGV[1] then return {false, -3} end \
return {false, redis.call('PTTL', KEYS[1])}";

/// `true` in Lua if `KEYS[1]` holds the lease of the token `ARGV[1]`.
macro_rules! holds {
    () => {
        "redis.call('TYPE', KEYS[1]).ok == 'hash' and redis.call('HGET', KEYS[1], 'lease') == ARGV[1]"
    };
}

/// The lease holder's write, first half (in a `MULTI`, before `RENAME
/// staging key`): `KEYS[1]` the key, `KEYS[2]` the staging name
/// ([`staging_of`]); `ARGV[1]` the token, `ARGV[2]` the value, `ARGV[3]`
/// its TTL in ms. If the key holds the token's lease: writes the value
/// under the staging name, 1 (the `RENAME` then replaces the lease with
/// it). Else 0, and nothing is written (the lease was void: the key was
/// written or removed, the lease taken over or lapsed).
pub(crate) const STAGE: &str = concat!(
    "if ",
    holds!(),
    " then redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3]) return 1 end return 0"
);

/// The lease holder's write in one script, on one key (a Cluster slot in
/// migration, where the `MULTI` of [`STAGE`] is refused, or a user
/// without `MULTI`): `KEYS[1]` the key; `ARGV` as [`STAGE`]'s. 1 if
/// stored, 0 if the lease was void.
pub(crate) const STORE: &str = concat!(
    "if ",
    holds!(),
    " then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0"
);

/// A holder giving its lease up (`KEYS[1]` the key, `ARGV[1]` the token).
pub(crate) const RELEASE: &str = concat!(
    "if ",
    holds!(),
    " then return redis.call('DEL', KEYS[1]) end return 0"
);

/// `remove`: the value (`GETDEL`); a lease is deleted (its load then
/// stores nothing) and reads as none; a key of another type is an error.
/// On one key.
pub(crate) const REMOVE: &str = "local t = redis.call('TYPE', KEYS[1]).ok \
if t == 'string' then return redis.call('GETDEL', KEYS[1]) end \
if t == 'hash' and redis.call('HEXISTS', KEYS[1], 'lease') == 1 then \
redis.call('DEL', KEYS[1]) return false end \
if t == 'none' then return false end \
return redis.error_reply('WRONGTYPE the key holds neither a value nor a lease')";

/// What [`LEASE`] found.
pub(crate) enum Leased<V> {
    /// The key's value (a near copy was kept, as by a fetch).
    Value(V),
    /// The lease is this caller's: load and [`STORE`].
    Mine,
    /// Another holds the lease, for this long at most (`None`: unknown).
    Held(Option<Duration>),
}

/// A hash tag (`{t}`) of each slot, found once: the shortest alphanumeric
/// strings whose CRC16 gives the slot.
fn tags() -> &'static [Box<[u8]>] {
    static TAGS: OnceLock<Vec<Box<[u8]>>> = OnceLock::new();
    TAGS.get_or_init(|| {
        const A: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let mut tags: Vec<Option<Box<[u8]>>> = vec![None; crate::slots::SLOTS];
        let mut left = tags.len();
        let mut len = 1;
        while left > 0 {
            let mut idx = vec![0usize; len];
            loop {
                let t: Vec<u8> = idx.iter().map(|&i| A[i]).collect();
                let s = usize::from(crc16(&t)) % tags.len();
                if tags[s].is_none() {
                    tags[s] = Some(t.into());
                    left -= 1;
                }
                // The next string of this length (odometer), or done.
                let mut i = 0;
                while i < len && idx[i] + 1 == A.len() {
                    idx[i] = 0;
                    i += 1;
                }
                if i == len {
                    break;
                }
                idx[i] += 1;
            }
            len += 1;
        }
        tags.into_iter().map(Option::unwrap_or_default).collect()
    })
}

/// Where the holder of the lease on the key named `name` with `token`
/// stages its value: `name:lease:token`, in the slot of `name` (a hash tag
/// or a suffix is added where needed). Never a key's name: a key's
/// encoding is self-delimiting, so `name` followed by more bytes does not
/// decode as a key (its invalidation drops no near copy); nor another
/// holder's (tokens are unique).
pub(crate) fn staging_of(name: &[u8], token: &str) -> Vec<u8> {
    let mut staging = name.to_vec();
    staging.extend_from_slice(b":lease:");
    staging.extend_from_slice(token.as_bytes());
    in_slot(staging, slot(name))
}

/// `name`, with what it takes to hash to `want` appended if it does not.
fn in_slot(mut name: Vec<u8>, want: u16) -> Vec<u8> {
    if slot(&name) == want {
        // A hash tag in `name`, which the suffix kept.
        return name;
    }
    if !name.contains(&b'{') {
        name.push(b'{');
        name.extend_from_slice(&tags()[usize::from(want)]);
        name.push(b'}');
        return name;
    }
    // A `{` without a usable tag: the slot is the CRC16 of the whole name.
    // One pass over `name`, then a search over short suffixes (`:` and hex
    // digits, no brace) from that CRC state: 16,384 suffixes of a few
    // bytes expected, whatever the name's length.
    let state = crc16_from(0, &name);
    name.push(b':');
    let base = name.len();
    let at_colon = crc16_from(state, b":");
    let mut digits = [0u8; 16];
    for n in 0u64.. {
        let hex = hex_of(n, &mut digits);
        if crc16_from(at_colon, hex) % SLOTS == want {
            name.truncate(base);
            name.extend_from_slice(hex);
            break;
        }
    }
    debug_assert_eq!(slot(&name), want);
    name
}

/// `n` in lower-case hex, in `buf`.
fn hex_of(mut n: u64, buf: &mut [u8; 16]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[(n & 15) as usize];
        n >>= 4;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// A token no other lease of any process has: 128 bits from the std
/// hasher's random keys, the process id, a counter and the time.
pub(crate) fn token() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut out = String::with_capacity(32);
    for half in 0..2u64 {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(half);
        h.write_u32(std::process::id());
        h.write_u64(n);
        h.write_u128(t);
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
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
        let ms = lease_ttl.as_millis().clamp(1, link::MAX_PX_MS) as u64;
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
        let ms = ttl.as_nanos().div_ceil(1_000_000).clamp(1, link::MAX_PX_MS) as u64;
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

impl<K: CacheKey, V: CacheValue> NearCache<K, V> {
    /// The Redis name a lease wait listens on: the key's, which holds the
    /// lease while it is loaded.
    pub(crate) fn lease_name(&self, key: &K) -> Result<Vec<u8>, Error> {
        Ok(codec::redis_key(&self.prefix, key)?)
    }

    /// The load of a missing key under a lease (see the module docs):
    /// `init` runs only in the lease's holder, anywhere in the fleet.
    pub(crate) fn load_leased<E: From<Error>>(
        &self,
        key: &K,
        ttl: Duration,
        lease_ttl: Duration,
        init: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E> {
        let name = self.lease_name(key)?;
        let token = token();
        // Gives the lease back if `init` fails or panics, or the value is
        // not stored; and if a take fails: one that timed out may still
        // take the lease when the server gets to it, and the release,
        // sent after it on the same link, then ends it (by this token
        // only).
        let mut release = Release {
            cache: self,
            key,
            token: &token,
            armed: false,
        };
        let mut waited = false;
        loop {
            let wait = self.waiters.register(name.clone());
            release.armed = true;
            let found = self.links.run(key, &self.prefix, |l, hop| {
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
            self.links.run_multi(key, &self.prefix, |l, hop| {
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
    pub(crate) cache: &'a NearCache<K, V>,
    pub(crate) key: &'a K,
    pub(crate) token: &'a str,
    pub(crate) armed: bool,
}

impl<K: CacheKey, V: CacheValue> Drop for Release<'_, K, V> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let c = self.cache;
        c.links.release(self.key, &c.prefix, self.token);
    }
}

/// The wait after a [`Leased::Held`]: the lease's time left and a
/// millisecond (the server counts whole ms), or the whole lease TTL.
pub(crate) fn patience(held: Option<Duration>, lease_ttl: Duration) -> Duration {
    held.map_or(lease_ttl, |d| d + Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staging_name_shares_the_keys_slot_and_never_names_a_key() {
        for n in [
            &b"p:\x03abc"[..],
            b"p:{user1}x",
            b"p:{x",
            b"p:{}x",
            b"p:}{",
            b"",
        ] {
            let t = token();
            let st = staging_of(n, &t);
            assert_eq!(slot(&st), slot(n), "{:?}", String::from_utf8_lossy(&st));
            assert!(st.starts_with(n) && st.len() > n.len());
            assert_ne!(st, staging_of(n, &token()));
        }
        assert_ne!(token(), token());
    }

    /// A name with an unusable `{` hashes whole: its staging name's slot is
    /// found by a suffix search from the name's CRC state, not by hashing
    /// the whole name again per try (16,384 tries expected: 0.4 s a call
    /// for a 4 KiB key). Counted in bytes through the CRC: a few passes
    /// over the name (the checks), and a short suffix a try.
    #[test]
    fn a_long_name_with_an_open_brace_costs_a_few_passes_over_it() {
        use crate::slots::CRC_BYTES;
        let mut name = b"p:{".to_vec();
        name.extend(std::iter::repeat_n(b'x', 4096));
        for t in ["a", "b", "c", "d"] {
            CRC_BYTES.with(|n| n.set(0));
            let st = staging_of(&name, t);
            let bytes = CRC_BYTES.with(|n| n.get());
            assert!(
                bytes < 6 * 4096 + 1_000_000,
                "{bytes} bytes through the CRC"
            );
            assert_eq!(slot(&st), slot(&name));
            // The suffix: ":lease:", the token, ':' and a few hex digits.
            let tail = &st[name.len()..];
            assert!(tail.len() <= b":lease:".len() + t.len() + 1 + 8, "{tail:?}");
            assert!(!tail.contains(&b'{') && !tail.contains(&b'}'));
        }
    }

    #[test]
    fn hex_digits() {
        let mut buf = [0u8; 16];
        assert_eq!(hex_of(0, &mut buf), b"0");
        assert_eq!(hex_of(0xbeef, &mut buf), b"beef");
        assert_eq!(hex_of(u64::MAX, &mut buf), b"ffffffffffffffff");
    }
}

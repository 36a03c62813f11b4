//! The commands a link sends for the cache's calls: a read (`fetch`), a
//! `put` (`set`), a `remove` (`del`), and the lease's take, store and
//! release (see [`crate::lease`]). Each writes its command and queues its
//! op under the link's mutex ([`Shared::call`]); the reader applies the
//! reply ([`super::reader`]).

use super::{MAX_PX_MS, Shared};
use crate::codec::{self, CacheKey, CacheValue};
use crate::error::Error;
use crate::op::{self, Hop, Op};
use crate::reply::Receiver;
use crate::script::{self, FETCH, LEASE, Leased, RELEASE, STAGE, STORE, staging_of};
use std::sync::atomic::Ordering;
use std::time::Duration;

impl<K: CacheKey, V: CacheValue> Shared<K, V> {
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
    /// echoing (see [`crate::lease`]'s docs); [`STORE`], on the key alone, in a
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
}

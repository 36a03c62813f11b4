//! The leader's load of a blocking loading call
//! ([`NearCache::try_get_or_insert_with`]): Redis once more, then `init`,
//! stored with `SET ... NX`, or under a lease held in Redis (fleet-wide
//! loading, [`crate::lease`]).

use crate::error::Error;
use crate::{CacheKey, CacheValue, NearCache, codec, lease};
use std::time::Duration;

impl<K: CacheKey, V: CacheValue> NearCache<K, V> {
    /// The leader's load (of [`try_get_or_insert_with`](Self::try_get_or_insert_with)):
    /// Redis once more (a value may have come since), then `init`.
    pub(super) fn load<E: From<Error>>(
        &self,
        key: &K,
        ttl: Duration,
        init: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E> {
        if let Some(lease_ttl) = self.lease_ttl {
            return self.load_leased(key, ttl, lease_ttl, init);
        }
        let fetched = self
            .links
            .run(key, &self.prefix, |l, hop| l.fetch(key, hop))?;
        if let Some(v) = fetched {
            return Ok(v);
        }
        let v = init()?;
        if !ttl.is_zero() {
            self.links.run(key, &self.prefix, |l, hop| {
                l.set(key.clone(), v.clone(), ttl, true, hop)
            })?;
        }
        Ok(v)
    }

    /// The Redis name a lease wait listens on: the key's, which holds the
    /// lease while it is loaded.
    pub(crate) fn lease_name(&self, key: &K) -> Result<Vec<u8>, Error> {
        Ok(codec::redis_key(&self.prefix, key)?)
    }

    /// The load of a missing key under a lease
    /// ([`lease::Loader::load_leased`]): `init` runs only in the lease's
    /// holder, anywhere in the fleet.
    fn load_leased<E: From<Error>>(
        &self,
        key: &K,
        ttl: Duration,
        lease_ttl: Duration,
        init: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E> {
        let loader = lease::Loader {
            links: &self.links,
            prefix: &self.prefix,
            waiters: &self.waiters,
            monitor: &self.monitor,
        };
        loader.load_leased(key, ttl, lease_ttl, init)
    }
}

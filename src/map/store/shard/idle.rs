//! Idle expiry's records: what a map with `time_to_idle` keeps per node
//! ([`Idle`]), and what a lookup hands back ([`Found`]) so that a read
//! records its access under the read lock it ran under.
//!
//! Plain data and one atomic store per read; no locks, no user code.

use crate::sync::{AtomicU64, Ordering};

/// What a map with idle expiry keeps per node besides the [`Node`]: the
/// deadline the last write set, and the time of the last access (a write,
/// or a read that found the entry live). The entry is live while `now <=
/// min(write, access + idle)`, its *effective deadline*; the node's own
/// `deadline` is where its timer sits, never later than that (accesses
/// only move the effective deadline later, and eviction moves the timer).
pub(super) struct Idle {
    pub(super) write: u64,
    /// Raised by reads under the read lock (by a compare-and-swap that
    /// only raises it, so racing reads keep the latest: `Found::access`);
    /// set by writes under the write lock.
    pub(super) access: AtomicU64,
}

impl Idle {
    pub(super) fn new(write: u64, now: u64) -> Self {
        Self {
            write,
            access: AtomicU64::new(now),
        }
    }
}

/// An entry a lookup found, live or not.
pub(crate) struct Found<'a, V> {
    pub(crate) value: &'a V,
    /// Its effective deadline: the caller compares it with the time.
    pub(crate) deadline: u64,
    /// The deadline its last write set (the same without idle expiry).
    pub(crate) write: u64,
    /// Its idle record, in a map with idle expiry.
    pub(super) idle: Option<Accesses<'a>>,
}

/// A found entry's idle record, as the lookup read it.
pub(super) struct Accesses<'a> {
    /// Where its last access is kept.
    pub(super) at: &'a AtomicU64,
    /// The last access the lookup saw there.
    pub(super) last: u64,
    /// The map's time to idle.
    pub(super) idle: u64,
}

impl<V> Found<'_, V> {
    /// Whether the entry is live at `now`; if so, and the map has idle
    /// expiry, records a read at `now` as an access. Under the read lock the
    /// lookup ran under.
    ///
    /// Racing reads keep the latest time: the store only ever raises it, by
    /// a compare-and-swap from the value the lookup saw (usually the only
    /// atomic operation of the read, and none when a later read got there
    /// first).
    #[inline]
    pub(crate) fn access(&self, now: u64) -> bool {
        if now > self.deadline {
            return false;
        }
        if let Some(a) = &self.idle {
            let mut last = a.last;
            while last < now {
                match a
                    .at
                    .compare_exchange_weak(last, now, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => break,
                    Err(seen) => last = seen,
                }
            }
        }
        true
    }

    /// Whether the entry expired by `now` by its idle time alone (its write
    /// deadline has not passed): a read in flight may still record an
    /// access that keeps it alive.
    #[inline]
    pub(crate) fn idle_expired(&self, now: u64) -> bool {
        self.idle.is_some() && self.deadline < now && now <= self.write
    }

    /// The effective deadline once [`access`](Self::access) at `now` said
    /// the entry was live.
    #[inline]
    pub(crate) fn deadline_after(&self, now: u64) -> u64 {
        match &self.idle {
            Some(a) => self.write.min(a.last.max(now).saturating_add(a.idle)),
            None => self.deadline,
        }
    }
}

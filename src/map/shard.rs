//! One shard: a hash table of slab indices plus the timer wheel whose slab
//! holds the entries.
//!
//! # Ground rules
//!
//! * Plain `&mut self` code. The map wraps each shard in its own
//!   `RwLock`; the shard knows nothing of locks, threads or events.
//! * One allocation per entry serves both the table and the expiry index: the
//!   entry lives in the wheel's slab node (with the timer links), and the
//!   table stores only a [`Slot`]: the node's `u32` index and 32 bits of the
//!   key's hash. Growing the table and rejecting hash mismatches never touch
//!   the slab.
//! * The hash is computed by the caller before the lock is taken and stored
//!   in the entry, so resizing and eviction never run user `Hash` code. `Eq`
//!   runs inside lookups (inherent to a hash table); it only reads.
//! * Values leave the shard by value (`Removed<K, V>`): the caller drops them,
//!   or publishes them, after releasing the lock.
//! * Time: entries carry their exact deadline in clock nanoseconds. The wheel
//!   runs on ticks of `2^shift` nanoseconds, the largest power of two not
//!   above the configured precision (1 ms gives 524,288 ns), so converting a
//!   time to a tick is a shift, not a division. An entry's timer tick is the
//!   first tick that starts strictly after its deadline, so eviction is never
//!   early and at most one tick (less than one precision) late. Reads compare
//!   the exact deadline.

use crate::timer::TimerWheel;
use hashbrown::{HashTable, hash_table};
use std::borrow::Borrow;

/// A stored entry. With the wheel node around it, an entry costs
/// `size_of::<K>() + size_of::<V>() + 40` bytes in the slab (rounded up to
/// the alignment of `K` and `V`): `deadline` and `hash` here, and the
/// generation, two links and the tick in the node.
pub(crate) struct Entry<K, V> {
    pub(crate) key: K,
    pub(crate) value: V,
    /// Exact deadline in clock nanoseconds; visible while `now <= deadline`.
    pub(crate) deadline: u64,
    pub(crate) hash: u64,
}

/// Why an entry left the shard. Mirrors the public `Cause` for the doors a
/// shard operation can open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Door {
    /// Past its deadline when it left.
    Expired,
    /// Explicitly removed (or cleared) while live.
    Removed,
    /// Overwritten by `put` while live.
    Replaced,
}

/// An entry that left the shard, to be published or dropped after unlock.
pub(crate) struct Removed<K, V> {
    pub(crate) key: K,
    pub(crate) value: V,
    pub(crate) deadline: u64,
    pub(crate) door: Door,
}

/// A table entry: where the entry lives, and the low 32 bits of its hash.
#[derive(Clone, Copy, Debug)]
struct Slot {
    index: u32,
    hash: u32,
}

/// The 64-bit hash the table works with, rebuilt from 32 stored bits: the
/// low bits pick the bucket and the top 7 the control byte, independent of
/// each other for tables below 2^25 buckets (a larger table stays correct,
/// with more control-byte false positives).
#[inline]
fn table_hash(h32: u32) -> u64 {
    let h = u64::from(h32);
    h | (h << 32)
}

/// The tick shift for a precision of `precision` ns: the largest `s` with
/// `2^s <= precision` (at least 1).
pub(crate) fn tick_shift(precision: u64) -> u32 {
    (63 - precision.max(2).leading_zeros()).max(1)
}

/// Result of [`Shard::put`].
pub(crate) enum PutOutcome<K, V> {
    /// A new entry; nothing left the shard.
    Inserted,
    /// An existing entry was overwritten; its old value left by `door`
    /// (`Replaced` if it was live, `Expired` if it was past its deadline).
    /// `key` is the caller's key (equal to the stored one, which stays).
    Overwrote(Removed<K, V>),
}

pub(crate) struct Shard<K, V> {
    table: HashTable<Slot>,
    wheel: TimerWheel<Entry<K, V>>,
    /// A wheel tick lasts `2^shift` nanoseconds.
    shift: u32,
}

impl<K, V> Shard<K, V> {
    /// A shard whose ticks last `2^shift` ns (see [`tick_shift`]).
    pub(crate) fn new(shift: u32, now: u64) -> Self {
        // >= 1 keeps `tick_for` from saturating (see `evict`).
        debug_assert!((1..64).contains(&shift));
        Self {
            table: HashTable::new(),
            wheel: TimerWheel::new(now >> shift),
            shift,
        }
    }

    /// The wheel tick at which an entry with `deadline` becomes evictable:
    /// the first tick starting strictly after the deadline.
    #[inline]
    pub(crate) fn tick_for(&self, deadline: u64) -> u64 {
        (deadline >> self.shift) + 1
    }

    /// Clock time (ns) at which the wheel reaches `tick`.
    #[inline]
    pub(crate) fn time_of(&self, tick: u64) -> u64 {
        tick.checked_shl(self.shift)
            .filter(|t| t >> self.shift == tick)
            .unwrap_or(u64::MAX)
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.wheel.len()
    }

    /// Index of the entry with `key`, if held (expired or not).
    #[inline]
    fn find<Q>(&self, hash: u64, key: &Q) -> Option<u32>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let wheel = &self.wheel;
        let h32 = hash as u32;
        self.table
            .find(table_hash(h32), |s| {
                s.hash == h32 && wheel.get_at(s.index).is_some_and(|e| e.key.borrow() == key)
            })
            .map(|s| s.index)
    }

    #[inline]
    fn entry(&self, index: u32) -> &Entry<K, V> {
        let id = self
            .wheel
            .id_at(index)
            .expect("table points at a vacant node");
        self.wheel.get(id).expect("id_at returned a live id")
    }

    /// The live entry for `key` at time `now`, if any.
    #[inline]
    pub(crate) fn get<Q>(&self, hash: u64, key: &Q, now: u64) -> Option<&Entry<K, V>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let e = self.entry(self.find(hash, key)?);
        (now <= e.deadline).then_some(e)
    }

    /// Inserts or overwrites. `deadline > now` is the caller's duty.
    pub(crate) fn put(
        &mut self,
        hash: u64,
        key: K,
        value: V,
        deadline: u64,
        now: u64,
    ) -> PutOutcome<K, V>
    where
        K: Eq,
    {
        let tick = self.tick_for(deadline);
        let wheel = &self.wheel;
        // One probe serves both outcomes. Growing the table rehashes from the
        // stored 32 bits: no user code, no slab access.
        let h32 = hash as u32;
        let entry = self.table.entry(
            table_hash(h32),
            |s| s.hash == h32 && wheel.get_at(s.index).is_some_and(|e| e.key == key),
            |s| table_hash(s.hash),
        );
        match entry {
            hash_table::Entry::Occupied(o) => {
                let id = self
                    .wheel
                    .id_at(o.get().index)
                    .expect("table points at a vacant node");
                let e = self.wheel.get_mut(id).expect("live id");
                let door = if now <= e.deadline {
                    Door::Replaced
                } else {
                    Door::Expired
                };
                let old_deadline = std::mem::replace(&mut e.deadline, deadline);
                let old_value = std::mem::replace(&mut e.value, value);
                self.wheel.reschedule(id, tick);
                PutOutcome::Overwrote(Removed {
                    key,
                    value: old_value,
                    deadline: old_deadline,
                    door,
                })
            }
            hash_table::Entry::Vacant(v) => {
                let id = self.wheel.insert(
                    tick,
                    Entry {
                        key,
                        value,
                        deadline,
                        hash,
                    },
                );
                v.insert(Slot {
                    index: id.index(),
                    hash: h32,
                });
                PutOutcome::Inserted
            }
        }
    }

    /// Removes `key` if held. The door is `Removed` if it was live at `now`,
    /// `Expired` otherwise.
    pub(crate) fn remove<Q>(&mut self, hash: u64, key: &Q, now: u64) -> Option<Removed<K, V>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let index = self.find(hash, key)?;
        let e = self.take(hash, index);
        let door = if now <= e.deadline {
            Door::Removed
        } else {
            Door::Expired
        };
        Some(Removed {
            key: e.key,
            value: e.value,
            deadline: e.deadline,
            door,
        })
    }

    /// Sets a new deadline for a live entry. `false` if absent or expired.
    pub(crate) fn touch<Q>(&mut self, hash: u64, key: &Q, deadline: u64, now: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let Some(index) = self.find(hash, key) else {
            return false;
        };
        let tick = self.tick_for(deadline);
        let id = self
            .wheel
            .id_at(index)
            .expect("table points at a vacant node");
        let e = self.wheel.get_mut(id).expect("live id");
        if now > e.deadline {
            return false;
        }
        e.deadline = deadline;
        self.wheel.reschedule(id, tick);
        true
    }

    /// Removes the entry at `index` from table and wheel.
    fn take(&mut self, hash: u64, index: u32) -> Entry<K, V> {
        let id = self
            .wheel
            .id_at(index)
            .expect("table points at a vacant node");
        self.table
            .find_entry(table_hash(hash as u32), |s| s.index == index)
            .expect("entry missing from table")
            .remove();
        self.wheel.cancel(id).expect("live id")
    }

    /// Evicts at most `limit` entries whose timers are due at `now`, pushing
    /// them to `out`. Returns `true` if more are due.
    pub(crate) fn evict(&mut self, now: u64, limit: usize, out: &mut Vec<Removed<K, V>>) -> bool {
        let now_tick = now >> self.shift;
        let table = &mut self.table;
        self.wheel.advance_at_most(now_tick, limit, |id, e| {
            // tick = (deadline >> shift) + 1 cannot overflow for shift >= 1,
            // so a fired timer is always past its deadline.
            debug_assert!(e.deadline < now);
            let index = id.index();
            table
                .find_entry(table_hash(e.hash as u32), |s| s.index == index)
                .expect("entry missing from table")
                .remove();
            out.push(Removed {
                key: e.key,
                value: e.value,
                deadline: e.deadline,
                door: Door::Expired,
            });
        })
    }

    /// When the wheel next has work, in clock nanoseconds (`None` if empty).
    pub(crate) fn next_wakeup(&self) -> Option<u64> {
        self.wheel.next_wakeup().map(|t| self.time_of(t))
    }

    /// Takes every entry out, leaving the shard empty, in O(1) under the lock
    /// (the caller drains the returned shard after unlocking).
    pub(crate) fn take_all(&mut self, now: u64) -> Shard<K, V> {
        std::mem::replace(self, Shard::new(self.shift, now))
    }

    /// Drains every entry (for `clear` and shutdown), without the lock.
    pub(crate) fn drain(mut self, mut f: impl FnMut(Entry<K, V>)) {
        self.table.clear();
        self.wheel.drain(|_, e| f(e));
    }

    /// Test-only consistency check between table and wheel.
    #[cfg(test)]
    pub(crate) fn validate(&self) {
        self.wheel.validate();
        assert_eq!(self.table.len(), self.wheel.len());
        for s in self.table.iter() {
            let i = s.index;
            let e = self.entry(i);
            assert_eq!(s.hash, e.hash as u32, "table slot hash mismatch");
            assert_eq!(self.tick_for(e.deadline), {
                let id = self.wheel.id_at(i).unwrap();
                self.wheel.deadline(id).unwrap()
            });
        }
    }
}

//! The write path beside the plain `put`: the shard write lock taken with
//! a key's flight in mind (`write_key`), the conditional and bounded put
//! (`put_slow`), and when a write wakes the eviction thread.

use super::load::flight;
use super::store::shard::{self, Door, PutOutcome, Removed, Room, Shard};
use super::{ExpireMap, Inner, nanos};
use crate::sync::Ordering;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::ops::Not;
use std::time::Duration;

/// Rounds of making room in other shards a put of a bounded map makes
/// before its value is refused: other puts may take each room made before
/// it is reserved, and a round that finds nothing to give yields first.
const ROOM_ROUNDS: u32 = 8;

/// When `put_slow` stores.
#[derive(Clone, Copy)]
pub(super) enum PutIf<'a, K, V> {
    Always,
    /// No live entry for the key.
    Absent,
    /// A live entry for the key.
    Live,
    /// No write touched the key since this load began. The put takes the
    /// load's flight out of the shard's list under the lock hold that
    /// settles it (stored, refused, or touched), and tells the guard.
    Untouched(&'a flight::FlightGuard<'a, K, V>),
    /// The key's live entry has this write deadline (`None`: no live
    /// entry), as a write with the map's expiry read it (`expiry`).
    Seen(Option<u64>),
    /// The commit of an `update` (the key's writes wait for it, so its
    /// entry changed only by leaving). `keep`: store with this write
    /// deadline (the entry's) instead of the TTL, only if the entry read
    /// has not expired since: live until `live_until` as read, or, past
    /// that, still live under the lock with that write deadline (a read
    /// may have moved its idle deadline).
    Commit {
        keep: Option<u64>,
        live_until: Option<u64>,
    },
}

/// `put_slow`'s `Commit` condition failed: the entry expired since.
pub(super) struct Stale;

/// Why [`put_cond`](ExpireMap::put_cond) stored nothing; the key and
/// value come back.
pub(super) enum NotStored<K, V> {
    /// Its condition no longer held (`Commit`: the entry expired; `Seen`:
    /// the entry changed).
    Stale(K, V),
    /// The bound refused them, and the caller asked for them back.
    Refused(K, V),
}

/// `Inner::due_min` when no bounded entry was ever stored.
pub(super) const DUE_MIN_NONE: u64 = !DueMin::GENERATION;

/// The word `Inner::due_min`: a time no shard's `due` is below, in its high
/// 48 bits (rounded down to 65.5 µs, so still a lower bound), and a 16-bit
/// generation that every lowering of a `due` moves.
///
/// A put that makes room in a full map asks whether another shard may hold
/// an expired entry (`due_elsewhere`): one whose `due` (a lower bound of
/// its entries' deadlines) is before the clock. While the word's time is
/// at or after the clock the answer is no, from one load. Otherwise it
/// reads every shard's `due`, and if none is before the clock it raises
/// the word's time to the earliest, by a compare-exchange from the word it
/// read first. A put that
/// lowers a `due` meanwhile (`set_due`: store, then a release update of the
/// word that always changes the generation) makes that exchange fail, so
/// the word is never raised past a `due` the scan did not see. A scan that
/// read the word after such an update (acquire) reads the lowered `due`.
/// (An exchange could succeed wrongly only if 65,536 lowerings took the
/// generation round during one scan, and the cost would be a put evicting
/// a live entry of its own shard before an expired one of another, which
/// the eviction thread takes anyway.)
pub(super) struct DueMin;

impl DueMin {
    const GENERATION: u64 = 0xFFFF;

    /// The time in word `w` (a lower bound of every `due`).
    #[inline]
    pub(super) fn time(w: u64) -> u64 {
        w & !Self::GENERATION
    }

    /// `w` lowered to `at` if that is earlier, the generation moved.
    fn lowered(w: u64, at: u64) -> u64 {
        Self::time(w).min(at & !Self::GENERATION) | (w.wrapping_add(1) & Self::GENERATION)
    }

    /// `w` with its time raised to `at` (rounded down), the generation kept.
    fn raised(w: u64, at: u64) -> u64 {
        (at & !Self::GENERATION) | (w & Self::GENERATION)
    }
}

impl<K, V, S> ExpireMap<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// [`put`](Self::put) into a bounded map, and the conditional puts
    /// into any map: the weigher runs first (no lock held), and what the
    /// bound pushes out is published or dropped after the lock is released.
    /// Apart from the unbounded `put`, which pays nothing for it.
    #[inline(never)]
    pub(super) fn put_slow(
        &self,
        key: K,
        value: V,
        ttl: Duration,
        cond: PutIf<'_, K, V>,
    ) -> Result<Option<V>, Stale> {
        self.put_cond(key, value, ttl, cond, false)
            .map_err(|_| Stale)
    }

    /// [`put`](Self::put) (and so `insert`) into a bounded map:
    /// [`put_slow`](Self::put_slow) of `PutIf::Always`, with
    /// [`put_cond`](Self::put_cond)'s body inlined for that condition, so
    /// that the cases of the others fold away (a full map's usual put,
    /// the miss of a cache-aside request).
    #[inline(never)]
    pub(super) fn put_always(&self, key: K, value: V, ttl: Duration) -> Option<V> {
        // Neither a stale condition nor, without `give_back`, a refusal
        // hands anything back.
        self.put_cond_inline(key, value, ttl, PutIf::Always, false)
            .unwrap_or(None)
    }

    /// [`put_slow`](Self::put_slow), which hands back what it did not
    /// store: when `cond` failed, and, if `give_back`, when the bound
    /// refused the value (then nothing is published for it). A load's
    /// store (`PutIf::Untouched`) takes the key's hash from its flight
    /// instead of hashing the key again.
    pub(super) fn put_cond(
        &self,
        key: K,
        value: V,
        ttl: Duration,
        cond: PutIf<'_, K, V>,
        give_back: bool,
    ) -> Result<Option<V>, NotStored<K, V>> {
        self.put_cond_inline(key, value, ttl, cond, give_back)
    }

    /// [`put_cond`](Self::put_cond)'s body, inlined into it and into
    /// [`put_always`](Self::put_always).
    #[inline(always)]
    fn put_cond_inline(
        &self,
        key: K,
        value: V,
        ttl: Duration,
        cond: PutIf<'_, K, V>,
        give_back: bool,
    ) -> Result<Option<V>, NotStored<K, V>> {
        let hash = match cond {
            PutIf::Untouched(load) => load.flight.hash,
            _ => self.inner.hasher.hash_one(&key),
        };
        let inner = &*self.inner;
        let ttl = nanos(ttl);
        let weight = inner.weigher.as_ref().map_or(1, |w| w(&key, &value));
        // Heavier than the whole bound: never held. A plain put stores it
        // over a held key and pushes it out at once (the old value is
        // returned, the new one leaves as `Size`); a `try_` put hands it
        // back and changes nothing.
        if give_back && inner.budget.as_ref().is_some_and(|b| weight > b.cap) {
            return Err(NotStored::Refused(key, value));
        }
        // Declared before the lock guard, so that if the user's `Eq` panics
        // in the probe, the key and value, and anything the bound pushed out,
        // are dropped after the guard: outside the lock.
        let mut kv = Some((key, value));
        let mut out = shard::Out::new();
        let mut rounds = 0;
        loop {
            let (outcome, kick, read, deadline, mut due) = {
                let key = &kv.as_ref().expect("just set").0;
                // A load's store and an update's commit are the writes their
                // key's own flight is waiting for.
                let own = matches!(cond, PutIf::Commit { .. } | PutIf::Untouched(_));
                let never = ttl == u64::MAX && !matches!(cond, PutIf::Commit { keep: Some(_), .. });
                let (mut shard, read) =
                    inner.write_key_with(hash, key, own, |t, s| inner.put_time(never, t, s));
                // No time read: nothing below depends on it (`put_time`).
                let now = read.unwrap_or(0);
                match cond {
                    PutIf::Always => {}
                    PutIf::Absent => {
                        if let Some(live) = shard.live_value(hash, key, now) {
                            return Ok(Some(live.clone()));
                        }
                    }
                    PutIf::Live => {
                        if shard.live_value(hash, key, now).is_none() {
                            return Ok(None);
                        }
                    }
                    // A write during the load wins (see `load`).
                    PutIf::Untouched(load) if load.flight.touched() => {
                        shard.end_flight(load);
                        return Ok(None);
                    }
                    PutIf::Untouched(_) => {}
                    // Kept a deadline that has passed since: nothing to
                    // store. A read during `f` may have moved an idle
                    // deadline past the one `f` was shown: an entry still
                    // live here is still the one `f` saw (the key's writes
                    // waited), so it is replaced.
                    PutIf::Commit {
                        keep: Some(w),
                        live_until: Some(d),
                    } if now > d && shard.live_write(hash, key, now) != Some(w) => {
                        return Err(Self::stale(&mut kv));
                    }
                    PutIf::Commit { .. } => {}
                    PutIf::Seen(seen) => {
                        if shard.live_write(hash, key, now) != seen {
                            return Err(Self::stale(&mut kv));
                        }
                    }
                }
                let deadline = match cond {
                    PutIf::Commit { keep: Some(d), .. } => d,
                    _ => now.saturating_add(ttl),
                };
                let due_elsewhere = || inner.due_elsewhere(hash, now);
                let outcome = shard.put_bounded(
                    hash,
                    &mut kv,
                    deadline,
                    now,
                    weight,
                    &mut out,
                    inner.due_here(hash, now),
                    due_elsewhere,
                );
                if let PutIf::Untouched(load) = cond {
                    // Settled here unless it must make room elsewhere
                    // (the load stays registered over those rounds).
                    if !matches!(outcome, PutOutcome::NoRoom { .. }) {
                        shard.end_flight(load);
                    }
                }
                if give_back && matches!(outcome, PutOutcome::Refused) {
                    // The refused value is the last thing the shard pushed
                    // out (`Shard::put_bounded`).
                    kv = out.take_last().map(|r| (r.key, r.value));
                }
                inner.slot(hash).count_size_out(&mut shard, out.take_size());
                // The entry's effective deadline: idle-capped, a write being
                // an access (later accesses only move it later).
                let timer = inner.timer_of(deadline, now);
                if matches!(outcome, PutOutcome::Inserted | PutOutcome::Overwrote(_)) {
                    inner.note_due(hash, timer);
                }
                let kick = matches!(outcome, PutOutcome::Refused | PutOutcome::NoRoom { .. })
                    .not()
                    .then(|| inner.needs_kick(&shard, timer))
                    .flatten();
                (
                    outcome,
                    kick,
                    read,
                    deadline,
                    inner.take_due(&mut shard, now),
                )
            };
            // What leaves is published with the time the put read, or with
            // one read now when it read none (`RemovedAt`).
            let removed_at = read;
            self.kick_if(kick);
            // An overwritten value leaves before what the put evicted
            // after it; nothing else waits (and a retry must not drop them).
            if !matches!(outcome, PutOutcome::Overwrote(_)) {
                inner.leave_due(due.take());
            }
            inner.leave_pushed(&mut out, removed_at);
            return Ok(match outcome {
                PutOutcome::Refused if give_back => {
                    let (key, value) = kv.take().expect("a refused put gets its value back");
                    return Err(NotStored::Refused(key, value));
                }
                PutOutcome::Inserted | PutOutcome::Refused => None,
                PutOutcome::Overwrote(old) => {
                    let old = inner.leave(old, removed_at);
                    inner.leave_due(due);
                    old
                }
                PutOutcome::NoRoom { need, candidate } => {
                    rounds += 1;
                    let room = match rounds {
                        ROOM_ROUNDS => Room::Refused,
                        _ => inner.room_elsewhere(hash, need, candidate),
                    };
                    match room {
                        Room::Made => continue,
                        Room::Short => {
                            crate::sync::thread::yield_now();
                            continue;
                        }
                        // The policy chose the victim over this value, or no
                        // room could be had: it leaves as `Size` (an overwrite
                        // that found no room for its new weight keeps the old
                        // value).
                        Room::Refused => {
                            let (key, value) = kv.take().expect("a refused put keeps its value");
                            if give_back {
                                return Err(NotStored::Refused(key, value));
                            }
                            let door = Door::Size;
                            inner.leave(
                                Removed {
                                    key,
                                    value,
                                    deadline,
                                    door,
                                },
                                removed_at,
                            );
                            None
                        }
                    }
                }
            });
        }
    }

    /// What a put whose condition failed hands back.
    fn stale(kv: &mut Option<(K, V)>) -> NotStored<K, V> {
        let (key, value) = kv.take().expect("a put holds its key and value");
        NotStored::Stale(key, value)
    }

    /// Wakes the eviction thread (if any) to plan again. After unlocking.
    #[inline]
    pub(super) fn kick_if(&self, kick: Option<u64>) {
        if let (Some(at), Some(_)) = (kick, &self.owner.evictor) {
            self.inner.signal.kick(at);
        }
    }
}

impl<K, V, S> Inner<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
{
    /// Makes room for `need` more weight in the budget of a bounded map
    /// from the shards other than `hash`'s, one lock at a time (the caller
    /// holds none), starting at a shard that rotates from call to call so
    /// that no shard gives more than its turn. `candidate`: the new key's
    /// estimated frequency, which each shard's victim must lose to (see
    /// `Shard::make_room`). What leaves is published or dropped after each
    /// lock is released.
    ///
    /// Expired entries go first: a first round visits only the shards
    /// whose `due` time has passed and evicts only what has expired there
    /// (due on their wheel, or past its deadline in the tick it lies in);
    /// then, if the room is still not there, the policy's victims.
    #[cold]
    #[inline(never)]
    pub(super) fn room_elsewhere(&self, hash: u64, need: u64, candidate: Option<u64>) -> Room {
        let Some(budget) = &self.budget else {
            return Room::Made;
        };
        let n = self.shards.len();
        let own = self.shard_index(hash);
        let start = self.room_cursor.fetch_add(1, Ordering::Relaxed);
        for live in [false, true] {
            for k in 0..n {
                if budget.fits(need) {
                    return Room::Made;
                }
                let j = start.wrapping_add(k) % n;
                if j == own || (!live && !self.is_due(j, self.clock.now_at_most())) {
                    continue;
                }
                let mut out = shard::Out::new();
                let (room, now) = {
                    let lock = &self.shards[j];
                    let (mut shard, (), now) =
                        self.clock.around(|| lock.write(), |_| (), |t, _| t.now());
                    let due = self.is_due(j, now);
                    let room = shard.make_room(need, now, None, candidate, due, live, &mut out);
                    lock.count_size_out(&mut shard, out.take_size());
                    // Exact again (or nearly), while the lock is held.
                    self.set_due(j, shard.deadline_floor());
                    (room, now)
                };
                self.leave_pushed(&mut out, now);
                if room != Room::Short {
                    return room;
                }
            }
        }
        if budget.fits(need) {
            Room::Made
        } else {
            Room::Short
        }
    }

    /// Whether shard `j` may hold an entry expired at `now` (`now` past
    /// its deadline).
    fn is_due(&self, j: usize, now: u64) -> bool {
        self.due[j].load(Ordering::Relaxed) < now
    }

    /// Whether `hash`'s shard, whose write lock the caller holds, may hold
    /// an entry expired at `now` (`true` in an unbounded map). Under that
    /// lock the shard's `due` is a lower bound of its entries' deadlines:
    /// when it is at or after `now`, none has expired, and making room
    /// there need not look for expired entries.
    #[inline]
    pub(super) fn due_here(&self, hash: u64, now: u64) -> bool {
        self.due
            .get(self.shard_index(hash))
            .is_none_or(|due| due.load(Ordering::Relaxed) < now)
    }

    /// Whether a shard other than `hash`'s may hold an expired entry at
    /// `now`: then a full bounded map takes that room before it evicts a
    /// live entry (see `room_elsewhere`). One load while `due_min` says
    /// nothing can have expired; otherwise every shard's `due`.
    #[inline]
    pub(super) fn due_elsewhere(&self, hash: u64, now: u64) -> bool {
        let seen = self.due_min.load(Ordering::Acquire);
        if DueMin::time(seen) >= now {
            return false;
        }
        self.scan_due(hash, now, seen)
    }

    /// [`due_elsewhere`](Self::due_elsewhere) past the word: reads every
    /// shard's `due`, and if none is before `now`, raises `due_min` to the
    /// earliest (unless a `due` was lowered since `seen` was read).
    #[cold]
    #[inline(never)]
    fn scan_due(&self, hash: u64, now: u64, seen: u64) -> bool {
        let own = self.shard_index(hash);
        let mut elsewhere = false;
        let mut earliest = u64::MAX;
        for (j, due) in self.due.iter().enumerate() {
            let t = due.load(Ordering::Relaxed);
            earliest = earliest.min(t);
            elsewhere |= j != own && t < now;
        }
        if earliest >= now {
            // Fails if a `due` was lowered after `seen` (the generation
            // moved): then `earliest` may be too late.
            let _ = self.due_min.compare_exchange(
                seen,
                DueMin::raised(seen, earliest),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        elsewhere
    }

    /// A write in a bounded map gave an entry of `hash`'s shard, whose write
    /// lock the caller holds, the effective deadline `at`: its write
    /// deadline, or with idle expiry no later than the write's time plus
    /// the idle time (see [`timer_of`](Self::timer_of)). Accesses only move
    /// an idle deadline later, so `at` stays a lower bound of when the
    /// entry expires.
    #[inline]
    pub(super) fn note_due(&self, hash: u64, at: u64) {
        let j = self.shard_index(hash);
        if let Some(due) = self.due.get(j) {
            if at < due.load(Ordering::Relaxed) {
                self.set_due(j, at);
            }
        }
    }

    /// Shard `j`'s `due` is now `at` (its write lock held). A lower time
    /// lowers `due_min` too, and moves its generation.
    fn set_due(&self, j: usize, at: u64) {
        let before = self.due[j].swap(at, Ordering::Relaxed);
        if at < before {
            // Release: a scan that reads the new word (acquire) reads `at`
            // in `due[j]`, or later.
            let _ = self
                .due_min
                .fetch_update(Ordering::Release, Ordering::Relaxed, |w| {
                    Some(DueMin::lowered(w, at))
                });
        }
    }

    /// The write lock of `hash`'s shard and the exact time, for the
    /// operations that change a shard.
    #[inline(always)]
    pub(super) fn write_now(
        &self,
        hash: u64,
    ) -> (impl std::ops::DerefMut<Target = Shard<K, V>> + '_, u64) {
        // The home slot is only a hint here: the write may grow the table.
        let (guard, (), now) =
            self.around(hash, |l| l.write(), |s| s.start_write(hash), |t, _| t.now());
        (guard, now)
    }

    /// The write lock of `key`'s shard (hash `hash`) and the exact time,
    /// for a write of `key`: a load of `key` in flight loses to the write
    /// (it is marked), and an update of `key` in flight is waited for
    /// ([`Flight::wait`](flight::Flight::wait)) with the lock released, then
    /// the lock is taken again. One predictable branch when nothing is in
    /// flight in the shard. `own`: the write is the one the key's own flight
    /// waits to make (a load's store, an update's commit): no check.
    #[inline(always)]
    pub(super) fn write_key<Q>(
        &self,
        hash: u64,
        key: &Q,
        own: bool,
    ) -> (impl std::ops::DerefMut<Target = Shard<K, V>> + '_, u64)
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.write_key_with(hash, key, own, |t, _| t.now())
    }

    /// [`write_key`](Self::write_key) that reads the time with `read` (in
    /// the order of [`Time::around`](crate::clock::Time::around), given the
    /// shard).
    #[inline(always)]
    pub(super) fn write_key_with<Q, T>(
        &self,
        hash: u64,
        key: &Q,
        own: bool,
        read: impl Fn(&crate::clock::Time, &Shard<K, V>) -> T,
    ) -> (impl std::ops::DerefMut<Target = Shard<K, V>> + '_, T)
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        loop {
            let (shard, (), now) = self.around(
                hash,
                |l| l.write(),
                |s| s.start_write(hash),
                |t, s| read(t, s),
            );
            if own || shard.flights.is_empty() {
                return (shard, now);
            }
            match flight::before_write(&shard.flights, hash, key) {
                None => return (shard, now),
                Some(update) => {
                    drop(shard);
                    update.wait();
                }
            }
        }
    }

    /// The time a put of an entry that never expires (`never`: its
    /// deadline is `u64::MAX` at any time) reads under the shard lock, as
    /// the `read` of [`write_key_with`](Self::write_key_with): the exact
    /// time, or `None`, reading no clock, while nothing the put does under
    /// the lock depends on it. That holds in a shard that never held a
    /// deadline and keeps no times of its own (`Shard::time_free`: every
    /// entry there is live at any time), while no shard of the map may
    /// hold one either (`due_min`: a bounded put making room asks about
    /// other shards; an unbounded map never lowers it, and its puts ask
    /// nothing of other shards). The put then passes 0, the clock's origin, where a
    /// time is asked for; a value it pushes out is published with the time
    /// read then ([`RemovedAt`]).
    #[inline(always)]
    pub(super) fn put_time(
        &self,
        never: bool,
        t: &crate::clock::Time,
        s: &Shard<K, V>,
    ) -> Option<u64> {
        if never
            && s.time_free()
            && DueMin::time(self.due_min.load(Ordering::Acquire)) == DueMin::time(DUE_MIN_NONE)
        {
            None
        } else {
            Some(t.now())
        }
    }

    /// Where the timer of an entry written at `now` with write deadline
    /// `deadline` goes: with idle expiry, no later than `now + idle`.
    #[inline]
    pub(super) fn timer_of(&self, deadline: u64, now: u64) -> u64 {
        match self.config.idle {
            Some(idle) => deadline.min(now.saturating_add(idle)),
            None => deadline,
        }
    }

    /// Called under the shard's write lock after a deadline was set: does the
    /// eviction thread need a kick, and for when? (See the protocol in
    /// `evictor`.)
    #[inline]
    pub(super) fn needs_kick(&self, shard: &Shard<K, V>, deadline: u64) -> Option<u64> {
        shard
            .evictable_at(deadline)
            .filter(|&at| self.signal.needs_kick(at))
    }
}

//! The capacity bound's hooks into a shard: the bounded put, reweighing an
//! overwritten entry, and making room (expired entries first, then the
//! policy's victims). The policy itself (`map::policy`) decides; this room
//! only moves entries out through the shard's doors.

use super::slab::{COUNT_ONE, MAX_NODES};

/// Rounds of making room and reserving it in [`Shard::reserve`].
const RESERVE_TRIES: usize = 4;
use super::*;

impl<K, V> Shard<K, V> {
    /// [`put`](Self::put) into a bounded shard (or an unbounded one, which
    /// it treats as `put` does): the entry weighs `weight`. A new entry's
    /// weight (an overwrite's gain) is reserved in the map's budget first;
    /// what must leave to make room (expired entries, the policy's
    /// victims, or this value if the policy refuses it or it is heavier
    /// than the whole bound) is pushed to `out` (see `policy`). If the
    /// budget has no room and this shard nothing more to give, nothing
    /// changes and the result is [`PutOutcome::NoRoom`]. `due_here`: this
    /// shard may hold entries expired at `now` (when it does not, making
    /// room skips the search for them); `due_elsewhere()`: another may.
    ///
    /// A new key never counted is refused without a look for a victim
    /// (the CLOCK hand stays) when no shard may hold an expired entry: it
    /// would lose to any victim, and no expired entry could make room.
    #[allow(clippy::too_many_arguments)] // one call site, each argument a fact of the put
    pub(crate) fn put_bounded(
        &mut self,
        hash: u64,
        kv: &mut Option<(K, V)>,
        deadline: u64,
        now: u64,
        weight: u64,
        out: &mut impl Sink<K, V>,
        due_here: bool,
        due_elsewhere: impl Fn() -> bool,
    ) -> PutOutcome<K, V>
    where
        K: Eq,
    {
        let h32 = hash as u32;
        let slab = &self.entries.slab;
        // One probe serves both outcomes. Growing the table re-places slots
        // from the stored hash bits: no user code.
        // The index `alloc` would use; past `MAX_NODES - 1` it panics itself.
        let max_index = slab.nodes.len().min(MAX_NODES - 1) as u32;
        let key = &kv.as_ref().expect("put without a key and value").0;
        match self
            .table
            .probe(h32, is_key(slab, key), max_index, hash_of(slab))
        {
            Probe::Found(index) => {
                if let Some(b) = &self.entries.bound {
                    let old = b.weight(index);
                    if weight > b.cap {
                        // Over the whole bound alone: stored, then pushed
                        // out at once (its old weight goes back).
                        let replaced = self.overwrite(index, kv, deadline, now);
                        out.push(self.take_index(index, Door::Size));
                        return PutOutcome::Overwrote(replaced);
                    }
                    if weight > old {
                        let gain = weight - old;
                        let room = self.reserve(
                            gain,
                            now,
                            Some(index),
                            None,
                            due_here,
                            &due_elsewhere,
                            out,
                        );
                        // Its own entry may have left meanwhile (it was
                        // due): then the caller looks again.
                        let held = self.entries.slab.nodes[index as usize]
                            .prev
                            .load(Ordering::Relaxed)
                            != VACANT;
                        if room == Room::Made && !held {
                            self.bound().release(gain);
                        }
                        if !(held && room == Room::Made) {
                            return PutOutcome::NoRoom {
                                need: gain,
                                candidate: None,
                            };
                        }
                    }
                }
                let replaced = self.overwrite(index, kv, deadline, now);
                if let Some(b) = &mut self.entries.bound {
                    // The overwrite counts as an access.
                    with_mut_u32(&mut self.entries.slab.nodes[index as usize].prev, |p| {
                        if *p < 3 * COUNT_ONE {
                            *p += COUNT_ONE;
                        }
                    });
                    b.reweigh(index, weight);
                }
                PutOutcome::Overwrote(replaced)
            }
            Probe::Vacant(mut at) => {
                if let Some(b) = &mut self.entries.bound {
                    // A put of an absent key counts as an access to it
                    // (an overwrite counts through the entry's access count),
                    // after its estimate is read for admission: a victim's
                    // latest access is not counted yet either (see `policy`).
                    let reserved = b.try_reserve(weight);
                    let seen = b.sketch.frequency_then_increment(h32);
                    let candidate = if reserved { 0 } else { seen };
                    if !reserved {
                        // A candidate never counted loses to every victim
                        // (`Bound::admits`): unless expired entries could
                        // make room, the hand need not look for one.
                        // No shard may hold an expired entry: `make_room`
                        // would take none first, so the policy alone decides.
                        let quiet = !due_here && !due_elsewhere();
                        let room = if weight > b.cap || (seen == 0 && quiet) {
                            Room::Refused
                        } else if quiet && self.hand_keeps(seen) {
                            // What `make_room`'s first step would decide,
                            // without the search's setup.
                            Room::Refused
                        } else {
                            let c = Some(candidate);
                            self.reserve(weight, now, None, c, due_here, &due_elsewhere, out)
                        };
                        match room {
                            Room::Made => {}
                            Room::Short => {
                                return PutOutcome::NoRoom {
                                    need: weight,
                                    candidate: Some(candidate),
                                };
                            }
                            Room::Refused => {
                                let (key, value) = kv.take().expect("put without a key and value");
                                out.push(Removed {
                                    key,
                                    value,
                                    deadline,
                                    door: Door::Size,
                                });
                                return PutOutcome::Refused;
                            }
                        }
                        // Removals shifted the table's slots.
                        at = self.table.vacant(h32);
                    }
                }
                let index = self.entries.alloc(kv, deadline, now, h32, weight);
                self.table.fill(at, h32, index);
                self.changes.wrote(index);
                PutOutcome::Inserted
            }
        }
    }

    /// Whether the entry under the CLOCK hand, live and unread since the
    /// hand last passed it, beats a new key estimated `candidate` times
    /// (TinyLFU, [`Bound::admits`]): then it stays, the hand stays on it,
    /// and the candidate is refused, as [`make_room`](Self::make_room)
    /// decides at its first step, without its setup (a full map's usual
    /// miss in the hit-ratio traces). Only while no shard may hold an
    /// expired entry, where `make_room` would take none first. `false`
    /// (nothing changed) in every other case, for `make_room` to settle.
    fn hand_keeps(&mut self, candidate: u64) -> bool {
        let n = self.entries.slab.nodes.len() as u32;
        if n == 0 {
            return false;
        }
        let i = wrap(self.bound().hand, n);
        let p = with_mut_u32(&mut self.entries.slab.nodes[i as usize].prev, |p| *p);
        if p == VACANT || p >= COUNT_ONE {
            return false;
        }
        let h = self.entries.slab.nodes.hash(i);
        let b = self.bound_mut();
        b.victim_hint = h;
        if b.admits(candidate, h) {
            return false;
        }
        b.hand = i;
        true
    }

    /// Reserves `need` in the map's budget, making room in this shard as
    /// needed (see [`make_room`](Self::make_room); live entries only while
    /// no other shard may hold expired ones). A room made may be taken by
    /// another shard's put before this one reserves it: then it makes more,
    /// a few times, before it reports [`Room::Short`]. [`Room::Made`]
    /// means reserved.
    #[allow(clippy::too_many_arguments)] // `put_bounded`'s, passed on
    fn reserve(
        &mut self,
        need: u64,
        now: u64,
        skip: Option<u32>,
        candidate: Option<u64>,
        due_here: bool,
        due_elsewhere: &impl Fn() -> bool,
        out: &mut impl Sink<K, V>,
    ) -> Room {
        self.bound_mut().keep_freed();
        let mut room = Room::Short;
        for _ in 0..RESERVE_TRIES {
            if self.bound_mut().take_kept_or_reserve(need) {
                room = Room::Made;
                break;
            }
            let live = !due_elsewhere();
            match self.make_room(need, now, skip, candidate, due_here, live, out) {
                Room::Made => {}
                other => {
                    room = other;
                    break;
                }
            }
        }
        // No user code ran since `keep_freed`: nothing unwinds past this.
        self.bound_mut().settle_kept();
        room
    }

    /// A lower bound of every held entry's effective deadline: the map's
    /// `due` for this shard (no entry can be expired before the clock
    /// passes it). `u64::MAX` if none ever expires, 0 while the wheel has
    /// entries due. Exact when the wheel's next list is short (at most
    /// [`NEXT_TICK_SEARCH`] nodes, whose deadlines it reads), so that a
    /// shard whose next entries are still live in their deadline's tick is
    /// not taken for one holding expired ones; otherwise the start of the
    /// tick before the list's first (a timer's tick is the first that
    /// starts after its deadline).
    pub(crate) fn deadline_floor(&self) -> u64 {
        let w = &self.entries;
        if w.lists.first_due().is_some() {
            return 0;
        }
        let Some(tick) = w.lists.next_wakeup() else {
            return u64::MAX;
        };
        if tick >= w.slab.never() {
            return u64::MAX;
        }
        // Every timer is on the list of `tick` (the first) or a later one,
        // whose ticks are past the list's last: their deadlines are at or
        // after that tick's start. An idle entry's deadline may have moved
        // on from its timer's: read it.
        let mut nodes = [0u32; NEXT_TICK_SEARCH + 1];
        // A list walked ahead of time (`None`) is spread over several.
        let n = w.lists.list_nodes(&w.slab, tick, &mut nodes);
        let Some(n) = n.filter(|&n| n <= NEXT_TICK_SEARCH) else {
            return self.time_of(tick - 1);
        };
        let later = self.time_of(w.lists.list_end(tick));
        nodes[..n]
            .iter()
            .map(|&i| w.slab.live_until(i))
            .fold(later, u64::min)
    }

    fn bound_mut(&mut self) -> &mut Bound {
        self.entries.bound.as_deref_mut().expect("a bounded shard")
    }

    /// The policy state of a bounded shard.
    fn bound(&self) -> &Bound {
        self.entries.bound.as_deref().expect("a bounded shard")
    }

    /// Makes room in the map's budget for `need` more weight from this
    /// shard: evicts what its wheel has due at `now` (if `due_here`: the
    /// caller's lower bound of the shard's deadlines, `Inner::due`, does
    /// not rule out entries expired at `now`), then (if `live`)
    /// walks the CLOCK hand (see `policy`), evicting entries past their
    /// deadline as `Expired` and victims as `Size`, never `skip`. With a `candidate`
    /// (a new key's estimated frequency), the first victim stays unless the
    /// candidate's is higher: then nothing more is evicted and the result
    /// is [`Room::Refused`]. [`Room::Made`] once the budget has the room
    /// (other shards' puts may take it before the caller reserves it);
    /// [`Room::Short`] if this shard has nothing more to give.
    #[allow(clippy::too_many_arguments)] // each argument a fact of the put
    pub(crate) fn make_room(
        &mut self,
        need: u64,
        now: u64,
        skip: Option<u32>,
        candidate: Option<u64>,
        due_here: bool,
        live: bool,
        out: &mut impl Sink<K, V>,
    ) -> Room {
        let fits = |s: &Self| s.entries.bound.as_ref().is_none_or(|b| b.fits(need));
        // Expired entries first: what the wheel has due, ...
        while due_here && !fits(self) {
            let before = out.len();
            // With idle expiry a due timer may only move on, not evict.
            let (more, _) = self.evict(now, 1, out);
            if out.len() == before && !more {
                break;
            }
        }
        // ... then those past their deadline but not yet due, whose timer
        // tick is the next one: they share its list (a short one; at most
        // `NEXT_TICK_SEARCH` are looked at).
        if due_here && !fits(self) {
            let w = &self.entries;
            let mut nodes = [0u32; NEXT_TICK_SEARCH];
            // Not while that list is being walked ahead of time (`None`,
            // for a moment after the wheel enters a level-1 slot).
            let n = w
                .lists
                .list_nodes(&w.slab, w.slab.tick_of(now) + 1, &mut nodes)
                .unwrap_or(0);
            for &i in &nodes[..n] {
                if fits(self) {
                    break;
                }
                if now > self.entries.slab.live_until(i) && Some(i) != skip {
                    out.push(self.take_index(i, Door::Expired));
                }
            }
        }
        if !live {
            return if fits(self) { Room::Made } else { Room::Short };
        }
        let mut admitted = candidate.is_none();
        // Each step passes over a vacant node, takes a count off a live one
        // (at most 3 each), or evicts one: 4 sweeps always reach a victim.
        let mut steps = 4 * self.entries.slab.nodes.len() as u64 + 4;
        // Only an eviction here changes whether the room is there (other
        // shards' puts may give some back meanwhile, as they may at any
        // time): asked again after each, not at every step.
        let mut short = !fits(self);
        while short && steps > 0 {
            steps -= 1;
            let n = self.entries.slab.nodes.len() as u32;
            if n == 0 {
                break; // nothing held: `fits` holds for any `need` admitted
            }
            let b = self.entries.bound.as_mut().expect("bounded");
            // Wraps the hand (left at `n` by the step before, or anywhere
            // past a smaller slab).
            let i = wrap(b.hand, n);
            b.hand = i + 1;
            if Some(i) == skip {
                continue;
            }
            let deadline = self.entries.slab.live_until(i);
            let node = &mut self.entries.slab.nodes[i as usize];
            let count = with_mut_u32(&mut node.prev, |p| {
                if *p == VACANT {
                    None
                } else if *p >= COUNT_ONE {
                    *p -= COUNT_ONE;
                    Some(true)
                } else {
                    Some(false)
                }
            });
            let h = self.entries.slab.nodes.hash(i);
            match count {
                None => {}
                Some(_) if now > deadline => {
                    out.push(self.take_index(i, Door::Expired));
                    short = !fits(self);
                }
                Some(true) => b.sketch.increment(h),
                Some(false) => {
                    if !admitted {
                        let cand = candidate.expect("unadmitted without a candidate");
                        if !b.admits(cand, h) {
                            // The victim stays, and meets the next candidate.
                            b.hand = i;
                            return Room::Refused;
                        }
                        admitted = true;
                    }
                    out.push(self.take_index(i, Door::Size));
                    short = !fits(self);
                }
            }
        }
        if short && !fits(self) {
            Room::Short
        } else {
            Room::Made
        }
    }
}

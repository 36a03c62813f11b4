//! The capacity bound's hooks into a shard: the bounded put, reweighing an
//! overwritten entry, and making room (expired entries first, then the
//! policy's victims). The policy itself (`map::policy`) decides; this room
//! only moves entries out through the shard's doors.

use super::slab::{COUNT_ONE, MAX_NODES};
use super::*;

impl<K, V> Shard<K, V> {
    /// [`put`](Self::put) into a bounded shard (or an unbounded one, which
    /// it treats as `put` does): the entry weighs `weight`, and what must
    /// leave to make room (expired entries, the policy's victims, or this
    /// value if the policy refuses it or it is heavier than the whole
    /// bound) is pushed to `out` (see `policy`).
    pub(crate) fn put_bounded(
        &mut self,
        hash: u64,
        kv: &mut Option<(K, V)>,
        deadline: u64,
        now: u64,
        weight: u32,
        out: &mut impl Sink<K, V>,
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
                let old = self.overwrite(index, kv, deadline, now);
                if self.entries.bound.is_some() {
                    self.reweigh(index, weight, now, out);
                }
                PutOutcome::Overwrote(old)
            }
            Probe::Vacant(mut at) => {
                if let Some(b) = &mut self.entries.bound {
                    // A put of an absent key counts as an access to it
                    // (an overwrite counts through the entry's access count).
                    b.sketch.increment(h32);
                    let fits = b.used.saturating_add(u64::from(weight)) <= b.cap;
                    if !fits {
                        let admitted = u64::from(weight) <= b.cap
                            && self.make_room(u64::from(weight), now, None, Some(h32), out);
                        if !admitted {
                            let (key, value) = kv.take().expect("put without a key and value");
                            out.push(Removed {
                                key,
                                value,
                                deadline,
                                door: Door::Size,
                            });
                            return PutOutcome::Refused;
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

    /// After an overwrite of live node `index` in a bounded shard: counts
    /// the access, records the new `weight`, and if the shard is now over
    /// its bound makes room by pushing out *other* entries (only a weight
    /// that grew can do that), or, if the entry alone is over the bound,
    /// pushes out the entry itself (its new value, as `Size`).
    fn reweigh(&mut self, index: u32, weight: u32, now: u64, out: &mut impl Sink<K, V>) {
        let Some(b) = &mut self.entries.bound else {
            return;
        };
        with_mut_u32(&mut self.entries.slab.nodes[index as usize].prev, |p| {
            if *p < 3 * COUNT_ONE {
                *p += COUNT_ONE;
            }
        });
        b.reweigh(index, weight);
        if b.used <= b.cap {
            return;
        }
        if u64::from(weight) > b.cap {
            out.push(self.take_index(index, Door::Size));
        } else {
            let made = self.make_room(0, now, Some(index), None, out);
            debug_assert!(made, "an entry within the bound always fits alone");
        }
    }

    /// Makes room in a bounded shard for `need` more weight: evicts what
    /// its wheel has due at `now`, then walks the CLOCK hand (see
    /// `policy`), evicting entries past their deadline as `Expired` and
    /// victims as `Size`, never `skip`. With a `candidate` (the hash bits of
    /// a new key), the first victim stays unless the candidate's estimated
    /// frequency is higher: then nothing more is evicted and the result is
    /// `false`. `true` once the room is there.
    fn make_room(
        &mut self,
        need: u64,
        now: u64,
        skip: Option<u32>,
        candidate: Option<u32>,
        out: &mut impl Sink<K, V>,
    ) -> bool {
        let fits = |s: &Self| {
            s.entries
                .bound
                .as_ref()
                .is_none_or(|b| b.used + need <= b.cap)
        };
        // Expired entries first: what the wheel has due, ...
        while !fits(self) {
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
        if !fits(self) {
            let w = &self.entries;
            let mut nodes = [0u32; NEXT_TICK_SEARCH];
            let n = w
                .lists
                .list_nodes(&w.slab, w.slab.tick_of(now) + 1, &mut nodes);
            for &i in &nodes[..n] {
                if fits(self) {
                    break;
                }
                if now > self.entries.slab.live_until(i) && Some(i) != skip {
                    out.push(self.take_index(i, Door::Expired));
                }
            }
        }
        let mut admitted = candidate.is_none();
        // Each step passes over a vacant node, takes a count off a live one
        // (at most 3 each), or evicts one: 4 sweeps always reach a victim.
        let mut steps = 4 * self.entries.slab.nodes.len() as u64 + 4;
        while !fits(self) && steps > 0 {
            steps -= 1;
            let n = self.entries.slab.nodes.len() as u32;
            if n == 0 {
                break; // nothing held: `fits` holds for any `need` admitted
            }
            let b = self.entries.bound.as_mut().expect("bounded");
            let i = b.hand % n;
            b.hand = (i + 1) % n;
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
                Some(_) if now > deadline => out.push(self.take_index(i, Door::Expired)),
                Some(true) => b.sketch.increment(h),
                Some(false) => {
                    if !admitted {
                        let cand = candidate.expect("unadmitted without a candidate");
                        if !b.admits(cand, h) {
                            // The victim stays, and meets the next candidate.
                            b.hand = i;
                            return false;
                        }
                        admitted = true;
                    }
                    out.push(self.take_index(i, Door::Size));
                }
            }
        }
        debug_assert!(fits(self), "the CLOCK hand found no room");
        fits(self)
    }
}

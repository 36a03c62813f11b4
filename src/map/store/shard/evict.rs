//! A shard's eviction: taking the entries whose timers are due
//! ([`Shard::evict`], by the eviction thread or a write's share), walking
//! the next slots' timers ahead ([`Shard::precascade`]), when a write takes
//! due entries ([`Shard::writers_evict`]), and the wheel's next wake-up.
//! What leaves goes out by value, through a [`Sink`], for the map to
//! publish or drop unlocked.

use super::{Door, Removed, Shard, Sink, hash_of};
use crate::timer::Links;

impl<K, V> Shard<K, V> {
    /// Evicts at most `limit` entries whose timers are due at `now`, or at
    /// the time the wheel has already reached if that is later (see
    /// "Eviction time" above), pushing them to `out`. Returns whether more
    /// are due, and the time they were evicted at: every evicted deadline is
    /// below it.
    pub(crate) fn evict(
        &mut self,
        now: u64,
        limit: usize,
        out: &mut impl Sink<K, V>,
    ) -> (bool, u64) {
        let now = now.max(self.time_of(self.entries.lists.now()));
        // tick_of(now) >= the wheel's tick, since the wheel's tick starts at
        // or before `now`: `move_to` goes forward or stays.
        let now_tick = self.entries.slab.tick_of(now);
        // Writes take due entries from `writer_lag` ticks after the last
        // eviction that left none due: a pass still working through a
        // backlog (a batch at a time, against writers that keep taking
        // the lock) does not hold them off.
        let drained = self.time_of(now_tick.saturating_add(self.writer_lag));
        let entries = &mut self.entries;
        entries.lists.move_to(&mut entries.slab, now_tick);
        for _ in 0..limit {
            let Some(index) = entries.lists.first_due() else {
                break;
            };
            if entries.slab.idle.is_some() {
                // Read since its timer was set: its effective deadline moved
                // on. Its timer goes there, to a tick after `now_tick`.
                let until = entries.slab.live_until(index);
                let tick = entries.slab.tick_for(until);
                if tick > now_tick {
                    let popped = entries.lists.pop_due(&mut entries.slab);
                    debug_assert_eq!(popped, Some(index));
                    entries.slab.nodes[index as usize].deadline = until;
                    entries.timed |= until != u64::MAX;
                    entries.lists.link(&mut entries.slab, index, tick);
                    continue;
                }
            }
            // Out of the table first, while the node is still live: a panic
            // anywhere below leaves no table slot pointing at a vacant node.
            let h32 = entries.slab.nodes.hash(index);
            let found = self
                .table
                .remove(h32, |i| i == index, hash_of(&entries.slab));
            debug_assert_eq!(found, Some(index), "due entry missing from the table");
            let popped = entries.lists.pop_due(&mut entries.slab);
            debug_assert_eq!(popped, Some(index));
            let e = entries.vacate(index, false);
            // The due list is a linked list, so its nodes arrive one cache
            // miss after another. Start loading the node (and hash bits) of
            // the one after next now, and the table slot of the next one,
            // whose hash bits the previous round started loading: all three
            // overlap with this entry's table probe.
            if let Some(next) = entries.lists.first_due() {
                entries.slab.prefetch_node(entries.slab.links(next).1);
                self.table.prefetch_home(entries.slab.nodes.hash(next));
            }
            // The wheel's tick is at most tick_of(now), so the entry's tick
            // is too: below `u64::MAX`, now >> shift > deadline >> shift;
            // at `u64::MAX`, deadline < u64::MAX (its tick is not `never`).
            // Either way the entry is past its deadline (see "The end of
            // time"). The state is consistent here whatever this says.
            debug_assert!(e.deadline < now);
            out.push(Removed {
                key: e.key,
                value: e.value,
                deadline: e.deadline,
                door: Door::Expired,
            });
        }
        let more = entries.lists.first_due().is_some();
        if !more {
            self.writers_from = drained;
        }
        (more, now)
    }

    /// Walks up to `budget` timers of the wheel's next level-1 slot to
    /// where they go when it begins (`timer::Lists`, "Walking ahead"), so
    /// that the eviction at its start does not walk them all at once; once
    /// none is left, up to `budget` of the next level-2 slot's, counted
    /// down from `ahead2`. Returns whether some are left that these budgets
    /// allow. Moves no entry's eviction time.
    pub(crate) fn precascade(&mut self, budget: usize, ahead2: &mut usize) -> bool {
        let entries = &mut self.entries;
        if entries.lists.precascade(&mut entries.slab, budget) {
            return true;
        }
        let n = budget.min(*ahead2);
        *ahead2 -= n;
        n != 0 && entries.lists.precascade2(&mut entries.slab, n) && *ahead2 != 0
    }

    /// After a write's bounded [`evict`](Self::evict) left entries due:
    /// the next writes take more at once (the thread is behind).
    pub(crate) fn writers_continue(&mut self) {
        self.writers_from = 0;
    }

    /// Whether a write at `now` should take due entries (see
    /// `evictor::take_due`): no eviction has left the shard with nothing
    /// due for `writer_lag` ticks (the thread is behind, or working
    /// through a backlog a batch at a time while writers keep the lock
    /// busy), or an earlier write's eviction left entries
    /// due. One load of what a write has just touched and a comparison.
    #[inline]
    pub(crate) fn writers_evict(&self, now: u64) -> bool {
        now >= self.writers_from
    }

    /// When the wheel next has work, in clock nanoseconds: `None` if it
    /// holds nothing that will ever be due (see "The end of time").
    pub(crate) fn next_wakeup(&self) -> Option<u64> {
        let tick = self.entries.lists.next_wakeup()?;
        (tick < self.entries.slab.never()).then(|| self.time_of(tick))
    }
}

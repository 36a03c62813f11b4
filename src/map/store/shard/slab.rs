//! The shard's entry storage: the slab of nodes (entry + timer links), its
//! chunks and parallel arrays (hash bits, idle records), its free stack,
//! and the timer lists that link its live nodes ([`Entries`]).
//!
//! Owns the slab invariant below, and every `unsafe` read of a node's
//! `kv`. Knows nothing of the table or of locks; calls only
//! `crate::timer`'s lists and the bound's bookkeeping (`policy::Bound`).

use super::idle::Idle;
use crate::map::policy::Bound;
use crate::sync::{AtomicU32, Ordering, with_mut_u32};
use crate::timer::{Links, Lists, NIL};
use std::mem::MaybeUninit;

/// An entry taken out of a shard by [`Shard::drain`].
pub(crate) struct Entry<K, V> {
    pub(crate) key: K,
    pub(crate) value: V,
    /// Exact deadline in clock nanoseconds.
    pub(crate) deadline: u64,
}

/// One slab node: an entry and its timer links, nothing else. For
/// `u64 -> u64` that is 32 bytes; in general `size_of::<(K, V)>() + 16`,
/// rounded up to the alignment of `K` and `V`. The key's 32 hash bits, which
/// only removal by index and table growth need, sit in a parallel array of
/// [`Nodes`] instead: in the node they took 8 bytes with the padding.
/// (Chunks are only as aligned as the allocator makes them, 16 bytes with
/// glibc, so some nodes still straddle two cache lines; aligning nodes to 32
/// bytes measured no faster.)
#[repr(C)]
pub(super) struct Node<K, V> {
    /// Initialised exactly while the node is linked in the wheel's lists
    /// (see "Slab invariant" on [`Shard`]).
    pub(super) kv: MaybeUninit<(K, V)>,
    /// Exact deadline in clock nanoseconds; visible while `now <= deadline`.
    pub(super) deadline: u64,
    /// The previous node's index in the low bits ([`LINK`]), and the access
    /// count of a bounded shard's CLOCK in the top two (see `policy`). A
    /// lookup raises the count under the *read* lock, so the field is
    /// atomic; everything else changes it under the write lock. A vacant
    /// node's is [`VACANT`].
    pub(super) prev: AtomicU32,
    pub(super) next: u32,
}

/// The bits of `Node::prev` that hold an index.
pub(super) const LINK: u32 = (1 << 30) - 1;

/// One access in `Node::prev`'s count bits.
pub(super) const COUNT_ONE: u32 = 1 << 30;

/// `Node::prev` of a vacant node: no live node's (its index would be
/// `LINK`, which no node has).
pub(super) const VACANT: u32 = u32::MAX;

/// Most nodes in one shard's slab: their indices fit in [`LINK`], all-ones
/// excluded.
pub(super) const MAX_NODES: usize = LINK as usize;

impl<K, V> Node<K, V> {
    /// A lookup found this live node: raise its access count, unless it is
    /// already at the top (then this is only a load of the line the lookup
    /// just read). A load and a store, not a read-modify-write: under the
    /// read lock only lookups write here, and they only change the count
    /// bits, so every value stored has the same index bits; racing lookups
    /// may lose each other's raise, which is harmless.
    #[inline]
    pub(super) fn hit(&self) {
        let p = self.prev.load(Ordering::Relaxed);
        if p < 3 * COUNT_ONE {
            self.prev.store(p + COUNT_ONE, Ordering::Relaxed);
        }
    }
}

/// Bits of a node index that give its place inside a chunk of [`Nodes`].
/// 1,024 nodes rather than 4,096: with the default of up to 256 shards a
/// map of 6 * 10^5 entries (4,700 a shard at 128) left most of a second
/// 4,096-node chunk unused in every shard, 70 bytes an entry against 46.4
/// (`memory` example); the split is the same shift and mask either way.
pub(super) const CHUNK_BITS: u32 = 10;

/// Nodes per chunk (32 KiB of `u64 -> u64` nodes).
pub(super) const CHUNK: usize = 1 << CHUNK_BITS;

/// The slab's storage: chunks of [`CHUNK`] nodes that never move once
/// allocated. The first chunk grows like a `Vec` up to `CHUNK`, so a small
/// shard stays small; every later chunk is allocated whole. Against one
/// doubling `Vec` (the earlier layout): growing never copies the slab under
/// the shard lock, and the slack is at most one partly used chunk per shard
/// instead of up to half the allocation (10^6 entries happened to fill
/// their `Vec`s; 1.1 × 10^6 took 91.5 bytes per entry).
///
/// Beside each chunk of nodes is a chunk of their keys' 32 hash bits
/// (same shape), kept for vacant nodes too.
///
/// The first chunk is held in the shard itself (`first`, `first_hashes`),
/// the later ones in a list (`rest`): a shard of at most
/// [`CHUNK`] nodes (every shard of a map up to 128 × 1,024 entries, at the
/// default count) goes from its header straight to a node, not through a
/// list of chunks on a line of its own: one dependent cache miss fewer a
/// lookup in a map too large for L1.
///
/// `repr(C)`: the first chunk first (see `Shard`'s layout).
#[repr(C)]
pub(super) struct Nodes<K, V> {
    pub(super) first: Vec<Node<K, V>>,
    pub(super) first_hashes: Vec<u32>,
    pub(super) rest: Vec<Chunk<K, V>>,
    /// A map with idle expiry's write deadlines and last accesses, a list
    /// of chunks in the nodes' shape; empty in every other map, which pays
    /// nothing.
    pub(super) idle: Vec<Vec<Idle>>,
    /// A map with refresh ahead's write times: when each entry's value was
    /// last written (a list of chunks as `idle`); empty in every other map.
    pub(super) born: Vec<Vec<u64>>,
    /// Nodes pushed (below [`MAX_NODES`]).
    pub(super) len: u32,
    /// Most nodes this slab will hold (a bounded shard's entry bound, at
    /// most `u32::MAX`), so that its last chunk is allocated no larger than
    /// needed.
    pub(super) limit: u32,
    /// Whether `idle` is kept.
    pub(super) tracks_idle: bool,
    /// Whether `born` is kept.
    pub(super) tracks_born: bool,
}

/// A chunk's nodes and their hash bits ([`Nodes::chunk`]).
type ChunkRef<'a, K, V> = (&'a Vec<Node<K, V>>, &'a Vec<u32>);
/// [`ChunkRef`], to change ([`Nodes::chunk_mut`]).
type ChunkMut<'a, K, V> = (&'a mut Vec<Node<K, V>>, &'a mut Vec<u32>);

/// A chunk of [`Nodes`] past the first: its nodes and their hash bits.
pub(super) struct Chunk<K, V> {
    nodes: Vec<Node<K, V>>,
    hashes: Vec<u32>,
}

impl<K, V> Nodes<K, V> {
    pub(super) fn new() -> Self {
        Self {
            first: Vec::new(),
            first_hashes: Vec::new(),
            rest: Vec::new(),
            idle: Vec::new(),
            tracks_idle: false,
            born: Vec::new(),
            tracks_born: false,
            len: 0,
            limit: u32::MAX,
        }
    }

    /// The chunk that holds node `index`, and its place in the chunk.
    #[inline]
    pub(super) fn split(index: usize) -> (usize, usize) {
        (index >> CHUNK_BITS, index & (CHUNK - 1))
    }

    /// Chunk `chunk`'s nodes and their hash bits, if it was started.
    #[inline]
    fn chunk(&self, chunk: usize) -> Option<ChunkRef<'_, K, V>> {
        match chunk {
            0 => Some((&self.first, &self.first_hashes)),
            c => self.rest.get(c - 1).map(|r| (&r.nodes, &r.hashes)),
        }
    }

    /// [`chunk`](Self::chunk), to change.
    #[inline]
    fn chunk_mut(&mut self, chunk: usize) -> Option<ChunkMut<'_, K, V>> {
        match chunk {
            0 => Some((&mut self.first, &mut self.first_hashes)),
            c => self
                .rest
                .get_mut(c - 1)
                .map(|r| (&mut r.nodes, &mut r.hashes)),
        }
    }

    /// The 32 hash bits stored with node `index`.
    #[inline]
    pub(super) fn hash(&self, index: u32) -> u32 {
        let (chunk, at) = Self::split(index as usize);
        self.chunk(chunk).expect("a pushed node").1[at]
    }

    #[inline]
    pub(super) fn set_hash(&mut self, index: u32, h32: u32) {
        let (chunk, at) = Self::split(index as usize);
        self.chunk_mut(chunk).expect("a pushed node").1[at] = h32;
    }

    /// Node `index`'s idle record. Only in a shard that tracks idle time.
    #[inline]
    pub(super) fn idle(&self, index: u32) -> &Idle {
        let (chunk, at) = Self::split(index as usize);
        &self.idle[chunk][at]
    }

    /// [`idle`](Self::idle) without bounds checks.
    ///
    /// # Safety
    ///
    /// `index < self.len()`, and the slab tracks idle time (then `push`
    /// gave every node an idle record, in the same chunk shape).
    #[inline]
    pub(super) unsafe fn idle_unchecked(&self, index: u32) -> &Idle {
        let (chunk, at) = Self::split(index as usize);
        // SAFETY: as for `get_unchecked`: `push` fills `idle` beside the
        // chunks of nodes, in order, whenever `tracks_idle`.
        unsafe { self.idle.get_unchecked(chunk).get_unchecked(at) }
    }

    /// When node `index`'s value was last written. Only in a shard that
    /// tracks write times (refresh ahead).
    #[inline]
    pub(super) fn born(&self, index: u32) -> u64 {
        let (chunk, at) = Self::split(index as usize);
        self.born[chunk][at]
    }

    /// Records that node `index`'s value was written at `now`, if the
    /// shard tracks write times.
    #[inline]
    pub(super) fn set_born(&mut self, index: u32, now: u64) {
        if self.tracks_born {
            let (chunk, at) = Self::split(index as usize);
            self.born[chunk][at] = now;
        }
    }

    /// Nodes ever pushed (live and vacant).
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len as usize
    }

    /// Appends a node with hash bits `h32`; its index is the old `len()`.
    pub(super) fn push(&mut self, node: Node<K, V>, h32: u32, idle: Idle, born: u64) {
        let (chunk, at) = Self::split(self.len as usize);
        if at == 0 {
            // A new chunk. The first is always there (`first`), and grows
            // like a `Vec`; a later one is allocated to CHUNK, or to what
            // `limit` leaves (a hint only: past it, it grows like a `Vec`).
            let rest = self.limit.saturating_sub(self.len).max(1) as usize;
            let cap = if chunk == 0 { 0 } else { CHUNK.min(rest) };
            if chunk > 0 {
                self.rest.push(Chunk {
                    nodes: Vec::with_capacity(cap),
                    hashes: Vec::with_capacity(cap),
                });
            }
            if self.tracks_idle {
                self.idle.push(Vec::with_capacity(cap));
            }
            if self.tracks_born {
                self.born.push(Vec::with_capacity(cap));
            }
        }
        let (nodes, hashes) = self.chunk_mut(chunk).expect("started above");
        nodes.push(node);
        hashes.push(h32);
        if self.tracks_idle {
            self.idle[chunk].push(idle);
        }
        if self.tracks_born {
            self.born[chunk].push(born);
        }
        self.len += 1;
    }

    /// Node `index`, without bounds checks.
    ///
    /// # Safety
    ///
    /// `index < self.len()`.
    #[inline]
    pub(super) unsafe fn get_unchecked(&self, index: usize) -> &Node<K, V> {
        let (chunk, at) = Self::split(index);
        // SAFETY: every index below `len` was pushed: its chunk exists and
        // holds at least `at + 1` nodes (`push` fills chunks in order).
        unsafe {
            match chunk {
                0 => self.first.get_unchecked(at),
                _ => self.rest.get_unchecked(chunk - 1).nodes.get_unchecked(at),
            }
        }
    }

    /// Node `index` and its hash bits, if the slab has them.
    #[inline]
    pub(super) fn get(&self, index: usize) -> Option<(&Node<K, V>, &u32)> {
        let (chunk, at) = Self::split(index);
        let (nodes, hashes) = self.chunk(chunk)?;
        Some((nodes.get(at)?, &hashes[at]))
    }
}

impl<K, V> std::ops::Index<usize> for Nodes<K, V> {
    type Output = Node<K, V>;

    #[inline]
    fn index(&self, index: usize) -> &Node<K, V> {
        let (chunk, at) = Self::split(index);
        &self.chunk(chunk).expect("a pushed node").0[at]
    }
}

impl<K, V> std::ops::IndexMut<usize> for Nodes<K, V> {
    #[inline]
    fn index_mut(&mut self, index: usize) -> &mut Node<K, V> {
        let (chunk, at) = Self::split(index);
        &mut self.chunk_mut(chunk).expect("a pushed node").0[at]
    }
}

/// The slab as the wheel's [`Links`] store. A node's timer tick is derived
/// from its exact deadline (`tick_for`), so it is not stored.
///
/// `repr(C)`: the first chunk first (see `Shard`'s layout).
#[repr(C)]
pub(super) struct Slab<K, V> {
    pub(super) nodes: Nodes<K, V>,
    /// A wheel tick lasts `2^shift` nanoseconds.
    pub(super) shift: u32,
    /// Added to every tick number (see [`phase`]).
    pub(super) phase: u64,
    /// The time to idle in ns, if entries have one (then `nodes` tracks
    /// idle time).
    pub(super) idle: Option<u64>,
}

impl<K, V> Slab<K, V> {
    /// See [`Shard::tick_for`].
    #[inline]
    pub(super) fn tick_for(&self, deadline: u64) -> u64 {
        (deadline >> self.shift) + 1 + self.phase + u64::from(deadline == u64::MAX)
    }

    /// The wheel tick that time `now` falls in; the clock's last instant,
    /// `u64::MAX`, counts as the tick after the last (see "The end of time"
    /// on [`Shard`]).
    #[inline]
    pub(super) fn tick_of(&self, now: u64) -> u64 {
        (now >> self.shift) + self.phase + u64::from(now == u64::MAX)
    }

    /// Where the timer of an entry written to expire at `write` and last
    /// accessed at `access` goes: its effective deadline.
    #[inline]
    pub(super) fn effective(&self, write: u64, access: u64) -> u64 {
        match self.idle {
            Some(idle) => write.min(access.saturating_add(idle)),
            None => write,
        }
    }

    /// The effective deadline of live node `index`: the node's own deadline,
    /// or with idle expiry `min(write deadline, last access + idle)`.
    #[inline]
    pub(super) fn live_until(&self, index: u32) -> u64 {
        if self.idle.is_none() {
            return self.nodes[index as usize].deadline;
        }
        let idle = self.nodes.idle(index);
        self.effective(idle.write, idle.access.load(Ordering::Relaxed))
    }

    /// Gives live node `index` the write deadline `write`, and if `now` is
    /// given records an access then (a write is one; `expire` is not);
    /// returns the deadline its timer goes to.
    #[inline]
    pub(super) fn written(&mut self, index: u32, write: u64, now: Option<u64>) -> u64 {
        if self.idle.is_none() {
            return write;
        }
        let (chunk, at) = Nodes::<K, V>::split(index as usize);
        let idle = &mut self.nodes.idle[chunk][at];
        idle.write = write;
        // Reads record their time under the read lock; a write's is later.
        let mut access = idle.access.load(Ordering::Relaxed);
        if let Some(now) = now {
            access = access.max(now);
            idle.access.store(access, Ordering::Relaxed);
        }
        self.effective(write, access)
    }

    /// The tick of deadline `u64::MAX`, which `tick_of` never reaches.
    #[inline]
    pub(super) fn never(&self) -> u64 {
        self.tick_for(u64::MAX)
    }

    /// The key and value of node `index`.
    ///
    /// # Safety
    ///
    /// `index` must be live: linked in the wheel's lists, which is the case
    /// for every index stored in the table.
    #[inline]
    pub(super) unsafe fn kv(&self, index: u32) -> &(K, V) {
        // SAFETY: the caller guarantees `index` is live, so below `len`
        // (see `live`), and a live node's `kv` is initialised (slab
        // invariant).
        unsafe { self.live(index).kv.assume_init_ref() }
    }

    /// Live node `index`, without bounds checks: a lookup's node access is
    /// on the path of every `get`, whose instruction count sets how fast a
    /// loop of them runs (BENCHMARKS.md, "Where a get's time goes").
    ///
    /// # Safety
    ///
    /// `index` must be live (as for [`kv`](Self::kv)).
    #[inline]
    pub(super) unsafe fn live(&self, index: u32) -> &Node<K, V> {
        // SAFETY: a live node was pushed and never popped (the slab only
        // grows), so `index < nodes.len()`.
        unsafe { self.nodes.get_unchecked(index as usize) }
    }

    /// Hints the CPU to start loading node `index` (its key, value and
    /// deadline; not its hash bits): a no-op for an index past the slab.
    #[inline]
    pub(super) fn prefetch_kv(&self, index: u32) {
        if let Some((node, _)) = self.nodes.get(index as usize) {
            crate::map::store::table::prefetch_line(node);
        }
    }

    /// Moves the key and value out of node `index`, leaving it uninitialised.
    ///
    /// # Safety
    ///
    /// `index` must be live, and the caller must make it vacant (unlink it
    /// and push it on the free stack) before anything reads its `kv` again.
    #[inline]
    pub(super) unsafe fn take_kv(&mut self, index: u32) -> (K, V) {
        // SAFETY: live means initialised; the caller stops treating the node
        // as initialised, so the pair is not read or dropped twice.
        unsafe { self.nodes[index as usize].kv.assume_init_read() }
    }
}

impl<K, V> Links for Slab<K, V> {
    /// Hints the CPU to start loading node `index` and its hash bits (no-op
    /// for an index past the slab, such as `NIL`).
    #[inline]
    fn prefetch_node(&self, index: u32) {
        if let Some((node, hash)) = self.nodes.get(index as usize) {
            crate::map::store::table::prefetch_line(node);
            crate::map::store::table::prefetch_line(hash);
        }
    }

    #[inline]
    fn links(&self, index: u32) -> (u32, u32) {
        let n = &self.nodes[index as usize];
        (n.prev.load(Ordering::Relaxed) & LINK, n.next)
    }

    #[inline]
    fn set_prev(&mut self, index: u32, to: u32) {
        debug_assert!(to < LINK);
        with_mut_u32(&mut self.nodes[index as usize].prev, |p| {
            *p = (*p & !LINK) | to;
        });
    }

    #[inline]
    fn set_next(&mut self, index: u32, to: u32) {
        self.nodes[index as usize].next = to;
    }

    #[inline]
    fn deadline(&self, index: u32) -> u64 {
        self.tick_for(self.nodes[index as usize].deadline)
    }
}

/// The slab, its free stack and the wheel's lists: everything but the
/// table, so that a table entry (which borrows the table) can be held while
/// the wheel changes.
///
/// # Slab invariant
///
/// A node is *live* exactly when it is linked in `lists`; then its `kv` is
/// initialised and exactly one table slot holds its index. Every other node
/// of the slab is *vacant*: its index is on `free` once, and its `kv` is
/// uninitialised. Every method of [`Shard`] restores this before it returns
/// or runs anything that can panic (user `Eq` runs only inside table probes,
/// before any change). The `unsafe` reads of `kv` rely on it.
///
/// How each path keeps it, without relying on a `debug_assert!`:
///
/// * `put` fills the table slot with the index `alloc` just linked (the
///   slot encoding is checked by an `assert!` in `Table::fill`); an
///   overwrite keeps both.
/// * `remove` takes the index out of the table, then unlinks and frees it.
/// * `evict` takes the first due node (linked), removes its table slot by
///   index under the hash bits `alloc` stored for it (the bits `put` filled
///   the slot under; only `alloc` writes them), and only then unlinks and
///   frees it. Should the slot not be found, no slot held the index, so
///   freeing the node leaves nothing pointing at it.
/// * `take_all` and `drain` move the whole table and wheel out together.
///
/// `repr(C)`, what a read looks at first (see `Shard`'s layout).
#[repr(C)]
pub(super) struct Entries<K, V> {
    /// Set once a node here gets a deadline other than `u64::MAX`, never
    /// cleared: while it is clear, every entry held lives forever and a
    /// read needs no clock (see `Shard::timed`).
    pub(super) timed: bool,
    /// The capacity policy's state, in a bounded map.
    pub(super) bound: Option<Box<Bound>>,
    pub(super) slab: Slab<K, V>,
    /// Vacant node indices, reused last-in first-out.
    pub(super) free: Vec<u32>,
    pub(super) lists: Lists<{ crate::timer::DEFAULT_LEVEL_BITS }>,
    pub(super) len: usize,
}

impl<K, V> Entries<K, V> {
    /// Takes a vacant node (or grows the slab), fills it and links it.
    /// Takes the key and value out of `kv` (which must hold them) into a
    /// new node. If the shard is full it panics with them still in `kv`,
    /// so the caller can drop them after releasing the lock.
    #[inline]
    /// `deadline` is the write deadline, `now` the time of the write (its
    /// first access, for idle expiry).
    pub(super) fn alloc(
        &mut self,
        kv: &mut Option<(K, V)>,
        deadline: u64,
        now: u64,
        h32: u32,
        weight: u64,
    ) -> u32 {
        let reuse = self.free.pop();
        if reuse.is_none() {
            assert!(
                self.slab.nodes.len() < MAX_NODES,
                "expiremap: more than 2^30 - 1 entries in one shard"
            );
        }
        let write = deadline;
        let deadline = self.slab.effective(write, now);
        // Links set by `link` below; an access count of 0.
        let node = Node {
            kv: MaybeUninit::new(kv.take().expect("alloc without a key and value")),
            deadline,
            prev: AtomicU32::new(0),
            next: NIL,
        };
        let index = if let Some(index) = reuse {
            // Overwriting a vacant node drops nothing: `kv` is MaybeUninit.
            self.slab.nodes[index as usize] = node;
            self.slab.nodes.set_hash(index, h32);
            if self.slab.nodes.tracks_idle {
                let (chunk, at) = Nodes::<K, V>::split(index as usize);
                self.slab.nodes.idle[chunk][at] = Idle::new(write, now);
            }
            self.slab.nodes.set_born(index, now);
            index
        } else {
            // < NIL, checked above.
            let index = self.slab.nodes.len() as u32;
            self.slab.nodes.push(node, h32, Idle::new(write, now), now);
            index
        };
        let tick = self.slab.tick_for(deadline);
        self.lists.link(&mut self.slab, index, tick);
        self.timed |= deadline != u64::MAX;
        self.len += 1;
        if let Some(b) = &mut self.bound {
            b.add(index, weight);
        }
        index
    }

    /// Makes live node `index` (already removed from the table, or just
    /// popped from the due list if `linked` is false) vacant and returns its
    /// entry.
    /// The entry's `deadline` is its effective one.
    #[inline]
    pub(super) fn vacate(&mut self, index: u32, linked: bool) -> Entry<K, V> {
        let deadline = self.slab.live_until(index);
        if linked {
            let tick = self.slab.tick_for(self.slab.nodes[index as usize].deadline);
            self.lists.unlink(&mut self.slab, index, tick);
        }
        // SAFETY: `index` was live; it is now unlinked and goes on the free
        // stack right below, so nothing reads its `kv` again until `alloc`
        // overwrites it.
        let (key, value) = unsafe { self.slab.take_kv(index) };
        with_mut_u32(&mut self.slab.nodes[index as usize].prev, |p| *p = VACANT);
        self.free.push(index);
        self.len -= 1;
        if let Some(b) = &mut self.bound {
            b.remove(index);
        }
        Entry {
            key,
            value,
            deadline,
        }
    }

    /// Moves live node `index` to a new deadline. If the new deadline
    /// belongs on the node's list (a refresh that stays within the node's
    /// wheel slot: with a 1 h TTL, one of ~137 s), only the deadline
    /// changes: relinking would touch the node's two neighbours, two cache
    /// misses in a large shard.
    #[inline]
    pub(super) fn reschedule(&mut self, index: u32, deadline: u64) {
        self.timed |= deadline != u64::MAX;
        let node = &mut self.slab.nodes[index as usize];
        let old = std::mem::replace(&mut node.deadline, deadline);
        let (old, tick) = (self.slab.tick_for(old), self.slab.tick_for(deadline));
        // Linking reads only the links; the ticks are passed in.
        if !self.lists.same_list(old, tick) {
            self.lists.unlink(&mut self.slab, index, old);
            self.lists.link(&mut self.slab, index, tick);
        }
    }

    /// Unlinks and makes vacant the first due node.
    #[inline]
    pub(super) fn pop_due(&mut self) -> Option<(u32, Entry<K, V>)> {
        let index = self.lists.pop_due(&mut self.slab)?;
        Some((index, self.vacate(index, false)))
    }
}

impl<K, V> Drop for Entries<K, V> {
    fn drop(&mut self) {
        // Move every live pair out first (no user code), then drop them one
        // at a time: a panicking `Drop` of one still drops the rest (a
        // `Vec`'s drop glue would abort on a second panic), and the first
        // panic goes on once all are dropped.
        self.lists.all_due(&mut self.slab);
        let mut live = Vec::with_capacity(self.len);
        while let Some(index) = self.lists.pop_due(&mut self.slab) {
            // SAFETY: popped from the lists, so it was live; it is never
            // read again (the slab is being dropped, and drops no `kv`).
            live.push(unsafe { self.slab.take_kv(index) });
        }
        self.len = 0;
        let mut panics = crate::unwind::Panics::new();
        panics.drop_each(live);
        panics.resume();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(i: u32) -> Node<u64, u64> {
        Node {
            kv: MaybeUninit::uninit(),
            deadline: u64::from(i),
            prev: AtomicU32::new(VACANT),
            next: i,
        }
    }

    /// Nodes past the first chunk (held in the shard) live in the list of
    /// later chunks; every accessor finds each node and its hash bits on
    /// both sides of each boundary, and `limit` only sizes a chunk.
    #[test]
    fn nodes_past_the_first_chunk_are_found_by_index() {
        let mut n = Nodes::<u64, u64>::new();
        n.tracks_born = true;
        n.tracks_idle = true;
        n.limit = (2 * CHUNK + 500) as u32;
        let count = 2 * CHUNK as u32 + 600; // past `limit`: grows like a `Vec`
        for i in 0..count {
            n.push(node(i), i ^ 0xABCD, Idle::new(0, 0), u64::from(i) * 3);
        }
        assert_eq!(n.len(), count as usize);
        assert_eq!((n.first.len(), n.rest.len()), (CHUNK, 2));
        assert_eq!(n.rest[0].nodes.capacity(), CHUNK, "a later chunk is whole");
        assert_eq!(
            (n.idle.len(), n.born.len()),
            (3, 3),
            "parallel chunks follow"
        );
        for i in (0..count).filter(|i| i % 97 == 0 || (i % CHUNK as u32) < 2) {
            let at = i as usize;
            assert_eq!(n[at].next, i);
            // SAFETY: `at < n.len()`.
            assert_eq!(unsafe { n.get_unchecked(at) }.deadline, u64::from(i));
            let (got, h) = n.get(at).expect("pushed");
            assert_eq!((got.next, *h), (i, i ^ 0xABCD));
            assert_eq!(n.hash(i), i ^ 0xABCD);
            assert_eq!(n.born(i), u64::from(i) * 3);
            assert_eq!(n.idle(i).write, 0);
            n.set_hash(i, 7);
            assert_eq!(n.hash(i), 7);
            n[at].next = 0;
            assert_eq!(n[at].next, 0);
        }
        assert!(n.get(count as usize).is_none());
        assert!(n.get(5 * CHUNK).is_none());
    }
}

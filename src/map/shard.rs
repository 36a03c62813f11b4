//! One shard: a hash table of slab indices plus the timer wheel whose slab
//! holds the entries.
//!
//! # Ground rules
//!
//! * Plain `&mut self` code. The map wraps each shard in its own
//!   `RwLock`; the shard knows nothing of locks, threads or events.
//! * One allocation per entry serves both the table and the expiry index: the
//!   entry lives in the wheel's slab node (with the timer links), and the
//!   [`Table`] stores only a 4-byte slot: the node's index and a tag of the
//!   key's hash. Rejecting other keys by tag never touches the slab; a hit
//!   reads one table slot and one node. The key's 32 hash bits sit in a
//!   parallel array of the slab, read only when the table grows or removes.
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

use super::policy::Bound;
pub(crate) use super::table::Home;
use super::table::{Probe, Table};
use crate::sync::{AtomicU32, AtomicU64, Ordering, with_mut_u32};
use crate::timer::{Links, Lists, NIL};
use std::borrow::Borrow;
use std::mem::MaybeUninit;

mod iter;

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
struct Node<K, V> {
    /// Initialised exactly while the node is linked in the wheel's lists
    /// (see "Slab invariant" on [`Shard`]).
    kv: MaybeUninit<(K, V)>,
    /// Exact deadline in clock nanoseconds; visible while `now <= deadline`.
    deadline: u64,
    /// The previous node's index in the low bits ([`LINK`]), and the access
    /// count of a bounded shard's CLOCK in the top two (see `policy`). A
    /// lookup raises the count under the *read* lock, so the field is
    /// atomic; everything else changes it under the write lock. A vacant
    /// node's is [`VACANT`].
    prev: AtomicU32,
    next: u32,
}

/// The bits of `Node::prev` that hold an index.
const LINK: u32 = (1 << 30) - 1;
/// One access in `Node::prev`'s count bits.
const COUNT_ONE: u32 = 1 << 30;
/// `Node::prev` of a vacant node: no live node's (its index would be
/// `LINK`, which no node has).
const VACANT: u32 = u32::MAX;
/// Most nodes in one shard's slab: their indices fit in [`LINK`], all-ones
/// excluded.
const MAX_NODES: usize = LINK as usize;
/// The most entries a bounded shard's table is sized for up front (1.3 MiB
/// of slots): a larger share grows it as the shard fills, so that a bound
/// of `u64::MAX` costs an empty map 8 × 1.3 MiB at 8 shards, not its share
/// of the bound.
const PRESIZED_TABLE: u64 = 1 << 18;
/// Most nodes of the next timer tick's list a full bounded shard looks at
/// for expired entries before it asks the policy for a victim.
const NEXT_TICK_SEARCH: usize = 32;

impl<K, V> Node<K, V> {
    /// A lookup found this live node: raise its access count, unless it is
    /// already at the top (then this is only a load of the line the lookup
    /// just read). A load and a store, not a read-modify-write: under the
    /// read lock only lookups write here, and they only change the count
    /// bits, so every value stored has the same index bits; racing lookups
    /// may lose each other's raise, which is harmless.
    #[inline]
    fn hit(&self) {
        let p = self.prev.load(Ordering::Relaxed);
        if p < 3 * COUNT_ONE {
            self.prev.store(p + COUNT_ONE, Ordering::Relaxed);
        }
    }
}

/// What a map with idle expiry keeps per node besides the [`Node`]: the
/// deadline the last write set, and the time of the last access (a write,
/// or a read that found the entry live). The entry is live while `now <=
/// min(write, access + idle)`, its *effective deadline*; the node's own
/// `deadline` is where its timer sits, never later than that (accesses
/// only move the effective deadline later, and eviction moves the timer).
struct Idle {
    write: u64,
    /// Raised by reads under the read lock (by a compare-and-swap that
    /// only raises it, so racing reads keep the latest: `Found::access`);
    /// set by writes under the write lock.
    access: AtomicU64,
}

impl Idle {
    fn new(write: u64, now: u64) -> Self {
        Self {
            write,
            access: AtomicU64::new(now),
        }
    }
}

/// Bits of a node index that give its place inside a chunk of [`Nodes`].
const CHUNK_BITS: u32 = 12;
/// Nodes per chunk (128 KiB of `u64 -> u64` nodes).
const CHUNK: usize = 1 << CHUNK_BITS;

/// The slab's storage: chunks of [`CHUNK`] nodes that never move once
/// allocated. The first chunk grows like a `Vec` up to `CHUNK`, so a small
/// shard stays small; every later chunk is allocated whole. Against one
/// doubling `Vec` (the earlier layout): growing never copies the slab under
/// the shard lock, and the slack is at most one partly used chunk per shard
/// instead of up to half the allocation (10^6 entries happened to fill
/// their `Vec`s; 1.1 × 10^6 took 91.5 bytes per entry).
///
/// Beside each chunk of nodes is a chunk of their keys' 32 hash bits
/// (`hashes`, same shape), kept for vacant nodes too.
struct Nodes<K, V> {
    chunks: Vec<Vec<Node<K, V>>>,
    hashes: Vec<Vec<u32>>,
    /// A map with idle expiry's write deadlines and last accesses (same
    /// shape as `hashes`); empty in every other map, which pays nothing.
    idle: Vec<Vec<Idle>>,
    /// Whether `idle` is kept.
    tracks_idle: bool,
    len: usize,
    /// Most nodes this slab will hold (a bounded shard's entry bound), so
    /// that its last chunk is allocated no larger than needed.
    limit: usize,
}

impl<K, V> Nodes<K, V> {
    fn new() -> Self {
        Self {
            chunks: Vec::new(),
            hashes: Vec::new(),
            idle: Vec::new(),
            tracks_idle: false,
            len: 0,
            limit: usize::MAX,
        }
    }

    /// The chunk that holds node `index`, and its place in the chunk.
    #[inline]
    fn split(index: usize) -> (usize, usize) {
        (index >> CHUNK_BITS, index & (CHUNK - 1))
    }

    /// The 32 hash bits stored with node `index`.
    #[inline]
    fn hash(&self, index: u32) -> u32 {
        let (chunk, at) = Self::split(index as usize);
        self.hashes[chunk][at]
    }

    #[inline]
    fn set_hash(&mut self, index: u32, h32: u32) {
        let (chunk, at) = Self::split(index as usize);
        self.hashes[chunk][at] = h32;
    }

    /// Node `index`'s idle record. Only in a shard that tracks idle time.
    #[inline]
    fn idle(&self, index: u32) -> &Idle {
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
    unsafe fn idle_unchecked(&self, index: u32) -> &Idle {
        let (chunk, at) = Self::split(index as usize);
        // SAFETY: as for `get_unchecked`: `push` fills `idle` beside
        // `chunks`, in order, whenever `tracks_idle`.
        unsafe { self.idle.get_unchecked(chunk).get_unchecked(at) }
    }

    /// Nodes ever pushed (live and vacant).
    #[inline]
    fn len(&self) -> usize {
        self.len
    }

    /// Appends a node with hash bits `h32`; its index is the old `len()`.
    fn push(&mut self, node: Node<K, V>, h32: u32, idle: Idle) {
        let chunk = self.len >> CHUNK_BITS;
        if chunk == self.chunks.len() {
            // A hint only: a chunk past `limit` grows like a `Vec` to CHUNK.
            let rest = self.limit.saturating_sub(self.len).max(1);
            let cap = if chunk == 0 { 0 } else { CHUNK.min(rest) };
            self.chunks.push(Vec::with_capacity(cap));
            self.hashes.push(Vec::with_capacity(cap));
            if self.tracks_idle {
                self.idle.push(Vec::with_capacity(cap));
            }
        }
        self.chunks[chunk].push(node);
        self.hashes[chunk].push(h32);
        if self.tracks_idle {
            self.idle[chunk].push(idle);
        }
        self.len += 1;
    }

    /// Node `index`, without bounds checks.
    ///
    /// # Safety
    ///
    /// `index < self.len()`.
    #[inline]
    unsafe fn get_unchecked(&self, index: usize) -> &Node<K, V> {
        let (chunk, at) = Self::split(index);
        // SAFETY: every index below `len` was pushed: its chunk exists and
        // holds at least `at + 1` nodes (`push` fills chunks in order).
        unsafe { self.chunks.get_unchecked(chunk).get_unchecked(at) }
    }

    /// Node `index` and its hash bits, if the slab has them.
    #[inline]
    fn get(&self, index: usize) -> Option<(&Node<K, V>, &u32)> {
        let (chunk, at) = Self::split(index);
        Some((self.chunks.get(chunk)?.get(at)?, &self.hashes[chunk][at]))
    }
}

impl<K, V> std::ops::Index<usize> for Nodes<K, V> {
    type Output = Node<K, V>;

    #[inline]
    fn index(&self, index: usize) -> &Node<K, V> {
        let (chunk, at) = Self::split(index);
        &self.chunks[chunk][at]
    }
}

impl<K, V> std::ops::IndexMut<usize> for Nodes<K, V> {
    #[inline]
    fn index_mut(&mut self, index: usize) -> &mut Node<K, V> {
        let (chunk, at) = Self::split(index);
        &mut self.chunks[chunk][at]
    }
}

/// The slab as the wheel's [`Links`] store. A node's timer tick is derived
/// from its exact deadline (`tick_for`), so it is not stored.
struct Slab<K, V> {
    nodes: Nodes<K, V>,
    /// A wheel tick lasts `2^shift` nanoseconds.
    shift: u32,
    /// Added to every tick number (see [`phase`]).
    phase: u64,
    /// The time to idle in ns, if entries have one (then `nodes` tracks
    /// idle time).
    idle: Option<u64>,
}

impl<K, V> Slab<K, V> {
    /// See [`Shard::tick_for`].
    #[inline]
    fn tick_for(&self, deadline: u64) -> u64 {
        (deadline >> self.shift) + 1 + self.phase + u64::from(deadline == u64::MAX)
    }

    /// The wheel tick that time `now` falls in; the clock's last instant,
    /// `u64::MAX`, counts as the tick after the last (see "The end of time"
    /// on [`Shard`]).
    #[inline]
    fn tick_of(&self, now: u64) -> u64 {
        (now >> self.shift) + self.phase + u64::from(now == u64::MAX)
    }

    /// Where the timer of an entry written to expire at `write` and last
    /// accessed at `access` goes: its effective deadline.
    #[inline]
    fn effective(&self, write: u64, access: u64) -> u64 {
        match self.idle {
            Some(idle) => write.min(access.saturating_add(idle)),
            None => write,
        }
    }

    /// The effective deadline of live node `index`: the node's own deadline,
    /// or with idle expiry `min(write deadline, last access + idle)`.
    #[inline]
    fn live_until(&self, index: u32) -> u64 {
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
    fn written(&mut self, index: u32, write: u64, now: Option<u64>) -> u64 {
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
    fn never(&self) -> u64 {
        self.tick_for(u64::MAX)
    }

    /// The key and value of node `index`.
    ///
    /// # Safety
    ///
    /// `index` must be live: linked in the wheel's lists, which is the case
    /// for every index stored in the table.
    #[inline]
    unsafe fn kv(&self, index: u32) -> &(K, V) {
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
    unsafe fn live(&self, index: u32) -> &Node<K, V> {
        // SAFETY: a live node was pushed and never popped (the slab only
        // grows), so `index < nodes.len()`.
        unsafe { self.nodes.get_unchecked(index as usize) }
    }

    /// Moves the key and value out of node `index`, leaving it uninitialised.
    ///
    /// # Safety
    ///
    /// `index` must be live, and the caller must make it vacant (unlink it
    /// and push it on the free stack) before anything reads its `kv` again.
    #[inline]
    unsafe fn take_kv(&mut self, index: u32) -> (K, V) {
        // SAFETY: live means initialised; the caller stops treating the node
        // as initialised, so the pair is not read or dropped twice.
        unsafe { self.nodes[index as usize].kv.assume_init_read() }
    }
}

impl<K, V> Links for Slab<K, V> {
    /// Hints the CPU to start loading node `index` and its hash bits (no-op
    /// for an index past the slab, such as `NIL`).
    #[inline]
    fn prefetch(&self, index: u32) {
        if let Some((node, hash)) = self.nodes.get(index as usize) {
            super::prefetch(node);
            super::prefetch(hash);
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
    /// Pushed out by the capacity bound, or refused by it.
    Size,
}

/// Where a shard operation puts the entries that leave it.
pub(crate) trait Sink<K, V> {
    fn push(&mut self, r: Removed<K, V>);
    fn len(&self) -> usize;
}

impl<K, V> Sink<K, V> for Vec<Removed<K, V>> {
    #[inline]
    fn push(&mut self, r: Removed<K, V>) {
        Vec::push(self, r);
    }
    #[inline]
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

/// The entries one `put` pushes out: usually none or one, kept inline, so
/// a put into a full shard does not allocate; more go to a `Vec`.
pub(crate) struct Out<K, V> {
    first: Option<Removed<K, V>>,
    rest: Vec<Removed<K, V>>,
}

impl<K, V> Out<K, V> {
    pub(crate) fn new() -> Self {
        Self {
            first: None,
            rest: Vec::new(),
        }
    }

    /// Nothing was pushed.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_none()
    }
}

impl<K, V> Sink<K, V> for Out<K, V> {
    #[inline]
    fn push(&mut self, r: Removed<K, V>) {
        if self.first.is_none() {
            self.first = Some(r);
        } else {
            self.rest.push(r);
        }
    }
    #[inline]
    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }
}

impl<K, V> IntoIterator for Out<K, V> {
    type Item = Removed<K, V>;
    type IntoIter =
        std::iter::Chain<std::option::IntoIter<Removed<K, V>>, std::vec::IntoIter<Removed<K, V>>>;
    fn into_iter(self) -> Self::IntoIter {
        self.first.into_iter().chain(self.rest)
    }
}

/// An entry that left the shard, to be published or dropped after unlock.
pub(crate) struct Removed<K, V> {
    pub(crate) key: K,
    pub(crate) value: V,
    pub(crate) deadline: u64,
    pub(crate) door: Door,
}

/// The table-probe predicate for `key`: user `Eq` on the stored key of a
/// slot whose hash bits already matched.
#[inline]
fn is_key<'a, K, V, Q>(slab: &'a Slab<K, V>, key: &'a Q) -> impl Fn(u32) -> bool + 'a
where
    K: Borrow<Q>,
    Q: Eq + ?Sized,
{
    // SAFETY: table slots hold live indices (slab invariant).
    move |index| unsafe { slab.kv(index) }.0.borrow() == key
}

/// The stored hash bits of a slab index, for the table to re-place slots.
#[inline]
fn hash_of<K, V>(slab: &Slab<K, V>) -> impl Fn(u32) -> u32 + '_ {
    |index| slab.nodes.hash(index)
}

/// The phase of shard `index` of `shards` (a power of two), in whole ticks.
///
/// Every entry is re-placed once by a cascade when time enters its level-1
/// wheel slot (64 ticks, ~34 ms at the default precision). With the same
/// wheel geometry in every shard, all shards cascade in the same eviction
/// pass: at 10^6 entries that pass took ~5.6 ms against ~1.6 ms for the
/// others, and set the lateness tail. Numbering each shard's ticks from a
/// different offset (a fraction of a level-1 slot) spreads the cascades
/// evenly over the passes. The offset is a whole number of ticks, so tick
/// boundaries, and with them eviction times, stay exactly where they were.
pub(crate) fn phase(index: usize, shards: usize) -> u64 {
    let slots = crate::timer::Lists::<{ crate::timer::DEFAULT_LEVEL_BITS }>::SLOTS;
    (index * slots / shards.max(1)) as u64 % slots as u64
}

/// The tick shift for a precision of `precision` ns: the largest `s` with
/// `2^s <= precision` (at least 1).
pub(crate) fn tick_shift(precision: u64) -> u32 {
    (63 - precision.max(2).leading_zeros()).max(1)
}

/// An entry a lookup found, live or not.
pub(crate) struct Found<'a, V> {
    pub(crate) value: &'a V,
    /// Its effective deadline: the caller compares it with the time.
    pub(crate) deadline: u64,
    /// The deadline its last write set (the same without idle expiry).
    pub(crate) write: u64,
    /// Its idle record, in a map with idle expiry.
    idle: Option<Accesses<'a>>,
}

/// A found entry's idle record, as the lookup read it.
struct Accesses<'a> {
    /// Where its last access is kept.
    at: &'a AtomicU64,
    /// The last access the lookup saw there.
    last: u64,
    /// The map's time to idle.
    idle: u64,
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

/// Result of [`Shard::put`].
pub(crate) enum PutOutcome<K, V> {
    /// A new entry; nothing left the shard.
    Inserted,
    /// An existing entry was overwritten; its old value left by `door`
    /// (`Replaced` if it was live, `Expired` if it was past its deadline).
    /// `key` is the caller's key (equal to the stored one, which stays).
    Overwrote(Removed<K, V>),
    /// The key was absent and the bound refused the new entry: it is in
    /// `out`, as `Size`.
    Refused,
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
struct Wheel<K, V> {
    slab: Slab<K, V>,
    /// Vacant node indices, reused last-in first-out.
    free: Vec<u32>,
    lists: Lists<{ crate::timer::DEFAULT_LEVEL_BITS }>,
    len: usize,
    /// The capacity policy's state, in a bounded map.
    bound: Option<Box<Bound>>,
}

impl<K, V> Wheel<K, V> {
    /// Takes a vacant node (or grows the slab), fills it and links it.
    /// Takes the key and value out of `kv` (which must hold them) into a
    /// new node. If the shard is full it panics with them still in `kv`,
    /// so the caller can drop them after releasing the lock.
    #[inline]
    /// `deadline` is the write deadline, `now` the time of the write (its
    /// first access, for idle expiry).
    fn alloc(
        &mut self,
        kv: &mut Option<(K, V)>,
        deadline: u64,
        now: u64,
        h32: u32,
        weight: u32,
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
            index
        } else {
            // < NIL, checked above.
            let index = self.slab.nodes.len() as u32;
            self.slab.nodes.push(node, h32, Idle::new(write, now));
            index
        };
        let tick = self.slab.tick_for(deadline);
        self.lists.link(&mut self.slab, index, tick);
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
    fn release(&mut self, index: u32, linked: bool) -> Entry<K, V> {
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
    fn reschedule(&mut self, index: u32, deadline: u64) {
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
    fn pop_due(&mut self) -> Option<(u32, Entry<K, V>)> {
        let index = self.lists.pop_due(&mut self.slab)?;
        Some((index, self.release(index, false)))
    }
}

impl<K, V> Drop for Wheel<K, V> {
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

/// A hash table of slab indices plus a timer wheel whose nodes are the
/// entries. See [`Wheel`] for the slab invariant.
///
/// # The end of time
///
/// An entry is live while `now <= deadline`, and its timer tick is the first
/// that starts after its deadline. The clock's range ends at `u64::MAX`, so
/// two cases get a tick of their own, keeping eviction exact there too:
///
/// * deadline `u64::MAX` (a saturated TTL) is live at every time, so it
///   never expires: its tick is one past the last that `tick_of` can reach,
///   and [`next_wakeup`](Shard::next_wakeup) does not report it;
/// * time `u64::MAX` has no tick that starts after it, so `tick_of(u64::MAX)`
///   is the tick after the last: every other deadline is below `u64::MAX`
///   and is due then.
///
/// Overflow: `shift >= 1` and `phase < 2^62`, so every tick is at most
/// `2^63 + 1 + 2^62`.
///
/// # Eviction time
///
/// [`evict`](Shard::evict) never evicts at a time below one the wheel has
/// already reached: the wheel's due list holds exactly the entries whose
/// tick it has passed, so a caller with an older reading of the clock would
/// otherwise pop entries that are live at its time. The wheel only reaches a
/// tick at a time that some caller read, so that floor is never in the
/// future.
pub(crate) struct Shard<K, V> {
    table: Table,
    wheel: Wheel<K, V>,
    /// The loads and updates in flight for keys of this shard (see
    /// `map::load`); the shard only keeps them, across `take_all` too.
    pub(crate) flights: Vec<crate::sync::Arc<super::load::Flight<K, V>>>,
    /// Which nodes were written while an optimistic reader (`retain`)
    /// watches.
    pub(crate) changes: Changes,
}

/// The nodes written since optimistic readers started watching: how
/// `retain` tells, per entry, whether the entry it showed its `f` changed
/// before it applies `f`'s verdict.
///
/// A reader registers under the shard's *read* lock ([`watch`]: a relaxed
/// increment, ordered against writers by the lock) and gets its place in
/// the log; while any reader watches, every write of a node under the write
/// lock (a put, an overwrite, a new deadline, a removal) appends the node's
/// index. Under the write lock a reader then asks whether a node was
/// written since its place ([`changed_since`]), and stops watching
/// ([`unwatch_and_trim`]; the last to stop there empties the log), or
/// stops under the read lock ([`unwatch`]) if it has nothing to ask. The
/// log grows only while someone watches. Eviction is not
/// logged: it only vacates nodes, and a vacant node reused by a put is
/// logged by the put.
///
/// [`watch`]: Changes::watch
/// [`changed_since`]: Changes::changed_since
/// [`unwatch`]: Changes::unwatch
/// [`unwatch_and_trim`]: Changes::unwatch_and_trim
pub(crate) struct Changes {
    watchers: AtomicU32,
    written: Vec<u32>,
}

impl Changes {
    fn new() -> Self {
        Self {
            watchers: AtomicU32::new(0),
            written: Vec::new(),
        }
    }

    /// Starts watching, under the read lock: the place to pass to
    /// [`changed_since`](Self::changed_since).
    pub(crate) fn watch(&self) -> usize {
        self.watchers.fetch_add(1, Ordering::Relaxed);
        self.written.len()
    }

    /// Stops watching, under the read lock.
    pub(crate) fn unwatch(&self) {
        self.watchers.fetch_sub(1, Ordering::Relaxed);
    }

    /// Stops watching, under the write lock: the last watcher to stop
    /// empties the log.
    pub(crate) fn unwatch_and_trim(&mut self) {
        let last = with_mut_u32(&mut self.watchers, |w| {
            *w -= 1;
            *w == 0
        });
        if last {
            self.written = Vec::new();
        }
    }

    /// Whether node `index` was written since `place`, under the write lock.
    pub(crate) fn changed_since(&self, place: usize, index: u32) -> bool {
        self.written[place..].contains(&index)
    }

    /// Node `index` is being written, under the write lock.
    #[inline]
    fn wrote(&mut self, index: u32) {
        if with_mut_u32(&mut self.watchers, |w| *w != 0) {
            self.written.push(index);
        }
    }
}

impl<K, V> Shard<K, V> {
    /// A shard whose ticks last `2^shift` ns (see [`tick_shift`]), numbered
    /// from `phase` (see [`phase`]).
    pub(crate) fn new(shift: u32, phase: u64, now: u64) -> Self {
        // shift >= 1 and a phase below 2^62 keep `tick_for` from overflowing
        // (see "The end of time" on `Shard`).
        assert!((1..64).contains(&shift) && phase < 1 << 62);
        let slab = Slab {
            nodes: Nodes::new(),
            shift,
            phase,
            idle: None,
        };
        Self {
            flights: Vec::new(),
            changes: Changes::new(),
            table: Table::new(),
            wheel: Wheel {
                lists: Lists::new(slab.tick_of(now)),
                slab,
                free: Vec::new(),
                len: 0,
                bound: None,
            },
        }
    }

    /// This shard, bounded to `cap` entries (or weight units, if
    /// `weighted`): see `policy`. For a new, empty shard.
    pub(crate) fn bounded(mut self, cap: u64, weighted: bool) -> Self {
        self.wheel.bound = Some(Box::new(Bound::new(cap, weighted)));
        if !weighted {
            // At most `cap` entries: a table that need not grow up to a
            // moderate share (3/4 full when the shard is), then grows as an
            // unbounded one does, so that a huge bound does not allocate up
            // front what it may never use; and a slab whose last chunk is no
            // larger than needed.
            self.table = Table::with_capacity(cap.min(PRESIZED_TABLE) as usize);
            self.wheel.slab.nodes.limit = usize::try_from(cap).unwrap_or(usize::MAX);
        }
        self
    }

    /// This shard, whose entries also expire `idle` ns after their last
    /// access. For a new, empty shard.
    pub(crate) fn idle(mut self, idle: u64) -> Self {
        self.wheel.slab.idle = Some(idle);
        self.wheel.slab.nodes.tracks_idle = true;
        self
    }

    /// This shard's bound and whether it is weighted, to make another like
    /// it.
    fn bound_config(&self) -> Option<(u64, bool)> {
        self.wheel
            .bound
            .as_ref()
            .map(|b| (b.cap, b.weights.is_some()))
    }

    /// What the shard holds against its bound (its weight, or its entry
    /// count), and the bound; `None` if unbounded.
    #[cfg(test)]
    pub(crate) fn usage(&self) -> Option<(u64, u64)> {
        self.wheel.bound.as_ref().map(|b| (b.used, b.cap))
    }

    /// When an entry with `deadline` becomes evictable (clock ns): the start
    /// of its timer tick, the first that starts strictly after the deadline.
    /// `None` for a deadline that never expires.
    #[inline]
    pub(crate) fn evictable_at(&self, deadline: u64) -> Option<u64> {
        (deadline != u64::MAX).then(|| self.time_of(self.tick_for(deadline)))
    }

    /// The wheel tick at which an entry with `deadline` becomes evictable:
    /// the first tick starting strictly after the deadline.
    #[inline]
    pub(crate) fn tick_for(&self, deadline: u64) -> u64 {
        self.wheel.slab.tick_for(deadline)
    }

    /// Clock time (ns) at which the wheel reaches `tick`.
    #[inline]
    pub(crate) fn time_of(&self, tick: u64) -> u64 {
        let Slab { shift, phase, .. } = self.wheel.slab;
        let tick = tick.saturating_sub(phase);
        tick.checked_shl(shift)
            .filter(|t| t >> shift == tick)
            .unwrap_or(u64::MAX)
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.wheel.len
    }

    /// Starts a lookup of `hash`: hints the CPU to load its table slot, and
    /// returns where [`get_from`](Self::get_from) continues (a write, which
    /// may grow the table, only wants the hint).
    #[inline]
    pub(crate) fn start(&self, hash: u64) -> Home {
        self.table.start(hash as u32)
    }

    /// The value and exact deadline of the entry for `key`, live or not:
    /// the caller compares the deadline with the time.
    #[cfg(test)]
    pub(crate) fn get<Q>(&self, hash: u64, key: &Q) -> Option<(&V, u64)>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.get_from(self.start(hash), hash, key)
            .map(|f| (f.value, f.deadline))
    }

    /// [`get`](Self::get) from `home`, which [`start`](Self::start) gave
    /// for `hash` under the same lock. Always inlined: every read's hot path.
    #[inline(always)]
    pub(crate) fn get_from<Q>(&self, home: Home, hash: u64, key: &Q) -> Option<Found<'_, V>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let slab = &self.wheel.slab;
        let index = self.table.find_from(home, hash as u32, is_key(slab, key))?;
        // SAFETY: the table holds only live indices (slab invariant).
        let node = unsafe { slab.live(index) };
        if self.wheel.bound.is_some() {
            node.hit();
        }
        // SAFETY: as above; a live node's `kv` is initialised.
        let value = &unsafe { node.kv.assume_init_ref() }.1;
        if slab.nodes.tracks_idle {
            return Some(self.found_idle(index, value));
        }
        Some(Found {
            value,
            deadline: node.deadline,
            write: node.deadline,
            idle: None,
        })
    }

    /// [`get_from`](Self::get_from) in a shard without idle expiry, where
    /// an entry's deadline is its node's: the value and that deadline.
    /// Only the shape of the result differs, so that the hottest read keeps
    /// it small; in a shard with idle expiry it is wrong (not unsafe).
    #[inline(always)]
    pub(crate) fn get_plain<Q>(&self, home: Home, hash: u64, key: &Q) -> Option<(&V, u64)>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        debug_assert!(!self.wheel.slab.nodes.tracks_idle);
        let slab = &self.wheel.slab;
        let index = self.table.find_from(home, hash as u32, is_key(slab, key))?;
        // SAFETY: the table holds only live indices (slab invariant).
        let node = unsafe { slab.live(index) };
        if self.wheel.bound.is_some() {
            node.hit();
        }
        // SAFETY: as above; a live node's `kv` is initialised.
        Some((&unsafe { node.kv.assume_init_ref() }.1, node.deadline))
    }

    /// The part of [`get_from`](Self::get_from) only a map with idle expiry
    /// runs: its read of the node's idle record.
    #[inline]
    fn found_idle<'a>(&'a self, index: u32, value: &'a V) -> Found<'a, V> {
        let slab = &self.wheel.slab;
        // SAFETY: `index` came from the table, so it is live (slab
        // invariant) and below `nodes.len()`; a shard that tracks idle time
        // pushes an idle record with every node.
        let idle = unsafe { slab.nodes.idle_unchecked(index) };
        let d = slab.idle.unwrap_or(u64::MAX);
        let last = idle.access.load(Ordering::Relaxed);
        Found {
            value,
            deadline: idle.write.min(last.saturating_add(d)),
            write: idle.write,
            idle: Some(Accesses {
                at: &idle.access,
                last,
                idle: d,
            }),
        }
    }

    /// Inserts or overwrites with the key and value in `kv` (which must
    /// hold them). `deadline > now` is the caller's duty.
    ///
    /// They stay in `kv` until the probe (which runs the user's `Eq`) is
    /// over and the shard is known to have room: if either panics, the
    /// caller still owns them and drops them after releasing the lock, so
    /// no user `Drop` runs under it.
    ///
    /// An unbounded shard's; see [`put_bounded`](Self::put_bounded).
    #[inline]
    pub(crate) fn put(
        &mut self,
        hash: u64,
        kv: &mut Option<(K, V)>,
        deadline: u64,
        now: u64,
    ) -> PutOutcome<K, V>
    where
        K: Eq,
    {
        debug_assert!(self.wheel.bound.is_none());
        let slab = &self.wheel.slab;
        let h32 = hash as u32;
        // The index `alloc` would use; past `MAX_NODES - 1` it panics itself.
        let max_index = slab.nodes.len().min(MAX_NODES - 1) as u32;
        let key = &kv.as_ref().expect("put without a key and value").0;
        match self
            .table
            .probe(h32, is_key(slab, key), max_index, hash_of(slab))
        {
            Probe::Found(index) => PutOutcome::Overwrote(self.overwrite(index, kv, deadline, now)),
            Probe::Vacant(at) => {
                let index = self.wheel.alloc(kv, deadline, now, h32, 1);
                self.table.fill(at, h32, index);
                self.changes.wrote(index);
                PutOutcome::Inserted
            }
        }
    }

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
        let slab = &self.wheel.slab;
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
                if self.wheel.bound.is_some() {
                    self.reweigh(index, weight, now, out);
                }
                PutOutcome::Overwrote(old)
            }
            Probe::Vacant(mut at) => {
                if let Some(b) = &mut self.wheel.bound {
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
                let index = self.wheel.alloc(kv, deadline, now, h32, weight);
                self.table.fill(at, h32, index);
                self.changes.wrote(index);
                PutOutcome::Inserted
            }
        }
    }

    /// Puts the value in `kv` into live node `index` with a new deadline;
    /// returns the old value, `Replaced` if it was live at `now`, else
    /// `Expired`. `key` is the caller's (equal to the stored one, which
    /// stays).
    fn overwrite(
        &mut self,
        index: u32,
        kv: &mut Option<(K, V)>,
        deadline: u64,
        now: u64,
    ) -> Removed<K, V> {
        self.changes.wrote(index);
        let old_deadline = self.wheel.slab.live_until(index);
        let sched = self.wheel.slab.written(index, deadline, Some(now));
        let node = &mut self.wheel.slab.nodes[index as usize];
        let door = if now <= old_deadline {
            Door::Replaced
        } else {
            Door::Expired
        };
        // SAFETY: the index came from the table, so the node is live and
        // its `kv` initialised.
        let pair = unsafe { node.kv.assume_init_mut() };
        let (key, value) = kv.take().expect("put without a key and value");
        let old_value = std::mem::replace(&mut pair.1, value);
        self.wheel.reschedule(index, sched);
        Removed {
            key,
            value: old_value,
            deadline: old_deadline,
            door,
        }
    }

    /// After an overwrite of live node `index` in a bounded shard: counts
    /// the access, records the new `weight`, and if the shard is now over
    /// its bound makes room by pushing out *other* entries (only a weight
    /// that grew can do that), or, if the entry alone is over the bound,
    /// pushes out the entry itself (its new value, as `Size`).
    fn reweigh(&mut self, index: u32, weight: u32, now: u64, out: &mut impl Sink<K, V>) {
        let Some(b) = &mut self.wheel.bound else {
            return;
        };
        with_mut_u32(&mut self.wheel.slab.nodes[index as usize].prev, |p| {
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
            s.wheel
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
            let w = &self.wheel;
            let mut nodes = [0u32; NEXT_TICK_SEARCH];
            let n = w
                .lists
                .list_nodes(&w.slab, w.slab.tick_of(now) + 1, &mut nodes);
            for &i in &nodes[..n] {
                if fits(self) {
                    break;
                }
                if now > self.wheel.slab.live_until(i) && Some(i) != skip {
                    out.push(self.take_index(i, Door::Expired));
                }
            }
        }
        let mut admitted = candidate.is_none();
        // Each step passes over a vacant node, takes a count off a live one
        // (at most 3 each), or evicts one: 4 sweeps always reach a victim.
        let mut steps = 4 * self.wheel.slab.nodes.len() as u64 + 4;
        while !fits(self) && steps > 0 {
            steps -= 1;
            let n = self.wheel.slab.nodes.len() as u32;
            if n == 0 {
                break; // nothing held: `fits` holds for any `need` admitted
            }
            let b = self.wheel.bound.as_mut().expect("bounded");
            let i = b.hand % n;
            b.hand = (i + 1) % n;
            if Some(i) == skip {
                continue;
            }
            let deadline = self.wheel.slab.live_until(i);
            let node = &mut self.wheel.slab.nodes[i as usize];
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
            let h = self.wheel.slab.nodes.hash(i);
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

    /// Takes live node `index` out of the table and the wheel.
    fn take_index(&mut self, index: u32, door: Door) -> Removed<K, V> {
        let h32 = self.wheel.slab.nodes.hash(index);
        let found = self
            .table
            .remove(h32, |i| i == index, hash_of(&self.wheel.slab));
        debug_assert_eq!(found, Some(index), "live entry missing from the table");
        let e = self.wheel.release(index, true);
        Removed {
            key: e.key,
            value: e.value,
            deadline: e.deadline,
            door,
        }
    }

    /// [`put`](Self::put) with the key and value passed by value. Test-only.
    #[cfg(test)]
    pub(crate) fn put_owned(
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
        let mut out = Vec::new();
        let r = self.put_bounded(hash, &mut Some((key, value)), deadline, now, 1, &mut out);
        assert!(out.is_empty(), "put_owned on a full bounded shard");
        r
    }

    /// Removes `key` if held. The door is `Removed` if it was live at `now`,
    /// `Expired` otherwise.
    pub(crate) fn remove<Q>(&mut self, hash: u64, key: &Q, now: u64) -> Option<Removed<K, V>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let slab = &self.wheel.slab;
        let index = self
            .table
            .remove(hash as u32, is_key(slab, key), hash_of(slab))?;
        self.changes.wrote(index);
        let e = self.wheel.release(index, true);
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

    /// Sets a new deadline for a live entry; returns where its timer went
    /// (with idle expiry it may be earlier), or `None` if the entry is
    /// absent or expired.
    ///
    /// With `cond`, only if the new deadline is later (`Later`) or earlier
    /// (`Earlier`) than the entry's effective deadline.
    pub(crate) fn touch<Q>(
        &mut self,
        hash: u64,
        key: &Q,
        deadline: u64,
        now: u64,
        cond: super::ExpireIf,
    ) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        use super::ExpireIf;
        let slab = &self.wheel.slab;
        let index = self.table.find(hash as u32, is_key(slab, key))?;
        let old = slab.live_until(index);
        let holds = match cond {
            ExpireIf::Always => true,
            ExpireIf::Later => deadline > old,
            ExpireIf::Earlier => deadline < old,
        };
        if now > old || !holds {
            return None;
        }
        self.changes.wrote(index);
        let sched = self.wheel.slab.written(index, deadline, None);
        self.wheel.reschedule(index, sched);
        Some(sched)
    }

    /// The value of the live entry for `key` at `now`, if any.
    pub(crate) fn live_value<Q>(&self, hash: u64, key: &Q, now: u64) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let found = self.get_from(self.start(hash), hash, key)?;
        (now <= found.deadline).then_some(found.value)
    }

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
        let now = now.max(self.time_of(self.wheel.lists.now()));
        let wheel = &mut self.wheel;
        // tick_of(now) >= the wheel's tick, since the wheel's tick starts at
        // or before `now`: `move_to` goes forward or stays.
        let now_tick = wheel.slab.tick_of(now);
        wheel.lists.move_to(&mut wheel.slab, now_tick);
        for _ in 0..limit {
            let Some(index) = wheel.lists.first_due() else {
                return (false, now);
            };
            if wheel.slab.idle.is_some() {
                // Read since its timer was set: its effective deadline moved
                // on. Its timer goes there, to a tick after `now_tick`.
                let until = wheel.slab.live_until(index);
                let tick = wheel.slab.tick_for(until);
                if tick > now_tick {
                    let popped = wheel.lists.pop_due(&mut wheel.slab);
                    debug_assert_eq!(popped, Some(index));
                    wheel.slab.nodes[index as usize].deadline = until;
                    wheel.lists.link(&mut wheel.slab, index, tick);
                    continue;
                }
            }
            // Out of the table first, while the node is still live: a panic
            // anywhere below leaves no table slot pointing at a vacant node.
            let h32 = wheel.slab.nodes.hash(index);
            let found = self.table.remove(h32, |i| i == index, hash_of(&wheel.slab));
            debug_assert_eq!(found, Some(index), "due entry missing from the table");
            let popped = wheel.lists.pop_due(&mut wheel.slab);
            debug_assert_eq!(popped, Some(index));
            let e = wheel.release(index, false);
            // The due list is a linked list, so its nodes arrive one cache
            // miss after another. Start loading the node (and hash bits) of
            // the one after next now, and the table slot of the next one,
            // whose hash bits the previous round started loading: all three
            // overlap with this entry's table probe.
            if let Some(next) = wheel.lists.first_due() {
                wheel.slab.prefetch(wheel.slab.links(next).1);
                self.table.prefetch(wheel.slab.nodes.hash(next));
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
        (wheel.lists.first_due().is_some(), now)
    }

    /// When the wheel next has work, in clock nanoseconds: `None` if it
    /// holds nothing that will ever be due (see "The end of time").
    pub(crate) fn next_wakeup(&self) -> Option<u64> {
        let tick = self.wheel.lists.next_wakeup()?;
        (tick < self.wheel.slab.never()).then(|| self.time_of(tick))
    }

    /// Takes every entry out, leaving the shard empty, in O(1) under the lock
    /// (the caller drains the returned shard after unlocking).
    pub(crate) fn take_all(&mut self, now: u64) -> Shard<K, V> {
        let Slab {
            shift, phase, idle, ..
        } = self.wheel.slab;
        let mut fresh = Shard::new(shift, phase, now);
        if let Some((cap, weighted)) = self.bound_config() {
            fresh = fresh.bounded(cap, weighted);
        }
        if let Some(idle) = idle {
            fresh = fresh.idle(idle);
        }
        // Flights and watchers concern keys, not entries: they stay.
        fresh.flights = std::mem::take(&mut self.flights);
        std::mem::swap(&mut fresh.changes, &mut self.changes);
        std::mem::replace(self, fresh)
    }

    /// Drains every entry (for `clear` and shutdown), without the lock. If
    /// `f` panics, dropping the shard drops the entries not yet drained.
    pub(crate) fn drain(mut self, mut f: impl FnMut(Entry<K, V>)) {
        self.table = Table::new();
        self.wheel.lists.all_due(&mut self.wheel.slab);
        while let Some((_, e)) = self.wheel.pop_due() {
            f(e);
        }
    }

    /// Test-only consistency check between table and wheel, and of the slab
    /// invariant.
    #[cfg(test)]
    pub(crate) fn validate(&self) {
        let w = &self.wheel;
        let n = w.slab.nodes.len();
        let mut live = vec![false; n];
        let mut count = 0;
        w.lists.validate(&w.slab, |i| {
            assert!(!live[i as usize], "node {i} linked twice");
            live[i as usize] = true;
            count += 1;
        });
        assert_eq!(count, w.len, "len mismatch");
        assert_eq!(self.table.len(), w.len, "table and wheel sizes differ");
        self.table.validate(hash_of(&w.slab));
        let mut free = vec![false; n];
        for &f in &w.free {
            assert!(!live[f as usize], "free stack holds live node {f}");
            assert!(!free[f as usize], "free stack holds {f} twice");
            free[f as usize] = true;
        }
        assert_eq!(w.free.len() + w.len, n, "nodes neither live nor free");
        for index in self.table.iter() {
            assert!(live[index as usize], "table points at vacant {index}");
        }
        for (i, &l) in live.iter().enumerate() {
            let vacant = w.slab.nodes[i].prev.load(Ordering::Relaxed) == VACANT;
            assert_eq!(vacant, !l, "node {i}: marked vacant {vacant}, live {l}");
            // A timer is never later than its entry's effective deadline.
            let timer = w.slab.nodes[i].deadline;
            assert!(
                !l || timer <= w.slab.live_until(i as u32),
                "node {i}: timer at {timer} after its effective deadline"
            );
        }
        if let Some(b) = &w.bound {
            let weights: u64 = (0..n as u32)
                .filter(|&i| live[i as usize])
                .map(|i| b.weight(i))
                .sum();
            assert_eq!(b.used, weights, "bound's usage is not the live weights");
            assert!(b.used <= b.cap, "over the bound: {} > {}", b.used, b.cap);
        }
    }
}

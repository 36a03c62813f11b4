//! The storage floor: one shard's entries and how they are found.
//!
//! * `shard`: [`Shard`](shard::Shard), the table glue and the operations
//!   under a shard's lock (lookups, puts, removal, eviction, draining), with
//!   its rooms: the slab and its invariant, idle records, the bound's hooks,
//!   what leaves by which door, the locked spans of iteration;
//! * `table`: the hash table of 4-byte slots of slab indices.
//!
//! Plain `&mut self` code: the map wraps each shard in its own lock, and
//! nothing here takes a lock, starts a thread, publishes an event or drops
//! a value that leaves (it leaves by value, for the map to drop or publish
//! unlocked). The only user code under a lock is `Eq` in lookups and the
//! clones the map asks for.
//!
//! May call: `crate::map::policy` (the bound's budget and each shard's
//! policy), `crate::timer::Lists`, `crate::sync` and `crate::unwind`. A
//! shard keeps its keys' flights (`crate::map::load::flight::Flight`) and
//! calls none of their code; nothing here calls the map's other floors.

pub(super) mod shard;
pub(super) mod table;

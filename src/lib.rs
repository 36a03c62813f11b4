//! A concurrent expiring key-value map.
//!
//! [`ExpireMap<K, V>`](ExpireMap) offers `put`, `get` and `remove` with a
//! time to live per entry. Expired entries never show through a read, a
//! background thread evicts them within a few milliseconds of their deadline
//! even when nobody touches the map, and any number of [`Subscriber`]s receive
//! the eviction events. It is built from two parts that are public and usable
//! on their own:
//!
//! * [`timer`]: the XOR-order hierarchical timeout index (hitime's
//!   `msb(deadline ^ now)` bins, generalised to `R` bits per level), with O(1)
//!   insert and cancel and bulk expiry;
//! * [`broadcast`]: a lock-free ring that broadcasts messages to many
//!   readers, each with a cache-padded generation counter, with exact lag
//!   reporting.
//!
//! # Quick start
//!
//! ```
//! use expiremap::{Cause, ExpireMap};
//! use std::time::Duration;
//!
//! let map: ExpireMap<String, u32> = ExpireMap::new();
//! let mut events = map.subscribe()?;
//!
//! map.put("a".to_string(), 1, Duration::from_millis(5));
//! assert_eq!(map.get("a"), Some(1));
//!
//! // The eviction thread publishes the expiry on its own.
//! let e = events.recv()?;
//! assert_eq!((e.key.as_str(), e.value, e.cause), ("a", 1, Cause::Expired));
//! assert_eq!(map.get("a"), None);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Expiration semantics
//!
//! * An entry put at time `t` with TTL `d` has deadline `t + d` and is visible
//!   while `now <= deadline` (inclusive). Reads (`get`, `get_many`,
//!   `get_with_ttl`, `ttl`, `contains_key`) compare the exact deadline: an entry past it is invisible
//!   even before it is evicted. Only [`len`](ExpireMap::len) counts such
//!   entries.
//! * `put` overwrites value and deadline and returns the previous *live*
//!   value. A zero TTL is ignored (nothing changes, `None`). A TTL too large to
//!   represent saturates to the largest deadline (about 584 years).
//! * Every value leaves by exactly one door: returned by `remove` or `put`,
//!   published as [`Cause::Expired`], published as [`Cause::Shutdown`] when the
//!   map is dropped, or still present. A value found past its deadline by
//!   `remove`, `clear` or an overwriting `put` leaves as `Expired`. A `remove`
//!   racing the eviction of the same entry: exactly one of them gets it.
//!   With [`Builder::publish_removals`] a returned value is also published
//!   (a clone, as `Removed` or `Replaced`): the caller gets the value and
//!   subscribers get its event, still one door, which the event names.
//!
//! ```
//! use expiremap::{ExpireMap, ManualClock};
//! use std::time::Duration;
//!
//! let clock = ManualClock::new();
//! let map = ExpireMap::<u32, u32>::builder()
//!     .clock(clock.clone())
//!     .background_eviction(false)
//!     .build();
//! map.put(1, 10, Duration::from_millis(10));
//! clock.advance(Duration::from_millis(10));
//! assert_eq!(map.get(&1), Some(10)); // at the deadline: still visible
//! clock.advance(Duration::from_nanos(1));
//! assert_eq!(map.get(&1), None); // past it: gone for every read
//! assert_eq!(map.len(), 1); // but held until evicted
//! clock.advance(Duration::from_millis(1));
//! assert_eq!(map.evict_expired(), 1);
//! assert!(map.is_empty());
//! ```
//!
//! # The eviction thread
//!
//! Each map (unless built with `background_eviction(false)`) owns one thread.
//! It sleeps until the earliest deadline, but at least the eviction interval
//! (4 ms) between passes; a `put` or `touch` with an earlier deadline wakes it.
//! An empty map costs no wake-ups at all. Each pass evicts in bounded batches,
//! releasing the shard lock between them. With the thread running and not
//! starved, an entry is evicted no later than deadline + interval + precision
//! (1 ms).
//!
//! When the thread falls behind that promise (starved of CPU by request
//! threads, or outpaced by many writers), the writers share its work: a
//! write (`put`, `remove`, `expire`, a conditional put, a load's store) to a
//! shard that no eviction has drained for one interval plus one precision
//! takes up to 8 of its due entries under the lock it already holds, and
//! publishes them as `Expired` after the unlock. So memory stays bounded by
//! the TTLs whether or not the thread gets CPU; the rule is the thread's
//! (never before the entry's timer tick), and
//! [`Stats::evicted_by_writers`] counts them. While the thread keeps up a
//! write only compares the time with the shard's mark.
//!
//! [`ExpireMap`] is a cheap handle (`Clone`); dropping the last
//! handle stops the thread and joins it, except when the drop runs on that
//! thread itself (a value's `Drop` owning the last handle).
//!
//! With a [`ManualClock`], [`ManualClock::advance`] wakes the thread, so
//! background eviction follows virtual time; [`ExpireMap::evict_expired`] and
//! [`ExpireMap::next_expiry`] drive a map without a thread.
//!
//! # The map's own expiry
//!
//! Calls that name no TTL ([`insert`](ExpireMap::insert),
//! [`try_insert`](ExpireMap::try_insert), and moka's loaders
//! [`get_with`](ExpireMap::get_with), [`try_get_with`](ExpireMap::try_get_with),
//! [`optionally_get_with`](ExpireMap::optionally_get_with) and their forms)
//! use the map's: an [`Expiry`] policy's TTL from the key and value
//! ([`Builder::expire_after`]), else [`Builder::time_to_live`], else none.
//! The policy runs outside every lock. A zero from it stores nothing and
//! expires a live entry of the key; a zero `ttl` given to `put` is ignored.
//!
//! With [`Builder::refresh_after`], a loader call that finds a value
//! written more than `d` ago returns it and reloads the key (one reload per
//! key at a time, in that call or on a [`Builder::refresh_spawner`]), so a
//! key read through a loader is reloaded before it expires instead of
//! missing at its deadline.
//!
//! # Events and lag
//!
//! By default only evictions are published (`Expired`, `Shutdown`);
//! [`Builder::publish_removals`] adds `Removed` and `Replaced`. An event is
//! published by the operation that removed the value, so one thread's events
//! appear in its operation order. Events go through a ring of
//! `event_capacity` slots (1024 by default, allocated on the first
//! `subscribe`): writers never wait for slow readers, and a subscriber that
//! fell more than the capacity behind gets [`RecvError::Lagged`] with the exact
//! number it missed, then continues from the oldest event still held. An
//! event's value is dropped as soon as every subscriber has received it (or
//! lost it to a lag, or gone away), by the receive that was last; one that
//! no subscriber took stays until the ring wraps on it. After the map is
//! dropped, subscribers drain what is left and see [`RecvError::Closed`].
//!
//! [`Subscriber::recv_async`] waits for the next event without blocking a
//! thread, on any executor: the task's waker is registered in the ring and
//! the next publish wakes it (the library has no runtime). With the cargo
//! feature `stream`, a `Subscriber` is also a `futures_core::Stream` of
//! `Result<Event, Lagged>` that ends at `Closed`.
//!
//! ```
//! use expiremap::{ExpireMap, ManualClock, TryRecvError};
//! use std::time::Duration;
//!
//! let clock = ManualClock::new();
//! let map = ExpireMap::<u32, u32>::builder()
//!     .clock(clock.clone())
//!     .background_eviction(false)
//!     .event_capacity(4)
//!     .build();
//! let mut slow = map.subscribe()?;
//! for i in 0..10 {
//!     map.put(i, i, Duration::from_millis(1));
//! }
//! clock.advance(Duration::from_millis(3));
//! assert_eq!(map.evict_expired(), 10);
//! let mut seen = 0;
//! let mut lost = 0;
//! loop {
//!     match slow.try_recv() {
//!         Ok(_) => seen += 1,
//!         Err(TryRecvError::Lagged(n)) => lost += n,
//!         Err(_) => break,
//!     }
//! }
//! assert_eq!(seen + lost, 10); // nothing is lost silently
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Capacity
//!
//! By default a map holds whatever is put until it expires.
//! [`Builder::max_entries`] bounds the number of entries, and
//! [`Builder::max_weight`] with [`Builder::weigher`] their total weight.
//! When a put needs room, **expired entries go first**; after them a policy
//! chooses, with the hit ratio of the best peers (measured against moka and
//! quick_cache in `cargo bench --bench hit_ratio`, BENCHMARKS.md):
//!
//! * eviction by CLOCK: each entry has a 2-bit access count that a hit
//!   raises with one relaxed store to the node the lookup already read
//!   (under the read lock, never the write lock), and the hand passes over
//!   recently read entries;
//! * admission by TinyLFU (as in Caffeine and moka): a count-min sketch
//!   remembers how often keys were asked for, held or not, and a new key
//!   displaces the CLOCK victim only if it was asked for more often before
//!   the put in hand. A scan of one-off keys does not flush the cache, and
//!   a loop over more keys than fit keeps a fixed part of them.
//!
//! Every value pushed out, and every new value refused, leaves as
//! [`Cause::Size`], published by default; conservation holds as for every
//! other door. The bound holds for the map as a whole, not per shard: a
//! new entry (or the weight an overwrite adds) is reserved in one
//! map-wide budget before it is stored, so the entries held never exceed
//! the bound at any moment, and a new key is stored whenever the map holds
//! less than the bound (`n` entries are held once `n` distinct keys were
//! put, however they hash). When the budget is spent, a put makes room in
//! its own shard first, and takes it from the other shards, one lock at a
//! time, when its own has nothing to give. An overwrite pushes out other
//! entries only if its weight grew; an entry heavier than the whole bound
//! is refused. [`ExpireMap::weighted_size`] is what the entries held
//! weigh.
//!
//! ```
//! use expiremap::{Cause, ExpireMap};
//! use std::time::Duration;
//!
//! let map = ExpireMap::<u32, u32>::builder().shards(1).max_entries(2).build();
//! let mut events = map.subscribe()?;
//! let hour = Duration::from_secs(3600);
//! map.put(1, 1, hour);
//! map.put(2, 2, hour);
//! assert_eq!(map.get(&1), Some(1)); // key 1 was read
//! map.put(3, 3, hour); // never asked for before: refused
//! assert_eq!(map.len(), 2);
//! let e = events.try_recv()?;
//! assert_eq!((e.key, e.cause), (3, Cause::Size));
//! map.put(3, 3, hour); // asked for once before, as key 2 was: refused
//! assert_eq!(events.try_recv()?.key, 3);
//! map.put(3, 3, hour); // asked for twice before: displaces key 2
//! assert_eq!((map.get(&2), map.get(&3)), (None, Some(3)));
//! assert_eq!(events.try_recv()?.key, 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Memory per entry
//!
//! An entry lives in one slab node of its shard, which is also its timer
//! wheel node: key, value, exact deadline and two `u32` links, nothing else.
//! Beside each node the slab keeps the key's 32 hash bits (in a parallel
//! array, so a read touches only the node). Nodes live in chunks of 1,024
//! that never move, so the slab's slack is at most one partly used chunk per
//! shard. The hash table (linear probing, between 1/2 and 3/4 full: it grows
//! by 3/2 and 4/3 in turn) stores 4 bytes per slot: the node's index and,
//! in the bits the index does not need, a tag of the hash. Growing it reads
//! the slab's hash bits, never a key:
//!
//! ```text
//! node  = size_of::<(K, V)>() + 16 bytes, rounded up to K's and V's alignment
//!         (deadline 8, prev 4, next 4), plus 4 bytes of hash beside it
//! table = 4 bytes per slot, 1.33 to 2 slots per entry (and, in a shard
//!         whose table grows past 2^17 slots, the old slots beside the
//!         new for the next 1/32 of their count in puts)
//! bytes/entry ~= node + 4 + 5.3..8 (+ 4 per freed node)
//!                + shards * 1024 * (node + 4) / entries (the last chunks' slack)
//! ```
//!
//! For `u64 -> u64` a node is 32 bytes. Measured for `ExpireMap<u64, u64>`
//! (counting allocator, `cargo run --release --example memory -- N`):
//! **42.9 bytes per entry** at 10^6 entries in 8 shards, 41.8–44.7 from
//! 6 × 10^5 to 2 × 10^6 (a `RwLock<HashMap<u64, u64>>` takes 35.7 at
//! 10^6), 55.1 at 10^5 (the last chunks weigh more); 44.2 at 10^6 in the
//! 128 shards that are the default on 2 cores.
//! `tests/memory.rs` checks the formula's bound. The
//! event ring costs nothing until the first `subscribe`.
//!
//! A map with [`Builder::max_entries`] sizes each shard's table for its
//! share of the bound up front (with a little room for a shard holding
//! more than its share), up to 2^18 entries a shard (5.3 bytes per entry
//! when full; a larger share grows the table), sizes its slab's last chunk
//! to about the share, and adds the admission sketch (12 four-bit
//! counters, 6 bytes, per entry of the bound, grown as the shard fills, so
//! that a huge bound costs what the map holds): **47.8 bytes per entry**
//! at 10^6, everything counted
//! (`cargo run --release --example memory -- 1000000 bounded`). A weighted
//! map adds 8 bytes per entry for the weights.
//!
//! # Monitoring
//!
//! [`ExpireMap::stats`] is always there. Two cargo features, both off by
//! default, feed a service's dashboards and traces:
//!
//! **`metrics`**: `Builder::metrics(name)` (which, like
//! `ExpireMap::publish_metrics`, exists only with the feature) publishes
//! the map's counters through the [`metrics`](https://docs.rs/metrics)
//! facade (so any exporter works), labelled `cache="name"`. The names
//! follow Micrometer's cache binder as its Prometheus registry renders
//! them, so dashboards built for Caffeine read them unchanged; the last
//! five are expiremap's own:
//!
//! | series | kind | what |
//! | --- | --- | --- |
//! | `cache_gets_total{result="hit"\|"miss"}` | counter | reads that found a live value, and those that did not ([`Stats::hits`], [`Stats::misses`]) |
//! | `cache_puts_total` | counter | loads that stored their value: a loader, reload or bulk loader that returned, once per run. Micrometer's Caffeine binder gives the name this meaning (Caffeine counts no puts); a plain `put` is not counted, so the put path runs exactly what it runs without the feature |
//! | `cache_evictions_total{cause="expired"\|"size"\|"removed"}` | counter | values evicted for their deadline ([`Stats::evicted`]), pushed out or refused by the bound ([`Stats::size_evicted`]), removed by `remove`, `clear`, `retain` or an `update` |
//! | `cache_size` | gauge | [`len`](ExpireMap::len) |
//! | `cache_load_duration_seconds{result="success"\|"failure"}` | summary (`_sum`, `_count`; a histogram if the exporter is set so) | how long each loader ran (loads, reloads, bulk loads); `failure`: it returned an error or `None`, panicked, or its future was dropped |
//! | `cache_weighted_size` | gauge | [`weighted_size`](ExpireMap::weighted_size) |
//! | `cache_eviction_lateness_max_seconds` | gauge | [`Stats::max_lateness`] |
//! | `cache_reloads_total` | counter | refresh-ahead reloads started ([`Stats::refreshes`]) |
//! | `cache_reload_failures_total` | counter | reloads that failed ([`Stats::refresh_failures`]) |
//! | `cache_events_lost_total` | counter | events subscribers lost by falling a ring behind ([`Stats::events_lost`]) |
//!
//! The hit ratio over five minutes, in PromQL:
//!
//! ```text
//! sum(rate(cache_gets_total{result="hit",cache="users"}[5m]))
//!   / sum(rate(cache_gets_total{cache="users"}[5m]))
//! ```
//!
//! Nothing is published from `get` or `put`: the series come from counts
//! the map keeps anyway (a name turns on
//! [`record_stats`](Builder::record_stats) for the hits and misses; loads
//! that stored their value are counted where the load ends), published
//! by the eviction thread at least once a second, by the last handle's
//! drop, and by `ExpireMap::publish_metrics` (for a scrape that must be
//! current, or a map without the thread). Counters are published as the
//! running totals (`absolute`), so a publication missed costs nothing.
//! Loads are the exception: a loader's duration is recorded when it
//! returns (two clock reads around it, only in a map with a name). No lock
//! of the map is held while the recorder runs. `examples/metrics.rs`
//! prints a Prometheus scrape
//! (`cargo run --release --features metrics --example metrics`).
//!
//! **`tracing`**: a `debug` span `expiremap.load` around each run of a
//! loader (`kind` = `load`, `reload` or `bulk`, `key_hash` or `keys`,
//! `outcome`, `duration_us`), and a `warn` event inside it when the
//! loader fails. Nothing on the hit paths.
//!
//! # User code and locks
//!
//! Keys are hashed before any lock is taken. While a shard lock is held the
//! only user code that runs is `Eq` (inside a lookup, and to find a key's
//! load or update in flight), `V::clone` (in `get`, `get_many`,
//! `get_with_ttl`, `update`'s read, a loading call's second look (bulk
//! loads' too), `iter`, `retain`, and
//! `put_if_absent` when the key is live), `K::clone` (in `iter`, `keys`
//! and `retain`) and a
//! user [`Clock`]'s `now` (the time is read
//! after the lock is taken, so that "expired or not" is decided at the
//! instant the operation acts): they must not call back into the same map. Values
//! that leave the map are dropped, and events published, after the lock is
//! released; subscribers run on their own threads and may call back into the
//! map, subscribe, or drop it. One case can still wait on itself: a
//! subscriber copies each event with `K::clone` and `V::clone`, so those must
//! not publish to the same map (an operation that publishes, from inside
//! `clone`, may wait for the copy in progress when the ring is full).
//!
//! # Panics
//!
//! The map's operations do not panic on any input. A panic in user `Hash`,
//! `Eq` or `Clone` propagates to the caller and leaves the shard consistent
//! (parking_lot locks do not poison); if `Eq` panics inside `put`, the key
//! and value being put are dropped after the shard lock is released, and if
//! `V::clone` panics in `iter` or `retain`, the key already cloned is
//! dropped after the lock too.
//!
//! A panicking `Drop` of a key or value never costs another value its door:
//! every value still leaves by exactly one door. Where the map drops values
//! or old events in bulk (`evict_expired`, `clear`, dropping the map, the
//! eviction thread) it finishes the whole batch, then resumes the first
//! panic (the eviction thread catches it and carries on; a map dropped
//! while its thread is already unwinding drops it). A call that hands a
//! value back (`put`, `remove`, `replace`, `update`, …) and publishes on
//! the way catches such a panic from another value's `Drop`, or from
//! `V::clone` of a notification copy, and returns its value. One case is
//! the language's own: a value a call returns is leaked if a local of the
//! caller panics in `Drop` during the return (rust-lang/rust#47949).
//!
//! A `get_or_insert_with` whose `init` asks for its own key (or a
//! `get_many_with` whose `load` asks for one of its keys), an `update`
//! whose `f` writes its own key, and a cycle of loads or updates each
//! waiting for another's key (across threads and maps) would wait for ever:
//! they panic instead, naming the threads; an async load that asks for its
//! own key from inside panics too, but a cycle through async loads on
//! other tasks waits for ever (see [`ExpireMap::get_or_insert_with_async`]).
//! `get_many_with` panics, naming
//! the key's position, when its `load` leaves out a key it was asked for
//! (`try_get_many_with` returns `BulkError::Missing`).
//! [`Builder::build`] panics on invalid settings ([`Builder::try_build`]
//! returns the error instead).
//!
//! One capacity limit: a shard holds at most 2^30 − 1 entries (its entries
//! are addressed by 30 bits of a `u32`; the other two hold the access
//! count), and a `put` past that panics, as `Vec` does on capacity
//! overflow. For `u64 -> u64` that is over 38 GB in one shard; more
//! [shards](Builder::shards) raise the limit.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod limits;
mod sync;
mod unwind;

pub mod broadcast;
pub mod clock;
mod map;
pub mod timer;

/// The README's code blocks, compiled and run as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub use broadcast::{RecvError, RecvTimeoutError, SubscribeError, TryRecvError};
pub use clock::{Clock, ManualClock, SystemClock};
pub use map::{
    BuildError, Builder, BulkError, Cause, DEFAULT_EVENT_CAPACITY, DEFAULT_EVICTION_INTERVAL,
    DEFAULT_MAX_SUBSCRIBERS, DEFAULT_PRECISION, Event, ExpireIf, ExpireMap, Expiry, Iter, Keys,
    MAX_EVENT_CAPACITY, MAX_PERIOD, MAX_SHARDS, MAX_SUBSCRIBERS, MIN_EVICTION_INTERVAL,
    MIN_PRECISION, Refused, Stats, Subscriber, Update,
};

//! A near cache in front of Redis: an [`expiremap::ExpireMap`] in each
//! process, kept coherent by Redis itself.
//!
//! [`NearCache<K, V>`](NearCache) keeps its entries in Redis (or Valkey),
//! where every process sees them, and a *near copy* of what it read or wrote
//! in a bounded local [`ExpireMap`]. A read that finds a near copy costs no
//! network; a miss reads the value and its remaining Redis TTL in one round
//! trip and keeps a near copy that never outlives the Redis key nor the cap
//! set with [`Builder::max_near_ttl`]. Writes go through to Redis, then to
//! the near copy. A write by any process drops the near copies in every
//! other process, through Redis's server-assisted client-side caching.
//!
//! ```no_run
//! use expiremap_redis::NearCache;
//! use std::time::Duration;
//!
//! let cache: NearCache<String, u64> = NearCache::builder("redis://127.0.0.1:6379")
//!     .prefix("users:")
//!     .max_entries(10_000)
//!     .build()?;
//! cache.put("alice".to_string(), 42, Duration::from_secs(60))?;
//! assert_eq!(cache.get(&"alice".to_string())?, Some(42)); // a near hit
//! # Ok::<(), expiremap_redis::Error>(())
//! ```
//!
//! # Async
//!
//! [`get_async`](NearCache::get_async), [`put_async`](NearCache::put_async),
//! [`remove_async`](NearCache::remove_async),
//! [`get_or_insert_with_async`](NearCache::get_or_insert_with_async) and
//! [`try_get_or_insert_with_async`](NearCache::try_get_or_insert_with_async)
//! are the same calls as futures, for any executor (tokio of either
//! flavour, async-std, a hand-rolled one): the library depends on no
//! runtime. A miss awaits its reply without parking a thread (the cache's
//! reader thread wakes the task when the reply is applied; the supervisor
//! thread wakes it when the call timeout has passed, within 50 ms of it),
//! so a stalled server holds up only the tasks that wait on it. A near hit
//! is ready on the first poll. The coherence and the staleness bound are
//! the same as for the blocking calls. Dropping a call's future does not
//! take its command back: a reply that comes is applied as any other.
//!
//! ```no_run
//! # async fn demo() -> Result<(), expiremap_redis::Error> {
//! use expiremap_redis::NearCache;
//! use std::time::Duration;
//!
//! let cache: NearCache<String, u64> = NearCache::builder("redis://127.0.0.1:6379").build()?;
//! let v = cache
//!     .get_or_insert_with_async("bob".to_string(), Duration::from_secs(60), async { 7 })
//!     .await?;
//! assert_eq!(cache.get_async(&"bob".to_string()).await?, Some(v));
//! # Ok(()) }
//! ```
//!
//! # Coherence
//!
//! Each cache holds **one** data connection, in RESP3, on which it asks for
//! `CLIENT TRACKING ON BCAST PREFIX <prefix> NOLOOP`: the server pushes an
//! invalidation message on that connection for every key under the prefix
//! that any *other* client changes (writes, deletes, expirations, evictions,
//! `FLUSHALL`). Every command of the cache goes through the same connection
//! and one thread reads it: it applies replies (storing near copies) and
//! invalidations (dropping them) one by one, in the order the server sent
//! them. That order is what makes the race of the Redis documentation
//! ("a read reply overtaken by the invalidation of its key") impossible
//! here: an invalidation sent after the reply is applied after the store.
//!
//! Why this and not a second, redirect connection (`REDIRECT <id>` to a
//! connection subscribed to `__redis__:invalidate`): with two connections
//! the two streams race each other, the tracking connection can be lost
//! without the redirect one noticing (RESP2 tells nobody), and our own
//! writes come back as invalidations that drop the near copy a `put` just
//! made. One RESP3 connection has none of these: `NOLOOP` keeps our own
//! writes from echoing, and its loss is one event. The `redis` crate
//! provides the URL parsing, command encoding and RESP3 parser; the
//! connection thread is ours, because its sync client can neither be read
//! by one thread while others write nor deliver pushes in order with
//! replies, and its async client would bring a runtime.
//!
//! # Staleness bound
//!
//! With a staleness bound `S` ([`Builder::staleness_bound`], 500 ms by
//! default):
//!
//! > a `get` that starts more than `S` after a write (by any process)
//! > completed never returns the value that write replaced.
//!
//! How it is enforced: the cache pings the server every `S / 4` on its
//! connection. A `PONG` to a ping sent at `t` proves that every
//! invalidation the server produced before it read that ping has already
//! been applied (same connection, in order), so near copies are served only
//! while `now <= t + S` for the latest answered ping; otherwise `get` reads
//! from Redis. A read from Redis is never stale. (Redis queues the broadcast invalidations of an
//! event-loop turn before it sends that turn's replies, so a ping sent after
//! a write's reply reaches the server after that write's invalidation was
//! queued on our connection.) So the bound holds however slow the network, the
//! server or this process is; what it costs is that near hits stop (reads go
//! to Redis) while pings are late.
//!
//! In the usual case an invalidation arrives within one loopback round trip
//! of the write: see `BENCHMARKS.md` for the measured delay (median and
//! p99), far below `S`.
//!
//! What `S` trades: a smaller `S` gives fresher near copies and near hits
//! that stop sooner when the server is slow to answer (reads then go to
//! Redis, which costs a round trip each). It is not a liveness timeout: a
//! late ping does not close the connection (see *Lost connections*).
//!
//! Assumptions: the server and this machine's clocks run at the same rate
//! (Redis expires keys on its own clock), and writes under the prefix go to
//! the same server (with replicas, a read from a replica is as stale as the
//! replica). `SWAPDB` sends no invalidation (a Redis limit): after a swap of
//! the cache's database, near copies of the old data are served until they
//! expire (at most [`Builder::max_near_ttl`]) or the cache reconnects; swap
//! databases with the caches stopped, or keep the cap short.
//!
//! # Lost connections
//!
//! No call waits forever, whatever the server or user code does: a call
//! waits at most its call timeout ([`Builder::call_timeout`], 2 s by
//! default; counted from its start, so a Cluster's redirects share it) and
//! then fails with an [`Error::Connection`] of kind
//! `TimedOut` ([`Error::is_timeout`]); the connection and the near copies
//! stay, and the reply, if it comes, is applied as usual. A ping that goes
//! unanswered for the longer of `S` and the call timeout closes the
//! connection (failing every waiting call). So a server stall shorter than
//! that (a fork, a `DEBUG SLEEP`, a failover's `CLIENT PAUSE`) stops near
//! hits after `S`, but keeps the connection and the near copies, and the
//! calls made during it get their replies if they come within the call
//! timeout. A panic of user code on the cache's reader thread (see
//! *Codec*) never leaves a call waiting either.
//!
//! A call never waits for the socket: its command is queued and written
//! as far as the socket takes it at once, and the connection's supervisor
//! thread writes the rest as the server reads it. So a stalled server, or
//! a value larger than the socket buffers, blocks no caller's thread (an
//! executor's worker included) nor the other callers of the connection;
//! each waits for its reply, at most its call timeout. While a server is
//! stalled (a ping unanswered for longer than `S / 4`) and near hits have
//! stopped (`S` has passed), a [`get`](NearCache::get) of a key that has a
//! near copy fails at once with a timeout error ([`Error::is_timeout`],
//! naming the server and how long it has not answered) instead of waiting
//! for the server; a key without a near copy is read from the server,
//! waiting at most the call timeout. Connecting waits at most
//! the connect timeout ([`Builder::connect_timeout`]) for each answer; a
//! server that gives none is a `TimedOut` error too. Connection errors
//! name their server (`server host:port: ...`, or `cluster node
//! host:port: ...`) and a timeout says how long was waited.
//!
//! When the connection breaks (server killed, network gone, ping overdue):
//! near hits stop at once, every call waiting on it fails with
//! [`Error::Connection`], every near copy is dropped (invalidations may have
//! been missed), and calls fail fast with `Error::Connection` while the
//! cache reconnects in the background (backoff from 10 ms up to 500 ms).
//! While it cannot (a password changed: `WRONGPASS`; a TLS error), those
//! errors say why its last attempt failed (in the message, and as the
//! error's `source`), as does [`NearCache::last_connect_error`].
//! Once reconnected, tracking is set up again before any near copy is
//! stored. A `put` or `remove` that failed with `Error::Connection` may or
//! may not have reached the server.
//!
//! # Redis Cluster
//!
//! [`NearCache::cluster_builder`] takes the URLs of some of a cluster's
//! nodes (the seeds; one that answers with the slot table is enough) and
//! gives the same `NearCache`, with the same calls, coherence and staleness
//! bound per key:
//!
//! * The cache asks a seed for the slot table (`CLUSTER SLOTS`) and opens
//!   one link, exactly the single-server connection above (RESP3, broadcast
//!   tracking of the prefix, its reader, its pings, its reconnects), to
//!   every primary; all links store into one near map. A key goes to the
//!   primary of its slot (CRC16 of the Redis key, or of its `{hash tag}`),
//!   so its replies and the invalidations of its writes come on one
//!   connection, in order: the invalidation of a key comes from the node
//!   that owns it.
//! * Near copies are served only while every primary's link has an
//!   answered ping sent less than `S` ago: a primary that stalls for
//!   longer than `S` stops the near hits of every key (calls go to Redis,
//!   and the other primaries' keys keep working) until it answers again.
//!   That is what keeps the bound for a copy read through an `ASK` (from a
//!   node the slot table does not name yet).
//! * Topology: a `MOVED` points the slot at the node it names and asks for
//!   the slot table at once; an `ASK` (a slot in migration) resends the one
//!   command with `ASKING`; the slot table is also read every second. A
//!   node named without a host (`cluster-preferred-endpoint-type
//!   unknown-endpoint`: a null host in `CLUSTER SLOTS`, `MOVED 3999
//!   :7002`; or `?`) is at the host of the node that named it. When the
//!   slot table changes, every near copy is dropped; when a node's link is
//!   lost, every near copy is dropped too (as on one server), and calls on
//!   that node's keys fail with an [`Error::Connection`] that names the
//!   node (`cluster node host:port: ...`) while the link reconnects; the
//!   other nodes' keys keep working. A key leaves a node by `MIGRATE`,
//!   which deletes it there, so that node's invalidation drops its near
//!   copy. A `CLUSTERDOWN` (a node removed with `del-node` right after a
//!   reshard took its slots, while the table in use still names it) sends
//!   the call to another primary, which redirects it to the slot's node,
//!   and asks for the slot table at once.
//! * Slots in migration: every command of the cache names one key (a
//!   lease is held in its key: see *Fleet-wide loading*), so each follows
//!   its own `ASK` to wherever its key is, none is refused with
//!   `TRYAGAIN`, and none leaves a key on two nodes (which would make the
//!   reshard's `MIGRATE` of it fail with `BUSYKEY`). Once a `put` or
//!   `remove` returns `Ok`, every later read in any process sees it or a
//!   newer write (after `S`), and no load overwrites it, through the
//!   migration, the reshard that ends it, a `del-node` after it, and a
//!   manual failover (`CLUSTER FAILOVER`). (An unplanned failover keeps
//!   what Redis keeps: a write acknowledged by a primary that dies before
//!   its replica has it is lost by Redis itself.)
//! * Which slot table is taken: an answer that differs from the table in
//!   use is taken only once a second node answers the same (or no other
//!   node answers); an empty table never is. So a node removed with
//!   `redis-cli --cluster del-node`, which keeps running and answers an
//!   empty table, is not believed: the cache asks another node from then
//!   on. A read that gives no table to trust keeps the table in use, and
//!   [`NearCache::last_slot_table_error`] says why until a read succeeds.
//! * Linking: a primary not linked yet is linked when a redirect or the
//!   table names it, and its link connects on a thread of its own, never on
//!   the calling thread nor under a lock of the cache. A call to a node
//!   whose first connect has not ended waits for it (an async call awaits,
//!   so a stalled node holds up only the calls that wait on it), at most
//!   four connect timeouts, then fails with that connect's error, naming
//!   the node (a node that never answers: [`Error::is_timeout`]). `build`
//!   needs the slot table from one seed and waits for every primary's
//!   first connect (in parallel); a primary that cannot be reached (down,
//!   another password) does not fail it: its keys' calls fail, naming it,
//!   while its link keeps trying, and no near copy is served meanwhile (see
//!   the bullet on stalls above). Errors about a node (a refused
//!   connection, `WRONGPASS`) name it.
//! * For the other nodes' keys to keep working while a primary is down
//!   without a replica to replace it, the cluster must be set with
//!   `cluster-require-full-coverage no` (otherwise every node answers
//!   `CLUSTERDOWN`, which calls return as [`Error::Server`]).
//! * Limits: the links are to primaries only (no reads from replicas);
//!   [`Builder::redis_expirations`] is refused (each node sends its own
//!   events); the credentials and TLS settings of the first seed's URL are
//!   used for every node; a cluster has only database 0. A failover to a
//!   replica is followed when the replica answers with its slots (a
//!   `MOVED`, or the next slot table). A network partition is beyond the
//!   bound: a primary cut off from its cluster but not from this process
//!   keeps answering pings, so near copies of its keys may be served while
//!   its replacement takes writes, until it steps down or its link fails.
//!   Tested on clusters of three and four primaries of Redis 7.0.15.
//!
//! # Fleet-wide loading
//!
//! [`get_or_insert_with`](NearCache::get_or_insert_with) and its kin (the
//! `try_` and async forms) load a missing key **once across every process
//! that shares the Redis**, not once per process, with memcache-style
//! leases (Nishtala et al., NSDI 2013). On by default;
//! [`Builder::leases`] turns them off, [`Builder::lease_ttl`] sets their
//! life ([`DEFAULT_LEASE_TTL`], 10 s).
//!
//! * The first miss anywhere takes the key's *lease*: the missing key is
//!   set to a hash holding a random token, with the lease TTL, in the same
//!   script that found it missing (one round trip, as the plain miss's
//!   read). It runs `init`. A plain read of the key meanwhile finds no
//!   value (as before the lease); a key of another type is an error.
//! * Every other caller, in any process, finds the lease held and waits:
//!   for an invalidation of the key on the tracking connection it already
//!   has (the holder's write, a `put`, a `remove`, a lease given back or
//!   expired: each writes the key), or for the lease's time left,
//!   whichever comes first; then it reads again, and takes the lease if
//!   it is free. No polling: a waiter sends nothing while it waits.
//! * The holder's value is stored only while the key still holds its
//!   lease: one `MULTI`/`EXEC` of a script that compares the token and
//!   stages the value under a name of its own, and a `RENAME` of that onto
//!   the key (which fails if nothing was staged). The holder keeps a near
//!   copy of its value, as a `put` does.
//!   A `put` (`SET`) or `remove` of the key by any cache, or any other
//!   client's write of it, replaces the lease in the command that writes,
//!   so a load that started before it never lands after it: no old value
//!   over a newer `put`, no removed key brought back for a whole TTL (the
//!   cache-aside stale set). The load's value is then only returned to its
//!   callers.
//! * A holder whose `init` fails or panics, or whose future is dropped,
//!   gives the lease back, and a waiter takes over at once. A process that
//!   dies (or a link that is lost) holding a lease delays the others by at
//!   most the lease TTL; a load that outlives its lease is not stored (its
//!   callers get its value), and another process may load meanwhile.
//! * Every step names the key alone (the staging name of the holder's
//!   `MULTI` is in its slot), so over a Cluster each follows the key
//!   wherever a migration has it (see *Redis Cluster*).
//!
//! What it gains: with `P` processes reading a hot key, one load per
//! expiry instead of `P` (measured in `BENCHMARKS.md`: 1.00 instead of
//! 8.00 loads per expiry with 8 processes, on one server and on a 3-primary
//! cluster), and no stale set. What it costs: the same round trips as
//! without it on a miss (the lease is taken by the miss's read and ended by
//! the store), a script and a `MULTI`/`EXEC` instead of `GET`/`SET NX`
//! (measured at about 13–25 µs more per loaded miss with the store as one
//! script); `put` is a plain `SET` and `remove` a script (one round trip
//! each). The holder's store is not a plain script: Redis sends a script's
//! writes back to its own connection as invalidations, `NOLOOP` or not,
//! which would drop the near copy it made. Where the `MULTI` is refused (a
//! Cluster slot in migration, or a user without `MULTI`) the holder stores
//! with one script on the key, and its near copy is dropped after the store
//! (its next read goes to Redis). With [`Builder::redis_expirations`], a
//! lease that lapses (its holder died) is reported as an expiration of its
//! key.
//!
//! What the lease TTL should be: longer than your slowest load (a few
//! times its p99.9), since a load that outlives its lease is done twice;
//! and as short as you can afford a stuck or crashed loader to hold the
//! fleet up.
//!
//! # Requirements
//!
//! Redis 6.2 or later (RESP3 and `GETDEL`), over TCP
//! (`redis://host:port/db`, with `user:password@` if needed) or TLS
//! (`rediss://`, with the default `tls` feature: rustls, the Mozilla roots
//! of `webpki-roots`, or a private CA with [`Builder::tls_ca_pem`];
//! certificate checks cannot be turned off). On Redis 7 and later a miss
//! reads with `EVAL_RO` (not held up by `CLIENT PAUSE ... WRITE`, allowed
//! on read-only replicas); on 6.2 with `EVAL`. Tested with Redis 7.0.15
//! (Debian 12's package), over TCP and TLS. Valkey speaks the same protocol
//! but is not tested (Debian 12 has no package of it). Not supported yet:
//! Unix sockets, TLS client certificates. A
//! cluster node's URL given to [`NearCache::builder`] fails `build` with an
//! [`Error::Config`] that says to use [`NearCache::cluster_builder`] (the
//! server's `INFO cluster` says `cluster_enabled:1`); see *Redis Cluster*. Values much larger
//! than what the link moves in the call timeout delay the calls and pings
//! queued behind them.
//!
//! # Near copies and TTLs
//!
//! A near copy lives for `min(remaining Redis TTL, cap)`, where the
//! remaining TTL is counted from when the command was *sent* (before the
//! server read it) and cut by 2 ms, because Redis keeps deadlines in whole
//! milliseconds. A key without a Redis TTL is kept near for the cap. A
//! change of the TTL by another client (`EXPIRE`, `PERSIST`) is a write and
//! drops the near copies. The near map is bounded by [`Builder::max_entries`]
//! (the core map's TinyLFU policy); a near copy pushed out is only a future
//! miss.
//!
//! # Codec
//!
//! Keys and values go through `serde` with [postcard]: compact (varint
//! integers, no field names, no framing beyond what a type needs), with a
//! wire format that is stable since its 1.0, and actively kept. The Redis
//! key is the prefix followed by the key's postcard bytes; the Redis value is
//! the value's postcard bytes. A value that does not decode (another type,
//! trailing bytes) is an [`Error::Codec`]. (bincode, the other usual
//! choice, is no longer maintained.)
//!
//! Decoding runs your `Deserialize` on bytes anyone with access to the
//! server may have written, mostly on the cache's reader thread, so it is
//! fenced in: a `Deserialize` that panics, or a value nested so deep that
//! decoding it would need more than 256 KiB of stack (a recursive type and
//! a hostile value), is an [`Error::Codec`] for the call that read it (a key
//! name in an invalidation or an expiration event is skipped), and the
//! cache goes on. Any other panic of user code on the reader (`Hash`,
//! `Clone`...) closes the connection, fails the waiting calls and the cache
//! reconnects.
//!
//! Keys must round-trip: an invalidation names a Redis key, and its near
//! copy is found by decoding that name, so a key whose encoding does not
//! decode back to an equal key could never be invalidated. Such keys (with
//! serde's untagged or internally tagged enums, `skip_serializing_if`,
//! `#[serde(skip)]`: postcard is not self-describing) are refused with an
//! [`Error::Codec`] on every call, before anything is sent or kept. The
//! check costs one decode of the key per round trip, nothing on a near hit.
//!
//! [postcard]: https://docs.rs/postcard
//!
//! # Events
//!
//! [`NearCache::subscribe`] returns the near map's subscriber: each near copy
//! that leaves is one event, with the core crate's causes. `Expired` means
//! the near copy reached its deadline (its Redis TTL or the cap);
//! `Size` that the bound pushed it out; with [`Builder::publish_removals`],
//! `Removed` and `Replaced` report invalidations, removes and overwrites.
//! Events are about this process's near copies, not about Redis keys
//! nobody here read: for those, see the next section.
//!
//! # Expirations in Redis
//!
//! With [`Builder::redis_expirations`], the cache also subscribes to the
//! server's `expired` key events, on a second connection of its own (a
//! subscribed connection is a pub/sub client to the server, with pub/sub's
//! output buffer limits, so the data connection never subscribes), and
//! [`NearCache::subscribe_expirations`] gives a reader of the keys under
//! the prefix that expired in Redis, whoever wrote them. A key, not an
//! [`Event`]: Redis reports only the name, and the value is gone. The
//! reader is a [`broadcast::Receiver`] of the core crate, so a reader that
//! falls more than 1,024 keys behind is told exactly how many it missed
//! (`Lagged(n)`) and goes on from the oldest it still can.
//!
//! It is lossy the way Redis pub/sub is, and says so only where it can:
//!
//! * The server must send the events: `notify-keyspace-events` must have
//!   `E` and `x` (`CONFIG SET notify-keyspace-events Ex`). `build` checks
//!   that when the server lets it read the setting (`CONFIG GET`), and
//!   fails with [`Error::Config`] naming it; a server that refuses `CONFIG`
//!   (some managed services) is trusted.
//! * Nothing is reported for the time that connection is down: Redis does
//!   not keep pub/sub messages for a client that is not connected. The cache
//!   reconnects it on its own; while it is down, the near cache works as
//!   usual (and after a reconnect the server's setting is not checked
//!   again).
//! * A replica sends no `expired` events (it deletes keys when its master
//!   says so): connect to the master.
//! * Redis sends the event when it deletes the key: at once when a command
//!   touches it after its deadline, otherwise when its background sweep
//!   finds it (10 times a second by default, sampling keys with a TTL). So
//!   an expiration is reported at or after the key's deadline: in
//!   `BENCHMARKS.md`, 200 keys nobody read were reported a median 70 ms and
//!   at most 0.4 s after theirs; a server with many expiring keys can take
//!   longer.
//! * Keys under the prefix that do not decode as `K` are skipped.
//!
//! # Monitoring
//!
//! Two cargo features, both off by default, as in the core crate (each
//! turns on the core's feature of the same name):
//!
//! **`metrics`**: `Builder::metrics(name)` (which, like
//! `NearCache::publish_metrics`, exists only with the feature) publishes
//! through the [`metrics`](https://docs.rs/metrics) facade (so any
//! exporter works), labelled `cache="name"`:
//!
//! * the near map's series, the core crate's (`expiremap::Builder::metrics`
//!   gets the same name; see "Monitoring" in its docs), under Micrometer's
//!   cache names: `cache_gets_total{result="hit"|"miss"}` counts the near
//!   hits and the reads that asked Redis, `cache_size` the near copies,
//!   `cache_evictions_total{cause}` the copies that left (invalidations and
//!   reconnects drop them as `removed`), `cache_load_duration_seconds` the
//!   loads of [`NearCache::get_or_insert_with`] and its blocking kin;
//! * the Redis tier's:
//!
//! | series | kind | what |
//! | --- | --- | --- |
//! | `cache_redis_calls_total{result="ok"\|"error"\|"timeout"}` | counter | calls to Redis, a cluster's redirects followed within one: ended with a reply, with an error ([`Error::is_timeout`] false), with no reply within the call timeout. A lease's release, which waits for nothing, is no call, nor is one refused before it is sent (a key or value that does not encode) |
//! | `cache_redis_call_duration_seconds` | summary (`_sum`, `_count`; a histogram if the exporter is set so) | how long each call took, redirects included |
//! | `cache_invalidations_total` | counter | keys the server said were written, as the cache's connections received them: other clients' writes, and the cache's own lease takes (scripts, whose writes Redis sends back to their own connection); a flush counts one |
//! | `cache_reconnects_total` | counter | connections made after one was lost (each drops the node's near copies) |
//! | `cache_lease_waits_total` | counter | waits for a load's lease held elsewhere in the fleet (see *Fleet-wide loading*) |
//! | `cache_lease_takeovers_total` | counter | leases taken after a wait: the holder's value never came (its load failed, or its lease lapsed) |
//!
//! The near hit ratio over five minutes, in PromQL:
//!
//! ```text
//! sum(rate(cache_gets_total{result="hit",cache="users"}[5m]))
//!   / sum(rate(cache_gets_total{cache="users"}[5m]))
//! ```
//!
//! A near hit pays nothing new: the series are published from counts the
//! cache keeps (the near map's stats; the Redis tier's atomic counts,
//! added to where a round trip or a server push happens anyway), at least
//! once a second by the cache's threads (a link's supervisor), by
//! `NearCache::publish_metrics` (for a scrape that must be current), and
//! when the cache is dropped. Counters are published as running totals
//! (`absolute`). A call's duration is the one value recorded as it
//! happens: two clock reads around the call, only in a named cache. No
//! lock of the cache is held while the recorder runs.
//!
//! **`tracing`**: a `debug` span `expiremap_redis.load` around each load of
//! a missing key by its loader (`key_hash`, a hash of the key's Redis name
//! that every process of the same build computes alike; `leased`;
//! `outcome` = `success`, `failure`, `panicked` or `cancelled`;
//! `duration_us`), with a `warn` event inside it when the load fails (for
//! the blocking API it runs inside the core crate's `expiremap.load`); a
//! `debug` span `expiremap_redis.lease_wait` around each wait for a lease
//! held elsewhere (`key_hash`, `patience_ms`); and `warn` events, naming
//! the node, for a lost connection, a failed connect attempt, a reconnect,
//! a slot-table change (by the node that answered it), and a call that
//! ends in an error (its message names the node). Nothing on the hit
//! paths.

#![cfg_attr(docsrs, feature(doc_cfg))]

/// The README's code blocks, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// The modules stand in layers, each importing only from those below it
// (the list is `layers::LAYERS`, which a test checks against every file;
// ARCHITECTURE.md draws it): `NearCache` (this file, `builder`, `load`,
// `prefix`) and its async face (`nonblocking`) are the top one.
mod builder;
mod cluster;
mod codec;
mod connect;
mod error;
mod expirations;
#[cfg(test)]
mod layers;
mod lease;
mod link;
mod load;
mod monitor;
mod nonblocking;
mod op;
mod prefix;
mod reply;
mod script;
mod slots;
mod waiters;
mod wire;

pub use builder::{Builder, DEFAULT_LEASE_TTL};
pub use codec::{CacheKey, CacheValue};
pub use error::{CodecError, Error};
pub use expiremap::broadcast;
pub use expiremap::{Cause, Event, SubscribeError, Subscriber};

use cluster::Links;
use expirations::Expirations;
use expiremap::ExpireMap;
use prefix::PrefixClaim;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A near cache in front of Redis. See the [crate docs](crate) for the
/// coherence protocol and the staleness bound.
///
/// `Send + Sync`: share it between threads by reference or in an `Arc`.
/// Dropping it closes its connections and stops its threads: three (the
/// connection's reader, the supervisor that pings and reconnects, and the
/// near map's evictor), and a fourth with [`Builder::redis_expirations`].
/// Over a cluster: a reader and a supervisor per primary, the near map's
/// evictor, and one that reads the slot table.
pub struct NearCache<K, V> {
    links: Links<K, V>,
    near: Arc<ExpireMap<K, V>>,
    /// The key prefix in Redis.
    prefix: Vec<u8>,
    staleness: Duration,
    /// With `redis_expirations`: its connection, thread and ring.
    expirations: Option<Arc<Expirations<K>>>,
    /// The loads in flight of `get_or_insert_with_async`.
    flights: nonblocking::Flights<V>,
    /// Fleet-wide loading: the lease TTL (`None`: leases off).
    lease_ttl: Option<Duration>,
    /// The callers waiting for a lease held elsewhere (shared with the links).
    waiters: Arc<waiters::Waiters>,
    /// The Redis tier's counts (shared with the links).
    monitor: Arc<monitor::Counters>,
    /// Its entry in the process's table of prefixes in use.
    _prefix: PrefixClaim,
}

impl<K: CacheKey, V: CacheValue> NearCache<K, V> {
    /// A builder for a cache on the server at `url`
    /// (`redis://[user:password@]host:port[/db]`).
    pub fn builder(url: impl Into<String>) -> Builder<K, V> {
        Builder::new(url.into(), None)
    }

    /// A builder for a cache over a Redis Cluster, from its seed nodes'
    /// URLs (`redis://[user:password@]host:port`, or `rediss://`; any
    /// reachable node will do, the others are found from it). The cache
    /// links every primary (see the crate docs, *Redis Cluster*); the
    /// credentials, TLS and timeouts of the first seed's URL apply to all.
    ///
    /// ```no_run
    /// use expiremap_redis::NearCache;
    ///
    /// let cache: NearCache<String, u64> =
    ///     NearCache::cluster_builder(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///         .prefix("users:")
    ///         .build()?;
    /// # Ok::<(), expiremap_redis::Error>(())
    /// ```
    pub fn cluster_builder<I, S>(seeds: I) -> Builder<K, V>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let seeds: Vec<String> = seeds.into_iter().map(Into::into).collect();
        Builder::new(seeds.first().cloned().unwrap_or_default(), Some(seeds))
    }

    /// The value of `key`: from the near copy if there is one and the
    /// staleness bound allows (no network), else from Redis in one round
    /// trip (value and remaining TTL), leaving a near copy.
    ///
    /// While the staleness bound stops near hits because the key's server
    /// has left a ping unanswered (a stalled server), a key with a near
    /// copy fails at once with a timeout error ([`Error::is_timeout`])
    /// instead of waiting for the server (see the crate docs, *Lost
    /// connections*).
    pub fn get(&self, key: &K) -> Result<Option<V>, Error> {
        if let Some(v) = self.near_read(key)? {
            return Ok(Some(v));
        }
        self.links
            .run(key, &self.prefix, |l, hop| l.fetch(key, hop))
    }

    #[inline]
    fn near_hit(&self, key: &K) -> Option<V> {
        if self.links.fresh() {
            self.near.get(key)
        } else {
            None
        }
    }

    /// A `get`'s first look: the near copy if it may be served; an error
    /// if one is held but its server is stalled (a read from it would
    /// wait); `None`: ask Redis.
    #[inline]
    fn near_read(&self, key: &K) -> Result<Option<V>, Error> {
        if self.links.fresh() {
            return Ok(self.near.get(key));
        }
        self.stalled_near(key)
    }

    #[cold]
    fn stalled_near(&self, key: &K) -> Result<Option<V>, Error> {
        if !self.near.contains_key(key) {
            return Ok(None);
        }
        match self.links.stalled(key, &self.prefix) {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// Stores `value` under `key` in Redis with `ttl` (`SET ... PX`, rounded
    /// up to a millisecond), then as the near copy. A zero `ttl` is ignored,
    /// as by [`ExpireMap::put`]: nothing changes.
    pub fn put(&self, key: K, value: V, ttl: Duration) -> Result<(), Error> {
        if ttl.is_zero() {
            return Ok(());
        }
        self.links
            .run(&key, &self.prefix, |l, hop| {
                l.set(key.clone(), value.clone(), ttl, false, hop)
            })
            .map(drop)
    }

    /// Deletes `key` from Redis (`GETDEL`) and drops the near copy. Returns
    /// the value Redis held.
    ///
    /// An [`Error::Codec`] that is about decoding (`encoding == false`)
    /// means the key *was* deleted, but the value it held did not decode as
    /// `V` (its message says so too).
    pub fn remove(&self, key: &K) -> Result<Option<V>, Error> {
        self.links.run(key, &self.prefix, |l, hop| l.del(key, hop))
    }

    /// The value of `key`, or, if Redis has none, `init()`'s value stored
    /// with `ttl`. At most one caller per key in this process runs `init` at
    /// a time (others wait for its value), and with leases (the default)
    /// at most one per key in the whole fleet: the others wait for its
    /// value, or for its lease to lapse (see the crate docs, *Fleet-wide
    /// loading*). `init`'s value is stored only while its lease is valid:
    /// if another process wrote or removed the key meanwhile, that write
    /// stands and `init`'s value is only returned. (Without leases it is
    /// stored with `SET ... NX`.) A zero `ttl` returns the value without
    /// storing it.
    ///
    /// `init` must not ask this cache for the same key (it would wait for
    /// itself, and panics instead).
    pub fn get_or_insert_with(
        &self,
        key: K,
        ttl: Duration,
        init: impl FnOnce() -> V,
    ) -> Result<V, Error> {
        self.try_get_or_insert_with(key, ttl, || Ok::<V, Error>(init()))
    }

    /// [`get_or_insert_with`](Self::get_or_insert_with) with an `init` that
    /// may fail: nothing is stored, and its error goes to its caller and to
    /// the callers waiting for it (a clone each; see
    /// [`ExpireMap::try_get_or_insert_with`]). Errors of the cache itself
    /// are turned into `E` with `From<Error>`.
    pub fn try_get_or_insert_with<E>(
        &self,
        key: K,
        ttl: Duration,
        init: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E>
    where
        E: From<Error> + Clone + Send + Sync + 'static,
    {
        if let Some(v) = self.get(&key)? {
            return Ok(v);
        }
        // Single flight through the near map's own loading, with a zero TTL:
        // it stores nothing itself (the connection's reader does), it only
        // makes waiters share the loader's value.
        self.near
            .try_get_or_insert_with(key.clone(), Duration::ZERO, || {
                let span = monitor::LoadSpan::new(
                    || codec::redis_key(&self.prefix, &key).ok(),
                    self.lease_ttl.is_some(),
                );
                let r = span.run(|| self.load(&key, ttl, init));
                span.end(r.is_ok());
                r
            })
    }

    /// A reader of the near copies' events (see the crate docs, *Events*).
    pub fn subscribe(&self) -> Result<Subscriber<K, V>, SubscribeError> {
        self.near.subscribe()
    }

    /// A reader of the keys under the prefix that expire in Redis, with
    /// [`Builder::redis_expirations`] (otherwise an [`Error::Config`]). It
    /// sees the expirations from the moment it subscribes; see the crate
    /// docs, *Expirations in Redis*, for what it may miss.
    ///
    /// ```no_run
    /// use expiremap_redis::{NearCache, broadcast::RecvError};
    /// use std::time::Duration;
    ///
    /// let cache: NearCache<String, u64> = NearCache::builder("redis://127.0.0.1:6379")
    ///     .redis_expirations(true)
    ///     .build()?;
    /// let mut expired = cache.subscribe_expirations()?;
    /// cache.put("session".to_string(), 1, Duration::from_millis(100))?;
    /// loop {
    ///     match expired.recv() {
    ///         Ok(key) => break assert_eq!(key, "session"),
    ///         Err(RecvError::Lagged(n)) => eprintln!("{n} expirations missed"),
    ///         Err(RecvError::Closed) => unreachable!("the cache is alive"),
    ///     }
    /// }
    /// # Ok::<(), expiremap_redis::Error>(())
    /// ```
    pub fn subscribe_expirations(&self) -> Result<broadcast::Receiver<K>, Error> {
        self.expirations
            .as_ref()
            .ok_or_else(|| {
                Error::Config("subscribe_expirations needs Builder::redis_expirations(true)".into())
            })?
            .subscribe()
    }

    /// The near copy of `key`, if this process holds one that a `get` would
    /// return now, without any network. For tests and metrics.
    pub fn peek_near(&self, key: &K) -> Option<V> {
        self.near_hit(key)
    }

    /// The time left to the near copy of `key` (ignoring the staleness
    /// bound), without any network.
    pub fn near_ttl(&self, key: &K) -> Option<Duration> {
        self.near.ttl(key)
    }

    /// Near copies held (including ones past their deadline not yet evicted).
    pub fn near_len(&self) -> usize {
        self.near.len()
    }

    /// `true` while the cache has a connection (calls may still fail on it).
    pub fn is_connected(&self) -> bool {
        self.links.connected()
    }

    /// While the cache is reconnecting: why its last attempt failed (a
    /// refused connection, a TLS error, `WRONGPASS` after a password
    /// change...). Calls that fail for want of a connection carry it too,
    /// in their message and as their error's source.
    pub fn last_connect_error(&self) -> Option<Error> {
        self.links.last_error()
    }

    /// Over a Redis Cluster: why the last read of the slot table gave no
    /// table to trust (no node answered, nodes disagreed, or a node
    /// answered an empty table), until a read does; the table in use is
    /// kept meanwhile. Calls that find no primary for their slot carry it
    /// in their message. Always `None` for one server.
    pub fn last_slot_table_error(&self) -> Option<Error> {
        self.links.table_error()
    }

    /// How many connections the cache has made, the first included: one
    /// more after each recovery from a lost connection.
    pub fn connections(&self) -> u64 {
        self.links.connects()
    }

    /// The staleness bound in force (see the crate docs).
    pub fn staleness_bound(&self) -> Duration {
        self.staleness
    }

    /// Publishes every series of [`Builder::metrics`] now (feature
    /// `metrics`; nothing if the cache has no metrics name), the near
    /// map's and the Redis tier's, to the recorder in force on this
    /// thread: one set with `metrics::with_local_recorder`, else the
    /// global one. The cache's threads publish at least once a second and
    /// its drop once more; call this for a scrape that must be current.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn publish_metrics(&self) {
        self.near.publish_metrics();
        self.monitor.publish();
    }
}

impl<K, V> Drop for NearCache<K, V> {
    fn drop(&mut self) {
        self.links.close();
        if let Some(e) = &self.expirations {
            e.close();
        }
        // The last counts (the near map publishes its own when its last
        // handle goes).
        #[cfg(feature = "metrics")]
        self.monitor.publish();
    }
}

impl<K, V> fmt::Debug for NearCache<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NearCache")
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("staleness", &self.staleness)
            .finish_non_exhaustive()
    }
}

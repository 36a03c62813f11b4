//! Acknowledged writes while a cluster changes, on real three-primary
//! clusters: a slot in migration (`MIGRATING`/`IMPORTING`, `ASK`,
//! `TRYAGAIN` on commands over several keys), a reshard by `redis-cli` under
//! load from several caches with leases on, and a node removed after a
//! reshard (`del-node`: it answers `CLUSTERDOWN`), and a manual failover
//! under the same load. Several caches on
//! separate connections stand for the processes of a fleet. The rule: once
//! `put` or `remove` returns `Ok`, every later read sees it (or a newer
//! write), a load never overwrites it, and the operator's reshard completes.
//! No timing is asserted: timeouts only bound hangs.

use crate::common::cluster::Cluster;
use crate::common::{PATIENCE, eventually, held_load, stacks, within};
use expiremap_redis::NearCache;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

const HOUR: Duration = Duration::from_secs(3600);
/// The staleness bound of the caches here.
const BOUND: Duration = Duration::from_millis(300);

type Cache = NearCache<String, u64>;

fn cache(c: &Cluster, prefix: &str) -> Cache {
    NearCache::cluster_builder(c.urls())
        .prefix(prefix)
        .staleness_bound(BOUND)
        .call_timeout(PATIENCE)
        .build()
        .expect("a cluster cache")
}

/// A cluster, a prefix whose keys all live in one slot (a hash tag), that
/// slot, its node and another node.
fn setup() -> (Cluster, String, u16, usize, usize) {
    let c = Cluster::start(3);
    let (tag, slot) = c.tag_of_first_slot(0);
    let from = c.owner(0, slot);
    (c, format!("{{{tag}}}:"), slot, from, (from + 1) % 3)
}

/// What every cache reads for `key` (a fresh one too), once more than the
/// staleness bound has passed.
fn reads(c: &Cluster, prefix: &str, caches: &[&Cache], key: &str) -> Vec<Option<u64>> {
    thread::sleep(BOUND * 2);
    let fresh = cache(c, prefix);
    let key = key.to_string();
    caches
        .iter()
        .copied()
        .chain([&fresh])
        .map(|x| x.get(&key).unwrap())
        .collect()
}

/// Item 1: a lease taken on the source before the migration, a `put` by
/// another process during it, the lease's slot moved with its keys: the
/// load's store must not replace the acknowledged put.
#[test]
fn a_slow_load_never_overwrites_a_put_acknowledged_during_a_migration() {
    let (c, prefix, slot, from, to) = setup();
    let a = Arc::new(cache(&c, &prefix));
    let b = cache(&c, &prefix);
    let (load, go) = held_load(&a, "k", 1);
    c.start_migration(slot, from, to);
    b.put("k".into(), 2, HOUR).unwrap();
    c.migrate_keys(slot, from, to).unwrap();
    c.finish_migration(slot, to);
    go.send(()).unwrap();
    assert_eq!(load.join().unwrap(), 1, "the load returns its value");
    assert_eq!(reads(&c, &prefix, &[&a, &b], "k"), [Some(2); 3]);
}

/// Item 2: a `put` of a key still on the source lands there (not on the
/// target beside the old value): reads see it, and the reshard's
/// `MIGRATE` of the key succeeds.
#[test]
fn a_put_during_a_migration_lands_where_its_key_is() {
    let (c, prefix, slot, from, to) = setup();
    let a = cache(&c, &prefix);
    let b = cache(&c, &prefix);
    for i in 0..4u64 {
        a.put(format!("k{i}"), 1, HOUR).unwrap();
    }
    c.start_migration(slot, from, to);
    for i in 0..4u64 {
        b.put(format!("k{i}"), 2, HOUR).unwrap();
    }
    for i in 0..4u64 {
        assert_eq!(
            reads(&c, &prefix, &[&a, &b], &format!("k{i}")),
            [Some(2); 3]
        );
    }
    c.migrate_keys(slot, from, to)
        .expect("no key left on two nodes");
    c.finish_migration(slot, to);
    for i in 0..4u64 {
        assert_eq!(
            reads(&c, &prefix, &[&a, &b], &format!("k{i}")),
            [Some(2); 3]
        );
    }
}

/// Item 3: `remove` of a key still on the source, during the migration:
/// it succeeds at once (it was refused with `TRYAGAIN` until the end).
#[test]
fn a_remove_during_a_migration_succeeds() {
    let (c, prefix, slot, from, to) = setup();
    let a = cache(&c, &prefix);
    let b = cache(&c, &prefix);
    a.put("on-source".into(), 1, HOUR).unwrap();
    a.put("moved".into(), 2, HOUR).unwrap();
    c.start_migration(slot, from, to);
    // One key moves to the target, one stays on the source.
    let mut src = c.nodes[from].raw();
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(c.nodes[to].port)
        .arg(format!("{prefix}\x05moved"))
        .arg(0)
        .arg(5000)
        .query(&mut src)
        .unwrap();
    assert_eq!(b.remove(&"on-source".into()).unwrap(), Some(1));
    assert_eq!(b.remove(&"moved".into()).unwrap(), Some(2));
    assert_eq!(b.remove(&"absent".into()).unwrap(), None);
    for k in ["on-source", "moved"] {
        assert_eq!(reads(&c, &prefix, &[&a, &b], k), [None; 3]);
    }
    c.migrate_keys(slot, from, to).unwrap();
    c.finish_migration(slot, to);
}

/// A lease taken before the migration, its load stored during it (the
/// holder's `MULTI` is refused there; its one-key store follows the key),
/// and a load that starts during it: both land, and the keys migrate.
#[test]
fn loads_during_a_migration_store_their_values() {
    let (c, prefix, slot, from, to) = setup();
    let a = Arc::new(cache(&c, &prefix));
    let b = cache(&c, &prefix);
    let (load, go) = held_load(&a, "before", 1);
    c.start_migration(slot, from, to);
    go.send(()).unwrap();
    assert_eq!(load.join().unwrap(), 1);
    assert_eq!(
        b.get_or_insert_with("during".into(), HOUR, || 2).unwrap(),
        2
    );
    assert_eq!(reads(&c, &prefix, &[&a, &b], "before"), [Some(1); 3]);
    assert_eq!(reads(&c, &prefix, &[&a, &b], "during"), [Some(2); 3]);
    c.migrate_keys(slot, from, to).unwrap();
    c.finish_migration(slot, to);
    assert_eq!(reads(&c, &prefix, &[&a, &b], "before"), [Some(1); 3]);
}

/// Item 7: a holder whose load fails gives its lease back where the lease
/// is. Here the lease migrated to the target (its slot in migration, its
/// key moved) before the load failed: the release, sent to the slot's
/// node, meets an `ASK` and is sent on to the target (it once stopped
/// there, and the lease held the key for its whole TTL, an hour here).
#[test]
fn a_failed_load_releases_its_lease_after_the_lease_migrated() {
    let (c, prefix, slot, from, to) = setup();
    let hour_lease = |c: &Cluster| -> Cache {
        NearCache::cluster_builder(c.urls())
            .prefix(&prefix)
            .staleness_bound(BOUND)
            .lease_ttl(HOUR)
            .call_timeout(PATIENCE)
            .build()
            .unwrap()
    };
    let a = Arc::new(hour_lease(&c));
    let b = hour_lease(&c);
    let (started_tx, started) = mpsc::channel();
    let (fail, fail_rx) = mpsc::channel::<()>();
    let loader = {
        let a = Arc::clone(&a);
        thread::spawn(move || {
            a.try_get_or_insert_with("k".to_string(), HOUR, || {
                started_tx.send(()).unwrap();
                fail_rx.recv().unwrap();
                Err(expiremap_redis::Error::Config("the load failed".into()))
            })
        })
    };
    started.recv_timeout(PATIENCE).expect("the load started");
    c.start_migration(slot, from, to);
    c.migrate_keys(slot, from, to).unwrap();
    fail.send(()).unwrap();
    assert!(loader.join().unwrap().is_err());
    // The lease is gone: another process loads at once.
    let got = within("another process takes over", move || {
        b.get_or_insert_with("k".to_string(), HOUR, || 2).unwrap()
    });
    assert_eq!(got, 2);
}

/// A write of the acceptance run: its version, whether it removed, when
/// it was sent and when it was acknowledged.
#[derive(Clone, Copy)]
struct Write {
    version: u64,
    remove: bool,
    sent: Instant,
    acked: Instant,
}

/// A read of the acceptance run.
struct Read {
    key: u64,
    start: Instant,
    end: Instant,
    got: Option<u64>,
}

/// A load's value: never to be read where an acknowledged put stands.
const LOADED: u64 = u64::MAX;

/// What is wrong with `r`, given its key's writes (one writer a key, so
/// in version order): the newest write acknowledged more than the
/// staleness bound before the read started (`floor`) must be what it
/// reads, or a later write. A value at least the floor's version; no value
/// (or a load's) only if a remove not older than the floor was sent before
/// the read ended.
fn stale(r: &Read, writes: &[Write]) -> Option<String> {
    let floor = writes.iter().rev().find(|w| w.acked + BOUND < r.start)?;
    let removed = writes
        .iter()
        .any(|w| w.remove && w.version >= floor.version && w.sent < r.end);
    let ok = match r.got {
        Some(LOADED) | None => removed,
        Some(v) => v >= floor.version,
    };
    (!ok).then(|| {
        format!(
            "k{}: read {:?} after version {} ({}) was acknowledged",
            r.key,
            r.got,
            floor.version,
            if floor.remove { "a remove" } else { "a put" }
        )
    })
}

/// The acceptance run: `redis-cli --cluster reshard` moves the slot of
/// every key here while three caches put (each its own keys, versions
/// rising), remove, read and load (with leases) them. The reshard
/// completes; no call fails; every read that starts more than the
/// staleness bound after a write was acknowledged sees that write or a
/// newer one (a load's value only after a remove); at the end every cache
/// reads each key's last acknowledged write.
#[test]
fn a_reshard_under_load_loses_no_acknowledged_write() {
    let (c, prefix, _slot, from, to) = setup();
    under_load(&c, &prefix, || c.reshard_one(from, to));
}

/// The same load through a manual failover (`CLUSTER FAILOVER` on the
/// replica of the keys' primary: the replica catches up, then takes the
/// slots, and the old primary becomes its replica).
#[test]
fn a_failover_under_load_loses_no_acknowledged_write() {
    let (mut c, prefix, slot, from, _) = setup();
    let r = c.add_replica(from);
    under_load(&c, &prefix, || {
        let _: () = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query(&mut c.nodes[r].raw())
            .map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        while c.owner(r, slot) != r || c.owner(from, slot) != r {
            if t0.elapsed() > PATIENCE {
                return Err("the replica did not take the slot".into());
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    });
}

/// Three caches put, remove, read and load the keys under `prefix` while
/// `change` changes the cluster; then the checks of the acceptance run.
fn under_load(c: &Cluster, prefix: &str, change: impl FnOnce() -> Result<(), String>) {
    let caches: Vec<Arc<Cache>> = (0..3).map(|_| Arc::new(cache(c, prefix))).collect();
    const KEYS: u64 = 24;
    let writes: Arc<Mutex<HashMap<u64, Vec<Write>>>> = Arc::default();
    let reads: Arc<Mutex<Vec<Read>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let doing = Arc::new(Doing::default());
    let mut threads = Vec::new();
    // Writers: cache w writes the keys k with k % 3 == w; every fourth
    // write of a key is a remove. Versions 1, 2, 3...
    for w in 0..3u64 {
        let (cache, writes, stop, failures, doing) = (
            Arc::clone(&caches[w as usize]),
            Arc::clone(&writes),
            Arc::clone(&stop),
            Arc::clone(&failures),
            Arc::clone(&doing),
        );
        let me = doing.worker();
        threads.push(thread::spawn(move || {
            let mut version = 0u64;
            while !stop.load(Ordering::Relaxed) {
                version += 1;
                let remove = version.is_multiple_of(4);
                for k in (w..KEYS).step_by(3) {
                    // After the stop a worker ends its call in progress only.
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let key = format!("k{k}");
                    let call = if remove { "remove" } else { "put" };
                    doing.now(me, format!("cache {w}: {call} {key}"));
                    let sent = Instant::now();
                    let r = if remove {
                        cache.remove(&key).map(drop)
                    } else {
                        cache.put(key, version, HOUR)
                    };
                    let acked = Instant::now();
                    match r {
                        Ok(()) => writes.lock().unwrap().entry(k).or_default().push(Write {
                            version,
                            remove,
                            sent,
                            acked,
                        }),
                        Err(e) => failures.lock().unwrap().push(format!("write k{k}: {e}")),
                    }
                }
                thread::sleep(Duration::from_millis(5));
            }
        }));
    }
    // Readers and loaders: every cache reads every key, and loads the
    // missing ones.
    for (c, cache) in caches.iter().enumerate() {
        let (cache, reads, stop, failures, doing) = (
            Arc::clone(cache),
            Arc::clone(&reads),
            Arc::clone(&stop),
            Arc::clone(&failures),
            Arc::clone(&doing),
        );
        let me = doing.worker();
        threads.push(thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                for key in 0..KEYS {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let k = format!("k{key}");
                    let plain = n.is_multiple_of(2);
                    let call = if plain { "get" } else { "get_or_insert_with" };
                    doing.now(me, format!("cache {c}: {call} {k}"));
                    let start = Instant::now();
                    let r = if plain {
                        cache.get(&k)
                    } else {
                        cache.get_or_insert_with(k, HOUR, || LOADED).map(Some)
                    };
                    let end = Instant::now();
                    match r {
                        Ok(got) => reads.lock().unwrap().push(Read {
                            key,
                            start,
                            end,
                            got,
                        }),
                        Err(e) => failures.lock().unwrap().push(format!("read k{key}: {e}")),
                    }
                }
                thread::sleep(Duration::from_millis(2));
            }
        }));
    }
    thread::sleep(Duration::from_millis(500));
    let changed = change();
    thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    // After the stop a worker ends the call it is in: within its call
    // timeout (PATIENCE), or a load's lease wait within the lease's time.
    // One still running well after that is stuck, and the failure says
    // where.
    let t0 = Instant::now();
    while threads.iter().any(|t| !t.is_finished()) {
        if t0.elapsed() > 4 * PATIENCE {
            let stuck: Vec<String> = (0..threads.len())
                .filter(|&i| !threads[i].is_finished())
                .map(|i| doing.describe(i))
                .collect();
            panic!(
                "workers still in a call {:?} after the stop: {stuck:#?}\n{}",
                4 * PATIENCE,
                stacks()
            );
        }
        thread::sleep(Duration::from_millis(10));
    }
    for t in threads {
        t.join().unwrap();
    }
    changed.expect("the cluster change completes");
    let mut failures = failures.lock().unwrap().clone();
    let writes = writes.lock().unwrap();
    let reads = reads.lock().unwrap();
    failures.extend(
        reads
            .iter()
            .filter_map(|r| stale(r, writes.get(&r.key).map_or(&[], |w| &w[..]))),
    );
    assert!(
        failures.is_empty(),
        "{} failures in {} reads: {:?}",
        failures.len(),
        reads.len(),
        &failures[..failures.len().min(10)]
    );
    // Every cache reads each key's last acknowledged write.
    thread::sleep(BOUND * 2);
    for k in 0..KEYS {
        let last = *writes[&k].last().unwrap();
        for (i, x) in caches.iter().enumerate() {
            let got = x.get(&format!("k{k}")).unwrap();
            let ok = match got {
                Some(LOADED) | None => last.remove,
                Some(v) => !last.remove && v == last.version,
            };
            assert!(
                ok,
                "cache {i}, k{k}: read {got:?}, the last acknowledged write {}",
                last.version
            );
        }
    }
}

/// What each worker of [`under_load`] is doing, and since when: named by
/// a run whose workers do not end.
#[derive(Default)]
struct Doing(Mutex<Vec<(String, Instant)>>);

impl Doing {
    /// A new worker's place.
    fn worker(&self) -> usize {
        let mut d = self.0.lock().unwrap();
        d.push(("starting".into(), Instant::now()));
        d.len() - 1
    }

    /// Worker `i` starts what `what` says.
    fn now(&self, i: usize, what: String) {
        self.0.lock().unwrap()[i] = (what, Instant::now());
    }

    fn describe(&self, i: usize) -> String {
        let (what, since) = &self.0.lock().unwrap()[i];
        format!("{what}, for {:?}", since.elapsed())
    }
}

/// Item 4: a node removed right after a reshard took its slots
/// (`redis-cli --cluster del-node`; it keeps running, reset, and answers
/// `CLUSTERDOWN Hash slot not served`): the cache, whose slot table may
/// still name it, asks the table again and goes to the slots' new node;
/// every call works. The node is the one the cache reads its slot table
/// on, so that the table is read elsewhere too.
#[test]
fn a_node_removed_after_a_reshard_leaves_no_key_unusable() {
    let c = Cluster::start(3);
    let a = cache(&c, "rm:");
    for i in 0..40u64 {
        a.put(format!("k{i}"), i, HOUR).unwrap();
    }
    let x = eventually(
        "one node where the cache reads the slot table",
        || match c.slot_readers()[..] {
            [x] => Some(x),
            _ => None,
        },
    );
    let to = (x + 1) % 3;
    // The keys x held move with its slots (as a reshard does), then x is
    // removed at once.
    let slots = c.slots_of(x, x);
    c.start_migrations(&slots, x, to);
    c.migrate_keys_of(&slots, x, to).unwrap();
    c.move_all_slots(x, to);
    c.del_node(x, to);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        for i in 0..40u64 {
            let k = format!("k{i}");
            assert_eq!(a.get(&k).unwrap(), Some(i), "{k}");
            a.put(k, i, HOUR).unwrap();
        }
        thread::sleep(Duration::from_millis(50));
    }
}

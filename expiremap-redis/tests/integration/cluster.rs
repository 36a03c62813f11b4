//! Redis Cluster: a real three-primary cluster on loopback ports
//! (`tests/common/cluster.rs`). Keys routed by slot on every node, writes
//! seen across caches within the staleness bound, a slot migrated while
//! caches read and write, a primary killed and brought back, and the async
//! API over the cluster.

use crate::common::cluster::Cluster;
use crate::common::{PATIENCE, eventually, join_within};
use expiremap_redis::{Error, NearCache};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const HOUR: Duration = Duration::from_secs(3600);
const S: Duration = Duration::from_millis(300);

fn cache(c: &Cluster, prefix: &str) -> NearCache<String, u64> {
    NearCache::cluster_builder(c.urls())
        .prefix(prefix)
        .staleness_bound(S)
        .build()
        .expect("a cluster cache")
}

fn keys_on(c: &Cluster, i: usize, prefix: &str) -> Vec<String> {
    c.keys_on(i, prefix)
}

#[test]
fn plain_builder_refuses_a_cluster_node_and_cluster_builder_a_plain_server() {
    let c = Cluster::start(3);
    let r = NearCache::<String, u64>::builder(c.url(0))
        .prefix("c:")
        .build();
    match r {
        Err(Error::Config(m)) => assert!(m.contains("cluster_builder"), "{m}"),
        Err(e) => panic!("not a configuration error: {e}"),
        Ok(_) => panic!("built a single-server cache on a cluster node"),
    }
    let s = crate::common::Server::start();
    let r = NearCache::<String, u64>::cluster_builder([s.url()]).build();
    match r {
        Err(Error::Config(m)) => assert!(m.contains("not a Redis Cluster node"), "{m}"),
        Err(e) => panic!("not a configuration error: {e}"),
        Ok(_) => panic!("built a cluster cache on a plain server"),
    }
    let r = NearCache::<String, u64>::cluster_builder(Vec::<String>::new()).build();
    assert!(matches!(r, Err(Error::Config(_))));
}

#[test]
fn puts_on_every_node_and_writes_seen_across_caches_within_the_bound() {
    let c = Cluster::start(3);
    let (a, b) = (cache(&c, "w:"), cache(&c, "w:"));
    for i in 0..1000u64 {
        a.put(format!("k{i}"), i, HOUR).unwrap();
    }
    let on: Vec<Vec<String>> = (0..3).map(|i| keys_on(&c, i, "w:")).collect();
    assert_eq!(on.iter().map(Vec::len).sum::<usize>(), 1000);
    for (i, keys) in on.iter().enumerate() {
        assert!(!keys.is_empty(), "node {i} holds no key");
    }
    // Ten keys of each node: b holds near copies, a overwrites them; a get
    // that starts more than S after the write completed sees the new value.
    let sample: Vec<&String> = on.iter().flat_map(|k| k.iter().take(10)).collect();
    for k in &sample {
        assert!(b.get(k).unwrap().is_some());
        assert!(b.peek_near(k).is_some() || !b.is_connected());
    }
    for k in &sample {
        a.put((*k).clone(), 5000, HOUR).unwrap();
    }
    std::thread::sleep(S + Duration::from_millis(5));
    for k in &sample {
        assert_eq!(b.get(k).unwrap(), Some(5000), "{k}");
    }
    // And the invalidations themselves arrived (not only the bound).
    for k in &sample {
        a.put((*k).clone(), 6000, HOUR).unwrap();
    }
    for k in &sample {
        eventually("an invalidation", || {
            (b.peek_near(k) != Some(5000)).then_some(())
        });
    }
    assert_eq!(a.remove(sample[0]).unwrap(), Some(6000));
    assert_eq!(b.get(sample[0]).unwrap(), None);
}

#[test]
fn a_killed_primary_fails_its_keys_only_and_the_cache_recovers() {
    let mut c = Cluster::start(3);
    let a = NearCache::<String, u64>::cluster_builder(c.urls())
        .prefix("d:")
        .staleness_bound(HOUR)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    for i in 0..200u64 {
        a.put(format!("k{i}"), i, HOUR).unwrap();
    }
    let on: Vec<Vec<String>> = (0..3).map(|i| keys_on(&c, i, "d:")).collect();
    c.nodes[2].kill();
    let dead = &on[2][0];
    let e = eventually("an error for the dead node's key", || a.get(dead).err());
    assert!(
        e.to_string()
            .contains(&format!("cluster node 127.0.0.1:{}", c.nodes[2].port)),
        "{e}"
    );
    assert!(e.is_connection(), "{e}");
    // The other nodes' keys keep working, reads and writes.
    for keys in &on[..2] {
        for k in keys.iter().take(5) {
            assert!(a.get(k).unwrap().is_some(), "{k}");
            a.put(k.clone(), 7, HOUR).unwrap();
            assert_eq!(a.get(k).unwrap(), Some(7));
        }
    }
    // Calls on the dead node's keys fail with a connection error, quickly.
    for k in on[2].iter().take(5) {
        let e = a.put(k.clone(), 1, HOUR).unwrap_err();
        assert!(e.is_connection(), "{e}");
    }
    // The node comes back (empty: no persistence; its slots from its
    // nodes.conf): the cache works on its keys again.
    c.nodes[2].restart();
    c.wait_ok(2);
    eventually("the node's keys work again", || {
        a.put(dead.clone(), 9, HOUR).ok()
    });
    assert_eq!(a.get(dead).unwrap(), Some(9));
    assert_eq!(a.get(&on[2][1]).unwrap(), None);
}

/// Moves `slot` from node `from` to node `to` the way `redis-cli --cluster
/// reshard` does (IMPORTING/MIGRATING, MIGRATE of its keys a few at a
/// time, then SETSLOT NODE on every node), pausing between batches so that
/// the caches meet the slot in migration (`ASK`).
fn migrate(c: &Cluster, slot: u16, from: usize, to: usize) {
    let (from_id, to_id) = (c.id(from), c.id(to));
    let mut src = c.nodes[from].raw();
    let mut dst = c.nodes[to].raw();
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("IMPORTING")
        .arg(&from_id)
        .query(&mut dst)
        .unwrap();
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("MIGRATING")
        .arg(&to_id)
        .query(&mut src)
        .unwrap();
    loop {
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(3)
            .query(&mut src)
            .unwrap();
        if keys.is_empty() {
            break;
        }
        let mut m = redis::cmd("MIGRATE");
        m.arg("127.0.0.1")
            .arg(c.nodes[to].port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("REPLACE")
            .arg("KEYS");
        for k in &keys {
            m.arg(&k[..]);
        }
        let _: () = m.query(&mut src).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    for i in 0..c.nodes.len() {
        let mut r = c.nodes[i].raw();
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("NODE")
            .arg(&to_id)
            .query(&mut r)
            .unwrap();
    }
}

/// Per key: the values whose put completed, with when.
type Acked = HashMap<u64, Vec<(Instant, u64)>>;

#[test]
fn a_slot_migrated_under_load_loses_no_write_and_serves_nothing_stale() {
    let c = Cluster::start(3);
    // A hash tag in the prefix puts every key of these caches in one slot.
    let prefix = "{m}:";
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(prefix)
        .query(&mut c.nodes[0].raw())
        .unwrap();
    let from = c.owner(0, slot);
    let to = (from + 1) % 3;
    let w = Arc::new(cache(&c, prefix));
    let r = Arc::new(cache(&c, prefix));
    const KEYS: u64 = 20;
    let acked: Arc<Mutex<Acked>> = Arc::default();
    for k in 0..KEYS {
        w.put(format!("k{k}"), 0, HOUR).unwrap();
        acked.lock().unwrap().insert(k, vec![(Instant::now(), 0)]);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (w, acked, stop) = (Arc::clone(&w), Arc::clone(&acked), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut n = 1u64;
            let mut errors = 0;
            while !stop.load(Ordering::Relaxed) {
                let k = n % KEYS;
                match w.put(format!("k{k}"), n, HOUR) {
                    Ok(()) => acked
                        .lock()
                        .unwrap()
                        .get_mut(&k)
                        .unwrap()
                        .push((Instant::now(), n)),
                    Err(_) => errors += 1,
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            // The last write of each key succeeds, so its value is known.
            for k in 0..KEYS {
                let t0 = Instant::now();
                loop {
                    if w.put(format!("k{k}"), n, HOUR).is_ok() {
                        acked
                            .lock()
                            .unwrap()
                            .get_mut(&k)
                            .unwrap()
                            .push((Instant::now(), n));
                        break;
                    }
                    assert!(t0.elapsed() < PATIENCE, "no write succeeds");
                }
                n += 1;
            }
            errors
        })
    };
    let reader = {
        let (r, acked, stop) = (Arc::clone(&r), Arc::clone(&acked), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for k in 0..KEYS {
                    let start = Instant::now();
                    let Ok(Some(v)) = r.get(&format!("k{k}")) else {
                        continue;
                    };
                    reads += 1;
                    // Every write completed more than S before the get
                    // started is seen (values only grow).
                    let floor = acked.lock().unwrap()[&k]
                        .iter()
                        .filter(|(t, _)| *t + S < start)
                        .map(|(_, v)| *v)
                        .max()
                        .unwrap_or(0);
                    assert!(
                        v >= floor,
                        "k{k}: read {v}, but {floor} was written more than S before"
                    );
                }
            }
            reads
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    migrate(&c, slot, from, to);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    // After the stop the writer makes one acknowledged write of each key,
    // each within PATIENCE; the reader ends its round of gets.
    let limit = PATIENCE * (KEYS as u32 + 1);
    let _errors = join_within("the writer", writer, limit);
    let reads = join_within("the reader", reader, limit);
    assert!(reads > 0);
    // Every key is on the new node, with its last acknowledged value.
    assert_eq!(keys_on(&c, to, prefix).len() as u64, KEYS);
    assert!(keys_on(&c, from, prefix).is_empty());
    let fresh = cache(&c, prefix);
    for k in 0..KEYS {
        let last = acked.lock().unwrap()[&k].last().unwrap().1;
        assert_eq!(fresh.get(&format!("k{k}")).unwrap(), Some(last), "k{k}");
    }
    // The caches that saw the migration read the last values too (past S).
    std::thread::sleep(S + Duration::from_millis(5));
    for k in 0..KEYS {
        let last = acked.lock().unwrap()[&k].last().unwrap().1;
        assert_eq!(r.get(&format!("k{k}")).unwrap(), Some(last), "k{k}");
        assert_eq!(w.get(&format!("k{k}")).unwrap(), Some(last), "k{k}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_async_api_over_the_cluster() {
    let c = Cluster::start(3);
    let a = cache(&c, "as:");
    for i in 0..300u64 {
        a.put_async(format!("k{i}"), i, HOUR).await.unwrap();
    }
    for i in 0..3 {
        assert!(!keys_on(&c, i, "as:").is_empty(), "node {i} holds no key");
    }
    for i in 0..300u64 {
        assert_eq!(a.get_async(&format!("k{i}")).await.unwrap(), Some(i));
    }
    let v = a
        .get_or_insert_with_async("new".to_string(), HOUR, async { 11 })
        .await
        .unwrap();
    assert_eq!(v, 11);
    assert_eq!(a.remove_async(&"new".to_string()).await.unwrap(), Some(11));
}

#[tokio::test(flavor = "current_thread")]
async fn a_stalled_primary_holds_up_only_its_own_keys_on_current_thread() {
    // (Its keys' calls wait; near hits stop for all keys past S.)
    let c = Cluster::start(3);
    // Pings unanswered for S stop near hits; the link is closed only after
    // the call timeout (20 s), far beyond this test.
    let a = NearCache::<String, u64>::cluster_builder(c.urls())
        .prefix("sp:")
        .staleness_bound(S)
        .call_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    // Written by another cache: `a` holds near copies of k0 and k2 only.
    let b = cache(&c, "sp:");
    for i in 0..100u64 {
        b.put_async(format!("k{i}"), i, HOUR).await.unwrap();
    }
    let on: Vec<Vec<String>> = (0..3).map(|i| keys_on(&c, i, "sp:")).collect();
    let (k0, k2) = (on[0][0].clone(), on[2][0].clone());
    let value = |k: &str| k[1..].parse::<u64>().unwrap();
    assert_eq!(a.get_async(&k0).await.unwrap(), Some(value(&k0)));
    assert_eq!(a.get_async(&k2).await.unwrap(), Some(value(&k2)));
    assert!(a.peek_near(&k0).is_some() && a.peek_near(&k2).is_some());

    c.nodes[2].signal("-STOP");
    let ticks = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let ticker = {
        let ticks = Arc::clone(&ticks);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // A miss on the stalled node waits without blocking the runtime's one
    // thread: the ticker runs, and the wait can be given up.
    let before = ticks.load(Ordering::Relaxed);
    let r = tokio::time::timeout(Duration::from_millis(300), a.get_async(&on[2][1])).await;
    assert!(r.is_err(), "a stalled node answered: {r:?}");
    assert!(
        ticks.load(Ordering::Relaxed) > before,
        "the ticker never ran"
    );
    // Past S, no near copy is served (every link must be fresh: a copy's
    // invalidations may come from the stalled node); the other nodes' keys
    // keep working, from Redis.
    let t0 = Instant::now();
    while a.peek_near(&k2).is_some() || a.peek_near(&k0).is_some() {
        assert!(t0.elapsed() < PATIENCE, "a near copy still served");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(a.get_async(&k0).await.unwrap(), Some(value(&k0)));
    a.put_async(on[1][0].clone(), 77, HOUR).await.unwrap();
    assert_eq!(a.get_async(&on[1][0]).await.unwrap(), Some(77));

    // The near-held k2 fails fast while its node's ping is unanswered
    // (edges.rs), so until its node answers again after it wakes.
    c.nodes[2].signal("-CONT");
    let t0 = Instant::now();
    let got = loop {
        match a.get_async(&k2).await {
            Err(e) if e.is_timeout() && t0.elapsed() < PATIENCE => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            r => break r,
        }
    };
    assert_eq!(got.unwrap(), Some(value(&k2)));
    ticker.abort();
}

#[test]
fn a_slot_table_change_is_followed_without_a_redirect() {
    let c = Cluster::start(3);
    let a = NearCache::<String, u64>::cluster_builder(c.urls())
        .prefix("t:")
        .staleness_bound(HOUR)
        .build()
        .unwrap();
    let x = "x".to_string();
    a.put(x.clone(), 1, HOUR).unwrap();
    assert_eq!(a.peek_near(&x), Some(1));
    // An empty slot, not x's, handed to another primary: no key moves and
    // no call of the cache meets a redirect; the refresher sees the new
    // table and drops the near copies.
    let mut raw = c.nodes[0].raw();
    let slot_of = |raw: &mut redis::Connection, name: &[u8]| -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(name)
            .query(raw)
            .unwrap()
    };
    let xs = slot_of(&mut raw, b"t:\x01x");
    let slot = slot_of(&mut raw, b"{empty}");
    assert_ne!(slot, xs);
    let from = c.owner(0, slot);
    let to_id = c.id((from + 1) % 3);
    for i in 0..3 {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("NODE")
            .arg(&to_id)
            .query(&mut c.nodes[i].raw())
            .unwrap();
    }
    eventually("the near copies dropped", || {
        a.peek_near(&x).is_none().then_some(())
    });
    assert_eq!(a.get(&x).unwrap(), Some(1));
}

//! Redis Cluster topology as operators change it, on real clusters
//! (`tests/common/cluster.rs`): a node removed with `redis-cli --cluster
//! del-node` (it keeps running and answers an empty slot table), a call in
//! flight to a node that loses its slots, nodes
//! that name no endpoint (`cluster-preferred-endpoint-type
//! unknown-endpoint`), a slot table that cannot be read, a stopped node
//! behind a redirect on a current-thread runtime, a primary down at build,
//! and a primary with another password.

use crate::common::cluster::Cluster;
use crate::common::{PATIENCE, eventually};
use expiremap_redis::{Error, NearCache};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const HOUR: Duration = Duration::from_secs(3600);

/// The Redis key of the cache key `k` (a short `String`) under `prefix`:
/// the prefix, postcard's one-byte length, the bytes.
fn name(prefix: &str, k: &str) -> Vec<u8> {
    let mut n = prefix.as_bytes().to_vec();
    n.push(k.len() as u8);
    n.extend_from_slice(k.as_bytes());
    n
}

#[test]
fn a_node_removed_with_del_node_does_not_empty_the_slot_table() {
    let c = Cluster::start(3);
    let a = NearCache::<String, u64>::cluster_builder(c.urls())
        .prefix("dn:")
        .staleness_bound(HOUR)
        .build()
        .unwrap();
    let reader = || {
        eventually(
            "one node where the cache reads the slot table",
            || match c.slot_readers()[..] {
                [x] => Some(x),
                _ => None,
            },
        )
    };
    // The node the cache reads its slot table on is drained (its slots,
    // empty, handed to another node). Should the reads have moved off it
    // meanwhile, the node they moved to is drained too.
    let mut x = reader();
    loop {
        let to = (0..3)
            .find(|&i| i != x && !c.slots_of(i, i).is_empty())
            .unwrap();
        c.move_all_slots(x, to);
        let now = reader();
        if now == x {
            break;
        }
        x = now;
    }
    let via = (x + 1) % 3;
    for i in 0..100u64 {
        a.put(format!("k{i}"), i, HOUR).unwrap();
    }
    c.del_node(x, via);
    // x runs on, reset: it answers an empty slot table, which the cache
    // must not take. It reads the table elsewhere, and every key works.
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut c.nodes[x].raw())
        .unwrap();
    assert!(slots.is_empty(), "{slots:?}");
    eventually("the slot table read on another node", || {
        (!c.slot_readers().contains(&x)).then_some(())
    });
    // Over a few refreshes (one a second).
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        for i in 0..100u64 {
            let k = format!("k{i}");
            assert_eq!(a.get(&k).unwrap(), Some(i), "{k}");
            a.put(k, i, HOUR).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_call_in_flight_to_a_node_that_loses_its_slots_gets_its_reply() {
    let c = Cluster::start(3);
    let a = Arc::new(
        NearCache::<String, u64>::cluster_builder(c.urls())
            .prefix("{lf}:")
            .staleness_bound(HOUR)
            .call_timeout(PATIENCE)
            .build()
            .unwrap(),
    );
    // Written by another cache: `a` holds no near copy, its get is a miss.
    let b = NearCache::<String, u64>::cluster_builder(c.urls())
        .prefix("{lf}:")
        .build()
        .unwrap();
    b.put("k".into(), 5, HOUR).unwrap();
    let x = c.owner(0, c.slot_of(b"{lf}:"));
    let (y, z) = ((x + 1) % 3, (x + 2) % 3);
    let slots = c.slots_of(x, x);
    let y_id = c.id(y);
    // x stalls with a's get in flight on its link...
    c.nodes[x].signal("-STOP");
    let call = {
        let a = Arc::clone(&a);
        std::thread::spawn(move || a.get(&"k".to_string()))
    };
    std::thread::sleep(Duration::from_millis(300));
    // ... while the others hand all its slots to y: the cache takes the
    // new table, and x's link leaves it.
    for i in [y, z] {
        let mut p = redis::pipe();
        p.atomic();
        for s in &slots {
            p.cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(*s)
                .arg("NODE")
                .arg(&y_id)
                .ignore();
        }
        let _: () = p.query(&mut c.nodes[i].raw()).unwrap();
    }
    eventually("x's link out of the table", || {
        (a.connections() == 2).then_some(())
    });
    // x wakes: the call gets x's reply (the value, or a MOVED to y,
    // followed), not a lost connection.
    c.nodes[x].signal("-CONT");
    let r = call.join().unwrap();
    assert!(matches!(r, Ok(Some(5) | None)), "{r:?}");
}

#[test]
fn unknown_endpoints_mean_the_node_asked_in_slot_tables_and_redirects() {
    let c = Cluster::start(3);
    // CLUSTER SLOTS gives null hosts, MOVED and ASK ":port".
    c.config_set("cluster-preferred-endpoint-type", "unknown-endpoint");
    let cache = || {
        NearCache::<String, u64>::cluster_builder(c.urls())
            .prefix("{ue}:")
            .staleness_bound(HOUR)
            .build()
            .expect("a cache over nodes that name no endpoint")
    };
    let a = cache();
    // Every key of this prefix is in one slot: put it in migration, so
    // that its owner answers `ASK :port` for the keys it lacks.
    let slot = c.slot_of(b"{ue}:");
    let from = c.owner(0, slot);
    let to = (from + 1) % 3;
    a.put("old".into(), 1, HOUR).unwrap();
    c.start_migration(slot, from, to);
    a.put("new".into(), 2, HOUR).unwrap();
    assert_eq!(c.keys_on(to, "{ue}:"), ["new"]);
    let b = cache();
    assert_eq!(b.get(&"new".to_string()).unwrap(), Some(2));
    assert_eq!(b.get(&"old".to_string()).unwrap(), Some(1));
    // The migration ends (the last key moved, the slot given to `to`):
    // `MOVED :port`, or the next slot table.
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(c.nodes[to].port)
        .arg(name("{ue}:", "old"))
        .arg(0)
        .arg(5000)
        .query(&mut c.nodes[from].raw())
        .unwrap();
    for i in 0..3 {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("NODE")
            .arg(c.id(to))
            .query(&mut c.nodes[i].raw())
            .unwrap();
    }
    for cache in [&a, &b] {
        assert_eq!(cache.get(&"old".to_string()).unwrap(), Some(1));
        cache.put("new".into(), 3, HOUR).unwrap();
        assert_eq!(cache.get(&"new".to_string()).unwrap(), Some(3));
    }
    eventually("the slot table read", || {
        a.last_slot_table_error().is_none().then_some(())
    });
}

#[test]
fn a_slot_table_that_cannot_be_read_is_reported_until_it_can() {
    let c = Cluster::start(3);
    let acl = |rules: &[&str]| {
        for s in &c.nodes {
            let _: () = redis::cmd("ACL")
                .arg("SETUSER")
                .arg("cache")
                .arg(rules)
                .query(&mut s.raw())
                .unwrap();
        }
    };
    acl(&["on", ">pw", "~*", "&*", "+@all"]);
    let urls: Vec<String> = c
        .nodes
        .iter()
        .map(|s| format!("redis://cache:pw@127.0.0.1:{}", s.port))
        .collect();
    let a = NearCache::<String, u64>::cluster_builder(urls)
        .prefix("acl:")
        .build()
        .unwrap();
    assert!(a.last_slot_table_error().is_none());
    // CLUSTER SLOTS refused to the cache's user: every read of the table
    // fails, while the calls work on the table in use.
    acl(&["-cluster"]);
    let e = eventually("the failed reads reported", || a.last_slot_table_error());
    assert!(e.to_string().contains("NOPERM"), "{e}");
    assert!(e.to_string().contains("cluster node 127.0.0.1:"), "{e}");
    a.put("k".into(), 1, HOUR).unwrap();
    assert_eq!(a.get(&"k".to_string()).unwrap(), Some(1));
    acl(&["+cluster"]);
    eventually("a read succeeds again", || {
        a.last_slot_table_error().is_none().then_some(())
    });
}

#[tokio::test(flavor = "current_thread")]
async fn a_stopped_node_behind_a_redirect_holds_up_only_its_own_call() {
    let mut c = Cluster::start(3);
    // A fourth primary without slots: no cache links it until a redirect
    // names it.
    let n = c.add_node();
    let t = Duration::from_secs(5);
    let a = Arc::new(
        NearCache::<String, u64>::cluster_builder(c.urls()[..3].to_vec())
            .prefix("{sn}:")
            .staleness_bound(HOUR)
            .connect_timeout(t)
            .build()
            .unwrap(),
    );
    // Another cache, on other keys, holding a near copy.
    let b = NearCache::<String, u64>::cluster_builder(c.urls()[..3].to_vec())
        .prefix("other:")
        .staleness_bound(HOUR)
        .build()
        .unwrap();
    b.put_async("hot".into(), 7, HOUR).await.unwrap();
    let slot = c.slot_of(b"{sn}:");
    let from = c.owner(0, slot);
    c.start_migration(slot, from, n);
    c.nodes[n].signal("-STOP");

    // A miss: `from` answers ASK, to the stopped node, whose link cannot
    // connect (the kernel accepts, the node never answers HELLO).
    let done = Arc::new(AtomicBool::new(false));
    let stalled = {
        let (a, done) = (Arc::clone(&a), Arc::clone(&done));
        tokio::spawn(async move {
            let r = a.get_async(&"k".to_string()).await;
            done.store(true, Ordering::SeqCst);
            r
        })
    };
    // Time for the call to meet its redirect (its first reply, the ASK,
    // comes in a round trip): a call that connected on the runtime's one
    // thread would hold this task until it ended.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The runtime's thread is not held: this task gets near hits, one per
    // turn, while the redirected call waits.
    let hits = AtomicU64::new(0);
    for _ in 0..100 {
        assert!(
            !done.load(Ordering::SeqCst),
            "the redirected call held the runtime"
        );
        assert_eq!(b.get_async(&"hot".to_string()).await.unwrap(), Some(7));
        hits.fetch_add(1, Ordering::Relaxed);
        tokio::task::yield_now().await;
    }
    assert!(
        !done.load(Ordering::SeqCst),
        "the redirected call held the runtime"
    );
    let e = tokio::time::timeout(PATIENCE, stalled)
        .await
        .expect("the redirected call ends")
        .unwrap()
        .unwrap_err();
    let m = e.to_string();
    assert!(e.is_timeout(), "{m}");
    assert!(
        m.contains(&format!("cluster node 127.0.0.1:{}", c.nodes[n].port)),
        "{m}"
    );
    assert!(m.contains(&format!("{t:?}")), "{m}");
    assert_eq!(b.peek_near(&"hot".to_string()), Some(7));

    // The node wakes: the redirect is followed.
    c.nodes[n].signal("-CONT");
    let t0 = Instant::now();
    loop {
        match a.get_async(&"k".to_string()).await {
            Ok(v) => break assert_eq!(v, None),
            Err(e) => assert!(t0.elapsed() < PATIENCE, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Keys `k0..` under `prefix` by the node that owns their slot, as node
/// `asker` sees it.
fn keys_by_node(c: &Cluster, asker: usize, prefix: &str, n: u64) -> Vec<Vec<String>> {
    let mut by = vec![Vec::new(); c.nodes.len()];
    for i in 0..n {
        let k = format!("k{i}");
        let owner = c.owner(asker, c.slot_of(&name(prefix, &k)));
        by[owner].push(k);
    }
    by
}

#[test]
fn build_succeeds_with_a_primary_down_and_links_it_when_it_comes_back() {
    let mut c = Cluster::start(3);
    let by = keys_by_node(&c, 0, "pd:", 60);
    c.nodes[2].kill();
    // The dead node first among the seeds.
    let mut seeds = c.urls();
    seeds.rotate_right(1);
    let a = NearCache::<String, u64>::cluster_builder(seeds)
        .prefix("pd:")
        .staleness_bound(HOUR)
        .build()
        .expect("a cache while one primary is down");
    for k in by[0].iter().chain(&by[1]) {
        a.put(k.clone(), 1, HOUR).unwrap();
        assert_eq!(a.get(k).unwrap(), Some(1));
    }
    let dead = format!("cluster node 127.0.0.1:{}", c.nodes[2].port);
    for k in &by[2] {
        let e = a.put(k.clone(), 1, HOUR).unwrap_err();
        assert!(e.is_connection() && e.to_string().contains(&dead), "{e}");
    }
    let e = a
        .last_connect_error()
        .expect("the dead node's last attempt");
    assert!(e.to_string().contains(&dead), "{e}");
    // Back (empty; its slots from its nodes.conf): its link connects.
    c.nodes[2].restart();
    c.wait_ok(2);
    let k = &by[2][0];
    eventually("the node's keys work", || a.put(k.clone(), 2, HOUR).ok());
    assert_eq!(a.get(k).unwrap(), Some(2));
}

#[test]
fn a_primary_with_another_password_is_named_and_does_not_fail_build() {
    let c = Cluster::start(3);
    let by = keys_by_node(&c, 0, "pw:", 60);
    let url = |i: usize, pw: &str| format!("redis://:{pw}@127.0.0.1:{}", c.nodes[i].port);
    let set_password = |i: usize, auth: Option<&str>, pw: &str| {
        let mut raw = match auth {
            Some(old) => redis::Client::open(url(i, old)).unwrap().get_connection(),
            None => redis::Client::open(c.url(i)).unwrap().get_connection(),
        }
        .unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg(pw)
            .query(&mut raw)
            .unwrap();
    };
    set_password(0, None, "pw");
    set_password(1, None, "pw");
    set_password(2, None, "other");
    let odd = format!("cluster node 127.0.0.1:{}", c.nodes[2].port);
    // Asked alone, the odd node fails build, named.
    match NearCache::<String, u64>::cluster_builder([url(2, "pw")]).build() {
        Err(Error::Server(m)) => assert!(m.contains("WRONGPASS") && m.contains(&odd), "{m}"),
        other => panic!("expected WRONGPASS naming the node, got {other:?}"),
    }
    let a = NearCache::<String, u64>::cluster_builder((0..3).map(|i| url(i, "pw")))
        .prefix("pw:")
        .build()
        .expect("a cache whose seeds answer");
    for k in by[0].iter().chain(&by[1]) {
        a.put(k.clone(), 1, HOUR).unwrap();
    }
    let e = a.put(by[2][0].clone(), 1, HOUR).unwrap_err();
    let m = e.to_string();
    assert!(m.contains("WRONGPASS") && m.contains(&odd), "{m}");
    match a.last_connect_error() {
        Some(Error::Server(m)) => assert!(m.contains("WRONGPASS") && m.contains(&odd), "{m}"),
        other => panic!("expected WRONGPASS naming the node, got {other:?}"),
    }
    set_password(2, Some("other"), "pw");
    let k = &by[2][0];
    eventually("the node's keys work", || a.put(k.clone(), 2, HOUR).ok());
    assert_eq!(a.get(k).unwrap(), Some(2));
}

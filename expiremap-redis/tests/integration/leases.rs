//! Fleet-wide loading: several caches on separate connections stand for
//! the processes of a fleet, against a real `redis-server` (and a real
//! three-primary cluster). One load per hot key for all of them; a slow
//! load that races a `remove` or a `put` never lands; a stuck holder, or a
//! process killed while it holds a lease, holds the others up for at most
//! the lease TTL, and a late write is refused.
//! No timing is asserted: timeouts only bound hangs.

use crate::common::cluster::Cluster;
use crate::common::{Server, eventually, held_load, within};
use expiremap_redis::NearCache;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

type Cache = NearCache<String, u64>;

fn single(s: &Server, prefix: &str, lease_ttl: Duration) -> Cache {
    NearCache::builder(s.url())
        .prefix(prefix)
        .staleness_bound(HOUR)
        .lease_ttl(lease_ttl)
        .build()
        .expect("connect")
}

fn clustered(c: &Cluster, prefix: &str) -> Cache {
    NearCache::cluster_builder(c.urls())
        .prefix(prefix)
        .staleness_bound(Duration::from_millis(300))
        .build()
        .expect("a cluster cache")
}

/// `procs` caches × `threads` threads call `get_or_insert_with` on one hot
/// key at once, `rounds` times (the key removed in between, as by an
/// expiry): returns the loads of each round.
fn herd(caches: Vec<Cache>, threads: usize, rounds: u64) -> Vec<u64> {
    let caches: Vec<Arc<Cache>> = caches.into_iter().map(Arc::new).collect();
    let key = "hot".to_string();
    let loads = Arc::new(AtomicU64::new(0));
    let mut per_round = Vec::new();
    for round in 1..=rounds {
        caches[0].remove(&key).unwrap();
        for c in &caches {
            eventually("the old copy dropped", || {
                c.peek_near(&key).is_none().then_some(())
            });
        }
        let gate = Arc::new(Barrier::new(caches.len() * threads));
        let before = loads.load(Ordering::SeqCst);
        let handles: Vec<_> = caches
            .iter()
            .flat_map(|c| (0..threads).map(move |_| Arc::clone(c)))
            .map(|c| {
                let (gate, loads, key) = (Arc::clone(&gate), Arc::clone(&loads), key.clone());
                thread::spawn(move || {
                    gate.wait();
                    c.get_or_insert_with(key, HOUR, || {
                        loads.fetch_add(1, Ordering::SeqCst);
                        thread::sleep(Duration::from_millis(30));
                        round
                    })
                    .unwrap()
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), round);
        }
        per_round.push(loads.load(Ordering::SeqCst) - before);
    }
    per_round
}

#[test]
fn a_herd_of_processes_loads_a_hot_key_once() {
    let s = Server::start();
    let caches = (0..4).map(|_| single(&s, "herd:", HOUR)).collect();
    let loads = within("the herd", move || herd(caches, 3, 5));
    assert_eq!(loads, vec![1; 5], "loads per round");
}

#[test]
fn without_leases_each_process_loads() {
    // What the lease saves: with leases off, the same herd loads in more
    // than one process (each process's own single flight still holds).
    let s = Server::start();
    let caches = (0..4)
        .map(|_| {
            NearCache::builder(s.url())
                .prefix("off:")
                .staleness_bound(HOUR)
                .leases(false)
                .build()
                .unwrap()
        })
        .collect();
    let loads = within("the herd", move || herd(caches, 1, 3));
    assert!(loads.iter().all(|&n| (1..=4).contains(&n)), "{loads:?}");
}

/// A load that blocks until told, racing `write` from another cache:
/// returns what the loader's call returned and what the fleet then reads.
fn race(a: &Arc<Cache>, b: &Cache, key: &str, write: impl FnOnce(&Cache)) -> (u64, Option<u64>) {
    // 1: the old value, read before the write.
    let (loader, go) = held_load(a, key, 1);
    write(b);
    go.send(()).unwrap();
    let returned = loader.join().unwrap();
    let key = key.to_string();
    let read = b.get(&key).unwrap();
    assert_eq!(a.get(&key).unwrap(), read, "the two processes disagree");
    (returned, read)
}

#[test]
fn a_slow_load_never_resurrects_a_removed_key() {
    let s = Server::start();
    let a = Arc::new(single(&s, "rr:", HOUR));
    let b = single(&s, "rr:", HOUR);
    for i in 0..5 {
        let key = format!("k{i}");
        let (returned, read) = race(&a, &b, &key, |b| {
            b.remove(&key).unwrap();
        });
        assert_eq!(returned, 1, "the load's value is returned to its caller");
        assert_eq!(
            read, None,
            "race {i}: the stale load landed after the remove"
        );
    }
}

#[test]
fn a_slow_load_never_overwrites_a_put() {
    let s = Server::start();
    let a = Arc::new(single(&s, "rp:", HOUR));
    let b = single(&s, "rp:", HOUR);
    for i in 0..5 {
        let key = format!("k{i}");
        let (returned, read) = race(&a, &b, &key, |b| b.put(key.clone(), 2, HOUR).unwrap());
        assert_eq!(returned, 1);
        assert_eq!(read, Some(2), "race {i}: the stale load overwrote the put");
    }
}

/// A holder whose load never ends (a process that died holding the
/// lease, as far as Redis can tell) holds the others up until its lease
/// lapses; they take over, and its late write, if it ever comes, is
/// refused.
#[test]
fn a_stuck_holder_is_taken_over_after_the_lease_ttl_and_its_late_write_refused() {
    let s = Server::start();
    let lease = Duration::from_millis(300);
    let a = Arc::new(single(&s, "st:", lease));
    let b = Arc::new(single(&s, "st:", lease));
    let (stuck, go) = held_load(&a, "k", 1);
    // B finds the lease held, waits for it to lapse, then loads.
    let b2 = Arc::clone(&b);
    let got = within("the takeover", move || {
        b2.get_or_insert_with("k".to_string(), HOUR, || 2).unwrap()
    });
    assert_eq!(got, 2);
    // The stuck holder ends at last: its write is refused (its lease
    // lapsed and B's store ended B's), its value only returned.
    go.send(()).unwrap();
    assert_eq!(stuck.join().unwrap(), 1);
    let k = "k".to_string();
    assert_eq!(b.get(&k).unwrap(), Some(2));
    assert_eq!(a.get(&k).unwrap(), Some(2));
}

/// The child test's name as the test harness knows it (its path below the
/// test binary's crate: the binary holds every file of `tests/` as a module).
fn child_test_name() -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::child_holds_a_lease_until_killed")
}

/// The child process of
/// `a_holder_killed_mid_load_delays_the_others_by_at_most_the_lease_ttl`:
/// with `EXPIREMAP_LEASE_CHILD` set to a server's URL, takes the lease of
/// key `k` under `kl:` and loads until it is killed. Without it (a run of
/// the ignored tests by hand), returns at once.
#[test]
#[ignore = "a child process of another test"]
fn child_holds_a_lease_until_killed() {
    let Ok(url) = std::env::var("EXPIREMAP_LEASE_CHILD") else {
        return;
    };
    let cache: Cache = NearCache::builder(url)
        .prefix("kl:")
        .staleness_bound(HOUR)
        .lease_ttl(KILLED_LEASE)
        .build()
        .expect("connect");
    let _ = cache.get_or_insert_with("k".to_string(), HOUR, || {
        println!("lease held");
        loop {
            thread::sleep(HOUR);
        }
    });
}

const KILLED_LEASE: Duration = Duration::from_millis(500);

/// A process killed (`SIGKILL`: no release, no store) while its loader
/// holds the lease delays the other processes by at most the lease TTL:
/// the lease it leaves in Redis has at most that long to live, and the
/// next caller waits it out and loads, once.
#[test]
fn a_holder_killed_mid_load_delays_the_others_by_at_most_the_lease_ttl() {
    let s = Server::start();
    /// Kills the child however the test ends.
    struct Child(std::process::Child);
    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Child(
        Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", &child_test_name()])
            .args(["--nocapture", "--test-threads=1"])
            .env("EXPIREMAP_LEASE_CHILD", s.url())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the child process"),
    );
    let out = child.0.stdout.take().unwrap();
    within("the child takes the lease", move || {
        let mut lines = std::io::BufReader::new(out).lines();
        while let Some(line) = lines.next().transpose().unwrap() {
            if line.contains("lease held") {
                return;
            }
        }
        panic!("the child ended without taking the lease");
    });
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    // What it left: its lease, with at most the lease TTL to live.
    let mut raw = s.raw();
    let names: Vec<Vec<u8>> = redis::cmd("KEYS").arg("kl:*").query(&mut raw).unwrap();
    // A lease is the key itself, holding a hash until the load stores.
    let leases: Vec<&Vec<u8>> = names
        .iter()
        .filter(|n| {
            let t: String = redis::cmd("TYPE").arg(n).query(&mut raw).unwrap();
            t == "hash"
        })
        .collect();
    assert_eq!(leases.len(), 1, "{names:?}");
    let left: i64 = redis::cmd("PTTL").arg(leases[0]).query(&mut raw).unwrap();
    let ttl = KILLED_LEASE.as_millis() as i64;
    assert!(0 < left && left <= ttl, "the lease has {left} ms left");
    // Another process waits it out and loads, once.
    let b = single(&s, "kl:", KILLED_LEASE);
    let loads = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&loads);
    let got = within("the takeover", move || {
        b.get_or_insert_with("k".to_string(), HOUR, || {
            counted.fetch_add(1, Ordering::SeqCst);
            2
        })
        .unwrap()
    });
    assert_eq!((got, loads.load(Ordering::SeqCst)), (2, 1));
}

/// A lease that lapses while its holder still loads: the holder's write,
/// when it comes, is refused even though nobody else wrote the key (a plain
/// `SET NX` would land it).
#[test]
fn a_lapsed_lease_refuses_its_holders_late_write() {
    let s = Server::start();
    let lease = Duration::from_millis(100);
    let a = Arc::new(single(&s, "la:", lease));
    let b = single(&s, "la:", lease);
    let (late, go) = held_load(&a, "k", 1);
    // The lease was taken before the load started: this much later it
    // has lapsed on the server, whatever the machine's speed.
    thread::sleep(lease * 3);
    go.send(()).unwrap();
    assert_eq!(
        late.join().unwrap(),
        1,
        "the value is returned to its caller"
    );
    let k = "k".to_string();
    assert_eq!(b.get(&k).unwrap(), None, "the late write landed");
    assert_eq!(a.get(&k).unwrap(), None);
}

/// The holder's `init` fails: the lease is given back at once (the waiter
/// loads without waiting for the lease TTL, an hour here).
#[test]
fn a_failed_load_gives_its_lease_back() {
    let s = Server::start();
    let a = Arc::new(single(&s, "fl:", HOUR));
    let b = Arc::new(single(&s, "fl:", HOUR));
    let (started_tx, started) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let failing = {
        let a = Arc::clone(&a);
        thread::spawn(move || {
            a.try_get_or_insert_with("k".to_string(), HOUR, || {
                started_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                Err(expiremap_redis::Error::Config(
                    "the database is down".into(),
                ))
            })
        })
    };
    within("the failing load starts", move || started.recv().unwrap());
    let waiter = {
        let b = Arc::clone(&b);
        thread::spawn(move || b.get_or_insert_with("k".to_string(), HOUR, || 2).unwrap())
    };
    thread::sleep(Duration::from_millis(20));
    go.send(()).unwrap();
    assert!(failing.join().unwrap().is_err());
    assert_eq!(
        within("the waiter loads", move || waiter.join().unwrap()),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_callers_of_several_processes_load_once() {
    let s = Server::start();
    let caches: Vec<Arc<Cache>> = (0..3).map(|_| Arc::new(single(&s, "as:", HOUR))).collect();
    let loads = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = caches
        .iter()
        .flat_map(|c| (0..4).map(move |_| Arc::clone(c)))
        .map(|c| {
            let loads = Arc::clone(&loads);
            tokio::spawn(async move {
                c.get_or_insert_with_async("k".to_string(), HOUR, async {
                    loads.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    9
                })
                .await
                .unwrap()
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 9);
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
}

#[test]
fn over_a_cluster_one_load_per_hot_key_and_no_stale_set() {
    let c = Cluster::start(3);
    let caches = (0..3).map(|_| clustered(&c, "ch:")).collect();
    let loads = within("the cluster herd", move || herd(caches, 2, 3));
    assert_eq!(loads, vec![1; 3], "loads per round");

    let a = Arc::new(clustered(&c, "cr:"));
    let b = clustered(&c, "cr:");
    for i in 0..3 {
        let key = format!("k{i}");
        let (_, read) = race(&a, &b, &key, |b| {
            b.remove(&key).unwrap();
        });
        assert_eq!(
            read, None,
            "race {i}: the stale load landed after the remove"
        );
    }
}

/// How many reads (`EVAL_RO` of a miss) the server has run.
fn reads(s: &Server) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut s.raw())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_eval_ro:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// The lease holder keeps a near copy of what it stored, as a `put` does:
/// its next read is a near hit, not a read from Redis. (A store by one
/// script came back to its own connection as an invalidation, `NOLOOP`
/// or not, and dropped the copy.) Another process's waiters and copies
/// still hear of the store.
#[test]
fn the_holders_near_copy_outlives_its_store_as_a_puts_does() {
    let s = Server::start();
    let a = single(&s, "own:", HOUR);
    let b = single(&s, "own:", HOUR);
    let (k, p, other) = ("k".to_string(), "p".to_string(), "other".to_string());
    assert_eq!(a.get_or_insert_with(k.clone(), HOUR, || 5).unwrap(), 5);
    a.put(p.clone(), 6, HOUR).unwrap();
    // A round trip after both writes: its reply comes after any
    // invalidation they sent this connection.
    assert_eq!(a.get(&other).unwrap(), None);
    let before = reads(&s);
    assert_eq!(a.peek_near(&k), Some(5), "the holder's copy was dropped");
    assert_eq!(a.get(&k).unwrap(), Some(5));
    assert_eq!(a.peek_near(&p), Some(6), "the put's copy was dropped");
    assert_eq!(a.get(&p).unwrap(), Some(6));
    assert_eq!(
        reads(&s),
        before,
        "a read of a just-written key went to Redis"
    );
    // The other process: reads the stored value, and a later store by A
    // drops its copy (A removes, then loads again).
    assert_eq!(b.get(&k).unwrap(), Some(5));
    a.remove(&k).unwrap();
    eventually("B's copy dropped by the remove", || {
        b.peek_near(&k).is_none().then_some(())
    });
    assert_eq!(b.get(&k).unwrap(), None);
    assert_eq!(a.get_or_insert_with(k.clone(), HOUR, || 7).unwrap(), 7);
    assert_eq!(b.get(&k).unwrap(), Some(7));
    assert_eq!(a.get(&other).unwrap(), None);
    assert_eq!(a.peek_near(&k), Some(7));
}

/// A server error of each step of a lease names the node and the step,
/// as connection errors do: users whose ACL refuses a command.
#[test]
fn server_errors_of_the_lease_steps_name_the_node_and_the_step() {
    let user = |name: &'static str, minus: &'static str| {
        ["--user", name, "on", ">pw", "~*", "&*", "+@all", minus]
    };
    let args: Vec<&str> = [
        user("noeval", "-eval"),
        user("norename", "-rename"),
        user("noset", "-set"),
        user("nomulti", "-multi"),
    ]
    .concat();
    let s = Server::start_with(&args);
    let node = format!("server 127.0.0.1:{}", s.port);
    let as_user = |name: &str| -> Cache {
        NearCache::builder(format!("redis://{name}:pw@127.0.0.1:{}", s.port))
            .prefix("acl:")
            .build()
            .expect("connect")
    };
    let says = |e: expiremap_redis::Error, step: &str, cmd: &str| {
        let m = e.to_string();
        assert!(
            m.contains(&node) && m.contains(step) && m.contains("NOPERM") && m.contains(cmd),
            "{m}"
        );
    };
    let k = "k".to_string();
    let noeval = as_user("noeval");
    says(
        noeval
            .get_or_insert_with(k.clone(), HOUR, || 1)
            .unwrap_err(),
        "lease take (script)",
        "'eval'",
    );
    says(noeval.remove(&k).unwrap_err(), "remove (script)", "'eval'");
    let norename = as_user("norename");
    says(
        norename
            .get_or_insert_with(k.clone(), HOUR, || 1)
            .unwrap_err(),
        "lease store (MULTI/EXEC)",
        "'rename'",
    );
    let noset = as_user("noset");
    says(
        noset.put(k.clone(), 1, HOUR).unwrap_err(),
        "put (SET)",
        "'set'",
    );
    // Without MULTI, a lease holder stores with its one-key script: the
    // load lands, and no call reports an error for a write that landed
    // (a refused MULTI once let the commands after it run alone).
    let nomulti = as_user("nomulti");
    let other = as_user("norename");
    let k2 = "k2".to_string();
    assert_eq!(
        nomulti.get_or_insert_with(k2.clone(), HOUR, || 7).unwrap(),
        7
    );
    assert_eq!(other.get(&k2).unwrap(), Some(7));
    nomulti.put(k2.clone(), 8, HOUR).unwrap();
    // `other`'s near copy of 7 goes with the put's invalidation (within the
    // staleness bound, not at once).
    eventually("the put seen by the other cache", || {
        (other.get(&k2).unwrap() == Some(8)).then_some(())
    });
}

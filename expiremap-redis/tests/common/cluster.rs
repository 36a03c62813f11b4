//! A real Redis Cluster for the tests: three primaries (no replicas) on free
//! loopback ports, each with its own directory and cluster config file,
//! joined with `redis-cli --cluster create`, killed when the guard drops.
//! `cluster-require-full-coverage no`: with a primary down, the other
//! primaries keep serving their slots.

use super::{PATIENCE, Server, free_port, output_within};
use std::ffi::OsStr;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub struct Cluster {
    pub nodes: Vec<Server>,
}

pub fn redis_cli() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

/// How long a `redis-cli --cluster` command may run: a reshard's
/// `MIGRATE`, or a create's wait for the nodes to agree, ends well within
/// it on any machine; one that has not is stuck, and is killed.
const CLI_LIMIT: Duration = Duration::from_secs(2 * PATIENCE.as_secs());

/// `redis-cli args...`, killed after `limit` (see [`output_within`]).
fn cli_within<A: AsRef<OsStr>>(
    args: impl IntoIterator<Item = A>,
    limit: Duration,
) -> Result<Output, String> {
    output_within(Command::new(redis_cli()).args(args), limit)
}

/// `redis-cli --cluster args...`, which must succeed within [`CLI_LIMIT`].
fn cluster_cli(args: &[String]) -> Output {
    let out = cli_within(
        ["--cluster"]
            .iter()
            .map(OsStr::new)
            .chain(args.iter().map(OsStr::new)),
        CLI_LIMIT,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "redis-cli --cluster {}: {}",
        args[0],
        printed(&out)
    );
    out
}

/// What a finished `redis-cli` printed, stdout then stderr.
fn printed(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A server started for a cluster (not joined yet).
fn node() -> Server {
    // The bus port would default to port + 10000, which may not exist for
    // a high port: pick a free one (again on a retry).
    Server::start_with_ports(|| {
        let bus = free_port().to_string();
        [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-port",
            &bus,
            "--cluster-node-timeout",
            "1000",
            "--cluster-require-full-coverage",
            "no",
            "--cluster-allow-reads-when-down",
            "no",
        ]
        .map(String::from)
        .to_vec()
    })
}

impl Cluster {
    /// Starts `n` primaries and joins them; returns once every node reports
    /// `cluster_state:ok`.
    pub fn start(n: usize) -> Cluster {
        // A create that does not end (the nodes never agree on the
        // configuration: `redis-cli` waits for that without a limit) is
        // killed, and new nodes are tried.
        let mut failed = Vec::new();
        for _ in 0..3 {
            let nodes: Vec<Server> = (0..n).map(|_| node()).collect();
            let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
            args.extend(nodes.iter().map(|s| format!("127.0.0.1:{}", s.port)));
            args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
            match cli_within(&args, CLI_LIMIT) {
                Ok(out) => {
                    assert!(
                        out.status.success(),
                        "redis-cli --cluster create: {}",
                        printed(&out)
                    );
                    let c = Cluster { nodes };
                    for i in 0..n {
                        c.wait_ok(i);
                    }
                    return c;
                }
                Err(e) => {
                    eprintln!("a cluster create is stuck, trying new nodes: {e}");
                    failed.push(e);
                }
            }
        }
        panic!("no cluster could be created: {failed:#?}")
    }

    pub fn url(&self, i: usize) -> String {
        self.nodes[i].url()
    }

    /// Every node's `redis://` URL (the seeds).
    pub fn urls(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|i| self.url(i)).collect()
    }

    /// Runs `redis-cli -p <node i> args...` and returns its output.
    pub fn cli(&self, i: usize, args: &[&str]) -> String {
        let port = self.nodes[i].port.to_string();
        let all = ["-h", "127.0.0.1", "-p", &port]
            .into_iter()
            .chain(args.iter().copied());
        let out = cli_within(all, PATIENCE).unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until node `i` says `cluster_state:ok`.
    pub fn wait_ok(&self, i: usize) {
        let t0 = Instant::now();
        while !self
            .cli(i, &["CLUSTER", "INFO"])
            .contains("cluster_state:ok")
        {
            assert!(t0.elapsed() < PATIENCE, "cluster node {i} not ok");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The node ID of node `i`.
    pub fn id(&self, i: usize) -> String {
        self.cli(i, &["CLUSTER", "MYID"]).trim().to_string()
    }

    /// The index of the node that owns `slot`, as node `asker` sees it.
    pub fn owner(&self, asker: usize, slot: u16) -> usize {
        let nodes = self.cli(asker, &["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let port: u16 = f[1]
                .split(['@', ':'])
                .nth(1)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            for r in &f[8.min(f.len())..] {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                if let (Ok(a), Ok(b)) = (a.parse::<u16>(), b.parse::<u16>())
                    && (a..=b).contains(&slot)
                {
                    return self
                        .nodes
                        .iter()
                        .position(|s| s.port == port)
                        .expect("a known node");
                }
            }
        }
        panic!("no owner of slot {slot}")
    }

    /// The keys (as a cache's `String` keys) under `prefix` that node `i`
    /// holds: the prefix, then postcard's one-byte length (keys in the
    /// tests are short), then the bytes.
    pub fn keys_on(&self, i: usize, prefix: &str) -> Vec<String> {
        let mut raw = self.nodes[i].raw();
        let names: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query(&mut raw)
            .expect("KEYS");
        names
            .into_iter()
            .map(|n| String::from_utf8(n[prefix.len() + 1..].to_vec()).expect("a short key"))
            .collect()
    }

    /// The slot of the Redis key `name`.
    pub fn slot_of(&self, name: &[u8]) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(name)
            .query(&mut self.nodes[0].raw())
            .expect("CLUSTER KEYSLOT")
    }

    /// `CONFIG SET name value` on every node.
    pub fn config_set(&self, name: &str, value: &str) {
        for s in &self.nodes {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg(name)
                .arg(value)
                .query(&mut s.raw())
                .expect("CONFIG SET");
        }
    }

    /// Starts one more node and joins it as a primary that owns no slot
    /// (`redis-cli --cluster add-node`); returns its index once every node
    /// knows it.
    pub fn add_node(&mut self) -> usize {
        self.nodes.push(node());
        let i = self.nodes.len() - 1;
        cluster_cli(&[
            "add-node".into(),
            format!("127.0.0.1:{}", self.nodes[i].port),
            format!("127.0.0.1:{}", self.nodes[0].port),
        ]);
        let id = self.id(i);
        let t0 = Instant::now();
        while !(0..self.nodes.len()).all(|j| self.cli(j, &["CLUSTER", "NODES"]).contains(&id)) {
            assert!(t0.elapsed() < PATIENCE, "the new node is not known to all");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.wait_ok(i);
        i
    }

    /// The slots node `i` owns, as node `asker` sees it.
    pub fn slots_of(&self, asker: usize, i: usize) -> Vec<u16> {
        let id = self.id(i);
        let nodes = self.cli(asker, &["CLUSTER", "NODES"]);
        let line = nodes
            .lines()
            .find(|l| l.starts_with(&id))
            .expect("the node in CLUSTER NODES");
        let mut slots = Vec::new();
        for r in line.split(' ').skip(8) {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            if let (Ok(a), Ok(b)) = (a.parse::<u16>(), b.parse::<u16>()) {
                slots.extend(a..=b);
            }
        }
        slots
    }

    /// Hands every slot of node `from` to node `to` with `CLUSTER SETSLOT
    /// ... NODE` on every node, in one transaction per node (a node's view
    /// changes at once), `from` last (the slots must hold no key); returns
    /// once every node sees `from` without slots (it may have become a
    /// replica of `to`).
    pub fn move_all_slots(&self, from: usize, to: usize) {
        let slots = self.slots_of(from, from);
        let to_id = self.id(to);
        let mut order: Vec<usize> = vec![to];
        order.extend((0..self.nodes.len()).filter(|&i| i != to && i != from));
        order.push(from);
        for i in order {
            let mut p = redis::pipe();
            p.atomic();
            for s in &slots {
                p.cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(*s)
                    .arg("NODE")
                    .arg(&to_id)
                    .ignore();
            }
            let r: redis::RedisResult<()> = p.query(&mut self.nodes[i].raw());
            // `from` may have learnt the change by gossip first, and a
            // master that loses its last slot becomes a replica of the
            // node that took them (which refuses SETSLOT).
            if i != from {
                r.expect("CLUSTER SETSLOT");
            }
        }
        let t0 = Instant::now();
        while !(0..self.nodes.len()).all(|i| self.slots_of(i, from).is_empty()) {
            assert!(t0.elapsed() < PATIENCE, "node {from} still owns slots");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis-cli --cluster del-node` of node `i` (which must own no slot),
    /// asked through node `via`: the other nodes forget it, and it is reset
    /// (`CLUSTER RESET SOFT`) but keeps running.
    pub fn del_node(&self, i: usize, via: usize) {
        cluster_cli(&[
            "del-node".into(),
            format!("127.0.0.1:{}", self.nodes[via].port),
            self.id(i),
        ]);
    }

    /// The nodes on which a RESP3 client's last command was `CLUSTER SLOTS`:
    /// where a cache reads its slot table.
    pub fn slot_readers(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                self.cli(i, &["CLIENT", "LIST"])
                    .lines()
                    .any(|l| l.contains("cmd=cluster|slots") && l.contains(" resp=3"))
            })
            .collect()
    }
}

impl Cluster {
    /// `CLUSTER SETSLOT slot IMPORTING` on `to` and `MIGRATING` on `from`:
    /// the slot in migration, as `redis-cli --cluster reshard` starts it
    /// (`from` answers `ASK` for the keys it lacks).
    pub fn start_migration(&self, slot: u16, from: usize, to: usize) {
        self.start_migrations(&[slot], from, to);
    }

    /// [`start_migration`](Self::start_migration) of every slot in
    /// `slots`: one connection to each node, the commands pipelined.
    pub fn start_migrations(&self, slots: &[u16], from: usize, to: usize) {
        let (from_id, to_id) = (self.id(from), self.id(to));
        for (on, state, id) in [(to, "IMPORTING", &from_id), (from, "MIGRATING", &to_id)] {
            let mut p = redis::pipe();
            for s in slots {
                p.cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(*s)
                    .arg(state)
                    .arg(id)
                    .ignore();
            }
            let () = p.query(&mut self.nodes[on].raw()).unwrap();
        }
    }

    /// Moves every key of `slot` from `from` to `to` as `redis-cli
    /// --cluster reshard` does (`MIGRATE ... KEYS`, without `REPLACE`, a
    /// few keys at a time); a key already on `to` fails it (`BUSYKEY`).
    pub fn migrate_keys(&self, slot: u16, from: usize, to: usize) -> Result<(), String> {
        self.migrate_keys_of(&[slot], from, to)
    }

    /// [`migrate_keys`](Self::migrate_keys) of every slot in `slots`, on
    /// one connection.
    pub fn migrate_keys_of(&self, slots: &[u16], from: usize, to: usize) -> Result<(), String> {
        let mut src = self.nodes[from].raw();
        for &slot in slots {
            loop {
                let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(10)
                    .query(&mut src)
                    .map_err(|e| e.to_string())?;
                if keys.is_empty() {
                    break;
                }
                let mut m = redis::cmd("MIGRATE");
                m.arg("127.0.0.1")
                    .arg(self.nodes[to].port)
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS");
                for k in &keys {
                    m.arg(k);
                }
                let r: redis::RedisResult<redis::Value> = m.query(&mut src);
                r.map_err(|e| format!("MIGRATE: {e}"))?;
            }
        }
        Ok(())
    }

    /// `CLUSTER SETSLOT slot NODE <to>` on every node (`to` first): the
    /// migration's end.
    pub fn finish_migration(&self, slot: u16, to: usize) {
        let id = self.id(to);
        let mut order = vec![to];
        order.extend((0..self.nodes.len()).filter(|&i| i != to));
        for i in order {
            let _: () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&id)
                .query(&mut self.nodes[i].raw())
                .unwrap();
        }
    }

    /// A hash tag whose slot is the first that node `i` owns (the slot
    /// `redis-cli --cluster reshard --cluster-from <i> --cluster-slots 1`
    /// moves), and that slot.
    pub fn tag_of_first_slot(&self, i: usize) -> (String, u16) {
        let want = self.slots_of(i, i)[0];
        (0u32..)
            .map(|n| format!("t{n}"))
            .find(|t| crc16(t.as_bytes()) % 16384 == want)
            .map(|t| (t, want))
            .unwrap()
    }

    /// `redis-cli --cluster reshard` of one slot (the first `from` owns) to
    /// `to`, through node `via`: what an operator runs. Its output on
    /// failure.
    pub fn reshard_one(&self, from: usize, to: usize) -> Result<(), String> {
        let args = [
            "--cluster".into(),
            "reshard".into(),
            format!("127.0.0.1:{}", self.nodes[from].port),
            "--cluster-from".into(),
            self.id(from),
            "--cluster-to".into(),
            self.id(to),
            "--cluster-slots".into(),
            "1".into(),
            "--cluster-yes".into(),
            "--cluster-pipeline".into(),
            "2".into(),
        ];
        let out = cli_within(&args, CLI_LIMIT)?;
        let text = printed(&out);
        if out.status.success() && !text.contains("ERR") {
            Ok(())
        } else {
            Err(text)
        }
    }
}

impl Cluster {
    /// Starts one more node, joins it and makes it a replica of node
    /// `of`; returns its index once it has synced.
    pub fn add_replica(&mut self, of: usize) -> usize {
        let i = self.add_node();
        let _: () = redis::cmd("CLUSTER")
            .arg("REPLICATE")
            .arg(self.id(of))
            .query(&mut self.nodes[i].raw())
            .expect("CLUSTER REPLICATE");
        let t0 = Instant::now();
        while !self
            .cli(i, &["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(t0.elapsed() < PATIENCE, "the replica did not sync");
            std::thread::sleep(Duration::from_millis(20));
        }
        i
    }
}

/// CRC16/XMODEM (Redis Cluster's key hash), for choosing test keys.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

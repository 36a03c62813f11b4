//! A real Redis Cluster for the tests: three primaries (no replicas) on free
//! loopback ports, each with its own directory and cluster config file,
//! joined with `redis-cli --cluster create`, killed when the guard drops.
//! `cluster-require-full-coverage no`: with a primary down, the other
//! primaries keep serving their slots.

use super::{PATIENCE, Server, free_port};
use std::process::Command;
use std::time::{Duration, Instant};

pub struct Cluster {
    pub nodes: Vec<Server>,
}

pub fn redis_cli() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

impl Cluster {
    /// Starts `n` primaries and joins them; returns once every node reports
    /// `cluster_state:ok`.
    pub fn start(n: usize) -> Cluster {
        let nodes: Vec<Server> = (0..n)
            .map(|_| {
                // The bus port would default to port + 10000, which may not
                // exist for a high port: pick a free one (again on a retry).
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
            })
            .collect();
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(nodes.iter().map(|s| format!("127.0.0.1:{}", s.port)));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        let out = Command::new(redis_cli())
            .args(&args)
            .output()
            .expect("redis-cli (apt-get install redis-tools)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let c = Cluster { nodes };
        for i in 0..n {
            c.wait_ok(i);
        }
        c
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
        let out = Command::new(redis_cli())
            .args(["-h", "127.0.0.1", "-p", &self.nodes[i].port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
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
}

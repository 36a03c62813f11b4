//! The randomized shadow-map test at any scale (the ExpireMap seed's
//! `test_expire_map`):
//!
//! ```text
//! cargo run --release --example shadow -- --keys 10000 --ops 2000000 \
//!     --threads 4 --max-ttl-ms 20 --seed 42
//! ```
//!
//! Exits non-zero on any mismatch.

#[path = "../tests/common/shadow_mt.rs"]
mod shadow_mt;

use shadow_mt::{Params, run};

fn main() {
    let mut p = Params {
        keys: 10_000,
        ops: 1_000_000,
        threads: 4,
        max_ttl_ms: 20,
        seed: 42,
        evictors: 1,
        progress: true,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || -> u64 {
            let v = it
                .next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
            v.parse()
                .unwrap_or_else(|_| usage(&format!("{flag}: not a number: {v}")))
        };
        match flag.as_str() {
            "--keys" => p.keys = value(),
            "--ops" => p.ops = value(),
            "--threads" => p.threads = value() as usize,
            "--max-ttl-ms" => p.max_ttl_ms = value(),
            "--seed" => p.seed = value(),
            "--quiet" => p.progress = false,
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if p.threads == 0 || p.threads > 15 {
        usage("--threads must be 1..=15");
    }
    if p.keys < 2 * p.threads as u64 {
        usage("--keys must be at least 2 per thread");
    }
    if p.max_ttl_ms == 0 {
        usage("--max-ttl-ms must be at least 1");
    }
    println!(
        "shadow: keys={} ops={} threads={} max-ttl-ms={} seed={}",
        p.keys, p.ops, p.threads, p.max_ttl_ms, p.seed
    );
    let s = run(&p);
    let secs = s.elapsed.as_secs_f64();
    println!(
        "ops {}  in {:.2} s  ({:.2} Mops/s)  mismatches = {}  events seen = {} (expired {})",
        s.ops,
        secs,
        s.ops as f64 / secs / 1e6,
        s.mismatches,
        s.events,
        s.expired_events
    );
    for m in &s.first_mismatches {
        println!("  mismatch: {m}");
    }
    if s.mismatches > 0 {
        std::process::exit(1);
    }
}

fn usage(err: &str) -> ! {
    if !err.is_empty() {
        eprintln!("error: {err}");
    }
    eprintln!(
        "usage: shadow [--keys K] [--ops N] [--threads T] [--max-ttl-ms M] [--seed S] [--quiet]"
    );
    std::process::exit(2);
}

//! Eviction lateness on the real clock, and the idle map's wake-ups.
//!
//! ```text
//! cargo run --release --example lateness [-- --entries 100000 --spread-ms 1000 --shards N]
//! ```
//!
//! Puts N entries with TTLs spread uniformly over the spread, receives every
//! `Expired` event on a subscriber thread, and reports p50/p99/max of
//! (time the event was received - deadline). Then counts the eviction
//! thread's wake-ups over one second of an idle map.

use expiremap::{Cause, Clock, ExpireMap, SystemClock};
use std::time::Duration;

fn main() {
    let mut entries = 100_000u64;
    let mut spread_ms = 1_000u64;
    let mut shards = None;
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let v = pair.get(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            eprintln!("usage: lateness [--entries N] [--spread-ms MS] [--shards N]");
            std::process::exit(2)
        });
        match pair[0].as_str() {
            "--entries" => entries = v,
            "--spread-ms" => spread_ms = v,
            "--shards" => shards = Some(v as usize),
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2)
            }
        }
    }

    let clock = SystemClock::new();
    let mut builder = ExpireMap::<u64, u64>::builder()
        .clock(clock)
        .event_capacity(
            (entries as usize)
                .next_power_of_two()
                .clamp(1 << 17, 1 << 20),
        );
    if let Some(n) = shards {
        builder = builder.shards(n);
    }
    let map = builder.build();
    let mut sub = map.subscribe().expect("subscribe");
    let receiver = std::thread::spawn(move || {
        let mut late = Vec::with_capacity(entries as usize);
        while late.len() < entries as usize {
            let e = sub.recv().expect("no lag with a ring larger than the run");
            assert_eq!(e.cause, Cause::Expired);
            let received = clock.now();
            late.push(received.saturating_sub(e.deadline().as_nanos() as u64));
        }
        late
    });
    let mut x = 0x2545_F491_4F6C_DD1D_u64;
    for k in 0..entries {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let ttl = Duration::from_micros(1 + x % (spread_ms * 1000));
        map.put(k, k, ttl);
    }
    let mut late = receiver.join().unwrap();
    late.sort_unstable();
    let pct = |p: f64| late[((late.len() - 1) as f64 * p) as usize] as f64 / 1e6;
    println!(
        "lateness over {} entries, TTLs spread over {} ms, {} shards (interval 4 ms, \
         precision 1 ms):",
        entries,
        spread_ms,
        shards.map_or_else(|| "default".to_string(), |n| n.to_string())
    );
    println!(
        "  p50 {:.3} ms   p99 {:.3} ms   max {:.3} ms   (target p99 <= 7 ms)",
        pct(0.50),
        pct(0.99),
        late[late.len() - 1] as f64 / 1e6
    );
    println!("  map after: len {}, {:?}", map.len(), map.stats());

    let idle: ExpireMap<u64, u64> = ExpireMap::new();
    std::thread::sleep(Duration::from_secs(1));
    let before = idle.stats().wakeups;
    println!("idle map: {} eviction-thread wake-ups over 1 s", before);
    idle.put(1, 1, Duration::from_secs(3600));
    std::thread::sleep(Duration::from_secs(1));
    println!(
        "map holding one entry due in 1 h: {} wake-ups over 1 s",
        idle.stats().wakeups - before
    );
}

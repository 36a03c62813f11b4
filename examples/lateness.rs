//! Eviction lateness on the real clock, and the idle map's wake-ups.
//!
//! ```text
//! cargo run --release --example lateness [-- --entries 100000 --spread-ms 1000 --shards N --worst K]
//! ```
//!
//! Puts N entries with TTLs spread uniformly over the spread, receives every
//! `Expired` event on a subscriber thread, and reports p50/p99/max of
//! (time the event was received - deadline). With `--worst K` it also
//! lists the K 10 ms windows of deadlines whose events were latest, beside
//! the time the puts ended: what happens at a window (a table growing
//! under a put, a timer cascade) shows in when it recurs. Then counts the
//! eviction thread's wake-ups over one second of an idle map.

use expiremap::{Cause, Clock, ExpireMap, SystemClock};
use std::time::Duration;

fn main() {
    let mut entries = 100_000u64;
    let mut spread_ms = 1_000u64;
    let mut shards = None;
    let mut worst = 0usize;
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let v = pair.get(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            eprintln!("usage: lateness [--entries N] [--spread-ms MS] [--shards N] [--worst K]");
            std::process::exit(2)
        });
        match pair[0].as_str() {
            "--entries" => entries = v,
            "--spread-ms" => spread_ms = v,
            "--shards" => shards = Some(v as usize),
            "--worst" => worst = v as usize,
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
    // A thread that sleeps 1 ms at a time and notes how far past that it
    // woke: a machine that stops running threads for a while (a busy
    // host under a VM) shows here as well as in the events, while the
    // map's own delays show only in the events.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut worst = (0u64, 0u64); // (overslept ns, at)
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let before = clock.now();
                std::thread::sleep(Duration::from_millis(1));
                let after = clock.now();
                let over = (after - before).saturating_sub(1_000_000);
                if over > worst.0 {
                    worst = (over, after);
                }
            }
            worst
        })
    };
    let receiver = std::thread::spawn(move || {
        // (deadline, lateness) in ns, per event.
        let mut late = Vec::with_capacity(entries as usize);
        while late.len() < entries as usize {
            let e = sub.recv().expect("no lag with a ring larger than the run");
            assert_eq!(e.cause, Cause::Expired);
            let received = clock.now();
            let deadline = e.deadline().as_nanos() as u64;
            late.push((deadline, received.saturating_sub(deadline)));
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
    let puts_done = clock.now();
    let by_deadline = receiver.join().unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (overslept, overslept_at) = probe.join().unwrap();
    let mut late: Vec<u64> = by_deadline.iter().map(|&(_, l)| l).collect();
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
        "  p50 {:.3} ms   p99 {:.3} ms   max {:.3} ms   (target: p99 <= 5 ms, max <= 10 ms)",
        pct(0.50),
        pct(0.99),
        late[late.len() - 1] as f64 / 1e6
    );
    // For the charts (`benches/charts.sh run`): the distribution.
    if let Some(dir) = std::env::var_os("BENCH_CSV_DIR") {
        use std::io::Write;
        let path = std::path::Path::new(&dir).join("lateness.csv");
        let new = !path.exists();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("BENCH_CSV_DIR/lateness.csv");
        if new {
            writeln!(f, "shards,percentile,ms").unwrap();
        }
        let label = shards.map_or_else(|| "default".to_string(), |n| n.to_string());
        for p in [10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 100.0] {
            writeln!(f, "{label},{p},{:.3}", pct(p / 100.0)).unwrap();
        }
    }
    println!("  map after: len {}, {:?}", map.len(), map.stats());
    println!(
        "  a 1 ms sleep on another thread overslept by at most {:.1} ms (woke at {:.0} ms)",
        overslept as f64 / 1e6,
        overslept_at as f64 / 1e6
    );
    if worst > 0 {
        const WINDOW: u64 = 10_000_000;
        let mut windows = std::collections::BTreeMap::<u64, (u64, u64)>::new();
        for &(deadline, l) in &by_deadline {
            let w = windows.entry(deadline / WINDOW).or_default();
            w.0 = w.0.max(l);
            w.1 += 1;
        }
        let mut ranked: Vec<_> = windows.into_iter().collect();
        ranked.sort_by_key(|&(_, (max, _))| std::cmp::Reverse(max));
        ranked.truncate(worst);
        ranked.sort_unstable();
        println!(
            "  puts ended at {:.0} ms; the {} latest 10 ms windows of deadlines:",
            puts_done as f64 / 1e6,
            ranked.len()
        );
        for (w, (max, n)) in ranked {
            println!(
                "    deadlines {:>5}-{:<5} ms: {:>5} events, max {:.1} ms late",
                w * 10,
                w * 10 + 10,
                n,
                max as f64 / 1e6
            );
        }
    }

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

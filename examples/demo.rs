//! The main demonstration: put/get with TTLs, a subscriber printing events as
//! entries expire on their own, and shutdown notifications.
//!
//! ```text
//! cargo run --example demo
//! ```

use expiremap::{Cause, ExpireMap, RecvError};
use std::time::{Duration, Instant};

fn main() {
    let map: ExpireMap<String, String> = ExpireMap::new();
    let mut events = map
        .subscribe()
        .expect("a fresh map has room for subscribers");
    let start = Instant::now();

    // A subscriber on its own thread prints every event as it arrives.
    let printer = std::thread::spawn(move || {
        loop {
            match events.recv() {
                Ok(e) => println!(
                    "[{:>4} ms] {:<8} {} = {}  (deadline +{} ms, {:.1} ms late)",
                    start.elapsed().as_millis(),
                    format!("{:?}", e.cause),
                    e.key,
                    e.value,
                    e.deadline().as_millis(),
                    e.lateness().as_secs_f64() * 1e3,
                ),
                Err(RecvError::Lagged(n)) => println!("missed {n} events"),
                Err(RecvError::Closed) => {
                    println!(
                        "[{:>4} ms] map dropped: event stream closed",
                        start.elapsed().as_millis()
                    );
                    return;
                }
            }
        }
    });

    let ms = Duration::from_millis;
    map.put("session:alice".into(), "token-a".into(), ms(50));
    map.put("session:bob".into(), "token-b".into(), ms(120));
    map.put("config".into(), "v1".into(), Duration::from_secs(3600));
    println!("get session:alice -> {:?}", map.get("session:alice"));
    println!(
        "ttl session:bob   -> {:?}",
        map.ttl("session:bob").map(|d| d.as_millis())
    );

    // Overwrite returns the previous live value; touch extends a deadline.
    let old = map.put("config".into(), "v2".into(), Duration::from_secs(3600));
    println!("put config v2      -> previous {old:?}");
    assert!(map.touch("session:bob", ms(150)));

    // Nobody touches the map now: the eviction thread publishes the
    // expirations at their deadlines on its own.
    std::thread::sleep(ms(300));
    println!(
        "after 300 ms: len = {}, get session:alice -> {:?}",
        map.len(),
        map.get("session:alice")
    );
    assert_eq!(map.get("session:alice"), None);

    // Dropping the map stops and joins the eviction thread; what is still
    // held is published with Cause::Shutdown, then subscribers see Closed.
    println!("dropping the map (config is still live)");
    drop(map);
    printer.join().unwrap();
    let _ = Cause::Shutdown;
}

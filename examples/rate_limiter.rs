//! A fixed-window rate limiter on `ExpireMap::update`: each client may make
//! `LIMIT` requests per window; the window starts at its first request and
//! its counter expires with it. Four threads hammer three clients at once;
//! no request is counted twice or lost.
//!
//! ```text
//! cargo run --example rate_limiter
//! ```

use expiremap::{ExpireMap, Update};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const LIMIT: u32 = 100;
const WINDOW: Duration = Duration::from_secs(3600);

/// Counts one request of `client` in its window; `true` if it is allowed.
fn allow(counts: &ExpireMap<&'static str, u32>, client: &'static str) -> bool {
    let n = counts.update(client, |seen| match seen {
        // First request of a window: the window starts now.
        None => Update::Set(1, WINDOW),
        // Later ones count within the same window (its deadline is kept).
        Some((n, _left)) => Update::SetKeepTtl(n + 1),
    });
    n.is_some_and(|n| n <= LIMIT)
}

fn main() {
    let counts = Arc::new(ExpireMap::<&'static str, u32>::new());
    let allowed = Arc::new(AtomicU32::new(0));
    let clients = ["alice", "bob", "carol"];
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (counts, allowed) = (counts.clone(), allowed.clone());
            std::thread::spawn(move || {
                for i in 0..150 {
                    if allow(&counts, clients[i % 3]) {
                        allowed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // 600 requests, 200 per client: exactly LIMIT of each get through.
    for c in clients {
        let n = counts.get(c).unwrap();
        let left = counts.ttl(c).unwrap();
        println!("{c}: {n} requests in this window, {left:?} until it resets");
        assert_eq!(n, 200);
    }
    let allowed = allowed.load(Ordering::Relaxed);
    println!("allowed {allowed} of 600 (limit {LIMIT} per client per window)");
    assert_eq!(allowed, 3 * LIMIT);
}

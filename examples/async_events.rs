//! A tokio task consumes a map's events with `Subscriber::recv_async` while
//! a writer thread and a writer task put entries with short TTLs.
//!
//! ```sh
//! cargo run --example async_events
//! ```
//!
//! The map runs on the system clock with its background eviction thread,
//! which publishes each expiry as it happens and wakes the consumer task;
//! the task never blocks a runtime thread. Once the writers are done, the
//! map is dropped: what is still live leaves as `Shutdown`, and the
//! consumer sees `Closed` and ends. Every value put is accounted for
//! exactly once (received or counted in a `Lagged(n)`). Runs in well under
//! a second on tokio's single-threaded runtime.

use expiremap::{Cause, ExpireMap, RecvError, Subscriber};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Entries each writer puts.
const PER_WRITER: u32 = 2_000;

/// What the consumer saw.
#[derive(Debug, Default)]
struct Tally {
    expired: u64,
    shutdown: u64,
    other: u64,
    lost: u64,
    max_lateness: Duration,
}

/// Receives until the map is gone.
async fn consume(mut events: Subscriber<u32, u64>) -> Tally {
    let mut t = Tally::default();
    loop {
        match events.recv_async().await {
            Ok(e) => match e.cause {
                Cause::Expired => {
                    t.expired += 1;
                    t.max_lateness = t.max_lateness.max(e.lateness());
                }
                Cause::Shutdown => t.shutdown += 1,
                _ => t.other += 1,
            },
            Err(RecvError::Lagged(n)) => t.lost += n,
            Err(RecvError::Closed) => return t,
        }
    }
}

/// TTL of the `i`-th put: 1 to 16 ms.
fn ttl(i: u32) -> Duration {
    Duration::from_millis(1 + u64::from(i % 16))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let started = Instant::now();
    let map = Arc::new(
        ExpireMap::<u32, u64>::builder()
            .event_capacity(1 << 13)
            .build(),
    );
    let consumer = tokio::spawn(consume(map.subscribe().expect("a free subscriber slot")));

    // A writer thread: keys 0..PER_WRITER, in bursts.
    let thread_writer = {
        let map = Arc::clone(&map);
        std::thread::spawn(move || {
            for i in 0..PER_WRITER {
                map.put(i, u64::from(i), ttl(i));
                if i % 200 == 199 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        })
    };
    // A writer task: keys PER_WRITER.., yielding to the consumer between
    // bursts (it shares the runtime's only thread with it).
    let task_writer = {
        let map = Arc::clone(&map);
        tokio::spawn(async move {
            for i in 0..PER_WRITER {
                map.put(PER_WRITER + i, u64::from(i), ttl(i));
                if i % 200 == 199 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        })
    };
    task_writer.await.expect("writer task");
    thread_writer.join().expect("writer thread");

    // Let most entries expire on their own, then drop the map: the rest
    // leave as Shutdown and the consumer's stream closes.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let map = Arc::into_inner(map).expect("the writers are done");
    drop(map);
    let t = consumer.await.expect("consumer task");

    let put = u64::from(2 * PER_WRITER);
    println!(
        "put {put}: {} expired (max lateness {:?}), {} at shutdown, {} lost to lag, in {:?}",
        t.expired,
        t.max_lateness,
        t.shutdown,
        t.lost,
        started.elapsed()
    );
    assert_eq!(t.other, 0, "only evictions are published by default");
    assert_eq!(
        t.expired + t.shutdown + t.lost,
        put,
        "every value accounted for once"
    );
}

//! The `metrics` feature: two named caches, a small workload, and the
//! Prometheus scrape it renders (Micrometer's cache names, so Caffeine
//! dashboards read it unchanged).
//!
//! ```text
//! cargo run --release --features metrics --example metrics
//! ```
//!
//! `users` (loads, refresh ahead, expiries, a removal, a subscriber that
//! falls behind) and `sessions` (a bound of 4 entries that pushes values
//! out). The counts are checked against the workload before the scrape is
//! printed, so a wrong count fails the run.

use expiremap::{ExpireMap, TryRecvError};
use metrics_exporter_prometheus::PrometheusBuilder;
use std::thread::sleep;
use std::time::Duration;

fn main() {
    // No HTTP listener: the handle renders the scrape itself.
    let scrape = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder");
    let minute = Duration::from_secs(60);
    let ms = Duration::from_millis;

    let users = ExpireMap::<u32, String>::builder()
        .metrics("users")
        .refresh_after(ms(30))
        .event_capacity(2)
        .build();
    let mut events = users.subscribe().expect("one subscriber");
    for k in 1..=4 {
        users.put(k, format!("user {k}"), minute);
    }
    for k in 1..=6 {
        users.get(&k); // 4 hits, 2 misses
    }
    // A load (a miss; its value stored: `cache_puts_total` counts it) and a
    // failed load (a miss).
    users.get_or_insert_with(10, minute, || {
        sleep(ms(10));
        "user 10".to_string()
    });
    let failed = users.try_get_or_insert_with(11, minute, || {
        sleep(ms(5));
        Err("user service down")
    });
    assert!(failed.is_err());
    // Three values that expire in 20 ms, evicted as they expire:
    // three `Expired` events into a ring of two, which the subscriber,
    // reading only now, finds one behind.
    for k in 20..23 {
        users.put(k, format!("temp {k}"), ms(20));
    }
    sleep(ms(60));
    users.evict_expired(); // whatever the thread has not done yet
    assert_eq!(events.try_recv().unwrap_err(), TryRecvError::Lagged(1));
    // Keys 1 and 2 are now older than 30 ms: each loading call returns
    // the current value (a hit) and reloads it, once with success (its
    // store is counted in `cache_puts_total`), once with an error.
    users.get_or_insert_with(1, minute, || "user 1, reloaded".to_string());
    let kept = users.try_get_or_insert_with(2, minute, || Err("user service down"));
    assert_eq!(kept.as_deref(), Ok("user 2"));
    users.remove(&3);

    let sessions = ExpireMap::<u32, u32>::builder()
        .metrics("sessions")
        .max_entries(4)
        .build();
    for k in 0..6 {
        sessions.put(k, k, minute); // 2 of the 6 over the bound
    }

    let u = users.stats();
    assert_eq!((u.hits, u.misses), (6, 4), "users: {u:?}");
    assert_eq!(
        (u.evicted, u.refreshes, u.refresh_failures),
        (3, 2, 1),
        "users: {u:?}"
    );
    assert_eq!((users.len(), u.events_lost), (4, 1), "users: {u:?}");
    assert_eq!(sessions.stats().size_evicted, 2);
    assert_eq!(sessions.len(), 4);

    // The eviction threads publish at least once a second; publish now for
    // a current scrape.
    users.publish_metrics();
    sessions.publish_metrics();
    print!("{}", scrape.render());
}

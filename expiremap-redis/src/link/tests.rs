use super::*;
use std::sync::mpsc;
use std::thread;

/// A link that has lost its connection before any attempt to reconnect
/// failed (no error kept, not closed): `settled` says "reconnecting". It
/// once locked `last_error` twice and hung, and with it the supervisor and
/// every later call (a test that killed its server right after `build`).
#[test]
fn settled_without_a_failed_attempt_says_reconnecting() {
    let cfg = Config::from_url("redis://127.0.0.1:1").expect("a URL");
    let near = Arc::new(ExpireMap::<String, u64>::builder().build());
    let link = Shared::new(near, cfg);
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let r = link.settled().map_err(|e| e.map(|e| e.to_string()));
        let _ = tx.send(r);
    });
    let r = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("settled() never returned");
    match r {
        Err(Some(m)) => assert!(m.contains("reconnecting"), "{m}"),
        other => panic!("{other:?}"),
    }
}

//! What broke: publishing held a read guard on the map's sender slot while
//! sending. A send can drop the oldest event in the ring; if that event's value
//! owned the last map handle, the map's shutdown ran inside the send, on the
//! eviction thread, and took the same slot's write lock: a self-deadlock.
//! Fixed by sending through a cloned sender with no guard held.

use expiremap::{ExpireMap, ManualClock};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

type SelfMap = ExpireMap<u32, Arc<Holder>>;

struct Holder {
    map: Mutex<Option<SelfMap>>,
    done: Mutex<Option<mpsc::Sender<()>>>,
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.map.lock().unwrap().take());
        if let Some(tx) = self.done.lock().unwrap().take() {
            let _ = tx.send(());
        }
    }
}

fn holder(map: Option<SelfMap>, done: Option<mpsc::Sender<()>>) -> Arc<Holder> {
    Arc::new(Holder {
        map: Mutex::new(map),
        done: Mutex::new(done),
    })
}

#[test]
fn map_dropped_by_an_event_evicted_from_the_ring() {
    let clock = ManualClock::new();
    let map: SelfMap = ExpireMap::builder()
        .clock(clock.clone())
        .event_capacity(1)
        .shards(1) // one shard, one bin: evicted and published in put order
        .build();
    let sub = map.subscribe().unwrap(); // never reads: the ring overflows
    let (tx, rx) = mpsc::channel();
    let ms = Duration::from_millis(1);
    let owner = holder(None, Some(tx));
    map.put(1, owner.clone(), ms);
    map.put(2, holder(None, None), ms);
    map.put(3, holder(None, None), ms);
    *owner.map.lock().unwrap() = Some(map);
    drop(owner); // the map now lives only inside the value of key 1
    clock.advance(5 * ms); // evict 1, 2, 3: sending 2 or 3 drops event 1
    rx.recv_timeout(Duration::from_secs(120))
        .expect("map drop inside a publish hung");
    drop(sub);
}

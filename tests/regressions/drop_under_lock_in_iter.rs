//! What broke: when `V::clone` panicked in `iter()` or `retain`, the key
//! already cloned for that entry was dropped by the unwinding inside the
//! locked span: `K::drop` ran under the shard's read lock, and a `Drop`
//! that writes to the map deadlocked on its own lock. Fixed by catching
//! the value's clone panic, releasing the lock, then dropping the key and
//! resuming the panic.

use crate::common::within;
use expiremap::ExpireMap;
use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

type Map = ExpireMap<Key, Poison>;

thread_local! {
    /// The map a cloned key writes to when dropped, on this thread.
    static MAP: RefCell<Option<Arc<Map>>> = const { RefCell::new(None) };
}

/// A key whose clones write to the map when dropped.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Key {
    id: u32,
    clone: bool,
}

impl Clone for Key {
    fn clone(&self) -> Self {
        Key {
            id: self.id,
            clone: true,
        }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if self.clone {
            let map = MAP.with(|m| m.borrow().clone());
            if let Some(map) = map {
                let id = 1_000 + self.id;
                map.put(
                    Key { id, clone: false },
                    Poison(id),
                    Duration::from_secs(60),
                );
            }
        }
    }
}

/// A value whose clone panics for 13.
#[derive(Debug)]
struct Poison(u32);

impl Clone for Poison {
    fn clone(&self) -> Self {
        assert_ne!(self.0, 13, "value clone panics");
        Poison(self.0)
    }
}

fn filled() -> Arc<Map> {
    let map: Arc<Map> = Arc::new(ExpireMap::builder().shards(1).build());
    for id in 0..20 {
        map.put(
            Key { id, clone: false },
            Poison(id),
            Duration::from_secs(60),
        );
    }
    map
}

/// Runs `op` over a filled map on a thread whose cloned keys write to the
/// map when dropped: `op` panics with the value's clone (not a deadlock),
/// the key cloned for that entry was dropped after the lock (its put
/// landed), and the map is intact.
fn clone_panic_in(op: fn(&Map)) {
    let map = filled();
    let m = map.clone();
    let r = within(60, move || {
        MAP.with(|slot| *slot.borrow_mut() = Some(m.clone()));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op(&m)));
        MAP.with(|slot| slot.borrow_mut().take());
        r.is_err()
    });
    assert!(
        r.expect("no deadlock"),
        "the clone's panic reaches the caller"
    );
    assert!(map.contains_key(&Key {
        id: 1_013,
        clone: false
    }));
    assert_eq!(
        map.get(&Key {
            id: 3,
            clone: false
        })
        .map(|v| v.0),
        Some(3)
    );
}

#[test]
fn a_value_clone_panic_in_iter_drops_the_key_after_the_lock() {
    clone_panic_in(|m| {
        m.iter().count();
    });
}

#[test]
fn a_value_clone_panic_in_retain_drops_the_key_after_the_lock() {
    clone_panic_in(|m| m.retain(|_, _| true));
}

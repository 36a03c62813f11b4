//! What broke: loads in flight were registered under the key's 64-bit hash,
//! not the key. With a `Hash` that covers only some of the fields `Eq`
//! compares (legal), or colliding hashes, an `init` for key A that loaded
//! key B of the same hash panicked with "asked the map for its own key",
//! and a `put` of B during A's load discarded A's loaded value. Fixed by
//! finding flights by hash, then `Eq`, in the key's shard.

use crate::common::manual;
use expiremap::ExpireMap;
use std::hash::{Hash, Hasher};
use std::time::Duration;

const MINUTE: Duration = Duration::from_secs(60);

/// Two keys with the same `id` hash alike and differ by `tag`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Partial {
    id: u32,
    tag: u32,
}

impl Hash for Partial {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.id.hash(h);
    }
}

fn key(id: u32, tag: u32) -> Partial {
    Partial { id, tag }
}

#[test]
fn an_init_may_load_another_key_of_the_same_hash() {
    let (map, _clock) = manual::<Partial, u32>();
    let v = map.get_or_insert_with(key(1, 0), MINUTE, || {
        map.get_or_insert_with(key(1, 1), MINUTE, || 10) + 1
    });
    assert_eq!(v, 11);
    assert_eq!(map.get(&key(1, 0)), Some(11));
    assert_eq!(map.get(&key(1, 1)), Some(10));
}

#[test]
fn a_put_of_another_key_of_the_same_hash_does_not_discard_a_load() {
    let (map, _clock) = manual::<Partial, u32>();
    let v = map.get_or_insert_with(key(2, 0), MINUTE, || {
        map.put(key(2, 1), 20, MINUTE);
        map.remove(&key(2, 2));
        7
    });
    assert_eq!(v, 7);
    assert_eq!(map.get(&key(2, 0)), Some(7), "the load was stored");
    assert_eq!(map.get(&key(2, 1)), Some(20));
    // A put of the key itself still wins over its load.
    let v = map.get_or_insert_with(key(3, 0), MINUTE, || {
        map.put(key(3, 0), 30, MINUTE);
        3
    });
    assert_eq!((v, map.get(&key(3, 0))), (3, Some(30)));
}

/// The same through a hasher under which every key collides.
#[test]
fn loads_of_colliding_keys_are_told_apart_by_eq() {
    #[derive(Clone, Default)]
    struct Constant;
    impl std::hash::BuildHasher for Constant {
        type Hasher = Zero;
        fn build_hasher(&self) -> Zero {
            Zero
        }
    }
    struct Zero;
    impl Hasher for Zero {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, _: &[u8]) {}
    }
    let map = ExpireMap::<u32, u32>::builder()
        .hasher(Constant)
        .background_eviction(false)
        .build();
    let v = map.get_or_insert_with(1, MINUTE, || {
        map.put(3, 3, MINUTE);
        map.get_or_insert_with(2, MINUTE, || 2) * 10
    });
    assert_eq!(v, 20);
    assert_eq!(
        (map.get(&1), map.get(&2), map.get(&3)),
        (Some(20), Some(2), Some(3))
    );
}

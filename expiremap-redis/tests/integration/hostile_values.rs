//! Bytes anyone could have written under the prefix, shaped to hurt: a
//! value or a key name nested far deeper than any real one. Each is a
//! codec error (or, as a key name, skipped), never a stack overflow that
//! aborts the process. In a file of its own: before the fix, the abort
//! took the whole test binary down.

use crate::common::{Server, eventually, within};
use expiremap_redis::{Error, NearCache};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Tree {
    Leaf,
    Node(Box<Tree>),
}

fn deep(n: usize) -> Tree {
    (0..n).fold(Tree::Leaf, |t, _| Tree::Node(Box::new(t)))
}

/// postcard of `deep(n)`: n times the variant `Node` (1), then `Leaf` (0).
fn deep_bytes(n: usize) -> Vec<u8> {
    let mut b = vec![1u8; n];
    b.push(0);
    b
}

#[test]
fn a_value_nested_30000_deep_is_a_codec_error() {
    let s = Server::start();
    let c: Arc<NearCache<String, Tree>> = Arc::new(
        NearCache::builder(s.url())
            .prefix("h:")
            .staleness_bound(HOUR)
            .build()
            .unwrap(),
    );
    let mut raw = s.raw();
    // "h:" + postcard("v"), 30 KB nested 30,000 deep.
    let _: () = redis::cmd("SET")
        .arg(b"h:\x01v".as_slice())
        .arg(deep_bytes(30_000))
        .query(&mut raw)
        .unwrap();
    let c2 = Arc::clone(&c);
    match within("get of a deep value", move || c2.get(&"v".to_string())) {
        Err(Error::Codec(e)) => assert!(!e.encoding && e.message.contains("deep"), "{e}"),
        other => panic!("expected a codec error, got {other:?}"),
    }
    let c2 = Arc::clone(&c);
    let r = within("remove of a deep value", move || {
        c2.remove(&"v".to_string())
    });
    assert!(matches!(r, Err(Error::Codec(_))), "{r:?}");
    // Real values nest much less, and go through.
    c.put("w".into(), deep(100), HOUR).unwrap();
    let d: NearCache<String, Tree> = NearCache::builder(s.url())
        .prefix("h:")
        .staleness_bound(HOUR)
        .build()
        .unwrap();
    assert_eq!(d.get(&"w".to_string()).unwrap(), Some(deep(100)));
    assert!(c.is_connected());
    assert_eq!(c.connections(), 1);
}

#[test]
fn a_key_name_nested_30000_deep_is_skipped_by_invalidations() {
    let s = Server::start();
    let a: NearCache<Tree, u64> = NearCache::builder(s.url())
        .prefix("n:")
        .staleness_bound(HOUR)
        .build()
        .unwrap();
    let b: NearCache<Tree, u64> = NearCache::builder(s.url())
        .prefix("n:")
        .staleness_bound(HOUR)
        .build()
        .unwrap();
    a.put(deep(3), 1, HOUR).unwrap();
    assert_eq!(b.get(&deep(3)).unwrap(), Some(1));
    let mut name = b"n:".to_vec();
    name.extend(deep_bytes(30_000));
    let mut raw = s.raw();
    let _: () = redis::cmd("SET")
        .arg(name)
        .arg(b"\x01".as_slice())
        .query(&mut raw)
        .unwrap();
    a.put(deep(3), 2, HOUR).unwrap();
    eventually("b's copy invalidated after the deep name", || {
        (b.peek_near(&deep(3)) != Some(1)).then_some(())
    });
    assert_eq!(b.get(&deep(3)).unwrap(), Some(2));
    assert_eq!(b.connections(), 1);
}

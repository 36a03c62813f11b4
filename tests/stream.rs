//! The `Stream` impl of a map's events (feature `stream`; `.ci/test.sh` runs
//! it): lag surfaces as an item, the stream ends when the map is dropped.
#![cfg(feature = "stream")]

mod common;

use common::{MS, let_others_run, runtime, with_eviction_thread};
use expiremap::Cause;

#[test]
fn the_stream_surfaces_lag_and_ends_when_the_map_is_dropped() {
    use expiremap::broadcast::Lagged;
    use futures_core::Stream;
    use std::pin::Pin;

    async fn next<S: Stream + Unpin>(s: &mut S) -> Option<S::Item> {
        std::future::poll_fn(|cx| Pin::new(&mut *s).poll_next(cx)).await
    }

    let (map, clock) = with_eviction_thread(2);
    let mut events = map.subscribe().unwrap();
    runtime().block_on(async move {
        for k in 0..5 {
            map.put(k, k, MS);
        }
        clock.advance(2 * MS);
        map.evict_expired();
        let reader = tokio::spawn(async move {
            let mut items = Vec::new();
            while let Some(item) = next(&mut events).await {
                items.push(item.map(|e| e.cause));
            }
            items
        });
        let_others_run().await;
        drop(map);
        let items = reader.await.unwrap();
        assert_eq!(
            items,
            [Err(Lagged(3)), Ok(Cause::Expired), Ok(Cause::Expired)]
        );
    });
}

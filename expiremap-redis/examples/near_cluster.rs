//! Two near caches over a Redis Cluster, standing for two machines, with
//! blocking and async calls.
//!
//! Start a cluster (three primaries here), then run the example with some
//! of its nodes as seeds:
//!
//! ```text
//! for p in 7000 7001 7002; do
//!   mkdir -p /tmp/c$p && redis-server --port $p --cluster-enabled yes \
//!     --cluster-config-file nodes.conf --dir /tmp/c$p --save '' --appendonly no &
//! done
//! redis-cli --cluster create 127.0.0.1:7000 127.0.0.1:7001 127.0.0.1:7002 \
//!   --cluster-replicas 0 --cluster-yes
//! cargo run -p expiremap-redis --example near_cluster redis://127.0.0.1:7000 redis://127.0.0.1:7001
//! ```
//!
//! The seeds come from the arguments, else `REDIS_CLUSTER` (space
//! separated), else `redis://127.0.0.1:7000`. Keys go under the prefix
//! `example-cluster:`.

use expiremap_redis::{Error, NearCache};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

fn main() -> Result<(), Error> {
    let mut seeds: Vec<String> = std::env::args().skip(1).collect();
    if seeds.is_empty() {
        seeds = std::env::var("REDIS_CLUSTER")
            .map(|s| s.split_whitespace().map(String::from).collect())
            .unwrap_or_else(|_| vec!["redis://127.0.0.1:7000".to_string()]);
    }
    let open = || {
        NearCache::<String, u64>::cluster_builder(seeds.iter().map(String::as_str))
            .prefix("example-cluster:")
            .max_entries(10_000)
            .build()
    };
    let (web1, web2) = (open()?, open()?);
    println!(
        "two caches on the cluster of {seeds:?}, staleness bound {:?}",
        web1.staleness_bound()
    );

    // Keys spread over every node's slots.
    let minute = Duration::from_secs(60);
    for i in 0..100 {
        web1.put(format!("user{i}"), i, minute)?;
    }
    println!("web1 put user0..user99 (routed by slot over the primaries)");
    let mut sum = 0;
    for i in 0..100 {
        sum += web2.get(&format!("user{i}"))?.unwrap_or(0);
    }
    println!(
        "web2 read them all (sum {sum}); now near copies: {}",
        web2.near_len()
    );

    // A write by web1 drops web2's near copy, whichever node owns the key.
    let t0 = Instant::now();
    web1.put("user7".to_string(), 700, minute)?;
    while web2.peek_near(&"user7".to_string()).is_some() {
        if t0.elapsed() > Duration::from_secs(5) {
            return Err(Error::Protocol("no invalidation came".into()));
        }
        thread::yield_now();
    }
    println!(
        "web1 put user7=700; web2's near copy dropped after {:?}; web2 reads {:?}",
        t0.elapsed(),
        web2.get(&"user7".to_string())?
    );

    // The async calls, here on a minimal executor (any will do: the
    // library brings no runtime).
    let v = block_on(async {
        web2.put_async("async".to_string(), 1, minute).await?;
        web2.get_or_insert_with_async("lazy".to_string(), minute, async { 42 })
            .await
    })?;
    println!("async: put, then get_or_insert_with_async = {v}");

    for i in 0..100 {
        web1.remove(&format!("user{i}"))?;
    }
    web1.remove(&"async".to_string())?;
    web1.remove(&"lazy".to_string())?;
    println!("cleaned up; done");
    Ok(())
}

/// Runs a future on this thread, parking between polls.
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(&waker)) {
            return v;
        }
        thread::park();
    }
}

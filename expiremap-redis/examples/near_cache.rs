//! Two near caches in front of one Redis, standing for two machines.
//!
//! Start a server, then run the example:
//!
//! ```text
//! redis-server --port 6379 --save '' --appendonly no --notify-keyspace-events Ex &
//! cargo run -p expiremap-redis --example near_cache [redis://127.0.0.1:6379]
//! ```
//!
//! The URL comes from the first argument, else `REDIS_URL`, else
//! `redis://127.0.0.1:6379`. Keys go under the prefix `example:`. Without
//! `--notify-keyspace-events Ex` the server sends no expiration events, and
//! the example says so and skips that part.

use expiremap_redis::broadcast::RecvTimeoutError;
use expiremap_redis::{Error, NearCache};
use std::time::{Duration, Instant};

fn main() -> Result<(), Error> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("REDIS_URL").ok())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_string());
    let open = || {
        NearCache::<String, String>::builder(url.as_str())
            .prefix("example:")
            .max_entries(10_000)
            .max_near_ttl(Duration::from_secs(30))
            .build()
    };
    let (web1, web2) = (open()?, open()?);
    println!(
        "two caches on {url}, staleness bound {:?}",
        web1.staleness_bound()
    );

    let key = "greeting".to_string();
    let minute = Duration::from_secs(60);
    web1.put(key.clone(), "hello".into(), minute)?;
    println!("web1 put greeting=hello");
    println!(
        "web2 get -> {:?} (from redis, one round trip)",
        web2.get(&key)?
    );

    let t = Instant::now();
    let hits = 1_000_000;
    for _ in 0..hits {
        std::hint::black_box(web2.get(&key)?);
    }
    println!(
        "web2 {hits} near hits: {:?} each, no network",
        t.elapsed() / hits
    );

    let t = Instant::now();
    web1.put(key.clone(), "bonjour".into(), minute)?;
    while web2.peek_near(&key).as_deref() == Some("hello") {
        std::thread::yield_now();
    }
    println!(
        "web1 put greeting=bonjour; web2's near copy dropped {:?} after the write began",
        t.elapsed()
    );
    let now = web2.get(&key)?;
    println!("web2 get -> {now:?}");
    assert_eq!(now.as_deref(), Some("bonjour"));

    // A third process watches the keys that expire in Redis.
    let watcher = match NearCache::<String, String>::builder(url.as_str())
        .prefix("example:")
        .redis_expirations(true)
        .build()
    {
        Ok(w) => Some(w),
        Err(Error::Config(why)) => {
            println!("no expiration events: {why}");
            None
        }
        Err(e) => return Err(e),
    };
    let mut expired = watcher
        .as_ref()
        .map(NearCache::subscribe_expirations)
        .transpose()?;

    // A near copy never outlives the Redis key.
    let put_at = Instant::now();
    web1.put(
        "short".into(),
        "soon gone".into(),
        Duration::from_millis(200),
    )?;
    web2.get(&"short".to_string())?;
    println!(
        "a 200 ms key: web2's near copy has {:?} left",
        web2.near_ttl(&"short".to_string()).unwrap_or_default()
    );
    if let Some(rx) = &mut expired {
        // Redis deletes the key at or after its deadline (when something
        // touches it, or its background sweep finds it), then reports it.
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(k) => println!(
                "the watcher saw {k:?} expire in Redis {:?} after the put",
                put_at.elapsed()
            ),
            Err(RecvTimeoutError::Timeout) => println!("no expiration reported within 10 s"),
            Err(e) => println!("expiration events: {e:?}"),
        }
    }

    // Loading: one caller per key in this process runs the loader.
    let v = web2.get_or_insert_with("computed".into(), minute, || {
        println!("web2 loads 'computed' (once)");
        "expensive".into()
    })?;
    let w = web1.get_or_insert_with("computed".into(), minute, || unreachable!())?;
    assert_eq!(v, w);
    println!("web1 finds 'computed' = {w:?} without loading");

    for k in ["greeting", "short", "computed"] {
        web1.remove(&k.to_string())?;
    }
    println!("cleaned up");
    Ok(())
}

//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use expiremap::{ExpireMap, ManualClock};
use std::time::Duration;

/// 1 ms.
pub const MS: Duration = Duration::from_millis(1);

/// A map on a fresh `ManualClock`, driven by hand (no background thread).
pub fn manual<K, V>() -> (ExpireMap<K, V>, ManualClock)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    let clock = ManualClock::new();
    let map = ExpireMap::builder()
        .clock(clock.clone())
        .shards(4)
        .background_eviction(false)
        .build();
    (map, clock)
}

/// SplitMix64: seeded, tiny, good enough for test inputs.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// The seed for randomized tests: `EXPIREMAP_SEED` or `default`.
pub fn seed(default: u64) -> u64 {
    std::env::var("EXPIREMAP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A key whose `Hash` panics for 13 and whose `Eq` panics when comparing
/// 7. Every other key hashes alike, so lookups always run `Eq`.
#[derive(Clone, Debug)]
pub struct Touchy(pub u32);
impl std::hash::Hash for Touchy {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        assert_ne!(self.0, 13, "hash panic");
        0u8.hash(h);
    }
}
impl PartialEq for Touchy {
    fn eq(&self, other: &Self) -> bool {
        assert!(self.0 != 7 && other.0 != 7, "eq panic");
        self.0 == other.0
    }
}
impl Eq for Touchy {}

/// Threads that call `evict_expired` in a loop, racing whatever else the
/// test does, until [`stop`](Self::stop).
pub struct Racers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Racers {
    /// `n` threads looping `map.evict_expired()`.
    pub fn spawn<K, V, S>(map: &std::sync::Arc<ExpireMap<K, V, S>>, n: usize) -> Self
    where
        K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
        V: Clone + Send + Sync + 'static,
        S: std::hash::BuildHasher + Send + Sync + 'static,
    {
        Self::spawn_with(map, n, false)
    }

    /// As [`spawn`](Self::spawn); with `catch`, a panic out of
    /// `evict_expired` (a value's `Drop`) is caught and the loop goes on.
    pub fn spawn_with<K, V, S>(
        map: &std::sync::Arc<ExpireMap<K, V, S>>,
        n: usize,
        catch: bool,
    ) -> Self
    where
        K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
        V: Clone + Send + Sync + 'static,
        S: std::hash::BuildHasher + Send + Sync + 'static,
    {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let (map, stop) = (map.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        if catch {
                            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                map.evict_expired()
                            }));
                        } else {
                            map.evict_expired();
                        }
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }

    /// Stops the threads and joins them.
    pub fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("an evict_expired racer panicked");
        }
    }
}

/// Runs `f` on its own thread and returns its outcome (a panic as `Err`),
/// or panics if it has not finished within `secs` seconds: a test of a
/// hang fails instead of hanging (the stuck thread is left behind).
pub fn within<R: Send + 'static>(
    secs: u64,
    f: impl FnOnce() -> R + Send + 'static,
) -> std::thread::Result<R> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(r);
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("still running after {secs} s: a hang"))
}

/// The message of a panic payload.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// tokio's single-threaded runtime (the features the crate's dev-dependency
/// enables: `rt`, `macros`, `time`).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// Lets the runtime poll every other ready task, so that a task just
/// spawned runs into its `recv_async` and goes to sleep there.
pub async fn let_others_run() {
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
}

/// A map on a `ManualClock` with its background eviction thread running:
/// `clock.advance` wakes the thread, which evicts and publishes on its own.
pub fn with_eviction_thread(event_capacity: usize) -> (ExpireMap<u32, u32>, ManualClock) {
    let clock = ManualClock::new();
    let map = ExpireMap::builder()
        .clock(clock.clone())
        .event_capacity(event_capacity)
        .build();
    (map, clock)
}

/// Polls `f` to its end on this thread with a waker that does nothing,
/// yielding between polls: for futures that complete by themselves (a
/// loader's, or one woken by another thread that makes progress anyway).
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Waker};
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

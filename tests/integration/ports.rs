//! Five programs that users ported from moka and quick_cache, each twice:
//! `before` with the calls that existed then (an `Arc` around the map, the
//! TTL repeated at every loader, a TTL smuggled out of `update` through a
//! captured variable, errors made `Clone`), and `after` with the calls a
//! moka user knows (`Clone` handles, `time_to_live` and `Expiry` used by
//! `insert` and `get_with`, `try_get_with`'s `Arc<E>`). Each test runs both
//! through the same steps and asserts that they behave alike, so the
//! `after` forms are checked programs, not sketches.

#![allow(unreachable_pub)] // each program's items are `pub` as in its crate

use expiremap::{ExpireMap, Expiry, ManualClock, Update};
use std::time::Duration;

fn manual<K, V>(clock: &ManualClock) -> expiremap::Builder<K, V>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    ExpireMap::builder()
        .clock(clock.clone())
        .background_eviction(false)
}

// 1. An HTTP proxy cache: each response carries its own max-age.

#[derive(Clone, Debug, PartialEq)]
struct Response {
    body: String,
    max_age: Duration,
}

fn fetch(url: &str) -> Response {
    let secs = url.len() as u64;
    Response {
        body: format!("<{url}>"),
        max_age: Duration::from_secs(secs),
    }
}

mod proxy_before {
    use super::*;
    use std::sync::{Arc, Mutex};

    pub struct Proxy {
        cache: Arc<ExpireMap<String, Response>>,
    }

    impl Proxy {
        pub fn new(cache: ExpireMap<String, Response>) -> Self {
            Self {
                cache: Arc::new(cache),
            }
        }

        pub fn get(&self, url: &str) -> Response {
            if let Some(r) = self.cache.get(url) {
                return r;
            }
            // The TTL is known only after the fetch: smuggled out of
            // `update` through a captured variable.
            let out = Mutex::new(None);
            self.cache.update(url.to_string(), |seen| match seen {
                Some((r, _)) => {
                    *out.lock().unwrap() = Some(r.clone());
                    Update::Keep
                }
                None => {
                    let r = fetch(url);
                    let ttl = r.max_age;
                    *out.lock().unwrap() = Some(r.clone());
                    Update::Set(r, ttl)
                }
            });
            out.into_inner().unwrap().expect("set by update")
        }
    }
}

mod proxy_after {
    use super::*;

    pub struct MaxAge;

    impl Expiry<String, Response> for MaxAge {
        fn expire_after_create(&self, _: &String, r: &Response) -> Option<Duration> {
            Some(r.max_age)
        }
    }

    #[derive(Clone)]
    pub struct Proxy {
        cache: ExpireMap<String, Response>,
    }

    impl Proxy {
        pub fn new(cache: ExpireMap<String, Response>) -> Self {
            Self { cache }
        }

        pub fn get(&self, url: &str) -> Response {
            let url = url.to_string();
            self.cache.get_with(url.clone(), move || fetch(&url))
        }
    }
}

#[test]
fn proxy_cache_before_and_after_alike() {
    let (c1, c2) = (ManualClock::new(), ManualClock::new());
    let before = proxy_before::Proxy::new(manual(&c1).build());
    let after = proxy_after::Proxy::new(manual(&c2).expire_after(proxy_after::MaxAge).build());
    for url in ["/a", "/index", "/a"] {
        assert_eq!(before.get(url), after.get(url));
    }
    c1.advance(Duration::from_secs(3));
    c2.advance(Duration::from_secs(3));
    // "/a" (2 s) expired in both; "/index" (6 s) lives.
    let b = before.get("/index");
    assert_eq!(b, after.get("/index"));
    assert_eq!(b.body, "</index>");
}

// 2. A session store (tower-sessions): `save` with the session's own expiry
// date, which may already have passed.

#[derive(Clone, Debug, PartialEq)]
struct Session {
    data: String,
    /// Clock time of expiry.
    expires_at: Duration,
}

mod sessions_before {
    use super::*;
    use std::sync::Arc;

    #[derive(Clone)]
    pub struct Store {
        map: Arc<ExpireMap<u64, Session>>,
        clock: ManualClock,
    }

    impl Store {
        pub fn new(map: ExpireMap<u64, Session>, clock: ManualClock) -> Self {
            Self {
                map: Arc::new(map),
                clock,
            }
        }

        pub fn save(&self, id: u64, s: Session) {
            let ttl = s.expires_at.saturating_sub(self.clock.now_duration());
            // A zero TTL is ignored by `put`: the old session would stay
            // loadable, so the port had to remove it by hand.
            if ttl.is_zero() {
                self.map.remove(&id);
            } else {
                self.map.put(id, s, ttl);
            }
        }

        pub fn load(&self, id: u64) -> Option<Session> {
            self.map.get(&id)
        }
    }
}

mod sessions_after {
    use super::*;

    pub struct UntilExpiry(pub ManualClock);

    impl Expiry<u64, Session> for UntilExpiry {
        fn expire_after_create(&self, _: &u64, s: &Session) -> Option<Duration> {
            Some(s.expires_at.saturating_sub(self.0.now_duration()))
        }
        fn expire_after_update(
            &self,
            k: &u64,
            s: &Session,
            _: Option<Duration>,
        ) -> Option<Duration> {
            self.expire_after_create(k, s)
        }
    }

    #[derive(Clone)]
    pub struct Store {
        map: ExpireMap<u64, Session>,
    }

    impl Store {
        pub fn new(map: ExpireMap<u64, Session>) -> Self {
            Self { map }
        }

        pub fn save(&self, id: u64, s: Session) {
            self.map.insert(id, s);
        }

        pub fn load(&self, id: u64) -> Option<Session> {
            self.map.get(&id)
        }
    }
}

/// The clock's reading as a `Duration`.
trait Now {
    fn now_duration(&self) -> Duration;
}

impl Now for ManualClock {
    fn now_duration(&self) -> Duration {
        use expiremap::Clock;
        Duration::from_nanos(self.now())
    }
}

#[test]
fn session_store_before_and_after_alike() {
    let (c1, c2) = (ManualClock::new(), ManualClock::new());
    let before = sessions_before::Store::new(manual(&c1).build(), c1.clone());
    let after_map = manual(&c2)
        .expire_after(sessions_after::UntilExpiry(c2.clone()))
        .build();
    let after = sessions_after::Store::new(after_map);
    let s = |data: &str, at: u64| Session {
        data: data.into(),
        expires_at: Duration::from_secs(at),
    };
    let save = |id, session: Session| {
        before.save(id, session.clone());
        after.save(id, session);
    };
    save(1, s("alice", 100));
    save(2, s("bob", 10));
    c1.advance(Duration::from_secs(50));
    c2.advance(Duration::from_secs(50));
    // Saved again with an expiry already passed: gone in both.
    save(1, s("alice", 40));
    for id in [1, 2] {
        assert_eq!(before.load(id), None);
        assert_eq!(after.load(id), None);
    }
    save(3, s("carol", 60));
    assert_eq!(before.load(3), after.load(3));
    assert_eq!(after.load(3).map(|s| s.data), Some("carol".to_string()));
}

// 3. One-time auth codes: issued on one thread, redeemed on another, ten
// minutes to live.

const CODE_TTL: Duration = Duration::from_secs(600);

mod codes_before {
    use super::*;
    use std::sync::Arc;

    pub fn issue(codes: &Arc<ExpireMap<String, u64>>, code: &str, user: u64) {
        codes.put(code.to_string(), user, CODE_TTL);
    }

    pub fn redeem(codes: &Arc<ExpireMap<String, u64>>, code: &str) -> Option<u64> {
        codes.remove(code)
    }

    pub fn run(map: ExpireMap<String, u64>) -> (Option<u64>, Option<u64>) {
        let codes = Arc::new(map);
        let issuer = Arc::clone(&codes);
        std::thread::spawn(move || issue(&issuer, "abc", 7))
            .join()
            .unwrap();
        let redeemer = Arc::clone(&codes);
        std::thread::spawn(move || (redeem(&redeemer, "abc"), redeem(&redeemer, "abc")))
            .join()
            .unwrap()
    }
}

mod codes_after {
    use super::*;

    pub fn run(codes: ExpireMap<String, u64>) -> (Option<u64>, Option<u64>) {
        let issuer = codes.clone();
        std::thread::spawn(move || issuer.insert("abc".into(), 7))
            .join()
            .unwrap();
        let redeemer = codes.clone();
        std::thread::spawn(move || (redeemer.remove("abc"), redeemer.remove("abc")))
            .join()
            .unwrap()
    }
}

#[test]
fn auth_codes_before_and_after_alike() {
    let clock = ManualClock::new();
    let before = codes_before::run(manual(&clock).build());
    let after = codes_after::run(manual(&clock).time_to_live(CODE_TTL).build());
    assert_eq!(before, (Some(7), None));
    assert_eq!(before, after);
}

// 4. A JSON-RPC cache (first built on quick_cache): a failed call is
// shared with the callers waiting for it, and `std::io::Error` is not
// `Clone`.

fn rpc(method: &str) -> Result<String, std::io::Error> {
    match method {
        "eth_blockNumber" => Ok("0x10".into()),
        _ => Err(std::io::Error::other(format!("no method {method}"))),
    }
}

mod rpc_before {
    use super::*;
    use std::sync::Arc;

    /// The error made `Clone` for `try_get_or_insert_with`: its message.
    #[derive(Clone, Debug)]
    pub struct RpcError(pub String);

    #[derive(Clone)]
    pub struct Client {
        cache: Arc<ExpireMap<String, String>>,
    }

    impl Client {
        pub fn new(cache: ExpireMap<String, String>) -> Self {
            Self {
                cache: Arc::new(cache),
            }
        }

        pub fn call(&self, method: &str) -> Result<String, RpcError> {
            self.cache
                .try_get_or_insert_with(method.to_string(), Duration::from_secs(12), || {
                    rpc(method).map_err(|e| RpcError(e.to_string()))
                })
        }
    }
}

mod rpc_after {
    use super::*;
    use std::sync::Arc;

    #[derive(Clone)]
    pub struct Client {
        cache: ExpireMap<String, String>,
    }

    impl Client {
        pub fn new(cache: ExpireMap<String, String>) -> Self {
            Self { cache }
        }

        pub fn call(&self, method: &str) -> Result<String, Arc<std::io::Error>> {
            let method = method.to_string();
            self.cache
                .try_get_with(method.clone(), move || rpc(&method))
        }
    }
}

#[test]
fn rpc_cache_before_and_after_alike() {
    let clock = ManualClock::new();
    let before = rpc_before::Client::new(manual(&clock).build());
    let block_time = Duration::from_secs(12);
    let after = rpc_after::Client::new(manual(&clock).time_to_live(block_time).build());
    for method in ["eth_blockNumber", "eth_nope", "eth_blockNumber"] {
        let (b, a) = (before.call(method), after.call(method));
        match (b, a) {
            (Ok(b), Ok(a)) => assert_eq!(b, a),
            (Err(b), Err(a)) => assert_eq!(b.0, a.to_string()),
            other => panic!("{other:?}"),
        }
    }
}

// 5. A fixed-window rate limiter in an axum service: a handle per handler.

const WINDOW: Duration = Duration::from_secs(1);
const LIMIT: u32 = 3;

fn count(seen: Option<(&u32, Duration)>) -> Update<u32> {
    match seen {
        None => Update::Set(1, WINDOW),
        Some((n, _)) => Update::SetKeepTtl(n + 1),
    }
}

mod limiter_before {
    use super::*;
    use std::sync::Arc;

    #[derive(Clone)]
    pub struct AppState {
        pub hits: Arc<ExpireMap<String, u32>>,
    }

    pub fn handler(state: &AppState, client: &str) -> bool {
        state.hits.update(client.to_string(), count).unwrap_or(0) <= LIMIT
    }
}

mod limiter_after {
    use super::*;

    #[derive(Clone)]
    pub struct AppState {
        pub hits: ExpireMap<String, u32>,
    }

    pub fn handler(state: &AppState, client: &str) -> bool {
        state.hits.update(client.to_string(), count).unwrap_or(0) <= LIMIT
    }
}

#[test]
fn rate_limiter_before_and_after_alike() {
    let clock = ManualClock::new();
    let before = limiter_before::AppState {
        hits: std::sync::Arc::new(manual(&clock).build()),
    };
    let after = limiter_after::AppState {
        hits: manual(&clock).build(),
    };
    let mut answers = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let (b, a) = (before.clone(), after.clone());
        answers.0.push(limiter_before::handler(&b, "10.0.0.1"));
        answers.1.push(limiter_after::handler(&a, "10.0.0.1"));
    }
    assert_eq!(answers.0, [true, true, true, false, false]);
    assert_eq!(answers.0, answers.1);
    clock.advance(WINDOW + Duration::from_nanos(1));
    assert!(limiter_after::handler(&after, "10.0.0.1"));
    assert!(limiter_before::handler(&before, "10.0.0.1"));
}

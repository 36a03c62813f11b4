//! The server's `expired` key events, on a connection of their own.
//!
//! # Ground rules
//!
//! * A connection that subscribes becomes a *pub/sub client* to the
//!   server: `client-output-buffer-limit pubsub` applies to everything it is
//!   sent, and `CLIENT KILL TYPE pubsub` closes it. So the events never
//!   share the data connection ([`crate::link`]): a burst of events or of
//!   large replies, an operator's kill, or a `SUBSCRIBE` the server refuses
//!   after a reconnect (an ACL change) costs events, never the near cache.
//! * One thread reads the connection and publishes each key under the
//!   prefix to a [`broadcast`] ring; readers of the ring see exact lag.
//! * Lossy like Redis pub/sub, and only that: events sent while the
//!   connection is down are lost. The thread reconnects with backoff (10 ms
//!   to 500 ms) and subscribes again. A dead peer that sends no reset is
//!   found by TCP keepalive (idle 5 s, then 3 probes 1 s apart); a server
//!   that merely stops answering sends no events either, so there is no
//!   ping here.
//! * The first connection is made by `build`, on its thread, so that an
//!   unreachable server, a refused `SUBSCRIBE` or a server set to send no
//!   `expired` events (read with `CONFIG GET` where that is allowed) is an
//!   error there.

use crate::codec;
use crate::connect::{self, Config};
use crate::error::Error;
use crate::wire::ReadHalf;
use expiremap::broadcast;
use redis::{Parser, PushKind, Value};
use serde::de::DeserializeOwned;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Longest wait between two attempts to reconnect.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// The events' connection, its reader thread and the ring it publishes to.
pub(crate) struct Expirations<K> {
    cfg: Config,
    ring: broadcast::Sender<K>,
    /// A handle on the live connection, for [`close`](Self::close) to shut
    /// it down; `None` while there is none.
    stream: Mutex<Option<TcpStream>>,
    closing: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<K> Expirations<K>
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    /// Connects (checking the server's setting), subscribes, and starts the
    /// reader thread.
    pub(crate) fn start(cfg: Config, ring: broadcast::Sender<K>) -> Result<Arc<Self>, Error> {
        let me = Arc::new(Self {
            cfg,
            ring,
            stream: Mutex::new(None),
            closing: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let (stream, parser) = me.connect(true)?;
        let reader = Arc::clone(&me);
        let spawned = thread::Builder::new()
            .name("expiremap-redis-expirations".into())
            .spawn(move || reader.run(stream, parser));
        match spawned {
            Ok(h) => {
                *lock(&me.thread) = Some(h);
                Ok(me)
            }
            Err(e) => {
                me.close();
                Err(Error::io(e))
            }
        }
    }

    /// A new reader of the ring.
    pub(crate) fn subscribe(&self) -> Result<broadcast::Receiver<K>, Error> {
        self.ring
            .subscribe()
            .map_err(|e| Error::Config(e.to_string()))
    }

    /// Connects, handshakes and subscribes; with `first`, also checks that
    /// the server sends `expired` events. Makes the connection the one
    /// `close` shuts down, unless the cache is closing.
    fn connect(&self, first: bool) -> Result<(ReadHalf, Parser), Error> {
        let cfg = &self.cfg;
        let (mut stream, write) = connect::dial(cfg)?;
        keepalive(stream.tcp())?;
        let mut cmds = vec![("HELLO", connect::hello(cfg))];
        if first {
            let get = redis::cmd("CONFIG")
                .arg("GET")
                .arg("notify-keyspace-events")
                .clone();
            cmds.push(("CONFIG GET", get));
        }
        // Key events are per database: `__keyevent@<db>__:expired`.
        let channel = format!("__keyevent@{}__:expired", cfg.db);
        let subscribe = redis::cmd("SUBSCRIBE").arg(channel).clone();
        cmds.push(("SUBSCRIBE", subscribe));
        let mut parser = Parser::new();
        // CONFIG may be disabled or denied (managed servers): the setting
        // cannot be checked then, only documented.
        let replies = connect::handshake(
            &mut stream,
            &write,
            &mut parser,
            &cmds,
            &["CONFIG GET"],
            |m| self.publish(m),
        )?;
        if first {
            check_key_events(&replies[1])?;
        }
        let mut slot = lock(&self.stream);
        if self.closing.load(Ordering::Acquire) {
            return Err(Error::connection(
                std::io::ErrorKind::NotConnected,
                "the cache is closing",
            ));
        }
        *slot = Some(write.socket().map_err(Error::io)?);
        Ok((stream, parser))
    }

    /// The reader thread: publishes events until the connection ends, then
    /// reconnects, until the cache closes.
    fn run(self: Arc<Self>, mut stream: ReadHalf, mut parser: Parser) {
        loop {
            while let Ok(v) = parser.parse_value(&mut stream) {
                if let Value::Push {
                    kind: PushKind::Message,
                    data,
                } = v
                {
                    self.publish(data);
                }
            }
            *lock(&self.stream) = None;
            let mut backoff = Duration::from_millis(10);
            loop {
                if self.closing.load(Ordering::Acquire) {
                    return;
                }
                match self.connect(false) {
                    Ok((s, p)) => {
                        (stream, parser) = (s, p);
                        break;
                    }
                    Err(_) => {
                        thread::park_timeout(backoff);
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
            }
        }
    }

    /// An `expired` key event (`[channel, key name]`): published if the key
    /// is one of ours. Only this channel is subscribed to. A name that does
    /// not decode (or whose `Deserialize` panics) is skipped.
    fn publish(&self, data: Vec<Value>) {
        if let [_, Value::BulkString(name)] = data.as_slice()
            && let Some(k) = codec::key_of::<K>(&self.cfg.prefix, name)
        {
            self.ring.send(k);
        }
    }
}

impl<K> Expirations<K> {
    /// Stops the reader thread and waits for it. Readers of the ring see
    /// `Closed` once the cache (which holds the ring) is dropped.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        if let Some(s) = lock(&self.stream).take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        let reader = lock(&self.thread).take();
        if let Some(h) = reader {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// TCP keepalive on the events' connection, which is otherwise silent: a
/// peer gone without a reset is found within about 8 s.
fn keepalive(stream: &TcpStream) -> Result<(), Error> {
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(5))
        .with_interval(Duration::from_secs(1));
    #[cfg(any(target_os = "linux", target_os = "macos", target_os = "freebsd"))]
    let ka = ka.with_retries(3);
    socket2::SockRef::from(stream)
        .set_tcp_keepalive(&ka)
        .map_err(Error::io)
}

/// Checks the reply to `CONFIG GET notify-keyspace-events`: the server
/// sends `expired` key events only if its flags have `E` (key events) and
/// `x` (expirations) or `A` (every class). A reply that does not carry the
/// setting (an error, or a server or proxy without it) cannot be checked,
/// and passes.
fn check_key_events(reply: &Value) -> Result<(), Error> {
    let flags = match reply {
        Value::Map(pairs) => pairs.first().map(|(_, v)| v),
        Value::Array(items) => items.get(1),
        _ => None,
    };
    let flags = match flags {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        _ => return Ok(()),
    };
    if flags.contains('E') && (flags.contains('x') || flags.contains('A')) {
        return Ok(());
    }
    Err(Error::Config(format!(
        "redis_expirations: the server's notify-keyspace-events is {flags:?}, which sends no \
         expired key events; they need E and x (`CONFIG SET notify-keyspace-events Ex`, or \
         `notify-keyspace-events Ex` in redis.conf)"
    )))
}

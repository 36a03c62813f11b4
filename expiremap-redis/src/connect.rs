//! Connecting to a server: the settings ([`Config`], from the URL and the
//! builder), the TCP or TLS dial, and the handshake (`HELLO 3`, credentials,
//! the first commands and their replies). Shared by the data connection
//! ([`crate::link`]) and the expired-events connection
//! ([`crate::expirations`]).

use crate::error::Error;
use crate::wire::{self, ReadHalf, WriteHalf, is_timeout, no_answer};
use redis::{ConnectionAddr, Parser, PushKind, Value};
use std::fmt;
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

/// How the cache connects, and its bounds.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
    /// `rediss://`: TLS, with this client configuration (set by `build`).
    pub(crate) tls: bool,
    #[cfg(feature = "tls")]
    pub(crate) tls_config: Option<Arc<rustls::ClientConfig>>,
    pub(crate) prefix: Vec<u8>,
    pub(crate) staleness: Duration,
    pub(crate) max_near_ttl: Duration,
    pub(crate) connect_timeout: Duration,
    /// How long a call waits for its reply; see [`Config::dead_after`].
    pub(crate) call_timeout: Duration,
    /// A node of a Redis Cluster (from the cluster builder): its
    /// `cluster_enabled:1` is expected, not refused.
    pub(crate) cluster: bool,
    /// The callers waiting for leases held elsewhere, shared by every link
    /// of the cache (clones share it).
    pub(crate) waiters: Arc<crate::waiters::Waiters>,
    /// The Redis tier's counts, shared by every link of the cache (clones
    /// share it; see [`crate::monitor`]).
    pub(crate) monitor: Arc<crate::monitor::Counters>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .field("tls", &self.tls)
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .finish_non_exhaustive()
    }
}

/// Query parameters shown as they are in a masked URL; every other
/// parameter's value (`pass`, `password`, `user`...) is masked.
const SHOWN_PARAMS: [&str; 2] = ["db", "protocol"];

/// `url` with its secrets masked (`***`), for messages and `Debug`: the
/// user-info (user and password before an `@`), every query value but
/// those of [`SHOWN_PARAMS`] (the `redis` crate reads `pass` and `user`
/// from the query of `redis+unix://` URLs), and a fragment. Masked as the
/// URL parser of the `redis` crate reads it; a URL that does not parse
/// as one with a host (no scheme: `u:secret@host:port` reads as the
/// scheme `u` and a path) keeps only its scheme if it has an `@`, `?` or
/// `#` anywhere (a password may be what makes it unparsable).
pub(crate) fn redact(url: &str) -> String {
    let parsed = url::Url::parse(url).ok().filter(|u| !u.cannot_be_a_base());
    let Some(mut u) = parsed else {
        if !url.contains(['@', '?', '#']) {
            return url.to_string();
        }
        return match url.split_once("://") {
            Some((scheme, _)) => format!("{scheme}://***"),
            None => "***".to_string(),
        };
    };
    if (!u.username().is_empty() || u.password().is_some())
        && (u.set_password(None).is_err() || u.set_username("***").is_err())
    {
        return format!("{}://***", u.scheme());
    }
    if u.query().is_some() {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let v = if SHOWN_PARAMS.contains(&&*k) {
                    v.into_owned()
                } else {
                    "***".to_string()
                };
                (k.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    if u.fragment().is_some() {
        u.set_fragment(Some("***"));
    }
    u.into()
}

impl Config {
    pub(crate) fn from_url(url: &str) -> Result<Self, Error> {
        use redis::IntoConnectionInfo;
        let bad =
            |e: &dyn fmt::Display| Error::Config(format!("bad redis URL {}: {e}", redact(url)));
        // The `redis` crate parses `rediss://` only with its own TLS
        // features (which bring its connections); ours is in `wire`.
        let (plain, tls) = match url.split_once("://") {
            Some(("rediss", rest)) => (format!("redis://{rest}"), true),
            Some(("valkeys", rest)) => (format!("valkey://{rest}"), true),
            _ => (url.to_string(), false),
        };
        if tls && plain.contains('#') {
            return Err(bad(
                &"no URL fragment is supported (certificate checks cannot be \
                turned off with #insecure; trust a private CA with Builder::tls_ca_pem)",
            ));
        }
        let info = plain.as_str().into_connection_info().map_err(|e| bad(&e))?;
        let (host, port) = match info.addr() {
            ConnectionAddr::Tcp(h, p) => (h.clone(), *p),
            other => {
                return Err(Error::Config(format!(
                    "only TCP (redis://) and TLS (rediss://) are supported, not {other:?}"
                )));
            }
        };
        if tls && !cfg!(feature = "tls") {
            return Err(Error::Config(
                "rediss:// needs the `tls` feature of expiremap-redis (on by default)".into(),
            ));
        }
        let r = info.redis_settings();
        Ok(Config {
            host,
            port,
            username: r.username().map(str::to_string),
            password: r.password().map(str::to_string),
            db: r.db(),
            tls,
            #[cfg(feature = "tls")]
            tls_config: None,
            prefix: b"expiremap:".to_vec(),
            staleness: Duration::from_millis(500),
            max_near_ttl: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(1),
            call_timeout: Duration::from_secs(2),
            cluster: false,
            waiters: Arc::default(),
            monitor: Arc::default(),
        })
    }

    /// The server, as errors name it: `server host:port`, or `cluster node
    /// host:port`.
    pub(crate) fn node(&self) -> String {
        let what = if self.cluster {
            "cluster node"
        } else {
            "server"
        };
        format!("{what} {}:{}", self.host, self.port)
    }

    pub(crate) fn ping_every(&self) -> Duration {
        self.staleness / 4
    }

    /// How long a ping may go unanswered before the connection is closed:
    /// the longer of the staleness bound and the call timeout. A shorter
    /// stall costs near hits (after `staleness`) and calls that time out,
    /// never the connection nor the near copies.
    pub(crate) fn dead_after(&self) -> Duration {
        self.staleness.max(self.call_timeout)
    }
}

/// `true` if an `INFO cluster` reply says `cluster_enabled:1`.
pub(crate) fn cluster_enabled(info: &Value) -> bool {
    let text = match info {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::VerbatimString { text, .. } => text.clone(),
        _ => return false,
    };
    text.lines().any(|l| l.trim() == "cluster_enabled:1")
}

/// The major version in a `HELLO` reply (`version` => `"7.0.15"`).
pub(crate) fn server_major(hello: &Value) -> Option<u32> {
    let Value::Map(pairs) = hello else {
        return None;
    };
    pairs.iter().find_map(|(k, v)| {
        let text = |v: &Value| match v {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        if text(k)? != "version" {
            return None;
        }
        text(v)?.split('.').next()?.parse().ok()
    })
}

/// A connection to the server (TCP, and TLS for `rediss://`), with the
/// configured timeouts; reads time out after `connect_timeout` until
/// [`handshake`] is done, writes after the call timeout.
pub(crate) fn dial(cfg: &Config) -> Result<(ReadHalf, WriteHalf), Error> {
    let addrs = (cfg.host.as_str(), cfg.port)
        .to_socket_addrs()
        .map_err(Error::io)?;
    let mut last = Error::connection(
        io::ErrorKind::NotFound,
        &format!("{} resolves to no address", cfg.host),
    );
    let mut stream = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, cfg.connect_timeout) {
            // Nothing listens there, and the system gave the connection
            // that very port as its own: TCP joined it to itself, and it
            // would read back what it sends.
            Ok(s) if to_itself(&s) => {
                last = Error::connection(
                    io::ErrorKind::ConnectionRefused,
                    &format!(
                        "nothing listens on {a} (the connection was given that port as its own \
                         and joined itself)"
                    ),
                );
            }
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) if is_timeout(&e) => {
                last = no_answer("TCP connect", Some(cfg.connect_timeout));
            }
            Err(e) => last = Error::io(e),
        }
    }
    let stream = stream.ok_or(last)?;
    stream.set_nodelay(true).map_err(Error::io)?;
    stream
        .set_read_timeout(Some(cfg.connect_timeout))
        .map_err(Error::io)?;
    stream
        .set_write_timeout(Some(cfg.call_timeout.max(cfg.connect_timeout)))
        .map_err(Error::io)?;
    #[cfg(feature = "tls")]
    if cfg.tls {
        let config = cfg
            .tls_config
            .clone()
            .ok_or_else(|| Error::Config("TLS without a client configuration".into()))?;
        return wire::tls(stream, config, &cfg.host);
    }
    wire::plain(stream)
}

/// `true` if `s` is connected to itself: a connect to a free port of the
/// system's ephemeral range on this host that was given that port as its
/// own source port (TCP's simultaneous open joins the two ends).
fn to_itself(s: &TcpStream) -> bool {
    matches!((s.local_addr(), s.peer_addr()), (Ok(l), Ok(p)) if l == p)
}

/// A server's error reply as the server wrote it (`NOPERM this user
/// has...`, `MOVED 3999 127.0.0.1:7002`), which is also what a cluster's
/// redirects are read from.
pub(crate) fn server_error(e: &redis::ServerError) -> String {
    match e.details() {
        Some(d) => format!("{} {d}", e.code()),
        None => e.code().to_string(),
    }
}

/// `HELLO 3`, with the credentials if any.
pub(crate) fn hello(cfg: &Config) -> redis::Cmd {
    let mut hello = redis::cmd("HELLO");
    hello.arg(3);
    if let Some(pass) = &cfg.password {
        hello
            .arg("AUTH")
            .arg(cfg.username.as_deref().unwrap_or("default"))
            .arg(pass);
    }
    hello
}

/// Sends `cmds` (named, for errors) in one write and reads one reply for
/// each, in order, handing any `message` push read meanwhile to `message`;
/// then lifts the read timeout. Returns the replies. A server error is an
/// [`Error::Server`] naming its command, unless the command is named in
/// `may_fail` (then its error reply is returned like any other).
pub(crate) fn handshake(
    read: &mut ReadHalf,
    write: &WriteHalf,
    parser: &mut Parser,
    cmds: &[(&'static str, redis::Cmd)],
    may_fail: &[&str],
    mut message: impl FnMut(Vec<Value>),
) -> Result<Vec<Value>, Error> {
    let mut bytes = Vec::new();
    for (_, c) in cmds {
        c.write_packed_command(&mut bytes);
    }
    // The connect timeout, which `dial` set as the read timeout.
    let t = read.tcp().read_timeout().ok().flatten();
    write.send_all(&bytes).map_err(|e| match is_timeout(&e) {
        true => no_answer("sending the handshake", t),
        false => Error::io(e),
    })?;
    let mut replies = Vec::with_capacity(cmds.len());
    for (name, _) in cmds {
        let reply = loop {
            let v = parser
                .parse_value(&mut *read)
                .map_err(|e| match e.is_timeout() {
                    true => no_answer(&format!("waiting for the reply to {name}"), t),
                    false => Error::connection(io::ErrorKind::InvalidData, &e.to_string()),
                })?;
            match v {
                Value::Push {
                    kind: PushKind::Message,
                    data,
                } => message(data),
                v => break v,
            }
        };
        match reply {
            Value::ServerError(e) if !may_fail.contains(name) => {
                return Err(Error::Server(format!("{name}: {}", server_error(&e))));
            }
            reply => replies.push(reply),
        }
    }
    read.tcp().set_read_timeout(None).map_err(Error::io)?;
    Ok(replies)
}

#[cfg(test)]
mod tests {
    use super::{redact, to_itself};

    #[test]
    fn a_connection_joined_to_itself_is_told_from_one_to_a_listener() {
        use std::net::{SocketAddr, TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let to_listener = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert!(!to_itself(&to_listener));
        // A socket bound to a port and connected to that same port: what a
        // connect to a free port that picks it as its own source gives.
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        let own = s.local_addr().unwrap();
        match s.connect(&own) {
            Ok(()) => assert!(to_itself(&TcpStream::from(s))),
            // A system that refuses the simultaneous open has no such case.
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}"),
        }
    }

    #[test]
    fn redact_masks_user_info_query_values_and_fragments() {
        let cases = [
            ("redis://127.0.0.1:6379/2", "redis://127.0.0.1:6379/2"),
            ("redis://u:pw@h:1/0", "redis://***@h:1/0"),
            ("redis://:pw@h:1", "redis://***@h:1"),
            ("rediss://u@h:1", "rediss://***@h:1"),
            (
                "redis+unix:///tmp/r.sock?db=2&pass=pw&user=u",
                "redis+unix:///tmp/r.sock?db=2&pass=***&user=***",
            ),
            ("unix:///tmp/r.sock?pass=p@w", "unix:///tmp/r.sock?pass=***"),
            (
                "redis://h:1?password=pw#frag",
                "redis://h:1?password=***#***",
            ),
            // Unparsable: only the scheme, if anything could be a secret.
            ("redis://u:pw@h:port", "redis://***"),
            ("redis://:p?w@h:1", "redis://***"),
            ("not a url", "not a url"),
            ("pw@h", "***"),
            // No scheme: `u` would be one, and the rest a path.
            ("u:secret@host:6379", "***"),
            ("default:secret@10.0.0.1:6379/0", "***"),
            ("host:6379", "host:6379"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact(url), shown, "{url}");
        }
    }
}

//! The one error type of the crate.

use std::fmt;
use std::io;
use std::sync::Arc;

/// What went wrong with a [`NearCache`](crate::NearCache) call.
///
/// `Clone`, so that one lost connection can fail every call that was
/// waiting on it with the same cause.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Error {
    /// The builder's settings or URL are not usable (an unsupported scheme,
    /// a bad prefix, a zero timeout). A URL in the message has its
    /// credentials masked.
    Config(String),
    /// No answer from the server: it could not be reached, the connection
    /// was lost while the call waited (the near copies were dropped; the
    /// cache reconnects on its own), the cache is reconnecting (the message
    /// and the error's `source` say why its last attempt failed), or no
    /// reply came within the call timeout (kind
    /// [`TimedOut`](io::ErrorKind::TimedOut), see [`Error::is_timeout`]; the
    /// connection and the near copies stay). A `put` or `remove` that
    /// failed this way may or may not have reached the server.
    Connection(Arc<io::Error>),
    /// The server answered with an error reply (`-ERR ...`, `-NOAUTH ...`).
    /// The message of a call's error names the server and the step
    /// (`server 127.0.0.1:6379: lease take (script): NOPERM ...`); one of
    /// connecting names the command (`HELLO: WRONGPASS ...`).
    Server(String),
    /// The server's reply did not have the expected shape (not a server
    /// compatible with Redis 6.2 or later); a call's names the server. A key
    /// of another Redis type under the prefix is a [`Error::Server`]
    /// (`WRONGTYPE`).
    Protocol(String),
    /// A key or value could not be encoded, or bytes read from the server
    /// could not be decoded as the cache's key or value type.
    Codec(CodecError),
}

impl Error {
    pub(crate) fn connection(kind: io::ErrorKind, msg: &str) -> Self {
        Error::Connection(Arc::new(io::Error::new(kind, msg.to_string())))
    }

    pub(crate) fn io(e: io::Error) -> Self {
        Error::Connection(Arc::new(e))
    }

    /// This error, naming the server it is about (`node`: `server
    /// host:port`, or `cluster node host:port`): a connection error keeps
    /// its kind and gets the cause as its source; a server or protocol
    /// error gets `node` in its message. Other errors are not about a node.
    pub(crate) fn at(self, node: &str) -> Self {
        match self {
            Error::Connection(cause) => Error::Connection(Arc::new(io::Error::new(
                cause.kind(),
                AtNode {
                    node: node.to_string(),
                    cause,
                },
            ))),
            Error::Server(m) => Error::Server(format!("{node}: {m}")),
            Error::Protocol(m) => Error::Protocol(format!("{node}: {m}")),
            e => e,
        }
    }

    /// The server this error is about, as [`at`](Self::at) named it
    /// (`server host:port`, `cluster node host:port`), if it names one.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    pub(crate) fn node(&self) -> Option<&str> {
        let named =
            |m: &'_ str| -> bool { m.starts_with("server ") || m.starts_with("cluster node ") };
        match self {
            Error::Connection(e) => e
                .get_ref()
                .and_then(|c| c.downcast_ref::<AtNode>())
                .map(|a| a.node.as_str()),
            Error::Server(m) | Error::Protocol(m) if named(m) => m.split(": ").next(),
            _ => None,
        }
    }

    /// `true` for [`Error::Connection`]: retrying later may succeed.
    pub fn is_connection(&self) -> bool {
        matches!(self, Error::Connection(_))
    }

    /// `true` for a call that got no reply within the call timeout
    /// ([`Builder::call_timeout`](crate::Builder::call_timeout)), and for
    /// a connect that got no answer within the connect timeout
    /// ([`Builder::connect_timeout`](crate::Builder::connect_timeout)):
    /// the message says which server, and after how long.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Connection(e) if e.kind() == io::ErrorKind::TimedOut)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(m) => write!(f, "near cache configuration: {m}"),
            Error::Connection(e) => write!(f, "redis connection: {e}"),
            Error::Server(m) => write!(f, "redis server error: {m}"),
            Error::Protocol(m) => write!(f, "unexpected redis reply: {m}"),
            Error::Codec(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Connection(e) => Some(&**e),
            Error::Codec(e) => Some(e),
            _ => None,
        }
    }
}

impl From<CodecError> for Error {
    fn from(e: CodecError) -> Self {
        Error::Codec(e)
    }
}

/// A connection error about one server, named.
#[derive(Debug)]
struct AtNode {
    node: String,
    cause: Arc<io::Error>,
}

impl fmt::Display for AtNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.node, self.cause)
    }
}

impl std::error::Error for AtNode {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.cause)
    }
}

/// A key or value that did not go through the codec (postcard).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodecError {
    /// Encoding (`true`) or decoding (`false`).
    pub encoding: bool,
    /// Which half of the entry: `"key"` or `"value"`.
    pub part: &'static str,
    /// The codec's own message.
    pub message: String,
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = if self.encoding { "encode" } else { "decode" };
        write!(f, "cannot {op} the {}: {}", self.part, self.message)
    }
}

impl std::error::Error for CodecError {}

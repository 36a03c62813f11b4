//! Error types of the broadcast area's receivers and subscriptions. A
//! bad setting given to `Sender::new` is the crate's [`BuildError`](crate::BuildError).

use std::fmt;

/// Why [`Sender::subscribe`](super::Sender::subscribe) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SubscribeError {
    /// Every registry slot is owned by a live `Receiver`; dropping one frees
    /// its slot.
    RegistryFull {
        /// The registry size the area was built with.
        max_readers: usize,
    },
}

impl fmt::Display for SubscribeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RegistryFull { max_readers } => write!(
                f,
                "broadcast reader registry is full ({max_readers} readers)"
            ),
        }
    }
}

impl std::error::Error for SubscribeError {}

/// Why [`Receiver::recv`](super::Receiver::recv) returned no message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvError {
    /// Exactly this many messages were freed before this receiver read them.
    /// The next receive continues from the oldest message still held.
    Lagged(u64),
    /// Every `Sender` is gone and every message has been received.
    Closed,
}

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lagged(n) => write!(f, "receiver lagged behind and lost {n} messages"),
            Self::Closed => f.write_str("broadcast area closed: every sender is gone"),
        }
    }
}

impl std::error::Error for RecvError {}

/// Why [`Receiver::try_recv`](super::Receiver::try_recv) returned no message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryRecvError {
    /// No message is available now; senders remain.
    Empty,
    /// Exactly this many messages were freed before this receiver read them.
    /// The next receive continues from the oldest message still held.
    Lagged(u64),
    /// Every `Sender` is gone and every message has been received.
    Closed,
}

impl fmt::Display for TryRecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("no message available"),
            Self::Lagged(n) => write!(f, "receiver lagged behind and lost {n} messages"),
            Self::Closed => f.write_str("broadcast area closed: every sender is gone"),
        }
    }
}

impl std::error::Error for TryRecvError {}

/// Why [`Receiver::recv_timeout`](super::Receiver::recv_timeout) returned no
/// message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvTimeoutError {
    /// The timeout elapsed with no message.
    Timeout,
    /// Exactly this many messages were freed before this receiver read them.
    /// The next receive continues from the oldest message still held.
    Lagged(u64),
    /// Every `Sender` is gone and every message has been received.
    Closed,
}

impl fmt::Display for RecvTimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout => f.write_str("timed out waiting for a message"),
            Self::Lagged(n) => write!(f, "receiver lagged behind and lost {n} messages"),
            Self::Closed => f.write_str("broadcast area closed: every sender is gone"),
        }
    }
}

impl std::error::Error for RecvTimeoutError {}

/// A lag, as an item of a receiver's `Stream`: exactly this many messages
/// were freed before the receiver read them, and the stream continues from
/// the oldest message still held. (A stream has no `Closed` item: it ends.)
///
/// ```
/// use expiremap::broadcast::Lagged;
/// assert_eq!(Lagged(3).to_string(), "receiver lagged behind and lost 3 messages");
/// ```
#[cfg(feature = "stream")]
#[cfg_attr(docsrs, doc(cfg(feature = "stream")))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lagged(pub u64);

#[cfg(feature = "stream")]
impl fmt::Display for Lagged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "receiver lagged behind and lost {} messages", self.0)
    }
}

#[cfg(feature = "stream")]
impl std::error::Error for Lagged {}

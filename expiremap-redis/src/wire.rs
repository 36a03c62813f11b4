//! The byte stream of a connection, plain TCP or TLS, split in a read half
//! (the one thread that reads the connection) and a write half (callers,
//! under the cache's `link` lock).
//!
//! A caller never waits for the socket: [`WriteHalf::send`] queues its
//! bytes behind what is queued and writes what the socket takes at once
//! (`MSG_DONTWAIT`); what is left is written by the link's supervisor
//! ([`WriteHalf::flush`] when [`WriteHalf::writable`]). So a server that
//! stops reading (stopped, or a value larger than the socket buffers)
//! holds up no caller's thread: the calls wait for their replies, at most
//! their call timeout. Only the handshakes, on their own threads, write
//! blocking ([`WriteHalf::send_all`], bounded by the socket's write
//! timeout).
//!
//! With TLS (`rediss://`, the `tls` feature), both halves share the rustls
//! state under a mutex, but nobody blocks on the socket while holding it:
//! the read half reads ciphertext from the socket unlocked, then takes the
//! lock only to decrypt it (and to send what the TLS layer itself must
//! answer); the write half takes it to encrypt and send a command. So a
//! reader waiting for the server never holds up a caller's write, as with
//! plain TCP, where the halves are two handles of one socket.

use crate::error::Error;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
#[cfg(feature = "tls")]
use std::sync::Arc;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// The TLS state of a connection, shared by its halves.
#[cfg(feature = "tls")]
type Tls = Arc<Mutex<rustls::ClientConnection>>;

/// The read half.
pub(crate) struct ReadHalf {
    tcp: TcpStream,
    #[cfg(feature = "tls")]
    tls: Option<TlsRead>,
}

/// The read half's TLS side: the state, and plaintext decrypted but not
/// yet handed out.
#[cfg(feature = "tls")]
struct TlsRead {
    conn: Tls,
    plain: Vec<u8>,
    at: usize,
    raw: Box<[u8]>,
}

/// The write half.
pub(crate) struct WriteHalf {
    tcp: TcpStream,
    #[cfg(feature = "tls")]
    tls: Option<Tls>,
    /// Plain TCP: bytes sent that the socket has not taken yet, in order
    /// (TLS keeps its own, sealed, in the rustls state).
    backlog: Mutex<Vec<u8>>,
}

/// Splits a plain TCP connection.
pub(crate) fn plain(tcp: TcpStream) -> Result<(ReadHalf, WriteHalf), Error> {
    let write = tcp.try_clone().map_err(Error::io)?;
    Ok((
        ReadHalf {
            tcp,
            #[cfg(feature = "tls")]
            tls: None,
        },
        WriteHalf {
            tcp: write,
            #[cfg(feature = "tls")]
            tls: None,
            backlog: Mutex::new(Vec::new()),
        },
    ))
}

/// Runs the TLS handshake on `tcp` (whose read timeout bounds it) and
/// splits the connection.
#[cfg(feature = "tls")]
pub(crate) fn tls(
    mut tcp: TcpStream,
    config: Arc<rustls::ClientConfig>,
    host: &str,
) -> Result<(ReadHalf, WriteHalf), Error> {
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| Error::Config(format!("TLS: {host:?} is not a server name: {e}")))?;
    let mut conn = rustls::ClientConnection::new(config, name)
        .map_err(|e| Error::connection(io::ErrorKind::InvalidData, &format!("TLS: {e}")))?;
    // Commands are encrypted as they come: no limit on what is buffered
    // (the write half flushes it all before it returns).
    conn.set_buffer_limit(None);
    while conn.is_handshaking() {
        match conn.complete_io(&mut tcp) {
            Ok((0, 0)) => {
                return Err(Error::connection(
                    io::ErrorKind::UnexpectedEof,
                    "TLS handshake: the server closed the connection",
                ));
            }
            Ok(_) => {}
            Err(e) if is_timeout(&e) => {
                let t = tcp.read_timeout().ok().flatten();
                return Err(no_answer("TLS handshake", t));
            }
            Err(e) => {
                return Err(Error::connection(e.kind(), &format!("TLS handshake: {e}")));
            }
        }
    }
    let write = tcp.try_clone().map_err(Error::io)?;
    let conn = Arc::new(Mutex::new(conn));
    Ok((
        ReadHalf {
            tcp,
            tls: Some(TlsRead {
                conn: Arc::clone(&conn),
                plain: Vec::new(),
                at: 0,
                raw: vec![0; 32 * 1024].into_boxed_slice(),
            }),
        },
        WriteHalf {
            tcp: write,
            tls: Some(conn),
            backlog: Mutex::new(Vec::new()),
        },
    ))
}

impl ReadHalf {
    /// The socket, for timeouts and shutdowns.
    pub(crate) fn tcp(&self) -> &TcpStream {
        &self.tcp
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl WriteHalf {
    /// Queues `bytes` behind what is queued and writes what the socket
    /// takes now, never waiting for it. `Ok(true)`: nothing is left to
    /// write; `Ok(false)`: the rest waits for [`flush`](Self::flush).
    pub(crate) fn send(&self, bytes: &[u8]) -> io::Result<bool> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            let mut conn = lock(tls);
            // No limit on what is buffered (see `tls`): never blocks.
            conn.writer().write_all(bytes)?;
            return drain(&mut conn, &self.tcp);
        }
        let mut backlog = lock(&self.backlog);
        if backlog.is_empty() {
            let n = write_now(&self.tcp, bytes)?;
            backlog.extend_from_slice(&bytes[n..]);
        } else {
            backlog.extend_from_slice(bytes);
            let n = write_now(&self.tcp, &backlog)?;
            backlog.drain(..n);
        }
        Ok(backlog.is_empty())
    }

    /// Writes what is queued, as far as the socket takes it now.
    /// `Ok(true)`: nothing is left.
    pub(crate) fn flush(&self) -> io::Result<bool> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            return drain(&mut lock(tls), &self.tcp);
        }
        let mut backlog = lock(&self.backlog);
        if !backlog.is_empty() {
            let n = write_now(&self.tcp, &backlog)?;
            backlog.drain(..n);
            if backlog.is_empty() {
                // What a large value left behind.
                backlog.shrink_to(64 * 1024);
            }
        }
        Ok(backlog.is_empty())
    }

    /// Waits until the socket can take more bytes (or is closed), at most
    /// `timeout`. No lock is held.
    pub(crate) fn writable(&self, timeout: Duration) {
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            let mut fd = libc::pollfd {
                fd: self.tcp.as_raw_fd(),
                events: libc::POLLOUT,
                revents: 0,
            };
            let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
            // SAFETY: `fd` is one valid, initialized `pollfd` that lives
            // through the call, and we pass a count of 1; the socket stays
            // open while `self` is borrowed. poll only reads the struct and
            // writes its `revents`.
            unsafe { libc::poll(&mut fd, 1, ms) };
        }
        #[cfg(not(unix))]
        std::thread::sleep(timeout.min(Duration::from_millis(1)));
    }

    /// Sends `bytes` whole, blocking up to the socket's write timeout: for
    /// handshakes and the slot table's connection, on threads of their
    /// own, before anything else is queued.
    pub(crate) fn send_all(&self, bytes: &[u8]) -> io::Result<()> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            let mut conn = lock(tls);
            conn.writer().write_all(bytes)?;
            while conn.wants_write() {
                conn.write_tls(&mut &self.tcp)?;
            }
            return Ok(());
        }
        (&self.tcp).write_all(bytes)
    }

    /// Closes both directions: the read half sees the end.
    pub(crate) fn shutdown(&self) {
        let _ = self.tcp.shutdown(Shutdown::Both);
    }

    /// Another handle of the socket, to shut it down from elsewhere.
    pub(crate) fn socket(&self) -> io::Result<TcpStream> {
        self.tcp.try_clone()
    }
}

/// Writes as much of `bytes` as the socket takes without waiting; how much.
fn write_now(tcp: &TcpStream, bytes: &[u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < bytes.len() {
        match NonBlocking(tcp).write(&bytes[n..]) {
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Writes the sealed TLS records as far as the socket takes them now.
/// `Ok(true)`: none is left.
#[cfg(feature = "tls")]
fn drain(conn: &mut rustls::ClientConnection, tcp: &TcpStream) -> io::Result<bool> {
    while conn.wants_write() {
        match conn.write_tls(&mut NonBlocking(tcp)) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// A socket written without waiting (`MSG_DONTWAIT`, for this write only:
/// the reader's reads on the same socket still block), and without
/// `SIGPIPE` where the platform has the flag.
struct NonBlocking<'a>(&'a TcpStream);

impl Write for NonBlocking<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        #[cfg(unix)]
        {
            #[cfg(any(target_os = "linux", target_os = "android"))]
            let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
            #[cfg(not(any(target_os = "linux", target_os = "android")))]
            let flags = libc::MSG_DONTWAIT;
            socket2::SockRef::from(self.0).send_with_flags(buf, flags)
        }
        #[cfg(not(unix))]
        {
            // No per-call flag: a short blocking write.
            let mut tcp = self.0;
            tcp.write(buf)
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for ReadHalf {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &mut self.tls {
            return tls.read(&self.tcp, buf);
        }
        self.tcp.read(buf)
    }
}

#[cfg(feature = "tls")]
impl TlsRead {
    fn read(&mut self, tcp: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.at < self.plain.len() {
                let n = buf.len().min(self.plain.len() - self.at);
                buf[..n].copy_from_slice(&self.plain[self.at..self.at + n]);
                self.at += n;
                return Ok(n);
            }
            self.plain.clear();
            self.at = 0;
            // Unlocked: the write half may send meanwhile.
            let n = (&mut &*tcp).read(&mut self.raw)?;
            if n == 0 {
                return Ok(0);
            }
            let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
            let mut ciphertext = &self.raw[..n];
            let mut closed = false;
            while !ciphertext.is_empty() {
                if conn.read_tls(&mut ciphertext)? == 0 {
                    break;
                }
                let state = conn
                    .process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                let k = state.plaintext_bytes_to_read();
                if k > 0 {
                    let from = self.plain.len();
                    self.plain.resize(from + k, 0);
                    conn.reader().read_exact(&mut self.plain[from..])?;
                }
                closed |= state.peer_has_closed();
            }
            // What the TLS layer answers on its own (key updates, alerts),
            // behind what callers queued: as far as the socket takes it
            // now; the rest goes with the next send or flush.
            drain(&mut conn, tcp)?;
            if closed && self.plain.is_empty() {
                return Ok(0);
            }
        }
    }
}

/// The client configuration of `rediss://` connections: the roots to trust
/// (the PEM certificates given, else the Mozilla roots of `webpki-roots`),
/// TLS 1.2 and 1.3, no client certificate.
#[cfg(feature = "tls")]
pub(crate) fn client_config(ca_pem: Option<&[u8]>) -> Result<Arc<rustls::ClientConfig>, Error> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| {
                    Error::Config(format!("tls_ca_pem: not a PEM certificate: {e}"))
                })?;
                roots
                    .add(cert)
                    .map_err(|e| Error::Config(format!("tls_ca_pem: {e}")))?;
            }
            if roots.is_empty() {
                return Err(Error::Config(
                    "tls_ca_pem: no CERTIFICATE block in the PEM".into(),
                ));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// `true` for the error of a socket read or write that timed out (Unix
/// says `WouldBlock`, "Resource temporarily unavailable", for a socket
/// timeout).
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// The error of a step of connecting (or of asking for the slot table)
/// that got no answer within the connect timeout `t` (a socket's timeout,
/// `None` if it has none): kind `TimedOut`, so [`Error::is_timeout`].
pub(crate) fn no_answer(what: &str, t: Option<Duration>) -> Error {
    let t = t.map_or_else(String::new, |t| format!(" ({t:?})"));
    Error::connection(
        io::ErrorKind::TimedOut,
        &format!("{what}: no answer within the connect timeout{t}"),
    )
}

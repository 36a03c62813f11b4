//! The byte stream of a connection, split in a read half (the one thread
//! that reads the connection) and a write half (callers, under the cache's
//! `link` lock): two handles of one TCP socket.

use crate::error::Error;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};

/// The read half.
pub(crate) struct ReadHalf {
    tcp: TcpStream,
}

/// The write half.
pub(crate) struct WriteHalf {
    tcp: TcpStream,
}

/// Splits a plain TCP connection.
pub(crate) fn plain(tcp: TcpStream) -> Result<(ReadHalf, WriteHalf), Error> {
    let write = tcp.try_clone().map_err(Error::io)?;
    Ok((ReadHalf { tcp }, WriteHalf { tcp: write }))
}

impl ReadHalf {
    /// The socket, for timeouts and shutdowns.
    pub(crate) fn tcp(&self) -> &TcpStream {
        &self.tcp
    }
}

impl WriteHalf {
    /// Sends `bytes` whole (blocking up to the socket's write timeout).
    pub(crate) fn send(&self, bytes: &[u8]) -> io::Result<()> {
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

impl Read for ReadHalf {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.tcp.read(buf)
    }
}

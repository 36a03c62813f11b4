//! A Redis Cluster's slot table as the cache reads it: the slot of a key
//! (CRC16), the redirects (`MOVED`, `ASK`) in server errors, the
//! `CLUSTER SLOTS` reply, and the connection on which it is asked for.
//! Nothing here holds a lock or knows of the links ([`crate::cluster`]).
//!
//! A node's address in an answer may be missing: with
//! `cluster-preferred-endpoint-type unknown-endpoint` the host is null in
//! `CLUSTER SLOTS` and empty in a redirect (`MOVED 3999 :7002`), and with
//! `hostname` and no hostname set it is `?`. Redis means "the node you
//! asked": both readers take the host of the node that answered.

use crate::connect::{self, Config};
use crate::error::Error;
use crate::wire::{self, ReadHalf, WriteHalf};
use redis::{Parser, Value};
use std::io;
use std::time::Duration;

/// Slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;

/// A node's address.
pub(crate) type Addr = (String, u16);

/// Slots `first..=last` and their primary.
pub(crate) type Range = (u16, u16, Addr);

/// How errors name a node of a cluster.
pub(crate) fn label(addr: &Addr) -> String {
    format!("cluster node {}:{}", addr.0, addr.1)
}

/// CRC16/XMODEM, as Redis Cluster uses it.
pub(crate) fn crc16(bytes: &[u8]) -> u16 {
    crc16_from(0, bytes)
}

/// The CRC16 of the bytes whose CRC16 is `crc` followed by `bytes`.
pub(crate) fn crc16_from(mut crc: u16, bytes: &[u8]) -> u16 {
    #[cfg(test)]
    CRC_BYTES.with(|n| n.set(n.get() + bytes.len() as u64));
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
thread_local! {
    /// Bytes through [`crc16_from`] on this thread (what a test counts).
    pub(crate) static CRC_BYTES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The slot of a Redis key: of its hash tag (the bytes between the first
/// `{` and the next `}`, if not empty), else of the whole key.
pub(crate) fn slot(name: &[u8]) -> u16 {
    let tagged = name.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &name[open + 1..];
        let len = rest.iter().position(|&b| b == b'}')?;
        (len > 0).then(|| &rest[..len])
    });
    crc16(tagged.unwrap_or(name)) % SLOTS as u16
}

/// A host as a node names another: empty or `?` (no endpoint known to it)
/// is the host of the node that answered, `asked`.
fn host_or(host: &str, asked: &str) -> String {
    if host.is_empty() || host == "?" {
        asked.to_string()
    } else {
        host.to_string()
    }
}

/// A redirect in a server error: `MOVED <slot> <host>:<port>` or `ASK ...`.
pub(crate) struct Redirect {
    pub(crate) ask: bool,
    pub(crate) slot: u16,
    pub(crate) addr: Addr,
}

impl Redirect {
    /// The redirect in `e`, an error of the node at host `asked`.
    pub(crate) fn parse(e: &Error, asked: &str) -> Option<Redirect> {
        let Error::Server(m) = e else { return None };
        let mut words = m.split_whitespace();
        let ask = match words.next()? {
            "MOVED" => false,
            "ASK" => true,
            _ => return None,
        };
        let slot = words.next()?.parse().ok()?;
        let (host, port) = words.next()?.rsplit_once(':')?;
        Some(Redirect {
            ask,
            slot,
            addr: (host_or(host, asked), port.parse().ok()?),
        })
    }
}

/// The slot ranges and their primaries in a `CLUSTER SLOTS` reply of the
/// node at host `asked`, sorted, with adjacent ranges of one primary
/// merged (so two answers compare equal when they map every slot alike).
pub(crate) fn parse_slots(reply: &Value, asked: &str) -> Result<Vec<Range>, Error> {
    let bad = || Error::Protocol(format!("CLUSTER SLOTS answered {reply:?}"));
    let Value::Array(ranges) = reply else {
        return Err(bad());
    };
    let mut out = Vec::new();
    for r in ranges {
        let Value::Array(f) = r else {
            return Err(bad());
        };
        let (Some(Value::Int(a)), Some(Value::Int(b)), Some(Value::Array(primary))) =
            (f.first(), f.get(1), f.get(2))
        else {
            return Err(bad());
        };
        let host = match primary.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            // `unknown-endpoint`: the node asked.
            Some(Value::Nil) => String::new(),
            _ => return Err(bad()),
        };
        let Some(Value::Int(port)) = primary.get(1) else {
            return Err(bad());
        };
        let (a, b, port) = (
            u16::try_from(*a).map_err(|_| bad())?,
            u16::try_from(*b).map_err(|_| bad())?,
            u16::try_from(*port).map_err(|_| bad())?,
        );
        if a > b || usize::from(b) >= SLOTS {
            return Err(bad());
        }
        out.push((a, b, (host_or(&host, asked), port)));
    }
    Ok(normalize(out))
}

/// `ranges` sorted by first slot, adjacent ranges of one node merged.
pub(crate) fn normalize(mut ranges: Vec<Range>) -> Vec<Range> {
    ranges.sort_by_key(|r| r.0);
    let mut out: Vec<Range> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if last.2 == r.2 && u32::from(last.1) + 1 == u32::from(r.0) => {
                last.1 = r.1;
            }
            _ => out.push(r),
        }
    }
    out
}

/// The connection on which the slot table is asked for (kept open between
/// refreshes; no tracking, so nothing but replies comes on it).
pub(crate) struct SlotsConn {
    read: ReadHalf,
    write: WriteHalf,
    parser: Parser,
    timeout: Duration,
}

impl SlotsConn {
    /// Connects to `addr` and asks for the slot table. Errors name the
    /// node.
    pub(crate) fn open(base: &Config, addr: &Addr) -> Result<(SlotsConn, Vec<Range>), Error> {
        let mut cfg = base.clone();
        (cfg.host, cfg.port) = addr.clone();
        let (mut read, write) = connect::dial(&cfg).map_err(|e| e.at(&label(addr)))?;
        let cmds = [
            ("HELLO", connect::hello(&cfg)),
            ("CLUSTER SLOTS", redis::cmd("CLUSTER").arg("SLOTS").clone()),
        ];
        let mut parser = Parser::new();
        let replies = connect::handshake(&mut read, &write, &mut parser, &cmds, &[], |_| {})
            .map_err(|e| match e {
                Error::Server(m) if m.contains("cluster support disabled") => {
                    Error::Config(format!(
                        "{}:{} is not a Redis Cluster node: use NearCache::builder for one server",
                        addr.0, addr.1
                    ))
                }
                e => e.at(&label(addr)),
            })?;
        let ranges = parse_slots(&replies[1], &addr.0).map_err(|e| e.at(&label(addr)))?;
        let conn = SlotsConn {
            read,
            write,
            parser,
            timeout: cfg.connect_timeout,
        };
        Ok((conn, ranges))
    }

    /// Asks the node at `addr` (this connection's) for the slot table
    /// again, waiting at most the connect timeout (as for the handshake):
    /// a stalled node holds the refresher, and a cache's drop, no longer
    /// than that. Errors name the node.
    pub(crate) fn ask(&mut self, addr: &Addr) -> Result<Vec<Range>, Error> {
        self.ask_at(&addr.0).map_err(|e| e.at(&label(addr)))
    }

    fn ask_at(&mut self, asked: &str) -> Result<Vec<Range>, Error> {
        self.read
            .tcp()
            .set_read_timeout(Some(self.timeout))
            .map_err(Error::io)?;
        self.write
            .send_all(b"*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n")
            .map_err(Error::io)?;
        let reply = self.parser.parse_value(&mut self.read).map_err(|e| {
            if e.is_timeout() {
                wire::no_answer("waiting for the reply to CLUSTER SLOTS", Some(self.timeout))
            } else {
                Error::connection(io::ErrorKind::InvalidData, &e.to_string())
            }
        })?;
        match reply {
            Value::ServerError(e) => Err(Error::Server(format!(
                "CLUSTER SLOTS: {}",
                connect::server_error(&e)
            ))),
            reply => parse_slots(&reply, asked),
        }
    }
}

impl Drop for SlotsConn {
    fn drop(&mut self) {
        self.write.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_and_slots_match_redis() {
        // The check value of CRC16/XMODEM, and the Redis Cluster spec's.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        // Hash tags: the first {...} with something inside.
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }

    #[test]
    fn redirects_parse() {
        let moved = |m: &str| Redirect::parse(&Error::Server(m.into()), "10.0.0.9");
        let r = moved("MOVED 3999 127.0.0.1:6381").unwrap();
        assert!(!r.ask);
        assert_eq!((r.slot, r.addr), (3999, ("127.0.0.1".to_string(), 6381)));
        let r = moved("ASK 1 ::1:7000").unwrap();
        assert!(r.ask);
        assert_eq!(r.addr, ("::1".to_string(), 7000));
        assert!(moved("WRONGTYPE x").is_none());
        // No endpoint known to the node (`unknown-endpoint`: empty; a
        // missing hostname: `?`): the node asked, at the port named.
        let r = moved("MOVED 3999 :6381").unwrap();
        assert_eq!(r.addr, ("10.0.0.9".to_string(), 6381));
        let r = moved("ASK 7 ?:6382").unwrap();
        assert_eq!((r.ask, r.addr), (true, ("10.0.0.9".to_string(), 6382)));
    }

    #[test]
    fn slot_tables_parse_with_null_hosts_and_normalize() {
        let node = |h: Value, p: i64| Value::Array(vec![h, Value::Int(p)]);
        let range = |a: i64, b: i64, n: Value| Value::Array(vec![Value::Int(a), Value::Int(b), n]);
        let reply = Value::Array(vec![
            range(100, 16383, node(Value::BulkString(b"?".to_vec()), 7002)),
            range(0, 49, node(Value::Nil, 7001)),
            range(50, 99, node(Value::BulkString(b"".to_vec()), 7001)),
        ]);
        let at = |p: u16| ("10.0.0.9".to_string(), p);
        assert_eq!(
            parse_slots(&reply, "10.0.0.9").unwrap(),
            vec![(0, 99, at(7001)), (100, 16383, at(7002))]
        );
        let bad = Value::Array(vec![range(0, 1, node(Value::Int(3), 7001))]);
        assert!(matches!(parse_slots(&bad, "h"), Err(Error::Protocol(_))));
    }
}

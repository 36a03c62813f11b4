//! The link's reader thread: it applies the replies and the invalidation
//! pushes one by one in wire order, and is the only writer of the near
//! map (see the ground rules in [`crate::link`]). A lost connection ends
//! it, and its cleanup fails the pending calls and drops every near copy.

use super::{OnDrop, SLACK, Shared, nanos};
use crate::codec::{self, CacheKey, CacheValue};
use crate::error::Error;
use crate::monitor::Counters;
use crate::op::{self, Op};
use crate::reply;
use crate::script::Leased;
use crate::wire::ReadHalf;
use expiremap::Clock;
use redis::{Parser, PushKind, Value};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl<K: CacheKey, V: CacheValue> Shared<K, V> {
    /// Stores a near copy whose Redis key had `ttl` left (`None`: no
    /// expiry) when the command was sent at `sent`.
    fn store(&self, key: K, value: V, sent: u64, ttl: Option<Duration>) {
        let elapsed = Duration::from_nanos(self.clock.now().saturating_sub(sent));
        let left = match ttl {
            Some(t) => t.saturating_sub(elapsed + SLACK),
            None => Duration::MAX,
        }
        .min(self.cfg.max_near_ttl);
        if left.is_zero() {
            self.near.remove(&key);
        } else {
            self.near.put(key, value, left);
        }
    }

    fn invalidate(&self, data: Vec<Value>) {
        match data.into_iter().next() {
            Some(Value::Array(names) | Value::Set(names)) => {
                for name in names {
                    if let Value::BulkString(name) = &name {
                        self.cfg.waiters.wake(name);
                    }
                    if let Value::BulkString(name) = name
                        && let Some(k) = codec::key_of::<K>(&self.cfg.prefix, &name)
                    {
                        Counters::add(&self.cfg.monitor.invalidations);
                        self.near.remove(&k);
                    }
                }
            }
            // A null list: the server flushed its databases.
            _ => {
                Counters::add(&self.cfg.monitor.invalidations);
                self.near.clear();
                self.cfg.waiters.wake_all();
            }
        }
    }

    fn apply(&self, op: Op<K, V>, reply: Value) {
        if let Value::ServerError(e) = reply {
            if let Some(k) = op.key() {
                self.near.remove(k);
            }
            return match op {
                // A command of a `MULTI` not queued: its `EXEC` fails with this.
                Op::Asking => self.queue_refused(&e),
                Op::Set {
                    aborted: Some(first),
                    tx,
                    ..
                } => tx.send(Err(first)),
                op => {
                    let e = op::at_step(&e, op.step());
                    op.fail(e);
                }
            };
        }
        match op {
            Op::Asking => {}
            Op::Ping { sent } => {
                let until = sent.saturating_add(nanos(self.cfg.staleness));
                self.fresh_until.fetch_max(until, Ordering::AcqRel);
            }
            Op::Fetch { key, sent, tx } => {
                let r = self.fetched(key, sent, reply);
                tx.send(r);
            }
            Op::Lease { key, sent, tx } => {
                let r = self.leased(key, sent, reply);
                tx.send(r);
            }
            Op::Release { tx, .. } => tx.send(Ok(())),
            Op::Set {
                key,
                value,
                ttl,
                sent,
                tx,
                step,
                ..
            } => {
                let r = op::written(reply, step);
                match r {
                    Ok(true) => {
                        self.wake_key(&key);
                        self.store(key, value, sent, Some(ttl));
                    }
                    Ok(false) => {}
                    Err(_) => drop(self.near.remove(&key)),
                }
                tx.send(r);
            }
            Op::Del { key, tx } => {
                self.near.remove(&key);
                self.wake_key(&key);
                let r = match reply {
                    Value::Nil | Value::Boolean(false) => Ok(None),
                    Value::BulkString(b) => codec::decode_value(&b).map(Some).map_err(|mut e| {
                        e.message.push_str(" (the key was deleted all the same)");
                        Error::from(e)
                    }),
                    other => Err(Error::Protocol(format!("GETDEL answered {other:?}"))),
                };
                tx.send(r);
            }
        }
    }

    /// The reader thread: applies replies and pushes until the connection
    /// ends, then cleans up (also if it ends in a panic of user code).
    pub(super) fn read_loop(self: Arc<Self>, mut stream: ReadHalf, mut parser: Parser) {
        let _cleanup = OnDrop(|| self.reader_ended());
        loop {
            let value = match parser.parse_value(&mut stream) {
                Ok(v) => v,
                Err(_) => break,
            };
            match value {
                Value::Push {
                    kind: PushKind::Invalidate,
                    data,
                } => self.invalidate(data),
                Value::Push { .. } => {}
                reply => {
                    let op = {
                        let mut link = self.link();
                        let Some(conn) = link.as_mut() else { break };
                        let op = conn.pending.pop_front();
                        if let Some(Op::Ping { .. }) = op {
                            conn.ping_sent = None;
                            self.ping_out.store(0, Ordering::Release);
                        }
                        op
                    };
                    match op {
                        Some(op) => self.apply(op, reply),
                        // A reply nobody asked for: the stream is out of step.
                        None => break,
                    }
                }
            }
        }
    }

    /// After the reader's last message: the connection is lost.
    fn reader_ended(&self) {
        self.fresh_until.store(0, Ordering::Release);
        self.lower_floor();
        self.ping_out.store(0, Ordering::Release);
        let conn = self.link().take();
        if let Some(conn) = conn {
            conn.stream.shutdown();
            for op in conn.pending {
                op.fail(reply::lost());
            }
        }
        // Invalidations may have been missed from the moment the connection
        // broke: no near copy survives it, and lease waits look again.
        self.near.clear();
        self.cfg.waiters.wake_all();
        if let Some(t) = self.supervisor.get() {
            t.unpark();
        }
    }

    /// The first `MULTI` op waiting after a refused command keeps its
    /// error, naming the op's step.
    fn queue_refused(&self, e: &redis::ServerError) {
        if let Some(conn) = self.link().as_mut()
            && let Some(Op::Set { aborted, step, .. }) = conn
                .pending
                .iter_mut()
                .find(|op| matches!(op, Op::Set { .. }))
        {
            aborted.get_or_insert_with(|| op::at_step(e, step));
        }
    }

    /// The reply of a miss's read (the value and its PTTL), keeping a near
    /// copy; also the value of [`LEASE`]'s reply.
    fn fetched(&self, key: K, sent: u64, reply: Value) -> Result<Option<V>, Error> {
        let bad = |what: &Value| Error::Protocol(format!("fetch script answered {what:?}"));
        let Value::Array(items) = &reply else {
            self.near.remove(&key);
            return Err(bad(&reply));
        };
        let (value, pttl) = match items.as_slice() {
            [v, Value::Int(pttl)] => (v, *pttl),
            _ => {
                self.near.remove(&key);
                return Err(bad(&reply));
            }
        };
        match value {
            Value::BulkString(bytes) => match codec::decode_value::<V>(bytes) {
                Ok(v) => {
                    let ttl = match pttl {
                        -1 => None,
                        ms if ms >= 0 => Some(Duration::from_millis(ms as u64)),
                        // Gone between GET and PTTL cannot happen in a script;
                        // keep no copy if it does.
                        _ => Some(Duration::ZERO),
                    };
                    self.store(key, v.clone(), sent, ttl);
                    Ok(Some(v))
                }
                Err(e) => {
                    self.near.remove(&key);
                    Err(e.into())
                }
            },
            Value::Nil | Value::Boolean(false) => {
                self.near.remove(&key);
                Ok(None)
            }
            _ => {
                self.near.remove(&key);
                Err(bad(&reply))
            }
        }
    }

    /// Wakes the lease waits on `key` (after our own write of it, of which
    /// `NOLOOP` sends us no invalidation).
    fn wake_key(&self, key: &K) {
        if self.cfg.waiters.active()
            && let Ok(name) = codec::redis_key(&self.cfg.prefix, key)
        {
            self.cfg.waiters.wake(&name);
        }
    }

    /// The reply of [`LEASE`].
    fn leased(&self, key: K, sent: u64, reply: Value) -> Result<Leased<V>, Error> {
        if let Value::Array(items) = &reply
            && let [Value::Nil | Value::Boolean(false), Value::Int(n)] = items.as_slice()
        {
            return Ok(match *n {
                -3 => Leased::Mine,
                ms if ms >= 0 => Leased::Held(Some(Duration::from_millis(ms as u64))),
                _ => Leased::Held(None),
            });
        }
        Ok(match self.fetched(key, sent, reply)? {
            Some(v) => Leased::Value(v),
            None => Leased::Held(None),
        })
    }
}

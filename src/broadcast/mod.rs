//! Temporary stand-in with the pinned API of the broadcast area, so the map
//! can be built and tested while the lock-free ring is written on its own
//! branch. It is replaced wholesale when that branch lands.
#![allow(missing_docs, missing_debug_implementations)]

use crate::sync::{Arc, Condvar, Mutex};
use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

struct State<T> {
    buf: VecDeque<T>,
    head: u64, // generation of buf[0]
    readers: Vec<Option<u64>>,
    senders: usize,
}

struct Shared<T> {
    cap: usize,
    state: Mutex<State<T>>,
    cv: Condvar,
}

pub struct Sender<T>(Arc<Shared<T>>);
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
    slot: usize,
}

macro_rules! err {
    ($name:ident { $($v:ident $(($t:ty))?),* }) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($v $(($t))?),* }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { fmt::Debug::fmt(self, f) }
        }
        impl std::error::Error for $name {}
    };
}
err!(RecvError { Lagged(u64), Closed });
err!(TryRecvError { Empty, Lagged(u64), Closed });
err!(RecvTimeoutError { Timeout, Lagged(u64), Closed });
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscribeError {
    RegistryFull { max_readers: usize },
}
impl fmt::Display for SubscribeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
impl std::error::Error for SubscribeError {}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildError {
    Capacity(usize),
    MaxReaders(usize),
}
impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
impl std::error::Error for BuildError {}

impl<T: Send + Sync> Sender<T> {
    pub fn new(capacity: usize, max_readers: usize) -> Result<Self, BuildError> {
        if capacity == 0 || !capacity.is_power_of_two() {
            return Err(BuildError::Capacity(capacity));
        }
        if max_readers == 0 {
            return Err(BuildError::MaxReaders(max_readers));
        }
        Ok(Self(Arc::new(Shared {
            cap: capacity,
            state: Mutex::new(State {
                buf: VecDeque::new(),
                head: 0,
                readers: vec![None; max_readers],
                senders: 1,
            }),
            cv: Condvar::new(),
        })))
    }
    pub fn send(&self, value: T) {
        let old = {
            let mut s = self.0.state.lock();
            s.buf.push_back(value);
            let old = if s.buf.len() > self.0.cap {
                s.head += 1;
                s.buf.pop_front()
            } else {
                None
            };
            self.0.cv.notify_all();
            old
        };
        drop(old);
    }
    pub fn subscribe(&self) -> Result<Receiver<T>, SubscribeError> {
        let mut s = self.0.state.lock();
        let next = s.head + s.buf.len() as u64;
        let max_readers = s.readers.len();
        let slot = s
            .readers
            .iter()
            .position(Option::is_none)
            .ok_or(SubscribeError::RegistryFull { max_readers })?;
        s.readers[slot] = Some(next);
        Ok(Receiver {
            shared: self.0.clone(),
            slot,
        })
    }
    pub fn receiver_count(&self) -> usize {
        self.0.state.lock().readers.iter().flatten().count()
    }
    pub fn capacity(&self) -> usize {
        self.0.cap
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.0.state.lock().senders += 1;
        Self(self.0.clone())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        self.0.state.lock().senders -= 1;
        self.0.cv.notify_all();
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.shared.state.lock().readers[self.slot] = None;
    }
}

impl<T: Clone + Send + Sync> Receiver<T> {
    fn poll(&mut self) -> Result<T, TryRecvError> {
        let mut s = self.shared.state.lock();
        let pos = s.readers[self.slot].unwrap();
        if pos < s.head {
            s.readers[self.slot] = Some(s.head);
            return Err(TryRecvError::Lagged(s.head - pos));
        }
        let i = (pos - s.head) as usize;
        if let Some(v) = s.buf.get(i).cloned() {
            s.readers[self.slot] = Some(pos + 1);
            return Ok(v);
        }
        if s.senders == 0 {
            Err(TryRecvError::Closed)
        } else {
            Err(TryRecvError::Empty)
        }
    }
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        self.poll()
    }
    pub fn recv(&mut self) -> Result<T, RecvError> {
        loop {
            match self.poll() {
                Ok(v) => return Ok(v),
                Err(TryRecvError::Lagged(n)) => return Err(RecvError::Lagged(n)),
                Err(TryRecvError::Closed) => return Err(RecvError::Closed),
                Err(TryRecvError::Empty) => {}
            }
            let mut s = self.shared.state.lock();
            let pos = s.readers[self.slot].unwrap();
            if pos == s.head + s.buf.len() as u64 && s.senders > 0 {
                self.shared.cv.wait(&mut s);
            }
        }
    }
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        let end = Instant::now() + timeout;
        loop {
            match self.poll() {
                Ok(v) => return Ok(v),
                Err(TryRecvError::Lagged(n)) => return Err(RecvTimeoutError::Lagged(n)),
                Err(TryRecvError::Closed) => return Err(RecvTimeoutError::Closed),
                Err(TryRecvError::Empty) => {}
            }
            let now = Instant::now();
            if now >= end {
                return Err(RecvTimeoutError::Timeout);
            }
            let mut s = self.shared.state.lock();
            let pos = s.readers[self.slot].unwrap();
            if pos == s.head + s.buf.len() as u64 && s.senders > 0 {
                self.shared.cv.wait_for(&mut s, end - now);
            }
        }
    }
    pub fn try_recv_batch(&mut self, out: &mut Vec<T>, max: usize) -> Result<usize, TryRecvError> {
        let mut n = 0;
        while n < max {
            match self.poll() {
                Ok(v) => {
                    out.push(v);
                    n += 1;
                }
                Err(TryRecvError::Empty) if n > 0 => break,
                Err(e) if n == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(n)
    }
}

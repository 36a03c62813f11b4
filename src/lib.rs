//! expiremap: a concurrent expiring key-value map.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod sync;

pub mod broadcast;
pub mod clock;
pub mod timer;

pub use clock::{Clock, ManualClock, SystemClock};
mod map;

pub use broadcast::{RecvError, RecvTimeoutError, SubscribeError, TryRecvError};
pub use map::{
    BuildError, Builder, Cause, DEFAULT_EVENT_CAPACITY, DEFAULT_EVICTION_INTERVAL,
    DEFAULT_MAX_SUBSCRIBERS, DEFAULT_PRECISION, Event, ExpireMap, MAX_EVENT_CAPACITY, MAX_PERIOD,
    MAX_SHARDS, MAX_SUBSCRIBERS, MIN_EVICTION_INTERVAL, MIN_PRECISION, Stats, Subscriber,
};

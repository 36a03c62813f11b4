//! expiremap: a concurrent expiring key-value map.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod sync;

pub mod broadcast;
pub mod clock;
pub mod timer;

pub use clock::{Clock, ManualClock, SystemClock};

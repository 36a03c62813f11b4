//! User code that panics where the map holds values or locks: helpers that
//! keep such a panic from dropping a user value under a shard lock, or from
//! cutting short work that must reach every value (publishing a batch,
//! draining a shard).
//!
//! # Ground rules
//!
//! * A panic caught here is resumed on the caller's thread once the work is
//!   done and every lock is released, unless the thread is already
//!   unwinding (a second panic would abort the process), or the caller
//!   must return a value it holds: then it is dropped.
//! * Nothing here takes a lock or runs user code of its own.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

/// A caught panic's payload.
pub(crate) type Panic = Box<dyn Any + Send + 'static>;

/// Clones `k`, then `v`. If `V::clone` panics, the key's clone comes back
/// with the panic, for the caller to drop once it has released its lock
/// (dropped during the unwind, it would run `K::drop` under the lock).
#[inline]
pub(crate) fn clone_pair<K: Clone, V: Clone>(k: &K, v: &V) -> Result<(K, V), (K, Panic)> {
    let k = k.clone();
    match catch_unwind(AssertUnwindSafe(|| v.clone())) {
        Ok(v) => Ok((k, v)),
        Err(p) => Err((k, p)),
    }
}

/// After a lock is released: drops what a panicking clone had made under
/// it, then resumes that panic (nothing, if no clone panicked).
pub(crate) fn resume_after_unlock<K>(unwound: Option<(K, Panic)>) {
    if let Some((made, panic)) = unwound {
        drop(made);
        resume_unwind(panic);
    }
}

/// The first panic of several pieces of work that must all run, whatever
/// user code does in any of them.
#[derive(Default)]
pub(crate) struct Panics(Option<Panic>);

impl Panics {
    pub(crate) fn new() -> Self {
        Self(None)
    }

    /// Runs `f`, keeping its panic (the first one) for [`resume`](Self::resume).
    pub(crate) fn run<R>(&mut self, f: impl FnOnce() -> R) -> Option<R> {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(r) => Some(r),
            Err(p) => {
                match self.0 {
                    None => self.0 = Some(p),
                    Some(_) => forget_payload(p),
                }
                None
            }
        }
    }

    /// Keeps `p` as if [`run`](Self::run) had caught it.
    pub(crate) fn keep(&mut self, p: Panic) {
        match self.0 {
            None => self.0 = Some(p),
            Some(_) => forget_payload(p),
        }
    }

    /// Drops each of `values`, one at a time, so that a panicking `Drop` of
    /// one still drops the others (a slice's drop glue aborts on a second
    /// panic).
    pub(crate) fn drop_each<T>(&mut self, values: impl IntoIterator<Item = T>) {
        for v in values {
            self.run(move || drop(v));
        }
    }

    /// Drops the panic caught, if any, without resuming it: for a call
    /// that must return a value it holds (see `map::Inner::leave`).
    pub(crate) fn forget(self) {
        if let Some(p) = self.0 {
            forget_payload(p);
        }
    }

    /// Resumes the first panic caught, if any. On a thread that is already
    /// unwinding it is dropped instead.
    pub(crate) fn resume(self) {
        if let Some(p) = self.0 {
            if std::thread::panicking() {
                forget_payload(p);
            } else {
                resume_unwind(p);
            }
        }
    }
}

/// Drops a second panic's payload, which may itself panic in `Drop`; if
/// it does, that payload is leaked rather than abort the process.
fn forget_payload(p: Panic) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(p))) {
        std::mem::forget(again);
    }
}

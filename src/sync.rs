//! The one shim for every synchronization primitive.
//!
//! Nothing else in the crate names `std::sync`, `std::thread`, `parking_lot`
//! or `loom`. Under `--cfg expiremap_loom` every primitive switches to its
//! loom model, so the `loom-tests` crate explores the real protocols.
//!
//! The locks expose `parking_lot`'s non-poisoning API in both builds
//! (`lock()` returns the guard, `Condvar::wait(&mut guard)`), as tokio's
//! `loom/mocked.rs` does for loom's std-shaped locks.

pub(crate) use crossbeam_utils::CachePadded;

pub(crate) mod biased;

#[cfg(not(expiremap_loom))]
mod imp {
    pub(crate) use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard};
    pub(crate) use std::hint::spin_loop;
    pub(crate) use std::sync::Arc;
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use std::thread;

    /// Exclusive access to an atomic's value (`get_mut`; loom's `with_mut`).
    #[inline(always)]
    pub(crate) fn with_mut_u32<R>(a: &mut AtomicU32, f: impl FnOnce(&mut u32) -> R) -> R {
        f(a.get_mut())
    }

    /// `UnsafeCell` with loom's closure-based access API.
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }

    /// A lock and condition variable on std's futex-based primitives, with
    /// the same parking_lot-shaped API as [`Mutex`] and [`Condvar`]. Used
    /// where Miri must run with `-Zmiri-strict-provenance` (the CI setting):
    /// parking_lot_core's contended word lock casts integers to pointers,
    /// which that mode rejects. Poisoning is ignored, as in parking_lot.
    pub(crate) mod futex {
        use std::ops::{Deref, DerefMut};
        use std::sync::PoisonError;
        use std::time::Duration;

        /// std's mutex behind parking_lot's API.
        #[derive(Debug, Default)]
        pub(crate) struct Mutex<T>(std::sync::Mutex<T>);

        /// Guard of [`Mutex`]; the `Option` lets `Condvar::wait` take it by `&mut`.
        #[derive(Debug)]
        pub(crate) struct MutexGuard<'a, T>(Option<std::sync::MutexGuard<'a, T>>);

        impl<T> Mutex<T> {
            pub(crate) const fn new(value: T) -> Self {
                Self(std::sync::Mutex::new(value))
            }
            pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
                MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
            }
        }

        impl<T> Deref for MutexGuard<'_, T> {
            type Target = T;
            fn deref(&self) -> &T {
                self.0.as_ref().expect("guard present outside wait")
            }
        }
        impl<T> DerefMut for MutexGuard<'_, T> {
            fn deref_mut(&mut self) -> &mut T {
                self.0.as_mut().expect("guard present outside wait")
            }
        }

        /// Mirrors `parking_lot::WaitTimeoutResult`.
        #[derive(Debug, Clone, Copy)]
        pub(crate) struct WaitTimeoutResult(bool);
        impl WaitTimeoutResult {
            pub(crate) fn timed_out(self) -> bool {
                self.0
            }
        }

        /// std's condition variable behind parking_lot's API.
        #[derive(Debug, Default)]
        pub(crate) struct Condvar(std::sync::Condvar);

        impl Condvar {
            pub(crate) const fn new() -> Self {
                Self(std::sync::Condvar::new())
            }
            pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
                let g = guard.0.take().expect("guard present outside wait");
                guard.0 = Some(self.0.wait(g).unwrap_or_else(PoisonError::into_inner));
            }
            pub(crate) fn wait_for<T>(
                &self,
                guard: &mut MutexGuard<'_, T>,
                timeout: Duration,
            ) -> WaitTimeoutResult {
                let g = guard.0.take().expect("guard present outside wait");
                let (g, r) = self
                    .0
                    .wait_timeout(g, timeout)
                    .unwrap_or_else(PoisonError::into_inner);
                guard.0 = Some(g);
                WaitTimeoutResult(r.timed_out())
            }
            pub(crate) fn notify_all(&self) {
                self.0.notify_all();
            }
        }
    }

    /// Whether `Condvar::wait_for` can really time out. Under loom it cannot.
    pub(crate) const TIMED_WAITS: bool = true;

    /// A read lock that does not queue behind waiting writers, so a thread
    /// that already holds a read lock (via user code re-entering) cannot
    /// deadlock against a writer.
    #[inline]
    pub(crate) fn read_recursive<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
        lock.read_recursive()
    }

    /// Spawns a named thread.
    pub(crate) fn spawn_named<F>(name: &str, f: F) -> std::io::Result<thread::JoinHandle<()>>
    where
        F: FnOnce() + Send + 'static,
    {
        thread::Builder::new().name(name.to_owned()).spawn(f)
    }

    /// Cores available to this process (1 if unknown).
    pub(crate) fn available_parallelism() -> usize {
        thread::available_parallelism().map_or(1, usize::from)
    }
}

#[cfg(expiremap_loom)]
mod imp {
    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::hint::spin_loop;
    pub(crate) use loom::sync::Arc;
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use loom::thread;

    /// Exclusive access to an atomic's value (`get_mut`; loom's `with_mut`).
    pub(crate) fn with_mut_u32<R>(a: &mut AtomicU32, f: impl FnOnce(&mut u32) -> R) -> R {
        a.with_mut(f)
    }
    use std::ops::{Deref, DerefMut};
    use std::time::Duration;

    /// loom's mutex behind parking_lot's API.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    /// Guard of [`Mutex`]; the `Option` lets `Condvar::wait` take it by `&mut`.
    #[derive(Debug)]
    pub(crate) struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap()))
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().unwrap()
        }
    }
    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().unwrap()
        }
    }

    /// loom's condition variable behind parking_lot's API.
    #[derive(Debug)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    /// Mirrors `parking_lot::WaitTimeoutResult`.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct WaitTimeoutResult(bool);
    impl WaitTimeoutResult {
        pub(crate) fn timed_out(self) -> bool {
            self.0
        }
    }

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(loom::sync::Condvar::new())
        }
        pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let g = guard.0.take().unwrap();
            guard.0 = Some(self.0.wait(g).unwrap());
        }
        /// loom has no time: a timed wait is an untimed wait that may also
        /// wake spuriously, which every caller must tolerate anyway.
        pub(crate) fn wait_for<T>(
            &self,
            guard: &mut MutexGuard<'_, T>,
            _timeout: Duration,
        ) -> WaitTimeoutResult {
            self.wait(guard);
            WaitTimeoutResult(false)
        }
        pub(crate) fn notify_one(&self) -> bool {
            self.0.notify_one();
            true
        }
        pub(crate) fn notify_all(&self) -> usize {
            self.0.notify_all();
            0
        }
    }

    /// loom's rwlock behind parking_lot's API.
    #[derive(Debug)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);
    pub(crate) type RwLockReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
    pub(crate) type RwLockWriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::RwLock::new(value))
        }
        pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read().unwrap()
        }
        pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write().unwrap()
        }
    }

    /// Under loom the `futex` pair is loom's lock and condition variable,
    /// like [`Mutex`] and [`Condvar`].
    pub(crate) mod futex {
        pub(crate) use super::{Condvar, Mutex, MutexGuard};
    }

    /// Whether `Condvar::wait_for` can really time out. Under loom it cannot.
    pub(crate) const TIMED_WAITS: bool = false;

    /// loom's rwlock has no writer preference to worry about.
    pub(crate) fn read_recursive<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
        lock.read()
    }

    /// loom threads have no names.
    pub(crate) fn spawn_named<F>(_name: &str, f: F) -> std::io::Result<thread::JoinHandle<()>>
    where
        F: FnOnce() + Send + 'static,
    {
        Ok(thread::spawn(f))
    }

    /// One core: keeps loom models small.
    pub(crate) fn available_parallelism() -> usize {
        1
    }
}

pub(crate) use imp::*;

/// std's primitives in every build, loom's included: for bookkeeping whose
/// critical sections hold no loom-modelled operation (so that, under loom,
/// they are never contended across a switch of threads), and which no
/// protocol relies on for its correctness: today only the graph of waits
/// that turns a cycle of single-flight waits into a panic (`map::load`).
pub(crate) mod unmodeled {
    pub(crate) use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
    pub(crate) use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
}

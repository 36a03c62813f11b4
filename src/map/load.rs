//! Single-flight loading for [`ExpireMap::get_or_insert_with`]: at most one
//! caller per key runs its `init` at a time; the others park until it ends.
//!
//! # Protocol
//!
//! * A caller that misses registers a [`Load`] under its key's 64-bit hash
//!   in [`Loads`] (a mutex over a hash map; it holds no user code), raises
//!   `in_flight`, and then looks the key up once more: a value put between
//!   its miss and its registration is found then, and returned.
//! * Every write to an entry (`put`, `put_if_absent`, `remove`, `clear`)
//!   reads `in_flight` under its shard's write lock and, if any load is in
//!   flight, marks the load of its key's hash (all of them, for `clear`)
//!   as *touched*, still under that lock. The loader stores its value under
//!   the same shard lock only if its load is not touched: a write during
//!   the load wins, and the loaded value is only returned. The lock orders
//!   the two: a write either comes before the loader's second look (which
//!   then sees it) or sees `in_flight` raised (the loader raised it before
//!   that look, and the look's read lock was released before the write's
//!   write lock was taken).
//! * Others that miss find the registered load and park on its condition
//!   variable (no spinning). When it ends they take its value (a clone), or,
//!   if `init` failed or panicked, try again: one of them loads next. A
//!   load of another key with the same hash makes a caller wait for it and
//!   then look again, which is slower but correct.
//! * `init` runs with no lock held, so it may use the map for other keys.
//!   Asking for its own key from inside `init` would wait for itself: that
//!   is detected (the load records its thread) and panics with a message.

use crate::sync::{Arc, AtomicBool, AtomicUsize, Condvar, Mutex, Ordering, thread};
use std::collections::HashMap;

/// The loads in flight, by key hash. The registry's own hasher is fixed
/// (its keys are already the map's hashes), so that the map behaves the
/// same in every run of a loom model.
pub(crate) struct Loads<K, V> {
    in_flight: AtomicUsize,
    map: Mutex<Registry<K, V>>,
}

/// Loads by key hash.
type Registry<K, V> = HashMap<u64, Arc<Load<K, V>>, FixedState>;
type FixedState = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// One key's load.
pub(crate) struct Load<K, V> {
    pub(crate) key: K,
    state: Mutex<State<V>>,
    ended: Condvar,
    /// A write to this key's hash happened during the load.
    touched: AtomicBool,
    loader: thread::ThreadId,
}

enum State<V> {
    Loading,
    Done(V),
    Failed,
}

/// What a caller of [`Loads::begin`] is to do.
pub(crate) enum Turn<'a, K, V> {
    /// Run `init`: this caller is the loader. Dropping the guard (done,
    /// failed or unwinding) ends the load.
    Load(LoadGuard<'a, K, V>),
    /// Another caller is loading this hash: [`Load::wait`] for it.
    Wait(Arc<Load<K, V>>),
}

impl<K, V> Loads<K, V> {
    pub(crate) fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            map: Mutex::new(HashMap::default()),
        }
    }

    /// Registers a load of `key` (hash `hash`), or finds the one in flight.
    pub(crate) fn begin(&self, hash: u64, key: K) -> Turn<'_, K, V> {
        let mut map = self.map.lock();
        if let Some(load) = map.get(&hash) {
            return Turn::Wait(load.clone());
        }
        let load = Arc::new(Load {
            key,
            state: Mutex::new(State::Loading),
            ended: Condvar::new(),
            touched: AtomicBool::new(false),
            loader: thread::current().id(),
        });
        map.insert(hash, load.clone());
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        drop(map);
        Turn::Load(LoadGuard {
            loads: self,
            hash,
            load,
            value: None,
        })
    }

    /// Called under a shard's write lock by every write to an entry with
    /// `hash` (`None`: every entry, for `clear`).
    #[inline]
    pub(crate) fn wrote(&self, hash: Option<u64>) {
        if self.in_flight.load(Ordering::SeqCst) != 0 {
            self.mark(hash);
        }
    }

    #[cold]
    fn mark(&self, hash: Option<u64>) {
        let map = self.map.lock();
        match hash {
            Some(h) => {
                if let Some(load) = map.get(&h) {
                    load.touched.store(true, Ordering::SeqCst);
                }
            }
            None => map
                .values()
                .for_each(|l| l.touched.store(true, Ordering::SeqCst)),
        }
    }
}

impl<K, V: Clone> Load<K, V> {
    /// Parks until the load ends: its value (a clone), or `None` if it
    /// failed.
    ///
    /// # Panics
    ///
    /// If called by the loader itself (its `init` asked for its own key).
    pub(crate) fn wait(&self) -> Option<V> {
        assert!(
            self.loader != thread::current().id(),
            "expiremap: get_or_insert_with's init asked the map for its own key, \
             which would wait for itself"
        );
        let mut state = self.state.lock();
        loop {
            match &*state {
                State::Loading => self.ended.wait(&mut state),
                State::Done(v) => return Some(v.clone()),
                State::Failed => return None,
            }
        }
    }
}

impl<K, V> Load<K, V> {
    /// Whether a write to this key's hash happened since the load began.
    /// Read under the shard lock the loader stores under.
    pub(crate) fn touched(&self) -> bool {
        self.touched.load(Ordering::SeqCst)
    }
}

/// The loader's side of a [`Load`]. Dropping it ends the load: with the
/// value given to [`done`](Self::done), or as failed (an error, or a panic
/// in `init` unwinding through it), waking every waiter.
pub(crate) struct LoadGuard<'a, K, V> {
    loads: &'a Loads<K, V>,
    hash: u64,
    pub(crate) load: Arc<Load<K, V>>,
    value: Option<V>,
}

impl<K, V> LoadGuard<'_, K, V> {
    /// The load succeeded with `value` (handed to the waiters at drop).
    pub(crate) fn done(&mut self, value: V) {
        self.value = Some(value);
    }
}

impl<K, V> Drop for LoadGuard<'_, K, V> {
    fn drop(&mut self) {
        {
            let mut map = self.loads.map.lock();
            map.remove(&self.hash);
            self.loads.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        let mut state = self.load.state.lock();
        *state = match self.value.take() {
            Some(v) => State::Done(v),
            None => State::Failed,
        };
        drop(state);
        self.load.ended.notify_all();
    }
}

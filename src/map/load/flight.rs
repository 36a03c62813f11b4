//! A key's flights: the loads of `ExpireMap::get_or_insert_with` and the
//! updates of `ExpireMap::update` in flight (a load and an update per key
//! at most), and how other callers wait for them. The loading calls
//! themselves are in `load`.
//!
//! # Protocol
//!
//! * Each shard keeps the [`Flight`]s of its keys in `Shard::flights`,
//!   changed only under the shard's write lock. A flight is found by its
//!   key: the 64-bit hash first, then the user's `Eq` (the one user code a
//!   lookup runs under a lock anyway). Two keys whose hashes collide have
//!   flights of their own.
//! * A caller that misses takes the write lock, looks the key up again
//!   (a value put meanwhile is returned), then either finds the key's
//!   flight and waits for it (after unlocking), or registers one and runs
//!   its `init` (or `f`) with no lock held. Its [`FlightGuard`] ends the
//!   flight when dropped, however `init` ends (a value, an error, a panic):
//!   it unregisters it under the write lock, then records the outcome and
//!   wakes every waiter. So a waiter that wakes finds the key free. A
//!   load's store unregisters its flight under the lock it stores under
//!   ([`FlightGuard::left`]), saving the guard that lock round: still
//!   before the outcome is recorded, and never before the store is
//!   settled (a put that must make room elsewhere unlocks between
//!   rounds, and the flight stays registered over them).
//! * **Waiting** is parking on the flight's condition variable for a
//!   blocking caller, or, for an async caller, a waker registered in the
//!   flight's state under its mutex (the guard takes the wakers out and
//!   wakes them after setting the outcome under the same mutex, so a
//!   waker registered as the flight ends is either woken or sees the end).
//!   Blocking and async callers of one key share one flight. An async
//!   loader's guard lives in its future: dropping the future (cancelling
//!   it) ends the flight with no value, and a waiter loads next.
//! * **Outcomes**: a value (waiters take a clone), an error (waiters whose
//!   call returns the same error type take a clone; the others load), or
//!   nothing (a panic, a cancellation, an update: waiters look again).
//! * **Loads** lose to writes: every write of a key (`put`, `remove`,
//!   `put_if_absent`, `replace`, `expire`, `retain`'s removal, an
//!   `update`; every key for `clear`) marks a load of that key as
//!   *touched* under the write lock, and the loader stores its value under
//!   the same lock only if its load is untouched. Waiters of a load take
//!   its value (a clone). No write waits for a load: a load may run for as
//!   long as an async `init` awaits, and its runner may be a task that
//!   only the waiting thread's runtime would poll.
//! * **Updates** go first: a write of a key whose update is in flight
//!   waits (after unlocking) for the update to end, then writes. So an
//!   update's `f` runs exactly once, on the value its commit replaces
//!   (eviction, the capacity bound and `clear` do not wait: an entry may
//!   still expire or be pushed out meanwhile). An update's `f` is a plain
//!   closure run on its caller's thread, so such a wait lasts one `f`.
//! * **One flight of each kind per key.** A load registers only when its
//!   key has no flight; an update registers when its key has no update,
//!   touching a load that runs (see [`claim`]). So a key has at most a
//!   load and an update in flight, the load registered first and touched.
//!   [`find`] gives the update first: a loader waits for it, then looks
//!   again (and hits what it stored, or waits for the load).
//! * **Waiting never hangs on a cycle.** Before parking, a caller records
//!   in one process-wide graph which thread's flight it waits for, and
//!   follows the graph from there: if it leads back to a flight run by the
//!   calling thread (an `init` that asks for its own key, or two `init`s
//!   each asking for the other's key), the caller panics, naming the
//!   threads, instead of parking for ever. An async load has no thread
//!   of its own, so the graph cannot lead through it; but while its user
//!   code runs (its `init` polled, the expiry policy run as its value is
//!   stored) the flight names the thread running it ([`Flight::acting`]),
//!   and a wait for it from that thread, blocking or async, panics: the
//!   `init` asked for its own key.

use crate::sync::{Arc, AtomicBool, Condvar, Mutex, Ordering, thread, unmodeled};
use std::any::Any;
use std::borrow::Borrow;
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// [`Flight::graph`]'s bit for a flight that ended.
const OVER: u8 = 1;
/// [`Flight::graph`]'s bit for a flight a waiter linked to in the wait graph.
const LINKED: u8 = 2;

/// What a flight is doing for its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `get_or_insert_with`: waiters share its value.
    Load,
    /// `update`: writes of the key wait for it.
    Update,
}

/// One key's load or update in flight.
pub(crate) struct Flight<K, V> {
    pub(crate) key: K,
    pub(crate) hash: u64,
    pub(crate) kind: Kind,
    state: Mutex<State<V>>,
    ended: Condvar,
    /// A write of this key happened during the load. Set and read under the
    /// shard's write lock.
    touched: AtomicBool,
    /// The thread running it, for the wait graph (its id) and the panic
    /// that names a cycle (its name, copied only for a wait); `None` for
    /// an async load, whose task may move between threads and parks none.
    /// A handle, so that registering a load allocates no copy of the name.
    runner: Option<thread::Thread>,
    /// [`OVER`] once it ended, [`LINKED`] once a waiter entered the wait
    /// graph for it: each side sets its bit with one read-modify-write and
    /// sees whether the other's was there (see [`graph`]). Not
    /// loom-modelled (see `sync::unmodeled`), as the graph's mutex is not;
    /// `loom-tests/tests/wait_graph.rs` models the handshake.
    graph: unmodeled::AtomicU8,
    /// For an async load: the thread running its user code right now (its
    /// `init` being polled, or the map's expiry policy as it stores), set
    /// by [`Flight::acting`]. A wait for this flight from that thread is a
    /// wait for itself (see [`Flight::wait`]). Not loom-modelled: only the
    /// thread it names compares it with itself.
    acting: unmodeled::Mutex<Option<thread::ThreadId>>,
}

enum State<V> {
    /// With the wakers of the async callers waiting for it.
    Running(Vec<Waker>),
    Done(V),
    /// A load whose `init` failed: its error, for the waiters whose call
    /// returns the same error type (see [`Ended::Failed`]).
    Failed(SharedError),
    /// An update that ended, or a load that panicked or was cancelled.
    Ended,
}

/// A failed load's error, shared by its waiters: each whose call returns
/// the same error type gets a clone. A std `Arc` in every build: it only
/// carries the value (its count orders nothing).
pub(crate) type SharedError = unmodeled::Arc<dyn Any + Send + Sync>;

/// How a flight ended, as a waiter sees it.
pub(crate) enum Ended<V> {
    /// A load's value (a clone).
    Value(V),
    /// A load's `init` failed with this error.
    Failed(SharedError),
    /// An update ended, or a load panicked or was cancelled: look again.
    Over,
}

impl<K, V> Flight<K, V> {
    /// A flight of `key` (hash `hash`) run by the calling thread, or, if
    /// `task`, by an async task (on no thread in particular).
    pub(crate) fn new(key: K, hash: u64, kind: Kind, task: bool) -> Self {
        let me = thread::current();
        Self {
            key,
            hash,
            kind,
            state: Mutex::new(State::Running(Vec::new())),
            ended: Condvar::new(),
            touched: AtomicBool::new(false),
            runner: (!task).then_some(me),
            graph: unmodeled::AtomicU8::new(0),
            acting: unmodeled::Mutex::new(None),
        }
    }

    /// Whether a write of this key happened since the load began. Read
    /// under the shard lock the loader stores under.
    pub(crate) fn touched(&self) -> bool {
        self.touched.load(Ordering::Relaxed)
    }

    /// A write of this key (under the shard's write lock).
    pub(crate) fn touch(&self) {
        self.touched.store(true, Ordering::Relaxed);
    }

    /// Whether the calling thread runs this flight.
    pub(crate) fn is_mine(&self) -> bool {
        self.runner_id() == Some(thread::current().id())
    }

    /// The id of the thread running it (`None`: an async load).
    fn runner_id(&self) -> Option<thread::ThreadId> {
        self.runner.as_ref().map(thread::Thread::id)
    }

    /// The name of the thread running it, if it has one.
    fn runner_name(&self) -> Option<String> {
        self.runner.as_ref()?.name().map(str::to_owned)
    }

    fn acting_now(&self) -> unmodeled::MutexGuard<'_, Option<thread::ThreadId>> {
        (self.acting.lock()).unwrap_or_else(unmodeled::PoisonError::into_inner)
    }

    /// Marks the calling thread as running this async load's user code
    /// until the returned guard drops (which restores what was there).
    pub(crate) fn acting(&self) -> Acting<'_, K, V> {
        let before = self.acting_now().replace(thread::current().id());
        Acting {
            flight: self,
            before,
        }
    }

    /// # Panics
    ///
    /// If the calling thread runs this async load's user code: waiting
    /// would be waiting for itself.
    fn not_acting_here(&self) {
        if self.runner.is_none() && *self.acting_now() == Some(thread::current().id()) {
            panic!(
                "expiremap: an async load's init (or the expiry policy storing its \
                 value) asked the map for its own key, which would wait for itself"
            );
        }
    }
}

/// The guard of [`Flight::acting`].
pub(crate) struct Acting<'a, K, V> {
    flight: &'a Flight<K, V>,
    before: Option<thread::ThreadId>,
}

impl<K, V> Drop for Acting<'_, K, V> {
    fn drop(&mut self) {
        *self.flight.acting_now() = self.before;
    }
}

/// Awaits `fut`, polling it with the calling thread marked as running the
/// user code of `flights` (async loads: see [`Flight::acting`]).
pub(crate) async fn acting_for<K, V, T>(
    flights: &[&Flight<K, V>],
    fut: impl Future<Output = T>,
) -> T {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        let _acting: Vec<Acting<'_, K, V>> = flights.iter().map(|f| f.acting()).collect();
        fut.as_mut().poll(cx)
    })
    .await
}

impl<K, V: Clone> Flight<K, V> {
    /// Parks until the flight ends. Called with no lock held.
    ///
    /// # Panics
    ///
    /// If waiting would close a cycle of waits (see the module docs).
    pub(crate) fn wait(&self) -> Ended<V> {
        self.not_acting_here();
        let _edge = graph::Edge::enter(self);
        let mut state = self.state.lock();
        loop {
            if let Some(ended) = Self::ended(&state) {
                return ended;
            }
            self.ended.wait(&mut state);
        }
    }

    /// How the flight ended, if it did.
    fn ended(state: &State<V>) -> Option<Ended<V>> {
        match state {
            State::Running(_) => None,
            State::Done(v) => Some(Ended::Value(v.clone())),
            State::Failed(e) => Some(Ended::Failed(e.clone())),
            State::Ended => Some(Ended::Over),
        }
    }

    /// Waits for the flight to end without parking the thread: the future
    /// registers its task's waker with the flight, which wakes it when it
    /// ends (under the same lock the state is set under, so a flight that
    /// ends while the waker is being registered is seen by the check that
    /// comes with it).
    pub(crate) fn wait_async(&self) -> WaitAsync<'_, K, V> {
        WaitAsync { flight: self }
    }
}

/// The future of [`Flight::wait_async`].
pub(crate) struct WaitAsync<'a, K, V> {
    flight: &'a Flight<K, V>,
}

impl<K, V: Clone> Future for WaitAsync<'_, K, V> {
    type Output = Ended<V>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Ended<V>> {
        self.flight.not_acting_here();
        let mut state = self.flight.state.lock();
        if let Some(ended) = Flight::<K, V>::ended(&state) {
            return Poll::Ready(ended);
        }
        if let State::Running(wakers) = &mut *state {
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
        }
        Poll::Pending
    }
}

/// The flights of `key` among `flights` (at most a load and an update).
fn of_key<'a, K, V, Q>(
    flights: &'a [Arc<Flight<K, V>>],
    hash: u64,
    key: &Q,
) -> impl Iterator<Item = &'a Arc<Flight<K, V>>>
where
    K: Borrow<Q>,
    Q: Eq + ?Sized,
{
    flights
        .iter()
        .filter(move |f| f.hash == hash && f.key.borrow() == key)
}

/// The flight of `key` among `flights`, if any: its update if one is in
/// flight, else its load.
#[inline]
pub(crate) fn find<'a, K, V, Q>(
    flights: &'a [Arc<Flight<K, V>>],
    hash: u64,
    key: &Q,
) -> Option<&'a Arc<Flight<K, V>>>
where
    K: Borrow<Q>,
    Q: Eq + ?Sized,
{
    let mut found = None;
    for f in of_key(flights, hash, key) {
        if f.kind == Kind::Update {
            return Some(f);
        }
        found = Some(f);
    }
    found
}

/// What a write of `key` (an update's registration included) does first,
/// under its shard's write lock: marks a load of `key` touched (the write
/// wins, and is never made to wait for a load), and returns the update of
/// `key` in flight, if any, which the writer waits for (after unlocking)
/// before it writes.
pub(crate) fn claim<K, V, Q>(
    flights: &[Arc<Flight<K, V>>],
    hash: u64,
    key: &Q,
) -> Option<Arc<Flight<K, V>>>
where
    K: Borrow<Q>,
    Q: Eq + ?Sized,
{
    let mut update = None;
    for f in of_key(flights, hash, key) {
        match f.kind {
            Kind::Load => f.touch(),
            Kind::Update => update = Some(f.clone()),
        }
    }
    update
}

/// [`claim`] for a write other than an update's registration, with
/// flights in the shard.
///
/// # Panics
///
/// If the update of `key` is run by the calling thread: its `f` wrote its
/// own key, which would wait for itself.
#[cold]
pub(crate) fn before_write<K, V, Q>(
    flights: &[Arc<Flight<K, V>>],
    hash: u64,
    key: &Q,
) -> Option<Arc<Flight<K, V>>>
where
    K: Borrow<Q>,
    Q: Eq + ?Sized,
{
    let update = claim(flights, hash, key)?;
    assert!(
        !update.is_mine(),
        "expiremap: update's f wrote its own key, which would wait for the update itself"
    );
    Some(update)
}

/// Where flights are registered: the map's shard lock, over the shard's
/// list of its keys' flights (see `load`). This room knows it only by this
/// trait, so that it needs nothing of the shard's.
pub(crate) trait Registry<K, V> {
    /// Takes `flight` out of the list under the write lock, if it is there,
    /// and returns it so that the caller drops it after the lock is
    /// released.
    fn unregister(&self, flight: &Arc<Flight<K, V>>) -> Option<Arc<Flight<K, V>>>;
}

/// Ends a flight when dropped: unregisters it from its shard (under the
/// shard's write lock), then records the value given to
/// [`done`](Self::done) (none: it failed, unwound, or was an update) and
/// wakes every waiter.
pub(crate) struct FlightGuard<'a, K, V> {
    pub(crate) flight: Arc<Flight<K, V>>,
    value: Option<V>,
    error: Option<SharedError>,
    /// Where the flight is registered (`Sync`, so that an async loader's
    /// future, which holds the guard, is `Send`).
    lock: &'a (dyn Registry<K, V> + Sync),
    /// Still in the shard's list: cleared by [`left`](Self::left), when a
    /// store took it out under its own lock hold.
    registered: Cell<bool>,
}

impl<'a, K, V> FlightGuard<'a, K, V> {
    /// Guards `flight`, which the caller has just registered in `lock`.
    pub(crate) fn new(flight: Arc<Flight<K, V>>, lock: &'a (dyn Registry<K, V> + Sync)) -> Self {
        Self {
            flight,
            value: None,
            error: None,
            lock,
            registered: Cell::new(true),
        }
    }

    /// The flight was taken out of its shard's list (under the shard's
    /// write lock, by the store that ends its load): the drop need not
    /// take the lock again.
    pub(crate) fn left(&self) {
        self.registered.set(false);
    }

    /// The load succeeded with `value` (handed to the waiters at drop).
    pub(crate) fn done(&mut self, value: V) {
        self.value = Some(value);
    }

    /// The load failed with `error` (shared with the waiters at drop).
    pub(crate) fn failed(&mut self, error: SharedError) {
        self.error = Some(error);
    }
}

impl<K, V> Drop for FlightGuard<'_, K, V> {
    fn drop(&mut self) {
        // This guard holds another handle: no key is dropped under the lock.
        if self.registered.get() {
            drop(self.lock.unregister(&self.flight));
        }
        let mut state = self.flight.state.lock();
        let ended = match (self.value.take(), self.error.take()) {
            (Some(v), _) => State::Done(v),
            (None, Some(e)) => State::Failed(e),
            (None, None) => State::Ended,
        };
        let waiting = std::mem::replace(&mut *state, ended);
        drop(state);
        // Both bits are set by RMWs of one word: whichever comes second
        // sees the other's. Either a waiter linked first (this end marks
        // its link over, under the graph's mutex, which the waiter held
        // from its RMW to its link), or the waiter sees the end and links
        // nothing.
        let before = self
            .flight
            .graph
            .fetch_or(OVER, unmodeled::Ordering::AcqRel);
        if before & LINKED != 0 {
            graph::ended(&self.flight);
        }
        self.flight.ended.notify_all();
        if let State::Running(wakers) = waiting {
            wakers.into_iter().for_each(Waker::wake);
        }
    }
}

/// The process-wide graph of waits: which thread waits for a flight run by
/// which thread. One mutex held only for a walk of a few edges; only the
/// slow path (a caller that waits) touches it.
mod graph {
    use super::{Flight, LINKED, OVER, thread, unmodeled};

    struct Link {
        waiter: thread::ThreadId,
        runner: Option<thread::ThreadId>,
        runner_name: Option<String>,
        /// The flight waited for, by address: only compared, never read. The
        /// waiter holds a handle to it for as long as the link exists, so no
        /// other flight can have that address meanwhile.
        flight: usize,
        /// The flight ended (set by [`ended`] under the graph's mutex).
        over: bool,
    }

    static WAITS: unmodeled::Mutex<Vec<Link>> = unmodeled::Mutex::new(Vec::new());

    fn waits() -> unmodeled::MutexGuard<'static, Vec<Link>> {
        WAITS
            .lock()
            .unwrap_or_else(unmodeled::PoisonError::into_inner)
    }

    fn name(id: thread::ThreadId, name: Option<&str>) -> String {
        match name {
            Some(n) => format!("'{n}' ({id:?})"),
            None => format!("{id:?}"),
        }
    }

    fn address<K, V>(flight: &Flight<K, V>) -> usize {
        std::ptr::from_ref(flight).addr()
    }

    /// `flight` ended, after a waiter had linked to it: its links are over.
    #[cold]
    pub(super) fn ended<K, V>(flight: &Flight<K, V>) {
        let at = address(flight);
        for link in waits().iter_mut().filter(|l| l.flight == at) {
            link.over = true;
        }
    }

    /// The calling thread's wait, recorded while it lasts.
    pub(super) struct Edge(thread::ThreadId);

    impl Edge {
        /// Records that the calling thread waits for `flight`.
        ///
        /// # Panics
        ///
        /// If the chain of waits from `flight` leads back to a flight that
        /// the calling thread runs. Every link of such a chain is a thread
        /// parked until a flight ends whose runner is parked in turn, and
        /// the last flight's runner is the calling thread, which is inside
        /// that flight (it is not `over`): none can end. A link whose
        /// flight is `over` ends the walk, so a wait that is already
        /// ending is never taken for a cycle.
        pub(super) fn enter<K, V>(flight: &Flight<K, V>) -> Self {
            let me = thread::current().id();
            let mut waits = waits();
            // See `FlightGuard::drop`, which sets `OVER` the same way.
            let before = flight.graph.fetch_or(LINKED, unmodeled::Ordering::AcqRel);
            if before & OVER != 0 {
                // It ended: the wait returns at once, and links nothing.
                return Edge(me);
            }
            let mut runner = flight.runner_id();
            let mut runner_name = flight.runner_name();
            let mut over = false;
            let mut chain = String::new();
            // Each thread waits for one flight at a time: a walk longer
            // than the graph has left it.
            for _ in 0..=waits.len() {
                if over {
                    break;
                }
                let Some(runner_id) = runner else {
                    // An async load parks no thread: no cycle through it.
                    break;
                };
                if runner_id == me {
                    drop(waits);
                    let me = name(me, thread::current().name());
                    if chain.is_empty() {
                        panic!(
                            "expiremap: get_or_insert_with's init (or update's f) asked \
                             the map for its own key, which would wait for itself \
                             (thread {me})"
                        );
                    }
                    panic!(
                        "expiremap: a cycle of loads or updates would wait for ever: \
                         thread {me} waits for a key whose init (or f) runs on thread \
                         {chain}, which waits for a key whose init (or f) runs on \
                         thread {me}"
                    );
                }
                if !chain.is_empty() {
                    chain.push_str(", which waits for a key whose init (or f) runs on thread ");
                }
                chain.push_str(&name(runner_id, runner_name.as_deref()));
                let Some(next) = waits.iter().find(|l| l.waiter == runner_id) else {
                    break;
                };
                (runner, runner_name, over) = (next.runner, next.runner_name.clone(), next.over);
            }
            waits.push(Link {
                waiter: me,
                runner: flight.runner_id(),
                runner_name: flight.runner_name(),
                flight: address(flight),
                over: false,
            });
            Edge(me)
        }
    }

    impl Drop for Edge {
        fn drop(&mut self) {
            let mut waits = waits();
            if let Some(i) = waits.iter().position(|l| l.waiter == self.0) {
                waits.swap_remove(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Flight, FlightGuard, Kind, Registry, graph};
    use std::sync::{Arc, mpsc};

    /// A registry the flights of these tests are never in.
    struct Nowhere;

    impl Registry<u32, u32> for Nowhere {
        fn unregister(&self, _: &Arc<Flight<u32, u32>>) -> Option<Arc<Flight<u32, u32>>> {
            None
        }
    }

    /// Thread B runs flight 3 and waits for flight 1, run by this thread.
    /// If flight 1 is still running, this thread waiting for flight 3
    /// closes a cycle; once flight 1 ended (B not yet awake to unlink), it
    /// does not: the end marked B's link over.
    fn chain_through_flight_one(end_it_first: bool) -> Result<(), String> {
        let one = Arc::new(Flight::<u32, u32>::new(1, 1, Kind::Load, false));
        let (to_main, from_b) = mpsc::channel();
        let (to_b, from_main) = mpsc::channel::<()>();
        let b = {
            let one = one.clone();
            std::thread::spawn(move || {
                let three = Arc::new(Flight::<u32, u32>::new(3, 3, Kind::Load, false));
                let edge = graph::Edge::enter(&one);
                to_main.send(three).unwrap();
                from_main.recv().unwrap();
                drop(edge);
            })
        };
        let three = from_b.recv().unwrap();
        if end_it_first {
            drop(FlightGuard::new(one.clone(), &Nowhere));
        }
        let enter = std::panic::AssertUnwindSafe(|| drop(graph::Edge::enter(&three)));
        let waited = std::panic::catch_unwind(enter)
            .map_err(|p| p.downcast_ref::<String>().cloned().unwrap_or_default());
        to_b.send(()).unwrap();
        b.join().unwrap();
        waited
    }

    #[test]
    fn a_wait_through_a_running_flight_back_to_its_runner_is_a_cycle() {
        let msg = chain_through_flight_one(false).expect_err("a cycle");
        assert!(msg.contains("a cycle of loads or updates"), "{msg}");
    }

    #[test]
    fn a_wait_through_a_flight_that_ended_is_no_cycle() {
        assert_eq!(chain_through_flight_one(true), Ok(()));
    }

    #[test]
    fn a_wait_for_a_flight_that_ended_links_nothing() {
        let one = Arc::new(Flight::<u32, u32>::new(1, 1, Kind::Load, false));
        drop(FlightGuard::new(one.clone(), &Nowhere));
        // Run by this thread, but over: no panic for waiting on itself.
        drop(graph::Edge::enter(&one));
    }
}

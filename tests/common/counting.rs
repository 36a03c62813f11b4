//! A global allocator that counts live bytes (requested, not RSS), shared by
//! `tests/memory.rs` and `examples/memory.rs`. Each declares it with
//! `#[global_allocator]` and reads [`LIVE`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};

/// Forwards to the system allocator and keeps [`LIVE`] up to date.
pub(crate) struct Counting;

/// Bytes currently allocated through [`Counting`].
pub(crate) static LIVE: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    /// Allocations this thread made through [`Counting`] (reallocations
    /// included). Per thread, because other threads of the process (the test
    /// harness's own, which may first block on its channel late on a loaded
    /// machine) allocate whenever they like.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

/// Allocations the calling thread has made through [`Counting`] so far.
#[allow(dead_code)]
pub(crate) fn allocations_here() -> u64 {
    ALLOCS.with(Cell::get)
}

fn count_one() {
    // `try_with`: a thread's last allocations may come after its
    // thread-locals are gone. A const-initialised `Cell` never allocates.
    let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards every call to the system allocator unchanged; it only
// counts the bytes requested and released.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        count_one();
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - layout.size() as isize, Ordering::Relaxed);
        count_one();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

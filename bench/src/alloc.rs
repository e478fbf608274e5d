//! A global allocator that counts allocations while asked to.
//!
//! Each binary installs it with
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: tower_circuit_breaker_bench::alloc::CountingAlloc =
//!     tower_circuit_breaker_bench::alloc::CountingAlloc;
//! ```
//!
//! Counting is off unless [`start`] turned it on, so the timed runs pay one
//! relaxed load per allocation and nothing else.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// [`System`], counting allocations and reallocations between [`start`] and
/// [`stop`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

#[inline]
fn count() {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; counting touches only two atomics and never allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Turns counting on and returns the count so far.
pub fn start() -> u64 {
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    before
}

/// Turns counting off and returns the allocations made since `start`
/// returned `before`, on every thread.
pub fn stop(before: u64) -> u64 {
    COUNTING.store(false, Ordering::SeqCst);
    ALLOCATIONS.load(Ordering::SeqCst) - before
}

/// Whether [`CountingAlloc`] is this binary's global allocator (an
/// allocation made while counting was counted).
pub fn installed() -> bool {
    let before = start();
    let boxed = std::hint::black_box(Box::new(0u64));
    let n = stop(before);
    drop(boxed);
    n > 0
}

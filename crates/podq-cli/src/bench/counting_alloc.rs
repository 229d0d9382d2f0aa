//! The process's allocator, counting while a `memory` or `idle` measurement asks it
//! to: live bytes and allocations, over every thread.
//!
//! Off (the default, and during every other workload) a call costs one `Relaxed` load
//! of a flag no one writes, so the timing workloads see the system allocator as is.
//! On, each call adds to two shared counters: that is contended, but only the
//! footprint workloads switch it on, and they time nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};

/// The system allocator with switchable counters.
pub struct Counting;

/// Whether calls are counted.
static ON: AtomicBool = AtomicBool::new(false);
/// Bytes allocated minus bytes freed while counting (negative when blocks from before
/// were freed).
static LIVE: AtomicI64 = AtomicI64::new(0);
/// Allocations (and reallocations) while counting.
static ALLOCS: AtomicU64 = AtomicU64::new(0);

#[global_allocator]
static GLOBAL: Counting = Counting;

// SAFETY: every call is forwarded unchanged to the system allocator, which upholds
// `GlobalAlloc`'s contract; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        let p = unsafe { System.alloc(layout) };
        if ON.load(Relaxed) && !p.is_null() {
            LIVE.fetch_add(layout.size() as i64, Relaxed);
            ALLOCS.fetch_add(1, Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if ON.load(Relaxed) && !p.is_null() {
            LIVE.fetch_add(layout.size() as i64, Relaxed);
            ALLOCS.fetch_add(1, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc` is passed on as is.
        unsafe { System.dealloc(ptr, layout) };
        if ON.load(Relaxed) {
            LIVE.fetch_sub(layout.size() as i64, Relaxed);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc` is passed on as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if ON.load(Relaxed) && !p.is_null() {
            LIVE.fetch_add(new_size as i64 - layout.size() as i64, Relaxed);
            ALLOCS.fetch_add(1, Relaxed);
        }
        p
    }
}

/// What the counters read at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// Live bytes (relative to when counting started).
    pub live: i64,
    /// Allocations so far.
    pub allocs: u64,
}

impl Reading {
    /// `self - earlier`.
    pub fn since(self, earlier: Reading) -> Reading {
        Reading {
            live: self.live - earlier.live,
            allocs: self.allocs - earlier.allocs,
        }
    }
}

/// Counting while it lives; measurements nest nowhere, so one at a time.
pub struct Counter(());

impl Counter {
    /// Starts counting from zero.
    pub fn start() -> Counter {
        LIVE.store(0, Relaxed);
        ALLOCS.store(0, Relaxed);
        ON.store(true, Relaxed);
        Counter(())
    }

    /// The counters now. Other threads' calls in flight may or may not be in it; the
    /// footprint workloads read only once the threads they measure are quiet.
    pub fn read(&self) -> Reading {
        Reading {
            live: LIVE.load(Relaxed),
            allocs: ALLOCS.load(Relaxed),
        }
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        ON.store(false, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_a_known_allocation_and_its_free() {
        let counter = Counter::start();
        let before = counter.read();
        const BLOCK: i64 = 64 << 20;
        let block = std::hint::black_box(vec![0u8; BLOCK as usize]);
        let held = counter.read().since(before);
        drop(block);
        let after = counter.read().since(before);
        drop(counter);
        // Other test threads may allocate, and free blocks from before, meanwhile:
        // their traffic gets a 16 MiB margin either way around the 64 MiB block.
        const NOISE: i64 = 16 << 20;
        assert!((held.live - BLOCK).abs() < NOISE, "{held:?}");
        assert!(held.allocs >= 1, "{held:?}");
        assert!(after.live.abs() < NOISE, "{held:?} then {after:?}");
    }
}

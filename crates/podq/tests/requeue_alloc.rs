//! A re-queued `Work` costs no heap allocation per queue: after warm-up, thousands of
//! queue → run → re-queue cycles allocate nothing on the queueing thread, and at most a
//! handful of times in the whole process (amortised growth, never per item).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use podq::{Scope, Work, Workqueue};

/// Counts every allocation of the process, and separately those of threads that set
/// `COUNT_HERE`.
struct Counting;

static ALL: AtomicU64 = AtomicU64::new(0);
static HERE: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNT_HERE: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    ALL.fetch_add(1, Ordering::Relaxed);
    // try_with: the thread-local may be gone while a thread exits.
    if COUNT_HERE.try_with(Cell::get).unwrap_or(false) {
        HERE.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to the system allocator with the caller's arguments;
// counting has no effect on the memory returned.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
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

#[global_allocator]
static GLOBAL: Counting = Counting;

const CYCLES: u64 = 20_000;

#[test]
fn requeued_work_allocates_nothing_per_queue() {
    for scope in [Scope::Cpu, Scope::Cache, Scope::System] {
        let wq = Workqueue::builder(format!("alloc-{scope}"))
            .scope(scope)
            .build()
            .unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let me = std::thread::current();
        let work = {
            let done = Arc::clone(&done);
            Work::new(move || {
                done.store(true, Ordering::Release);
                me.unpark();
            })
        };
        let cycle = || {
            assert!(wq.queue(&work));
            while !done.swap(false, Ordering::Acquire) {
                std::thread::park();
            }
        };
        // Warm-up: workers exist, queues have grown to their working size.
        for _ in 0..1_000 {
            cycle();
        }
        COUNT_HERE.with(|c| c.set(true));
        let (all, here) = (ALL.load(Ordering::Relaxed), HERE.load(Ordering::Relaxed));
        for _ in 0..CYCLES {
            cycle();
        }
        let here = HERE.load(Ordering::Relaxed) - here;
        let all = ALL.load(Ordering::Relaxed) - all;
        COUNT_HERE.with(|c| c.set(false));
        assert_eq!(
            here, 0,
            "{scope}: the queueing thread allocated {here} times"
        );
        assert!(
            all < CYCLES / 1000,
            "{scope}: {all} allocations in the process for {CYCLES} queues"
        );
        wq.flush();
    }
}

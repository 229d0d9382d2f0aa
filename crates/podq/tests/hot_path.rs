//! Queueing a re-queued `Work` allocates nothing (once the pools, the table's reader
//! slot and the queues' capacities are warm). Syscalls and futex wakes are measured by
//! the benchmarks, not here.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use podq::{Scope, Work, Workqueue};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.fetch_add(1, SeqCst);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.fetch_add(1, SeqCst);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn requeueing_work_does_not_allocate() {
    for scope in [Scope::Cpu, Scope::System] {
        let wq = Workqueue::builder(format!("hot-{scope}"))
            .scope(scope)
            .build()
            .unwrap();
        // Stay on one CPU, so every queue call uses the same pool.
        let cpu = wq.topology().usable().first().unwrap();
        podq::pin_thread_to(cpu, wq.topology()).unwrap();
        // Start every worker the pool may run at once (one per pod CPU): creating a
        // worker thread allocates, and happens when no worker is idle yet.
        let pod_cpus = match scope {
            Scope::Cpu => 1,
            _ => wq.topology().usable().len(),
        };
        let started = Arc::new(AtomicUsize::new(0));
        let warm: Vec<_> = (0..pod_cpus)
            .map(|_| {
                let started = started.clone();
                wq.spawn(move || {
                    started.fetch_add(1, SeqCst);
                    while started.load(SeqCst) < pod_cpus {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        for h in warm {
            h.join().unwrap();
        }
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        let work = Work::new(move || {
            r.fetch_add(1, SeqCst);
        });
        for _ in 0..100 {
            assert!(wq.queue(&work));
            work.flush();
        }
        ALLOCS.store(0, SeqCst);
        for _ in 0..1000 {
            COUNTING.with(|c| c.set(true));
            let queued = wq.queue(&work);
            COUNTING.with(|c| c.set(false));
            assert!(queued);
            work.flush();
        }
        assert_eq!(
            ALLOCS.load(SeqCst),
            0,
            "allocations while queueing ({scope})"
        );
        assert_eq!(runs.load(SeqCst), 1100);
        // The counter does count: a one-shot closure is boxed.
        COUNTING.with(|c| c.set(true));
        let handle = wq.spawn(|| 1);
        COUNTING.with(|c| c.set(false));
        assert!(ALLOCS.load(SeqCst) > 0);
        assert_eq!(handle.join().unwrap(), 1);
    }
}

//! Queueing a re-queued `Work` allocates nothing, a `spawn` allocates once (the
//! closure and its join state in one block) and an `execute` nothing for a closure of
//! up to two words (it travels in the queue entry) and once for a larger one (its
//! closure), counted on every thread, workers
//! included (once the pools, the table's reader slot and the queues' capacities are
//! warm). Syscalls and futex wakes are measured by the benchmarks, not here.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::sync::Mutex;

use podq::{Scope, Work, Workqueue};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// Count allocations on every thread, not only where `COUNTING` is set.
static COUNT_ALL: AtomicBool = AtomicBool::new(false);
/// The tests share the counters: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn counting() -> bool {
    COUNT_ALL.load(SeqCst) || COUNTING.with(Cell::get)
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counting() {
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
        if counting() {
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
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
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

/// Every thread is counted, so one-off growth that a loaded machine can cause (a worker
/// started because another was preempted: its name, handle and thread-locals; a
/// worklist segment) may add a few blocks to a flood's count.
const ONE_OFFS: usize = 16;

#[test]
fn spawn_allocates_once_per_item_on_all_threads() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for scope in [Scope::Cpu, Scope::System] {
        let wq = Workqueue::builder(format!("spawn-{scope}"))
            .scope(scope)
            .build()
            .unwrap();
        let cpu = wq.topology().usable().first().unwrap();
        podq::pin_thread_to(cpu, wq.topology()).unwrap();
        let flood = |n: u64| -> u64 {
            let handles: Vec<_> = (0..n).map(|i| wq.spawn(move || i * 2)).collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        };
        const N: u64 = 2000;
        // Warm: workers, worklist and inactive-list capacities for N items at once.
        for _ in 0..3 {
            flood(N);
        }
        let mut handles = Vec::with_capacity(N as usize);
        ALLOCS.store(0, SeqCst);
        COUNT_ALL.store(true, SeqCst);
        for i in 0..N {
            handles.push(wq.spawn(move || i * 2));
        }
        let sum: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        COUNT_ALL.store(false, SeqCst);
        assert_eq!(sum, N * (N - 1));
        let allocs = ALLOCS.load(SeqCst);
        // One more block per item would add N.
        assert!(
            allocs <= N as usize + ONE_OFFS,
            "{allocs} allocations for {N} spawns ({scope})"
        );
        // The counter does count: each spawn is one block.
        assert!(allocs >= N as usize, "{allocs} allocations for {N} spawns");
    }
}

/// Items queued with `execute` in each counted flood.
const EXECUTES: usize = 2000;

/// Allocations on every thread while [`EXECUTES`] items are queued with `execute_one`
/// and run, after three such floods warmed the workers and the worklist and
/// inactive-list capacities; `runs` must have seen every item.
fn allocations_of_executes(
    name: &str,
    runs: &AtomicUsize,
    execute_one: impl Fn(&Workqueue),
) -> usize {
    let wq = Workqueue::builder(name).build().unwrap();
    let flood = || {
        for _ in 0..EXECUTES {
            execute_one(&wq);
        }
        wq.flush();
    };
    for _ in 0..3 {
        flood();
    }
    ALLOCS.store(0, SeqCst);
    COUNT_ALL.store(true, SeqCst);
    flood();
    COUNT_ALL.store(false, SeqCst);
    assert_eq!(runs.load(SeqCst), 4 * EXECUTES);
    ALLOCS.load(SeqCst)
}

/// An executed item's closure of up to two words travels in its queue entry: no
/// allocation at all (builds with `tracing` keep every closure in a block).
#[test]
fn execute_of_a_two_word_closure_allocates_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let runs = Arc::new(AtomicUsize::new(0));
    let allocs = allocations_of_executes("execute-zero-allocs", &runs, |wq| {
        let runs = runs.clone();
        let seq = std::hint::black_box(1usize);
        wq.execute(move || {
            runs.fetch_add(seq, SeqCst);
        })
    });
    let expected = if cfg!(feature = "tracing") {
        EXECUTES
    } else {
        0
    };
    // One per item would add EXECUTES.
    assert!(
        (expected..=expected + ONE_OFFS).contains(&allocs),
        "{allocs} allocations for {EXECUTES} executed items"
    );
}

/// A larger closure is a block of its own: one allocation per item.
#[test]
fn execute_of_a_larger_closure_allocates_once_per_item_on_all_threads() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let runs = Arc::new(AtomicUsize::new(0));
    let allocs = allocations_of_executes("execute-allocs", &runs, |wq| {
        let runs = runs.clone();
        let (one, zero) = std::hint::black_box((1usize, 0usize));
        wq.execute(move || {
            runs.fetch_add(one + zero, SeqCst);
        });
    });
    // One block per item (the `Arc` clone captured here is not an allocation); one
    // more per item would add EXECUTES.
    assert!(
        (EXECUTES..=EXECUTES + ONE_OFFS).contains(&allocs),
        "{allocs} allocations for {EXECUTES} executed items"
    );
}

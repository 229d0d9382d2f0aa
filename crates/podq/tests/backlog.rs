//! A flush that waits behind a `max_active` backlog: the workers keep activating the
//! waiting items in turns, as they do without a flusher, instead of settling and
//! activating item by item; and on a one-CPU pod the worker takes the items it
//! activates for its own pool without passing them through the worklist.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use podq::testing::fake_topology;
use podq::{Scope, Workqueue};

/// Items queued behind the gate: far more than `max_active`.
const ITEMS: usize = 20_000;
const MAX_ACTIVE: usize = 16;

#[test]
fn a_flush_behind_a_backlog_leaves_activation_in_turns() {
    // One pod of two CPUs: each activation turn (one run of ring slots) counts as one
    // acquisition of the pool's enqueue lock. (A one-CPU pod's worker takes the turns
    // for its own pool without the worklist: the test below.)
    // Both workers are held until the flush below waits, so that the backlog drains
    // behind a waiting flusher.
    let (wq, open) = held_pod("backlog", 2, Scope::System);
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..ITEMS {
        let ran = ran.clone();
        wq.execute(move || {
            ran.fetch_add(1, SeqCst);
        });
    }
    let before = lock_acquisitions(&wq);
    std::thread::scope(|s| {
        let flusher = s.spawn(|| wq.flush());
        // The flusher counts itself in before its first look; give it time to wait.
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(50) && !flusher.is_finished() {
            std::thread::sleep(Duration::from_millis(5));
        }
        open.store(true, SeqCst);
        flusher.join().unwrap();
    });
    assert_eq!(ran.load(SeqCst), ITEMS);
    let pushes = lock_acquisitions(&wq) - before;
    // In turns of what a worker's batch freed (its share of the 16 slots: 8 or so with
    // two workers), 1 500 to 3 600 pushes here; item by item, one or two items a turn,
    // 9 000 to 14 300 when each completion settled alone.
    assert!(
        pushes < ITEMS / 3,
        "{pushes} pushes onto the worklist for {ITEMS} items"
    );
}

#[test]
fn a_one_cpu_pods_worker_runs_what_it_activates_in_order_without_the_worklist() {
    let (wq, open) = held_pod("backlog-one-cpu", 1, Scope::Cpu);
    let order = Arc::new(Mutex::new(Vec::with_capacity(ITEMS)));
    for i in 0..ITEMS {
        let order = order.clone();
        wq.execute(move || order.lock().unwrap().push(i));
    }
    let before = lock_acquisitions(&wq);
    open.store(true, SeqCst);
    wq.flush();
    let order = order.lock().unwrap();
    assert_eq!(order.len(), ITEMS, "every item ran once");
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "items of one queuer ran out of order"
    );
    // Every turn after the first few was activated by the pool's one worker between
    // two items, straight into its batch: no push onto the worklist (pushed, there
    // would be about ITEMS / MAX_ACTIVE).
    let pushes = lock_acquisitions(&wq) - before;
    assert!(
        pushes < ITEMS / MAX_ACTIVE / 10,
        "{pushes} pushes onto the worklist for {ITEMS} items"
    );
}

/// A workqueue with `max_active` [`MAX_ACTIVE`] on one pod of `cpus` CPUs (`scope`
/// gives that pod), each of whose workers runs an item that waits until the returned
/// flag is raised: what is queued next waits behind them.
fn held_pod(name: &str, cpus: usize, scope: Scope) -> (Workqueue, Arc<AtomicBool>) {
    // Held for tens of milliseconds, the holders would leave the running count (the
    // CPU-intensive rule) and other workers would run the backlog: these tests count
    // what the held pool does, so the rule is off in this binary.
    podq::watchdog::set_cpu_intensive_threshold(None).unwrap();
    let wq = Workqueue::builder(name)
        .topology(fake_topology(1, 1, cpus, 1))
        .scope(scope)
        .max_active(MAX_ACTIVE)
        .build()
        .unwrap();
    let open = Arc::new(AtomicBool::new(false));
    for _ in 0..cpus {
        let open = open.clone();
        wq.execute(move || {
            while !open.load(SeqCst) {
                std::thread::yield_now();
            }
        });
    }
    (wq, open)
}

/// Acquisitions of the one pool's enqueue lock so far.
fn lock_acquisitions(wq: &Workqueue) -> usize {
    let stats = wq.stats();
    let [pool] = stats.pools.as_slice() else {
        panic!("one pool: {:?}", stats.pools);
    };
    usize::try_from(pool.enqueue_lock.acquisitions).unwrap()
}

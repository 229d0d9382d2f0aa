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
    let wq = Workqueue::builder("backlog")
        .topology(fake_topology(1, 1, 2, 1))
        .scope(Scope::System)
        .max_active(MAX_ACTIVE)
        .build()
        .unwrap();
    let open = Arc::new(AtomicBool::new(false));
    let ran = Arc::new(AtomicUsize::new(0));
    // The first two items hold both workers until the flush below waits, so that the
    // backlog drains behind a waiting flusher.
    for _ in 0..2 {
        let open = open.clone();
        wq.execute(move || {
            while !open.load(SeqCst) {
                std::thread::yield_now();
            }
        });
    }
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
    // In turns of up to `MAX_ACTIVE` items a turn, about ITEMS / MAX_ACTIVE pushes;
    // item by item, one or two items a turn, about ITEMS / 2 or more.
    assert!(
        pushes < ITEMS / 4,
        "{pushes} pushes onto the worklist for {ITEMS} items"
    );
}

#[test]
fn a_one_cpu_pods_worker_runs_what_it_activates_in_order_without_the_worklist() {
    let wq = Workqueue::builder("backlog-one-cpu")
        .topology(fake_topology(1, 1, 1, 1))
        .scope(Scope::Cpu)
        .max_active(MAX_ACTIVE)
        .build()
        .unwrap();
    let open = Arc::new(AtomicBool::new(false));
    let order = Arc::new(Mutex::new(Vec::with_capacity(ITEMS)));
    {
        let open = open.clone();
        wq.execute(move || {
            while !open.load(SeqCst) {
                std::thread::yield_now();
            }
        });
    }
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

/// Acquisitions of the one pool's enqueue lock so far.
fn lock_acquisitions(wq: &Workqueue) -> usize {
    let stats = wq.stats();
    let [pool] = stats.pools.as_slice() else {
        panic!("one pool: {:?}", stats.pools);
    };
    usize::try_from(pool.enqueue_lock.acquisitions).unwrap()
}

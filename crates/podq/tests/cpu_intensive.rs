//! The CPU-intensive rule: a worker that has run one item past the threshold stops
//! counting towards its pool's running workers, so the items behind it get another
//! worker. The threshold is process-wide: these tests take turns.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use podq::watchdog::{
    cpu_intensive_threshold, set_cpu_intensive_threshold, set_long_item_threshold,
    set_stall_threshold, DEFAULT_LONG_ITEM_THRESHOLD, DEFAULT_STALL_THRESHOLD,
};
use podq::{Topology, Workqueue};

/// Serialises the tests: each sets the process-wide threshold.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// A workqueue on one CPU: its pool runs one worker at a time.
fn one_cpu(name: &str) -> Workqueue {
    Workqueue::builder(name)
        .topology(Topology::synthetic("1s1c1t").unwrap())
        .build()
        .unwrap()
}

/// An item waits (without `podq::blocking`) for one queued behind it on the same
/// one-CPU pool, giving up after `patience`. Returns whether the one behind ran while
/// it waited, and the pool's count of workers that left the running count.
fn waits_for_the_item_behind(name: &str, patience: Duration) -> (bool, u64) {
    waits_on(&one_cpu(name), patience)
}

/// [`waits_for_the_item_behind`] on `wq`.
fn waits_on(wq: &Workqueue, patience: Duration) -> (bool, u64) {
    let (started_tx, started) = mpsc::channel();
    let (behind_tx, behind_rx) = mpsc::channel::<()>();
    let waiter = wq.spawn(move || {
        started_tx.send(()).unwrap();
        behind_rx.recv_timeout(patience).is_ok()
    });
    started.recv().unwrap();
    let behind = wq.spawn(move || {
        // The waiter may have given up already.
        let _ = behind_tx.send(());
    });
    let ran_during = waiter.join().unwrap();
    behind.join().unwrap();
    wq.flush();
    all_idle_and_none_counted(wq);
    (ran_during, wq.stats().pools[0].cpu_intensive)
}

#[test]
fn an_item_waiting_for_one_behind_it_gets_it_run() {
    let _turn = one_at_a_time();
    assert_eq!(cpu_intensive_threshold(), Some(Duration::from_millis(10)));
    let (ran_during, left) = waits_for_the_item_behind("ci-wait", Duration::from_secs(30));
    assert!(ran_during, "the item behind ran while the first one waited");
    if cfg!(feature = "stats") {
        assert_eq!(left, 1, "one worker left the count");
    }
}

#[test]
fn without_the_rule_the_item_behind_waits_its_turn() {
    let _turn = one_at_a_time();
    set_cpu_intensive_threshold(None).unwrap();
    let (ran_during, left) = waits_for_the_item_behind("ci-off", Duration::from_millis(300));
    set_cpu_intensive_threshold(Some(Duration::from_millis(10))).unwrap();
    assert!(!ran_during, "one worker at a time: the item behind waited");
    assert_eq!(left, 0);
}

/// A computing item on `wq`'s one-CPU pool runs until three items queued behind it
/// ran (or 30 s), then, if `then_block`, blocks a while: its worker, out of the count
/// already, must not leave it twice. Asserts that the items behind ran meanwhile and
/// that nothing was lost.
fn compute_until_the_items_behind_ran(wq: &Workqueue, then_block: bool) {
    let behind_ran = Arc::new(AtomicBool::new(false));
    let (started_tx, started) = mpsc::channel();
    let seen = Arc::clone(&behind_ran);
    let computing = wq.spawn(move || {
        started_tx.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !seen.load(SeqCst) && Instant::now() < deadline {
            std::hint::spin_loop();
        }
        if then_block {
            podq::blocking(|| std::thread::sleep(Duration::from_millis(20)));
        }
        seen.load(SeqCst)
    });
    started.recv().unwrap();
    let behind: Vec<_> = (0..3)
        .map(|i| {
            let flag = Arc::clone(&behind_ran);
            wq.spawn(move || {
                flag.store(true, SeqCst);
                i
            })
        })
        .collect();
    assert!(computing.join().unwrap(), "the items behind ran meanwhile");
    let results: Vec<i32> = behind.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(results, [0, 1, 2], "nothing lost");
}

/// Short items (under the threshold) on `wq`'s one-CPU pool run one at a time, and all
/// of them within a minute: the pool counts its workers right again.
fn runs_one_at_a_time(wq: &Workqueue) {
    let now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (done_tx, done) = mpsc::channel();
    for _ in 0..8 {
        let (now, most, done_tx) = (Arc::clone(&now), Arc::clone(&most), done_tx.clone());
        wq.execute(move || {
            let running = now.fetch_add(1, SeqCst) + 1;
            most.fetch_max(running, SeqCst);
            std::thread::sleep(Duration::from_millis(2));
            now.fetch_sub(1, SeqCst);
            done_tx.send(()).unwrap();
        });
    }
    for _ in 0..8 {
        done.recv_timeout(Duration::from_secs(60))
            .expect("the pool runs its items (its running count did not leak)");
    }
    assert_eq!(most.load(SeqCst), 1, "one running worker per pod CPU");
}

/// Once every worker of `wq`'s pool went idle, none counts as running: the demotions
/// were undone exactly once (a leak either way would leave the count off for good).
fn all_idle_and_none_counted(wq: &Workqueue) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let dump = wq.dump();
        let pool = &dump.pools[0];
        if pool.idle == pool.workers {
            assert_eq!(pool.running, 0, "{dump}");
            return;
        }
        assert!(Instant::now() < deadline, "workers never went idle: {dump}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_computing_item_lets_the_items_behind_run_and_counts_again_when_done() {
    let _turn = one_at_a_time();
    let wq = one_cpu("ci-compute");
    compute_until_the_items_behind_ran(&wq, false);
    all_idle_and_none_counted(&wq);
    runs_one_at_a_time(&wq);
    compute_until_the_items_behind_ran(&wq, true);
    all_idle_and_none_counted(&wq);
    runs_one_at_a_time(&wq);
    if cfg!(feature = "stats") {
        assert_eq!(wq.stats().pools[0].cpu_intensive, 2);
    }
}

#[test]
fn the_items_taken_with_a_computing_item_run_while_it_computes() {
    let _turn = one_at_a_time();
    // A pool of its own (nice 1): no single claims left from another test's long item.
    let wq = Workqueue::builder("ci-batch")
        .topology(Topology::synthetic("1s1c1t").unwrap())
        .nice(1)
        .build()
        .unwrap();
    // Frozen, the four items wait together; thawed, they reach the worklist in one
    // push, and the pool's only worker takes them in one batch.
    wq.freeze().unwrap();
    let behind_ran = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&behind_ran);
    let computing = wq.spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while seen.load(SeqCst) < 3 && Instant::now() < deadline {
            std::hint::spin_loop();
        }
        seen.load(SeqCst)
    });
    let behind: Vec<_> = (0..3)
        .map(|i| {
            let ran = Arc::clone(&behind_ran);
            wq.spawn(move || {
                ran.fetch_add(1, SeqCst);
                i
            })
        })
        .collect();
    assert!(wq.thaw());
    assert_eq!(
        computing.join().unwrap(),
        3,
        "the items in the computing worker's batch ran while it computed"
    );
    let results: Vec<i32> = behind.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(results, [0, 1, 2], "nothing lost");
    if cfg!(feature = "stats") {
        let pool = &wq.stats().pools[0];
        assert_eq!((pool.cpu_intensive, pool.handed_back), (1, 3));
    }
    all_idle_and_none_counted(&wq);
    runs_one_at_a_time(&wq);
}

#[test]
fn after_a_long_item_the_pool_takes_its_items_one_at_a_time_and_at_most_doubles() {
    let _turn = one_at_a_time();
    let wq = one_cpu("ci-single");
    compute_until_the_items_behind_ran(&wq, false);
    // Four items that wait without `podq::blocking`, queued at once. Taken one at a
    // time, the first leaves the count once it has waited past the threshold and the
    // next gets a worker, so they overlap; but no more than one worker per pod CPU is
    // out of the count at a time, so never more than two run.
    let now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let waiting: Vec<_> = (0..4)
        .map(|_| {
            let (now, most) = (Arc::clone(&now), Arc::clone(&most));
            wq.spawn(move || {
                let running = now.fetch_add(1, SeqCst) + 1;
                most.fetch_max(running, SeqCst);
                std::thread::sleep(Duration::from_millis(100));
                now.fetch_sub(1, SeqCst);
            })
        })
        .collect();
    // Meanwhile the dump shows the worker out of the count, never more than one.
    let mut most_out = 0;
    while waiting.iter().any(|item| !item.is_finished()) {
        let dump = wq.dump();
        let out = dump.pools[0].out_for_long_items;
        most_out = most_out.max(out);
        if out == 1 {
            assert!(
                dump.to_string()
                    .contains("1 out of the count for a long item"),
                "{dump}"
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    for item in waiting {
        item.join().unwrap();
    }
    assert_eq!(
        most.load(SeqCst),
        2,
        "the waiting items overlapped, two at most"
    );
    assert_eq!(most_out, 1, "one worker out of the count at most");
    all_idle_and_none_counted(&wq);
}

#[test]
fn a_worker_woken_from_idle_wakes_the_dozing_watchdog() {
    let _turn = one_at_a_time();
    // With the stall checks off the watchdog's slow looks are a second apart.
    set_stall_threshold(None).unwrap();
    set_long_item_threshold(None).unwrap();
    let wq = one_cpu("ci-doze");
    wq.spawn(|| ()).join().unwrap();
    // Nothing starts for longer than the watchdog waits before it dozes.
    std::thread::sleep(Duration::from_millis(300));
    // Woken, the worker wakes the watchdog, which finds the waiting item within a few
    // looks; dozing on, it would find it at its next slow look, up to a second later.
    let (ran_during, left) = waits_on(&wq, Duration::from_millis(600));
    set_stall_threshold(Some(DEFAULT_STALL_THRESHOLD)).unwrap();
    set_long_item_threshold(Some(DEFAULT_LONG_ITEM_THRESHOLD)).unwrap();
    assert!(ran_during, "the item behind ran while the first one waited");
    if cfg!(feature = "stats") {
        assert_eq!(left, 1);
    }
}

#[test]
fn thresholds_below_a_millisecond_are_refused() {
    let _turn = one_at_a_time();
    let err = set_cpu_intensive_threshold(Some(Duration::from_micros(500))).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid cpu-intensive threshold 500µs: must be at least 1ms"
    );
    assert_eq!(cpu_intensive_threshold(), Some(Duration::from_millis(10)));
}

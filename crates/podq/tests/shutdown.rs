//! Shutdown rules (see the `Workqueue` docs and RELIABILITY.md): dropping the last
//! handle of a workqueue runs what is queued (drain), waits for what runs, cancels what
//! sits on the timer, and stops the workers; process exit does not wait for idle
//! workers.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use podq::{DelayedWork, Work, Workqueue};

mod common;
use common::{counter, counting_delayed, counting_work, pool_threads, spawn_counting, threads};

#[test]
fn drop_runs_queued_items_and_waits_for_running_ones() {
    let wq = Workqueue::builder("shut-queued")
        .max_active(1)
        .build()
        .unwrap();
    let started = Arc::new(Barrier::new(2));
    let finished = Arc::new(AtomicBool::new(false));
    {
        let (started, finished) = (started.clone(), finished.clone());
        wq.spawn(move || {
            started.wait();
            std::thread::sleep(Duration::from_millis(100));
            finished.store(true, SeqCst);
        });
    }
    let runs = counter();
    // With max_active 1 these wait on the inactive list behind the running item.
    for _ in 0..200 {
        spawn_counting(&wq, &runs);
    }
    let work_runs = counter();
    let work = counting_work(&work_runs);
    assert!(wq.queue(&work));
    started.wait();
    drop(wq);
    assert!(finished.load(SeqCst), "drop waited for the running item");
    assert_eq!(runs.load(SeqCst), 200, "drop ran every queued item");
    assert_eq!(work_runs.load(SeqCst), 1);
    assert!(!work.is_pending());
}

#[test]
fn drop_cancels_delayed_items_on_the_timer() {
    let wq = Workqueue::builder("shut-timer").build().unwrap();
    let runs = counter();
    let items: Vec<DelayedWork> = (0..10).map(|_| counting_delayed(&runs)).collect();
    for d in &items {
        assert!(wq.queue_delayed(d, Duration::from_millis(200)));
    }
    drop(wq);
    // On a slow machine some timers fire before the drop: those items ran (drained).
    let ran_by_drop = runs.load(SeqCst);
    for d in &items {
        assert!(!d.is_pending(), "cancelled at drop");
    }
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        runs.load(SeqCst),
        ran_by_drop,
        "a cancelled timer never fires"
    );
    // The items are idle again, not stuck: they run on another queue.
    let other = Workqueue::builder("shut-timer-2").build().unwrap();
    for d in &items {
        assert!(other.queue_delayed(d, Duration::ZERO));
    }
    other.flush();
    assert_eq!(runs.load(SeqCst), ran_by_drop + 10);
}

#[test]
#[cfg_attr(miri, ignore = "Miri's threads are not the process's threads in /proc")]
fn drop_stops_and_joins_the_workers() {
    let wq = Workqueue::builder("shut-threads")
        .topology(podq::testing::fake_topology(1, 2, 2, 2))
        .scope(podq::Scope::Cpu)
        .build()
        .unwrap();
    let before = threads();
    let gate = Arc::new(Barrier::new(9));
    for cpu in 0..8 {
        let g = gate.clone();
        wq.queue_on(
            cpu,
            &Work::new(move || {
                podq::blocking(|| g.wait());
            }),
        );
    }
    gate.wait();
    wq.flush();
    let busy = threads();
    assert!(busy > before, "workers were started ({before} -> {busy})");
    drop(wq);
    // Other tests in this binary may run meanwhile: allow for their threads.
    let deadline = Instant::now() + Duration::from_secs(10);
    while threads() > before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        threads() < busy,
        "dropping the workqueue stopped its 8+ workers ({busy} -> {})",
        threads()
    );
}

/// Drops the last handle of `wq` inside one of its items while 50 items wait behind it;
/// `between` runs after that item is queued and before the 50.
fn drop_inside_an_item(wq: Workqueue, between: impl FnOnce(&Workqueue)) {
    let gate = Arc::new(Barrier::new(2));
    let runs = counter();
    let holder = {
        let (wq2, gate) = (std::sync::Mutex::new(Some(wq.clone())), gate.clone());
        wq.spawn(move || {
            gate.wait();
            // Wait until the test dropped its handle, so this is the last one.
            std::thread::sleep(Duration::from_millis(50));
            drop(wq2.lock().unwrap().take());
        })
    };
    between(&wq);
    for _ in 0..50 {
        spawn_counting(&wq, &runs);
    }
    gate.wait();
    drop(wq);
    holder.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while runs.load(SeqCst) < 50 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        runs.load(SeqCst),
        50,
        "items queued behind the dropping item ran"
    );
}

#[test]
fn dropping_the_last_handle_inside_an_item_loses_nothing() {
    // Items wait for an active slot (max_active 1) behind the dropping item.
    drop_inside_an_item(
        Workqueue::builder("shut-inside")
            .max_active(1)
            .build()
            .unwrap(),
        |_| {},
    );
    // Ordered, with a cpumask change between: the items wait on a plugged pwq that may
    // activate only once the older pwq, running the dropping item, is gone.
    let ordered = Workqueue::builder("shut-inside-ordered")
        .topology(podq::testing::fake_topology(1, 1, 2, 1))
        .ordered(true)
        .build()
        .unwrap();
    drop_inside_an_item(ordered, |wq| {
        wq.set_cpumask([1].into_iter().collect()).unwrap();
    });
}

/// The child half of `process_exit_does_not_wait_for_idle_workers`: run on its own
/// with `--ignored`, it leaves a workqueue with idle workers, a running `blocking` item
/// and a timer armed, and returns from the test (the harness then exits the process).
#[test]
#[ignore = "child process of process_exit_does_not_wait_for_idle_workers"]
fn exit_child() {
    let wq = Workqueue::builder("shut-exit").build().unwrap();
    for _ in 0..100 {
        wq.spawn(|| {});
    }
    wq.flush();
    let d = DelayedWork::new(|| {});
    assert!(wq.queue_delayed(&d, Duration::from_secs(3600)));
    // A worker stays inside an item forever.
    wq.spawn(|| podq::blocking(|| std::thread::sleep(Duration::from_secs(3600))));
    std::mem::forget(wq);
    println!("child-ready");
}

#[test]
fn process_exit_does_not_wait_for_idle_workers() {
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let mut child = Command::new(exe)
        .args(["--ignored", "--exact", "exit_child", "--nocapture"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let limit = Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = std::io::read_to_string(child.stdout.take().unwrap()).unwrap();
    assert!(status.success(), "child failed: {status}\n{out}");
    assert!(
        out.contains("child-ready"),
        "the child ran its part:\n{out}"
    );
    eprintln!("child exited in {:?}", start.elapsed());
}

#[test]
fn a_queue_call_refused_by_a_drain_leaves_the_item_idle() {
    // One thread drains over and over; another queues one item and waits for each
    // accepted run. A refused queue call (`false` while draining) must leave the item
    // idle: not pending, never run later, free to be queued again.
    let wq = Workqueue::builder("shut-refused").build().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let drainer = {
        let (wq, stop) = (wq.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(SeqCst) {
                wq.drain();
            }
        })
    };
    let runs = counter();
    let work = counting_work(&runs);
    let (mut accepted, mut refused) = (0usize, 0usize);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        if wq.queue(&work) {
            accepted += 1;
            work.flush();
        } else {
            refused += 1;
            assert!(
                !work.is_pending(),
                "a refused queue call left the item pending"
            );
        }
    }
    stop.store(true, SeqCst);
    drainer.join().unwrap();
    wq.flush();
    assert_eq!(runs.load(SeqCst), accepted, "{refused} refused calls");
    assert!(refused > 0, "the drains refused some calls");
}

#[test]
fn drop_joins_the_workers_of_a_retiring_pool() {
    let mut alive_after_drop = 0;
    for round in 0..30 {
        let wq = Workqueue::builder(format!("shut-retiring-{round}"))
            .topology(podq::testing::fake_topology(2, 1, 1, 1))
            .scope(podq::Scope::Cpu)
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let started = Arc::new(Barrier::new(2));
        let s = started.clone();
        podq::set_thread_cpu(Some(0));
        wq.spawn(move || {
            s.wait();
            let _ = rx.recv();
        });
        podq::set_thread_cpu(None);
        started.wait();
        let pool = wq
            .stats()
            .pools
            .iter()
            .find(|p| p.pod_cpus == "0" && p.workers > 0)
            .expect("the pool of CPU 0 runs the item")
            .id;
        // The item keeps the old pool's pwq alive, retiring, across the change.
        wq.set_scope(podq::Scope::System).unwrap();
        drop(tx);
        drop(wq);
        if pool_threads(pool) > 0 {
            alive_after_drop += 1;
        }
    }
    assert_eq!(
        alive_after_drop, 0,
        "rounds in which a worker of the retiring pool outlived the drop"
    );
}

//! The stall watchdog and long-item counting. Thresholds here are per workqueue, so the
//! process-wide ones (30 s, 1 s) stay as they are for the other tests of this binary;
//! the CPU-intensive rule, process-wide only, is off (tests/cpu_intensive.rs has it).

use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use podq::watchdog::{Stall, StallKind};
use podq::{Error, Topology, Work, Workqueue};

/// Collects the stalls told to a workqueue's error hook.
fn stall_hook() -> (
    Arc<Mutex<Vec<Stall>>>,
    impl Fn(&podq::ErrorReport<'_>) + Send + Sync,
) {
    let stalls: Arc<Mutex<Vec<Stall>>> = Arc::default();
    let s = stalls.clone();
    let hook = move |r: &podq::ErrorReport<'_>| {
        if let Error::Stall(stall) = r.error {
            assert_eq!(r.pool, stall.pool);
            s.lock().unwrap().push(stall.clone());
        }
    };
    (stalls, hook)
}

/// Waits (up to a minute) until `done` holds.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_long_running_item_is_reported_once_and_counted_long() {
    let (stalls, hook) = stall_hook();
    let wq = Workqueue::builder("wd-running")
        .stall_threshold(Duration::from_millis(40))
        .long_item_threshold(Duration::from_millis(20))
        .error_hook(hook)
        .build()
        .unwrap();
    let (release, gate) = mpsc::channel::<()>();
    let gate = Mutex::new(gate);
    let work = Work::named("slow_commit", move || {
        gate.lock().unwrap().recv().unwrap();
    });
    assert!(wq.queue(&work));
    eventually("a running stall", || !stalls.lock().unwrap().is_empty());
    // Several more looks of the watchdog (it looks every 5 ms here): no second report.
    std::thread::sleep(Duration::from_millis(60));
    release.send(()).unwrap();
    work.flush();
    let all = stalls.lock().unwrap().clone();
    // On a loaded machine the first worker may take longer than the threshold to
    // start: the item waiting for it is a pending stall of its own.
    let (stalls, slow_start): (Vec<Stall>, Vec<Stall>) = all
        .iter()
        .cloned()
        .partition(|s| matches!(s.kind, StallKind::Running { .. }));
    assert!(
        slow_start
            .iter()
            .all(|s| matches!(s.kind, StallKind::Pending { items: 1 })),
        "{all:?}"
    );
    assert_eq!(stalls.len(), 1, "{all:?}");
    match &stalls[0].kind {
        StallKind::Running {
            workqueue, label, ..
        } => {
            assert_eq!(workqueue, "wd-running");
            assert_eq!(label.as_deref(), Some("slow_commit"));
        }
        other => panic!("want a running stall, got {other:?}"),
    }
    assert!(stalls[0].stalled_for >= Duration::from_millis(40));
    let found = wq.stats().watchdog;
    assert_eq!(found.stalls, all.len() as u64);
    assert_eq!(found.last_stall.as_ref(), all.last());
    assert_eq!(found.long_items, 1);
    assert_eq!(
        found.first_long_items[0].label.as_deref(),
        Some("slow_commit")
    );
    assert!(found.first_long_items[0].ran_for >= Duration::from_millis(20));

    // Short items are neither long nor stalled.
    for _ in 0..20 {
        wq.spawn(|| ());
    }
    wq.flush();
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(wq.stats().watchdog.long_items, 1);
    assert_eq!(wq.stats().watchdog.stalls, all.len() as u64);
}

#[test]
fn pending_items_behind_a_stuck_pool_are_reported() {
    let (stalls, hook) = stall_hook();
    // One CPU: one worker may run at a time, so items queued behind a stuck one wait
    // (the stuck one does not leave the count: no test here needs it to).
    podq::watchdog::set_cpu_intensive_threshold(None).unwrap();
    let wq = Workqueue::builder("wd-pending")
        .topology(Topology::synthetic("1s1c1t").unwrap())
        .stall_threshold(Duration::from_millis(40))
        .error_hook(hook)
        .build()
        .unwrap();
    let (release, gate) = mpsc::channel::<()>();
    let gate = Mutex::new(gate);
    let (started_tx, started) = mpsc::channel::<()>();
    wq.spawn(move || {
        started_tx.send(()).unwrap();
        gate.lock().unwrap().recv().unwrap();
    });
    started.recv().unwrap();
    let behind: Vec<_> = (0..3).map(|i| wq.spawn(move || i)).collect();
    let behind_three = |s: &Stall| matches!(s.kind, StallKind::Pending { items: 3 });
    eventually("a pending stall", || {
        stalls.lock().unwrap().iter().any(behind_three)
    });
    std::thread::sleep(Duration::from_millis(60));
    release.send(()).unwrap();
    let results: Vec<i32> = behind.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(results, [0, 1, 2], "nothing lost");
    let stalls = stalls.lock().unwrap().clone();
    let three: Vec<_> = stalls.iter().filter(|s| behind_three(s)).collect();
    assert_eq!(three.len(), 1, "reported once: {stalls:?}");
    assert_eq!(three[0].pool, wq.stats().pools[0].id);
    let running = stalls
        .iter()
        .filter(|s| matches!(s.kind, StallKind::Running { .. }))
        .count();
    assert_eq!(running, 1, "the stuck item itself, once: {stalls:?}");
    // On a loaded machine the first worker may take longer than the threshold to
    // start: the blocker alone waited then, a stall of its own.
    assert!(
        stalls.iter().all(|s| behind_three(s)
            || matches!(
                s.kind,
                StallKind::Running { .. } | StallKind::Pending { items: 1 }
            )),
        "{stalls:?}"
    );
    assert_eq!(wq.stats().watchdog.stalls, stalls.len() as u64);
}

#[test]
fn thresholds_are_validated() {
    let err = Workqueue::builder("wd-bad")
        .stall_threshold(Duration::from_micros(500))
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid stall threshold 500µs: must be at least 1ms"
    );
    let err = Workqueue::builder("wd-bad-long")
        .long_item_threshold(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidWatchdogThreshold {
            what: "long-item",
            ..
        }
    ));
    let err = podq::watchdog::set_stall_threshold(Some(Duration::ZERO)).unwrap_err();
    assert!(err.to_string().contains("stall threshold"), "{err}");
    assert_eq!(
        podq::watchdog::stall_threshold(),
        Some(podq::watchdog::DEFAULT_STALL_THRESHOLD),
        "a refused setting changes nothing"
    );
    assert!(podq::watchdog::set_long_item_threshold(Some(Duration::from_nanos(1))).is_err());
    assert_eq!(
        podq::watchdog::long_item_threshold(),
        Some(podq::watchdog::DEFAULT_LONG_ITEM_THRESHOLD)
    );
}

/// With `panic_on_stall` the process aborts on the first stall. Run in a child
/// process (this same test, told so by the environment).
#[test]
fn panic_on_stall_aborts_the_process() {
    const CHILD: &str = "PODQ_WATCHDOG_ABORT_CHILD";
    if std::env::var_os(CHILD).is_some() {
        podq::watchdog::set_panic_on_stall(true);
        let wq = Workqueue::builder("wd-abort")
            .stall_threshold(Duration::from_millis(20))
            .build()
            .unwrap();
        wq.spawn(|| std::thread::sleep(Duration::from_secs(120)));
        std::thread::sleep(Duration::from_secs(120));
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "panic_on_stall_aborts_the_process",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{:?}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("podq: pool") && stderr.contains("aborting (panic_on_stall)"),
        "{stderr}"
    );
}

//! `Workqueue::shutdown(timeout)`: a bounded drain that reports what did not finish.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use podq::{DelayedWork, Error, Work, Workqueue};

mod common;

#[test]
fn finishes_in_time_and_then_refuses_outside_queueing() {
    let wq = Workqueue::builder("sd-in-time").build().unwrap();
    let runs = common::counter();
    for _ in 0..50 {
        let r = runs.clone();
        wq.spawn(move || {
            std::thread::sleep(Duration::from_millis(1));
            r.fetch_add(1, SeqCst);
        });
    }
    let done = wq.shutdown(Duration::from_secs(60)).unwrap();
    assert_eq!(done.cancelled_on_timer, 0);
    assert_eq!(runs.load(SeqCst), 50, "every item ran before it returned");
    let refused = wq.try_spawn(|| ()).unwrap_err();
    assert!(matches!(refused.error(), Error::Draining { .. }));
    assert!(!wq.queue(&Work::new(|| {})));
    // A second call has nothing left to wait for.
    assert!(wq.shutdown(Duration::ZERO).is_ok());
}

#[test]
fn times_out_reporting_queued_running_and_timer_items_and_loses_none() {
    let wq = Workqueue::builder("sd-late").ordered(true).build().unwrap();
    let (release, gate) = mpsc::channel::<()>();
    let gate = Mutex::new(gate);
    let (started_tx, started) = mpsc::channel::<()>();
    let runs = common::counter();
    let r = runs.clone();
    wq.spawn(move || {
        started_tx.send(()).unwrap();
        gate.lock().unwrap().recv().unwrap();
        r.fetch_add(1, SeqCst);
    });
    started.recv().unwrap();
    for _ in 0..3 {
        let r = runs.clone();
        wq.spawn(move || {
            r.fetch_add(1, SeqCst);
        });
    }
    let late = common::counter();
    let l = late.clone();
    let dwork = DelayedWork::new(move || {
        l.fetch_add(1, SeqCst);
    });
    assert!(wq.queue_delayed(&dwork, Duration::from_secs(3600)));

    let timeout = Duration::from_millis(50);
    let began = Instant::now();
    let err = wq.shutdown(timeout).unwrap_err();
    assert!(began.elapsed() >= timeout, "returned before its timeout");
    assert_eq!(
        (err.queued, err.running, err.cancelled_on_timer),
        (3, 1, 1),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "workqueue `sd-late` did not finish within 50ms: 3 items queued, 1 running \
         (1 cancelled on the timer)"
    );
    assert!(!dwork.is_pending(), "taken off the timer");

    // Nothing is lost: the queued items run once the blocker lets go.
    release.send(()).unwrap();
    wq.flush();
    assert_eq!(runs.load(SeqCst), 4);
    assert_eq!(late.load(SeqCst), 0);
    #[cfg(feature = "stats")]
    assert_eq!(wq.stats().totals.cancelled, 1);
    assert!(wq.shutdown(Duration::from_secs(60)).is_ok());
}

#[test]
fn chained_queueing_and_timers_that_fire_meanwhile_are_waited_for() {
    let wq = Workqueue::builder("sd-chain").build().unwrap();
    let runs = common::counter();
    let me: Arc<OnceLock<(Workqueue, Work)>> = Arc::default();
    let m = me.clone();
    let r = runs.clone();
    let chained = Work::new(move || {
        if r.fetch_add(1, SeqCst) < 19 {
            let (wq, work) = m.get().unwrap();
            assert!(wq.queue(work), "its own items may still queue");
        }
    });
    me.set((wq.clone(), chained.clone())).unwrap();

    let (fired_tx, fired) = mpsc::channel::<()>();
    let dwork = DelayedWork::new(move || {
        let _ = fired_tx.send(());
    });
    assert!(wq.queue_delayed(&dwork, Duration::from_millis(20)));
    let fired = Mutex::new(fired);
    wq.spawn(move || {
        podq::blocking(|| fired.lock().unwrap().recv_timeout(Duration::from_secs(60)))
            .expect("the timer fired while the shutdown waited");
    });
    assert!(wq.queue(&chained));
    let done = wq.shutdown(Duration::from_secs(60)).unwrap();
    assert_eq!(done.cancelled_on_timer, 0, "it fired and ran instead");
    assert_eq!(runs.load(SeqCst), 20);
}

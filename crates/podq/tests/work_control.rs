//! Controlling single items: `Work::disable`/`enable`/`is_running`, labels and
//! `podq::current()`.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::mpsc;
use std::time::Duration;

use podq::{DelayedWork, Error, Topology, Work, Workqueue};

mod common;

/// An ordered workqueue whose only item slot is held by a blocker until the returned
/// sender is dropped or sent to.
fn blocked(name: &str) -> (Workqueue, mpsc::Sender<()>, Work) {
    let wq = Workqueue::builder(name).ordered(true).build().unwrap();
    let (release, wait) = mpsc::channel::<()>();
    let wait = std::sync::Mutex::new(wait);
    let (started_tx, started) = mpsc::channel::<()>();
    let blocker = Work::new(move || {
        let _ = started_tx.send(());
        let _ = wait.lock().unwrap().recv();
    });
    assert!(wq.queue(&blocker));
    started.recv().unwrap();
    (wq, release, blocker)
}

#[test]
fn disable_cancels_the_queued_instance_and_refuses_queueing_until_enabled() {
    let (wq, release, blocker) = blocked("wc-disable");
    let runs = common::counter();
    let r = runs.clone();
    let work = Work::new(move || {
        r.fetch_add(1, SeqCst);
    });
    assert!(wq.queue(&work));
    assert!(work.disable().unwrap(), "an instance was pending");
    assert!(work.is_disabled());
    assert!(!work.is_pending());
    assert!(!wq.queue(&work), "disabled: refused");
    assert!(!work.disable().unwrap(), "nests; nothing pending now");
    assert!(!work.enable().unwrap(), "still disabled once");
    assert!(!wq.queue(&work));
    release.send(()).unwrap();
    wq.flush();
    assert_eq!(runs.load(SeqCst), 0, "the cancelled instance never ran");
    assert_eq!(wq.stats().totals.cancelled, 1, "and was counted cancelled");
    assert!(work.enable().unwrap());
    assert!(!work.is_disabled());
    assert!(wq.queue(&work));
    wq.flush();
    assert_eq!(runs.load(SeqCst), 1);
    assert!(matches!(work.enable(), Err(Error::NotDisabled)));
    drop(blocker);
}

#[test]
fn disable_on_the_timer_takes_it_off_and_refuses_arming() {
    let wq = Workqueue::builder("wc-delayed").build().unwrap();
    let runs = common::counter();
    let r = runs.clone();
    let dwork = DelayedWork::named("late", move || {
        r.fetch_add(1, SeqCst);
    });
    assert_eq!(dwork.label(), Some("late"));
    assert!(wq.queue_delayed(&dwork, Duration::from_millis(20)));
    assert!(dwork.disable().unwrap());
    assert!(!wq.queue_delayed(&dwork, Duration::ZERO), "arming refused");
    assert!(!wq.mod_delayed(&dwork, Duration::ZERO), "re-arming refused");
    std::thread::sleep(Duration::from_millis(60));
    wq.flush();
    assert_eq!(runs.load(SeqCst), 0);
    assert!(dwork.enable().unwrap());
    assert!(wq.queue_delayed(&dwork, Duration::ZERO));
    dwork.flush();
    assert_eq!(runs.load(SeqCst), 1);
}

#[test]
fn is_running_while_the_function_runs_and_disable_sync_waits_for_it() {
    let wq = Workqueue::builder("wc-running").build().unwrap();
    let (started_tx, started) = mpsc::channel::<()>();
    let (release, wait) = mpsc::channel::<()>();
    let wait = std::sync::Mutex::new(wait);
    let finished = common::counter();
    let f = finished.clone();
    let work = Work::new(move || {
        let _ = started_tx.send(());
        let _ = wait.lock().unwrap().recv();
        f.fetch_add(1, SeqCst);
    });
    assert!(!work.is_running());
    assert!(wq.queue(&work));
    started.recv().unwrap();
    assert!(work.is_running());
    assert!(!work.is_pending());
    let disabler = {
        let work = work.clone();
        std::thread::spawn(move || work.disable_sync().unwrap())
    };
    std::thread::sleep(Duration::from_millis(30));
    assert!(!disabler.is_finished(), "disable_sync waits for the run");
    release.send(()).unwrap();
    assert!(!disabler.join().unwrap(), "nothing was pending");
    assert_eq!(finished.load(SeqCst), 1, "it returned after the run ended");
    assert!(!work.is_running());
    assert!(!wq.queue(&work), "still disabled");
    assert!(work.enable().unwrap());
}

#[test]
fn disable_from_the_item_itself_stops_its_requeue() {
    let wq = Workqueue::builder("wc-self").build().unwrap();
    let runs = common::counter();
    let slot: std::sync::Arc<std::sync::OnceLock<(Workqueue, Work)>> = Default::default();
    let s = slot.clone();
    let r = runs.clone();
    let work = Work::new(move || {
        let (wq, me) = s.get().unwrap();
        if r.fetch_add(1, SeqCst) == 2 {
            assert!(!me.disable_sync().unwrap(), "does not wait for itself");
        }
        wq.queue(me);
    });
    slot.set((wq.clone(), work.clone())).unwrap();
    assert!(wq.queue(&work));
    while work.is_pending() || work.is_running() {
        std::thread::sleep(Duration::from_millis(1));
    }
    wq.flush();
    assert_eq!(runs.load(SeqCst), 3);
    assert!(work.is_disabled());
}

#[test]
fn current_names_the_workqueue_label_pool_and_cpu() {
    let topo = Topology::synthetic("1s4c1t").unwrap();
    let wq = Workqueue::builder("wc-current")
        .topology(topo)
        .build()
        .unwrap();
    assert_eq!(podq::current(), None, "not inside an item");
    let (tx, rx) = mpsc::channel();
    let work = Work::named("rpc_release", move || {
        tx.send(podq::current()).unwrap();
    });
    assert!(wq.queue_on(2, &work));
    let me = rx.recv().unwrap().expect("inside an item");
    assert_eq!(me.workqueue, "wc-current");
    assert_eq!(me.label.as_deref(), Some("rpc_release"));
    assert!(me.cpu < 4, "a CPU of the fake topology, not {}", me.cpu);
    let pools: Vec<u64> = wq.stats().pools.iter().map(|p| p.id).collect();
    assert!(
        pools.contains(&me.pool),
        "pool {} not in {pools:?}",
        me.pool
    );

    let named = wq.spawn_named("checksum", podq::current);
    let me = named.join().unwrap().unwrap();
    assert_eq!(me.label.as_deref(), Some("checksum"));
    // The label does not outlive its item: an unlabelled one after it has none.
    for _ in 0..8 {
        let me = wq.spawn(podq::current).join().unwrap().unwrap();
        assert_eq!(me.label, None);
        assert_eq!(me.workqueue, "wc-current");
    }
    let me = podq::spawn_named("dfl", podq::current)
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(me.workqueue, podq::DEFAULT_WORKQUEUE_NAME);
    assert_eq!(me.label.as_deref(), Some("dfl"));
}

#[test]
fn a_panicking_labelled_item_leaves_no_label_behind() {
    let wq = Workqueue::builder("wc-panic")
        .ordered(true)
        .build()
        .unwrap();
    wq.spawn_named("boom", || panic!("expected test panic"));
    let me = wq.spawn(podq::current).join().unwrap().unwrap();
    assert_eq!(me.label, None);
    let work = Work::named("boom-work", || panic!("expected test panic"));
    wq.queue(&work);
    work.flush();
    let me = wq.spawn(podq::current).join().unwrap().unwrap();
    assert_eq!(me.label, None);
}

#[test]
fn cancel_sync_keeps_a_full_disable_depth() {
    let work = Work::new(|| {});
    for _ in 0..65535 {
        work.disable().unwrap();
    }
    assert!(matches!(
        work.disable(),
        Err(Error::DisableDepth { max: 65535 })
    ));
    assert!(!work.cancel_sync());
    for _ in 1..65535 {
        assert!(
            !work.enable().unwrap(),
            "cancel_sync undid one of the disables"
        );
    }
    assert!(work.enable().unwrap());
}

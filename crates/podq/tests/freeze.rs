//! `Workqueue::freeze` / `thaw`: new and queued items wait, running ones finish, nothing
//! is lost through cancel, flush, attribute changes, timers, shutdown and drop.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use podq::{DelayedWork, Error, Scope, Topology, Work, Workqueue};
use proptest::prelude::*;

mod common;

/// Long enough for an item that should not run to have run.
const SETTLE: Duration = Duration::from_millis(50);

fn fake(name: &str) -> Workqueue {
    Workqueue::builder(name)
        .topology(Topology::synthetic("2s2c2t").unwrap())
        .scope(Scope::Cache)
        .build()
        .unwrap()
}

#[test]
fn items_queued_while_frozen_wait_and_run_once_after_thaw() {
    let wq = fake("fz-basic");
    assert!(!wq.is_frozen());
    wq.freeze().unwrap();
    assert!(wq.is_frozen());
    let runs = common::counter();
    let work = common::counting_work(&runs);
    assert!(wq.queue(&work));
    assert!(!wq.queue(&work), "PENDING coalesces while frozen too");
    for _ in 0..10 {
        common::spawn_counting(&wq, &runs);
    }
    std::thread::sleep(SETTLE);
    assert_eq!(runs.load(SeqCst), 0);
    let dump = wq.dump();
    assert!(dump.frozen);
    assert_eq!(dump.in_flight, 11);
    assert_eq!(dump.pwqs.iter().map(|p| p.inactive).sum::<usize>(), 11);
    assert!(dump.to_string().contains(": frozen, "), "{dump}");
    assert!(wq.thaw());
    assert!(!wq.thaw(), "not frozen any more");
    wq.flush();
    assert_eq!(runs.load(SeqCst), 11);
    assert!(!wq.dump().frozen);
}

#[test]
fn freeze_waits_for_running_items_and_holds_queued_ones() {
    let wq = Workqueue::builder("fz-running")
        .max_active(1)
        .build()
        .unwrap();
    let (release, running) = common::blocker(&wq);
    let runs = common::counter();
    for _ in 0..5 {
        // Behind the running item: inactive, waiting for the one slot.
        common::spawn_counting(&wq, &runs);
    }
    let (done_tx, done) = mpsc::channel();
    let freezer = {
        let wq = wq.clone();
        std::thread::spawn(move || done_tx.send(wq.freeze()).unwrap())
    };
    assert!(
        done.recv_timeout(SETTLE).is_err(),
        "freeze returned while an item ran"
    );
    release.send(()).unwrap();
    done.recv().unwrap().unwrap();
    freezer.join().unwrap();
    running.join().unwrap();
    std::thread::sleep(SETTLE);
    assert_eq!(runs.load(SeqCst), 0, "queued items stayed inactive");
    assert_eq!(wq.dump().nodes.iter().map(|n| n.nr).sum::<usize>(), 0);
    assert!(wq.thaw());
    wq.flush();
    assert_eq!(runs.load(SeqCst), 5);
}

#[test]
fn ordered_items_keep_their_order_across_a_freeze() {
    let wq = Workqueue::builder("fz-ordered")
        .ordered(true)
        .build()
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let push = |i: usize| {
        let order = Arc::clone(&order);
        drop(wq.spawn(move || order.lock().unwrap().push(i)));
    };
    let (release, running) = common::blocker(&wq);
    (0..5).for_each(push);
    let freezer = {
        let wq = wq.clone();
        std::thread::spawn(move || wq.freeze())
    };
    while !wq.is_frozen() {
        std::thread::yield_now();
    }
    (5..10).for_each(push);
    release.send(()).unwrap();
    freezer.join().unwrap().unwrap();
    running.join().unwrap();
    assert!(order.lock().unwrap().is_empty());
    wq.thaw();
    wq.flush();
    assert_eq!(*order.lock().unwrap(), (0..10).collect::<Vec<_>>());
}

#[test]
fn freezing_from_an_own_item_is_refused() {
    let wq = Workqueue::builder("fz-own").build().unwrap();
    let inner = wq.clone();
    let result = wq.spawn(move || inner.freeze()).join().unwrap();
    assert!(
        matches!(&result, Err(Error::FreezeFromOwnItem { wq }) if wq == "fz-own"),
        "{result:?}"
    );
    assert_eq!(
        result.unwrap_err().to_string(),
        "workqueue `fz-own` cannot be frozen from one of its own items: freeze waits until none runs"
    );
    assert!(!wq.is_frozen());
}

#[test]
fn a_thaw_during_the_wait_ends_the_freeze_with_an_error() {
    let wq = Workqueue::builder("fz-thawed").build().unwrap();
    let (release, running) = common::blocker(&wq);
    let freezer = {
        let wq = wq.clone();
        std::thread::spawn(move || wq.freeze())
    };
    while !wq.is_frozen() {
        std::thread::yield_now();
    }
    assert!(wq.thaw());
    let result = freezer.join().unwrap();
    assert!(
        matches!(&result, Err(Error::ThawedWhileFreezing { wq }) if wq == "fz-thawed"),
        "{result:?}"
    );
    release.send(()).unwrap();
    running.join().unwrap();
}

#[test]
fn cancel_while_frozen_removes_the_waiting_instance() {
    let wq = fake("fz-cancel");
    let runs = common::counter();
    let work = common::counting_work(&runs);
    wq.freeze().unwrap();
    assert!(wq.queue(&work));
    assert!(work.cancel(), "it was pending");
    assert!(!work.cancel());
    // Free to be queued again, and that instance runs.
    assert!(wq.queue(&work));
    wq.thaw();
    wq.flush();
    assert_eq!(runs.load(SeqCst), 1);
    assert_eq!(wq.dump().in_flight, 0);
    #[cfg(feature = "stats")]
    assert_eq!(wq.stats().totals.cancelled, 1);
}

#[test]
fn flush_on_a_frozen_workqueue_waits_for_the_thaw() {
    let wq = fake("fz-flush");
    let runs = common::counter();
    wq.freeze().unwrap();
    common::spawn_counting(&wq, &runs);
    assert!(
        !common::flush_within(&wq, SETTLE),
        "flush returned while frozen"
    );
    let (tx, rx) = mpsc::channel();
    let flusher = {
        let wq = wq.clone();
        std::thread::spawn(move || {
            wq.flush();
            tx.send(()).unwrap();
        })
    };
    assert!(rx.recv_timeout(SETTLE).is_err());
    wq.thaw();
    rx.recv().unwrap();
    flusher.join().unwrap();
    assert_eq!(runs.load(SeqCst), 1);
}

#[test]
fn attribute_changes_while_frozen_make_frozen_pwqs() {
    let wq = fake("fz-attrs");
    let runs = common::counter();
    wq.freeze().unwrap();
    for _ in 0..4 {
        common::spawn_counting(&wq, &runs);
    }
    wq.set_scope(Scope::Cpu).unwrap();
    wq.set_max_active(2).unwrap();
    for cpu in 0..8 {
        let work = common::counting_work(&runs);
        assert!(wq.queue_on(cpu, &work));
    }
    wq.set_scope(Scope::System).unwrap();
    std::thread::sleep(SETTLE);
    assert_eq!(runs.load(SeqCst), 0);
    let dump = wq.dump();
    assert_eq!(dump.in_flight, 12);
    assert!(dump.pwqs.iter().any(|p| !p.current && p.inactive > 0));
    for cpu in 0..8 {
        assert!(wq.congested(cpu).unwrap(), "CPU {cpu}: frozen is congested");
    }
    wq.thaw();
    wq.flush();
    assert_eq!(runs.load(SeqCst), 12);
    // The last completion on an old pwq retires it just after the flush can see it
    // empty: give it a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !wq.dump().pwqs.iter().all(|p| p.current) {
        assert!(
            std::time::Instant::now() < deadline,
            "old pwqs never retired"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_timer_that_fires_while_frozen_queues_its_item_to_wait() {
    let wq = fake("fz-timer");
    let runs = common::counter();
    let dwork: DelayedWork = common::counting_delayed(&runs);
    wq.freeze().unwrap();
    assert!(wq.queue_delayed(&dwork, Duration::from_millis(1)));
    while wq.dump().in_flight == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(SETTLE);
    assert_eq!(runs.load(SeqCst), 0);
    wq.thaw();
    wq.flush();
    assert_eq!(runs.load(SeqCst), 1);
}

#[test]
fn dropping_a_frozen_workqueue_runs_what_waited() {
    let wq = fake("fz-drop");
    let runs = common::counter();
    wq.freeze().unwrap();
    for _ in 0..20 {
        common::spawn_counting(&wq, &runs);
    }
    drop(wq);
    assert_eq!(runs.load(SeqCst), 20);
}

#[test]
fn shutdown_of_a_frozen_workqueue_thaws_and_drains() {
    let wq = fake("fz-shutdown");
    let runs = common::counter();
    wq.freeze().unwrap();
    for _ in 0..20 {
        common::spawn_counting(&wq, &runs);
    }
    wq.shutdown(Duration::from_secs(60)).unwrap();
    assert_eq!(runs.load(SeqCst), 20);
    assert!(!wq.is_frozen());
}

#[cfg(feature = "control")]
#[test]
fn ctl_list_and_dump_show_a_frozen_workqueue() {
    let mut ctl = common::control();
    let wq = Workqueue::builder("fz-ctl").build().unwrap();
    wq.expose().unwrap();
    let frozen_in_list = |ctl: &mut common::Control| {
        let reply = ctl
            .client
            .call(&common::request(r#"{"cmd":"list"}"#))
            .unwrap();
        let queues = reply.queues.unwrap();
        queues.iter().find(|q| q.name == "fz-ctl").unwrap().frozen
    };
    assert!(!frozen_in_list(&mut ctl));
    wq.freeze().unwrap();
    assert!(frozen_in_list(&mut ctl));
    let reply = ctl
        .client
        .call(&common::request(r#"{"cmd":"dump","queue":"fz-ctl"}"#))
        .unwrap();
    assert!(reply.dump.unwrap()[0].frozen);
    wq.thaw();
    assert!(!frozen_in_list(&mut ctl));
}

/// One step of the property's script.
#[derive(Clone, Debug)]
enum Op {
    /// Queue the `n`th re-queueable item (coalesces if it is still pending).
    Queue(usize),
    /// Spawn a one-shot item.
    Spawn,
    Freeze,
    Thaw,
    Scope(Scope),
    Cancel(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..6).prop_map(Op::Queue),
        4 => Just(Op::Spawn),
        1 => Just(Op::Freeze),
        1 => Just(Op::Thaw),
        1 => prop::sample::select(vec![Scope::Cpu, Scope::Cache, Scope::Numa, Scope::System])
            .prop_map(Op::Scope),
        1 => (0usize..6).prop_map(Op::Cancel),
    ]
}

/// Cases of the property: `PODQ_FREEZE_CASES` (default 24).
fn cases() -> u32 {
    std::env::var("PODQ_FREEZE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Two threads run scripts of queue, spawn, freeze, thaw, scope changes and
    /// cancels on one workqueue: no item starts between a `freeze` returning and the
    /// next `thaw`, and at the end (thawed, flushed) every accepted queue call that was
    /// not cancelled ran exactly once.
    #[test]
    fn frozen_items_all_run_exactly_once_after_thaw(
        scripts in prop::collection::vec(prop::collection::vec(op(), 1..40), 2),
    ) {
        let wq = Workqueue::builder("fz-prop")
            .topology(Topology::synthetic("2s2c2t").unwrap())
            .scope(Scope::Cache)
            .max_active(4)
            .build()
            .unwrap();
        // Set after a `freeze` returned, cleared before `thaw`; one lock serialises the
        // two threads' freezes and thaws so the flag means "frozen, none running".
        let closed = Arc::new(AtomicBool::new(false));
        let freezer = Arc::new(Mutex::new(()));
        let started_while_closed = common::counter();
        let spawned_runs = common::counter();
        let item = |runs: &Arc<AtomicUsize>| {
            let (closed, bad, runs) = (closed.clone(), started_while_closed.clone(), runs.clone());
            move || {
                if closed.load(SeqCst) {
                    bad.fetch_add(1, SeqCst);
                }
                runs.fetch_add(1, SeqCst);
            }
        };
        let work_runs: Vec<Arc<AtomicUsize>> = (0..6).map(|_| common::counter()).collect();
        let works: Vec<Work> = work_runs.iter().map(|r| Work::new(item(r))).collect();
        let expected_work: Vec<AtomicUsize> = (0..6).map(|_| AtomicUsize::new(0)).collect();
        let spawned = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for script in &scripts {
                let (wq, works, expected_work, spawned) = (&wq, &works, &expected_work, &spawned);
                let (closed, freezer, item, spawned_runs) = (&closed, &freezer, &item, &spawned_runs);
                s.spawn(move || {
                    for op in script {
                        match op {
                            Op::Queue(i) => {
                                if wq.queue(&works[*i]) {
                                    expected_work[*i].fetch_add(1, SeqCst);
                                }
                            }
                            Op::Spawn => {
                                drop(wq.spawn(item(spawned_runs)));
                                spawned.fetch_add(1, SeqCst);
                            }
                            Op::Freeze => {
                                let _one = freezer.lock().unwrap();
                                wq.freeze().unwrap();
                                closed.store(true, SeqCst);
                            }
                            Op::Thaw => {
                                let _one = freezer.lock().unwrap();
                                closed.store(false, SeqCst);
                                wq.thaw();
                            }
                            Op::Scope(scope) => wq.set_scope(*scope).unwrap(),
                            Op::Cancel(i) => {
                                if works[*i].cancel() {
                                    expected_work[*i].fetch_sub(1, SeqCst);
                                }
                            }
                        }
                    }
                });
            }
        });
        closed.store(false, SeqCst);
        wq.thaw();
        wq.flush();
        prop_assert_eq!(started_while_closed.load(SeqCst), 0);
        prop_assert_eq!(spawned_runs.load(SeqCst), spawned.load(SeqCst));
        for (runs, expected) in work_runs.iter().zip(&expected_work) {
            prop_assert_eq!(runs.load(SeqCst), expected.load(SeqCst));
        }
        prop_assert_eq!(wq.dump().in_flight, 0);
    }
}

//! Behaviour of work items, spawn, flush, cancel and drain on the live machine and on
//! fake topologies.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use podq::testing::fake_topology;
use podq::{CpuSet, Error, Scope, Work, Workqueue};

mod common;
use common::{counter, counting_delayed, counting_work, spawn_counting};

fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info.to_string();
            if !msg.contains("podq-test-panic") {
                default(info);
            }
        }));
    });
}

#[test]
fn queue_runs_once_and_pending_merges() {
    let wq = Workqueue::builder("t-merge").build().unwrap();
    let gate = Arc::new(Barrier::new(2));
    let runs = counter();
    let (g, r) = (gate.clone(), runs.clone());
    let blocker = Work::new(move || {
        g.wait();
    });
    let work = Work::new(move || {
        r.fetch_add(1, SeqCst);
    });
    // Keep the pool busy on an ordered queue so the second queue call sees PENDING.
    let ordered = Workqueue::builder("t-merge-ordered")
        .ordered(true)
        .build()
        .unwrap();
    assert!(ordered.queue(&blocker));
    assert!(ordered.queue(&work));
    assert!(
        !ordered.queue(&work),
        "queueing a pending item returns false"
    );
    assert!(work.is_pending());
    gate.wait();
    ordered.flush();
    assert_eq!(runs.load(SeqCst), 1);
    assert!(!work.is_pending());
    assert!(wq.queue(&work));
    wq.flush();
    assert_eq!(runs.load(SeqCst), 2);
}

#[test]
fn requeue_while_running_runs_again_never_concurrently() {
    let wq = Workqueue::builder("t-reentrant")
        .scope(Scope::Cpu)
        .build()
        .unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = counter();
    let runs = counter();
    let (i, o, r) = (inside.clone(), overlaps.clone(), runs.clone());
    let work = Work::new(move || {
        if i.fetch_add(1, SeqCst) != 0 {
            o.fetch_add(1, SeqCst);
        }
        std::thread::sleep(Duration::from_micros(200));
        i.fetch_sub(1, SeqCst);
        r.fetch_add(1, SeqCst);
    });
    let mut accepted = 0;
    for round in 0..200 {
        // Queue from every CPU's pod so the second run lands on another pool.
        if wq.queue_on(round % 2, &work) {
            accepted += 1;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    wq.flush();
    work.flush();
    assert_eq!(
        overlaps.load(SeqCst),
        0,
        "an item never runs concurrently with itself"
    );
    assert_eq!(runs.load(SeqCst), accepted);
}

#[test]
fn spawn_returns_values_and_panics() {
    quiet_panics();
    let wq = Workqueue::builder("t-spawn").build().unwrap();
    let handles: Vec<_> = (0..100).map(|i| wq.spawn(move || i * 2)).collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), i * 2);
    }
    let bad = wq.spawn(|| -> u8 { panic!("podq-test-panic spawn") });
    let err = bad.join().unwrap_err();
    assert!(err.message.contains("podq-test-panic"), "{err}");
    // The pool goes on after a panic.
    assert_eq!(wq.spawn(|| 7).join().unwrap(), 7);
    wq.flush(); // accounting finishes after the result is delivered
    if cfg!(feature = "stats") {
        let stats = wq.stats();
        assert_eq!(stats.totals.panicked, 1);
        assert_eq!(stats.totals.completed, 102);
    }
}

#[test]
fn a_join_handle_waits_with_a_timeout() {
    quiet_panics();
    let wq = Workqueue::builder("t-wait-timeout").build().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<u32>();
    let mut item = wq.spawn(move || rx.recv().unwrap() + 1);
    assert!(
        !item.wait_timeout(Duration::ZERO),
        "a zero timeout only looks"
    );
    let start = std::time::Instant::now();
    assert!(!item.wait_timeout(Duration::from_millis(20)));
    assert!(
        start.elapsed() >= Duration::from_millis(20),
        "gave up early"
    );
    assert!(!item.is_finished());
    tx.send(41).unwrap();
    // A timeout past the clock's range waits as long as it takes.
    assert!(item.wait_timeout(Duration::MAX));
    assert!(item.wait_timeout(Duration::ZERO), "finished stays finished");
    assert_eq!(item.join().unwrap(), 42);

    let mut bad = wq.spawn(|| -> u8 { panic!("podq-test-panic wait_timeout") });
    assert!(bad.wait_timeout(Duration::from_secs(60)));
    assert!(bad.join().unwrap_err().message.contains("podq-test-panic"));

    // Inside an item the wait is a `blocking` section: on a one-CPU pod the item it
    // waits for, queued behind it, gets a worker and runs.
    let one = Workqueue::builder("t-wait-timeout-1cpu")
        .topology(fake_topology(1, 1, 1, 1))
        .build()
        .unwrap();
    let inner = one.clone();
    let outer = one.spawn(move || {
        let mut behind = inner.spawn(|| 7);
        let finished = behind.wait_timeout(Duration::from_secs(60));
        (finished, behind.join().unwrap())
    });
    assert_eq!(outer.join().unwrap(), (true, 7));
}

#[test]
fn join_handle_is_a_future() {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Wake, Waker};

    struct Flag(AtomicBool, std::thread::Thread);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, SeqCst);
            self.1.unpark();
        }
    }
    let wq = Workqueue::builder("t-future").build().unwrap();
    let flag = Arc::new(Flag(AtomicBool::new(false), std::thread::current()));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(wq.spawn(|| {
        std::thread::sleep(Duration::from_millis(5));
        "async"
    }));
    loop {
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(v) => {
                assert_eq!(v.unwrap(), "async");
                break;
            }
            Poll::Pending => {
                while !flag.0.swap(false, SeqCst) {
                    std::thread::park();
                }
            }
        }
    }
}

#[test]
fn cancel_sync_beats_self_requeue() {
    let wq = Workqueue::builder("t-cancel").build().unwrap();
    let runs = counter();
    let slot: Arc<Mutex<Option<(Workqueue, Work)>>> = Arc::new(Mutex::new(None));
    let (r, s) = (runs.clone(), slot.clone());
    let work = Work::new(move || {
        r.fetch_add(1, SeqCst);
        if let Some((wq, me)) = s.lock().unwrap().as_ref() {
            wq.queue(me);
        }
    });
    *slot.lock().unwrap() = Some((wq.clone(), work.clone()));
    wq.queue(&work);
    while runs.load(SeqCst) < 50 {
        std::thread::yield_now();
    }
    work.cancel_sync();
    assert!(!work.is_pending());
    let after = runs.load(SeqCst);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        runs.load(SeqCst),
        after,
        "nothing runs after cancel_sync returned"
    );
    slot.lock().unwrap().take();
    // The item is usable again afterwards.
    assert!(wq.queue(&work));
    wq.flush();
    assert_eq!(runs.load(SeqCst), after + 1);
}

#[test]
fn cancel_removes_a_pending_item() {
    let wq = Workqueue::builder("t-cancel-pending")
        .ordered(true)
        .build()
        .unwrap();
    let gate = Arc::new(Barrier::new(2));
    let g = gate.clone();
    let blocker = Work::new(move || {
        g.wait();
    });
    let runs = counter();
    let work = counting_work(&runs);
    wq.queue(&blocker);
    wq.queue(&work);
    assert!(work.cancel());
    assert!(!work.cancel());
    gate.wait();
    wq.flush();
    assert_eq!(runs.load(SeqCst), 0);
    if cfg!(feature = "stats") {
        assert_eq!(wq.stats().totals.cancelled, 1);
    }
}

#[test]
fn flush_waits_for_everything_before_it() {
    let wq = Workqueue::builder("t-flush").max_active(3).build().unwrap();
    let done = counter();
    for _ in 0..500 {
        let d = done.clone();
        wq.spawn(move || {
            std::thread::sleep(Duration::from_micros(20));
            d.fetch_add(1, SeqCst);
        });
    }
    wq.flush();
    assert_eq!(done.load(SeqCst), 500);
}

#[test]
fn max_active_is_enforced_in_fifo_order() {
    for max_active in [1, 2] {
        let wq = Workqueue::builder(format!("t-max-active-{max_active}"))
            .max_active(max_active)
            .build()
            .unwrap();
        let running = counter();
        let peak = counter();
        let order = Arc::new(Mutex::new(Vec::new()));
        // All from one CPU: one pwq, whatever the machine's pods.
        let first = wq.topology().usable().first().unwrap();
        podq::set_thread_cpu(Some(first));
        for i in 0..200 {
            let (r, p, o) = (running.clone(), peak.clone(), order.clone());
            wq.spawn(move || {
                let now = r.fetch_add(1, SeqCst) + 1;
                p.fetch_max(now, SeqCst);
                o.lock().unwrap().push(i);
                std::thread::sleep(Duration::from_micros(50));
                r.fetch_sub(1, SeqCst);
            });
        }
        podq::set_thread_cpu(None);
        wq.flush();
        assert!(
            peak.load(SeqCst) <= max_active,
            "peak {}",
            peak.load(SeqCst)
        );
        let mut order = order.lock().unwrap().clone();
        if max_active == 1 {
            // One slot: an item is activated only after the one before it finished, so
            // the start order is the queueing order exactly. (With two slots a worker
            // preempted between taking an item and its first instruction lets the other
            // slot run any number of later items first: the observed order proves
            // nothing there.)
            assert_eq!(order, (0..200).collect::<Vec<_>>());
        }
        order.sort_unstable();
        assert_eq!(order, (0..200).collect::<Vec<_>>(), "each ran once");
        if cfg!(feature = "stats") {
            assert!(wq.stats().totals.max_active_waits > 0);
        }
    }
}

#[test]
fn ordered_runs_one_at_a_time_in_order() {
    let wq = Workqueue::builder("t-ordered")
        .ordered(true)
        .build()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let running = counter();
    for i in 0..300 {
        let (s, r) = (seen.clone(), running.clone());
        wq.spawn(move || {
            assert_eq!(r.fetch_add(1, SeqCst), 0);
            s.lock().unwrap().push(i);
            r.fetch_sub(1, SeqCst);
        });
    }
    wq.flush();
    assert_eq!(*seen.lock().unwrap(), (0..300).collect::<Vec<_>>());
    assert!(matches!(wq.set_max_active(4), Err(Error::Ordered { .. })));
}

#[test]
fn drain_accepts_only_chained_work() {
    let wq = Workqueue::builder("t-drain").build().unwrap();
    let chain = counter();
    let refused = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(Barrier::new(2));
    let (c, w2, g) = (chain.clone(), wq.clone(), gate.clone());
    let work = Arc::new(Mutex::new(None::<Work>));
    let slot = work.clone();
    let item = Work::new(move || {
        g.wait();
        // Chained: queueing from its own item is accepted while draining.
        if c.fetch_add(1, SeqCst) < 10 {
            let me = slot.lock().unwrap().clone().unwrap();
            assert!(w2.try_queue(&me).unwrap());
        }
    });
    *work.lock().unwrap() = Some(item.clone());
    wq.queue(&item);
    let (w3, rf, g2) = (wq.clone(), refused.clone(), gate.clone());
    let outsider = std::thread::spawn(move || {
        // Wait until the drain has started, then try from outside.
        while !matches!(w3.try_queue(&Work::new(|| {})), Err(Error::Draining { .. })) {
            std::thread::yield_now();
        }
        rf.store(true, SeqCst);
        for _ in 0..11 {
            g2.wait();
        }
    });
    wq.drain();
    outsider.join().unwrap();
    assert!(refused.load(SeqCst));
    assert_eq!(chain.load(SeqCst), 11);
    // After draining, queueing works again.
    assert!(wq.try_spawn(|| ()).is_ok());
    wq.flush();
}

#[test]
fn delayed_work() {
    let wq = Workqueue::builder("t-delayed").build().unwrap();
    let runs = counter();
    let dwork = counting_delayed(&runs);
    assert!(wq.queue_delayed(&dwork, Duration::from_millis(5)));
    assert!(!wq.queue_delayed(&dwork, Duration::from_millis(5)));
    while runs.load(SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    dwork.flush();
    assert!(wq.queue_delayed(&dwork, Duration::from_secs(3600)));
    assert!(dwork.cancel());
    assert!(!dwork.is_pending());
    assert!(wq.queue_delayed(&dwork, Duration::from_secs(3600)));
    assert!(
        wq.mod_delayed(&dwork, Duration::from_secs(7200)),
        "was pending"
    );
    assert!(dwork.flush(), "flush queues a timer item at once");
    assert_eq!(runs.load(SeqCst), 2);
    assert!(!wq.mod_delayed(&dwork, Duration::ZERO));
    dwork.flush();
    assert_eq!(runs.load(SeqCst), 3);
    assert!(wq.queue_delayed(&dwork, Duration::from_secs(3600)));
    assert!(dwork.cancel_sync());
    assert_eq!(runs.load(SeqCst), 3);
}

#[test]
fn dropping_a_workqueue_cancels_timers_and_finishes_items() {
    let runs = counter();
    let dwork = counting_delayed(&runs);
    let wq = Workqueue::builder("t-drop").build().unwrap();
    for _ in 0..100 {
        spawn_counting(&wq, &runs);
    }
    assert!(wq.queue_delayed(&dwork, Duration::from_secs(3600)));
    drop(wq);
    assert_eq!(runs.load(SeqCst), 100, "drop drains");
    assert!(!dwork.is_pending(), "drop cancels what is on the timer");
    assert!(!podq::stats::all().iter().any(|s| s.name == "t-drop"));
}

#[test]
fn bad_attributes_are_refused_and_change_nothing() {
    let topo = fake_topology(1, 1, 2, 2);
    let wq = Workqueue::builder("t-bad").topology(topo).build().unwrap();
    let before = wq.attrs();
    assert!(matches!(
        wq.set_cpumask(CpuSet::new()),
        Err(Error::EmptyCpumask)
    ));
    assert!(matches!(
        wq.set_cpumask(CpuSet::single(99)),
        Err(Error::NoUsableCpu { .. })
    ));
    assert!(matches!(
        wq.set_max_active(0),
        Err(Error::InvalidMaxActive { value: 0 })
    ));
    assert!(matches!(
        wq.set_max_active(5000),
        Err(Error::InvalidMaxActive { .. })
    ));
    assert!(matches!(
        wq.set_nice(20),
        Err(Error::InvalidNice { value: 20 })
    ));
    assert!(matches!(
        podq::set_default_scope(Scope::Default),
        Err(Error::DefaultScope { .. })
    ));
    assert_eq!(wq.attrs(), before);
    assert!(matches!(
        Workqueue::builder("").build(),
        Err(Error::EmptyName)
    ));
    assert!(matches!(
        Workqueue::builder("x").max_active(0).build(),
        Err(Error::InvalidMaxActive { value: 0 })
    ));
    assert_eq!(wq.spawn(|| 1).join().unwrap(), 1, "still works");
}

#[test]
fn cancelled_handed_off_instance_does_not_lose_the_next_one() {
    // The item runs (blocked); a second instance is queued and handed to the running
    // worker, cancelled there, and a third is queued and handed off over it. Every
    // instance must run or be reported cancelled, and flush must return.
    let wq = Workqueue::builder("t-handoff-stale").build().unwrap();
    let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let runs = counter();
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let work = {
        let (gate, runs) = (gate.clone(), runs.clone());
        let started_tx = Mutex::new(started_tx);
        Work::new(move || {
            if runs.fetch_add(1, SeqCst) == 0 {
                started_tx.lock().unwrap().send(()).unwrap();
                // Out of the running count, so another worker takes the next instance.
                podq::blocking(|| {
                    let (open, cv) = &*gate;
                    let mut open = open.lock().unwrap();
                    while !*open {
                        open = cv.wait(open).unwrap();
                    }
                });
            }
        })
    };
    assert!(wq.queue(&work));
    started_rx.recv().unwrap();
    assert!(
        wq.queue(&work),
        "queueing while running makes a new instance"
    );
    // Time for a worker to take it and hand it off (only widens the window).
    std::thread::sleep(Duration::from_millis(100));
    assert!(work.cancel(), "the handed-off instance was pending");
    assert!(wq.queue(&work));
    std::thread::sleep(Duration::from_millis(100));
    {
        let (open, cv) = &*gate;
        *open.lock().unwrap() = true;
        cv.notify_all();
    }
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    {
        let (wq, work) = (wq.clone(), work.clone());
        std::thread::spawn(move || {
            wq.flush();
            work.flush();
            done_tx.send(()).unwrap();
        });
    }
    done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("flush hung: an instance was lost in the handoff");
    assert_eq!(runs.load(SeqCst), 2, "the first and the third instance ran");
    if cfg!(feature = "stats") {
        let totals = wq.stats().totals;
        assert_eq!(totals.queued, 3);
        assert_eq!(totals.started, 2);
        assert_eq!(totals.cancelled, 1);
    }
}

#[test]
fn drain_refuses_delayed_items_from_outside() {
    let wq = Workqueue::builder("t-drain-delayed").build().unwrap();
    let gate = Arc::new(Barrier::new(2));
    let g = gate.clone();
    wq.spawn(move || {
        g.wait();
    });
    let runs = counter();
    let dwork = counting_delayed(&runs);
    let outsider = {
        let (wq, dwork) = (wq.clone(), dwork.clone());
        std::thread::spawn(move || {
            while !matches!(wq.try_queue(&Work::new(|| {})), Err(Error::Draining { .. })) {
                std::thread::yield_now();
            }
            let plain = wq.queue_delayed(&dwork, Duration::ZERO);
            let tried = wq.try_queue_delayed(&dwork, Duration::from_millis(1));
            let on = wq.try_queue_delayed_on(0, &dwork, Duration::ZERO);
            let modified = wq.try_mod_delayed(&dwork, Duration::ZERO);
            gate.wait();
            (plain, tried, on, modified)
        })
    };
    wq.drain();
    let (plain, tried, on, modified) = outsider.join().unwrap();
    assert!(!plain, "queue_delayed is refused while draining");
    assert!(matches!(tried, Err(Error::Draining { .. })), "{tried:?}");
    assert!(matches!(on, Err(Error::Draining { .. })), "{on:?}");
    assert!(
        matches!(modified, Err(Error::Draining { .. })),
        "{modified:?}"
    );
    assert!(!dwork.is_pending(), "a refused call leaves it idle");
    assert_eq!(runs.load(SeqCst), 0);
    // After the drain it is accepted again.
    assert!(wq.try_queue_delayed(&dwork, Duration::ZERO).unwrap());
    dwork.flush();
    assert_eq!(runs.load(SeqCst), 1);
}

#[test]
fn a_refused_try_spawn_gives_the_closure_back() {
    let wq = Workqueue::builder("t-spawn-back").build().unwrap();
    let gate = Arc::new(Barrier::new(2));
    let g = gate.clone();
    wq.spawn(move || {
        g.wait();
    });
    let outsider = {
        let wq = wq.clone();
        std::thread::spawn(move || loop {
            match wq.try_spawn(|| 7) {
                Ok(handle) => {
                    assert_eq!(handle.join().unwrap(), 7);
                }
                Err(refused) => {
                    assert!(matches!(refused.error(), Error::Draining { .. }));
                    assert!(refused.to_string().contains("draining"), "{refused}");
                    let f = refused.into_inner();
                    gate.wait();
                    return f();
                }
            }
        })
    };
    wq.drain();
    assert_eq!(outsider.join().unwrap(), 7, "the closure came back unrun");
}

#[test]
fn a_workqueue_panic_hook_replaces_the_process_wide_one() {
    let seen = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let s = seen.clone();
    let wq = Workqueue::builder("t-own-panic-hook")
        .panic_hook(move |r| {
            s.lock()
                .unwrap()
                .push((r.workqueue.to_owned(), r.message.to_owned()));
        })
        .build()
        .unwrap();
    let other = Workqueue::builder("t-no-panic-hook").build().unwrap();
    assert!(wq.spawn(|| panic!("boom")).join().is_err());
    assert!(other.spawn(|| panic!("elsewhere")).join().is_err());
    wq.flush();
    other.flush();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![("t-own-panic-hook".to_owned(), "boom".to_owned())]
    );
}

#[test]
fn an_ordered_workqueue_refuses_a_max_active_above_one() {
    let refused = Workqueue::builder("t-ordered-max-active")
        .ordered(true)
        .max_active(4)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            refused,
            podq::Error::Ordered {
                what: "max_active",
                ..
            }
        ),
        "{refused:?}"
    );
    assert_eq!(
        refused.to_string(),
        "workqueue `t-ordered-max-active` is ordered: max_active cannot change"
    );
    let one = Workqueue::builder("t-ordered-max-active-1")
        .ordered(true)
        .max_active(1)
        .build()
        .unwrap();
    assert_eq!(one.attrs().max_active, 1);
}

#[test]
fn executed_items_each_run_once_and_their_panics_reach_the_hook() {
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let s = seen.clone();
    let wq = Workqueue::builder("t-execute")
        .panic_hook(move |r| s.lock().unwrap().push(r.message.to_owned()))
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..5000 {
        let runs = runs.clone();
        wq.execute(move || {
            runs.fetch_add(1, SeqCst);
        });
    }
    wq.execute(|| panic!("detached boom"));
    wq.flush();
    assert_eq!(runs.load(SeqCst), 5000);
    assert_eq!(*seen.lock().unwrap(), vec!["detached boom".to_owned()]);
}

#[test]
fn a_refused_try_execute_gives_the_closure_back() {
    let wq = Workqueue::builder("t-execute-back").build().unwrap();
    wq.shutdown(Duration::from_secs(10)).unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let refused = wq
        .try_execute(move || {
            r.fetch_add(1, SeqCst);
        })
        .unwrap_err();
    assert!(matches!(refused.error(), Error::Draining { .. }));
    assert_eq!(ran.load(SeqCst), 0, "refused, not run");
    (refused.into_inner())();
    assert_eq!(ran.load(SeqCst), 1, "the closure came back whole");
}

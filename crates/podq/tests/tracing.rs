//! The `tracing` feature: the kernel's workqueue tracepoints as `tracing` events, seen
//! by a subscriber that collects them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex, OnceLock};

use podq::{Scope, Topology, Work, Workqueue};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

mod common;

/// One event: its name, target and fields (as text).
#[derive(Clone, Debug)]
struct Seen {
    name: &'static str,
    target: &'static str,
    fields: BTreeMap<&'static str, String>,
}

/// Collects every event of every thread (L: the list is behind its mutex).
#[derive(Default)]
struct Collector {
    events: Mutex<Vec<Seen>>,
}

/// The collector as the global subscriber.
struct Handle(Arc<Collector>);

struct Fields<'a>(&'a mut BTreeMap<&'static str, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }
}

impl Subscriber for Handle {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        reenter(event.metadata().name(), &fields);
        self.0.events.lock().unwrap().push(Seen {
            name: event.metadata().name(),
            target: event.metadata().target(),
            fields,
        });
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn collector() -> &'static Arc<Collector> {
    static COLLECTOR: OnceLock<Arc<Collector>> = OnceLock::new();
    COLLECTOR.get_or_init(|| {
        let c = Arc::new(Collector::default());
        tracing::subscriber::set_global_default(Handle(Arc::clone(&c))).unwrap();
        c
    })
}

/// The events of workqueue `wq`'s items, and the end events of items in `works`.
fn events_of(wq: &str, works: &[String]) -> Vec<Seen> {
    collector()
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| {
            e.fields.get("workqueue").is_some_and(|w| w == wq)
                || (e.name == "workqueue_execute_end"
                    && works.contains(e.fields.get("work").unwrap()))
        })
        .cloned()
        .collect()
}

#[test]
fn every_item_passes_queue_activate_start_end() {
    collector();
    let wq = Workqueue::builder("traced")
        .topology(Topology::synthetic("1s2c1t").unwrap())
        .scope(Scope::Cpu)
        .max_active(1)
        .build()
        .unwrap();
    // The blocker holds the one slot, so the labelled item waits for activation.
    let (release, gate) = mpsc::channel::<()>();
    let (started_tx, started) = mpsc::channel::<()>();
    let gate = Mutex::new(gate);
    let blocker = wq.spawn_named("blocker", move || {
        started_tx.send(()).unwrap();
        gate.lock().unwrap().recv().unwrap();
    });
    started.recv().unwrap();
    let work = Work::named("rpc_release", || {});
    assert!(wq.queue_on(1, &work));
    release.send(()).unwrap();
    blocker.join().unwrap();
    wq.flush();

    let all: Vec<Seen> = collector().events.lock().unwrap().clone();
    let ids: Vec<String> = all
        .iter()
        .filter(|e| e.name == "workqueue_queue_work" && e.fields["workqueue"] == "traced")
        .map(|e| e.fields["work"].clone())
        .collect();
    assert_eq!(ids.len(), 2, "{all:#?}");
    let events = events_of("traced", &ids);
    for (id, label) in ids.iter().zip(["blocker", "rpc_release"]) {
        let mine: Vec<&Seen> = events.iter().filter(|e| &e.fields["work"] == id).collect();
        let names: Vec<&str> = mine.iter().map(|e| e.name).collect();
        assert_eq!(
            names,
            [
                "workqueue_queue_work",
                "workqueue_activate_work",
                "workqueue_execute_start",
                "workqueue_execute_end"
            ],
            "{label}: {mine:#?}"
        );
        for e in &mine {
            assert_eq!(e.target, "podq::workqueue");
            assert_eq!(e.fields["label"], label, "{e:?}");
        }
        let start = mine[2];
        assert_eq!(start.fields["pool"], mine[0].fields["pool"]);
    }
    let queued = |id: &String| {
        events
            .iter()
            .find(|e| &e.fields["work"] == id && e.name == "workqueue_queue_work")
            .unwrap()
    };
    // Spawned without a CPU: none requested. The Work asked for CPU 1, whose pod (the
    // `cpu` scope) is CPU 1 alone: it is queued on the pool of CPU 1.
    assert!(!queued(&ids[0]).fields.contains_key("req_cpu"));
    let second = queued(&ids[1]);
    assert_eq!(second.fields["req_cpu"], "1");
    let start = events
        .iter()
        .find(|e| e.fields["work"] == ids[1] && e.name == "workqueue_execute_start")
        .unwrap();
    // Non-strict: the worker's CPU is any of the topology's (CPUs 0 and 1).
    assert!(
        ["0", "1"].contains(&start.fields["cpu"].as_str()),
        "{start:?}"
    );
    let cpu1_pool = wq
        .dump()
        .cpu_pools
        .iter()
        .find(|c| c.cpu == 1)
        .unwrap()
        .pool;
    assert_eq!(second.fields["pool"], cpu1_pool.to_string());
    // The labelled item waited for the blocker's slot: it was activated only after the
    // blocker started.
    let pos = |id: &String, name: &str| {
        events
            .iter()
            .position(|e| &e.fields["work"] == id && e.name == name)
            .unwrap()
    };
    assert!(pos(&ids[1], "workqueue_activate_work") > pos(&ids[0], "workqueue_execute_start"));
    // A Work's identity is the same for each of its runs.
    assert!(wq.queue(&work));
    wq.flush();
    let again = events_of("traced", &ids);
    assert_eq!(
        again
            .iter()
            .filter(|e| e.fields["work"] == ids[1] && e.name == "workqueue_execute_end")
            .count(),
        2
    );
}

/// The workqueue whose `outer` item's events queue an `inner` item from inside the
/// event, and the inner items' runs.
static REENTERED: OnceLock<Workqueue> = OnceLock::new();
static INNER_RUNS: AtomicUsize = AtomicUsize::new(0);

/// The subscriber's part in `a_subscriber_may_queue_work_from_inside_an_event`.
fn reenter(name: &str, fields: &BTreeMap<&'static str, String>) {
    let outer = fields.get("workqueue").is_some_and(|w| w == "reentered")
        && fields.get("label").is_some_and(|l| l == "outer");
    let boom = fields.get("workqueue").is_some_and(|w| w == "panicky")
        && fields.get("label").is_some_and(|l| l == "boom");
    if boom {
        panic!("subscriber boom in {name}");
    }
    if outer && (name == "workqueue_queue_work" || name == "workqueue_activate_work") {
        // The activation event runs under the pwq's and the worklist's locks.
        REENTERED.get().unwrap().execute(|| {
            INNER_RUNS.fetch_add(1, SeqCst);
        });
    }
}

#[test]
fn a_subscriber_may_queue_work_from_inside_an_event() {
    collector();
    // In a thread of its own, so that a hang (the queue call waiting for a lock its
    // own thread holds) fails the test instead of stopping it.
    let (done_tx, done) = mpsc::channel();
    std::thread::spawn(move || {
        reentered_run();
        done_tx.send(()).unwrap();
    });
    done.recv_timeout(std::time::Duration::from_secs(60))
        .expect("a queue call from inside an event hung");
    // One inner item from the queue event, one from the activation event: each ran
    // once, after the call that emitted its event had left its locks.
    assert_eq!(INNER_RUNS.load(SeqCst), 2);
    let events = events_of("reentered", &[]);
    let activated = events
        .iter()
        .filter(|e| {
            e.name == "workqueue_activate_work"
                && e.fields.get("label").is_some_and(|l| l == "outer")
        })
        .count();
    assert_eq!(activated, 1, "{events:#?}");
}

/// The blocker holds the one slot, so `outer` waits and is activated when the blocker's
/// completion frees it: its activation event runs under the pwq's and the worklist's
/// locks.
fn reentered_run() {
    let wq = REENTERED.get_or_init(|| {
        Workqueue::builder("reentered")
            .topology(Topology::synthetic("1s2c1t").unwrap())
            .scope(Scope::Cpu)
            .max_active(1)
            .build()
            .unwrap()
    });
    let (release, blocker) = common::blocker(wq);
    let outer = wq.spawn_named("outer", || {});
    release.send(()).unwrap();
    blocker.join().unwrap();
    outer.join().unwrap();
    // The activation event's item is queued when that activation pass ends, which may
    // be just after `outer` ran: flush until both inner items ran (bounded by the
    // caller's timeout).
    while INNER_RUNS.load(SeqCst) < 2 {
        wq.flush();
        std::thread::yield_now();
    }
    wq.flush();
}

/// A subscriber that panics in every event of an item that names its workqueue (the
/// queue and activation events run under podq's locks, the start event on the worker
/// before the item): the item is activated and runs all the same, and each panic goes
/// to the workqueue's panic hook.
#[test]
fn a_subscriber_panic_inside_an_event_is_reported_and_loses_nothing() {
    collector();
    let (hooked_tx, hooked) = mpsc::channel::<String>();
    let hooked_tx = Mutex::new(hooked_tx);
    let wq = Workqueue::builder("panicky")
        .topology(Topology::synthetic("1s2c1t").unwrap())
        .scope(Scope::Cpu)
        .max_active(1)
        .panic_hook(move |report| {
            hooked_tx
                .lock()
                .unwrap()
                .send(report.message.to_owned())
                .unwrap();
        })
        .build()
        .unwrap();
    let (release, blocker) = common::blocker(&wq);
    let (ran_tx, ran) = mpsc::channel::<()>();
    let ran_tx = Mutex::new(ran_tx);
    let _boom = wq.spawn_named("boom", move || ran_tx.lock().unwrap().send(()).unwrap());
    release.send(()).unwrap();
    blocker.join().unwrap();
    // Bounded, so that an item lost to the unwinding fails the test.
    ran.recv_timeout(std::time::Duration::from_secs(60))
        .expect("the item whose activation event panicked runs");
    wq.flush();
    // Three events name the workqueue (`workqueue_execute_end` names only the item).
    let mut messages: Vec<String> = (0..3)
        .map(|_| {
            hooked
                .recv_timeout(std::time::Duration::from_secs(60))
                .expect("each of the subscriber's panics reaches the panic hook")
        })
        .collect();
    messages.sort();
    let events = [
        "workqueue_activate_work",
        "workqueue_execute_start",
        "workqueue_queue_work",
    ];
    let expected: Vec<String> = events
        .iter()
        .map(|e| format!("subscriber boom in {e}"))
        .collect();
    assert_eq!(messages, expected);
}

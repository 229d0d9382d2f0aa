//! Pods, pools and workers on fake topologies mapped onto the real CPUs: pool per pod,
//! sharing between workqueues, strict pinning, queue_on/queue_node, locality, nice,
//! reaping and the stats snapshot.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use podq::testing::fake_topology;
use podq::{CpuSet, Scope, Work, Workqueue};

mod common;
use common::my_affinity;

/// The real CPU a virtual CPU of a 16-CPU fake topology maps onto.
fn real_of(v: usize, reals: &[usize], identity: bool) -> usize {
    if identity {
        v
    } else {
        reals[v % reals.len()]
    }
}

/// Queues one item per CPU from that CPU; returns what each item saw:
/// (queued-from cpu, worker's current_cpu(), worker's affinity).
fn run_from_every_cpu(wq: &Workqueue, cpus: &CpuSet) -> Vec<(usize, usize, CpuSet)> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    for cpu in cpus.iter() {
        podq::set_thread_cpu(Some(cpu));
        let s = seen.clone();
        wq.spawn(move || {
            s.lock()
                .unwrap()
                .push((cpu, podq::current_cpu(), my_affinity()));
        });
    }
    podq::set_thread_cpu(None);
    wq.flush();
    let out = seen.lock().unwrap().clone();
    out
}

#[test]
fn strict_cpu_scope_pins_each_pod_to_its_real_cpu() {
    let topo = fake_topology(2, 2, 2, 2);
    let reals: Vec<usize> = my_affinity().iter().collect();
    let identity = topo.usable().is_subset(&my_affinity());
    let wq = Workqueue::builder("p-strict-cpu")
        .topology(topo.clone())
        .scope(Scope::Cpu)
        .strict(true)
        .build()
        .unwrap();
    for (queued, ran, affinity) in run_from_every_cpu(&wq, topo.usable()) {
        assert_eq!(ran, queued, "a cpu-scope item runs on its own pod's CPU");
        assert_eq!(affinity, CpuSet::single(real_of(queued, &reals, identity)));
    }
    let stats = wq.stats();
    assert_eq!(stats.pools.len(), 17, "one pool per CPU plus the dfl pool");
    if cfg!(feature = "stats") {
        let total: u64 = stats.pools.iter().map(|p| p.locality.same_cpu).sum();
        assert_eq!(total, 16, "every item ran on the CPU it was queued from");
    }
    assert!(stats.pools.iter().all(|p| p.strict));
}

#[test]
fn numa_pods_keep_items_on_their_node() {
    let topo = fake_topology(2, 2, 2, 2);
    let wq = Workqueue::builder("p-numa")
        .topology(topo.clone())
        .scope(Scope::Numa)
        .strict(true)
        .build()
        .unwrap();
    for (queued, ran, _) in run_from_every_cpu(&wq, topo.usable()) {
        assert_eq!(
            topo.node_of(ran),
            topo.node_of(queued),
            "{queued} ran on {ran}"
        );
    }
    let pods: BTreeSet<String> = wq
        .stats()
        .pools
        .iter()
        .map(|p| p.pod_cpus.clone())
        .collect();
    assert!(pods.contains("0-7") && pods.contains("8-15"), "{pods:?}");
}

#[test]
fn non_strict_workers_may_run_anywhere_in_the_cpumask() {
    let topo = fake_topology(1, 2, 2, 1);
    let mask: CpuSet = [0, 1, 2].into_iter().collect();
    let reals: Vec<usize> = my_affinity().iter().collect();
    let identity = topo.usable().is_subset(&my_affinity());
    let wq = Workqueue::builder("p-nonstrict")
        .topology(topo.clone())
        .scope(Scope::Cpu)
        .cpumask(mask.clone())
        .build()
        .unwrap();
    let allowed: CpuSet = mask.iter().map(|v| real_of(v, &reals, identity)).collect();
    for (_, ran, affinity) in run_from_every_cpu(&wq, &mask) {
        assert!(mask.contains(ran), "ran on {ran}, outside the mask");
        assert_eq!(affinity, allowed);
    }
    // CPU 3 is outside the mask: queueing from it picks a CPU of the mask round-robin.
    podq::set_thread_cpu(Some(3));
    let ran = wq.spawn(podq::current_cpu).join().unwrap();
    podq::set_thread_cpu(None);
    assert!(mask.contains(ran));
}

#[test]
fn equal_attributes_share_pools() {
    let topo = fake_topology(1, 2, 2, 2);
    let build = |name: &str, strict: bool| {
        Workqueue::builder(name)
            .topology(topo.clone())
            .scope(Scope::Cache)
            .strict(strict)
            .build()
            .unwrap()
    };
    let (a, b, c) = (
        build("p-share-a", true),
        build("p-share-b", true),
        build("p-share-c", false),
    );
    let ids = |wq: &Workqueue| -> BTreeSet<u64> { wq.stats().pools.iter().map(|p| p.id).collect() };
    assert_eq!(
        ids(&a),
        ids(&b),
        "strict pools are shared by pod mask and nice"
    );
    assert!(
        ids(&a).is_disjoint(&ids(&c)),
        "strictness is part of the key"
    );
    let d = Workqueue::builder("p-share-d")
        .topology(topo.clone())
        .scope(Scope::Cache)
        .strict(true)
        .nice(5)
        .build()
        .unwrap();
    assert!(ids(&a).is_disjoint(&ids(&d)), "nice is part of the key");
}

#[test]
fn queue_on_and_queue_node_pick_the_pod() {
    let topo = fake_topology(2, 1, 2, 1);
    let wq = Workqueue::builder("p-queue-on")
        .topology(topo.clone())
        .scope(Scope::Cpu)
        .strict(true)
        .build()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let work = Work::new(move || s.lock().unwrap().push(podq::current_cpu()));
    for cpu in 0..4 {
        assert!(wq.queue_on(cpu, &work));
        work.flush();
    }
    assert_eq!(*seen.lock().unwrap(), vec![0, 1, 2, 3]);
    seen.lock().unwrap().clear();
    podq::set_thread_cpu(Some(0));
    assert!(wq.queue_node(1, &work));
    work.flush();
    assert!(wq.queue_node(0, &work));
    work.flush();
    podq::set_thread_cpu(None);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![2, 0],
        "first CPU of node 1; the local CPU on node 0"
    );
}

#[test]
fn spawn_node_and_execute_node_pick_a_cpu_of_the_node() {
    // 2 nodes of 2 one-CPU pods: node 0 has CPUs 0-1, node 1 CPUs 2-3.
    let topo = fake_topology(2, 1, 2, 1);
    let wq = Workqueue::builder("p-spawn-node")
        .topology(topo)
        .scope(Scope::Cpu)
        .strict(true)
        .build()
        .unwrap();
    let execute_node = |node| {
        let (tx, rx) = std::sync::mpsc::channel();
        wq.execute_node(node, move || tx.send(podq::current_cpu()).unwrap());
        rx.recv().unwrap()
    };
    // From CPU 1: the node's first CPU for the other node, the caller's own on its node.
    podq::set_thread_cpu(Some(1));
    assert_eq!(wq.spawn_node(1, podq::current_cpu).join().unwrap(), 2);
    assert_eq!(execute_node(1), 2);
    assert_eq!(wq.spawn_node(0, podq::current_cpu).join().unwrap(), 1);
    assert_eq!(execute_node(0), 1);
    // From CPU 3, node 1's other CPU.
    podq::set_thread_cpu(Some(3));
    assert_eq!(wq.spawn_node(1, podq::current_cpu).join().unwrap(), 3);
    assert_eq!(execute_node(0), 0);
    // A node the topology does not have acts as `spawn`: the caller's pod.
    assert_eq!(wq.spawn_node(7, podq::current_cpu).join().unwrap(), 3);
    assert_eq!(execute_node(usize::MAX), 3);
    podq::set_thread_cpu(None);
    refused_while_draining(
        &wq,
        |f| wq.spawn_node(0, f),
        |f| wq.try_execute_node(1, f).is_ok(),
        |f| wq.try_spawn_node(1, f),
    );
}

/// While `wq` drains behind an item that `spawn_blocker` queued, a placement's
/// `try_execute` and `try_spawn` are refused, the closure given back.
fn refused_while_draining(
    wq: &Workqueue,
    spawn_blocker: impl FnOnce(Box<dyn FnOnce() + Send>) -> podq::JoinHandle<()>,
    try_execute: impl Fn(fn()) -> bool,
    try_spawn: impl FnOnce(fn() -> u32) -> Result<podq::JoinHandle<u32>, podq::SpawnError<fn() -> u32>>,
) {
    let gate = Arc::new(Mutex::new(()));
    let held = gate.lock().unwrap();
    let g = Arc::clone(&gate);
    let blocker = spawn_blocker(Box::new(move || drop(g.lock().unwrap())));
    std::thread::scope(|s| {
        let draining = s.spawn(|| wq.drain());
        while try_execute(|| {}) {
            std::thread::yield_now();
        }
        let refused = try_spawn(|| 7).unwrap_err();
        assert!(
            refused.error().to_string().contains("draining"),
            "{}",
            refused.error()
        );
        assert_eq!((refused.into_parts().1)(), 7);
        drop(held);
        draining.join().unwrap();
    });
    blocker.join().unwrap();
}

#[test]
fn spawn_on_and_execute_on_pick_the_pod() {
    let topo = fake_topology(2, 1, 2, 1);
    let wq = Workqueue::builder("p-spawn-on")
        .topology(topo)
        .scope(Scope::Cpu)
        .strict(true)
        .build()
        .unwrap();
    for cpu in 0..4 {
        // From a thread that says it is on another CPU of the fake machine.
        podq::set_thread_cpu(Some((cpu + 1) % 4));
        assert_eq!(wq.spawn_on(cpu, podq::current_cpu).join().unwrap(), cpu);
        let (tx, rx) = std::sync::mpsc::channel();
        wq.execute_on(cpu, move || tx.send(podq::current_cpu()).unwrap());
        assert_eq!(rx.recv().unwrap(), cpu);
    }
    // A CPU the topology does not have acts as `spawn`: the caller's pod.
    podq::set_thread_cpu(Some(2));
    assert_eq!(wq.spawn_on(1000, podq::current_cpu).join().unwrap(), 2);
    podq::set_thread_cpu(None);
    refused_while_draining(
        &wq,
        |f| wq.spawn_on(0, f),
        |f| wq.try_execute_on(1, f).is_ok(),
        |f| wq.try_spawn_on(1, f),
    );
}

#[test]
fn positive_nice_is_applied_to_workers() {
    let wq = Workqueue::builder("p-nice").nice(7).build().unwrap();
    let nice = wq
        .spawn(|| {
            // SAFETY: getpriority on the calling thread has no preconditions.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
        })
        .join()
        .unwrap();
    assert_eq!(nice, 7);
}

#[test]
fn blocking_items_get_more_workers_and_idle_ones_are_reaped() {
    // One pod of 1 CPU: without the hint only one item would run at a time.
    let topo = fake_topology(1, 1, 1, 1);
    let wq = Workqueue::builder("p-blocking")
        .topology(topo)
        .idle_timeout(Duration::from_millis(20))
        .build()
        .unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let (inside, release) = (inside.clone(), release.clone());
            wq.spawn(move || {
                podq::blocking(|| {
                    inside.fetch_add(1, SeqCst);
                    while release.load(SeqCst) == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                })
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while inside.load(SeqCst) < 6 {
        assert!(
            Instant::now() < deadline,
            "blocking items did not all start"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    release.store(1, SeqCst);
    for h in handles {
        h.join().unwrap();
    }
    let pool = |wq: &Workqueue| {
        wq.stats()
            .pools
            .into_iter()
            .max_by_key(|p| p.workers_created)
            .unwrap()
    };
    if cfg!(feature = "stats") {
        assert!(pool(&wq).workers_created >= 6);
    }
    // Surplus idle workers exit after the idle timeout (the kernel keeps two idle).
    while pool(&wq).workers > 2 {
        assert!(Instant::now() < deadline, "idle workers were not reaped");
        std::thread::sleep(Duration::from_millis(5));
    }
    if cfg!(feature = "stats") {
        assert!(pool(&wq).workers_reaped >= 4);
    }
    assert_eq!(wq.spawn(|| 5).join().unwrap(), 5, "the pool still works");
}

#[test]
fn attribute_changes_move_new_items_and_flush_covers_old_pools() {
    let topo = fake_topology(2, 2, 2, 1);
    let wq = Workqueue::builder("p-swap")
        .topology(topo.clone())
        .scope(Scope::Cpu)
        .strict(true)
        .build()
        .unwrap();
    let gate = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    // Park items on the old pools.
    for cpu in 0..8 {
        podq::set_thread_cpu(Some(cpu));
        let (g, d) = (gate.clone(), done.clone());
        wq.spawn(move || {
            podq::blocking(|| {
                while g.load(SeqCst) == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            d.fetch_add(1, SeqCst);
        });
    }
    podq::set_thread_cpu(None);
    let old: BTreeSet<u64> = wq.stats().pools.iter().map(|p| p.id).collect();
    wq.set_scope(Scope::System).unwrap();
    assert_eq!(wq.effective_scope(), Scope::System);
    // New items go to the new pool at once, while the old ones are still busy.
    assert_eq!(wq.spawn(|| 1).join().unwrap(), 1);
    let during: BTreeSet<u64> = wq.stats().pools.iter().map(|p| p.id).collect();
    assert!(
        during.is_superset(&old),
        "retiring pools are still listed while busy"
    );
    let flusher = {
        let wq = wq.clone();
        std::thread::spawn(move || wq.flush())
    };
    std::thread::sleep(Duration::from_millis(20));
    assert!(!flusher.is_finished(), "flush waits for the old pools");
    gate.store(1, SeqCst);
    flusher.join().unwrap();
    assert_eq!(done.load(SeqCst), 8);
    let after: BTreeSet<u64> = wq.stats().pools.iter().map(|p| p.id).collect();
    // The system pod is the old dfl pool (same mask, same strictness): shared, kept.
    assert_eq!(old.len(), 9);
    assert_eq!(
        after.len(),
        1,
        "per-CPU pools retired once empty: {after:?}"
    );
    assert!(old.is_superset(&after));
}

#[test]
fn stats_serialise_to_json() {
    let wq = Workqueue::builder("p-json").build().unwrap();
    wq.spawn(|| ()).join().unwrap();
    wq.flush();
    let json = serde_json::to_value(wq.stats()).unwrap();
    assert_eq!(json["name"], "p-json");
    let pool = &json["pools"][0];
    for key in [
        "queued",
        "started",
        "completed",
        "panicked",
        "cancelled",
        "repatriated",
        "workers_created",
        "workers_reaped",
        "workers",
        "idle",
        "max_active_waits",
        "enqueue_lock",
        "dequeue_lock",
        "locality",
        "queue_to_start_ns",
        "run_time_ns",
        "cpu_time_ns",
    ] {
        assert!(pool.get(key).is_some(), "missing {key} in {pool}");
    }
    assert!(podq::stats::all().iter().any(|s| s.name == "p-json"));
    if cfg!(feature = "stats") {
        assert!(json["totals"]["completed"].as_u64().unwrap() >= 1);
        assert_eq!(pool["queue_to_start_ns"]["count"], 1);
    }
}

#[test]
fn pin_thread_to_maps_virtual_cpus_onto_real_ones() {
    let topo = fake_topology(2, 2, 2, 2);
    let reals: Vec<usize> = my_affinity().iter().collect();
    let identity = topo.usable().is_subset(&my_affinity());
    let handle = std::thread::spawn(move || {
        podq::pin_thread_to(5, &topo).unwrap();
        assert_eq!(podq::current_cpu(), 5);
        let pinned = my_affinity();
        let err = podq::pin_thread_to(99, &topo).unwrap_err();
        (pinned, err.to_string())
    });
    let (pinned, err) = handle.join().unwrap();
    assert_eq!(pinned, CpuSet::single(real_of(5, &reals, identity)));
    assert!(err.contains("99"), "{err}");
}

#[test]
fn max_active_is_enforced_per_node() {
    // 2 nodes x 4 CPUs, max_active 2: min_active = 2, so each node's share is
    // clamp(ceil(2 * 4 / 8), 2, 2) = 2 (the shares may sum to more than max_active).
    let topo = fake_topology(2, 1, 4, 1);
    let wq = Workqueue::builder("p-node-max")
        .topology(topo)
        .scope(Scope::Numa)
        .max_active(2)
        .build()
        .unwrap();
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    podq::set_thread_cpu(Some(1));
    for _ in 0..40 {
        let (r, p) = (running.clone(), peak.clone());
        wq.spawn(move || {
            let now = r.fetch_add(1, SeqCst) + 1;
            p.fetch_max(now, SeqCst);
            podq::blocking(|| std::thread::sleep(Duration::from_micros(200)));
            r.fetch_sub(1, SeqCst);
        });
    }
    podq::set_thread_cpu(None);
    wq.flush();
    assert!(
        peak.load(SeqCst) <= 2,
        "node 0 ran {} at once",
        peak.load(SeqCst)
    );
    // Raising max_active lets waiting items in at once.
    wq.set_max_active(16).unwrap();
    assert_eq!(wq.attrs().max_active, 16);
    assert_eq!(wq.spawn(|| 9).join().unwrap(), 9);
}

/// The kernel's per-node `max_active` rule, as documented on the builder: shares
/// rounded up with the `min(max_active, 8)` floor, so `max_active(3)` on 2 nodes lets
/// 6 items run at once, and never more.
#[test]
fn max_active_3_on_two_nodes_runs_up_to_6() {
    let wq = Workqueue::builder("pods-max-active")
        .topology(fake_topology(2, 1, 4, 1))
        .scope(Scope::Numa)
        .max_active(3)
        .build()
        .unwrap();
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let (running, peak) = (running.clone(), peak.clone());
            let work = move || {
                let now = running.fetch_add(1, SeqCst) + 1;
                peak.fetch_max(now, SeqCst);
                // Hold the slot until six run or a while passes (a bound, not a figure).
                let deadline = Instant::now() + Duration::from_secs(2);
                while peak.load(SeqCst) < 6 && Instant::now() < deadline {
                    podq::blocking(|| std::thread::sleep(Duration::from_millis(1)));
                }
                running.fetch_sub(1, SeqCst);
            };
            podq::set_thread_cpu(Some(if i % 2 == 0 { 0 } else { 4 }));
            let handle = wq.spawn(work);
            podq::set_thread_cpu(None);
            handle
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(peak.load(SeqCst), 6, "3 per node on 2 nodes");
}

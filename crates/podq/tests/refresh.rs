//! `podq::topology::refresh`: the usable CPUs change under the process and live
//! workqueues re-pod without losing work. The usable set is process-wide, so these
//! tests run one at a time in their own binary. The first two need two usable CPUs.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};

use podq::testing::{fake_topology, refresh_with};
use podq::{CpuSet, Error, Scope, Work, Workqueue};

mod common;
use common::{set_process_affinity, this_cpu};

static SERIAL: Mutex<()> = Mutex::new(());

/// The usable CPUs, or `None` (with a note) when fewer than two: nothing can go away.
fn two_cpus() -> Option<(CpuSet, usize, usize)> {
    let usable = podq::topology::live::affinity().unwrap();
    let mut it = usable.iter();
    match (it.next(), it.next()) {
        (Some(a), Some(b)) => Some((usable.clone(), a, b)),
        _ => {
            eprintln!("refresh tests need two usable CPUs; this machine has {usable}");
            None
        }
    }
}

/// Pods of the pools a workqueue uses now (flush first: retiring ones then leave).
fn pods(wq: &Workqueue) -> Vec<String> {
    wq.flush();
    let mut pods: Vec<String> = wq.stats().pools.into_iter().map(|p| p.pod_cpus).collect();
    pods.sort();
    pods
}

/// Runs one item queued as if from `from` and returns the real CPU it ran on.
fn ran_on(wq: &Workqueue, from: usize) -> usize {
    let cpu = Arc::new(AtomicUsize::new(usize::MAX));
    let c = cpu.clone();
    podq::set_thread_cpu(Some(from));
    let handle = wq.spawn(move || c.store(this_cpu(), SeqCst));
    podq::set_thread_cpu(None);
    handle.join().unwrap();
    cpu.load(SeqCst)
}

#[test]
fn refresh_repods_live_workqueues_and_loses_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some((all, a, b)) = two_cpus() else {
        return;
    };
    let strict = Workqueue::builder("refresh-strict")
        .scope(Scope::Cpu)
        .strict(true)
        .build()
        .unwrap();
    let only_b = Workqueue::builder("refresh-only-b")
        .cpumask(CpuSet::single(b))
        .build()
        .unwrap();
    let fake = Workqueue::builder("refresh-fake")
        .topology(fake_topology(1, 1, 4, 1))
        .scope(Scope::Cpu)
        .build()
        .unwrap();
    fake.spawn(|| {}).join().unwrap();
    let fake_pods = pods(&fake);
    assert_eq!(ran_on(&strict, b), b, "strict pod of CPU {b}");

    // Work in flight on CPU b's pool: one running item holding 200 queued ones back.
    let gate = Arc::new(Barrier::new(2));
    let runs = Arc::new(AtomicUsize::new(0));
    let blocker = {
        let g = gate.clone();
        Work::new(move || {
            g.wait();
        })
    };
    assert!(strict.queue_on(b, &blocker));
    let items: Vec<Work> = (0..200)
        .map(|_| {
            let r = runs.clone();
            Work::new(move || {
                r.fetch_add(1, SeqCst);
            })
        })
        .collect();
    for w in &items {
        assert!(strict.queue_on(b, w));
    }

    // CPU b goes away.
    assert_eq!(
        refresh_with(CpuSet::single(a)).unwrap().usable,
        CpuSet::single(a)
    );
    assert_eq!(
        ran_on(&strict, b),
        a,
        "items from CPU {b} now run in CPU {a}'s pod"
    );
    assert_eq!(
        ran_on(&only_b, b),
        a,
        "a cpumask with no usable CPU falls back to the usable ones"
    );
    assert_eq!(
        only_b.attrs().cpumask,
        CpuSet::single(b),
        "the request is kept"
    );
    gate.wait();
    strict.flush();
    assert_eq!(
        runs.load(SeqCst),
        200,
        "items queued before the refresh all ran"
    );
    assert_eq!(pods(&strict), vec![a.to_string()]);
    assert_eq!(pods(&only_b), vec![a.to_string()]);
    assert_eq!(pods(&fake), fake_pods, "fake topologies are not affected");

    // CPU b comes back.
    assert_eq!(refresh_with(all.clone()).unwrap().usable, all);
    assert_eq!(ran_on(&strict, b), b);
    assert_eq!(ran_on(&only_b, a), b, "the requested cpumask applies again");
    assert_eq!(pods(&only_b), vec![b.to_string()]);

    assert!(matches!(
        refresh_with(CpuSet::new()),
        Err(Error::EmptyCpumask)
    ));
    eprintln!("refresh: re-podded around CPU {b} going away and coming back");
}

#[test]
fn refresh_reads_the_narrowed_affinity() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some((all, a, _)) = two_cpus() else {
        return;
    };
    let wq = Workqueue::builder("refresh-live")
        .scope(Scope::Cpu)
        .strict(true)
        .build()
        .unwrap();
    for cpu in all.iter() {
        ran_on(&wq, cpu);
    }
    let before = pods(&wq);
    for cpu in all.iter() {
        assert!(
            before.contains(&cpu.to_string()),
            "a pod per CPU: {before:?}"
        );
    }
    set_process_affinity(&CpuSet::single(a));
    let narrowed = podq::topology::refresh();
    set_process_affinity(&all);
    assert_eq!(narrowed.unwrap().usable, CpuSet::single(a));
    for cpu in all.iter() {
        assert_eq!(ran_on(&wq, cpu), a);
    }
    assert_eq!(pods(&wq), vec![a.to_string()]);
    let restored = podq::topology::refresh().unwrap().usable;
    assert_eq!(restored, all.intersection(&restored), "within the affinity");
    assert!(restored.contains(a));
    for cpu in restored.iter() {
        assert_eq!(ran_on(&wq, cpu), cpu);
    }
}

#[test]
fn workers_whose_affinity_cannot_be_set_still_run_their_items() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let all = podq::topology::live::affinity().unwrap();
    // Pretend the OS reported a CPU that is not there: `sched_setaffinity` to it fails
    // with EINVAL, as it does for a CPU taken away by a shrinking cpuset.
    let ghost = 1000;
    let mut with_ghost = all.clone();
    with_ghost.insert(ghost);
    refresh_with(with_ghost).unwrap();
    let topo = fake_topology(1, 1, all.len() + 1, 1);
    let cpus = topo.usable().clone();
    let wq = Workqueue::builder("refresh-ghost")
        .topology(topo)
        .scope(Scope::Cpu)
        .strict(true)
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    for cpu in cpus.iter() {
        for _ in 0..10 {
            let r = runs.clone();
            podq::set_thread_cpu(Some(cpu));
            wq.spawn(move || {
                r.fetch_add(1, SeqCst);
            });
        }
    }
    podq::set_thread_cpu(None);
    wq.flush();
    refresh_with(all).unwrap();
    assert_eq!(runs.load(SeqCst), 10 * cpus.len(), "every item ran");
    // A refused pinning is visible only in the counters.
    if cfg!(feature = "stats") {
        let failures: u64 = wq.stats().pools.iter().map(|p| p.affinity_failures).sum();
        assert!(failures >= 1, "the refused pinning was counted");
    }
}

#[test]
fn refresh_repods_a_live_topology_passed_explicitly() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some((all, a, b)) = two_cpus() else {
        return;
    };
    let explicit = Workqueue::builder("refresh-explicit-live")
        .topology(podq::Topology::live().unwrap())
        .scope(Scope::Cpu)
        .strict(true)
        .build()
        .unwrap();
    assert_eq!(ran_on(&explicit, b), b);
    refresh_with(CpuSet::single(a)).unwrap();
    let moved = ran_on(&explicit, b);
    refresh_with(all).unwrap();
    assert_eq!(moved, a, "an explicit live topology follows the refresh");
    assert_eq!(ran_on(&explicit, b), b);
}

#[test]
fn refresh_names_the_workqueues_it_leaves_alone() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let usable = podq::topology::live::affinity().unwrap();
    let fake = Workqueue::builder("refresh-left-alone")
        .topology(fake_topology(2, 1, 1, 1))
        .build()
        .unwrap();
    let report = refresh_with(usable.clone()).unwrap();
    assert_eq!(report.usable, usable);
    let left = report
        .not_repodded
        .iter()
        .find(|n| n.workqueue == "refresh-left-alone")
        .expect("the fake-topology workqueue is reported");
    assert_eq!(
        left.reason,
        podq::topology::NotRepoddedReason::NotLiveMachine
    );
    assert!(
        report.to_string().contains("refresh-left-alone"),
        "{report}"
    );
    drop(fake);
}

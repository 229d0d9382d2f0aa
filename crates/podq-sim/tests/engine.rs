//! The engine's promises: nothing lost or run twice, strict pods hold, `max_active`
//! holds, the same seed gives the same run, bad runs are refused.

use podq_sim::{
    cost, simulate, CompletionSpec, QueueSpec, RemoteFree, RunLength, RunSpec, SimError, SimOutput,
    WorkerCap, Worklist, Workload,
};
use podq_topology::{Scope, Topology};

fn machine(name: &str) -> (Topology, podq_sim::CostParams) {
    let m = cost::machine(name).unwrap();
    (Topology::synthetic(m.shape).unwrap(), m.params)
}

fn completion(cpus: Vec<usize>) -> Workload {
    Workload::Completion(CompletionSpec {
        producer_cpus: cpus,
        depth: 4,
        io_bytes: podq_sim::DEFAULT_IO_BYTES,
        object_size: 256,
        alloc_cache: 16,
        remote_free: RemoteFree::Cpu,
        producer_ns: 2_000,
        high_priority: true,
        rpciod_ns: 16_000,
        nfsiod_ns: 4_000,
        toggle: Vec::new(),
        moves: Vec::new(),
    })
}

fn run(topo: &Topology, params: &podq_sim::CostParams, spec: &RunSpec) -> SimOutput {
    simulate(topo, params, spec).unwrap()
}

/// Everything a run reports, as text, for comparing runs.
fn digest(out: &SimOutput) -> String {
    let mut text = format!("{} {} {}\n", out.events, out.virtual_ns, out.peak_active);
    for s in &out.segments {
        text.push_str(&format!(
            "{} {} {:?} {:?} {:?} {:?} {:?} {:?}\n",
            s.items,
            s.seconds,
            s.counters,
            s.pool_locks,
            s.alloc,
            s.idle_per_cpu,
            s.hists
                .latency
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect::<Vec<_>>(),
            s.hists
                .queue
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect::<Vec<_>>(),
        ));
    }
    text
}

#[test]
fn every_item_runs_exactly_once() {
    let (topo, params) = machine("xeon-12c");
    for scope in [Scope::Cpu, Scope::Smt, Scope::Cache] {
        for strict in [false, true] {
            let spec = RunSpec {
                workload: Workload::Queue {
                    producer_cpus: (0..24).collect(),
                    item_ns: 100,
                },
                queue: QueueSpec::new("q", scope, strict),
                length: RunLength::Items(50),
                warmup: 0,
                seed: 3,
            };
            let out = run(&topo, &params, &spec);
            let s = &out.segments[0];
            // Each producer has one item in flight: the run stops at exactly 24 x 50.
            assert_eq!(s.items, 24 * 50, "{scope} {strict}");
            assert_eq!(s.counters.locality.iter().sum::<u64>(), 24 * 50);
            assert_eq!(s.hists.queue.len(), 24 * 50);
        }
    }
}

/// `queue` with every CPU of `machine` producing, on `scope`, with `worklist`.
fn queue_with(machine_name: &str, scope: Scope, worklist: Worklist) -> SimOutput {
    let (topo, params) = machine(machine_name);
    let spec = RunSpec {
        workload: Workload::Queue {
            producer_cpus: topo.usable().iter().collect(),
            item_ns: 100,
        },
        queue: QueueSpec {
            worklist,
            ..QueueSpec::new("q", scope, false)
        },
        length: RunLength::Duration(2_000_000),
        warmup: 500_000,
        seed: 1,
    };
    run(&topo, &params, &spec)
}

/// `throughput` on a machine of two CPUs (as this project's) with `params`, on `scope`,
/// with `worklist`: producers and workers share the CPUs, so items wait for a worker.
fn throughput_with(
    params: &podq_sim::CostParams,
    scope: Scope,
    worklist: Worklist,
    length: RunLength,
) -> SimOutput {
    let topo = Topology::synthetic("1s2c1t").unwrap();
    let spec = RunSpec {
        workload: Workload::Throughput {
            producer_cpus: vec![0, 1],
            depth: 64,
            item_ns: 0,
        },
        queue: QueueSpec {
            worklist,
            ..QueueSpec::new("q", scope, false)
        },
        length,
        warmup: 0,
        seed: 1,
    };
    run(&topo, params, &spec)
}

#[test]
fn runtime_workers_take_a_share_per_look_and_run_each_item_once() {
    // The kernel's worker looks at the worklist once per item; the runtime's takes its
    // share (`batch_take`) and runs it without looking again.
    let (_, params) = machine("xeon-12c");
    for scope in [Scope::Cpu, Scope::Cache] {
        let length = RunLength::Items(20_000);
        let locked = &throughput_with(&params, scope, Worklist::Locked, length).segments[0];
        let ring = &throughput_with(&params, scope, Worklist::Ring, length).segments[0];
        for s in [locked, ring] {
            assert_eq!(s.items, 2 * 20_000, "{scope}");
            assert_eq!(
                s.counters.locality.iter().sum::<u64>(),
                2 * 20_000,
                "{scope}"
            );
        }
        let looks = |s: &podq_sim::SegmentOutput| s.pool_locks.dequeue.acquisitions;
        assert!(looks(locked) >= locked.items, "{scope}: {}", looks(locked));
        assert!(
            looks(ring) * 4 < ring.items,
            "{scope}: {} looks for {} items",
            looks(ring),
            ring.items
        );
        assert!(ring.seconds < locked.seconds, "{scope}");
    }
}

#[test]
fn a_worker_pays_its_own_work_for_every_item_it_runs() {
    // `item_dispatch` is the worker's CPU time per item beyond the item itself (which is
    // 0 here): two CPUs cannot run 40 000 items in less than 40 000 x it / 2.
    let (_, mut params) = machine("xeon-12c");
    let spec = |params: &podq_sim::CostParams| {
        let out = throughput_with(
            params,
            Scope::Cpu,
            Worklist::Locked,
            RunLength::Items(20_000),
        );
        (out.segments[0].items, out.segments[0].seconds)
    };
    params.item_dispatch = 0.0;
    let free = spec(&params);
    params.item_dispatch = 2_000.0;
    let paid = spec(&params);
    assert_eq!((free.0, paid.0), (40_000, 40_000));
    let floor = 40_000.0 * 2_000e-9 / 2.0;
    assert!(paid.1 >= floor, "{} s < {floor} s", paid.1);
    assert!(free.1 * 2.0 < paid.1, "{} s against {} s", free.1, paid.1);
}

#[test]
fn a_one_cpu_pool_keeps_the_lock_under_the_ring_model() {
    // `cpu` pods have one CPU each: no ring, and with one item in flight per
    // producer a worker's share is that item, so the two models are the same run.
    let locked = queue_with("xeon-12c", Scope::Cpu, Worklist::Locked);
    let ring = queue_with("xeon-12c", Scope::Cpu, Worklist::Ring);
    assert_eq!(digest(&locked), digest(&ring));
}

#[test]
fn a_ring_splits_queuers_from_workers_in_a_shared_pool() {
    // 72 queuers and their workers on one `cache` pool: under the lock both sides
    // contend for one line; with the ring the queuers' claims no longer wait behind
    // the workers' takes, so fewer of them are contended and more items run.
    let locked = &queue_with("grace-72c", Scope::Cache, Worklist::Locked).segments[0];
    let ring = &queue_with("grace-72c", Scope::Cache, Worklist::Ring).segments[0];
    let share = |c: &podq_sim::LockCounts| c.contended as f64 / c.acquisitions.max(1) as f64;
    assert!(
        share(&ring.pool_locks.enqueue) < share(&locked.pool_locks.enqueue),
        "ring {:?}, locked {:?}",
        ring.pool_locks.enqueue,
        locked.pool_locks.enqueue
    );
    assert!(
        ring.items > locked.items,
        "ring {}, locked {}",
        ring.items,
        locked.items
    );
    // Each item is a claim on each side, counted as an acquisition of that side (a
    // producer's one item in flight may have been queued before the window).
    assert!(ring.pool_locks.enqueue.acquisitions + 72 >= ring.items);
    assert!(ring.pool_locks.dequeue.acquisitions + 72 >= ring.items);
}

#[test]
fn completion_runs_both_stages_of_every_io() {
    let (topo, params) = machine("xeon-2s24c");
    let spec = RunSpec {
        workload: completion((0..8).collect()),
        queue: QueueSpec::new("rpciod", Scope::Smt, false),
        length: RunLength::Items(20),
        warmup: 0,
        seed: 1,
    };
    let out = run(&topo, &params, &spec);
    let s = &out.segments[0];
    assert_eq!(s.items, 8 * 20);
    // rpciod and nfsiod items both counted; at most depth x producers more rpciod
    // items started than I/Os finished.
    let ran = s.counters.locality.iter().sum::<u64>();
    assert!((2 * 160..=2 * 160 + 2 * 32).contains(&ran), "{ran}");
    let a = s.alloc.counts;
    assert!(a.fast_allocs + a.slow_allocs >= 2 * 160);
}

/// Under podq's cap a worker preempted by a high-priority CQ still counts as running, so
/// its pod's next items wait for it; the kernel's pools (`WorkerCap::Unlimited`) start
/// another worker for them. Both run every I/O's two stages.
#[test]
fn without_the_cap_preempted_workers_get_company() {
    let (topo, params) = machine("xeon-2s24c");
    let workers = |cap: WorkerCap| {
        let mut queue = QueueSpec::new("rpciod", Scope::Smt, false);
        queue.worker_cap = cap;
        let spec = RunSpec {
            workload: completion((0..8).collect()),
            queue,
            length: RunLength::Items(50),
            warmup: 0,
            seed: 1,
        };
        let s = &run(&topo, &params, &spec).segments[0];
        assert_eq!(s.items, 8 * 50);
        s.counters.workers_created
    };
    let (capped, unlimited) = (workers(WorkerCap::PodCpus), workers(WorkerCap::Unlimited));
    assert!(
        unlimited > capped,
        "created {unlimited} without the cap, {capped} with it"
    );
}

/// One producer on CPU 0 of a 2-CPU machine keeping `depth` items of `item_ms` in
/// flight on `queue`, until it ran `items`, with the CPU-intensive rule on or off.
fn long_items(queue: QueueSpec, depth: usize, item_ms: u64, items: u64, on: bool) -> SimOutput {
    let topo = Topology::synthetic("1s2c1t").unwrap();
    let (_, params) = machine("xeon-12c");
    let spec = RunSpec {
        workload: Workload::Throughput {
            producer_cpus: vec![0],
            depth,
            item_ns: item_ms * 1_000_000,
        },
        queue: QueueSpec {
            cpu_intensive: on.then_some(podq_policy::CPU_INTENSIVE_THRESHOLD),
            ..queue
        },
        length: RunLength::Items(items),
        warmup: 0,
        seed: 1,
    };
    let out = run(&topo, &params, &spec);
    assert_eq!(out.segments[0].items, items);
    out
}

/// The runtime's CPU-intensive rule: a worker whose item has run 10 ms leaves its
/// one-CPU pod's running count, so the pool starts another worker for the items behind
/// it; being non-strict, that one runs on the idle CPU. No more than one worker per pod
/// CPU leaves the count, so the pool never has more than two.
#[test]
fn a_long_item_lets_another_worker_run_the_items_behind_it() {
    let run_with = |on| long_items(QueueSpec::new("q", Scope::Cpu, false), 6, 30, 12, on);
    let (off, on) = (run_with(false), run_with(true));
    let (off_c, on_c) = (&off.segments[0].counters, &on.segments[0].counters);
    assert_eq!((off_c.cpu_intensive, off_c.workers_created), (0, 1));
    assert!(on_c.cpu_intensive > 0, "{on_c:?}");
    assert_eq!(on_c.workers_created, 2, "{on_c:?}");
    // Twelve 30 ms items on one CPU take 360 ms; on two, not much over half that.
    assert!(off.virtual_ns >= 360_000_000, "{}", off.virtual_ns);
    assert!(on.virtual_ns < 250_000_000, "{}", on.virtual_ns);
}

/// With the runtime's worklist a worker claims a share of the waiting items; after an
/// item ran past the CPU-intensive threshold its worker's batch goes back to the
/// worklist and the pool's claims take one item each, so the items behind a long one
/// are not held in its worker's batch. Two CPUs: at most two more workers.
#[test]
fn after_a_long_item_claims_take_one_item_each() {
    let ring = QueueSpec {
        worklist: Worklist::Ring,
        ..QueueSpec::new("q", Scope::Cache, false)
    };
    let run_with = |on| {
        let out = long_items(ring.clone(), 16, 20, 48, on);
        let s = &out.segments[0];
        (s.pool_locks.dequeue.acquisitions, s.counters.clone())
    };
    let ((batched, off), (single, on)) = (run_with(false), run_with(true));
    assert!(batched <= 24, "{batched} claims for 48 items in batches");
    assert!(single >= 46, "{single} claims for 48 items one at a time");
    assert_eq!((off.cpu_intensive, off.workers_created), (0, 2));
    assert!(on.cpu_intensive > 0, "{on:?}");
    assert!(on.workers_created <= 4, "{on:?}");
    // A worker taken out of the count puts the rest of its batch back.
    assert_eq!(off.handed_back, 0);
    assert!(on.handed_back > 0, "{on:?}");
}

#[test]
fn strict_cpu_pods_run_every_item_where_it_was_queued() {
    let (topo, params) = machine("xeon-12c");
    let spec = RunSpec {
        workload: Workload::Queue {
            producer_cpus: vec![0, 5, 7],
            item_ns: 100,
        },
        queue: QueueSpec::new("q", Scope::Cpu, true),
        length: RunLength::Duration(2_000_000),
        warmup: 0,
        seed: 1,
    };
    let s = &run(&topo, &params, &spec).segments[0];
    assert!(s.items > 100);
    assert_eq!(s.counters.locality[0], s.items, "{:?}", s.counters.locality);
    // Nothing ever woke outside its pod.
    assert_eq!(s.counters.repatriations, 0);
}

#[test]
fn max_active_caps_the_items_running_at_once() {
    let (topo, params) = machine("xeon-12c");
    for (max_active, ordered, expect) in [(3, false, 3), (1024, true, 1)] {
        let spec = RunSpec {
            workload: Workload::Throughput {
                producer_cpus: (0..12).collect(),
                depth: 8,
                item_ns: 2_000,
            },
            queue: QueueSpec {
                name: "q".to_owned(),
                scope: Scope::Smt,
                strict: false,
                max_active,
                ordered,
                ..QueueSpec::new("q", Scope::Smt, false)
            },
            length: RunLength::Duration(2_000_000),
            warmup: 0,
            seed: 1,
        };
        let out = run(&topo, &params, &spec);
        assert_eq!(
            out.peak_active, expect,
            "max_active {max_active}, ordered {ordered}"
        );
        assert!(out.segments[0].items > 100);
    }
    // Without a cap, far more than either cap are active at once, never more than
    // the 12 producers x depth 8 in flight.
    let spec = RunSpec {
        workload: Workload::Throughput {
            producer_cpus: (0..12).collect(),
            depth: 8,
            item_ns: 2_000,
        },
        queue: QueueSpec::new("q", Scope::Smt, false),
        length: RunLength::Duration(2_000_000),
        warmup: 0,
        seed: 1,
    };
    let peak = run(&topo, &params, &spec).peak_active;
    assert!((48..=96).contains(&peak), "{peak}");
}

#[test]
fn the_same_seed_gives_the_same_run_and_another_seed_another() {
    let (topo, params) = machine("xeon-2s24c");
    let spec = |seed| RunSpec {
        workload: Workload::Completion(CompletionSpec {
            toggle: vec![Scope::Smt, Scope::CacheShard],
            ..match completion((0..16).collect()) {
                Workload::Completion(c) => c,
                _ => unreachable!(),
            }
        }),
        queue: QueueSpec::new("rpciod", Scope::Smt, false),
        length: RunLength::Duration(2_000_000),
        warmup: 0,
        seed,
    };
    let a = digest(&run(&topo, &params, &spec(7)));
    let b = digest(&run(&topo, &params, &spec(7)));
    let c = digest(&run(&topo, &params, &spec(8)));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn a_toggle_splits_the_run_into_segments_with_their_scopes() {
    let (topo, params) = machine("xeon-2s24c");
    let Workload::Completion(c) = completion((0..16).collect()) else {
        unreachable!()
    };
    let spec = RunSpec {
        workload: Workload::Completion(CompletionSpec {
            toggle: vec![Scope::Smt, Scope::Cache, Scope::Smt],
            ..c
        }),
        queue: QueueSpec::new("rpciod", Scope::Smt, false),
        length: RunLength::Duration(3_000_000),
        warmup: 0,
        seed: 1,
    };
    let out = run(&topo, &params, &spec);
    let scopes: Vec<Scope> = out.segments.iter().map(|s| s.scope).collect();
    assert_eq!(scopes, [Scope::Smt, Scope::Cache, Scope::Smt]);
    for s in &out.segments {
        assert!((s.seconds - 0.001).abs() < 1e-9);
        assert!(s.items > 0);
    }
}

#[test]
fn a_cold_cpu_pays_its_c_state_exit() {
    let (topo, mut params) = machine("xeon-12c");
    params.jitter = 0.0;
    let clat_p50 = |params: &podq_sim::CostParams| {
        let spec = RunSpec {
            workload: Workload::Latency {
                cpu: 0,
                think_ns: 1_000_000,
                item_ns: 100,
            },
            queue: QueueSpec::new("q", Scope::Smt, true),
            length: RunLength::Duration(50_000_000),
            warmup: 0,
            seed: 1,
        };
        run(&topo, params, &spec).segments[0]
            .hists
            .latency
            .value_at_quantile(0.5)
    };
    // The worker sleeps on CPU 0's sibling through each 1 ms think time, longer than
    // the 600 us C-state residency: every item waits the 133 us exit.
    let deep = clat_p50(&params);
    params.cstate_exit = 0.0;
    let shallow = clat_p50(&params);
    assert!(
        (132_000..136_000).contains(&(deep - shallow)),
        "{deep} {shallow}"
    );
}

#[test]
fn bad_runs_are_refused_with_the_reason() {
    let (topo, params) = machine("xeon-12c");
    let spec = |workload, length| RunSpec {
        workload,
        queue: QueueSpec::new("q", Scope::Smt, false),
        length,
        warmup: 0,
        seed: 1,
    };
    let queue = |cpus: Vec<usize>| Workload::Queue {
        producer_cpus: cpus,
        item_ns: 1,
    };
    let err = |s: RunSpec| simulate(&topo, &params, &s).err().unwrap().to_string();
    assert!(err(spec(queue(vec![]), RunLength::Items(1))).contains("no producer"));
    assert!(err(spec(queue(vec![99]), RunLength::Items(1))).contains("CPU 99"));
    assert!(err(spec(queue(vec![0]), RunLength::Duration(11_000_000_000))).contains("10 s"));
    assert!(err(spec(queue(vec![0]), RunLength::Items(0))).contains("zero items"));
    let flood = Workload::Throughput {
        producer_cpus: vec![0; 4096],
        depth: 4096,
        item_ns: 1,
    };
    assert!(err(spec(flood, RunLength::Items(1))).contains("at most 1048576"));
    let mut bad = params.clone();
    bad.wake = -1.0;
    let e = simulate(&topo, &bad, &spec(queue(vec![0]), RunLength::Items(1)));
    assert!(matches!(e, Err(SimError::Cost(_))));
    let big = Topology::synthetic("2s32c20t").unwrap();
    let e = simulate(&big, &params, &spec(queue(vec![0]), RunLength::Items(1)));
    assert!(e.err().unwrap().to_string().contains("at most 1024"));
}

/// A slow port caps the I/Os: at 0.1 GB/s a 4 KiB payload takes 40.96 us on the
/// wire, far more than the 22 us of CPU an I/O costs, so one CQ completes one I/O per
/// 40.96 us however its queue is set up (20 ms measured: 488.3 of them).
#[test]
fn the_transport_caps_io_at_the_ports_line_rate() {
    let (topo, mut params) = machine("xeon-12c");
    params.nic_rate = 0.1;
    for scope in [Scope::Cpu, Scope::Cache] {
        let spec = RunSpec {
            workload: completion(vec![0]),
            queue: QueueSpec::new("rpciod", scope, false),
            length: RunLength::Duration(20_000_000),
            warmup: 2_000_000,
            seed: 1,
        };
        let s = &run(&topo, &params, &spec).segments[0];
        assert!((487..=489).contains(&s.items), "{scope}: {}", s.items);
    }
    // At the profile's 25 GB/s the same CQ is bound by its CPU time instead.
    let (_, fast) = machine("xeon-12c");
    let spec = RunSpec {
        workload: completion(vec![0]),
        queue: QueueSpec::new("rpciod", Scope::Cache, false),
        length: RunLength::Duration(20_000_000),
        warmup: 2_000_000,
        seed: 1,
    };
    assert!(run(&topo, &fast, &spec).segments[0].items > 2 * 489);
}

#[test]
fn an_empty_or_huge_io_is_refused() {
    let (topo, params) = machine("xeon-12c");
    for bytes in [0, podq_sim::MAX_IO_BYTES + 1] {
        let Workload::Completion(c) = completion(vec![0]) else {
            unreachable!()
        };
        let spec = RunSpec {
            workload: Workload::Completion(CompletionSpec {
                io_bytes: bytes,
                ..c
            }),
            queue: QueueSpec::new("rpciod", Scope::Cache, false),
            length: RunLength::Duration(1_000_000),
            warmup: 0,
            seed: 1,
        };
        let Err(err) = simulate(&topo, &params, &spec) else {
            panic!("an I/O of {bytes} bytes was accepted");
        };
        assert!(
            err.to_string().contains(&format!(
                "an I/O of {bytes} bytes is outside 1..=1073741824"
            )),
            "{err}"
        );
    }
}

/// podq's spinning worker yields to a thread that may run on its CPU (its poll loop,
/// `policy::poll_pauses`): a producer woken onto the CPU where its item's worker then
/// spins for the next item runs at once, whether it arrived during the spin or just
/// before it began. One producer and its worker on one CPU: a round trip is a few
/// microseconds of wake-ups and switches, not the 20 µs spin (`IDLE_SPIN`).
#[test]
fn a_spinner_yields_to_the_producer_it_woke_on_its_cpu() {
    let (_, params) = machine("epyc-2s32c");
    let topo = Topology::synthetic("1s1c1t").unwrap();
    let spec = RunSpec {
        workload: Workload::Queue {
            producer_cpus: vec![0],
            item_ns: 100,
        },
        queue: QueueSpec::new("queue", Scope::Cpu, false),
        length: RunLength::Items(2_000),
        warmup: 0,
        seed: 1,
    };
    let out = run(&topo, &params, &spec);
    let seg = &out.segments[0];
    assert_eq!(seg.items, 2_000);
    let round_trip_ns = seg.seconds * 1e9 / seg.items as f64;
    let spin_ns = podq_policy::IDLE_SPIN.as_nanos() as f64;
    assert!(
        round_trip_ns < spin_ns / 2.0,
        "a round trip took {round_trip_ns:.0} ns: the producer waited out its worker's spin"
    );
}

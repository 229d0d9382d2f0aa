//! A deterministic discrete-event simulator of many-CPU machines running podq's
//! workqueues, for the machines its users have and a 2-CPU box has not.
//!
//! Every decision goes through `podq-policy`, the functions the threaded runtime calls:
//! pwq selection, pod masks, per-node `max_active` and admission, kicks, idle-worker
//! choice and repatriation, spinning, reaping, the CPU-intensive rule for long items
//! ([`long_items`]). What the runtime leaves to the hardware and the kernel is
//! modelled with named costs ([`cost`]), each with its source: line transfers by
//! distance, lock hand-offs, wake-ups and C-state exits, context switches, migrations,
//! SMT sharing, 4 KiB buffer reads, a slab allocator and, for `completion`, the RDMA
//! port's latency and line rate.
//!
//! Pure: no threads, clocks or globals. A run is a function of its topology, its
//! parameters, its workload and its seed; the same inputs give the same output.
//!
//! ```
//! use podq_sim::{cost, simulate, QueueSpec, RunLength, RunSpec, Workload};
//! use podq_topology::{Scope, Topology};
//!
//! let machine = cost::machine("xeon-12c").unwrap();
//! let topo = Topology::synthetic(machine.shape).unwrap();
//! let spec = RunSpec {
//!     workload: Workload::Queue { producer_cpus: vec![0, 1, 2], item_ns: 100 },
//!     queue: QueueSpec::new("queue", Scope::Cache, false),
//!     length: RunLength::Duration(2_000_000),
//!     warmup: 0,
//!     seed: 1,
//! };
//! let out = simulate(&topo, &machine.params, &spec).unwrap();
//! assert!(out.segments[0].items > 0);
//! ```
//!
//! # What is not modelled
//! Memory bandwidth saturation, interrupts and softirqs, the node lock of `max_active`
//! counters, the lock of another pool taken when activating one of its items,
//! priorities (`nice`) other than one high class for `completion`'s CQ producers, and
//! the NFS server: it answers each request at once, so the transport is the client's
//! port alone.
//! Lock waiters spin; a run queue is FIFO (high-priority threads first); a woken
//! normal thread preempts only after the running one had a full slice.

pub mod auto;
pub mod cost;
pub mod distance;
pub mod engine;
pub mod events;
pub mod lock;
pub mod long_items;
pub mod programs;
pub mod rng;
pub mod slab;
pub mod workload;
pub mod wq;

use podq_topology::{CpuSet, Scope, Topology};
use serde::Serialize;

pub use cost::{CostError, CostParams, Machine};
pub use lock::LockCounts;
pub use slab::AllocCounts;
pub use workload::{
    CompletionSpec, QueueSpec, RemoteFree, RunLength, RunSpec, WorkerCap, Worklist, Workload,
    DEFAULT_IO_BYTES,
};

use engine::{Counters, Role, Sim};
use events::{Event, Ns};
use programs::{Hists, Io, Producer, World};
use slab::Slab;

/// The most CPUs a simulated machine may have: beyond it a run takes minutes.
pub const MAX_SIM_CPUS: usize = 1024;
/// The longest virtual run, warm-up included, ns (10 s; a 96-CPU machine at a million
/// items/s takes seconds of wall time per simulated second).
pub const MAX_VIRTUAL_NS: Ns = 10_000_000_000;
/// The most producers.
pub const MAX_PRODUCERS: usize = 4096;
/// The largest per-producer depth.
pub const MAX_DEPTH: usize = 4096;
/// The largest `completion` I/O payload, bytes (1 GiB).
pub const MAX_IO_BYTES: u64 = 1 << 30;
/// The most items or I/Os in flight over all producers (each I/O is a record).
pub const MAX_IN_FLIGHT: usize = 1 << 20;

/// A run the simulator refuses.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Too many CPUs.
    #[error("the topology has {cpus} CPUs; the simulator takes at most {MAX_SIM_CPUS}")]
    TooManyCpus {
        /// CPUs asked for.
        cpus: usize,
    },
    /// Too long.
    #[error("a simulated run lasts at most {} s of virtual time", MAX_VIRTUAL_NS / 1_000_000_000)]
    TooLong,
    /// Bad producers.
    #[error("{0}")]
    Producers(String),
    /// Bad parameters.
    #[error(transparent)]
    Cost(#[from] CostError),
    /// The `auto` controller's ladder could not be built.
    #[error(transparent)]
    Topology(#[from] podq_topology::Error),
}

/// Pool lock counts of one workqueue's pools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PoolLocks {
    /// Appending items.
    pub enqueue: LockCounts,
    /// Workers taking items.
    pub dequeue: LockCounts,
}

/// The allocator model's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AllocOutput {
    /// Paths taken.
    pub counts: AllocCounts,
    /// The node list locks.
    pub node_lock: LockCounts,
}

/// The measurements of one segment (the whole run without `--toggle`).
pub struct SegmentOutput {
    /// The scope of the queue under test in this segment (`auto` when it chose).
    pub scope: Scope,
    /// `auto`: the switches made within the segment.
    pub auto_switches: Vec<auto::TimedSwitch>,
    /// The concrete scope in force at the segment's end.
    pub scope_at_end: Scope,
    /// Virtual seconds.
    pub seconds: f64,
    /// Items (I/Os in `completion`) finished.
    pub items: u64,
    /// Distributions.
    pub hists: Hists,
    /// The queue under test's pools.
    pub pool_locks: PoolLocks,
    /// nfsiod's pools (`completion`).
    pub nfsiod_pool_locks: Option<PoolLocks>,
    /// The allocator (`completion`).
    pub alloc: AllocOutput,
    /// Counters.
    pub counters: Counters,
    /// Idle share per usable CPU, in CPU order.
    pub idle_per_cpu: Vec<(usize, f64)>,
    /// Idle share per node, in node order.
    pub idle_per_node: Vec<(usize, f64)>,
}

/// A run's results.
pub struct SimOutput {
    /// One per segment.
    pub segments: Vec<SegmentOutput>,
    /// Events processed.
    pub events: u64,
    /// Virtual time simulated, ns.
    pub virtual_ns: Ns,
    /// The most items of the queue under test that were active at once.
    pub peak_active: usize,
}

struct Snapshot {
    at: Ns,
    scope: Scope,
    counters: Counters,
    busy: Vec<Ns>,
    locks: PoolLocks,
    nfsiod: PoolLocks,
    alloc: AllocOutput,
}

fn validate(topo: &Topology, cost: &CostParams, spec: &RunSpec) -> Result<(), SimError> {
    cost.validate()?;
    let cpus = topo.usable().len();
    if cpus > MAX_SIM_CPUS || topo.usable().last().is_some_and(|c| c >= 4 * MAX_SIM_CPUS) {
        return Err(SimError::TooManyCpus { cpus });
    }
    let bad = |m: String| Err(SimError::Producers(m));
    let producers = spec.workload.producer_cpus();
    if producers.is_empty() {
        return bad("the workload has no producer".to_owned());
    }
    if producers.len() > MAX_PRODUCERS {
        return bad(format!(
            "{} producers; the simulator takes at most {MAX_PRODUCERS}",
            producers.len()
        ));
    }
    if let Some(c) = producers.iter().find(|&&c| !topo.usable().contains(c)) {
        return bad(format!("producer CPU {c} is not a CPU of the topology"));
    }
    let depth = match &spec.workload {
        Workload::Throughput { depth, .. } => *depth,
        Workload::Completion(c) => c.depth,
        _ => 1,
    };
    if let Workload::Completion(c) = &spec.workload {
        if c.io_bytes == 0 || c.io_bytes > MAX_IO_BYTES {
            return bad(format!(
                "an I/O of {} bytes is outside 1..={MAX_IO_BYTES}",
                c.io_bytes
            ));
        }
    }
    if depth == 0 || depth > MAX_DEPTH {
        return bad(format!("depth {depth} is outside 1..={MAX_DEPTH}"));
    }
    if depth * producers.len() > MAX_IN_FLIGHT {
        return bad(format!(
            "{} producers x depth {depth} in flight; the simulator takes at most {MAX_IN_FLIGHT}",
            producers.len()
        ));
    }
    match spec.length {
        RunLength::Duration(0) => bad("the run lasts no time".to_owned()),
        RunLength::Duration(ns) if ns.saturating_add(spec.warmup) > MAX_VIRTUAL_NS => {
            Err(SimError::TooLong)
        }
        RunLength::Items(0) => bad("zero items per producer".to_owned()),
        _ => Ok(()),
    }
}

/// Runs one simulation.
pub fn simulate(topo: &Topology, cost: &CostParams, spec: &RunSpec) -> Result<SimOutput, SimError> {
    validate(topo, cost, spec)?;
    let producer_cpus = spec.workload.producer_cpus();
    let n = topo.usable().last().map_or(0, |c| c + 1);
    let max_node = topo.nodes().into_iter().max().unwrap_or(0);
    let (capacity, toggle, moves) = match &spec.workload {
        Workload::Completion(c) => (c.alloc_cache.max(1), c.toggle.clone(), c.moves.clone()),
        _ => (1, Vec::new(), Vec::new()),
    };
    let mut world = World::new(spec.workload.clone());
    world.slab = Slab {
        cache: vec![capacity; n],
        capacity,
        node_lock: Vec::new(),
        remote: vec![0; max_node + 1],
        counts: AllocCounts::default(),
    };
    world.per_producer = match spec.length {
        RunLength::Items(k) => Some(k),
        RunLength::Duration(_) => None,
    };
    world.target_items = match spec.length {
        RunLength::Items(k) => Some(k.saturating_mul(producer_cpus.len() as u64)),
        RunLength::Duration(_) => None,
    };
    let mut sim = Sim::new(topo, cost.clone(), spec.seed, world);
    for node in 0..=max_node {
        let lock = sim.new_lock(node);
        sim.world.slab.node_lock.push(lock);
    }
    let mut queue = spec.queue.clone();
    if let Some(&first) = toggle.first() {
        queue.scope = first;
    }
    // `auto`: the controller picks the concrete scope the queue starts at.
    let mut auto = None;
    if queue.scope == Scope::Auto {
        let controller = auto::SimAuto::new(topo, queue.strict, queue.auto.clone())?;
        queue.scope = controller.scope();
        sim.events.push(controller.window_ns(), Event::Auto);
        auto = Some(controller);
    }
    let (worklist, worker_cap, cpu_intensive) =
        (queue.worklist, queue.worker_cap, queue.cpu_intensive);
    sim.new_wq(queue);
    if let Workload::Completion(_) = spec.workload {
        // nfsiod keeps the default scope, as in the experiments where only rpciod changed.
        sim.new_wq(QueueSpec {
            worklist,
            worker_cap,
            cpu_intensive,
            ..QueueSpec::new("nfsiod", Scope::BUILTIN_DEFAULT, false)
        });
    }
    let depth = match &spec.workload {
        Workload::Completion(c) => c.depth,
        _ => 0,
    };
    for (p, &cpu) in producer_cpus.iter().enumerate() {
        let tid = sim.spawn(Role::Producer(p), CpuSet::single(cpu), cpu, Vec::new());
        sim.threads[tid].high =
            matches!(&spec.workload, Workload::Completion(c) if c.high_priority);
        for _ in 0..depth {
            sim.world.ios.push(Io {
                producer: p,
                ..Io::default()
            });
        }
        // A CQ starts waiting for its I/Os' first replies.
        sim.world.producers.push(Producer {
            tid,
            cpu,
            t0: 0,
            inflight: depth,
            waiting: depth > 0,
            free_slots: Vec::new(),
            issued: 0,
        });
        if depth == 0 {
            sim.wake(tid, cpu, cpu, None);
        }
    }
    // The first I/Os go out together, one of each CQ's in turn.
    for k in 0..depth {
        for p in 0..producer_cpus.len() {
            sim.transmit(p * depth + k);
        }
    }
    let (start, length) = match spec.length {
        RunLength::Duration(ns) => (spec.warmup, ns),
        RunLength::Items(_) => (0, MAX_VIRTUAL_NS),
    };
    let end = start + length;
    let segments = toggle.len().max(moves.len()).max(1);
    if start > 0 {
        sim.events.push(start, Event::Segment(0));
    }
    for i in 1..segments {
        sim.events.push(
            start + length / segments as u64 * i as u64,
            Event::Segment(i),
        );
    }
    sim.events
        .push(cost.balance_interval.round() as Ns, Event::Balance);
    if let Some(period) = sim.long_item_look_period() {
        sim.events.push(period, Event::LongItems);
    }
    sim.events.push(end, Event::End);
    let mut marks = vec![snapshot(&sim)];
    let scope_now = |sim: &Sim, auto: &Option<auto::SimAuto>| {
        if auto.is_some() {
            Scope::Auto
        } else {
            sim.world.wqs[0].spec.scope
        }
    };
    let mut scopes = vec![scope_now(&sim, &auto)];
    while let Some((at, event)) = sim.events.pop() {
        sim.now = at;
        match event {
            Event::Step { tid, generation } if generation & engine::TIMER_BIT != 0 => {
                sim.on_timer(tid, generation & !engine::TIMER_BIT)
            }
            Event::Step { tid, generation } => sim.on_step(tid, generation),
            Event::Arrive { tid, cpu } => sim.on_arrive(tid, cpu),
            Event::Wire(io) => sim.on_wire(io),
            Event::Balance => sim.on_balance(),
            Event::LongItems => sim.look_for_long_items(),
            Event::Segment(0) => {
                // The warm-up is over: measure from here.
                marks = vec![snapshot(&sim)];
                sim.world.hists = vec![Hists::new()];
            }
            Event::Segment(i) => {
                marks.push(snapshot(&sim));
                sim.world.hists.push(Hists::new());
                let strict = sim.world.wqs[0].spec.strict;
                if let Some(&scope) = toggle.get(i) {
                    sim.apply_attrs(0, scope, strict);
                }
                if let Some(cpus) = moves.get(i) {
                    move_producers(&mut sim, cpus);
                }
                scopes.push(scope_now(&sim, &auto));
            }
            Event::Auto => {
                if let Some(controller) = auto.as_mut() {
                    if let Some((scope, strict)) = controller.sample(&sim, 0) {
                        sim.apply_attrs(0, scope, strict);
                    }
                    let next = sim.now + controller.window_ns();
                    sim.events.push(next, Event::Auto);
                }
            }
            Event::End => break,
        }
        if sim.world.stop {
            break;
        }
    }
    marks.push(snapshot(&sim));
    let hists = std::mem::take(&mut sim.world.hists);
    let nodes = topo.nodes();
    let is_completion = matches!(spec.workload, Workload::Completion(_));
    let switches = auto.map(|a| a.switches).unwrap_or_default();
    let segments = marks
        .windows(2)
        .zip(hists)
        .zip(scopes)
        .map(|((w, hists), scope)| {
            let (a, b) = (&w[0], &w[1]);
            let span = (b.at - a.at).max(1);
            let idle_per_cpu: Vec<(usize, f64)> = topo
                .usable()
                .iter()
                .zip(a.busy.iter().zip(&b.busy))
                .map(|(c, (x, y))| (c, 1.0 - (y - x) as f64 / span as f64))
                .collect();
            let idle_per_node = nodes
                .iter()
                .map(|&node| {
                    let of: Vec<f64> = idle_per_cpu
                        .iter()
                        .filter(|(c, _)| topo.node_of(*c) == Some(node))
                        .map(|&(_, i)| i)
                        .collect();
                    (node, of.iter().sum::<f64>() / of.len().max(1) as f64)
                })
                .collect();
            SegmentOutput {
                scope,
                auto_switches: switches
                    .iter()
                    .filter(|s| s.at > a.at && s.at <= b.at)
                    .cloned()
                    .collect(),
                scope_at_end: b.scope,
                seconds: span as f64 / 1e9,
                items: b.counters.items - a.counters.items,
                hists,
                pool_locks: locks_since(&b.locks, &a.locks),
                nfsiod_pool_locks: is_completion.then(|| locks_since(&b.nfsiod, &a.nfsiod)),
                alloc: AllocOutput {
                    counts: b.alloc.counts.since(&a.alloc.counts),
                    node_lock: b.alloc.node_lock.since(&a.alloc.node_lock),
                },
                counters: counters_since(&b.counters, &a.counters),
                idle_per_cpu,
                idle_per_node,
            }
        })
        .collect();
    Ok(SimOutput {
        segments,
        events: sim.events.processed(),
        virtual_ns: sim.now,
        peak_active: sim.world.wqs[0].peak_active,
    })
}

/// Moves each producer to its CPU in `cpus` (round-robin if fewer): it may run only
/// there from now on, and gets there at its next wake-up.
fn move_producers(sim: &mut Sim, cpus: &[usize]) {
    for p in 0..sim.world.producers.len() {
        let Some(&cpu) = cpus.get(p % cpus.len().max(1)) else {
            return;
        };
        let tid = sim.world.producers[p].tid;
        sim.world.producers[p].cpu = cpu;
        sim.threads[tid].allowed = CpuSet::single(cpu);
    }
}

fn locks_since(b: &PoolLocks, a: &PoolLocks) -> PoolLocks {
    PoolLocks {
        enqueue: b.enqueue.since(&a.enqueue),
        dequeue: b.dequeue.since(&a.dequeue),
    }
}

fn counters_since(b: &Counters, a: &Counters) -> Counters {
    let mut locality = [0; 5];
    for (i, l) in locality.iter_mut().enumerate() {
        *l = b.locality[i] - a.locality[i];
    }
    Counters {
        items: b.items - a.items,
        context_switches: b.context_switches - a.context_switches,
        migrations: b.migrations - a.migrations,
        wakeups: b.wakeups - a.wakeups,
        locality,
        repatriations: b.repatriations - a.repatriations,
        workers_created: b.workers_created - a.workers_created,
        workers_reaped: b.workers_reaped - a.workers_reaped,
        run_delay_ns: [
            b.run_delay_ns[0] - a.run_delay_ns[0],
            b.run_delay_ns[1] - a.run_delay_ns[1],
        ],
        preemptions: b.preemptions - a.preemptions,
        cpu_intensive: b.cpu_intensive - a.cpu_intensive,
        handed_back: b.handed_back - a.handed_back,
    }
}

fn wq_locks(sim: &Sim, wq: usize) -> PoolLocks {
    let mut out = PoolLocks::default();
    if let Some(w) = sim.world.wqs.get(wq) {
        for &pool in &w.pools {
            let p = &sim.world.pools[pool];
            out.enqueue.add(&sim.locks[p.lock].counts[0]);
            out.dequeue.add(&sim.locks[p.take_lock].counts[1]);
        }
    }
    out
}

fn snapshot(sim: &Sim) -> Snapshot {
    let mut node_lock = LockCounts::default();
    for &l in &sim.world.slab.node_lock {
        node_lock.add(&sim.locks[l].counts[2]);
    }
    Snapshot {
        at: sim.now,
        scope: sim.world.wqs[0].spec.scope,
        counters: sim.counters.clone(),
        busy: sim.topo.usable().iter().map(|c| sim.busy_ns(c)).collect(),
        locks: wq_locks(sim, 0),
        nfsiod: wq_locks(sim, 1),
        alloc: AllocOutput {
            counts: sim.world.slab.counts,
            node_lock,
        },
    }
}

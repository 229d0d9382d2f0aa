//! What to simulate, as data: the queue under test, the producers and what each item
//! costs. The same descriptions `podq bench` runs on threads.

use std::time::Duration;

use podq_topology::Scope;

use crate::events::Ns;

/// The attributes of a simulated workqueue.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSpec {
    /// Its name (`rpciod`, `queue`, ...).
    pub name: String,
    /// Affinity scope.
    pub scope: Scope,
    /// Strict pods.
    pub strict: bool,
    /// `max_active`.
    pub max_active: usize,
    /// Ordered: one item at a time, in queueing order (one pwq, `max_active` 1).
    pub ordered: bool,
    /// The controller's window and thresholds when `scope` is `auto`.
    pub auto: crate::auto::AutoSpec,
    /// How its pools' worklists are shared between queuers and workers.
    pub worklist: Worklist,
    /// How many of a pool's workers may run at once.
    pub worker_cap: WorkerCap,
    /// The runtime's CPU-intensive threshold (`podq_policy::cpu_intensive`): a worker
    /// whose item has run this long leaves its pool's running count. `None` turns the
    /// rule off; [`WorkerCap::Unlimited`] has no count to leave and ignores it.
    pub cpu_intensive: Option<Duration>,
}

/// How many of a pool's workers may run at once: podq's rule or the kernel's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkerCap {
    /// podq's runtime: one per CPU of the pod (`podq_policy::PoolKey::concurrency`),
    /// a worker preempted on its CPU still counted (the runtime cannot see it).
    #[default]
    PodCpus,
    /// The kernel's unbound pools: no limit on running workers, so every queued item
    /// finds one woken or created for it, up to `podq_policy::POOL_MAX_WORKERS`
    /// threads a pool (the kernel has no such limit; `max_active` bounds both).
    Unlimited,
}

/// How a pool's worklist is shared between the CPUs that queue onto it and its
/// workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Worklist {
    /// The kernel's: one pool lock for every push and every take, with the pool's
    /// admission and wake-up decisions inside it.
    #[default]
    Locked,
    /// podq's runtime: a pool of several CPUs has a ring whose pushes claim its tail
    /// line and whose takes claim its head line, each a compare-and-swap with no
    /// critical section behind it; a one-CPU pool keeps the lock. In every pool a
    /// worker takes its share of the waiting items per acquisition
    /// (`podq_policy::batch_take`) and runs them before it looks again.
    /// Approximations: a claim is a lock of the model with no hold (its cost is the
    /// line's transfer, and under contention the hand-off), and a worker's idle and
    /// wake-up bookkeeping rides on the head line instead of the pool lock.
    Ring,
}

impl QueueSpec {
    /// A queue with the kernel's default `max_active`.
    pub fn new(name: &str, scope: Scope, strict: bool) -> QueueSpec {
        QueueSpec {
            name: name.to_owned(),
            scope,
            strict,
            max_active: podq_policy::WQ_DFL_ACTIVE,
            ordered: false,
            auto: crate::auto::AutoSpec::default(),
            worklist: Worklist::Locked,
            worker_cap: WorkerCap::PodCpus,
            cpu_intensive: Some(podq_policy::CPU_INTENSIVE_THRESHOLD),
        }
    }
}

/// When a free takes the allocator's slow path (as `podq bench --remote-free`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteFree {
    /// Freed on another CPU than it was allocated on.
    Cpu,
    /// Freed on another NUMA node.
    Node,
}

/// The payload of a `completion` I/O unless a run says otherwise: the 4 KiB buffer the
/// rpciod stage reads, and the unit of the reported MB/s.
pub const DEFAULT_IO_BYTES: u64 = 4096;

/// The NFS-over-RDMA miniature (`podq bench completion`).
///
/// An I/O whose nfsiod stage is done goes back through the transport (the cost
/// model's `nic_*`): its request and reply each take the adapter's latency, and its
/// payload crosses the one port after the payloads before it, at the port's rate.
/// Its CQ handles it when it arrives.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionSpec {
    /// The CPU of each completion producer (CQ).
    pub producer_cpus: Vec<usize>,
    /// I/Os in flight per producer.
    pub depth: usize,
    /// Payload of an I/O on the transport, bytes ([`DEFAULT_IO_BYTES`]).
    pub io_bytes: u64,
    /// Allocator object size, bytes.
    pub object_size: usize,
    /// Objects per CPU cache.
    pub alloc_cache: usize,
    /// Which frees are remote.
    pub remote_free: RemoteFree,
    /// CPU time of a producer per I/O (completion handling), ns.
    pub producer_ns: Ns,
    /// The producers run at high priority and preempt the workers on their CPUs, as
    /// the kernel's completion handlers do: xprtrdma polls its CQs with
    /// `IB_POLL_WORKQUEUE`, on `ib-comp-wq`, a per-CPU `WQ_HIGHPRI` workqueue whose
    /// workers run at nice -20. False: normal threads, as `podq bench`'s producers.
    pub high_priority: bool,
    /// CPU time of an rpciod item besides its buffer read and allocator work, ns.
    pub rpciod_ns: Ns,
    /// CPU time of an nfsiod item besides its allocator work, ns.
    pub nfsiod_ns: Ns,
    /// rpciod's scope in each equal time segment (empty: the queue's scope throughout).
    pub toggle: Vec<Scope>,
    /// The producers' CPUs in each equal time segment (empty: `producer_cpus`
    /// throughout); a producer moves at its next wake-up.
    pub moves: Vec<Vec<usize>>,
}

/// A workload.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// test_workqueue: each producer queues its own item, waits for it, queues it again.
    Queue {
        /// Producer CPUs.
        producer_cpus: Vec<usize>,
        /// CPU time of an item, ns.
        item_ns: Ns,
    },
    /// One synchronous submitter with think time.
    Latency {
        /// The submitter's CPU.
        cpu: usize,
        /// Think time between items, ns.
        think_ns: Ns,
        /// CPU time of an item, ns.
        item_ns: Ns,
    },
    /// Producers queueing back to back, up to `depth` items each in flight.
    Throughput {
        /// Producer CPUs.
        producer_cpus: Vec<usize>,
        /// Items in flight per producer.
        depth: usize,
        /// CPU time of an item, ns.
        item_ns: Ns,
    },
    /// CQ producers -> rpciod -> nfsiod with the slab model.
    Completion(CompletionSpec),
}

impl Workload {
    /// `queue`, `latency`, `throughput` or `completion`.
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Queue { .. } => "queue",
            Workload::Latency { .. } => "latency",
            Workload::Throughput { .. } => "throughput",
            Workload::Completion(_) => "completion",
        }
    }

    /// The producer CPUs.
    pub fn producer_cpus(&self) -> Vec<usize> {
        match self {
            Workload::Queue { producer_cpus, .. } | Workload::Throughput { producer_cpus, .. } => {
                producer_cpus.clone()
            }
            Workload::Latency { cpu, .. } => vec![*cpu],
            Workload::Completion(c) => c.producer_cpus.clone(),
        }
    }
}

/// How long a run lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunLength {
    /// Virtual time.
    Duration(Ns),
    /// Items per producer (the run ends when all producers' items are done).
    Items(u64),
}

/// One simulation run.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// The workload.
    pub workload: Workload,
    /// The queue under test (rpciod in `completion`).
    pub queue: QueueSpec,
    /// How long.
    pub length: RunLength,
    /// Virtual time run before measuring (duration runs only): workers get created and
    /// spread before the counters start.
    pub warmup: Ns,
    /// The random seed.
    pub seed: u64,
}

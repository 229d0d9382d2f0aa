//! The serialisable snapshots of the counters: per pool and per workqueue.

use serde::{Deserialize, Serialize};

use super::{Histogram, OwnedCounter, PoolCounters, WorkerCounters};
use crate::Attrs;

/// Item totals of a workqueue or pool.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Totals {
    /// Items accepted by a queue call (and `spawn`).
    pub queued: u64,
    /// Items whose function started.
    pub started: u64,
    /// Items whose function returned (panicked ones included). A workqueue's count
    /// grows when a worker settles its finished items, per batch (at the latest before
    /// it takes more items, blocks or goes idle, and before a flush they end returns),
    /// so while a worker runs a batch it may trail the pool's by up to 31 items.
    pub completed: u64,
    /// Items whose function panicked.
    pub panicked: u64,
    /// Queued items dropped without running: cancelled, superseded by `mod_delayed`,
    /// or still on the timer when their workqueue was dropped.
    pub cancelled: u64,
    /// Wake-ups of an idle worker that last ran outside the pod (non-strict pools).
    pub repatriated: u64,
    /// Items that had to wait for a `max_active` slot.
    pub max_active_waits: u64,
}

/// Contention of a pool's worklist (or of a lock) at one kind of call site. A
/// worklist is acquired by claiming slots of its lock-free ring, or, when the ring is
/// full or closed, by taking its lock (`pool/README.md`, "Worklist").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LockStats {
    /// Times it was acquired: a ring claim (one per item queued, one per run an
    /// activation or a worker takes) or the lock taken.
    pub acquisitions: u64,
    /// Times another thread had it: a ring claim retried after another's, or the lock
    /// already held (the try-lock failed).
    pub contended: u64,
    /// Total time spent waiting in contended acquisitions: for the lock and for the
    /// ring's retried claims (from the first retry to the claim) apart, the mean wait
    /// of a systematic sample of them (one in 8 per thread, each thread's first
    /// always) times their count, since two clock reads cost more than a short wait.
    pub wait_ns: u64,
}

/// Where items ran relative to where they were queued, in the workqueue's topology.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Locality {
    /// On the queueing CPU.
    pub same_cpu: u64,
    /// On another thread of its core.
    pub same_smt: u64,
    /// On another core of its last-level cache.
    pub same_llc: u64,
    /// On another LLC of its NUMA node.
    pub same_node: u64,
    /// On another node.
    pub remote: u64,
}

/// A latency distribution in nanoseconds (quantiles within 1/16 relative error). A
/// pool's item latencies are measured on a sample whose rate adapts to each queueing
/// thread's, about one measured item per 32 µs per thread (every item of a slower
/// thread, one in 128 at most in a flood; each thread's first always): a clock read
/// costs about as much as queueing a tiny item. Each measured item counts with the
/// weight of the items it stands for (those its thread queued since its previous
/// measured one), so the quantiles and the mean are those of all items, `count`
/// estimates how many items the distribution stands for (the exact item counts are in
/// [`Totals`]) and `samples` is the sample's size. A percentile's rank error from
/// sampling is about `sqrt(p (1 - p) / samples)`, e.g. ±0.1 points for p99 after
/// 10 000 samples.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Latency {
    /// Values recorded, each counted with its weight (for items: the items the
    /// distribution stands for, see above).
    pub count: u64,
    /// Values recorded, whatever their weight (for items: the sample's size).
    #[serde(default)]
    pub samples: u64,
    /// Smallest value.
    pub min: u64,
    /// Mean.
    pub mean: f64,
    /// Standard deviation (from bucket midpoints).
    pub stdev: f64,
    /// Largest value.
    pub max: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
}

/// A snapshot of one pool. Pools are shared by workqueues with equal pool attributes,
/// so these numbers cover every workqueue that uses the pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PoolStats {
    /// Process-unique pool id (as in worker names `podq/u<id>:<n>`).
    pub id: u64,
    /// The pod's CPUs as a cpulist.
    pub pod_cpus: String,
    /// Whether workers are confined to the pod.
    pub strict: bool,
    /// Nice value of the workers.
    pub nice: i32,
    /// Item counts of every workqueue using the pool (the same keys as
    /// [`WorkqueueStats::totals`], at the top level of the pool's JSON object).
    #[serde(flatten)]
    pub totals: Totals,
    /// Worker threads started.
    pub workers_created: u64,
    /// Worker threads that exited after idling too long.
    pub workers_reaped: u64,
    /// Worker threads that could not be started (each retried after the create
    /// cooldown and reported to the error hook).
    pub worker_spawn_failures: u64,
    /// Calls for help sent to rescuers while no worker could be started.
    pub maydays: u64,
    /// Items run by rescuers.
    pub rescued: u64,
    /// Workers whose CPU affinity could not be set.
    pub affinity_failures: u64,
    /// Workers whose nice value could not be set (e.g. EPERM for negative nice).
    pub nice_failures: u64,
    /// Workers now.
    pub workers: usize,
    /// Idle workers now.
    pub idle: usize,
    /// Pool-lock contention when queueing.
    pub enqueue_lock: LockStats,
    /// Pool-lock contention when workers take items.
    pub dequeue_lock: LockStats,
    /// Where items ran relative to where they were queued.
    pub locality: Locality,
    /// Time from the queue call to the start (waiting for a `max_active` slot
    /// included), from a weighted sample of the items ([`Latency`]).
    pub queue_to_start_ns: Latency,
    /// Time items ran, from a weighted sample of the items ([`Latency`]): `mean`
    /// times `totals.completed` estimates the pool's busy time.
    pub run_time_ns: Latency,
    /// CPU time of the workers, added when a worker goes idle or exits.
    pub cpu_time_ns: u64,
    /// Workers taken out of the pool's count of running workers because one item ran
    /// past the CPU-intensive threshold ([`crate::watchdog::set_cpu_intensive_threshold`]),
    /// so that another worker could run the items behind it.
    #[serde(default)]
    pub cpu_intensive: u64,
    /// Items such a worker had taken from the worklist and not started, which the
    /// watchdog put back at the worklist's front as it took the worker out of the
    /// count, for other workers to run.
    #[serde(default)]
    pub handed_back: u64,
}

impl PoolStats {
    pub(crate) fn from_counters(c: &PoolCounters) -> PoolStats {
        let workers = crate::sync::lock_std(&c.workers);
        let items = c.items.snapshot();
        let own = |f: fn(&WorkerCounters) -> &OwnedCounter| -> u64 {
            workers.iter().map(|w| f(w).get()).sum()
        };
        let mut dequeue_lock = c.dequeue_lock.snapshot();
        dequeue_lock.acquisitions += c.retired_dequeues.get() + own(|w| &w.dequeue_acquisitions);
        let place = |i: usize| {
            c.locality[i].get() + workers.iter().map(|w| w.locality[i].get()).sum::<u64>()
        };
        let latency = |f: fn(&WorkerCounters) -> &Histogram, shared: &Histogram| {
            Histogram::merged_snapshot(std::iter::once(shared).chain(workers.iter().map(|w| f(w))))
        };
        PoolStats {
            totals: Totals {
                started: items.started + own(|w| &w.started),
                completed: items.completed + own(|w| &w.completed),
                ..items
            },
            workers_created: c.workers_created.get(),
            workers_reaped: c.workers_reaped.get(),
            worker_spawn_failures: c.worker_spawn_failures.get(),
            maydays: c.maydays.get(),
            rescued: c.rescued.get(),
            affinity_failures: c.affinity_failures.get(),
            nice_failures: c.nice_failures.get(),
            enqueue_lock: c.enqueue_lock.snapshot(),
            dequeue_lock,
            locality: Locality {
                same_cpu: place(0),
                same_smt: place(1),
                same_llc: place(2),
                same_node: place(3),
                remote: place(4),
            },
            queue_to_start_ns: latency(|w| &w.queue_to_start, &c.queue_to_start),
            run_time_ns: latency(|w| &w.run_time, &c.run_time),
            cpu_time_ns: c.cpu_time_ns.get(),
            cpu_intensive: c.cpu_intensive.get(),
            handed_back: c.handed_back.get(),
            ..PoolStats::default()
        }
    }
}

/// A snapshot of one workqueue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkqueueStats {
    /// The workqueue's name.
    pub name: String,
    /// Its requested attributes.
    pub attrs: Attrs,
    /// Its scope with `default` resolved, and for `auto` the scope its controller chose.
    pub effective_scope: podq_topology::Scope,
    /// The `auto` controller, while the scope resolves to `auto`.
    pub auto: Option<crate::auto::AutoStats>,
    /// This workqueue's own item counts (its share of the pools' counts).
    pub totals: Totals,
    /// The pools its current and retiring pool_workqueues use, by id.
    pub pools: Vec<PoolStats>,
    /// What the stall watchdog found (stalls and long items).
    #[serde(default)]
    pub watchdog: crate::watchdog::WatchdogStats,
}

/// Snapshots of every live workqueue, in creation order.
pub fn all() -> Vec<WorkqueueStats> {
    crate::workqueue::live_workqueues()
        .iter()
        .map(|wq| wq.stats_snapshot())
        .collect()
}

#[cfg(all(test, feature = "stats"))]
mod tests {
    use super::*;
    use crate::stats::Recorder;
    use crate::sync::Mutex;

    /// Per-worker recording: a snapshot sums live workers with the shared counters, and
    /// a retiring worker's counts move to the shared ones without changing the sum.
    #[test]
    fn worker_counters_merge_and_retire() {
        let pool = PoolCounters::default();
        let all = Histogram::default();
        let (a, b) = (pool.register_worker(), pool.register_worker());
        // One LLC of four cores without SMT: CPU 1 is in CPU 0's LLC.
        let topology = crate::Topology::synthetic("1s4c1t").unwrap();
        // A workqueue's counts, which every start adds to as well.
        let wq = crate::stats::ItemCounters::default();
        for v in 1..=300u64 {
            let record = match v % 3 {
                0 => Recorder::Worker(&a),
                1 => Recorder::Worker(&b),
                _ => Recorder::Shared(&pool),
            };
            record.started(&wq);
            record.completed();
            record.locality(&topology, 0, 1);
            let weight = 1 << (v % 4);
            record.queue_to_start(v * 7, weight);
            record.run_time(v * 1000, weight);
            all.record(v * 1000, weight);
        }
        let mutex = Mutex::new(());
        {
            use crate::pool::Acquire;
            drop(
                pool.dequeue_lock
                    .owned(a.dequeue_acquisition())
                    .acquire(&mutex),
            );
        }
        let before = PoolStats::from_counters(&pool);
        assert_eq!((before.totals.started, before.totals.completed), (300, 300));
        assert_eq!(wq.get(crate::stats::Item::Started), 300);
        assert_eq!(before.locality.same_llc, 300);
        assert_eq!(before.dequeue_lock.acquisitions, 1);
        assert_eq!(before.run_time_ns, all.snapshot());
        assert_eq!(before.queue_to_start_ns.samples, 300);
        assert_eq!(
            before.queue_to_start_ns.count,
            (1..=300u64).map(|v| 1 << (v % 4)).sum::<u64>()
        );
        assert_eq!(
            (before.queue_to_start_ns.min, before.queue_to_start_ns.max),
            (7, 2100)
        );
        pool.retire_worker(&a);
        assert_eq!(PoolStats::from_counters(&pool), before);
        assert_eq!(crate::sync::lock_std(&pool.workers).len(), 1);
    }
}

#[cfg(all(test, not(loom)))]
mod json_tests {
    use super::*;

    /// A pool's item totals stay top-level keys of its JSON object (the control
    /// protocol, `podq monitor` and BENCH.md read them there), and read back.
    #[test]
    fn pool_totals_are_top_level_json_keys() {
        let pool = PoolStats {
            id: 9,
            totals: Totals {
                queued: 1,
                started: 2,
                completed: 3,
                panicked: 4,
                cancelled: 5,
                repatriated: 6,
                max_active_waits: 7,
            },
            workers: 8,
            ..PoolStats::default()
        };
        let json = serde_json::to_value(&pool).unwrap();
        let object = json.as_object().unwrap();
        let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "affinity_failures",
                "cancelled",
                "completed",
                "cpu_intensive",
                "cpu_time_ns",
                "dequeue_lock",
                "enqueue_lock",
                "handed_back",
                "id",
                "idle",
                "locality",
                "max_active_waits",
                "maydays",
                "nice",
                "nice_failures",
                "panicked",
                "pod_cpus",
                "queue_to_start_ns",
                "queued",
                "repatriated",
                "rescued",
                "run_time_ns",
                "started",
                "strict",
                "worker_spawn_failures",
                "workers",
                "workers_created",
                "workers_reaped",
            ]
        );
        let totals = [
            "queued",
            "started",
            "completed",
            "panicked",
            "cancelled",
            "repatriated",
            "max_active_waits",
        ]
        .map(|key| object[key].as_u64().unwrap());
        assert_eq!(totals, [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(
            (object["id"].as_u64(), object["workers"].as_u64()),
            (Some(9), Some(8))
        );
        let back: PoolStats = serde_json::from_value(json).unwrap();
        assert_eq!(back, pool);
    }
}

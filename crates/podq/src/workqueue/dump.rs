//! [`Workqueue::dump`] (the kernel's `show_workqueue_state`): a workqueue's
//! pool_workqueues, running items and pools, as a value and as text.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{lock, Hold, Pwq, Table, WqShared};
use crate::{busy, watchdog, Workqueue};

/// A workqueue's state (from [`Workqueue::dump`]). A snapshot taken without stopping
/// anything: counts may move while it is taken.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkqueueDump {
    /// The workqueue.
    pub name: String,
    /// Whether it is ordered.
    pub ordered: bool,
    /// Whether it is frozen ([`Workqueue::freeze`]): its items wait until it thaws.
    #[serde(default)]
    pub frozen: bool,
    /// Its `max_active` and `min_active`.
    pub max_active: usize,
    /// See `max_active`.
    pub min_active: usize,
    /// Items in flight (queued, waiting for a slot, running) on all its pwqs.
    pub in_flight: u64,
    /// Its pool_workqueues, oldest first.
    pub pwqs: Vec<PwqDump>,
    /// Its items running now.
    pub running: Vec<RunningItem>,
    /// The pools its pwqs use.
    pub pools: Vec<PoolDump>,
    /// Which pool serves each CPU of the effective cpumask (the CPU → pool map).
    pub cpu_pools: Vec<CpuPool>,
    /// The pool of the pwq spanning the whole cpumask (`dfl_pwq`).
    pub default_pool: Option<u64>,
    /// Active items against each node's share of `max_active` (`node_nr/max`).
    pub nodes: Vec<NodeActiveDump>,
}

/// One CPU's pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CpuPool {
    /// The CPU (topology numbering).
    pub cpu: usize,
    /// The pool serving it.
    pub pool: u64,
}

/// One node's active items and limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NodeActiveDump {
    /// The node; `None` for the counter of pools that span nodes.
    pub node: Option<usize>,
    /// Active items counted on it.
    pub nr: usize,
    /// Its share of `max_active`.
    pub max: usize,
}

/// One pool_workqueue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PwqDump {
    /// Its pool.
    pub pool: u64,
    /// Whether the CPU table points at it (otherwise it retires once empty).
    pub current: bool,
    /// Items in flight on it.
    pub in_flight: u64,
    /// Of those, items waiting for an active slot.
    pub inactive: usize,
    /// Ordered workqueues: held back until older pwqs are gone.
    pub plugged: bool,
    /// References held on it (the table, queued items, the workqueue's list).
    pub refs: usize,
}

/// An item running now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RunningItem {
    /// The pool whose worker runs it.
    pub pool: u64,
    /// Its label ([`crate::Work::named`]).
    pub label: Option<String>,
    /// The thread running it.
    pub thread: String,
    /// How long it has run, as the stall watchdog has seen it (`None`: for less than
    /// one watchdog period).
    pub running_for: Option<Duration>,
}

/// A pool the workqueue uses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PoolDump {
    /// The pool id.
    pub id: u64,
    /// Its pod's CPUs (topology numbering), as a list.
    pub pod_cpus: String,
    /// Whether its workers stay in the pod.
    pub strict: bool,
    /// Its workers' nice value.
    pub nice: i32,
    /// Workers, and of them idle ones.
    pub workers: usize,
    /// See `workers`.
    pub idle: usize,
    /// Workers counted as running items: at most one per pod CPU, besides those in
    /// `blocking` sections and those whose item ran past the CPU-intensive threshold
    /// ([`crate::watchdog::set_cpu_intensive_threshold`]), which do not count.
    #[serde(default)]
    pub running: usize,
    /// Workers out of the running count for an item past the CPU-intensive threshold:
    /// at most one per pod CPU.
    #[serde(default)]
    pub out_for_long_items: usize,
    /// Items on its worklist (active, not yet taken by a worker).
    pub worklist: usize,
    /// How long it has had pending items and no worker progress, as the stall
    /// watchdog saw it at its last look (`None`: it was making progress).
    pub no_progress_for: Option<Duration>,
}

impl Workqueue {
    /// The workqueue's state, as the kernel's `show_workqueue_state` prints it: its
    /// pool_workqueues (in flight, inactive, plugged, references), its running items
    /// (label, thread, for how long) and its pools (workers, idle ones, worklist, how
    /// long without progress). `Display` gives the text `podq ctl dump` prints.
    ///
    /// ```
    /// let wq = podq::Workqueue::builder("doc-dump").build()?;
    /// let text = wq.dump().to_string();
    /// assert!(text.starts_with("workqueue doc-dump:"), "{text}");
    /// assert_eq!(wq.dump().in_flight, 0);
    /// # Ok::<(), podq::Error>(())
    /// ```
    pub fn dump(&self) -> WorkqueueDump {
        self.shared().dump()
    }
}

impl WqShared {
    pub(crate) fn dump(&self) -> WorkqueueDump {
        let attrs = lock(&self.config).attrs.clone();
        let table: Arc<Table> = self.table.load();
        let pwqs: Vec<Arc<Pwq>> = lock(&self.pwqs).clone();
        let now = Instant::now();
        let is_current = |pwq: &Arc<Pwq>| {
            table
                .cpu_pwq
                .iter()
                .flatten()
                .chain(table.dfl.iter())
                .any(|p| Arc::ptr_eq(p, pwq))
        };
        let mut pools: Vec<PoolDump> = Vec::new();
        let pwq_dumps: Vec<PwqDump> = pwqs
            .iter()
            .map(|pwq| {
                let core = &pwq.pool.core;
                if pools.iter().all(|p| p.id != core.id) {
                    let (workers, idle) = core.worker_counts();
                    let (running, out_for_long_items) = core.running_workers();
                    pools.push(PoolDump {
                        id: core.id,
                        pod_cpus: core.key.pod.to_list(),
                        strict: core.key.strict,
                        nice: core.key.nice,
                        workers,
                        idle,
                        running,
                        out_for_long_items,
                        worklist: core.worklist_len(),
                        no_progress_for: watchdog::stuck_since(core.id).map(|t| now - t),
                    });
                }
                let (inactive, plugged) = {
                    let st = lock(&pwq.state);
                    (st.inactive.len(), st.hold == Hold::Plugged)
                };
                PwqDump {
                    pool: core.id,
                    current: is_current(pwq),
                    in_flight: pwq.in_flight.total(),
                    inactive,
                    plugged,
                    // Less this function's own clone.
                    refs: Arc::strong_count(pwq) - 1,
                }
            })
            .collect();
        let running = busy::running()
            .into_iter()
            .filter(|l| l.wq == self.id)
            .map(|l| RunningItem {
                pool: l.pool,
                label: l.label.as_deref().map(str::to_owned),
                running_for: watchdog::running_since(l.beat, l.word).map(|t| now - t),
                thread: l.thread,
            })
            .collect();
        let pool_of = |pwq: &Arc<Pwq>| pwq.pool.core.id;
        let cpu_pools = table
            .cpu_pwq
            .iter()
            .enumerate()
            .filter_map(|(cpu, pwq)| {
                pwq.as_ref().map(|p| CpuPool {
                    cpu,
                    pool: pool_of(p),
                })
            })
            .collect();
        let fallback = self.nodes.len() - 1;
        let nodes = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, counter)| {
                let (nr, max) = counter.active_of_max();
                let node = (i != fallback)
                    .then(|| self.node_index.iter().position(|&x| x == i))
                    .flatten();
                NodeActiveDump { node, nr, max }
            })
            .collect();
        WorkqueueDump {
            cpu_pools,
            default_pool: table.dfl.as_ref().map(pool_of),
            nodes,
            name: self.name.clone(),
            ordered: attrs.ordered,
            frozen: self.freeze.is_frozen(),
            max_active: attrs.max_active,
            min_active: attrs.min_active,
            in_flight: pwq_dumps.iter().map(|p| p.in_flight).sum(),
            pwqs: pwq_dumps,
            running,
            pools,
        }
    }
}

impl fmt::Display for WorkqueueDump {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "workqueue {}: {}{}max_active {} min_active {}, {} in flight",
            self.name,
            if self.frozen { "frozen, " } else { "" },
            if self.ordered { "ordered, " } else { "" },
            self.max_active,
            self.min_active,
            self.in_flight
        )?;
        for p in &self.pwqs {
            writeln!(
                f,
                "  pwq on pool {}: {}{} in flight, {} inactive{}, refs {}",
                p.pool,
                if p.current { "" } else { "retiring, " },
                p.in_flight,
                p.inactive,
                if p.plugged { ", plugged" } else { "" },
                p.refs
            )?;
        }
        for r in &self.running {
            let label = r
                .label
                .as_deref()
                .map_or(String::new(), |l| format!(" `{l}`"));
            let how_long = r
                .running_for
                .map_or("just started".to_owned(), |d| format!("for {d:.1?}"));
            writeln!(
                f,
                "  running{label} on pool {} thread {} {how_long}",
                r.pool, r.thread
            )?;
        }
        let mut by_pool: Vec<(u64, Vec<usize>)> = Vec::new();
        for c in &self.cpu_pools {
            match by_pool.iter_mut().find(|(p, _)| *p == c.pool) {
                Some((_, cpus)) => cpus.push(c.cpu),
                None => by_pool.push((c.pool, vec![c.cpu])),
            }
        }
        for (pool, cpus) in by_pool {
            let cpus: podq_topology::CpuSet = cpus.into_iter().collect();
            writeln!(f, "  cpus {} -> pool {pool}", cpus.to_list())?;
        }
        if let Some(pool) = self.default_pool {
            writeln!(f, "  default pool {pool}")?;
        }
        for n in &self.nodes {
            let node = n
                .node
                .map_or("nodes spanned".to_owned(), |id| format!("node {id}"));
            writeln!(f, "  {node}: {}/{} active", n.nr, n.max)?;
        }
        for p in &self.pools {
            let stuck = p
                .no_progress_for
                .map_or(String::new(), |d| format!(", no progress for {d:.1?}"));
            let out = match p.out_for_long_items {
                0 => String::new(),
                n => format!(" ({n} out of the count for a long item)"),
            };
            writeln!(
                f,
                "  pool {} (cpus {}{}, nice {}): {} workers, {} idle, {} counted running{out}, \
                 {} on the worklist{stuck}",
                p.id,
                p.pod_cpus,
                if p.strict { ", strict" } else { "" },
                p.nice,
                p.workers,
                p.idle,
                p.running,
                p.worklist
            )?;
        }
        Ok(())
    }
}

//! [`worker_pools`]: every worker pool of the process, as the pools table of the
//! kernel's `wq_dump.py` shows them (`podq ctl pools`).

use std::sync::{Arc, Weak};

use serde::{Deserialize, Serialize};

use super::lock;
use super::registry::pools;
use crate::pool::Pool;

/// One worker pool (from [`worker_pools`]): a snapshot taken without stopping it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkerPool {
    /// The pool id (its workers are named `podq/u<id>:<n>` by default).
    pub id: u64,
    /// The pool_workqueues that use it, of all workqueues (the kernel's `refcnt`).
    pub refs: usize,
    /// Its workers' nice value.
    pub nice: i32,
    /// Its workers, and of them idle ones.
    pub workers: usize,
    /// See `workers`.
    pub idle: usize,
    /// The CPUs its workers may run on: the pod if strict, else the workqueue's
    /// effective cpumask (topology numbering, as a list).
    pub cpus: String,
    /// Its pod's CPUs (as a list).
    pub pod_cpus: String,
    /// Whether its workers stay in the pod.
    pub strict: bool,
}

/// Every live worker pool of the process, by id: pools are shared by workqueues with
/// equal attributes, so this covers workqueues not made visible to the control server
/// too. CPU numbers are each pool's workqueue topology's (a workqueue built on a
/// synthetic topology has its own).
///
/// ```
/// let wq = podq::Workqueue::builder("doc-pools").scope(podq::Scope::System).build()?;
/// let pool = wq.dump().default_pool.expect("a default pool");
/// let pools = podq::worker_pools();
/// let mine = pools.iter().find(|p| p.id == pool).expect("listed");
/// assert!(mine.refs >= 1);
/// assert_eq!(mine.pod_cpus, wq.topology().usable().to_list());
/// # Ok::<(), podq::Error>(())
/// ```
pub fn worker_pools() -> Vec<WorkerPool> {
    // Upgraded under the registry lock, read without it (the pool lock is a leaf
    // after it, but not needed meanwhile).
    let live: Vec<Arc<Pool>> = lock(pools()).values().filter_map(Weak::upgrade).collect();
    let mut out: Vec<WorkerPool> = live
        .iter()
        .map(|pool| {
            let core = &pool.core;
            let (workers, idle) = core.worker_counts();
            WorkerPool {
                id: core.id,
                // Less this function's own reference.
                refs: Arc::strong_count(pool) - 1,
                nice: core.key.nice,
                workers,
                idle,
                cpus: core.key.cpumask.as_ref().unwrap_or(&core.key.pod).to_list(),
                pod_cpus: core.key.pod.to_list(),
                strict: core.key.strict,
            }
        })
        .collect();
    out.sort_by_key(|p| p.id);
    for pool in live {
        // Its last pwq went meanwhile, and with it the teardown that would have joined
        // its workers saw it still alive: stop it here and join them as teardown does
        // (not from inside an item, with no lock held).
        if let Some(last) = Arc::into_inner(pool) {
            let core = Arc::clone(&last.core);
            drop(last);
            if crate::pool::current_wq() == 0 {
                core.join_if_stopped();
            }
        }
    }
    out
}

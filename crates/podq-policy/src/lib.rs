//! Every podq decision as a small pure function over plain values.
//!
//! The threaded runtime (`podq`, which re-exports this crate as `podq::policy`) calls
//! these on its hot paths and the simulator (`podq-sim`) calls the same functions on a
//! virtual clock, so none of them touches a thread, a lock, an atomic, a clock or a
//! global: state the mechanism owns comes in as a value.
//! Kernel names are given where a function mirrors one (see `reference/kernel-workqueue.md`).

use std::time::Duration;

use podq_topology::{CpuSet, Topology};

/// The kernel's `WQ_MAX_ACTIVE`: the largest `max_active`.
pub const WQ_MAX_ACTIVE: usize = 2048;
/// The kernel's `WQ_DFL_ACTIVE`: `max_active` when none is given.
pub const WQ_DFL_ACTIVE: usize = 1024;
/// The kernel's `WQ_DFL_MIN_ACTIVE`: the per-node forward-progress floor.
pub const WQ_DFL_MIN_ACTIVE: usize = 8;
/// The kernel's `IDLE_WORKER_TIMEOUT`: idle workers older than this may be reaped.
pub const IDLE_WORKER_TIMEOUT: Duration = Duration::from_secs(300);
/// The kernel's `MAX_IDLE_WORKERS_RATIO`.
pub const MAX_IDLE_WORKERS_RATIO: usize = 4;
/// Hard cap on the threads of one pool, blocked ones included.
///
/// The kernel has no cap: an unbound pool grows to one worker per active item, bounded
/// only by `max_active` (up to 2048 per workqueue, and a pool is shared by many). Kernel
/// threads are cheap and the scheduler sees them sleep; user threads cost a stack each
/// and podq cannot see them sleep. So podq runs at most one *running* worker per pod CPU
/// (see [`kick`]) and lets `podq::blocking` sections add workers, up to this cap, so a
/// storm of blocking items cannot exhaust the process's threads.
pub const POOL_MAX_WORKERS: usize = 512;
/// How long a worker that found the worklist empty polls it before going idle (see
/// [`kick`]). Short enough that an idle pool costs next to nothing; long enough to
/// cover a producer's turnaround between two items.
pub const IDLE_SPIN: Duration = Duration::from_micros(20);
/// The valid range of `nice`, as the kernel's sysfs file.
pub const NICE_RANGE: std::ops::RangeInclusive<i32> = -20..=19;

/// The kernel's `min_active` default: `min(max_active, WQ_DFL_MIN_ACTIVE)`.
pub fn min_active(max_active: usize) -> usize {
    max_active.min(WQ_DFL_MIN_ACTIVE)
}

/// Whether `value` is a valid `max_active` (`1..=WQ_MAX_ACTIVE`). The kernel clamps
/// out-of-range values with a warning; podq refuses them so a typo is not silently
/// turned into a different limit.
pub fn valid_max_active(value: usize) -> bool {
    (1..=WQ_MAX_ACTIVE).contains(&value)
}

/// The per-node share of a system-wide `max_active` (`wq_update_node_max_active`):
/// `clamp(ceil(max_active * node_cpus / total_cpus), min_active, max_active)`, or
/// `min_active` when the workqueue has no CPU at all. The shares may sum to more than
/// `max_active`, as in the kernel.
pub fn node_max_active(
    max_active: usize,
    min_active: usize,
    node_cpus: usize,
    total_cpus: usize,
) -> usize {
    if total_cpus == 0 {
        return min_active;
    }
    let share = (max_active * node_cpus).div_ceil(total_cpus);
    share.clamp(min_active.min(max_active), max_active)
}

/// Whether one more item may become active on a node counter holding `nr` of `max`.
pub fn may_activate(nr: usize, max: usize) -> bool {
    nr < max
}

/// Where a newly queued item of a pool_workqueue goes (`__queue_work` step 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Straight onto the pool's worklist, taking an active slot.
    Activate,
    /// Behind the pwq's inactive items, to wait for a slot in FIFO order.
    Wait,
}

/// Admission of a new item: it becomes active only when nothing of its pwq waits before
/// it (no overtaking), the pwq is not plugged (ordered attribute change) and not already
/// waiting for a slot, and a node slot is free.
pub fn admission(
    inactive_empty: bool,
    plugged: bool,
    pwq_waiting: bool,
    slot_free: bool,
) -> Admission {
    if inactive_empty && !plugged && !pwq_waiting && slot_free {
        Admission::Activate
    } else {
        Admission::Wait
    }
}

/// `wq_select_unbound_cpu`: the CPU whose pod a `queue()` call uses. The local CPU when
/// it is in the workqueue's unbound mask; otherwise round-robin after `rr_last` within
/// the mask (the caller stores the result as the next `rr_last`); the local CPU if the
/// mask is empty.
pub fn select_cpu(local: usize, unbound: &CpuSet, rr_last: Option<usize>) -> usize {
    if unbound.contains(local) {
        return local;
    }
    let after = rr_last.map_or(0, |c| c + 1);
    unbound
        .iter()
        .find(|&c| c >= after)
        .or_else(|| unbound.first())
        .unwrap_or(local)
}

/// `select_numa_node_cpu`: the CPU `queue_node(node)` uses, or `None` for "as
/// `queue()`". `node_cpus` are the usable CPUs of the node (empty for an unknown node).
pub fn select_node_cpu(
    local: usize,
    local_node: Option<usize>,
    node: usize,
    node_cpus: &CpuSet,
) -> Option<usize> {
    if node_cpus.is_empty() {
        return None;
    }
    if local_node == Some(node) && node_cpus.contains(local) {
        return Some(local);
    }
    node_cpus.first()
}

/// The effective cpumask of a workqueue: the requested mask within the usable CPUs.
/// `None` when they do not meet (the kernel falls back to the global mask; podq refuses
/// the change instead, see the crate docs).
pub fn effective_cpumask(requested: &CpuSet, usable: &CpuSet) -> Option<CpuSet> {
    let mask = requested.intersection(usable);
    (!mask.is_empty()).then_some(mask)
}

/// `wq_calc_pod_cpumask`: the pod's CPUs within the effective mask, or the whole mask
/// when the pod has none of them.
pub fn pod_cpumask(pod_cpus: &CpuSet, effective: &CpuSet) -> CpuSet {
    let mask = pod_cpus.intersection(effective);
    if mask.is_empty() {
        effective.clone()
    } else {
        mask
    }
}

/// The NUMA node a pool charges its active items to: the node holding all of its pod
/// CPUs, or `None` (the fallback counter) when they span nodes.
pub fn pool_node(pod: &CpuSet, node_of: impl Fn(usize) -> Option<usize>) -> Option<usize> {
    let mut nodes = pod.iter().map(node_of);
    let first = nodes.next()??;
    nodes.all(|n| n == Some(first)).then_some(first)
}

/// A pool's load, as [`kick`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolLoad {
    /// Items on the worklist.
    pub worklist: usize,
    /// Idle workers.
    pub idle: usize,
    /// Workers running or about to run items, not counting those inside `blocking()`.
    pub running: usize,
    /// All workers, idle and blocked ones included.
    pub workers: usize,
    /// How many workers may run at once (one per pod CPU).
    pub concurrency: usize,
    /// Workers that found the worklist empty and poll it for a moment before going
    /// idle (counted in `running`): each will take one waiting item without a wake-up.
    pub spinning: usize,
}

/// What to do after queueing onto, or starting an item from, a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kick {
    /// Nothing: no waiting item, or enough workers are running.
    Nothing,
    /// Wake one idle worker ([`pick_idle`] chooses which).
    Wake,
    /// Start a new worker thread.
    Create,
}

/// `kick_pool`, adapted: wake an idle worker while items wait and fewer than
/// `concurrency` workers run; create one when none is idle and the pool is under
/// [`POOL_MAX_WORKERS`]. Called on every queue and on every item start, so wake-ups
/// chain through a pool as in the kernel.
///
/// Departure from the kernel: items that spinning workers will take (up to one each)
/// need no wake-up, so a pool kicks only for items beyond [`PoolLoad::spinning`].
/// The kernel never spins; a user-space futex wake-up costs two context switches,
/// which a worker polling for [`IDLE_SPIN`] saves when items arrive back to back.
pub fn kick(load: PoolLoad) -> Kick {
    if load.worklist <= load.spinning || load.running >= load.concurrency {
        Kick::Nothing
    } else if load.idle > 0 {
        Kick::Wake
    } else if load.workers < POOL_MAX_WORKERS {
        Kick::Create
    } else {
        Kick::Nothing
    }
}

/// The idle worker to wake: a position among the `idle` idle workers (oldest first,
/// `last_cpu(i)` giving the last CPU of the `i`-th) and whether waking it is a
/// repatriation.
///
/// Strict pools wake the most recently idled worker (LIFO, its cache is warm). Non-strict
/// pools wake the most recently idled worker whose last CPU is in the pod; if none is,
/// the most recently idled one, counted as a repatriation (the worker then moves itself
/// back into the pod, standing in for the kernel's `wake_cpu` nudge). `None` if no
/// worker is idle.
pub fn pick_idle(
    idle: usize,
    last_cpu: impl Fn(usize) -> usize,
    pod: &CpuSet,
    strict: bool,
) -> Option<(usize, bool)> {
    let newest = idle.checked_sub(1)?;
    if strict {
        return Some((newest, false));
    }
    match (0..idle).rev().find(|&i| pod.contains(last_cpu(i))) {
        Some(i) => Some((i, false)),
        None => Some((newest, true)),
    }
}

/// `too_many_workers`: `nr_idle > 2 && (nr_idle - 2) * 4 >= nr_busy`.
pub fn too_many_workers(nr_idle: usize, nr_busy: usize) -> bool {
    nr_idle > 2 && (nr_idle - 2) * MAX_IDLE_WORKERS_RATIO >= nr_busy
}

/// Whether the oldest idle worker, idle for `idle_for`, should exit now.
pub fn should_reap(nr_idle: usize, nr_busy: usize, idle_for: Duration, timeout: Duration) -> bool {
    idle_for >= timeout && too_many_workers(nr_idle, nr_busy)
}

/// Where an item ran relative to where it was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locality {
    /// The same CPU.
    SameCpu,
    /// Another thread of the same core.
    SameSmt,
    /// Another core sharing the last-level cache.
    SameLlc,
    /// Another LLC of the same NUMA node.
    SameNode,
    /// Another node (or a CPU unknown to the topology).
    Remote,
}

/// Classifies `ran` relative to `queued` in `topology`.
pub fn locality(topology: &Topology, queued: usize, ran: usize) -> Locality {
    if queued == ran {
        return Locality::SameCpu;
    }
    let (Some(q), Some(r)) = (topology.get(queued), topology.get(ran)) else {
        return Locality::Remote;
    };
    if q.smt.contains(ran) {
        Locality::SameSmt
    } else if q.llc.contains(ran) {
        Locality::SameLlc
    } else if q.node == r.node {
        Locality::SameNode
    } else {
        Locality::Remote
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podq_topology::CpuFacts;

    fn set(cpus: &[usize]) -> CpuSet {
        cpus.iter().copied().collect()
    }

    #[test]
    fn node_shares_follow_the_kernel_formula() {
        // 2 nodes of 4 CPUs, max 16: each gets ceil(16*4/8) = 8.
        assert_eq!(node_max_active(16, 8, 4, 8), 8);
        // Uneven: 3 of 8 CPUs -> ceil(48/8)=6, clamped up to min_active 8.
        assert_eq!(node_max_active(16, 8, 3, 8), 8);
        // ceil rounding: 10 * 1 / 3 = 3.33 -> 4.
        assert_eq!(node_max_active(10, 1, 1, 3), 4);
        // Clamped to max_active.
        assert_eq!(node_max_active(4, 4, 8, 8), 4);
        // No CPU at all: min_active.
        assert_eq!(node_max_active(100, 8, 0, 0), 8);
        // Shares may sum to more than max_active.
        let total: usize = (0..3).map(|_| node_max_active(10, 8, 1, 3)).sum();
        assert!(total > 10);
        // min_active larger than max_active never exceeds max_active.
        assert_eq!(node_max_active(2, 8, 1, 4), 2);
    }

    #[test]
    fn max_active_bounds() {
        assert!(!valid_max_active(0));
        assert!(valid_max_active(1));
        assert!(valid_max_active(WQ_MAX_ACTIVE));
        assert!(!valid_max_active(WQ_MAX_ACTIVE + 1));
        assert_eq!(min_active(1), 1);
        assert_eq!(min_active(WQ_DFL_ACTIVE), WQ_DFL_MIN_ACTIVE);
    }

    #[test]
    fn admission_never_overtakes() {
        assert_eq!(admission(true, false, false, true), Admission::Activate);
        assert_eq!(admission(false, false, false, true), Admission::Wait);
        assert_eq!(admission(true, true, false, true), Admission::Wait);
        assert_eq!(admission(true, false, true, true), Admission::Wait);
        assert_eq!(admission(true, false, false, false), Admission::Wait);
        assert!(may_activate(0, 1));
        assert!(!may_activate(1, 1));
    }

    #[test]
    fn cpu_selection() {
        let mask = set(&[2, 3, 6]);
        assert_eq!(select_cpu(3, &mask, None), 3);
        assert_eq!(select_cpu(0, &mask, None), 2);
        assert_eq!(select_cpu(0, &mask, Some(2)), 3);
        assert_eq!(select_cpu(0, &mask, Some(3)), 6);
        assert_eq!(select_cpu(0, &mask, Some(6)), 2, "wraps around");
        assert_eq!(select_cpu(5, &CpuSet::new(), None), 5);
        let node = set(&[4, 5]);
        assert_eq!(select_node_cpu(5, Some(1), 1, &node), Some(5));
        assert_eq!(select_node_cpu(0, Some(0), 1, &node), Some(4));
        assert_eq!(select_node_cpu(0, Some(0), 9, &CpuSet::new()), None);
    }

    #[test]
    fn pod_masks() {
        let eff = set(&[0, 1, 2, 3]);
        assert_eq!(pod_cpumask(&set(&[2, 3, 4]), &eff), set(&[2, 3]));
        assert_eq!(
            pod_cpumask(&set(&[6, 7]), &eff),
            eff,
            "widens to the whole mask"
        );
        assert_eq!(effective_cpumask(&set(&[1, 9]), &eff), Some(set(&[1])));
        assert_eq!(effective_cpumask(&set(&[9]), &eff), None);
        let node_of = |c: usize| Some(c / 2);
        assert_eq!(pool_node(&set(&[2, 3]), node_of), Some(1));
        assert_eq!(pool_node(&set(&[1, 2]), node_of), None);
        assert_eq!(pool_node(&CpuSet::new(), node_of), None);
    }

    #[test]
    fn kicking() {
        let load = PoolLoad {
            worklist: 1,
            idle: 1,
            running: 0,
            workers: 1,
            concurrency: 2,
            spinning: 0,
        };
        assert_eq!(kick(load), Kick::Wake);
        // A spinning worker takes the item; a second item needs a wake-up.
        let spun = PoolLoad {
            spinning: 1,
            running: 1,
            ..load
        };
        assert_eq!(kick(spun), Kick::Nothing);
        assert_eq!(
            kick(PoolLoad {
                worklist: 2,
                ..spun
            }),
            Kick::Wake
        );
        assert_eq!(
            kick(PoolLoad {
                worklist: 2,
                concurrency: 1,
                ..spun
            }),
            Kick::Nothing
        );
        assert_eq!(
            kick(PoolLoad {
                worklist: 0,
                ..load
            }),
            Kick::Nothing
        );
        assert_eq!(kick(PoolLoad { running: 2, ..load }), Kick::Nothing);
        assert_eq!(kick(PoolLoad { idle: 0, ..load }), Kick::Create);
        assert_eq!(
            kick(PoolLoad {
                idle: 0,
                workers: POOL_MAX_WORKERS,
                ..load
            }),
            Kick::Nothing
        );
    }

    #[test]
    fn idle_picking_is_lifo_and_repatriates() {
        let pod = set(&[0, 1]);
        let pick = |cpus: &[usize], strict| pick_idle(cpus.len(), |i| cpus[i], &pod, strict);
        assert_eq!(pick(&[], true), None);
        assert_eq!(pick(&[], false), None);
        assert_eq!(pick(&[5, 0, 7], true), Some((2, false)));
        assert_eq!(pick(&[5, 0, 7], false), Some((1, false)));
        assert_eq!(pick(&[1, 0, 7], false), Some((1, false)), "newest in pod");
        assert_eq!(pick(&[5, 7], false), Some((1, true)));
    }

    #[test]
    fn reaping() {
        assert!(!too_many_workers(2, 0));
        assert!(too_many_workers(3, 0));
        assert!(too_many_workers(3, 4));
        assert!(!too_many_workers(3, 5));
        let t = Duration::from_secs(300);
        assert!(!should_reap(3, 0, Duration::from_secs(299), t));
        assert!(should_reap(3, 0, t, t));
        assert!(!should_reap(2, 0, t, t));
    }

    #[test]
    fn locality_classes() {
        // 2 nodes x 1 LLC x 2 cores x 2 threads, linear siblings.
        let facts = (0..8).map(|c| {
            let core = c / 2;
            let node = c / 4;
            (
                c,
                CpuFacts {
                    smt: set(&[core * 2, core * 2 + 1]),
                    llc: (node * 4..node * 4 + 4).collect(),
                    node,
                    package: node,
                },
            )
        });
        let topo = Topology::from_parts(CpuSet::first_n(8), CpuSet::first_n(8), facts).unwrap();
        assert_eq!(locality(&topo, 0, 0), Locality::SameCpu);
        assert_eq!(locality(&topo, 0, 1), Locality::SameSmt);
        assert_eq!(locality(&topo, 0, 2), Locality::SameLlc);
        assert_eq!(locality(&topo, 0, 5), Locality::Remote);
        assert_eq!(locality(&topo, 0, 99), Locality::Remote);
    }
}

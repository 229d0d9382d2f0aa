//! Workers: wake or create, which idle worker, spinning and reaping.

use std::time::Duration;

use podq_topology::CpuSet;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn set(cpus: &[usize]) -> CpuSet {
        cpus.iter().copied().collect()
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
}

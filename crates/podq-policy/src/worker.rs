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

/// The kernel's `wq_cpu_intensive_thresh_us` default: a worker that has run one item
/// this long stops counting towards its pool's running workers ([`cpu_intensive`]).
pub const CPU_INTENSIVE_THRESHOLD: Duration = Duration::from_millis(10);

/// Whether a worker that has run one item for `ran` stops counting towards its pool's
/// running workers, so that the pool may wake or start another for the items waiting
/// behind it (`threshold`: [`CPU_INTENSIVE_THRESHOLD`] by default, `None`: never).
///
/// The kernel marks such a worker `WORKER_CPU_INTENSIVE` from the scheduler tick on
/// per-CPU pools; its unbound pools need no such rule, as they run a worker for every
/// item the scheduler sees waiting. podq caps running workers at one per pod CPU and
/// cannot see a worker sleep or spin, so one long item (computing, or waiting outside
/// `podq::blocking`) would hold its pod's only slot for its whole run; this rule gives
/// the slot back after `threshold`.
pub fn cpu_intensive(ran: Duration, threshold: Option<Duration>) -> bool {
    threshold.is_some_and(|t| ran >= t)
}

/// Whether one more worker of a pool of `concurrency` running workers may leave the
/// count for a long item ([`cpu_intensive`]) while `out` of its workers are out for one
/// already: at most as many as the pool's CPUs, so a pool runs at most twice its CPUs
/// of workers outside `podq::blocking` sections. The kernel has no such bound (its
/// `max_active` bounds the workers an unbound pool runs); here a flood of long
/// computing items would otherwise add a thread every threshold, up to
/// [`POOL_MAX_WORKERS`], all sharing the pod's CPUs. One extra worker per CPU is what
/// the cases the rule exists for need: items queued after a long one, and an item that
/// waits (without `podq::blocking`) for one queued behind it.
pub fn may_leave_count(out: usize, concurrency: usize) -> bool {
    out < concurrency
}

/// How often the runtime looks for items that ran past `threshold` while any worker
/// runs one: half of it, so a long item leaves the count between one and one and a
/// half thresholds after it started (at least 1 ms apart).
pub fn cpu_intensive_look_period(threshold: Duration) -> Duration {
    (threshold / 2).max(Duration::from_millis(1))
}

/// How long no worker may start an item before the runtime stops looking for long ones
/// at [`cpu_intensive_look_period`] and looks only as often as its stall watchdog; a
/// worker woken from idle then wakes it. Long enough that a steady stream of items
/// (one per millisecond, say) never pays for that wake-up; short enough that an idle
/// process does not wake every few milliseconds for long.
pub const CPU_INTENSIVE_DOZE_AFTER: Duration = Duration::from_millis(100);

/// How long a worker that found the worklist empty polls it before going idle (see
/// [`kick`]). Short enough that an idle pool costs next to nothing; long enough to
/// cover a producer's turnaround between two items.
pub const IDLE_SPIN: Duration = Duration::from_micros(20);

/// How a spinning worker polls its worklist during [`IDLE_SPIN`]: this many looks a
/// pause instruction apart, then looks a `sched_yield` apart until the budget ends.
///
/// In a pod of several CPUs (`pod_cpus`), eagerly ([`EAGER_POLL_PAUSES`]): a producer
/// on another of its CPUs may queue the next item, and pausing here costs it nothing.
/// A pod of one CPU is fed by producers on that CPU (a queue call picks its own CPU's
/// pod), and by other workers' completions during a `backlog` (items of the workqueue
/// whose completions the worker settled last wait for a `max_active` slot on their
/// node: a flood, whose slots free up microseconds apart). Then:
/// - another worker polls on the same CPU already (`cpu_shared`, asked only here: many
///   one-CPU pools on few CPUs): no pauses; a second pause loop there only keeps a
///   runnable thread off the CPU. The worker still polls, yielding, so that a queuer
///   needs no wake-up;
/// - a backlog: eagerly, as the next completion elsewhere will feed it;
/// - otherwise politely ([`POLITE_POLL_PAUSES`]): the producer that feeds the pool
///   shares the worker's CPU and cannot run while the worker pauses there.
///
/// Measured on a 2-CPU machine (`PERFORMANCE.md`), against 64 pauses for every
/// spinner: the closed loop on one-CPU pods 15–17% faster, re-queued items about 4%,
/// 64 and 256 pools 8% and 32%, floods and `system`'s closed loop unchanged within
/// the noise; fewer pauses for every spinner lost up to 16% in floods and 17% in
/// `system`'s closed loop. The simulator's workers poll
/// without yielding (a spinning worker holds its virtual CPU for the budget), so it
/// has no use for this.
pub fn poll_pauses(backlog: bool, pod_cpus: usize, cpu_shared: impl FnOnce() -> bool) -> u32 {
    if pod_cpus > 1 {
        EAGER_POLL_PAUSES
    } else if cpu_shared() {
        0
    } else if backlog {
        EAGER_POLL_PAUSES
    } else {
        POLITE_POLL_PAUSES
    }
}

/// [`poll_pauses`] where the next item may come from another CPU.
pub const EAGER_POLL_PAUSES: u32 = 64;

/// [`poll_pauses`] where only producers on the worker's CPU feed it.
pub const POLITE_POLL_PAUSES: u32 = 32;

// Eager polls longer; polite is not "never pause": a worker alone on its CPU still looks
// a pause apart for a while, as a producer on another CPU queues its next item.
const _: () = assert!(EAGER_POLL_PAUSES > POLITE_POLL_PAUSES && POLITE_POLL_PAUSES > 0);

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

/// [`kick`] while worker creation is cooling down after a failure (the kernel's
/// `CREATE_COOLDOWN`): no new worker is created then, so a thread limit does not cause a
/// storm of failing creations; the retry at the end of the cooldown kicks the pool
/// again. `cooling` is asked only when the kick would create. Waking is unaffected.
pub fn kick_cooled(kick: Kick, cooling: impl FnOnce() -> bool) -> Kick {
    if kick == Kick::Create && cooling() {
        Kick::Nothing
    } else {
        kick
    }
}

/// What a worker that found its pool's worklist empty does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleStep {
    /// Poll the worklist for at most this long, then look again under the lock.
    Spin(Duration),
    /// Join the idle list and park until woken, reaped or shut down.
    Park,
}

/// Spin or park: a worker spins once, for `budget`, after each item it ran (`spun`:
/// it already spun since); a zero budget never spins. Departure from the kernel, which
/// never spins (see [`kick`]); [`IDLE_SPIN`] is the runtime's budget.
pub fn idle_step(spun: bool, budget: Duration) -> IdleStep {
    if spun || budget.is_zero() {
        IdleStep::Park
    } else {
        IdleStep::Spin(budget)
    }
}

/// A pool's idle workers, as reaping sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleWorkers {
    /// Idle workers.
    pub idle: usize,
    /// All workers, idle ones included.
    pub workers: usize,
    /// How long the oldest idle worker has been idle.
    pub oldest_idle_for: Duration,
}

/// Reaping (`idle_worker_timeout`): the position in the idle list (oldest first) of the
/// worker that should exit now, if any. Only the oldest idle worker is reaped, and only
/// once it has been idle for `timeout` while the pool has too many idle workers
/// ([`too_many_workers`]); workers past the first keep waiting, and the next one is
/// looked at when its own timeout expires.
pub fn reap(pool: IdleWorkers, timeout: Duration) -> Option<usize> {
    let busy = pool.workers.saturating_sub(pool.idle);
    should_reap(pool.idle, busy, pool.oldest_idle_for, timeout).then_some(0)
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
    fn at_most_one_worker_per_cpu_is_out_of_the_count() {
        assert!(may_leave_count(0, 1));
        assert!(!may_leave_count(1, 1));
        assert!(may_leave_count(3, 4));
        assert!(!may_leave_count(4, 4));
    }

    #[test]
    fn a_long_item_leaves_the_count_at_its_threshold_and_never_without_one() {
        let t = Some(CPU_INTENSIVE_THRESHOLD);
        assert!(!cpu_intensive(Duration::from_micros(9_999), t));
        assert!(cpu_intensive(Duration::from_millis(10), t));
        assert!(!cpu_intensive(Duration::from_secs(3600), None));
        assert_eq!(
            cpu_intensive_look_period(CPU_INTENSIVE_THRESHOLD),
            Duration::from_millis(5)
        );
        assert_eq!(
            cpu_intensive_look_period(Duration::from_millis(1)),
            Duration::from_millis(1)
        );
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
    fn cooldown_blocks_only_creation() {
        assert_eq!(kick_cooled(Kick::Create, || true), Kick::Nothing);
        assert_eq!(kick_cooled(Kick::Create, || false), Kick::Create);
        assert_eq!(kick_cooled(Kick::Wake, || panic!("not asked")), Kick::Wake);
        assert_eq!(
            kick_cooled(Kick::Nothing, || panic!("not asked")),
            Kick::Nothing
        );
    }

    #[test]
    fn spin_once_then_park() {
        let budget = Duration::from_micros(20);
        assert_eq!(idle_step(false, budget), IdleStep::Spin(budget));
        assert_eq!(idle_step(true, budget), IdleStep::Park);
        assert_eq!(idle_step(false, Duration::ZERO), IdleStep::Park);
    }

    #[test]
    fn pausing_serves_items_from_other_cpus_and_yields_to_the_producer_here() {
        let unasked = || -> bool { panic!("only a one-CPU pod asks") };
        // A pod of several CPUs: always eager, and the CPU's other pollers not asked.
        assert_eq!(poll_pauses(false, 2, unasked), EAGER_POLL_PAUSES);
        assert_eq!(poll_pauses(true, 48, unasked), EAGER_POLL_PAUSES);
        // A one-CPU pod: a backlog feeds it from elsewhere; without one its producer
        // shares the CPU.
        assert_eq!(poll_pauses(true, 1, || false), EAGER_POLL_PAUSES);
        assert_eq!(poll_pauses(false, 1, || false), POLITE_POLL_PAUSES);
        // Another worker polls on this CPU already: no pauses.
        assert_eq!(poll_pauses(true, 1, || true), 0);
        assert_eq!(poll_pauses(false, 1, || true), 0);
    }

    #[test]
    fn reaps_the_oldest_surplus_worker() {
        let t = Duration::from_secs(300);
        let pool = |idle, workers, secs| IdleWorkers {
            idle,
            workers,
            oldest_idle_for: Duration::from_secs(secs),
        };
        assert_eq!(reap(pool(3, 3, 300), t), Some(0));
        assert_eq!(reap(pool(3, 3, 299), t), None, "not idle long enough");
        assert_eq!(reap(pool(2, 2, 900), t), None, "two idle workers are kept");
        // 3 idle, 4 busy: (3 - 2) * 4 >= 4.
        assert_eq!(reap(pool(3, 7, 300), t), Some(0));
        // 3 idle, 5 busy: (3 - 2) * 4 < 5, they may all be needed soon.
        assert_eq!(reap(pool(3, 8, 300), t), None);
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

//! What the `auto` controller reads: a workqueue's statistics over one window, per pod
//! and per place, and the pool counts both the runtime and the simulator take them from.

use podq_topology::CpuSet;
use serde::{Deserialize, Serialize};

/// One pod's statistics over a window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PodWindow {
    /// The pod's CPUs (its pool's pod mask).
    pub cpus: CpuSet,
    /// How many CPUs' worth of time the pod can use: its CPUs, or on a topology mapped
    /// onto fewer real CPUs, the real CPUs they run on. Busy and wait shares are of this.
    pub capacity: usize,
    /// Items queued onto the pod's pool.
    pub queued: u64,
    /// Items its workers started.
    pub started: u64,
    /// Items queued and not yet started at the end of the window.
    pub backlog: u64,
    /// Time its workers spent running items.
    pub busy_ns: u64,
    /// Pool-lock acquisitions (enqueue and dequeue).
    pub lock_acquisitions: u64,
    /// Of those, the ones that found the lock held.
    pub lock_contended: u64,
    /// Time spent waiting in contended acquisitions.
    pub lock_wait_ns: u64,
}

/// One pool's counts since it was made, as the runtime's statistics and the
/// simulator keep them: a pod's window is the difference of two
/// ([`PodWindow::between`]), so both measure a window the same way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolCounts {
    /// Items queued onto the pool.
    pub queued: u64,
    /// Items its workers started.
    pub started: u64,
    /// Items its workers finished.
    pub finished: u64,
    /// Of the finished items, those whose run time was measured: every one in the
    /// simulator; in the runtime the items a weighted sample stands for (each measured
    /// item counted with its weight, `podq::Latency`), so a window's busy time is
    /// scaled from it to the finished items.
    pub measured: u64,
    /// The run time of the measured items (in the runtime, each times its weight).
    pub measured_run_ns: u64,
    /// Pool-lock acquisitions (enqueue and dequeue).
    pub lock_acquisitions: u64,
    /// Of those, the ones that found the lock held.
    pub lock_contended: u64,
    /// Time spent waiting in contended acquisitions.
    pub lock_wait_ns: u64,
}

impl PoolCounts {
    /// Time the pool's workers spent running the items finished between `before`
    /// and `self`: the window's measured run time times its finished items per
    /// measured one; a window without a measured item counts its finished items at
    /// the mean run time so far. Exact when every item is measured.
    pub fn busy_since(&self, before: &PoolCounts) -> u64 {
        let finished = self.finished.saturating_sub(before.finished);
        let measured = self.measured.saturating_sub(before.measured);
        let (run_ns, per) = if measured > 0 {
            (
                self.measured_run_ns.saturating_sub(before.measured_run_ns),
                measured,
            )
        } else {
            (self.measured_run_ns, self.measured)
        };
        if per == 0 {
            return 0;
        }
        let busy = u128::from(run_ns) * u128::from(finished) / u128::from(per);
        u64::try_from(busy).unwrap_or(u64::MAX)
    }
}

impl PodWindow {
    /// The window of the pod `cpus` (of `capacity` CPUs' worth of time) whose pool
    /// counted `before` at the window's start and `now` at its end, with `backlog`
    /// items queued and not started at the end.
    pub fn between(
        cpus: CpuSet,
        capacity: usize,
        backlog: u64,
        before: &PoolCounts,
        now: &PoolCounts,
    ) -> PodWindow {
        let d = |f: fn(&PoolCounts) -> u64| f(now).saturating_sub(f(before));
        PodWindow {
            cpus,
            capacity,
            queued: d(|c| c.queued),
            started: d(|c| c.started),
            backlog,
            busy_ns: now.busy_since(before),
            lock_acquisitions: d(|c| c.lock_acquisitions),
            lock_contended: d(|c| c.lock_contended),
            lock_wait_ns: d(|c| c.lock_wait_ns),
        }
    }
}

/// Where the window's items ran relative to where they were queued.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaceCounts {
    /// Same CPU, another SMT thread, or another core of the same LLC.
    pub same_llc: u64,
    /// Another LLC, or another node.
    pub off_llc: u64,
}

/// A workqueue's statistics over one window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// Length of the window.
    pub duration_ns: u64,
    /// Items finished in the window.
    pub completed: u64,
    /// One entry per pool of the scope in force; pools of other layouts (retiring after a
    /// switch) are ignored.
    pub pods: Vec<PodWindow>,
    /// Where items ran.
    pub places: PlaceCounts,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(finished: u64, measured: u64, measured_run_ns: u64) -> PoolCounts {
        PoolCounts {
            finished,
            measured,
            measured_run_ns,
            ..PoolCounts::default()
        }
    }

    #[test]
    fn busy_time_scales_the_measured_run_time_to_every_finished_item() {
        let before = counts(100, 10, 50_000);
        // 160 finished in the window, 10 of them measured at 1 µs each.
        assert_eq!(counts(260, 20, 60_000).busy_since(&before), 160_000);
        // None measured in the window: its 4 items at the mean so far (5 µs).
        assert_eq!(counts(104, 10, 50_000).busy_since(&before), 20_000);
        assert_eq!(before.busy_since(&before), 0);
        assert_eq!(
            counts(3, 0, 0).busy_since(&PoolCounts::default()),
            0,
            "nothing measured yet"
        );
        // Every item measured (the simulator): exact.
        assert_eq!(
            counts(107, 107, 1_234_567).busy_since(&counts(7, 7, 4_567)),
            1_230_000
        );
    }

    #[test]
    fn a_pods_window_is_the_difference_of_its_pools_counts() {
        let before = PoolCounts {
            queued: 10,
            started: 8,
            finished: 8,
            measured: 8,
            measured_run_ns: 800,
            lock_acquisitions: 20,
            lock_contended: 2,
            lock_wait_ns: 50,
        };
        let now = PoolCounts {
            queued: 25,
            started: 20,
            finished: 18,
            measured: 18,
            measured_run_ns: 2_000,
            lock_acquisitions: 50,
            lock_contended: 5,
            lock_wait_ns: 150,
        };
        let cpus = CpuSet::first_n(2);
        let w = PodWindow::between(cpus.clone(), 2, 5, &before, &now);
        assert_eq!(
            w,
            PodWindow {
                cpus,
                capacity: 2,
                queued: 15,
                started: 12,
                backlog: 5,
                busy_ns: 1_200,
                lock_acquisitions: 30,
                lock_contended: 3,
                lock_wait_ns: 100,
            }
        );
    }
}

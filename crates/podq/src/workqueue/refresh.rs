//! Re-reading the usable CPUs ([`refresh`]): the user-space counterpart of the kernel's
//! CPU hotplug handling (reference §4.4). A process learns that its CPUs changed (CPU
//! offline, affinity narrowed, cgroup cpuset shrunk) only when it looks, so podq looks
//! when asked.
//!
//! Steps: read online ∩ affinity ∩ cgroup cpuset; store it as the real CPUs usable now;
//! re-apply the attributes of every live workqueue built on the live machine, as an
//! attribute change does (`WqShared::apply`): new pwqs for the pods as they are now,
//! old pwqs keep and finish what they hold, and flush covers both. Nothing is lost.
//!
//! As in the kernel (`wq_calc_pod_cpumask`), a pod left with no usable CPU falls back
//! to the workqueue's whole effective cpumask, and a workqueue cpumask left with no
//! usable CPU falls back to all usable CPUs (the kernel's `wq_unbound_cpumask`); the
//! requested cpumask is kept and applies again once its CPUs come back.
//!
//! Races considered: an attribute change running at the same time reads the usable
//! CPUs under the workqueue's `config` lock, after the new set was stored or before the
//! refresh re-applies that workqueue, so the last apply always uses the new set. A
//! workqueue being built while a refresh runs may miss it (it is registered after its
//! first apply); the next refresh covers it.

use podq_topology::CpuSet;

use super::{live_workqueues, WqShared};
use crate::cpu;
use crate::sync::lock_std as lock;
use crate::Error;

/// Re-reads the CPUs this process may use (online ∩ the process's affinity mask, that
/// of its main thread ∩ the cgroup's effective cpuset) and re-pods every live
/// workqueue built on the live machine, without losing work: queued and running items
/// finish on their old pools. Returns the usable CPUs now.
///
/// Call it after the process's affinity (`taskset -p`) or cpuset changed. A workqueue
/// never uses CPUs beyond those of the topology it was built with; workqueues on a
/// given (fake or captured) topology are not affected. Departure: the kernel reacts to
/// hotplug events itself.
pub fn refresh() -> Result<CpuSet, Error> {
    refresh_with(cpu::read_usable()?)
}

/// [`refresh`] as if the machine reported `usable` (for tests: no CPU has to go away).
/// An empty set is refused ([`Error::EmptyCpumask`]).
pub fn refresh_with(usable: CpuSet) -> Result<CpuSet, Error> {
    if usable.is_empty() {
        return Err(Error::EmptyCpumask);
    }
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = lock(&SERIAL);
    cpu::set_real_cpus(usable.clone());
    let mut first_error = None;
    for wq in live_workqueues().into_iter().filter(|wq| wq.live) {
        let mut cfg = lock(&wq.config);
        let attrs = cfg.attrs.clone();
        match wq.apply(&mut cfg, attrs) {
            Ok(released) => {
                drop(cfg);
                drop(released);
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(usable),
    }
}

impl WqShared {
    /// The CPUs of its topology usable now: for a workqueue on the live machine, those
    /// still among the real usable CPUs (`policy::usable_now`); otherwise the
    /// topology's usable CPUs.
    pub(super) fn usable_now(&self) -> CpuSet {
        let all = self.topology.usable();
        if self.live {
            crate::policy::usable_now(all, &cpu::real_cpus())
        } else {
            all.clone()
        }
    }
}

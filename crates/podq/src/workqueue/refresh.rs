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

use std::fmt;

use podq_topology::{CpuSet, Topology};

use super::{live_workqueues, WqShared};
use crate::cpu;
use crate::sync::lock;
use crate::Error;

/// What a [`refresh`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refreshed {
    /// The CPUs usable now.
    pub usable: CpuSet,
    /// Live workqueues it deliberately left on their pods, with the reason.
    pub not_repodded: Vec<NotRepodded>,
}

/// A workqueue a [`refresh`] left alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotRepodded {
    /// Its name.
    pub workqueue: String,
    /// Why.
    pub reason: NotRepoddedReason,
}

/// Why a [`refresh`] left a workqueue alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotRepoddedReason {
    /// It was built on a topology that is not this machine (fake, synthetic or
    /// captured): its CPUs are mapped onto the real ones and do not come and go.
    NotLiveMachine,
}

impl fmt::Display for NotRepoddedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotRepoddedReason::NotLiveMachine => f.write_str(
                "built on a topology that is not this machine (fake, synthetic or captured)",
            ),
        }
    }
}

impl fmt::Display for Refreshed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "usable CPUs {}", self.usable)?;
        for n in &self.not_repodded {
            write!(f, "; `{}` not re-podded: {}", n.workqueue, n.reason)?;
        }
        Ok(())
    }
}

/// Re-reads the CPUs this process may use (online ∩ the process's affinity mask, that
/// of its main thread ∩ the cgroup's effective cpuset) and re-pods every live
/// workqueue built on the live machine, without losing work: queued and running items
/// finish on their old pools. Returns the usable CPUs now and the workqueues it left
/// alone, with the reason.
///
/// Call it after the process's affinity (`taskset -p`) or cpuset changed. A workqueue
/// never uses CPUs beyond those of the topology it was built with. Workqueues built on
/// this machine's topology follow, whether it was the default or passed explicitly
/// (`.topology(Topology::live()?)`); those on a fake, synthetic or captured topology
/// are left alone and listed in [`Refreshed::not_repodded`]. Departure: the kernel
/// reacts to hotplug events itself.
pub fn refresh() -> Result<Refreshed, Error> {
    refresh_with(cpu::read_usable()?)
}

/// [`refresh`] as if the machine reported `usable` (for tests: no CPU has to go away).
/// An empty set is refused ([`Error::EmptyCpumask`]).
pub fn refresh_with(usable: CpuSet) -> Result<Refreshed, Error> {
    if usable.is_empty() {
        return Err(Error::EmptyCpumask);
    }
    static SERIAL: crate::sync::unmodelled::Mutex<()> = crate::sync::unmodelled::Mutex::new(());
    let _serial = lock(&SERIAL);
    cpu::set_real_cpus(usable.clone());
    let mut first_error = None;
    let mut not_repodded = Vec::new();
    for wq in live_workqueues() {
        if !wq.live {
            not_repodded.push(NotRepodded {
                workqueue: wq.name.clone(),
                reason: NotRepoddedReason::NotLiveMachine,
            });
            continue;
        }
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
        None => Ok(Refreshed {
            usable,
            not_repodded,
        }),
    }
}

/// Whether `topology` describes this machine: its CPUs are real and have the facts
/// sysfs gives for them now (as [`Topology::live`] builds it, possibly for fewer
/// CPUs). A topology that cannot be compared (no sysfs) is taken as not live.
pub(crate) fn is_live_machine(topology: &Topology) -> bool {
    let Ok(machine) = Topology::from_sysfs(std::path::Path::new("/")) else {
        return false;
    };
    if topology.possible() != machine.possible() || !topology.usable().is_subset(machine.usable()) {
        return false;
    }
    let Ok(narrowed) = machine.restrict(topology.usable()) else {
        return false;
    };
    topology
        .usable()
        .iter()
        .all(|c| topology.get(c) == narrowed.get(c))
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

//! CPUs as the runtime sees them: `sched_getcpu`, affinity, the thread-local CPU
//! override, and the mapping of a (possibly fake) topology onto the real CPUs.

use crate::sync::unmodelled::RwLock;
use std::cell::Cell;
use std::sync::PoisonError;

use podq_topology::{CpuFacts, CpuSet, Topology};

use crate::Error;

thread_local! {
    /// W: the CPU `queue()` from this thread acts as if called on.
    static CPU_OVERRIDE: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Makes `queue()` from this thread act as if called on `cpu` (`None`: the real CPU).
/// Workers set it to their CPU in the workqueue's topology before each item.
pub fn set_thread_cpu(cpu: Option<usize>) {
    CPU_OVERRIDE.with(|c| c.set(cpu));
}

/// The thread-local override if set, else `sched_getcpu()`.
pub fn current_cpu() -> usize {
    CPU_OVERRIDE.with(Cell::get).unwrap_or_else(real_cpu)
}

/// The real CPU this thread runs on (0 if the kernel cannot say).
#[cfg(not(miri))]
pub(crate) fn real_cpu() -> usize {
    // SAFETY: sched_getcpu takes no arguments and only reads the calling thread's state.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).unwrap_or(0)
}

/// Under Miri, which has no `sched_getcpu`: CPU 0, the first CPU of its affinity set.
#[cfg(miri)]
pub(crate) fn real_cpu() -> usize {
    0
}

/// The CPUs this process may run on (behind its lock): its affinity at first use
/// (`sched_getaffinity`), replaced by [`set_real_cpus`] on a refresh.
static REAL: RwLock<Option<CpuSet>> = RwLock::new(None);

/// The CPUs this process may run on now.
pub(crate) fn real_cpus() -> CpuSet {
    if let Some(set) = REAL.read().unwrap_or_else(PoisonError::into_inner).as_ref() {
        return set.clone();
    }
    let mut real = REAL.write().unwrap_or_else(PoisonError::into_inner);
    real.get_or_insert_with(|| {
        let set = process_affinity().unwrap_or_default();
        if set.is_empty() {
            CpuSet::single(real_cpu())
        } else {
            set
        }
    })
    .clone()
}

/// Replaces the usable real CPUs (a refresh); `cpus` is not empty.
pub(crate) fn set_real_cpus(cpus: CpuSet) {
    *REAL.write().unwrap_or_else(PoisonError::into_inner) = Some(cpus);
}

/// Reads the CPUs usable now: online ∩ the process's affinity mask ∩ the cgroup's
/// effective cpuset.
pub(crate) fn read_usable() -> Result<CpuSet, Error> {
    let online_path = "/sys/devices/system/cpu/online";
    let online = std::fs::read_to_string(online_path)
        .map_err(|source| podq_topology::Error::Io {
            path: online_path.into(),
            source,
        })
        .and_then(|text| CpuSet::parse_list(&text))?;
    let mut usable = online.intersection(&process_affinity()?);
    if let Some(cgroup) = podq_topology::live::cgroup_cpuset() {
        usable = usable.intersection(&cgroup);
    }
    Ok(usable)
}

fn process_affinity() -> Result<CpuSet, Error> {
    // The process's (main thread's) mask, not the calling thread's: a pinned thread
    // building the first workqueue must not narrow what podq believes it may use.
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    Ok(podq_topology::live::affinity_of(pid)?)
}

/// Binds the calling thread to `cpus` (real CPU numbers, any width).
pub(crate) fn set_affinity(cpus: &CpuSet) -> Result<(), Error> {
    Ok(podq_topology::live::set_affinity_of(0, cpus)?)
}

/// Sets the calling thread's nice value.
pub(crate) fn set_nice(nice: i32) -> Result<(), Error> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let who = libc::id_t::try_from(tid).unwrap_or(0);
    // SAFETY: PRIO_PROCESS with a thread id changes only that thread's priority.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::Os {
            call: "setpriority",
            source: std::io::Error::last_os_error(),
        })
    }
}

/// Pins the calling thread to the real CPU that `cpu` of `topology` maps onto and sets
/// the thread-local CPU override to `cpu`.
pub fn pin_thread_to(cpu: usize, topology: &Topology) -> Result<(), Error> {
    let map = CpuMap::new(topology);
    let real = map.real_of(cpu).ok_or_else(|| Error::InvalidCpu {
        cpu,
        usable: topology.usable().clone(),
    })?;
    set_affinity(&CpuSet::single(real))?;
    set_thread_cpu(Some(cpu));
    Ok(())
}

/// The machine podq runs on: [`Topology::live`] (sysfs, narrowed to the usable CPUs);
/// where sysfs cannot be read (some containers), the CPUs `sched_getaffinity` gives as one
/// core each, one LLC, one node, with a warning on the topology saying so.
pub(crate) fn live_topology() -> Topology {
    match Topology::live() {
        Ok(topology) => topology,
        Err(e) => affinity_topology().with_warning(format!(
            "sysfs topology unavailable ({e}); using the affinity mask as one LLC and one node"
        )),
    }
}

/// One core per usable CPU, one LLC, one node.
fn affinity_topology() -> Topology {
    let real = real_cpus();
    let facts: Vec<(usize, CpuFacts)> = real
        .iter()
        .map(|c| {
            (
                c,
                CpuFacts {
                    smt: CpuSet::single(c),
                    llc: real.clone(),
                    node: 0,
                    package: 0,
                },
            )
        })
        .collect();
    Topology::from_parts(real.clone(), real, facts)
        .expect("a non-empty CPU set with facts for each CPU is consistent")
}

/// How the CPUs of a topology map onto the real CPUs: identity when every usable CPU is
/// real, else round-robin (virtual `v` runs on the `v % nreal`-th real CPU, ascending).
#[derive(Clone, Debug)]
pub(crate) struct CpuMap {
    /// I: real CPU of each virtual CPU (`usize::MAX` for unusable ones).
    real_of: Vec<usize>,
}

impl CpuMap {
    pub(crate) fn new(topology: &Topology) -> CpuMap {
        let real = real_cpus();
        let usable = topology.usable();
        let identity = usable.is_subset(&real);
        let reals: Vec<usize> = real.iter().collect();
        let size = usable.last().map_or(0, |c| c + 1);
        let real_of = (0..size)
            .map(|v| {
                if !usable.contains(v) {
                    usize::MAX
                } else if identity {
                    v
                } else {
                    reals[v % reals.len()]
                }
            })
            .collect();
        CpuMap { real_of }
    }

    /// The real CPU a usable virtual CPU runs on.
    pub(crate) fn real_of(&self, cpu: usize) -> Option<usize> {
        self.real_of.get(cpu).copied().filter(|&r| r != usize::MAX)
    }

    /// The real CPUs a set of virtual CPUs runs on.
    pub(crate) fn reals(&self, cpus: &CpuSet) -> CpuSet {
        cpus.iter().filter_map(|c| self.real_of(c)).collect()
    }

    /// For each real CPU, the virtual CPU a worker running there counts as: the first
    /// of `preferred` mapping onto it, else the first of `fallback`, else `default`.
    pub(crate) fn virtual_table(
        &self,
        preferred: &CpuSet,
        fallback: &CpuSet,
        default: usize,
    ) -> Vec<usize> {
        let size = self
            .real_of
            .iter()
            .filter(|&&r| r != usize::MAX)
            .max()
            .map_or(0, |r| r + 1);
        (0..size)
            .map(|r| {
                preferred
                    .iter()
                    .chain(fallback.iter())
                    .find(|&v| self.real_of(v) == Some(r))
                    .unwrap_or(default)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_wins() {
        set_thread_cpu(Some(42));
        assert_eq!(current_cpu(), 42);
        set_thread_cpu(None);
        assert!(real_cpus().contains(current_cpu()));
    }

    #[test]
    fn fake_topologies_map_round_robin() {
        let topo = crate::testing::fake_topology(2, 2, 2, 2);
        let map = CpuMap::new(&topo);
        let reals: Vec<usize> = real_cpus().iter().collect();
        let identity = topo.usable().is_subset(&real_cpus());
        for v in 0..16 {
            let expected = if identity { v } else { reals[v % reals.len()] };
            assert_eq!(map.real_of(v), Some(expected));
        }
        assert_eq!(map.real_of(16), None);
        for live in [live_topology(), affinity_topology()] {
            let map = CpuMap::new(&live);
            for c in live.usable().iter() {
                assert_eq!(map.real_of(c), Some(c), "real CPUs map to themselves");
            }
        }
    }
}

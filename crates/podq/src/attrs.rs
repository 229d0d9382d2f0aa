//! Workqueue attributes (the kernel's sysfs files) and the key that makes pools shared.

use podq_topology::{CpuSet, Scope};
use serde::{Deserialize, Serialize};

use crate::policy;
use crate::Error;

/// The attributes of a workqueue, as the kernel's sysfs files name them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attrs {
    /// Affinity scope: how big pods are (`Default` follows [`crate::default_scope`]).
    pub scope: Scope,
    /// Whether workers are confined to their pod (`affinity_strict`).
    pub strict: bool,
    /// The CPUs the workqueue may use, in its topology's numbering.
    pub cpumask: CpuSet,
    /// Nice value of the workers, `-20..=19`.
    pub nice: i32,
    /// System-wide limit of items running at once, `1..=2048`, enforced per NUMA node.
    pub max_active: usize,
    /// One item at a time, in queueing order (fixed at build time).
    pub ordered: bool,
}

impl Attrs {
    /// Checks the values that do not depend on the topology.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.cpumask.is_empty() {
            return Err(Error::EmptyCpumask);
        }
        if !policy::NICE_RANGE.contains(&self.nice) {
            return Err(Error::InvalidNice { value: self.nice });
        }
        if !policy::valid_max_active(self.max_active) {
            return Err(Error::InvalidMaxActive {
                value: self.max_active,
            });
        }
        Ok(())
    }
}

/// What makes two pools different (`wqattrs_hash`/`wqattrs_equal`): the topology, the
/// pod mask, strictness, nice, the effective cpumask only when not strict, and the
/// workers' idle timeout.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PoolKey {
    /// Which topology the CPU numbers refer to.
    pub(crate) topology: u64,
    pub(crate) pod: CpuSet,
    pub(crate) strict: bool,
    pub(crate) nice: i32,
    /// `None` for strict pools.
    pub(crate) cpumask: Option<CpuSet>,
    /// Idle timeout of the workers.
    pub(crate) idle_timeout: std::time::Duration,
}

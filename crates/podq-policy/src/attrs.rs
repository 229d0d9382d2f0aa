//! Workqueue attributes (the kernel's sysfs files).

use podq_topology::{CpuSet, Scope};
use serde::{Deserialize, Serialize};

/// The attributes of a workqueue, as the kernel's sysfs files name them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attrs {
    /// Affinity scope: how big pods are (`Default` follows the process default scope).
    pub scope: Scope,
    /// Whether workers are confined to their pod (`affinity_strict`).
    pub strict: bool,
    /// The CPUs the workqueue may use, in its topology's numbering.
    pub cpumask: CpuSet,
    /// Nice value of the workers, `-20..=19`.
    pub nice: i32,
    /// Limit of items running at once, `1..=2048`, enforced per NUMA node as the
    /// kernel does: each node of the effective cpumask gets a share proportional to its
    /// CPUs, rounded up and never below `min(max_active, 8)` (the kernel's
    /// `WQ_DFL_MIN_ACTIVE` floor, so no node starves). The shares can add up to more
    /// than `max_active`: `max_active = 3` on a 2-node topology lets up to 6 items run,
    /// 3 on each node (see [`crate::node_max_active`]).
    pub max_active: usize,
    /// One item at a time, in queueing order (fixed at build time).
    pub ordered: bool,
}

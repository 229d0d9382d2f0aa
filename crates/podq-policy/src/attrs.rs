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
    /// CPUs, rounded up and never below `min_active` (by default `min(max_active, 8)`,
    /// the kernel's `WQ_DFL_MIN_ACTIVE` floor, so no node starves). The shares can add up to more
    /// than `max_active`: `max_active = 3` on a 2-node topology lets up to 6 items run,
    /// 3 on each node (see [`crate::node_max_active`]).
    pub max_active: usize,
    /// The per-node forward-progress floor, `0..=max_active` (the kernel's
    /// `min_active`): every node of the effective cpumask may run at least this many
    /// items at once, whatever its share of `max_active`. Default
    /// `min(max_active, 8)`; lowering `max_active` below it lowers it too, as in the
    /// kernel.
    #[serde(default = "default_min_active")]
    pub min_active: usize,
    /// One item at a time, in queueing order (fixed at build time).
    pub ordered: bool,
}

/// `min_active` for attributes written without it: the kernel's `WQ_DFL_MIN_ACTIVE`.
fn default_min_active() -> usize {
    crate::WQ_DFL_MIN_ACTIVE
}

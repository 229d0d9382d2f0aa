//! Machine topology and workqueue pods, computed exactly as the Linux kernel does.
//!
//! Pure code: no threads, no globals. Every input is a value or a root path; the live
//! machine is just the root `/` plus this process's affinity mask and cgroup cpuset.
//!
//! - [`Topology::from_sysfs`] reads a sysfs tree: a directory or a `.tar.gz` capture;
//!   [`Topology::live`] reads this machine as this process may use it;
//!   [`Topology::synthetic`] builds a machine from a shape such as `2s24c2t`;
//!   [`Topology::capture`] writes what `from_sysfs` reads into a `.tar.gz`.
//! - [`Topology::pods`] gives a scope's [`PodLayout`]; [`PodsReport`] holds all six.
//!
//! # Departures from the kernel
//! - Pods are built over the *usable* CPUs (online ∩ affinity ∩ cgroup cpuset), not
//!   over the possible CPUs at boot: user space cannot run anywhere else. The `system`
//!   pod is therefore the usable CPUs, and `cache_shard` counts usable cores only.
//! - A `cache_shard` size of 0 is refused, where the kernel raises it to 1.
//! - The generic builder, the pod-node rule (a pod's node is its highest CPU's) and the
//!   shard algorithm are otherwise the kernel's, step for step.
//!
//! ```
//! use podq_topology::{CpuFacts, CpuSet, Scope, Topology};
//!
//! // Two cores with two threads each, x86-style numbering (siblings at +2).
//! let facts = (0..4).map(|cpu| {
//!     let core = cpu % 2;
//!     (cpu, CpuFacts {
//!         smt: [core, core + 2].into_iter().collect(),
//!         llc: CpuSet::first_n(4),
//!         node: 0,
//!         package: 0,
//!     })
//! });
//! let topo = Topology::from_parts(CpuSet::first_n(4), CpuSet::first_n(4), facts).unwrap();
//! let smt = topo.pods(Scope::Smt).unwrap();
//! assert_eq!(smt.as_lists(), vec![vec![0, 2], vec![1, 3]]);
//! ```

mod cpuset;
mod error;
pub mod live;
pub mod pods;
mod report;
mod scope;
mod source;
pub mod synthetic;
mod sysfs;
mod topology;

pub use cpuset::{CpuSet, Iter, MAX_CPUS, MAX_TEXT_BYTES};
pub use error::Error;
pub use pods::PodLayout;
pub use report::PodsReport;
pub use scope::{Scope, DEFAULT_SCOPE_ENV};
pub use synthetic::{Numbering, Shape, MAX_SYNTHETIC_CPUS};
pub use topology::{CpuFacts, CpuFactsRef, Topology, DEFAULT_SHARD_SIZE};

//! Machine topology and workqueue pods, computed exactly as the Linux kernel does.
//!
//! Pure code: no threads, no globals. Every input is a value or a root path; the live
//! machine is just the root `/`.
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

pub use cpuset::{CpuSet, Iter, MAX_CPUS};
pub use error::Error;
pub use pods::PodLayout;
pub use report::PodsReport;
pub use scope::{Scope, DEFAULT_SCOPE_ENV};
pub use synthetic::{Numbering, Shape};
pub use topology::{CpuFacts, Topology, DEFAULT_SHARD_SIZE};

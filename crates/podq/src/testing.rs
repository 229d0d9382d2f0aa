//! Test helpers (the `test-util` feature): fake topologies with many pods, nodes and
//! LLCs on any machine, their CPUs mapped onto the real ones round-robin (see
//! [`crate::pin_thread_to`]); and [`refresh_with`], a refresh as if the machine's usable
//! CPUs had changed.

use podq_topology::{CpuFacts, CpuSet, Topology};

pub use crate::workqueue::refresh::refresh_with;

/// A machine of `nodes` NUMA nodes, each with `llcs` last-level caches of `cores` cores
/// of `threads` hardware threads, numbered linearly (a core's threads are adjacent).
///
/// # Panics
/// If any count is zero (a test helper: the shape is a literal in the test).
pub fn fake_topology(nodes: usize, llcs: usize, cores: usize, threads: usize) -> Topology {
    assert!(
        nodes * llcs * cores * threads > 0,
        "every count must be at least 1"
    );
    let per_llc = cores * threads;
    let per_node = llcs * per_llc;
    let total = nodes * per_node;
    let facts = (0..total).map(|cpu| {
        let core = cpu / threads;
        let llc = cpu / per_llc;
        let node = cpu / per_node;
        (
            cpu,
            CpuFacts {
                smt: (core * threads..(core + 1) * threads).collect(),
                llc: (llc * per_llc..(llc + 1) * per_llc).collect(),
                node,
                package: node,
            },
        )
    });
    Topology::from_parts(CpuSet::first_n(total), CpuSet::first_n(total), facts)
        .expect("a fake topology is consistent by construction")
}

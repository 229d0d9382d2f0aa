//! Where an item ran relative to where it was queued.

use podq_topology::Topology;

/// Where an item ran relative to where it was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locality {
    /// The same CPU.
    SameCpu,
    /// Another thread of the same core.
    SameSmt,
    /// Another core sharing the last-level cache.
    SameLlc,
    /// Another LLC of the same NUMA node.
    SameNode,
    /// Another node (or a CPU unknown to the topology).
    Remote,
}

/// Classifies `ran` relative to `queued` in `topology`.
#[inline]
pub fn locality(topology: &Topology, queued: usize, ran: usize) -> Locality {
    if queued == ran {
        return Locality::SameCpu;
    }
    let (Some(q), Some(r)) = (topology.get(queued), topology.get(ran)) else {
        return Locality::Remote;
    };
    if q.smt.contains(ran) {
        Locality::SameSmt
    } else if q.llc.contains(ran) {
        Locality::SameLlc
    } else if q.node == r.node {
        Locality::SameNode
    } else {
        Locality::Remote
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podq_topology::{CpuFacts, CpuSet};

    fn set(cpus: &[usize]) -> CpuSet {
        cpus.iter().copied().collect()
    }

    #[test]
    fn locality_classes() {
        // 2 nodes x 1 LLC x 2 cores x 2 threads, linear siblings.
        let facts = (0..8).map(|c| {
            let core = c / 2;
            let node = c / 4;
            (
                c,
                CpuFacts {
                    smt: set(&[core * 2, core * 2 + 1]),
                    llc: (node * 4..node * 4 + 4).collect(),
                    node,
                    package: node,
                },
            )
        });
        let topo = Topology::from_parts(CpuSet::first_n(8), CpuSet::first_n(8), facts).unwrap();
        assert_eq!(locality(&topo, 0, 0), Locality::SameCpu);
        assert_eq!(locality(&topo, 0, 1), Locality::SameSmt);
        assert_eq!(locality(&topo, 0, 2), Locality::SameLlc);
        assert_eq!(locality(&topo, 0, 5), Locality::Remote);
        assert_eq!(locality(&topo, 0, 99), Locality::Remote);
    }
}

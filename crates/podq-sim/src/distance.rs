//! How far apart two CPUs are, and what moving data between them costs.

use podq_topology::Topology;

use crate::cost::CostParams;

/// The distance classes of the cost model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Distance {
    /// The same CPU.
    Same,
    /// SMT siblings.
    Smt,
    /// Cores sharing an LLC.
    Llc,
    /// Different LLCs of one socket (package).
    CrossLlc,
    /// Different sockets.
    CrossSocket,
}

/// The distance between every pair of usable CPUs, precomputed.
pub struct Distances {
    n: usize,
    table: Vec<Distance>,
}

impl Distances {
    /// Classifies every pair of `topology`'s usable CPUs (`n` = highest usable + 1).
    pub fn new(topology: &Topology, n: usize) -> Distances {
        let mut table = vec![Distance::CrossSocket; n * n];
        for a in topology.usable().iter() {
            let fa = topology.facts(a);
            for b in topology.usable().iter() {
                let fb = topology.facts(b);
                table[a * n + b] = if a == b {
                    Distance::Same
                } else if fa.smt.contains(b) {
                    Distance::Smt
                } else if fa.llc.contains(b) {
                    Distance::Llc
                } else if fa.package == fb.package {
                    Distance::CrossLlc
                } else {
                    Distance::CrossSocket
                };
            }
        }
        Distances { n, table }
    }

    /// The distance from `a` to `b`.
    pub fn get(&self, a: usize, b: usize) -> Distance {
        self.table[a * self.n + b]
    }
}

/// One cache line's transfer over `d` (0 on the same CPU).
pub fn c2c(cost: &CostParams, d: Distance) -> f64 {
    match d {
        Distance::Same => 0.0,
        Distance::Smt => cost.c2c_smt,
        Distance::Llc => cost.c2c_llc,
        Distance::CrossLlc => cost.c2c_cross_llc,
        Distance::CrossSocket => cost.c2c_cross_socket,
    }
}

/// Reading a 4 KiB buffer last written over `d`.
pub fn buf4k(cost: &CostParams, d: Distance) -> f64 {
    match d {
        Distance::Same | Distance::Smt => cost.buf4k_local,
        Distance::Llc => cost.buf4k_llc,
        Distance::CrossLlc => cost.buf4k_cross_llc,
        Distance::CrossSocket => cost.buf4k_cross_socket,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_on_a_two_socket_ccx_machine() {
        // 2 sockets x 2 LLCs x 2 cores x 2 threads, x86 numbering: 16 CPUs, siblings +8.
        let topo = Topology::synthetic("2s2l2c2t").unwrap();
        let d = Distances::new(&topo, 16);
        assert_eq!(d.get(0, 0), Distance::Same);
        assert_eq!(d.get(0, 8), Distance::Smt);
        assert_eq!(d.get(0, 1), Distance::Llc);
        assert_eq!(d.get(0, 2), Distance::CrossLlc);
        assert_eq!(d.get(0, 4), Distance::CrossSocket);
        let cost = crate::cost::machine("epyc-2s32c").unwrap().params;
        assert_eq!(c2c(&cost, d.get(0, 2)), 103.0);
        assert_eq!(buf4k(&cost, d.get(0, 4)), 1400.0);
        assert_eq!(c2c(&cost, Distance::Same), 0.0);
    }
}

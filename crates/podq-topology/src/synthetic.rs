//! Synthetic machines described by a shape string, for machines we don't have.
//!
//! Grammar: `<S>s[<N>n][<L>l]<C>c[<T>t][:x86|:linear]`, each count per unit of the
//! level before it (as hwloc names its test machines):
//! - `S` sockets (packages);
//! - `N` NUMA nodes per socket (default 1);
//! - `L` last-level caches per node (default 1);
//! - `C` cores per LLC;
//! - `T` hardware threads per core (default 1).
//!
//! So `2s24c2t` is 2 sockets × 24 cores × 2 threads = 96 CPUs with one LLC and one node
//! per socket, and `2s4l8c2t` is 2 sockets × 4 LLCs × 8 cores × 2 threads = 128 CPUs.
//! Spaces and `x` separators are ignored (`2s x 24c x 2t`). At most
//! [`MAX_SYNTHETIC_CPUS`] CPUs.
//!
//! Numbering: `:x86` (the default) gives every core's first thread the ids
//! `0..cores`, its second thread `cores..2*cores` and so on (siblings at +cores);
//! `:linear` numbers a core's threads adjacently (siblings at +1).

use crate::{CpuFacts, CpuSet, Error, Topology};

/// The most CPUs a synthetic shape may have: twice Linux's largest `NR_CPUS` (8192).
/// Every CPU holds its LLC as a bitset, so the bound also keeps memory small.
pub const MAX_SYNTHETIC_CPUS: usize = 16384;

/// How hardware threads of one core are numbered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numbering {
    /// Siblings at `+cores` (Intel and AMD x86 machines).
    X86,
    /// Siblings adjacent (many ARM and POWER machines).
    Linear,
}

/// A parsed shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Sockets (packages).
    pub sockets: usize,
    /// NUMA nodes per socket.
    pub nodes_per_socket: usize,
    /// Last-level caches per node.
    pub llcs_per_node: usize,
    /// Cores per LLC.
    pub cores_per_llc: usize,
    /// Hardware threads per core.
    pub threads_per_core: usize,
    /// Sibling numbering.
    pub numbering: Numbering,
}

impl Shape {
    /// Parses a shape string (see the module docs).
    pub fn parse(text: &str) -> Result<Shape, Error> {
        let err = |reason: String| Error::Shape {
            shape: text.to_owned(),
            reason,
        };
        let (body, numbering) = match text.split_once(':') {
            None => (text, Numbering::X86),
            Some((body, "x86")) => (body, Numbering::X86),
            Some((body, "linear")) => (body, Numbering::Linear),
            Some((_, other)) => {
                return Err(err(format!(
                    "unknown numbering `{other}`; expected `x86` or `linear`"
                )))
            }
        };
        let compact: String = body
            .chars()
            .filter(|c| !c.is_whitespace() && *c != 'x')
            .collect();
        let order = ['s', 'n', 'l', 'c', 't'];
        let mut counts: [Option<usize>; 5] = [None; 5];
        let mut last_level: Option<usize> = None;
        let mut digits = String::new();
        for ch in compact.chars() {
            if ch.is_ascii_digit() {
                digits.push(ch);
                continue;
            }
            let Some(level) = order.iter().position(|&l| l == ch) else {
                return Err(err(format!(
                    "unexpected `{ch}`; expected counts followed by s, n, l, c, t"
                )));
            };
            if digits.is_empty() {
                return Err(err(format!("`{ch}` has no count before it")));
            }
            if last_level.is_some_and(|last| level <= last) {
                return Err(err(format!(
                    "`{ch}` is out of order or repeated; levels go s, n, l, c, t"
                )));
            }
            let n: usize = digits
                .parse()
                .map_err(|_| err(format!("count `{digits}` is too large")))?;
            if n == 0 {
                return Err(err(format!("`0{ch}`: counts must be at least 1")));
            }
            counts[level] = Some(n);
            last_level = Some(level);
            digits.clear();
        }
        if !digits.is_empty() {
            return Err(err(format!("trailing count `{digits}` has no unit")));
        }
        let sockets = counts[0].ok_or_else(|| err("missing socket count (`<S>s`)".to_owned()))?;
        let cores_per_llc =
            counts[3].ok_or_else(|| err("missing core count (`<C>c`)".to_owned()))?;
        let shape = Shape {
            sockets,
            nodes_per_socket: counts[1].unwrap_or(1),
            llcs_per_node: counts[2].unwrap_or(1),
            cores_per_llc,
            threads_per_core: counts[4].unwrap_or(1),
            numbering,
        };
        let total = [
            shape.sockets,
            shape.nodes_per_socket,
            shape.llcs_per_node,
            shape.cores_per_llc,
            shape.threads_per_core,
        ]
        .iter()
        .try_fold(1usize, |acc, &n| acc.checked_mul(n))
        .filter(|&t| t <= MAX_SYNTHETIC_CPUS);
        if total.is_none() {
            return Err(err(format!("more than {MAX_SYNTHETIC_CPUS} CPUs")));
        }
        Ok(shape)
    }

    /// Total cores.
    pub fn cores(&self) -> usize {
        self.sockets * self.nodes_per_socket * self.llcs_per_node * self.cores_per_llc
    }

    /// Total CPUs (hardware threads).
    pub fn cpus(&self) -> usize {
        self.cores() * self.threads_per_core
    }

    /// The CPU id of thread `thread` of core `core` (cores numbered 0.. across the
    /// machine in socket, node, LLC order).
    fn cpu(&self, core: usize, thread: usize) -> usize {
        match self.numbering {
            Numbering::X86 => thread * self.cores() + core,
            Numbering::Linear => core * self.threads_per_core + thread,
        }
    }

    /// Builds the topology: every CPU possible and usable.
    pub fn topology(&self) -> Result<Topology, Error> {
        let cores_per_node = self.llcs_per_node * self.cores_per_llc;
        let cores_per_socket = self.nodes_per_socket * cores_per_node;
        // Generated as `from_parts` takes them, so each CPU's sets live only until it
        // has kept (or found) their shared copy.
        let mut llc = CpuSet::new();
        let facts = (0..self.cores()).flat_map(move |core| {
            // Cores are numbered LLC by LLC, so a new LLC starts at each multiple.
            if core % self.cores_per_llc == 0 {
                llc = (core..core + self.cores_per_llc)
                    .flat_map(|c| (0..self.threads_per_core).map(move |t| (c, t)))
                    .map(|(c, t)| self.cpu(c, t))
                    .collect();
            }
            let smt: CpuSet = (0..self.threads_per_core)
                .map(|t| self.cpu(core, t))
                .collect();
            let llc = llc.clone();
            (0..self.threads_per_core).map(move |thread| {
                let facts = CpuFacts {
                    smt: smt.clone(),
                    llc: llc.clone(),
                    node: core / cores_per_node,
                    package: core / cores_per_socket,
                };
                (self.cpu(core, thread), facts)
            })
        });
        let all = CpuSet::first_n(self.cpus());
        Topology::from_parts(all.clone(), all, facts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Scope;

    #[test]
    fn parses_the_documented_forms() {
        let s = Shape::parse("2s24c2t").unwrap();
        assert_eq!((s.sockets, s.cores_per_llc, s.threads_per_core), (2, 24, 2));
        assert_eq!(s.cpus(), 96);
        assert_eq!(Shape::parse("2s4l8c2t").unwrap().cpus(), 128);
        let s = Shape::parse("2s2n12c2t:linear").unwrap();
        assert_eq!(s.nodes_per_socket, 2);
        assert_eq!(s.numbering, Numbering::Linear);
        assert_eq!(Shape::parse("2s x 24c x 2t").unwrap().cpus(), 96);
        assert_eq!(Shape::parse("1s4c").unwrap().threads_per_core, 1);
    }

    #[test]
    fn rejects_bad_shapes_naming_them() {
        for bad in [
            "",
            "2s",
            "24c",
            "2s0c",
            "2c2s",
            "2s2s4c",
            "s4c",
            "2s4c2",
            "2s4q",
            "2s4c:arm",
            "99999s99999c99t",
            "1s16385c",
        ] {
            let err = Shape::parse(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("`{bad}`")), "{err}");
        }
    }

    #[test]
    fn numberings_place_siblings() {
        let x86 = Shape::parse("1s4c2t").unwrap().topology().unwrap();
        assert_eq!(
            x86.pods(Scope::Smt).unwrap().as_lists(),
            vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]
        );
        let linear = Shape::parse("1s4c2t:linear").unwrap().topology().unwrap();
        assert_eq!(
            linear.pods(Scope::Smt).unwrap().as_lists(),
            vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
        );
    }

    #[test]
    fn levels_nest() {
        let t = Shape::parse("2s2n2l3c2t").unwrap().topology().unwrap();
        assert_eq!(t.usable().len(), 48);
        assert_eq!(t.pods(Scope::Cache).unwrap().len(), 8);
        assert_eq!(t.pods(Scope::Numa).unwrap().len(), 4);
        assert_eq!(t.nodes(), vec![0, 1, 2, 3]);
        // x86 numbering: CPU 24 is the second thread of core 0.
        assert_eq!(t.facts(24).smt.to_list(), "0,24");
        assert_eq!(t.facts(24).llc.to_list(), "0-2,24-26");
        assert_eq!(t.facts(47).package, 1);
    }
}

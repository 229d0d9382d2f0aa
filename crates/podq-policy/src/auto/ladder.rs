//! The `auto` controller's ladder: a workqueue's distinct pod layouts, narrowest first.

use podq_topology::{CpuSet, Error, Scope, Topology};

use super::AutoState;

/// The distinct pod layouts of a workqueue's CPUs, narrowest first.
#[derive(Clone, Debug, PartialEq)]
pub struct Ladder {
    pub(super) rungs: Vec<Rung>,
    /// Node of each CPU (index: CPU number), for arrival signatures.
    cpu_node: Vec<Option<usize>>,
    /// The nodes, in signature order.
    pub(super) nodes: Vec<usize>,
}

/// One pod layout of the ladder.
#[derive(Clone, Debug, PartialEq)]
pub struct Rung {
    /// The scope reported for this layout.
    pub scope: Scope,
    /// Every concrete scope that gives this layout.
    pub aliases: Vec<Scope>,
    /// The pods, within the workqueue's cpumask.
    pub pods: Vec<CpuSet>,
}

impl Ladder {
    /// The ladder of `topology`'s scopes within `cpumask`. Scopes with identical pods
    /// share a rung, reported by the first of them in the kernel's order, except that the
    /// built-in default (`cache_shard`) names any rung it belongs to.
    pub fn new(topology: &Topology, cpumask: &CpuSet) -> Result<Ladder, Error> {
        let mut rungs: Vec<Rung> = Vec::new();
        for scope in Scope::CONCRETE {
            let layout = topology.pods(scope)?;
            let mut pods: Vec<CpuSet> = layout
                .pod_cpus
                .iter()
                .map(|p| p.intersection(cpumask))
                .filter(|p| !p.is_empty())
                .collect();
            pods.sort();
            match rungs.iter_mut().find(|r| r.pods == pods) {
                Some(rung) => {
                    rung.aliases.push(scope);
                    if scope == Scope::BUILTIN_DEFAULT {
                        rung.scope = scope;
                    }
                }
                None => rungs.push(Rung {
                    scope,
                    aliases: vec![scope],
                    pods,
                }),
            }
        }
        // More pods first; equal counts keep the kernel's order (stable sort).
        rungs.sort_by_key(|r| std::cmp::Reverse(r.pods.len()));
        let size = cpumask.last().map_or(0, |c| c + 1);
        let cpu_node: Vec<Option<usize>> = (0..size)
            .map(|c| {
                if cpumask.contains(c) {
                    topology.node_of(c)
                } else {
                    None
                }
            })
            .collect();
        let mut nodes: Vec<usize> = cpu_node.iter().flatten().copied().collect();
        nodes.sort_unstable();
        nodes.dedup();
        Ok(Ladder {
            rungs,
            cpu_node,
            nodes,
        })
    }

    /// The rungs, narrowest first.
    pub fn rungs(&self) -> &[Rung] {
        &self.rungs
    }

    /// The rung whose layout `scope` gives (`None` for `default` and `auto`).
    pub fn rung_of(&self, scope: Scope) -> Option<usize> {
        self.rungs.iter().position(|r| r.aliases.contains(&scope))
    }

    /// The state of a controller starting at `scope` (a concrete scope; anything else
    /// starts at the built-in default) with strictness `strict`.
    pub fn start(&self, scope: Scope, strict: bool) -> AutoState {
        let rung = self
            .rung_of(scope)
            .or_else(|| self.rung_of(Scope::BUILTIN_DEFAULT))
            .unwrap_or(0);
        AutoState::at(rung, strict)
    }

    pub(super) fn node_of(&self, cpus: &CpuSet) -> Option<usize> {
        cpus.first()
            .and_then(|c| self.cpu_node.get(c).copied().flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ladder(shape: &str) -> Ladder {
        let topology = Topology::synthetic(shape).unwrap();
        Ladder::new(&topology, topology.usable()).unwrap()
    }

    fn scopes(ladder: &Ladder) -> Vec<Scope> {
        ladder.rungs().iter().map(|r| r.scope).collect()
    }

    #[test]
    fn ladders_merge_identical_layouts() {
        use Scope::*;
        let two_node = ladder("2s24c2t");
        assert_eq!(scopes(&two_node), [Cpu, Smt, CacheShard, Cache, System]);
        assert_eq!(two_node.rungs()[3].aliases, [Cache, Numa]);
        assert_eq!(two_node.rungs()[2].pods.len(), 6);
        let one_llc = ladder("1s12c");
        assert_eq!(scopes(&one_llc), [Cpu, CacheShard, Cache]);
        assert_eq!(one_llc.rungs()[0].aliases, [Cpu, Smt]);
        assert_eq!(one_llc.rungs()[2].aliases, [Cache, Numa, System]);
        // One LLC of 8 cores is one shard: cache_shard names the merged rung.
        let small = ladder("1s8c2t");
        assert_eq!(scopes(&small), [Cpu, Smt, CacheShard]);
        assert_eq!(small.rungs()[2].aliases, [Cache, CacheShard, Numa, System]);
        assert_eq!(small.rung_of(Numa), Some(2));
        assert_eq!(small.rung_of(Scope::Auto), None);
        assert_eq!(small.start(Scope::Auto, false).rung(), 2);
    }
}

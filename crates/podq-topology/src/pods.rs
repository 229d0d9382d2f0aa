//! Pods per affinity scope, built exactly as the kernel's `init_pod_type` and its
//! `cache_shard` algorithm do (see `reference/kernel-workqueue.md` §2).

use serde::Serialize;

use crate::{CpuSet, Error, Scope, Topology};

/// How the usable CPUs split into pods for one scope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodLayout {
    /// The scope these pods belong to (never `Default`).
    pub scope: Scope,
    /// CPUs of each pod; pods are numbered by their lowest CPU.
    pub pod_cpus: Vec<CpuSet>,
    /// NUMA node of each pod: that of its highest-numbered CPU (the kernel's
    /// last-write-wins rule); `None` for the `system` pod, as the kernel's -1.
    pub pod_node: Vec<Option<usize>>,
    /// Pod of each CPU number; `None` for CPUs that are not usable.
    pub cpu_pod: Vec<Option<usize>>,
}

impl PodLayout {
    /// Builds the pods of `scope` over `topology`'s usable CPUs.
    pub fn build(topology: &Topology, scope: Scope) -> Result<PodLayout, Error> {
        let usable = topology.usable();
        let llc_id = |c: usize| topology.facts(c).llc.first();
        let layout = match scope {
            Scope::Default => {
                return Err(Error::Invalid {
                    what: "scope",
                    reason: "`default` must be resolved to a concrete scope first".to_owned(),
                })
            }
            Scope::Auto => {
                return Err(Error::Invalid {
                    what: "scope",
                    reason: "`auto` has no pods of its own: ask its controller which scope it \
                             uses"
                        .to_owned(),
                })
            }
            Scope::Cpu => generic(topology, scope, &vec![None; table_len(usable)]),
            Scope::Smt => generic(topology, scope, &first_smt_sharer(topology)),
            Scope::Cache => generic(topology, scope, &first_with_same_key(usable, llc_id)),
            Scope::CacheShard => {
                let shard_id = cache_shard_ids(topology)?;
                let key = |c: usize| (llc_id(c), shard_id[c]);
                generic(topology, scope, &first_with_same_key(usable, key))
            }
            Scope::Numa => {
                let node = |c: usize| topology.facts(c).node;
                generic(topology, scope, &first_with_same_key(usable, node))
            }
            Scope::System => {
                let mut cpu_pod = vec![None; table_len(usable)];
                for c in usable {
                    cpu_pod[c] = Some(0);
                }
                PodLayout {
                    scope,
                    pod_cpus: vec![usable.clone()],
                    pod_node: vec![None],
                    cpu_pod,
                }
            }
        };
        Ok(layout)
    }

    /// Number of pods.
    pub fn len(&self) -> usize {
        self.pod_cpus.len()
    }

    /// Whether there is no pod (never true for a built layout).
    pub fn is_empty(&self) -> bool {
        self.pod_cpus.is_empty()
    }

    /// The pod of `cpu`, if it is usable.
    pub fn pod_of(&self, cpu: usize) -> Option<usize> {
        self.cpu_pod.get(cpu).copied().flatten()
    }

    /// Pods as sorted CPU lists, the shape of the fixtures' `.pods.json`.
    pub fn as_lists(&self) -> Vec<Vec<usize>> {
        self.pod_cpus.iter().map(|p| p.iter().collect()).collect()
    }
}

/// Length of a table indexed by CPU number that covers `cpus`.
fn table_len(cpus: &CpuSet) -> usize {
    cpus.last().map_or(0, |c| c + 1)
}

/// The kernel's generic builder (`init_pod_type`): walk CPUs ascending; each joins the
/// pod of the first lower CPU it shares with, or starts a new pod.
///
/// `first_sharer[cur]` is that first lower CPU. The kernel finds it by an O(P²) scan;
/// the helpers below compute the same answer in one pass, so machines with tens of
/// thousands of CPUs stay fast.
fn generic(topology: &Topology, scope: Scope, first_sharer: &[Option<usize>]) -> PodLayout {
    let usable = topology.usable();
    let mut cpu_pod = vec![None; table_len(usable)];
    let mut pod_cpus: Vec<CpuSet> = Vec::new();
    for cur in usable {
        let joined = first_sharer[cur].and_then(|pre| cpu_pod[pre]);
        let pod = joined.unwrap_or_else(|| {
            pod_cpus.push(CpuSet::new());
            pod_cpus.len() - 1
        });
        cpu_pod[cur] = Some(pod);
        pod_cpus[pod].insert(cur);
    }
    // Last write wins: a pod reports the node of its highest CPU.
    let mut pod_node = vec![None; pod_cpus.len()];
    for cpu in usable {
        if let Some(pod) = cpu_pod[cpu] {
            pod_node[pod] = Some(topology.facts(cpu).node);
        }
    }
    PodLayout {
        scope,
        pod_cpus,
        pod_node,
        cpu_pod,
    }
}

/// First sharer for an equivalence `key(a) == key(b)`: the first CPU seen with the
/// same key.
fn first_with_same_key<K: Eq + std::hash::Hash>(
    cpus: &CpuSet,
    key: impl Fn(usize) -> K,
) -> Vec<Option<usize>> {
    let mut first_of: std::collections::HashMap<K, usize> = std::collections::HashMap::new();
    let mut sharer = vec![None; table_len(cpus)];
    for cur in cpus {
        match first_of.entry(key(cur)) {
            std::collections::hash_map::Entry::Occupied(e) => sharer[cur] = Some(*e.get()),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(cur);
            }
        }
    }
    sharer
}

/// First sharer for the SMT predicate `cur ∈ smt(pre)`, which captured sibling lists
/// do not always make symmetric: the lowest `pre < cur` whose sibling set holds `cur`.
fn first_smt_sharer(topology: &Topology) -> Vec<Option<usize>> {
    let usable = topology.usable();
    let mut sharer: Vec<Option<usize>> = vec![None; table_len(usable)];
    // Usable CPUs above `pre` without a sharer yet: each SMT set costs one pass over
    // its words, not one step per member (sets can be the whole machine).
    let mut waiting = usable.clone();
    for pre in usable {
        waiting.remove(pre);
        let joined = topology.facts(pre).smt.intersection(&waiting);
        for cur in &joined {
            sharer[cur] = Some(pre);
        }
        waiting = waiting.difference(&joined);
    }
    sharer
}

/// Sizes of the shards an LLC of `cores` cores splits into with target `shard_size`:
/// `max(1, round_half_up(cores / size))` shards, larger shards first.
pub fn shard_sizes(cores: usize, shard_size: usize) -> Vec<usize> {
    let size = shard_size.max(1);
    let shards = ((cores + size / 2) / size).max(1);
    let per = cores / shards;
    let large = cores % shards;
    (0..shards).map(|i| per + usize::from(i < large)).collect()
}

/// `cpu_shard_id` per CPU number, restarting at 0 in every LLC: cores (SMT pods, by
/// their lowest CPU) fill shards in CPU-id order; siblings follow their leader.
fn cache_shard_ids(topology: &Topology) -> Result<Vec<usize>, Error> {
    let smt = PodLayout::build(topology, Scope::Smt)?;
    let cache = PodLayout::build(topology, Scope::Cache)?;
    let mut shard_id = vec![0; smt.cpu_pod.len()];
    for llc in &cache.pod_cpus {
        let is_leader = |c: usize| {
            smt.pod_of(c)
                .and_then(|p| smt.pod_cpus[p].first())
                .is_some_and(|first| first == c)
        };
        let cores = llc.iter().filter(|&c| is_leader(c)).count();
        let capacity = shard_sizes(cores, topology.shard_size());
        let (mut shard, mut in_shard) = (0usize, 0usize);
        for c in llc {
            if is_leader(c) {
                if in_shard >= capacity[shard] && shard + 1 < capacity.len() {
                    shard += 1;
                    in_shard = 0;
                }
                in_shard += 1;
                shard_id[c] = shard;
            } else {
                let leader = smt
                    .pod_of(c)
                    .and_then(|p| smt.pod_cpus[p].first())
                    .unwrap_or(c);
                shard_id[c] = shard_id[leader];
            }
        }
    }
    Ok(shard_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuFacts;
    use proptest::prelude::*;

    /// The kernel's O(P²) scan, literally: the first `pre < cur` with `share(cur, pre)`.
    fn naive_sharer(cpus: &CpuSet, share: impl Fn(usize, usize) -> bool) -> Vec<Option<usize>> {
        let mut sharer = vec![None; table_len(cpus)];
        for cur in cpus {
            sharer[cur] = cpus
                .iter()
                .take_while(|&pre| pre < cur)
                .find(|&pre| share(cur, pre));
        }
        sharer
    }

    proptest! {
        /// The one-pass sharer tables equal the kernel's scan, also for asymmetric
        /// (hand-edited or stale) sibling lists.
        #[test]
        fn fast_sharers_equal_the_kernel_scan(
            groups in proptest::collection::vec(
                (proptest::collection::btree_set(0..40usize, 0..5), 0..4usize, 0..3usize),
                1..40,
            )
        ) {
            let n = groups.len();
            let facts = groups.iter().enumerate().map(|(cpu, (smt, llc, node))| {
                (cpu, CpuFacts {
                    smt: smt.iter().copied().collect(),
                    llc: (0..n).filter(|c| groups[*c].1 == *llc).collect(),
                    node: *node,
                    package: 0,
                })
            });
            let all = CpuSet::first_n(n);
            let topo = Topology::from_parts(all.clone(), all.clone(), facts).unwrap();
            let smt = naive_sharer(&all, |cur, pre| topo.facts(pre).smt.contains(cur));
            prop_assert_eq!(first_smt_sharer(&topo), smt);
            let llc = |c: usize| topo.facts(c).llc.first();
            let cache = naive_sharer(&all, |cur, pre| llc(cur) == llc(pre));
            prop_assert_eq!(first_with_same_key(&all, llc), cache);
            let node = |c: usize| topo.facts(c).node;
            let numa = naive_sharer(&all, |cur, pre| node(cur) == node(pre));
            prop_assert_eq!(first_with_same_key(&all, node), numa);
        }
    }

    #[test]
    fn shard_table_matches_the_kernel() {
        assert_eq!(shard_sizes(8, 8), vec![8]);
        assert_eq!(shard_sizes(11, 8), vec![11]);
        assert_eq!(shard_sizes(12, 8), vec![6, 6]);
        assert_eq!(shard_sizes(19, 8), vec![10, 9]);
        assert_eq!(shard_sizes(36, 8), vec![8, 7, 7, 7, 7]);
        assert_eq!(shard_sizes(72, 8), vec![8; 9]);
        let mut hundred = vec![8; 9];
        hundred.extend([7; 4]);
        assert_eq!(shard_sizes(100, 8), hundred);
    }
}

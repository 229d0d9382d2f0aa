//! Where a queue call goes: the CPU, and the pod masks pools are built from.

use podq_topology::CpuSet;

/// `wq_select_unbound_cpu`: the CPU whose pod a `queue()` call uses. The local CPU when
/// it is in the workqueue's unbound mask; otherwise round-robin after `rr_last` within
/// the mask (the caller stores the result as the next `rr_last`); the local CPU if the
/// mask is empty.
pub fn select_cpu(local: usize, unbound: &CpuSet, rr_last: Option<usize>) -> usize {
    if unbound.contains(local) {
        return local;
    }
    let after = rr_last.map_or(0, |c| c + 1);
    unbound
        .iter()
        .find(|&c| c >= after)
        .or_else(|| unbound.first())
        .unwrap_or(local)
}

/// Which pwq of a workqueue's CPU table a queue call uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PwqChoice {
    /// The pwq of this CPU.
    Cpu(usize),
    /// The default pwq (`dfl_pwq`, spanning the whole effective cpumask): the chosen
    /// CPU has no pwq of its own.
    Default,
}

/// A queue call's pick: the pwq, and the round-robin position to store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pick {
    /// The pwq to queue on.
    pub pwq: PwqChoice,
    /// The caller's new `wq_rr_cpu_last`, if it changes (a CPU chosen round-robin).
    pub rr_last: Option<usize>,
}

/// `__queue_work`'s CPU and pwq choice: the requested CPU when it has a pwq (`queue_on`
/// with a usable CPU); else [`select_cpu`] (the local CPU when it is in the effective
/// mask `unbound`, else the next one round-robin after `rr_last`); then that CPU's pwq,
/// or the default pwq if it has none. `has_pwq(c)`: whether CPU `c` has a pwq in the
/// current table. A round-robin choice (one that is not `local`) is returned as the new
/// `rr_last`, which the caller keeps per thread, as the kernel keeps it per CPU.
pub fn pick_pwq(
    requested: Option<usize>,
    has_pwq: impl Fn(usize) -> bool,
    local: usize,
    unbound: &CpuSet,
    rr_last: Option<usize>,
) -> Pick {
    let (cpu, rr_last) = match requested {
        Some(c) if has_pwq(c) => (c, None),
        _ => {
            let chosen = select_cpu(local, unbound, rr_last);
            (chosen, (chosen != local).then_some(chosen))
        }
    };
    let pwq = if has_pwq(cpu) {
        PwqChoice::Cpu(cpu)
    } else {
        PwqChoice::Default
    };
    Pick { pwq, rr_last }
}

/// `select_numa_node_cpu`: the CPU `queue_node(node)` uses, or `None` for "as
/// `queue()`". `node_cpus` are the usable CPUs of the node (empty for an unknown node).
pub fn select_node_cpu(
    local: usize,
    local_node: Option<usize>,
    node: usize,
    node_cpus: &CpuSet,
) -> Option<usize> {
    if node_cpus.is_empty() {
        return None;
    }
    if local_node == Some(node) && node_cpus.contains(local) {
        return Some(local);
    }
    node_cpus.first()
}

/// The effective cpumask of a workqueue: the requested mask within the usable CPUs.
/// `None` when they do not meet (the kernel falls back to the global mask; podq refuses
/// the change instead, see the crate docs).
pub fn effective_cpumask(requested: &CpuSet, usable: &CpuSet) -> Option<CpuSet> {
    let mask = requested.intersection(usable);
    (!mask.is_empty()).then_some(mask)
}

/// `wq_calc_pod_cpumask`: the pod's CPUs within the effective mask, or the whole mask
/// when the pod has none of them.
pub fn pod_cpumask(pod_cpus: &CpuSet, effective: &CpuSet) -> CpuSet {
    let mask = pod_cpus.intersection(effective);
    if mask.is_empty() {
        effective.clone()
    } else {
        mask
    }
}

/// The NUMA node a pool charges its active items to: the node holding all of its pod
/// CPUs, or `None` (the fallback counter) when they span nodes.
pub fn pool_node(pod: &CpuSet, node_of: impl Fn(usize) -> Option<usize>) -> Option<usize> {
    let mut nodes = pod.iter().map(node_of);
    let first = nodes.next()??;
    nodes.all(|n| n == Some(first)).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Round-robin from outside the mask visits every CPU of the mask once per
        /// round, in ascending order, and a pick always names a CPU with a pwq.
        #[test]
        fn round_robin_is_fair(cpus in proptest::collection::btree_set(0usize..64, 1..12),
                               local in 64usize..80, start in proptest::option::of(0usize..64)) {
            let mask: CpuSet = cpus.iter().copied().collect();
            let mut rr = start;
            let mut seen = Vec::new();
            for _ in 0..mask.len() * 2 {
                let p = pick_pwq(None, |c| mask.contains(c), local, &mask, rr);
                let PwqChoice::Cpu(c) = p.pwq else { panic!("a mask CPU has a pwq") };
                prop_assert!(mask.contains(c));
                prop_assert_eq!(p.rr_last, Some(c));
                rr = p.rr_last;
                seen.push(c);
            }
            let (first, second) = seen.split_at(mask.len());
            prop_assert_eq!(first, second);
            let mut sorted = first.to_vec();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, mask.iter().collect::<Vec<_>>());
        }
    }

    fn set(cpus: &[usize]) -> CpuSet {
        cpus.iter().copied().collect()
    }

    #[test]
    fn cpu_selection() {
        let mask = set(&[2, 3, 6]);
        assert_eq!(select_cpu(3, &mask, None), 3);
        assert_eq!(select_cpu(0, &mask, None), 2);
        assert_eq!(select_cpu(0, &mask, Some(2)), 3);
        assert_eq!(select_cpu(0, &mask, Some(3)), 6);
        assert_eq!(select_cpu(0, &mask, Some(6)), 2, "wraps around");
        assert_eq!(select_cpu(5, &CpuSet::new(), None), 5);
        let node = set(&[4, 5]);
        assert_eq!(select_node_cpu(5, Some(1), 1, &node), Some(5));
        assert_eq!(select_node_cpu(0, Some(0), 1, &node), Some(4));
        assert_eq!(select_node_cpu(0, Some(0), 9, &CpuSet::new()), None);
    }

    #[test]
    fn pwq_picks() {
        let mask = set(&[2, 3, 6]);
        let has = |c: usize| mask.contains(c);
        let pick = |req, local, rr| pick_pwq(req, has, local, &mask, rr);
        // A usable requested CPU wins and leaves the round-robin alone.
        assert_eq!(
            pick(Some(6), 0, Some(2)),
            Pick {
                pwq: PwqChoice::Cpu(6),
                rr_last: None
            }
        );
        // An unusable one acts as queue(): local CPU in the mask.
        assert_eq!(
            pick(Some(9), 3, None),
            Pick {
                pwq: PwqChoice::Cpu(3),
                rr_last: None
            }
        );
        // Local CPU outside the mask: round-robin, stored.
        assert_eq!(
            pick(None, 0, Some(3)),
            Pick {
                pwq: PwqChoice::Cpu(6),
                rr_last: Some(6)
            }
        );
        // An empty mask keeps the local CPU, which has no pwq: the default pwq.
        assert_eq!(
            pick_pwq(None, |_| false, 5, &CpuSet::new(), None),
            Pick {
                pwq: PwqChoice::Default,
                rr_last: None
            }
        );
    }

    #[test]
    fn pod_masks() {
        let eff = set(&[0, 1, 2, 3]);
        assert_eq!(pod_cpumask(&set(&[2, 3, 4]), &eff), set(&[2, 3]));
        assert_eq!(
            pod_cpumask(&set(&[6, 7]), &eff),
            eff,
            "widens to the whole mask"
        );
        assert_eq!(effective_cpumask(&set(&[1, 9]), &eff), Some(set(&[1])));
        assert_eq!(effective_cpumask(&set(&[9]), &eff), None);
        let node_of = |c: usize| Some(c / 2);
        assert_eq!(pool_node(&set(&[2, 3]), node_of), Some(1));
        assert_eq!(pool_node(&set(&[1, 2]), node_of), None);
        assert_eq!(pool_node(&CpuSet::new(), node_of), None);
    }
}

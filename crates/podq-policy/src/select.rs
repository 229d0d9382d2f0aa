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

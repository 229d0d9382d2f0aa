//! Which pool a (pod, attributes) pair maps to, and what that pool's workers may do.

use std::time::Duration;

use podq_topology::CpuSet;

/// What makes two pools different (`wqattrs_hash`/`wqattrs_equal`): the topology, the
/// pod mask, strictness, nice, the effective cpumask only when not strict, and the
/// workers' idle timeout. Workqueues whose pods map to equal keys share one pool.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// Which topology the CPU numbers refer to (an identity the runtime assigns).
    pub topology: u64,
    /// The pod's CPUs.
    pub pod: CpuSet,
    /// Whether workers stay inside the pod.
    pub strict: bool,
    /// The workers' nice value.
    pub nice: i32,
    /// The workqueue's effective cpumask; `None` for strict pools (`wqattrs_equal`
    /// ignores it for them: strict workers never leave the pod).
    pub cpumask: Option<CpuSet>,
    /// How long a surplus idle worker waits before exiting.
    pub idle_timeout: Duration,
}

/// The attributes of a pool that come from its workqueue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolAttrs {
    /// The topology identity, as in [`PoolKey::topology`].
    pub topology: u64,
    /// Strict affinity.
    pub strict: bool,
    /// Nice value.
    pub nice: i32,
    /// Worker idle timeout.
    pub idle_timeout: Duration,
}

/// The pool key of a pod mask under `attrs`, with `effective` the workqueue's
/// effective cpumask (dropped for strict pools).
pub fn pool_key(pod: CpuSet, attrs: &PoolAttrs, effective: &CpuSet) -> PoolKey {
    PoolKey {
        topology: attrs.topology,
        pod,
        strict: attrs.strict,
        nice: attrs.nice,
        cpumask: (!attrs.strict).then(|| effective.clone()),
        idle_timeout: attrs.idle_timeout,
    }
}

impl PoolKey {
    /// The CPUs a worker of this pool may run on (topology numbering): the pod if
    /// strict, else the workqueue's effective cpumask.
    pub fn allowed_cpus(&self) -> &CpuSet {
        match &self.cpumask {
            Some(mask) if !self.strict => mask,
            _ => &self.pod,
        }
    }

    /// How many workers may run items at once: one per pod CPU (at least one).
    /// Departure: the kernel runs as many as there are runnable items; see
    /// [`crate::POOL_MAX_WORKERS`].
    pub fn concurrency(&self) -> usize {
        self.pod.len().max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(cpus: &[usize]) -> CpuSet {
        cpus.iter().copied().collect()
    }

    fn attrs(strict: bool) -> PoolAttrs {
        PoolAttrs {
            topology: 7,
            strict,
            nice: -5,
            idle_timeout: Duration::from_secs(300),
        }
    }

    #[test]
    fn strict_keys_drop_the_cpumask() {
        let eff = set(&[0, 1, 2, 3]);
        let strict = pool_key(set(&[2, 3]), &attrs(true), &eff);
        assert_eq!(strict.cpumask, None);
        assert_eq!(strict.allowed_cpus(), &set(&[2, 3]));
        assert_eq!(
            strict,
            pool_key(set(&[2, 3]), &attrs(true), &set(&[2, 3, 4])),
            "strict pools of different workqueue masks are shared"
        );
        let loose = pool_key(set(&[2, 3]), &attrs(false), &eff);
        assert_eq!(loose.cpumask, Some(eff.clone()));
        assert_eq!(loose.allowed_cpus(), &eff);
        assert_ne!(loose, pool_key(set(&[2, 3]), &attrs(false), &set(&[2, 3])));
        assert_ne!(strict, loose);
        assert_eq!(loose.topology, 7);
        assert_eq!(loose.nice, -5);
    }

    #[test]
    fn concurrency_is_one_per_pod_cpu() {
        let eff = set(&[0, 1, 2, 3]);
        assert_eq!(
            pool_key(set(&[0, 1, 2]), &attrs(false), &eff).concurrency(),
            3
        );
        assert_eq!(pool_key(set(&[5]), &attrs(true), &eff).concurrency(), 1);
        assert_eq!(pool_key(CpuSet::new(), &attrs(true), &eff).concurrency(), 1);
    }
}

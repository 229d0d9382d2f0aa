//! The attribute-change plan (`apply_workqueue_attrs`) and the CPU-hotplug fallbacks
//! it uses: which pool every CPU maps to under new attributes, which of the current
//! pwqs are reused, retired or plugged.

use std::time::Duration;

use podq_topology::{CpuSet, Scope, Topology};

use crate::{
    node_limits_with_floor, pod_cpumask, pool_key, pool_node, Attrs, NodeLimits, PoolAttrs, PoolKey,
};

/// Why a plan cannot be made; the workqueue keeps its current attributes.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The requested cpumask has no CPU usable in the workqueue's topology.
    #[error("cpumask {mask} has no CPU usable in this topology (usable: {usable})")]
    NoUsableCpu {
        /// The requested mask.
        mask: CpuSet,
        /// The topology's usable CPUs.
        usable: CpuSet,
    },
    /// The pods of the scope could not be built.
    #[error(transparent)]
    Topology(#[from] podq_topology::Error),
}

/// The CPUs of a topology usable now, after hotplug or an affinity change: those of
/// `all` (the topology's usable CPUs) among `real` (the CPUs the process may use now);
/// all of them if none is left, since the OS then decides where workers run.
pub fn usable_now(all: &CpuSet, real: &CpuSet) -> CpuSet {
    let now = all.intersection(real);
    if now.is_empty() {
        all.clone()
    } else {
        now
    }
}

/// The effective cpumask of `requested` over the CPUs `usable` now: their intersection;
/// if empty while `requested` has CPUs of the topology (they went away), all usable
/// CPUs, as the kernel falls back to `wq_unbound_cpumask` (the requested mask is kept
/// and applies again when its CPUs come back). A mask with no CPU of the topology at
/// all is refused.
pub fn hotplug_cpumask(
    requested: &CpuSet,
    usable: &CpuSet,
    topology_usable: &CpuSet,
) -> Result<CpuSet, PlanError> {
    if let Some(mask) = crate::effective_cpumask(requested, usable) {
        return Ok(mask);
    }
    if requested.intersects(topology_usable) {
        return Ok(usable.clone());
    }
    Err(PlanError::NoUsableCpu {
        mask: requested.clone(),
        usable: topology_usable.clone(),
    })
}

/// What stays fixed for a workqueue across attribute changes.
#[derive(Clone, Copy, Debug)]
pub struct WqShape<'a> {
    /// The topology its CPU numbers refer to.
    pub topology: &'a Topology,
    /// The topology's identity in pool keys.
    pub topology_id: u64,
    /// Ordered: one pwq over the whole mask, new pwqs plugged behind older ones.
    pub ordered: bool,
    /// Its pools' worker idle timeout.
    pub idle_timeout: Duration,
    /// The process default scope, for `Scope::Default`.
    pub default_scope: Scope,
}

/// The workqueue as it is before the change.
#[derive(Clone, Copy, Debug)]
pub struct Current<'a> {
    /// The pool keys of the pwqs in its table now (each once).
    pub pools: &'a [PoolKey],
    /// Whether any pwq is alive (current or retiring with items): new pwqs of an ordered
    /// workqueue then start plugged.
    pub pwqs_alive: bool,
}

/// One pool of the new table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedPool {
    /// Its key: the runtime finds or creates the shared pool for it.
    pub key: PoolKey,
    /// The NUMA node its active items are charged to (`None`: the fallback counter).
    pub node: Option<usize>,
    /// The index in [`Current::pools`] of the pwq reused for it; `None`: a new pwq.
    pub reused: Option<usize>,
}

/// An attribute change, computed before anything changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The effective cpumask (where `queue()` selects CPUs).
    pub effective: CpuSet,
    /// The scope in use, `Default` resolved.
    pub scope: Scope,
    /// The pools of the new table; the first is the default pwq's (the whole effective
    /// mask), the others in order of their first CPU.
    pub pools: Vec<PlannedPool>,
    /// For each CPU number up to the last usable one, the index in `pools` of its pwq;
    /// `None` for CPUs not usable now.
    pub cpu_pool: Vec<Option<usize>>,
    /// Indices in [`Current::pools`] of pwqs no longer in the table: they stop being
    /// current and retire once their items are done.
    pub retired: Vec<usize>,
    /// New pwqs start plugged (ordered workqueues with older pwqs alive): they accept
    /// items but activate none until every older pwq has retired.
    pub plugged: bool,
    /// The node shares of `max_active`.
    pub limits: NodeLimits,
}

/// Plans the change of a workqueue shaped `wq`, now `current`, to the attributes `new`,
/// over the CPUs `usable` now (see [`usable_now`]). `new` is assumed valid (nice and
/// `max_active` in range, non-empty mask).
pub fn plan(
    current: &Current<'_>,
    new: &Attrs,
    usable: &CpuSet,
    wq: &WqShape<'_>,
) -> Result<Plan, PlanError> {
    let topology = wq.topology;
    let effective = hotplug_cpumask(&new.cpumask, usable, topology.usable())?;
    let scope = new.scope.resolve(wq.default_scope);
    let layout = if wq.ordered {
        None
    } else {
        Some(topology.pods(scope)?)
    };
    let attrs = PoolAttrs {
        topology: wq.topology_id,
        strict: new.strict,
        nice: new.nice,
        idle_timeout: wq.idle_timeout,
    };
    let mut pools: Vec<PlannedPool> = Vec::new();
    let mut pool_for = |pod: CpuSet| -> usize {
        let key = pool_key(pod, &attrs, &effective);
        if let Some(i) = pools.iter().position(|p| p.key == key) {
            return i;
        }
        pools.push(PlannedPool {
            node: pool_node(&key.pod, |c| topology.node_of(c)),
            reused: current.pools.iter().position(|k| *k == key),
            key,
        });
        pools.len() - 1
    };
    let dfl = pool_for(effective.clone());
    let size = usable.last().map_or(0, |c| c + 1);
    let cpu_pool = (0..size)
        .map(|cpu| {
            if !usable.contains(cpu) {
                return None;
            }
            let Some(layout) = &layout else {
                return Some(dfl);
            };
            let mask = match layout.pod_of(cpu) {
                Some(p) => pod_cpumask(&layout.pod_cpus[p], &effective),
                None => effective.clone(),
            };
            Some(pool_for(mask))
        })
        .collect();
    let retired = (0..current.pools.len())
        .filter(|&i| !pools.iter().any(|p| p.reused == Some(i)))
        .collect();
    let plugged = wq.ordered && current.pwqs_alive;
    let limits = node_limits_with_floor(new.max_active, new.min_active, &effective, topology);
    Ok(Plan {
        effective,
        scope,
        pools,
        cpu_pool,
        retired,
        plugged,
        limits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use podq_topology::CpuFacts;
    use proptest::prelude::*;

    fn set(cpus: &[usize]) -> CpuSet {
        cpus.iter().copied().collect()
    }

    /// `nodes` nodes of `cores` cores of 2 threads, one LLC per node, linear numbering.
    fn machine(nodes: usize, cores: usize) -> Topology {
        let per_node = cores * 2;
        let facts = (0..nodes * per_node).map(|c| {
            let node = c / per_node;
            (
                c,
                CpuFacts {
                    smt: set(&[c & !1, c | 1]),
                    llc: (node * per_node..(node + 1) * per_node).collect(),
                    node,
                    package: node,
                },
            )
        });
        let all = CpuSet::first_n(nodes * per_node);
        Topology::from_parts(all.clone(), all, facts).unwrap()
    }

    fn attrs(scope: Scope, strict: bool, cpumask: CpuSet) -> Attrs {
        Attrs {
            scope,
            strict,
            cpumask,
            nice: 0,
            max_active: 16,
            min_active: 8,
            ordered: false,
        }
    }

    fn shape(topology: &Topology, ordered: bool) -> WqShape<'_> {
        WqShape {
            topology,
            topology_id: 1,
            ordered,
            idle_timeout: Duration::from_secs(300),
            default_scope: Scope::CacheShard,
        }
    }

    const NONE: Current<'static> = Current {
        pools: &[],
        pwqs_alive: false,
    };

    fn pods(plan: &Plan) -> Vec<CpuSet> {
        plan.pools.iter().map(|p| p.key.pod.clone()).collect()
    }

    #[test]
    fn numa_plan_of_two_nodes() {
        let topo = machine(2, 2);
        let all = CpuSet::first_n(8);
        let p = plan(
            &NONE,
            &attrs(Scope::Numa, false, all.clone()),
            &all,
            &shape(&topo, false),
        )
        .unwrap();
        assert_eq!(p.effective, all);
        assert_eq!(p.scope, Scope::Numa);
        assert_eq!(
            pods(&p),
            vec![all.clone(), set(&[0, 1, 2, 3]), set(&[4, 5, 6, 7])]
        );
        assert_eq!(
            p.cpu_pool,
            vec![
                Some(1),
                Some(1),
                Some(1),
                Some(1),
                Some(2),
                Some(2),
                Some(2),
                Some(2)
            ]
        );
        assert_eq!(
            p.pools.iter().map(|p| p.node).collect::<Vec<_>>(),
            vec![None, Some(0), Some(1)]
        );
        assert!(p
            .pools
            .iter()
            .all(|p| p.reused.is_none() && p.key.cpumask == Some(all.clone())));
        assert_eq!(p.limits.per_node, vec![(0, 8), (1, 8)]);
        assert!(!p.plugged);
        assert!(p.retired.is_empty());
    }

    #[test]
    fn a_scope_change_reuses_and_retires() {
        let topo = machine(2, 2);
        let all = CpuSet::first_n(8);
        let wq = shape(&topo, false);
        let numa = plan(&NONE, &attrs(Scope::Numa, true, all.clone()), &all, &wq).unwrap();
        let keys: Vec<PoolKey> = numa.pools.iter().map(|p| p.key.clone()).collect();
        let current = Current {
            pools: &keys,
            pwqs_alive: true,
        };
        let smt = plan(&current, &attrs(Scope::Smt, true, all.clone()), &all, &wq).unwrap();
        assert_eq!(
            pods(&smt),
            vec![
                all.clone(),
                set(&[0, 1]),
                set(&[2, 3]),
                set(&[4, 5]),
                set(&[6, 7])
            ]
        );
        // The default pwq (whole mask, strict: no cpumask in the key) is reused.
        assert_eq!(smt.pools[0].reused, Some(0));
        assert!(smt.pools[1..].iter().all(|p| p.reused.is_none()));
        assert_eq!(smt.retired, vec![1, 2]);
        assert!(!smt.plugged, "only ordered workqueues plug");
    }

    #[test]
    fn hotplug_fallbacks() {
        let topo = machine(2, 2);
        let all = CpuSet::first_n(8);
        // CPUs 4-7 went away: a mask on them falls back to all usable CPUs.
        let usable = usable_now(&all, &set(&[0, 1, 2, 3, 9]));
        assert_eq!(usable, set(&[0, 1, 2, 3]));
        assert_eq!(usable_now(&all, &set(&[9])), all, "none left: all of them");
        let p = plan(
            &NONE,
            &attrs(Scope::Numa, false, set(&[4, 5])),
            &usable,
            &shape(&topo, false),
        )
        .unwrap();
        assert_eq!(p.effective, set(&[0, 1, 2, 3]));
        // Node 0's pod is the whole effective mask: one pool serves it and the default.
        assert_eq!(p.cpu_pool, vec![Some(0), Some(0), Some(0), Some(0)]);
        assert_eq!(pods(&p), vec![set(&[0, 1, 2, 3])]);
        // Strict pods of a 2-node mask, node 1 gone: node 1's CPUs are not in the table.
        assert_eq!(
            hotplug_cpumask(&set(&[1, 6]), &usable, &all).unwrap(),
            set(&[1])
        );
        let err = hotplug_cpumask(&set(&[20]), &usable, &all).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cpumask 20 has no CPU usable in this topology (usable: 0-7)"
        );
    }

    #[test]
    fn ordered_plans_one_plugged_pwq() {
        let topo = machine(1, 2);
        let all = CpuSet::first_n(4);
        let mut a = attrs(Scope::Cpu, false, all.clone());
        a.ordered = true;
        a.max_active = 1;
        let wq = shape(&topo, true);
        let first = plan(&NONE, &a, &all, &wq).unwrap();
        assert_eq!(first.cpu_pool, vec![Some(0); 4]);
        assert!(!first.plugged);
        let keys = vec![first.pools[0].key.clone()];
        let current = Current {
            pools: &keys,
            pwqs_alive: true,
        };
        a.nice = 5;
        let second = plan(&current, &a, &all, &wq).unwrap();
        assert!(second.plugged);
        assert_eq!(second.retired, vec![0]);
        assert_eq!(second.limits.per_node, vec![(0, 1)]);
    }

    fn any_scope() -> impl Strategy<Value = Scope> {
        prop_oneof![
            Just(Scope::Cpu),
            Just(Scope::Smt),
            Just(Scope::Cache),
            Just(Scope::CacheShard),
            Just(Scope::Numa),
            Just(Scope::System),
            Just(Scope::Default),
        ]
    }

    proptest! {
        /// Every usable CPU gets a pwq (and only those), every pod lies within the
        /// effective mask and holds its CPU, strict keys carry no cpumask, and planning
        /// the same attributes again reuses everything and retires nothing.
        #[test]
        fn plans_cover_every_usable_cpu(nodes in 1usize..4, cores in 1usize..4,
                                        scope in any_scope(), strict: bool, ordered: bool,
                                        mask_bits in 1u32.., usable_bits in 0u32..) {
            let topo = machine(nodes, cores);
            let n = nodes * cores * 2;
            let bits = |b: u32| -> CpuSet { (0..n).filter(|&c| b >> (c % 32) & 1 == 1).collect() };
            let all = CpuSet::first_n(n);
            let usable = usable_now(&all, &bits(usable_bits));
            let mut mask = bits(mask_bits);
            if mask.is_empty() {
                mask = all.clone();
            }
            let a = Attrs { ordered, ..attrs(scope, strict, mask) };
            let wq = shape(&topo, ordered);
            let p = plan(&NONE, &a, &usable, &wq).unwrap();
            prop_assert!(p.effective.is_subset(&usable) && !p.effective.is_empty());
            for cpu in 0..p.cpu_pool.len().max(n) {
                let pool = p.cpu_pool.get(cpu).copied().flatten();
                prop_assert_eq!(pool.is_some(), usable.contains(cpu), "cpu {}", cpu);
                if let Some(i) = pool {
                    let key = &p.pools[i].key;
                    prop_assert!(!key.pod.is_empty() && key.pod.is_subset(&p.effective));
                    if p.effective.contains(cpu) {
                        prop_assert!(key.pod.contains(cpu));
                    }
                    if ordered {
                        prop_assert_eq!(i, 0);
                    }
                }
            }
            for pool in &p.pools {
                prop_assert_eq!(pool.key.cpumask.is_none(), strict);
            }
            let keys: Vec<PoolKey> = p.pools.iter().map(|p| p.key.clone()).collect();
            let again = plan(&Current { pools: &keys, pwqs_alive: true }, &a, &usable, &wq).unwrap();
            prop_assert!(again.retired.is_empty());
            prop_assert!(again.pools.iter().enumerate().all(|(i, p)| p.reused == Some(i)));
            prop_assert_eq!(again.plugged, ordered);
        }
    }
}

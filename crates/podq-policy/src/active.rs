//! Active-item limits: `max_active`, its per-node shares, admission of new items and
//! the order waiting items are activated in.

use podq_topology::CpuSet;

/// The kernel's `WQ_MAX_ACTIVE`: the largest `max_active`.
pub const WQ_MAX_ACTIVE: usize = 2048;

/// The kernel's `WQ_DFL_ACTIVE`: `max_active` when none is given.
pub const WQ_DFL_ACTIVE: usize = 1024;

/// The kernel's `WQ_DFL_MIN_ACTIVE`: the per-node forward-progress floor.
pub const WQ_DFL_MIN_ACTIVE: usize = 8;

/// The valid range of `nice`, as the kernel's sysfs file.
pub const NICE_RANGE: std::ops::RangeInclusive<i32> = -20..=19;

/// The kernel's `min_active` default: `min(max_active, WQ_DFL_MIN_ACTIVE)`.
pub fn min_active(max_active: usize) -> usize {
    max_active.min(WQ_DFL_MIN_ACTIVE)
}

/// Whether `value` is a valid `max_active` (`1..=WQ_MAX_ACTIVE`). The kernel clamps
/// out-of-range values with a warning; podq refuses them so a typo is not silently
/// turned into a different limit.
pub fn valid_max_active(value: usize) -> bool {
    (1..=WQ_MAX_ACTIVE).contains(&value)
}

/// Whether `value` is a valid `min_active` for a workqueue whose `max_active` is
/// `max_active` (`0..=max_active`). The kernel's `workqueue_set_min_active` clamps to
/// that range; podq refuses values outside it, as it does for `max_active`.
pub fn valid_min_active(value: usize, max_active: usize) -> bool {
    value <= max_active
}

/// The per-node share of a system-wide `max_active` (`wq_update_node_max_active`):
/// `clamp(ceil(max_active * node_cpus / total_cpus), min_active, max_active)`, or
/// `min_active` when the workqueue has no CPU at all. The shares may sum to more than
/// `max_active`, as in the kernel.
pub fn node_max_active(
    max_active: usize,
    min_active: usize,
    node_cpus: usize,
    total_cpus: usize,
) -> usize {
    if total_cpus == 0 {
        return min_active;
    }
    let share = (max_active * node_cpus).div_ceil(total_cpus);
    share.clamp(min_active.min(max_active), max_active)
}

/// Whether one more item may become active on a node counter holding `nr` of `max`.
pub fn may_activate(nr: usize, max: usize) -> bool {
    nr < max
}

/// Where a newly queued item of a pool_workqueue goes (`__queue_work` step 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Straight onto the pool's worklist, taking an active slot.
    Activate,
    /// Behind the pwq's inactive items, to wait for a slot in FIFO order.
    Wait,
}

/// A pwq's queueing state, as admission and activation see it under the pwq lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PwqQueue {
    /// Items of the pwq waiting for an active slot (its inactive FIFO).
    pub inactive: usize,
    /// Ordered workqueues: the pwq may not activate until older pwqs are gone.
    pub plugged: bool,
    /// The pwq is on its node's pending list, waiting for a slot.
    pub on_pending: bool,
}

/// The admission of one new item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admit {
    /// Where the item goes.
    pub admission: Admission,
    /// The pwq must join its node's pending list (it was not waiting, and is not
    /// plugged); the caller then tries activation once more, since a slot may have been
    /// freed between the failed `try_slot` and joining the list.
    pub join_pending: bool,
}

/// Admission of a new item onto `pwq`: it becomes active only when nothing of its pwq
/// waits before it (no overtaking), the pwq is not plugged (ordered attribute change)
/// and not already waiting for a slot, and a node slot is free. `try_slot` takes a slot
/// from the node counter; it is called only when the pwq is quiet, and the caller holds
/// the slot exactly when the answer is [`Admission::Activate`].
pub fn admit(pwq: PwqQueue, try_slot: impl FnOnce() -> bool) -> Admit {
    let quiet = pwq.inactive == 0 && !pwq.plugged && !pwq.on_pending;
    if quiet && try_slot() {
        return Admit {
            admission: Admission::Activate,
            join_pending: false,
        };
    }
    Admit {
        admission: Admission::Wait,
        join_pending: !pwq.on_pending && !pwq.plugged,
    }
}

/// Most inactive items one pwq moves to its pool in a turn of activation before the
/// next pending pwq's turn. The kernel moves one per completed item; podq's workers
/// free slots in batches, and a turn takes as many as were freed, up to one worker's
/// batch: a pool woken for its turn then has a batch's work for the switch. Half a
/// batch made 256 one-CPU pools sharing a node's slots switch 87 times per 1000 items
/// against 48 (`PERFORMANCE.md`, "Activation turns of a batch").
pub const ACTIVATION_TURN: usize = crate::batch::MAX_BATCH;

/// Free active slots of a node counter with `nr` active items and limit `max`.
pub fn free_slots(nr: usize, max: usize) -> usize {
    max.saturating_sub(nr)
}

/// What activation (`node_activate_pending_pwq`) does with the pwq at the head of its
/// node's pending list, once it has taken slots for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// Nothing to activate (the pwq is plugged or has no inactive item): it leaves the
    /// pending list and the slots are given back.
    Leave,
    /// Move its first `count` inactive items (FIFO) to its pool; slots beyond `count`
    /// are given back. `requeue`: it has more, so it goes to the back of the pending
    /// list (round-robin across pwqs).
    Take {
        /// How many items it activates in this turn.
        count: usize,
        /// Whether the pwq stays pending, at the back of the list.
        requeue: bool,
    },
}

/// The activation turn of the head pwq of a pending list holding `slots` slots
/// (at most [`ACTIVATION_TURN`] are used).
pub fn activation(pwq: PwqQueue, slots: usize) -> Activation {
    if pwq.plugged || pwq.inactive == 0 {
        Activation::Leave
    } else {
        let count = pwq.inactive.min(slots).min(ACTIVATION_TURN);
        Activation::Take {
            count,
            requeue: pwq.inactive > count,
        }
    }
}

/// The `max_active` share of every node of a workqueue (`wq_update_node_max_active`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLimits {
    /// `(node, limit)` for each node of the topology, ascending.
    pub per_node: Vec<(usize, usize)>,
    /// The limit of the fallback counter, charged by pools that span nodes:
    /// `max_active` itself.
    pub fallback: usize,
}

/// The node shares of `max_active` over the effective cpumask `effective`
/// ([`node_max_active`] with the [`min_active`] floor). For example `max_active = 3` on
/// 2 nodes of 4 CPUs gives each node `max(ceil(3 * 4 / 8), 3) = 3`: up to 6 items run.
pub fn node_limits(
    max_active: usize,
    effective: &CpuSet,
    topology: &podq_topology::Topology,
) -> NodeLimits {
    node_limits_with_floor(max_active, min_active(max_active), effective, topology)
}

/// As [`node_limits`], with the workqueue's own `min_active` floor instead of the
/// default [`min_active`] (a floor above `max_active` is capped by it). For example `max_active = 16`, `min_active = 12` on 2
/// nodes of 4 CPUs, with 2 of them in the cpumask on node 1: node 0 gets
/// `max(ceil(16 * 4 / 6), 12) = 12`, node 1 `max(ceil(16 * 2 / 6), 12) = 12`.
pub fn node_limits_with_floor(
    max_active: usize,
    min_active: usize,
    effective: &CpuSet,
    topology: &podq_topology::Topology,
) -> NodeLimits {
    let min = min_active;
    let total = effective.len();
    let per_node = topology
        .nodes()
        .into_iter()
        .map(|node| {
            let cpus = effective.intersection(&topology.node_cpus(node)).len();
            (node, node_max_active(max_active, min, cpus, total))
        })
        .collect();
    NodeLimits {
        per_node,
        fallback: max_active,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_shares_follow_the_kernel_formula() {
        // 2 nodes of 4 CPUs, max 16: each gets ceil(16*4/8) = 8.
        assert_eq!(node_max_active(16, 8, 4, 8), 8);
        // Uneven: 3 of 8 CPUs -> ceil(48/8)=6, clamped up to min_active 8.
        assert_eq!(node_max_active(16, 8, 3, 8), 8);
        // ceil rounding: 10 * 1 / 3 = 3.33 -> 4.
        assert_eq!(node_max_active(10, 1, 1, 3), 4);
        // Clamped to max_active.
        assert_eq!(node_max_active(4, 4, 8, 8), 4);
        // No CPU at all: min_active.
        assert_eq!(node_max_active(100, 8, 0, 0), 8);
        // Shares may sum to more than max_active.
        let total: usize = (0..3).map(|_| node_max_active(10, 8, 1, 3)).sum();
        assert!(total > 10);
        // min_active larger than max_active never exceeds max_active.
        assert_eq!(node_max_active(2, 8, 1, 4), 2);
    }

    #[test]
    fn max_active_bounds() {
        assert!(!valid_max_active(0));
        assert!(valid_max_active(1));
        assert!(valid_max_active(WQ_MAX_ACTIVE));
        assert!(!valid_max_active(WQ_MAX_ACTIVE + 1));
        assert_eq!(min_active(1), 1);
        assert_eq!(min_active(WQ_DFL_ACTIVE), WQ_DFL_MIN_ACTIVE);
    }

    #[test]
    fn min_active_bounds() {
        assert!(valid_min_active(0, 1));
        assert!(valid_min_active(8, 8));
        assert!(!valid_min_active(9, 8));
        assert!(valid_min_active(WQ_MAX_ACTIVE, WQ_MAX_ACTIVE));
        assert!(!valid_min_active(usize::MAX, WQ_MAX_ACTIVE));
    }

    #[test]
    fn node_limits_use_the_requested_floor() {
        let topo = podq_topology::Topology::synthetic("2s4c1t").unwrap();
        let mask = CpuSet::parse_list("0-3,4-5").unwrap();
        // Default floor 8: node 0 ceil(64/6) = 11, node 1 ceil(32/6) = 6 -> 8.
        let dfl = node_limits(16, &mask, &topo);
        assert_eq!(dfl.per_node, [(0, 11), (1, 8)]);
        assert_eq!(
            node_limits_with_floor(16, WQ_DFL_MIN_ACTIVE, &mask, &topo),
            dfl
        );
        // Floor 12 lifts both nodes to 12.
        let high = node_limits_with_floor(16, 12, &mask, &topo);
        assert_eq!(high.per_node, [(0, 12), (1, 12)]);
        assert_eq!(high.fallback, 16);
        // Floor 0: the plain proportional shares.
        let none = node_limits_with_floor(16, 0, &mask, &topo);
        assert_eq!(none.per_node, [(0, 11), (1, 6)]);
        // A floor above max_active is capped by it.
        let capped = node_limits_with_floor(4, 12, &mask, &topo);
        assert_eq!(capped.per_node, [(0, 4), (1, 4)]);
    }

    fn q(inactive: usize, plugged: bool, on_pending: bool) -> PwqQueue {
        PwqQueue {
            inactive,
            plugged,
            on_pending,
        }
    }

    const ACTIVATE: Admit = Admit {
        admission: Admission::Activate,
        join_pending: false,
    };

    fn wait(join_pending: bool) -> Admit {
        Admit {
            admission: Admission::Wait,
            join_pending,
        }
    }

    #[test]
    fn admission_never_overtakes() {
        assert_eq!(admit(q(0, false, false), || true), ACTIVATE);
        // No slot: wait, and join the pending list.
        assert_eq!(admit(q(0, false, false), || false), wait(true));
        // Items wait before it: behind them, no slot is even tried.
        assert_eq!(admit(q(2, false, true), || panic!("no try")), wait(false));
        assert_eq!(admit(q(1, false, false), || panic!("no try")), wait(true));
        // Plugged: waits, but not on the pending list (unplugging puts it there).
        assert_eq!(admit(q(0, true, false), || panic!("no try")), wait(false));
        assert!(may_activate(0, 1));
        assert!(!may_activate(1, 1));
    }

    #[test]
    fn activation_steps() {
        assert_eq!(activation(q(0, false, true), 4), Activation::Leave);
        assert_eq!(activation(q(3, true, true), 4), Activation::Leave);
        let take = |count, requeue| Activation::Take { count, requeue };
        assert_eq!(activation(q(1, false, true), 1), take(1, false));
        assert_eq!(activation(q(2, false, true), 1), take(1, true));
        assert_eq!(activation(q(3, false, true), 5), take(3, false));
        assert_eq!(activation(q(40, false, true), 30), take(30, true));
        assert_eq!(
            activation(q(40, false, true), 35),
            take(ACTIVATION_TURN, true)
        );
        assert_eq!(ACTIVATION_TURN, 32);
        assert_eq!(activation(q(40, false, true), 0), take(0, true));
        assert_eq!(free_slots(3, 8), 5);
        assert_eq!(free_slots(9, 8), 0);
    }

    #[test]
    fn node_limits_of_two_nodes() {
        use podq_topology::{CpuFacts, Topology};
        let facts = (0..8).map(|c| {
            let node = c / 4;
            let cpus: CpuSet = (node * 4..node * 4 + 4).collect();
            (
                c,
                CpuFacts {
                    smt: CpuSet::single(c),
                    llc: cpus,
                    node,
                    package: node,
                },
            )
        });
        let topo = Topology::from_parts(CpuSet::first_n(8), CpuSet::first_n(8), facts).unwrap();
        let all = CpuSet::first_n(8);
        // The documented example: max_active 3 on 2 nodes lets 6 run.
        let three = node_limits(3, &all, &topo);
        assert_eq!(three.per_node, vec![(0, 3), (1, 3)]);
        assert_eq!(three.fallback, 3);
        assert_eq!(
            node_limits(64, &all, &topo).per_node,
            vec![(0, 32), (1, 32)]
        );
        // A mask on node 0 only: node 1 keeps the floor.
        let node0: CpuSet = (0..4).collect();
        assert_eq!(
            node_limits(64, &node0, &topo).per_node,
            vec![(0, 64), (1, 8)]
        );
    }

    /// The activation order of a node with `slots` free slots and pwqs waiting with
    /// `inactive[i]` items each, joined in index order, when each activation pass holds
    /// `pass` slots (completions settled `pass` at a time): `(pwq, item)` in run order.
    fn activation_order(inactive: &[usize], slots: usize, pass: usize) -> Vec<(usize, usize)> {
        let mut left = inactive.to_vec();
        let mut taken = vec![0; inactive.len()];
        let mut pending: std::collections::VecDeque<usize> =
            (0..inactive.len()).filter(|&i| inactive[i] > 0).collect();
        let mut order = Vec::new();
        while order.len() < slots {
            let Some(p) = pending.pop_front() else { break };
            let held = pass.min(slots - order.len());
            match activation(q(left[p], false, true), held) {
                Activation::Leave => {}
                Activation::Take { count, requeue } => {
                    for _ in 0..count {
                        order.push((p, taken[p]));
                        taken[p] += 1;
                        left[p] -= 1;
                    }
                    if requeue {
                        pending.push_back(p);
                    }
                }
            }
        }
        order
    }

    #[test]
    fn activation_round_robins_pwqs() {
        assert_eq!(
            activation_order(&[3, 1, 2], 10, 1),
            vec![(0, 0), (1, 0), (2, 0), (0, 1), (2, 1), (0, 2)]
        );
        assert_eq!(activation_order(&[3, 1, 2], 2, 1), vec![(0, 0), (1, 0)]);
        // Slots freed two at a time: each turn takes two.
        assert_eq!(
            activation_order(&[3, 1, 2], 10, 2),
            vec![(0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (0, 2)]
        );
    }

    proptest::proptest! {
        /// Within a pwq items activate in FIFO order, every waiting item is activated
        /// when slots suffice, and no pwq is served twice while another waits.
        #[test]
        fn activation_is_fifo_and_fair(inactive in proptest::collection::vec(0usize..40, 1..6),
                                       slots in 0usize..200, pass in 1usize..40) {
            let order = activation_order(&inactive, slots, pass);
            let total: usize = inactive.iter().sum();
            proptest::prop_assert_eq!(order.len(), total.min(slots));
            let mut next = vec![0; inactive.len()];
            for &(p, i) in &order {
                proptest::prop_assert_eq!(i, next[p], "FIFO within a pwq");
                next[p] += 1;
            }
            for (k, &(p, i)) in order.iter().enumerate() {
                // Between this pwq's item i and i+1, each other pwq gets at most one
                // turn of at most ACTIVATION_TURN items.
                if let Some(j) = order[k + 1..].iter().position(|&(q, n)| q == p && n == i + 1) {
                    let between = &order[k + 1..k + 1 + j];
                    for other in 0..inactive.len() {
                        proptest::prop_assert!(between.iter().filter(|&&(q, _)| q == other).count() <= ACTIVATION_TURN);
                    }
                }
            }
        }

        /// Admission never lets a new item overtake one of its pwq that waits, and
        /// never activates without a slot.
        #[test]
        fn admission_never_overtakes_prop(inactive in 0usize..4, plugged: bool, on_pending: bool, slot: bool) {
            let mut tried = false;
            let a = admit(q(inactive, plugged, on_pending), || { tried = true; slot });
            if a.admission == Admission::Activate {
                proptest::prop_assert!(inactive == 0 && !plugged && !on_pending && tried && slot);
            }
            proptest::prop_assert!(!(tried && (inactive > 0 || plugged || on_pending)));
            proptest::prop_assert!(!(a.join_pending && (on_pending || plugged)));
        }
    }
}

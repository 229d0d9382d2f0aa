//! Active-item limits: `max_active`, its per-node shares and admission of new items.

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

/// Admission of a new item: it becomes active only when nothing of its pwq waits before
/// it (no overtaking), the pwq is not plugged (ordered attribute change) and not already
/// waiting for a slot, and a node slot is free.
pub fn admission(
    inactive_empty: bool,
    plugged: bool,
    pwq_waiting: bool,
    slot_free: bool,
) -> Admission {
    if inactive_empty && !plugged && !pwq_waiting && slot_free {
        Admission::Activate
    } else {
        Admission::Wait
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
    fn admission_never_overtakes() {
        assert_eq!(admission(true, false, false, true), Admission::Activate);
        assert_eq!(admission(false, false, false, true), Admission::Wait);
        assert_eq!(admission(true, true, false, true), Admission::Wait);
        assert_eq!(admission(true, false, true, true), Admission::Wait);
        assert_eq!(admission(true, false, false, false), Admission::Wait);
        assert!(may_activate(0, 1));
        assert!(!may_activate(1, 1));
    }
}

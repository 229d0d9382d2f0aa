//! The `auto` controller's thresholds and limits.

use serde::{Deserialize, Serialize};

/// The controller's thresholds and limits. Defaults are for 100 ms windows. In JSON,
/// missing fields take their defaults and unknown ones are refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutoConfig {
    /// Windows with fewer finished items are too quiet to judge.
    pub min_items: u64,
    /// A pod's lock is judged only with at least this many acquisitions in the window.
    pub min_acquisitions: u64,
    /// Consecutive windows a problem must be seen in before a switch.
    pub confirm_windows: u32,
    /// Windows after a switch before the next one (and before its outcome is judged).
    pub min_dwell_windows: u32,
    /// At most this many switches ...
    pub max_switches: u32,
    /// ... in any this many windows.
    pub rate_windows: u32,
    /// Lock contention: the share of a pod's CPU time spent waiting for its pool lock
    /// that counts as a problem.
    pub lock_wait_enter: f64,
    /// Below this share a lock is cool: the confirmation count restarts.
    pub lock_wait_exit: f64,
    /// A pod busy for at least this share of its CPUs' time is saturated.
    pub saturated_busy: f64,
    /// A pod busy for at most this share, with no backlog, is idle.
    pub idle_busy: f64,
    /// Imbalance needs idle CPUs worth at least this share of the saturated ones.
    pub min_idle_share: f64,
    /// Spill: the share of items run outside their LLC that makes a wide scope too wide
    /// when nothing is saturated.
    pub spill_share: f64,
    /// A switch whose items/s falls by more than this share is reverted.
    pub regression: f64,
    /// A switch whose items/s falls below this share of what it was is reverted as
    /// soon as `confirm_windows` windows show it, without waiting for the dwell.
    pub collapse: f64,
    /// A step must reduce the problem it was made for by this share to be followed by
    /// another step in the same direction.
    pub min_gain: f64,
    /// Two loads are the same when their per-node arrival shares differ by at most this
    /// (sum of differences) and their arrival rates by at most this share.
    pub same_load: f64,
}

impl Default for AutoConfig {
    fn default() -> Self {
        AutoConfig {
            min_items: 64,
            min_acquisitions: 32,
            confirm_windows: 3,
            min_dwell_windows: 10,
            max_switches: 4,
            rate_windows: 300,
            lock_wait_enter: 0.05,
            lock_wait_exit: 0.02,
            saturated_busy: 0.85,
            idle_busy: 0.30,
            min_idle_share: 0.25,
            spill_share: 0.5,
            regression: 0.05,
            collapse: 0.5,
            min_gain: 0.2,
            same_load: 0.25,
        }
    }
}

impl AutoConfig {
    /// Checks the values: shares in `0..=1`, the exit threshold not above the enter
    /// one, at least one confirmation window and one switch per rate span.
    pub fn validate(&self) -> Result<(), String> {
        let shares = [
            ("lock_wait_enter", self.lock_wait_enter),
            ("lock_wait_exit", self.lock_wait_exit),
            ("saturated_busy", self.saturated_busy),
            ("idle_busy", self.idle_busy),
            ("min_idle_share", self.min_idle_share),
            ("spill_share", self.spill_share),
            ("regression", self.regression),
            ("collapse", self.collapse),
            ("min_gain", self.min_gain),
            ("same_load", self.same_load),
        ];
        if let Some((name, value)) = shares.iter().find(|(_, v)| !(0.0..=1.0).contains(v)) {
            return Err(format!("{name} = {value}: must be a share in 0..=1"));
        }
        if self.lock_wait_exit > self.lock_wait_enter {
            return Err(format!(
                "lock_wait_exit = {} is above lock_wait_enter = {}",
                self.lock_wait_exit, self.lock_wait_enter
            ));
        }
        if self.confirm_windows == 0 || self.max_switches == 0 || self.rate_windows == 0 {
            return Err("confirm_windows, max_switches and rate_windows must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_are_checked() {
        assert_eq!(AutoConfig::default().validate(), Ok(()));
        let bad = |c: AutoConfig| c.validate().unwrap_err();
        let e = bad(AutoConfig {
            idle_busy: 1.5,
            ..AutoConfig::default()
        });
        assert_eq!(e, "idle_busy = 1.5: must be a share in 0..=1");
        let e = bad(AutoConfig {
            lock_wait_exit: 0.1,
            ..AutoConfig::default()
        });
        assert!(e.starts_with("lock_wait_exit = 0.1 is above"), "{e}");
        assert!(bad(AutoConfig {
            confirm_windows: 0,
            ..AutoConfig::default()
        })
        .contains("confirm_windows"));
        assert!(bad(AutoConfig {
            saturated_busy: f64::NAN,
            ..AutoConfig::default()
        })
        .contains("saturated_busy"));
    }
}

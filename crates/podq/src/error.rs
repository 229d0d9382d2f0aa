//! The crate's one error type.

use podq_topology::{CpuSet, Scope};

/// Everything a podq call can refuse. Each variant names the value at fault. More
/// variants may come: match with a wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A cpumask with no CPU in it.
    #[error("empty cpumask")]
    EmptyCpumask,
    /// A cpumask none of whose CPUs is usable in the workqueue's topology.
    #[error("cpumask {mask} has no CPU usable in this topology (usable: {usable})")]
    NoUsableCpu {
        /// The requested mask.
        mask: CpuSet,
        /// The topology's usable CPUs.
        usable: CpuSet,
    },
    /// `max_active` outside `1..=2048` (the kernel's `WQ_MAX_ACTIVE`).
    #[error("invalid max_active {value}: must be in 1..=2048")]
    InvalidMaxActive {
        /// The requested value.
        value: usize,
    },
    /// `min_active` above the workqueue's `max_active`.
    #[error("invalid min_active {value}: must be in 0..={max_active} (the max_active)")]
    InvalidMinActive {
        /// The requested value.
        value: usize,
        /// The workqueue's `max_active`.
        max_active: usize,
    },
    /// `nice` outside `-20..=19`.
    #[error("invalid nice {value}: must be in -20..=19")]
    InvalidNice {
        /// The requested value.
        value: i32,
    },
    /// An attribute that ordered workqueues freeze (`max_active`, `ordered`).
    #[error("workqueue `{wq}` is ordered: {what} cannot change")]
    Ordered {
        /// The workqueue.
        wq: String,
        /// The attribute.
        what: &'static str,
    },
    /// `default` offered as the process-wide default scope.
    #[error("`{scope}` cannot be the process default scope")]
    DefaultScope {
        /// The refused scope.
        scope: Scope,
    },
    /// A CPU number that is not usable in the workqueue's topology.
    #[error("CPU {cpu} is not usable in this topology (usable: {usable})")]
    InvalidCpu {
        /// The CPU.
        cpu: usize,
        /// The topology's usable CPUs.
        usable: CpuSet,
    },
    /// Queueing refused because the workqueue is draining and the caller is not one of
    /// its own items (only chained queueing is accepted while draining).
    #[error("workqueue `{wq}` is draining: only its own items may queue")]
    Draining {
        /// The workqueue.
        wq: String,
    },
    /// An attribute change reached a workqueue whose last handle was dropped (through
    /// the control plane, for a request made before the drop hid it).
    #[error("workqueue `{wq}` is destroyed: its attributes no longer change")]
    Destroyed {
        /// The workqueue.
        wq: String,
    },
    /// An `auto` window shorter than 1 ms.
    #[error("invalid auto window {window:?}: must be at least 1 ms")]
    InvalidAutoWindow {
        /// The requested window.
        window: std::time::Duration,
    },
    /// `auto` controller settings that make no sense.
    #[error("invalid auto config: {reason}")]
    InvalidAutoConfig {
        /// What is wrong.
        reason: String,
    },
    /// The `auto` scope asked of a build without the `stats` feature: `auto` chooses from
    /// the statistics, which that build does not record, so it would never switch.
    #[error("the `auto` scope needs podq's `stats` feature: it chooses from the statistics, which this build compiles out")]
    AutoNeedsStats,
    /// [`crate::Work::disable`] on an item already disabled as deep as it goes.
    #[error("work item is disabled {max} times already: cannot disable it again")]
    DisableDepth {
        /// The deepest disable nesting.
        max: u32,
    },
    /// [`crate::Work::enable`] on an item that is not disabled.
    #[error("work item is not disabled: nothing to enable")]
    NotDisabled,
    /// [`crate::Workqueue::freeze`] called from one of the workqueue's own items: it
    /// waits until none of them runs, so it would wait for itself.
    #[error(
        "workqueue `{wq}` cannot be frozen from one of its own items: freeze waits until none runs"
    )]
    FreezeFromOwnItem {
        /// The workqueue.
        wq: String,
    },
    /// [`crate::Workqueue::freeze`] gave up waiting for the running items because the
    /// workqueue was thawed meanwhile.
    #[error("workqueue `{wq}` was thawed before its running items finished")]
    ThawedWhileFreezing {
        /// The workqueue.
        wq: String,
    },
    /// A stall the watchdog found (told to error hooks, see [`crate::watchdog`]).
    #[error("{0}")]
    Stall(crate::watchdog::Stall),
    /// A watchdog threshold below 1 ms.
    #[error("invalid {what} threshold {threshold:?}: must be at least 1ms")]
    InvalidWatchdogThreshold {
        /// Which threshold (`stall`, `long-item`).
        what: &'static str,
        /// The requested value.
        threshold: std::time::Duration,
    },
    /// A worker stack size of 0 bytes.
    #[error("invalid stack size {bytes}: must be more than 0 bytes")]
    InvalidStackSize {
        /// The requested size.
        bytes: usize,
    },
    /// A workqueue name that is empty.
    #[error("workqueue name must not be empty")]
    EmptyName,
    /// An operating-system call failed.
    #[error("{call} failed")]
    Os {
        /// The call.
        call: &'static str,
        /// The error it returned.
        #[source]
        source: std::io::Error,
    },
    /// The topology could not be read or built.
    #[error(transparent)]
    Topology(#[from] podq_topology::Error),
}

/// A refused [`crate::Workqueue::try_spawn`]: why, and the closure, given back unrun.
pub struct SpawnError<F> {
    error: Error,
    f: F,
}

impl<F> SpawnError<F> {
    pub(crate) fn new(error: Error, f: F) -> SpawnError<F> {
        SpawnError { error, f }
    }

    /// Why the spawn was refused (today [`Error::Draining`]).
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The closure, unrun.
    pub fn into_inner(self) -> F {
        self.f
    }

    /// The reason and the closure.
    pub fn into_parts(self) -> (Error, F) {
        (self.error, self.f)
    }
}

impl<F> std::fmt::Debug for SpawnError<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<F> std::fmt::Display for SpawnError<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "spawn refused: {}", self.error)
    }
}

impl<F> std::error::Error for SpawnError<F> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

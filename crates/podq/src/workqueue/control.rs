//! Workqueues on the control plane: [`Workqueue::expose`] makes one visible by name
//! (the kernel's `WQ_SYSFS`), and its attributes reach the same code paths as the
//! `set_*` methods. The registry holds a `Weak` to the user-held handle, so a visible
//! workqueue still goes away when its last handle is dropped.

use std::sync::{Arc, Weak};

use super::{lock, WqHandle};
use crate::control::{AttrValue, ControlError, ControlledQueue, QueueAttrs, Registry};
use crate::stats::WorkqueueStats;
use crate::Workqueue;

impl Workqueue {
    /// Makes this workqueue visible to the control server under its name, like the
    /// kernel's `WQ_SYSFS` flag. Refused if a live visible workqueue has the name.
    /// Visibility never keeps the workqueue alive.
    ///
    /// ```
    /// use podq::Workqueue;
    ///
    /// let first = Workqueue::builder("doc-exposed").build()?;
    /// first.expose()?;
    /// let second = Workqueue::builder("doc-exposed").build()?;
    /// assert!(second.expose().is_err()); // the name is taken while `first` lives
    /// first.hide();
    /// second.expose()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn expose(&self) -> Result<(), ControlError> {
        let handle: Weak<dyn ControlledQueue> = Arc::downgrade(&self.handle) as Weak<_>;
        Registry::global().register(self.name(), handle)
    }

    /// Hides this workqueue from the control server again.
    pub fn hide(&self) {
        Registry::global().unregister(self.name());
    }
}

impl ControlledQueue for WqHandle {
    fn attrs(&self) -> QueueAttrs {
        let cfg = lock(&self.shared.config);
        let a = &cfg.attrs;
        QueueAttrs {
            scope: a.scope,
            effective_scope: cfg.effective_scope,
            strict: a.strict,
            cpumask: a.cpumask.clone(),
            nice: a.nice,
            max_active: a.max_active,
            min_active: a.min_active,
            ordered: a.ordered,
        }
    }

    fn frozen(&self) -> bool {
        self.shared.freeze.is_frozen()
    }

    fn nr_cpu_ids(&self) -> usize {
        self.shared.topology.possible().last().map_or(1, |c| c + 1)
    }

    fn apply(&self, value: AttrValue) -> Result<(), ControlError> {
        let wq = &self.shared;
        let attr = value.attr();
        let result = match value {
            AttrValue::AffinityScope(scope) => wq.change(|a| a.scope = scope),
            AttrValue::AffinityStrict(strict) => wq.change(|a| a.strict = strict),
            AttrValue::Cpumask(mask) => wq.change(|a| a.cpumask = mask),
            AttrValue::Nice(nice) => wq.change(|a| a.nice = nice),
            AttrValue::MaxActive(n) => wq.set_max_active(n),
            AttrValue::MinActive(n) => wq.set_min_active(n),
        };
        result.map_err(|e| ControlError::Rejected {
            what: format!("{attr} of {}", wq.name),
            source: Box::new(e),
        })
    }

    fn stats(&self) -> WorkqueueStats {
        self.shared.stats_snapshot()
    }

    fn dump(&self) -> crate::WorkqueueDump {
        self.shared.dump()
    }
}

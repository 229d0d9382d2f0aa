//! Workqueues on the control plane: [`Workqueue::expose`] makes one visible by name
//! (the kernel's `WQ_SYSFS`), and its attributes reach the same code paths as the
//! `set_*` methods. The registry holds a `Weak` to the user-held handle, so a visible
//! workqueue still goes away when its last handle is dropped.

use std::sync::{Arc, Weak};

use super::{lock, WqHandle};
use crate::control::{AttrValue, ControlledQueue, QueueAttrs, Registry};
use crate::Error;
use crate::Workqueue;

impl Workqueue {
    /// Makes this workqueue visible to the control server under its name, like the
    /// kernel's `WQ_SYSFS` flag. Refused if a live visible workqueue has the name.
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
    /// # Ok::<(), podq::Error>(())
    /// ```
    pub fn expose(&self) -> Result<(), Error> {
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
            ordered: a.ordered,
        }
    }

    fn nr_cpu_ids(&self) -> usize {
        self.shared.topology.possible().last().map_or(1, |c| c + 1)
    }

    fn apply(&self, value: AttrValue) -> Result<(), Error> {
        let wq = &self.shared;
        let attr = value.attr();
        let result = match value {
            AttrValue::AffinityScope(scope) => wq.change(|a| a.scope = scope),
            AttrValue::AffinityStrict(strict) => wq.change(|a| a.strict = strict),
            AttrValue::Cpumask(mask) => wq.change(|a| a.cpumask = mask),
            AttrValue::Nice(nice) => wq.change(|a| a.nice = nice),
            AttrValue::MaxActive(n) => wq.set_max_active(n),
        };
        result.map_err(|e| Error::Rejected {
            what: format!("{attr} of {}", wq.name),
            reason: e.to_string(),
        })
    }

    fn stats(&self) -> serde_json::Value {
        serde_json::to_value(self.shared.stats_snapshot()).unwrap_or_else(
            |e| serde_json::json!({ "name": self.shared.name, "error": e.to_string() }),
        )
    }
}

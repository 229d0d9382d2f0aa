//! Workqueues on the control plane: [`Workqueue::expose`] makes one visible by name
//! (the kernel's `WQ_SYSFS`), and its attributes reach the same code paths as the
//! `set_*` methods. The registry holds a `Weak` to the workqueue's shared state, never
//! to a user handle: a request in progress keeps that state alive, not the workqueue,
//! so the last user handle's drop still tears the workqueue down on the dropping
//! thread, waiting for its items. That drop first hides it, as the kernel's
//! `destroy_workqueue` first removes the sysfs device; a request that got the state
//! before is refused any change once the teardown marked it destroyed.

use std::sync::{Arc, Weak};

use super::{lock, WqShared};
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
        let shared: Weak<dyn ControlledQueue> = Arc::downgrade(self.shared()) as Weak<_>;
        Registry::global().register(self.name(), shared)
    }

    /// Hides this workqueue from the control server again (a no-op if another
    /// workqueue holds its name there).
    pub fn hide(&self) {
        self.shared().hide();
    }
}

impl WqShared {
    /// Takes the workqueue off the control plane if it is the one visible under its name.
    pub(super) fn hide(&self) {
        Registry::global().unregister(&self.name, std::ptr::from_ref(self).cast());
    }
}

impl ControlledQueue for WqShared {
    fn attrs(&self) -> QueueAttrs {
        let cfg = lock(&self.config);
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
        self.freeze.is_frozen()
    }

    fn nr_cpu_ids(&self) -> usize {
        self.topology.possible().last().map_or(1, |c| c + 1)
    }

    fn apply(self: Arc<Self>, value: AttrValue) -> Result<(), ControlError> {
        let wq = &self;
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
        self.stats_snapshot()
    }

    fn dump(&self) -> crate::WorkqueueDump {
        WqShared::dump(self)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use crate::control::{AttrValue, Registry};
    use crate::{Scope, Workqueue};

    /// A control request that looked the workqueue up (and so holds its state) while
    /// the user drops the last handle: the drop still drains on the dropping thread,
    /// waiting for the running item, the workqueue is hidden from the moment the drop
    /// begins, and the request's change, made after the teardown, is refused. With
    /// the registry holding the user handle, the drop returned at once and the
    /// request's thread tore the workqueue down.
    #[test]
    fn a_request_in_progress_does_not_take_over_the_last_handle() {
        const NAME: &str = "control-request-in-progress";
        let wq = Workqueue::builder(NAME).build().unwrap();
        wq.expose().unwrap();
        let (started_tx, started) = mpsc::channel();
        let (release, gate) = mpsc::channel::<()>();
        let item = wq.spawn(move || {
            started_tx.send(()).unwrap();
            gate.recv().unwrap();
        });
        started.recv().unwrap();
        let held = Registry::global().get(NAME).unwrap();
        let dropper = std::thread::spawn(move || drop(wq));
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !dropper.is_finished(),
            "the last handle's drop returned while its item still ran"
        );
        assert!(
            Registry::global().get(NAME).is_err(),
            "hidden from the moment the drop began"
        );
        release.send(()).unwrap();
        dropper.join().unwrap();
        item.join().unwrap();
        let refused = held
            .apply(AttrValue::AffinityScope(Scope::Cpu))
            .unwrap_err();
        let text = std::error::Error::source(&refused).map(ToString::to_string);
        assert_eq!(
            text.as_deref(),
            Some("workqueue `control-request-in-progress` is destroyed: its attributes no longer change")
        );
    }
}

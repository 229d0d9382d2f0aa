//! Labelled one-shot items: [`Workqueue::spawn_named`].

use std::sync::Arc;

use crate::error::SpawnError;
use crate::join::JoinHandle;
use crate::Workqueue;

impl Workqueue {
    /// As [`Workqueue::spawn`], the item labelled `label`, which [`crate::current()`]
    /// reports while it runs.
    ///
    /// ```
    /// let wq = podq::Workqueue::builder("doc-spawn-named").build()?;
    /// let label = wq.spawn_named("checksum", || podq::current().unwrap().label);
    /// assert_eq!(label.join().unwrap().as_deref(), Some("checksum"));
    /// # Ok::<(), podq::Error>(())
    /// ```
    ///
    /// # Panics
    /// If the workqueue is draining and the caller is not one of its items; use
    /// [`Workqueue::try_spawn_named`] to get an error instead.
    pub fn spawn_named<T: Send + 'static>(
        &self,
        label: impl Into<Arc<str>>,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> JoinHandle<T> {
        match self.try_spawn_named(label, f) {
            Ok(handle) => handle,
            Err(e) => panic!("{}", e.error()),
        }
    }

    /// As [`Workqueue::try_spawn`], the item labelled `label`.
    pub fn try_spawn_named<T, F>(
        &self,
        label: impl Into<Arc<str>>,
        f: F,
    ) -> Result<JoinHandle<T>, SpawnError<F>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        self.try_spawn_labelled(Some(label.into()), f)
    }
}

//! Work items: the re-queueable [`Work`] with its PENDING bit. The queue entries that
//! carry them through pools are in `entry.rs`. Protocol: `work/README.md`.

mod state;

use std::any::Any;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub(crate) use state::{Start, WorkState, PENDING};
use state::{MAX_DISABLE_DEPTH, RUNNING};

use crate::entry::Entry;
use crate::Error;
use std::sync::Arc;

/// A re-queueable work item.
///
/// Queueing sets its PENDING bit; queueing it again while pending does nothing and
/// returns `false`. The bit clears just before the function runs, so queueing it while
/// it runs schedules one more run, which starts after the running one returns: an item
/// never runs concurrently with itself. Clones are handles to the same item.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use podq::{Work, Workqueue};
///
/// let wq = Workqueue::builder("doc-work").build().unwrap();
/// let runs = Arc::new(AtomicUsize::new(0));
/// let counter = runs.clone();
/// let work = Work::new(move || {
///     counter.fetch_add(1, Ordering::SeqCst);
/// });
/// assert!(wq.queue(&work));
/// work.flush();
/// assert_eq!(runs.load(Ordering::SeqCst), 1);
/// assert!(!work.is_pending());
/// ```
#[derive(Clone)]
pub struct Work {
    pub(crate) inner: Arc<WorkInner>,
}

/// The shared part of a work item. Legend: I set at init; A see [`WorkState`].
pub(crate) struct WorkInner {
    /// A: the state word and its handoff and wait slots.
    pub(crate) state: WorkState<Entry>,
    /// I: the function.
    func: Box<dyn Fn() + Send + Sync>,
    /// I: the label given by [`Work::named`].
    pub(crate) label: Option<Arc<str>>,
}

impl fmt::Debug for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Work")
            .field("label", &self.label())
            .field("pending", &self.is_pending())
            .field("running", &self.is_running())
            .field("disabled", &self.inner.state.disable_depth())
            .finish()
    }
}

impl Work {
    /// A new idle work item running `f` each time it is queued.
    pub fn new(f: impl Fn() + Send + Sync + 'static) -> Work {
        Work::build(None, Box::new(f))
    }

    /// As [`Work::new`], with a label that [`crate::current()`] reports while it runs
    /// (the kernel's work function name, as `show_workqueue_state` prints it).
    ///
    /// ```
    /// use podq::{Work, Workqueue};
    ///
    /// let wq = Workqueue::builder("doc-named").build()?;
    /// let work = Work::named("rpc_release", || {
    ///     let me = podq::current().expect("inside an item");
    ///     assert_eq!(me.label.as_deref(), Some("rpc_release"));
    ///     assert_eq!(me.workqueue, "doc-named");
    /// });
    /// assert_eq!(work.label(), Some("rpc_release"));
    /// wq.queue(&work);
    /// work.flush();
    /// # Ok::<(), podq::Error>(())
    /// ```
    pub fn named(label: impl Into<Arc<str>>, f: impl Fn() + Send + Sync + 'static) -> Work {
        Work::build(Some(label.into()), Box::new(f))
    }

    fn build(label: Option<Arc<str>>, func: Box<dyn Fn() + Send + Sync>) -> Work {
        Work {
            inner: Arc::new(WorkInner {
                state: WorkState::new(),
                func,
                label,
            }),
        }
    }

    /// The label given by [`Work::named`].
    pub fn label(&self) -> Option<&str> {
        self.inner.label.as_deref()
    }

    /// Whether the item is queued (or on the timer) and has not started yet.
    pub fn is_pending(&self) -> bool {
        self.inner.state.load() & PENDING != 0
    }

    /// Whether a worker runs the item's function now (the running half of the kernel's
    /// `work_busy`). A snapshot: it may change as soon as it is read.
    pub fn is_running(&self) -> bool {
        self.inner.state.load() & RUNNING != 0
    }

    /// Whether the item is disabled ([`Work::disable`]), so that queueing it fails.
    pub fn is_disabled(&self) -> bool {
        self.inner.state.disable_depth() > 0
    }

    /// `disable_work`: cancels a pending instance and refuses queueing (every queue
    /// call returns false, delayed arming included) until as many [`Work::enable`]
    /// calls as `disable` calls have been made. Returns whether an instance was
    /// pending; a cancelled instance is counted cancelled where it was queued. Does
    /// not wait for a running instance (see [`Work::disable_sync`]).
    ///
    /// Refused with [`Error::DisableDepth`] once the item is disabled 65535 times
    /// (the kernel warns and leaves the depth as it is).
    ///
    /// ```
    /// use podq::{Work, Workqueue};
    ///
    /// let wq = Workqueue::builder("doc-disable").build()?;
    /// let work = Work::new(|| {});
    /// assert!(!work.disable()?);
    /// assert!(!wq.queue(&work), "disabled: queueing is refused");
    /// assert!(work.enable()?, "enabled again");
    /// assert!(wq.queue(&work));
    /// work.flush();
    /// assert!(work.enable().is_err(), "not disabled");
    /// # Ok::<(), podq::Error>(())
    /// ```
    pub fn disable(&self) -> Result<bool, Error> {
        self.inner.state.disable().ok_or(Error::DisableDepth {
            max: MAX_DISABLE_DEPTH,
        })
    }

    /// `disable_work_sync`: [`Work::disable`], then waits until no worker runs the
    /// item (unless called from the item itself, which would wait for itself). On
    /// return the item is neither pending nor running and stays so until enabled.
    pub fn disable_sync(&self) -> Result<bool, Error> {
        let was_pending = self.disable()?;
        if !self.is_current() {
            crate::blocking(|| self.inner.state.wait_not_running());
        }
        Ok(was_pending)
    }

    /// `enable_work`: undoes one [`Work::disable`]. Returns whether the item can be
    /// queued again (the depth reached zero); refused with [`Error::NotDisabled`] if
    /// it was not disabled (the kernel warns instead).
    pub fn enable(&self) -> Result<bool, Error> {
        self.inner.state.enable().ok_or(Error::NotDisabled)
    }

    /// `flush_work`: waits until the instance pending at the call (if any) and the
    /// running one (if any) have finished. Returns whether it had to wait. An instance
    /// sitting on a timer is not waited for (use [`crate::DelayedWork::flush`]).
    /// Calling it from the item itself deadlocks, as in the kernel.
    pub fn flush(&self) -> bool {
        crate::blocking(|| self.inner.state.flush())
    }

    /// `cancel_work`: removes a pending instance; returns whether there was one. Does not
    /// wait for a running instance.
    pub fn cancel(&self) -> bool {
        self.inner.state.cancel()
    }

    /// `cancel_work_sync`: removes a pending instance and waits for a running one.
    /// Queueing is refused meanwhile (the kernel's temporary disable), so an item that
    /// re-queues itself cannot win. Returns whether an instance was pending. On return
    /// the item is neither pending nor running, unless queued again after this call
    /// returned. Called from the item itself, it does not wait for itself.
    pub fn cancel_sync(&self) -> bool {
        // An item already disabled as deep as it goes is not pending and cannot be
        // queued: there is nothing to raise, and so nothing to lower after.
        let raised = self.inner.state.disable();
        if !self.is_current() {
            crate::blocking(|| self.inner.state.wait_not_running());
        }
        if raised.is_some() {
            self.inner.state.enable();
        }
        raised.unwrap_or(false)
    }

    fn is_current(&self) -> bool {
        crate::pool::running_work() == Arc::as_ptr(&self.inner) as usize
    }
}

impl WorkInner {
    /// Runs the function, catching a panic; returns its message if it panicked.
    pub(crate) fn run(&self) -> Option<String> {
        let _label = crate::current::Labelled::new(self.label.as_ref());
        catch_unwind(AssertUnwindSafe(|| (self.func)()))
            .err()
            .map(|p| panic_message(&*p))
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_owned()
    }
}

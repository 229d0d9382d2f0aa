//! [`current`] (the kernel's `current_work`): what the calling thread is running, read
//! from two thread-locals set around each run (also the runtime's own question: which
//! workqueue's item, which work item).
//!
//! Legend: W thread-private (a thread-local of the thread it describes).

use std::cell::{Cell, RefCell};
use std::ptr;
use std::sync::Arc;

use crate::workqueue::WqShared;

/// What a thread runs: the item's workqueue (null: none), the pool whose worker runs
/// it, and the address of its work item (0 for a one-shot item).
type RunningNow = (*const WqShared, u64, usize);

thread_local! {
    /// W: what this thread runs. Set by [`Running`] for exactly one run, during which
    /// the item's pwq, and so the workqueue, stays alive.
    static WQ: Cell<RunningNow> = const { Cell::new((ptr::null(), 0, 0)) };
    /// W: the label of the item this thread runs ([`crate::Work::named`]).
    static LABEL: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
}

/// What [`current`] tells about the item the calling thread runs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Current {
    /// The name of its workqueue.
    pub workqueue: String,
    /// Its label ([`crate::Work::named`], [`crate::Workqueue::spawn_named`]).
    pub label: Option<String>,
    /// The CPU it runs on, in its workqueue's topology numbering ([`crate::current_cpu`]).
    pub cpu: usize,
    /// The id of the pool whose worker runs it (as in [`crate::stats::PoolStats::id`]).
    pub pool: u64,
}

/// `current_work`: the item the calling thread runs, or `None` outside work items.
///
/// ```
/// let me = podq::spawn(|| podq::current().expect("inside an item")).join().unwrap();
/// assert_eq!(me.workqueue, podq::DEFAULT_WORKQUEUE_NAME);
/// assert_eq!(me.label, None);
/// assert!(podq::current().is_none(), "the caller runs no item");
/// ```
pub fn current() -> Option<Current> {
    let (wq, pool, _) = WQ.with(Cell::get);
    if wq.is_null() {
        return None;
    }
    // SAFETY: `WQ` is non-null only between `Running::new` and its drop on this
    // thread, which bracket one run; for the whole run the item is counted in its
    // pwq's in-flight word, which keeps the pwq (and its `Arc` of the workqueue)
    // alive, and `current` runs inside it.
    let workqueue = unsafe { &*wq }.name.clone();
    Some(Current {
        workqueue,
        label: LABEL.with(|l| l.borrow().as_deref().map(str::to_owned)),
        cpu: crate::current_cpu(),
        pool,
    })
}

/// The id of the workqueue whose item the calling thread runs (0: none).
pub(crate) fn current_wq() -> u64 {
    let (wq, ..) = WQ.with(Cell::get);
    if wq.is_null() {
        return 0;
    }
    // SAFETY: as in `current`: non-null only inside a run on this thread, which keeps
    // the workqueue alive.
    unsafe { &*wq }.id
}

/// The address of the work item the calling thread runs (0: none, or a one-shot item).
pub(crate) fn running_work() -> usize {
    WQ.with(Cell::get).2
}

/// Marks the calling thread as running an item of `wq` (work item at `work`, 0 for a
/// one-shot item) on a worker of pool `pool` until dropped.
pub(crate) struct Running {
    previous: RunningNow,
}

impl Running {
    #[inline]
    pub(crate) fn new(wq: &Arc<WqShared>, pool: u64, work: usize) -> Running {
        crate::busy::start(wq.id, pool);
        Running {
            previous: WQ.with(|c| c.replace((Arc::as_ptr(wq), pool, work))),
        }
    }
}

impl Running {
    /// The run ended. Returns whether the thread, a pool worker, stands demoted
    /// (`busy::end`).
    #[inline]
    pub(crate) fn end(self) -> bool {
        WQ.with(|c| c.set(self.previous));
        std::mem::forget(self);
        crate::busy::end()
    }
}

impl Drop for Running {
    /// Only if the run unwound past [`Running::end`].
    fn drop(&mut self) {
        WQ.with(|c| c.set(self.previous));
        crate::busy::end();
    }
}

/// Gives the calling thread's item a label until dropped (nothing to do for an item
/// without one, so unlabelled items pay no reference count).
pub(crate) struct Labelled {
    set: bool,
}

impl Labelled {
    pub(crate) fn new(label: Option<&Arc<str>>) -> Labelled {
        if let Some(label) = label {
            LABEL.with(|l| *l.borrow_mut() = Some(Arc::clone(label)));
            crate::busy::set_label(Some(label));
        }
        Labelled {
            set: label.is_some(),
        }
    }
}

impl Drop for Labelled {
    fn drop(&mut self) {
        if self.set {
            LABEL.with(|l| *l.borrow_mut() = None);
            crate::busy::set_label(None);
        }
    }
}

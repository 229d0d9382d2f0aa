//! [`current`] (the kernel's `current_work`): what the calling thread is running, read
//! from two thread-locals set around each run.
//!
//! Legend: W thread-private (a thread-local of the thread it describes).

use std::cell::{Cell, RefCell};
use std::ptr;
use std::sync::Arc;

use crate::workqueue::WqShared;

thread_local! {
    /// W: the workqueue and pool of the item this thread runs (null: none). Set by
    /// [`Running`] for exactly one run, during which the item's pwq, and so the
    /// workqueue, stays alive.
    static WQ: Cell<(*const WqShared, u64)> = const { Cell::new((ptr::null(), 0)) };
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
    let (wq, pool) = WQ.with(Cell::get);
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

/// Marks the calling thread as running an item of `wq` on a worker of pool `pool` until
/// dropped.
pub(crate) struct Running {
    previous: (*const WqShared, u64),
}

impl Running {
    #[inline]
    pub(crate) fn new(wq: &Arc<WqShared>, pool: u64) -> Running {
        crate::busy::start(wq.id, pool);
        Running {
            previous: WQ.with(|c| c.replace((Arc::as_ptr(wq), pool))),
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

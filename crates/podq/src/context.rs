//! What a thread knows about the podq work it is doing: the pool it works for, the
//! item it runs, its `blocking()` depth, the items it took and has not started and the
//! finished ones whose accounting it holds.
//! Every worker thread-local lives here, so that pools, items and workqueues read the
//! same state without depending on each other.
//!
//! Legend: W thread-private (a thread-local of the thread it describes).

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use crate::entry::{Entry, EntryMeta};
use crate::pool::{Fifo, PoolCore};
use crate::workqueue::Completions;

thread_local! {
    /// W: the pool this thread works for, if it is a worker.
    pub(crate) static WORKER_POOL: RefCell<Option<Arc<PoolCore>>> = const { RefCell::new(None) };
    /// W: nesting depth of `blocking()` sections.
    pub(crate) static BLOCKING_DEPTH: Cell<usize> = const { Cell::new(0) };
    /// W: items this worker took from its pool's worklist and has not started, oldest
    /// first (given back to the worklist when it blocks). The one exception to W: the
    /// watchdog takes it back for the worklist while the worker runs a demoted item
    /// ([`BatchRef::hand_back`]).
    pub(crate) static BATCH: RefCell<Fifo<Entry>> = const { RefCell::new(Fifo::new()) };
    /// W: finished items whose accounting this worker holds (`workqueue/completions.rs`).
    pub(crate) static COMPLETIONS: RefCell<Completions> = const { RefCell::new(Completions::new()) };
}

/// A pool worker's [`BATCH`], as the watchdog reaches it to hand the items of a worker
/// it took out of the count back to the worklist (`pool/intensive.rs`).
#[derive(Clone, Copy)]
pub(crate) struct BatchRef(*const RefCell<Fifo<Entry>>);

// SAFETY: the pointer is dereferenced only in `hand_back`, whose contract makes that
// access exclusive and ordered with the owning thread's; elsewhere it is only copied.
unsafe impl Send for BatchRef {}
// SAFETY: as for `Send`: shared copies are only passed along.
unsafe impl Sync for BatchRef {}

impl BatchRef {
    /// The calling thread's batch.
    pub(crate) fn mine() -> BatchRef {
        BATCH.with(|b| BatchRef(b))
    }

    /// Empties the batch into `into`, oldest first, from another thread; returns how
    /// many items it moved.
    ///
    /// # Safety
    ///
    /// The caller holds the owning worker's pool lock, and the worker runs an item
    /// that it will end by taking that lock before it touches its batch again (its
    /// demotion, confirmed by `Beat::demotion_stands`). So the thread and its
    /// thread-local are alive, the worker holds no borrow of the batch (it borrows it
    /// only between items, and in `blocking()` under the pool lock), and its next
    /// access comes after the caller's unlock.
    pub(crate) unsafe fn hand_back(self, into: impl FnOnce(&mut Fifo<Entry>)) -> usize {
        // SAFETY: by the contract above, the cell is alive and no other access to it
        // runs now; `try_borrow_mut` still refuses rather than aliasing a borrow.
        let cell = unsafe { &*self.0 };
        let Ok(mut batch) = cell.try_borrow_mut() else {
            return 0;
        };
        let n = batch.len();
        into(&mut batch);
        n
    }
}

/// Accounts a finished (`ran`) or dropped item through the calling thread's held
/// completions.
pub(crate) fn complete(meta: EntryMeta, ran: bool) {
    COMPLETIONS.with(|c| {
        let colour = meta.colour();
        c.borrow_mut().complete(meta.pwq, colour, ran)
    });
}

/// Settles the calling thread's held completions; returns whether items waited for a
/// slot on the node of the last completions it settled (now or before).
pub(crate) fn settle_completions() -> bool {
    COMPLETIONS.with(|c| {
        let mut c = c.borrow_mut();
        c.settle();
        c.backlog()
    })
}

/// Whether the calling thread is a worker of `pool` between two items: not inside one
/// (whose `blocking()` section gives the batch back to the worklist) and not exiting.
pub(crate) fn works_between_items_for(pool: &PoolCore) -> bool {
    crate::current::current_wq() == 0
        && BLOCKING_DEPTH.with(Cell::get) == 0
        && WORKER_POOL.with(|p| p.borrow().as_deref().is_some_and(|w| std::ptr::eq(w, pool)))
}

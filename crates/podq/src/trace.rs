//! The kernel's workqueue tracepoints as [`tracing`](https://docs.rs/tracing) events,
//! with the `tracing` feature; without it every function here is empty and the calls
//! compile to nothing.
//!
//! Events, all at `TRACE` level with target `podq::workqueue` and the tracepoint's
//! name as the event name:
//!
//! | event | when | fields |
//! |---|---|---|
//! | `workqueue_queue_work` | a queue call has picked the item's pwq | `work`, `label`, `workqueue`, `req_cpu` (absent: none requested), `cpu` (the queueing CPU), `pool` |
//! | `workqueue_activate_work` | the item goes to its pool's worklist (at once, or when a slot frees) | `work`, `label`, `workqueue`, `pool` |
//! | `workqueue_execute_start` | a worker is about to run it | `work`, `label`, `workqueue`, `pool`, `cpu` (the worker's) |
//! | `workqueue_execute_end` | it returned (or panicked) | `work`, `label` |
//!
//! `work` identifies the item as the kernel's `work` pointer does: a [`crate::Work`]'s
//! address (the same for each of its runs) or a spawned item's. CPUs are in the
//! workqueue's topology numbering. Departures: the kernel's `cpu` of
//! `workqueue_queue_work` is the CPU whose pool was chosen; podq gives the queueing
//! CPU and the chosen pool's id (`pool`), since a pool serves a whole pod. The
//! kernel's `function` field is the item's label (absent for unlabelled items).
//! Emitting an event costs what the subscriber does with it; a subscriber's time at
//! `workqueue_execute_start` is counted in the item's queue-to-start latency.
//!
//! A subscriber runs inside the queue and activation paths: `workqueue_queue_work`
//! inside the queue call's read section of the CPU → pwq table, and
//! `workqueue_activate_work`, for an item that waited for a `max_active` slot, under
//! its pwq's lock (and its pool's worklist lock when the ring is full or absent), as
//! the kernel's probes run under the pool lock. A queue call the subscriber makes there
//! would wait for a lock its own thread holds, so it is deferred instead
//! (`workqueue/reentry.rs`): checked at once, queued when the podq call that emitted
//! the event has released its locks. A panic of the subscriber in any event is caught,
//! so that the queueing, the activation or the item goes on, and reported to the
//! workqueue's panic hook (for the two events under locks, once they are released), as
//! an item's panic is.

#[cfg(feature = "tracing")]
use std::cell::{Cell, RefCell};
use std::sync::Arc;

#[cfg(feature = "tracing")]
use crate::entry::Task;
use crate::entry::{Entry, EntryMeta};
use crate::once::OnceTask;
use crate::pool::PoolCore;
use crate::work::WorkInner;
#[cfg(feature = "tracing")]
use crate::workqueue::WqShared;

#[cfg(feature = "tracing")]
thread_local! {
    /// W: whether this thread is in an event emitted under podq's locks.
    static IN_LOCKED_EVENT: Cell<bool> = const { Cell::new(false) };
    /// W: panics of subscribers in such events, with the event's workqueue, to report
    /// once the locks are released.
    static SUBSCRIBER_PANICS: RefCell<Vec<(Arc<WqShared>, String)>> =
        const { RefCell::new(Vec::new()) };
}

/// Whether the calling thread is inside `workqueue_queue_work` or
/// `workqueue_activate_work`: a queue call made there is deferred
/// (`workqueue/reentry.rs`).
#[cfg(feature = "tracing")]
pub(crate) fn in_locked_event() -> bool {
    IN_LOCKED_EVENT.get()
}

/// Emits an event of `wq`'s under podq's locks: marked (see [`in_locked_event`]), and
/// a subscriber's panic caught, so that the queue or activation around it completes;
/// the panic is kept for [`take_subscriber_panics`].
#[cfg(feature = "tracing")]
fn locked_event(wq: &Arc<WqShared>, emit: impl FnOnce()) {
    let outer = IN_LOCKED_EVENT.replace(true);
    let emitted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(emit));
    IN_LOCKED_EVENT.set(outer);
    if let Err(payload) = emitted {
        let message = crate::work::panic_message(&*payload);
        SUBSCRIBER_PANICS.with(|p| p.borrow_mut().push((Arc::clone(wq), message)));
    }
}

/// The subscriber panics caught in this thread's locked events since the last call,
/// for the caller to report (to the workqueue's panic hook) with no podq lock held.
#[cfg(feature = "tracing")]
pub(crate) fn take_subscriber_panics() -> Vec<(Arc<WqShared>, String)> {
    SUBSCRIBER_PANICS.with(|p| std::mem::take(&mut *p.borrow_mut()))
}

/// An item as the events name it (read only by the feature's events).
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) enum Item<'a> {
    /// A [`crate::Work`].
    Work(&'a Arc<WorkInner>),
    /// A spawned item.
    Once(&'a OnceTask),
}

impl<'a> Item<'a> {
    /// The item `task` runs.
    #[cfg(feature = "tracing")]
    fn of(task: &'a Task) -> Item<'a> {
        match task {
            Task::Work { work, .. } => Item::Work(work),
            Task::Once(once) => Item::Once(once),
        }
    }

    /// Its identity and label.
    #[cfg(feature = "tracing")]
    fn parts(self) -> (usize, Option<&'a Arc<str>>) {
        match self {
            Item::Work(work) => (Arc::as_ptr(work) as usize, work.label.as_ref()),
            Item::Once(once) => once.traced(),
        }
    }
}

/// `workqueue_queue_work`: `entry` was queued from `cpu`, asked for `req_cpu`.
#[inline(always)]
pub(crate) fn queue_work(entry: &Entry, req_cpu: Option<usize>, cpu: usize) {
    #[cfg(feature = "tracing")]
    {
        let (work, label) = Item::of(&entry.task).parts();
        let pwq = &entry.meta.pwq;
        locked_event(&pwq.wq, || {
            tracing::trace!(
                name: "workqueue_queue_work",
                target: "podq::workqueue",
                work,
                label = label.map(|l| &**l),
                workqueue = pwq.wq.name.as_str(),
                req_cpu,
                cpu,
                pool = pwq.pool.core.id,
            );
        });
    }
    #[cfg(not(feature = "tracing"))]
    let _ = (entry, req_cpu, cpu);
}

/// `workqueue_activate_work`: `entry` goes onto its pool's worklist.
#[inline(always)]
pub(crate) fn activate_work(entry: &Entry) {
    #[cfg(feature = "tracing")]
    {
        let (work, label) = Item::of(&entry.task).parts();
        let pwq = &entry.meta.pwq;
        locked_event(&pwq.wq, || {
            tracing::trace!(
                name: "workqueue_activate_work",
                target: "podq::workqueue",
                work,
                label = label.map(|l| &**l),
                workqueue = pwq.wq.name.as_str(),
                pool = pwq.pool.core.id,
            );
        });
    }
    #[cfg(not(feature = "tracing"))]
    let _ = entry;
}

/// An item about to run, kept for its `workqueue_execute_end` (empty without the
/// feature).
pub(crate) struct Executing {
    #[cfg(feature = "tracing")]
    work: usize,
    #[cfg(feature = "tracing")]
    label: Option<Arc<str>>,
}

/// `workqueue_execute_start`: `item` (queued as `meta`) starts on a worker of `pool`.
#[inline(always)]
pub(crate) fn execute_start(item: Item<'_>, meta: &EntryMeta, pool: &PoolCore) -> Executing {
    #[cfg(feature = "tracing")]
    {
        let (work, label) = item.parts();
        worker_event(meta, || {
            tracing::trace!(
                name: "workqueue_execute_start",
                target: "podq::workqueue",
                work,
                label = label.map(|l| &**l),
                workqueue = meta.pwq.wq.name.as_str(),
                pool = pool.id,
                cpu = pool.worker_cpu(),
            );
        });
        Executing {
            work,
            label: label.cloned(),
        }
    }
    #[cfg(not(feature = "tracing"))]
    {
        let _ = (item, meta, pool);
        Executing {}
    }
}

/// `workqueue_execute_end`: the item `started` names (queued as `meta`) returned.
#[inline(always)]
pub(crate) fn execute_end(started: Executing, meta: &EntryMeta) {
    #[cfg(feature = "tracing")]
    worker_event(meta, || {
        tracing::trace!(
            name: "workqueue_execute_end",
            target: "podq::workqueue",
            work = started.work,
            label = started.label.as_deref(),
        );
    });
    #[cfg(not(feature = "tracing"))]
    let _ = (started, meta);
}

/// Emits an event on a worker around an item (no podq lock held): a subscriber's
/// panic is caught, so that the worker carries on with the item, and reported to the
/// item's workqueue's panic hook at once.
#[cfg(feature = "tracing")]
fn worker_event(meta: &EntryMeta, emit: impl FnOnce()) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(emit)) {
        meta.pwq
            .wq
            .report_panic(&crate::work::panic_message(&*payload));
    }
}

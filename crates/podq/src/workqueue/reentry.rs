//! Queue calls made from inside a podq tracing event that runs under podq's locks
//! (`trace.rs`: `workqueue_queue_work` in the table's read section,
//! `workqueue_activate_work` under the pwq lock, and the worklist's when activation
//! spills). Made there, the call would wait for a lock its own thread holds; instead it
//! is checked as usual (a draining or destroyed workqueue refuses it at once) and kept
//! on the thread's list, and the podq call that emitted the event queues it once it has
//! released its locks (at the end of `enqueue_any` and of an activation pass), in the
//! order the calls were made. Until then the item is not in flight: a flush started
//! meanwhile by another thread need not wait for it. A subscriber's panic in those
//! events is reported here too, to the workqueue's panic hook, once the locks are free.
//!
//! Legend: W thread-private.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;

use super::WqShared;
use crate::entry::Task;

/// A queue call made inside an event.
struct Deferred {
    wq: Arc<WqShared>,
    task: Task,
    cpu: Option<usize>,
}

thread_local! {
    /// W: the calls to make, oldest first.
    static DEFERRED: RefCell<VecDeque<Deferred>> = const { RefCell::new(VecDeque::new()) };
    /// W: whether this thread is making them now (a call it makes may defer more,
    /// which the same loop takes).
    static RUNNING: Cell<bool> = const { Cell::new(false) };
}

/// Keeps `task` for `wq` (already accepted) to queue once the thread's locks are free.
pub(super) fn defer(wq: &Arc<WqShared>, task: Task, cpu: Option<usize>) {
    let call = Deferred {
        wq: Arc::clone(wq),
        task,
        cpu,
    };
    DEFERRED.with(|d| d.borrow_mut().push_back(call));
}

/// Reports the subscriber panics this thread's locked events caught, then queues the
/// calls it deferred. Called with no lock of the queue or activation path held (an
/// attribute change may hold its workqueue's `config`, under which it activates).
pub(super) fn run() {
    if RUNNING.get() {
        return;
    }
    /// Clears `RUNNING` however the loop ends (a panic hook may panic).
    struct Running;
    impl Drop for Running {
        fn drop(&mut self) {
            RUNNING.set(false);
        }
    }
    RUNNING.set(true);
    let _running = Running;
    for (wq, message) in crate::trace::take_subscriber_panics() {
        wq.report_panic(&message);
    }
    while let Some(call) = DEFERRED.with(|d| d.borrow_mut().pop_front()) {
        // Accepted when it was made, so only a workqueue torn down since refuses it
        // (as a fired timer's item).
        if let Err(task) = call.wq.enqueue_any(call.task, call.cpu, true) {
            call.wq.cancel_refused(task);
        }
    }
}

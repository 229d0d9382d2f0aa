//! Queue entries: what a pool's worklist holds, a work item's instance or a one-shot
//! closure, with the accounting it carries from the queue call to its completion.

use std::sync::Arc;

use crate::work::WorkInner;
use crate::workqueue::flush::Colour;
use crate::workqueue::PwqRef;

/// What a queue entry runs.
pub(crate) enum Task {
    /// Instance `seq` of a work item.
    Work {
        /// The item.
        work: Arc<WorkInner>,
        /// Which queueing this entry is (stale once the item's sequence moved on).
        seq: u32,
    },
    /// A one-shot closure (`spawn`).
    Once(crate::join::OnceTask),
}

/// One queued item: what to run and the accounting it carries. Its count in the pwq's
/// in-flight word keeps the pwq (and its pool) alive while the item is anywhere in
/// flight, as the kernel's `get_pwq` ([`PwqRef`]).
pub(crate) struct Entry {
    pub(crate) task: Task,
    pub(crate) meta: EntryMeta,
}

/// The accounting part of an [`Entry`].
pub(crate) struct EntryMeta {
    pub(crate) pwq: PwqRef,
    /// Flush colour (see `workqueue/flush.rs`).
    pub(crate) colour: Colour,
    /// The CPU of the queueing thread, in the workqueue's topology.
    #[cfg_attr(not(feature = "stats"), allow(dead_code))]
    pub(crate) queued_cpu: u32,
    /// When it was queued, for the one item in `stats/sample.rs` whose latency is
    /// measured.
    #[cfg(feature = "stats")]
    pub(crate) queued_at: Option<crate::stats::Stamp>,
}

#[cfg(all(test, not(loom)))]
mod size_tests {
    /// A queue entry's size is memory per queued item (the README's Performance
    /// section gives it): this keeps a change that grows it visible.
    #[test]
    fn a_queue_entry_is_48_bytes() {
        let expected = if cfg!(feature = "stats") { 48 } else { 40 };
        assert_eq!(std::mem::size_of::<super::Entry>(), expected);
    }
}

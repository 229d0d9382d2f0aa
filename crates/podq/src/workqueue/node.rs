//! Node admission (`wq_node_nr_active`): each node's share of `max_active` as a slot
//! counter, and the pending list of pwqs whose inactive items wait for a slot.
//! Protocol: `workqueue/README.md` ("max_active").
//!
//! Legend: A atomic (ordering and pair named at each field); N guarded by
//! `Waiting::pending`.

use std::collections::VecDeque;

use crossbeam_utils::CachePadded;

use crate::policy;
use crate::sync::{lock, seqcst_pair_fence, AtomicUsize, Mutex, Ordering::SeqCst};

/// One node's active-item slots. `P` is what waits on the pending list: a pwq in the
/// runtime, a plain value in the loom model. The slot counter and the pending list sit
/// on cache lines of their own: every queue call and completion writes the counter,
/// only pwqs that wait write the list.
pub(crate) struct NodeActive<P> {
    slots: CachePadded<Slots>,
    waiting: CachePadded<Waiting<P>>,
}

/// The slot counter and its limit.
struct Slots {
    /// A: the node's share of `max_active` (`SeqCst`, stored under `config`, read in
    /// `try_inc`: pairs with that load, so a raised limit is seen by the activation
    /// that follows the store).
    max: AtomicUsize,
    /// A: slots taken: active items, plus for a moment a `try_inc` that overshot and is
    /// about to undo (`SeqCst` read-modify-writes; see `nr_pending` for its pair).
    nr: AtomicUsize,
}

/// The pwqs waiting for a slot.
struct Waiting<P> {
    /// N: pwqs with inactive items waiting for a slot, served round-robin.
    pending: Mutex<VecDeque<P>>,
    /// A: `pending.len()`, stored under the `pending` lock, so that a completion skips
    /// that lock when nobody waits. A joiner's `SeqCst` store, then its `SeqCst` load
    /// of `nr` in `take_pending`, pairs with a completion's decrement of `nr`, then its
    /// `SeqCst` load of this (both in `take_pending`, with `seqcst_pair_fence` between
    /// for loom): one of the two sees the other, so a freed slot is never left unused.
    nr_pending: AtomicUsize,
}

impl<P> NodeActive<P> {
    pub(crate) fn new() -> Self {
        NodeActive {
            slots: CachePadded::new(Slots {
                max: AtomicUsize::new(1),
                nr: AtomicUsize::new(0),
            }),
            waiting: CachePadded::new(Waiting {
                pending: Mutex::new(VecDeque::new()),
                nr_pending: AtomicUsize::new(0),
            }),
        }
    }

    /// Sets the node's share of `max_active`.
    pub(crate) fn set_max(&self, max: usize) {
        self.slots.max.store(max, SeqCst);
    }

    /// The node's share of `max_active` (for tests of the limits).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn max(&self) -> usize {
        self.slots.max.load(SeqCst)
    }

    /// Active items and the node's share of `max_active` now (for `Workqueue::dump`).
    pub(crate) fn active_of_max(&self) -> (usize, usize) {
        (self.slots.nr.load(SeqCst), self.slots.max.load(SeqCst))
    }

    /// Whether pwqs wait for a slot now: a snapshot, and only a hint (a worker's way of
    /// polling, `policy::poll_pauses`); no admission decision reads it.
    pub(crate) fn has_waiting(&self) -> bool {
        self.waiting.nr_pending.load(SeqCst) > 0
    }

    /// Whether every slot is taken now (a snapshot, for `Workqueue::congested`).
    pub(crate) fn is_full(&self) -> bool {
        policy::free_slots(self.slots.nr.load(SeqCst), self.slots.max.load(SeqCst)) == 0
    }

    /// Takes a slot if one is free (`policy::may_activate`): one locked add, and an
    /// undo if that overshot the limit. The overshoot may make a concurrent
    /// `take_pending` find no free slot, so after a false return the caller must run
    /// its activation loop, as after `release`: the undo is a release.
    pub(crate) fn try_inc(&self) -> bool {
        let before = self.slots.nr.fetch_add(1, SeqCst);
        if policy::free_slots(before, self.slots.max.load(SeqCst)) > 0 {
            return true;
        }
        self.release(1);
        false
    }

    /// Takes up to `want` free slots (`policy::free_slots`); returns how many.
    fn try_take(&self, want: usize) -> usize {
        let mut nr = self.slots.nr.load(SeqCst);
        loop {
            let take = policy::free_slots(nr, self.slots.max.load(SeqCst)).min(want);
            if take == 0 {
                return 0;
            }
            match self
                .slots
                .nr
                .compare_exchange_weak(nr, nr + take, SeqCst, SeqCst)
            {
                Ok(_) => return take,
                Err(now) => nr = now,
            }
        }
    }

    /// Frees `n` slots. The caller then calls its activation loop (`take_pending`).
    pub(crate) fn release(&self, n: usize) {
        self.slots.nr.fetch_sub(n, SeqCst);
    }

    /// Puts `p` at the end of the pending list. The caller then calls its activation
    /// loop: a slot freed between its failed `try_inc` and this push may have found
    /// the list empty.
    pub(crate) fn push_pending(&self, p: P) {
        let mut pending = lock(&self.waiting.pending);
        pending.push_back(p);
        self.waiting.nr_pending.store(pending.len(), SeqCst);
    }

    /// One turn of activation (`node_activate_pending_pwq`): if something waits and a
    /// slot is free, takes up to `want` slots and the first waiter, which the caller
    /// activates (giving back with `release` the slots it does not use). `back` is the
    /// previous turn's waiter that still has items: it goes to the end of the list
    /// first, in the same acquisition (round-robin without a second lock per turn).
    pub(crate) fn take_pending(&self, want: usize, back: Option<P>) -> Option<(P, usize)> {
        if back.is_none() {
            // Between the caller's write (`release` or `push_pending`) and this read:
            // see `nr_pending`.
            seqcst_pair_fence();
            if self.waiting.nr_pending.load(SeqCst) == 0 {
                return None;
            }
        }
        let mut pending = lock(&self.waiting.pending);
        if let Some(p) = back {
            pending.push_back(p);
            self.waiting.nr_pending.store(pending.len(), SeqCst);
            // Between this store and the load of `nr` below: see `nr_pending`.
            seqcst_pair_fence();
        }
        if pending.is_empty() {
            return None;
        }
        let slots = self.try_take(want);
        if slots == 0 {
            return None;
        }
        let p = pending.pop_front()?;
        self.waiting.nr_pending.store(pending.len(), SeqCst);
        Some((p, slots))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn waiting_pwqs_show_until_the_last_is_activated() {
        let node = NodeActive::<u32>::new();
        node.set_max(1);
        assert!(!node.has_waiting());
        assert!(node.try_inc());
        assert!(!node.try_inc(), "max_active 1 is taken");
        node.push_pending(1);
        node.push_pending(2);
        assert!(node.has_waiting());
        // The slot is freed: the first waiter's turn leaves the second waiting.
        node.release(1);
        assert_eq!(node.take_pending(4, None), Some((1, 1)));
        assert!(node.has_waiting());
        node.release(1);
        assert_eq!(node.take_pending(4, None), Some((2, 1)));
        assert!(!node.has_waiting());
    }
}

/// Loom model of node admission on the real `NodeActive`:
/// `RUSTFLAGS="--cfg loom" cargo test -p podq --release --lib loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// Runs the activation loop as a releaser or a failed taker does: every waiter it
    /// activates is pwq 7 with one slot (max_active 1).
    fn activate_all(node: &NodeActive<u32>, activated: &AtomicUsize) {
        while let Some((p, slots)) = node.take_pending(4, None) {
            assert_eq!((p, slots), (7, 1));
            assert_eq!(activated.fetch_add(1, SeqCst), 0, "over max_active");
        }
    }

    /// A node with max_active 1 whose one slot a running item holds, and a thread that
    /// completes that item (release, then the activation loop).
    fn one_running_and_its_completion() -> (
        Arc<NodeActive<u32>>,
        Arc<AtomicUsize>,
        loom::thread::JoinHandle<()>,
    ) {
        let node = Arc::new(NodeActive::<u32>::new());
        assert!(node.try_inc(), "the running item's slot");
        let activated = Arc::new(AtomicUsize::new(0));
        let completer = {
            let (node, activated) = (node.clone(), activated.clone());
            loom::thread::spawn(move || {
                node.release(1);
                activate_all(&node, &activated);
            })
        };
        (node, activated, completer)
    }

    /// A queuer: takes a slot, or joins the pending list and runs the activation loop.
    fn queue(node: &NodeActive<u32>, activated: &AtomicUsize) {
        if node.try_inc() {
            activated.fetch_add(1, SeqCst);
        } else {
            node.push_pending(7);
            activate_all(node, activated);
        }
    }

    /// max_active 1: one item is active; its completion races with a queuer whose
    /// `try_inc` fails and who joins the pending list. In every interleaving the waiter
    /// is activated exactly once (no slot is left unused, no lost activation), and the
    /// slot count never exceeds the limit.
    #[test]
    fn loom_freed_slot_reaches_the_waiter() {
        loom::model(|| {
            let (node, activated, completer) = one_running_and_its_completion();
            queue(&node, &activated);
            completer.join().unwrap();
            assert_eq!(activated.load(SeqCst), 1);
            assert_eq!(node.slots.nr.load(SeqCst), 1);
            assert_eq!(node.waiting.nr_pending.load(SeqCst), 0);
        });
    }

    /// max_active 1, one item active: a queuer whose `try_inc` overshoots (and so
    /// makes the others' takes fail for a moment) races with the completion and with a
    /// second queuer that joins the pending list. Every side runs the activation loop
    /// after its failed take or release; in every interleaving the slot ends up used
    /// exactly once (by either queuer or the waiter), never left free.
    #[test]
    fn loom_an_overshooting_take_leaves_no_waiter_behind() {
        loom::model(|| {
            let (node, activated, completer) = one_running_and_its_completion();
            let overshooter = {
                let (node, activated) = (node.clone(), activated.clone());
                loom::thread::spawn(move || {
                    let took = node.try_inc();
                    if !took {
                        activate_all(&node, &activated);
                    }
                    took
                })
            };
            queue(&node, &activated);
            completer.join().unwrap();
            let took = overshooter.join().unwrap();
            let used = activated.load(SeqCst) + usize::from(took);
            assert_eq!(used, 1, "one slot, used exactly once");
            // The waiter may still wait, but only behind the overshooter's item.
            assert_eq!(node.slots.nr.load(SeqCst), 1, "a slot left free");
        });
    }
}

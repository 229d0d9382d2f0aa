//! Freezable workqueues ([`Workqueue::freeze`], [`Workqueue::thaw`]; the kernel's
//! `freeze_workqueues_begin`, `freeze_workqueues_busy` and `thaw_workqueues`).
//! Protocol: `workqueue/README.md` ("Freeze").
//!
//! Freezing marks every pwq frozen under its lock, which closes its gate: queue calls
//! take the locked path, where a frozen pwq counts as plugged, so new items wait on
//! its inactive list and activation leaves it alone. Items already active (handed to
//! a pool) run; `freeze` returns when none holds an active slot. Thawing clears the
//! marks and puts pwqs with waiting items back on their nodes' pending lists.
//!
//! Legend: A atomic (ordering and pair named at the field); M stored under
//! `WqShared::config`.

use crate::sync::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;

use super::{lock, WqShared};
use crate::{pool, Error, Workqueue};

/// How often `freeze` looks at the active slots, at most (it starts at 50 µs and
/// doubles up to this).
const POLL_MAX: Duration = Duration::from_millis(5);

/// A workqueue's frozen state.
#[derive(Debug, Default)]
pub(super) struct Freeze {
    /// A, M: whether the workqueue is frozen. Stored (`SeqCst`) under `config`, after
    /// the pwqs' marks are set (freeze) or cleared (thaw), so that a reader who sees it
    /// set sees every pwq frozen; read under `config` by `Pwq::new` and `thaw` (the
    /// lock orders them) and without it by [`Workqueue::is_frozen`] and `freeze`'s
    /// wait, which stops when a thaw cleared it.
    frozen: AtomicBool,
}

impl Freeze {
    /// Whether the workqueue is frozen now.
    pub(super) fn is_frozen(&self) -> bool {
        self.frozen.load(SeqCst)
    }
}

impl Workqueue {
    /// Freezes the workqueue (a freezable workqueue's `freeze_workqueues_begin`, then
    /// waiting as `freeze_workqueues_busy` is polled): from the call on, new items and
    /// queued items that were still waiting for an active slot wait, and items already
    /// active (handed to a pool) run to the end. Returns when none of its items runs
    /// or holds an active slot. Nothing is lost: everything waiting runs, exactly once,
    /// after [`Workqueue::thaw`].
    ///
    /// While frozen:
    /// - queue calls succeed as usual (PENDING coalescing included); timers that fire
    ///   queue their items, which wait too;
    /// - [`Work::cancel`](crate::Work::cancel) removes a waiting instance (it is
    ///   dropped, uncounted from `in_flight`, when the thaw reaches it);
    /// - [`Workqueue::flush`], [`Workqueue::drain`], [`Work::flush`](crate::Work::flush),
    ///   [`JoinHandle::join`](crate::JoinHandle::join) and broadcasts wait for waiting
    ///   items, that is until another thread thaws the workqueue: flushing a frozen
    ///   workqueue from the only thread that would thaw it never returns (its
    ///   [`Workqueue::dump`] says `frozen`);
    /// - attribute changes apply, and the new pool_workqueues start frozen;
    /// - dropping the last handle and [`Workqueue::shutdown`] thaw it first, so that
    ///   everything waiting runs before the workqueue goes.
    ///
    /// Freezing a frozen workqueue waits again for its active items. Refused from one
    /// of its own items ([`Error::FreezeFromOwnItem`]: the caller is one of the items
    /// it would wait for); [`Error::ThawedWhileFreezing`] if another thread thawed it
    /// before the active items finished.
    ///
    /// Departure: the kernel freezes every `WQ_FREEZABLE` workqueue at once (system
    /// suspend); podq freezes the one workqueue it is called on, and any workqueue may
    /// be frozen (there is no flag to set at build time). The kernel does it by setting each
    /// pwq's `max_active` to 0; podq marks the pwqs frozen and leaves the node limits
    /// as they are, so [`Workqueue::dump`] still shows them.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    ///
    /// let wq = podq::Workqueue::builder("doc-freeze").build()?;
    /// let ran = Arc::new(AtomicUsize::new(0));
    /// wq.freeze()?;
    /// let r = Arc::clone(&ran);
    /// let handle = wq.spawn(move || r.fetch_add(1, Ordering::SeqCst));
    /// assert!(wq.dump().frozen);
    /// assert_eq!(ran.load(Ordering::SeqCst), 0, "waits while frozen");
    /// assert!(wq.thaw());
    /// handle.join().unwrap();
    /// assert_eq!(ran.load(Ordering::SeqCst), 1);
    /// # Ok::<(), podq::Error>(())
    /// ```
    pub fn freeze(&self) -> Result<(), Error> {
        let wq = self.shared();
        if pool::current_wq() == wq.id {
            return Err(Error::FreezeFromOwnItem {
                wq: wq.name.clone(),
            });
        }
        wq.freeze_begin();
        pool::blocking(|| wq.wait_frozen())
    }

    /// Thaws the workqueue (`thaw_workqueues`): the items that waited are activated in
    /// queueing order per pool_workqueue, up to `max_active`, and new items run as
    /// usual. Returns whether it was frozen.
    pub fn thaw(&self) -> bool {
        self.shared().thaw()
    }

    /// Whether the workqueue is frozen.
    pub fn is_frozen(&self) -> bool {
        self.shared().freeze.is_frozen()
    }
}

impl WqShared {
    /// Marks the workqueue and its pwqs frozen, and waits out queue calls that passed a
    /// gate before it closed.
    fn freeze_begin(&self) {
        let cfg = lock(&self.config);
        for pwq in lock(&self.pwqs).iter() {
            let mut st = lock(&pwq.state);
            st.frozen = true;
            pwq.set_gate(&st);
        }
        // After the marks: whoever sees the flag set sees every pwq frozen.
        self.freeze.frozen.store(true, SeqCst);
        drop(cfg);
        // A queue call that loaded a gate clear before it closed may still take a slot
        // on the fast path; it stays in a read section of the table until its item is
        // on a worklist. One grace period waits for every such call, so from here on
        // the active slots count all of them.
        self.table.synchronize();
    }

    /// Waits until no item holds an active slot; stops if a thaw came first.
    fn wait_frozen(&self) -> Result<(), Error> {
        let mut poll = Duration::from_micros(50);
        loop {
            if !self.freeze.is_frozen() {
                return Err(Error::ThawedWhileFreezing {
                    wq: self.name.clone(),
                });
            }
            if self.nodes.iter().all(|n| n.active_of_max().0 == 0) {
                return Ok(());
            }
            std::thread::sleep(poll);
            poll = (poll * 2).min(POLL_MAX);
        }
    }

    /// Clears the frozen marks, puts pwqs with waiting items back on their nodes'
    /// pending lists and activates them. Returns whether it was frozen.
    pub(super) fn thaw(&self) -> bool {
        let cfg = lock(&self.config);
        if !self.freeze.is_frozen() {
            return false;
        }
        for pwq in lock(&self.pwqs).iter() {
            let mut st = lock(&pwq.state);
            st.frozen = false;
            pwq.repend(&mut st);
            pwq.set_gate(&st);
        }
        self.freeze.frozen.store(false, SeqCst);
        drop(cfg);
        for node in &self.nodes {
            self.activate(node);
        }
        true
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use std::sync::Arc;

    use crate::lease::Slot;
    use crate::published::Published;
    use crate::sync::{AtomicBool, Ordering::SeqCst};
    use crate::workqueue::node::NodeActive;

    /// Step 2 of a freeze (`README.md`, "Freeze"): a queue call loads its pwq's gate
    /// inside a read section of the table and, finding it open, takes a node slot on
    /// the fast path (`enqueue_any`); the freezer closes the gate, waits out the
    /// sections (`Published::synchronize`, as `freeze_begin`) and reads the node's
    /// active count (as `wait_frozen`). The real section, gate ordering and slot take,
    /// for a reader of `slot`: a slot taken on the fast path is always counted.
    fn freeze_sees_every_fast_path_slot(slot: Slot) {
        loom::model(move || {
            let table = Arc::new(Published::new(Arc::new(())));
            let gate = Arc::new(AtomicBool::new(false));
            let node = Arc::new(NodeActive::<u32>::new());
            node.set_max(4);
            let queuer = {
                let (table, gate, node) = (table.clone(), gate.clone(), node.clone());
                loom::thread::spawn(move || {
                    let section = table.read_as(slot);
                    let took = !gate.load(SeqCst) && node.try_inc();
                    drop(section);
                    took
                })
            };
            gate.store(true, SeqCst);
            table.synchronize();
            let active = node.active_of_max().0;
            let took = queuer.join().unwrap();
            assert!(!took || active == 1, "a fast-path slot the freezer missed");
        });
    }

    #[test]
    fn loom_freeze_counts_a_leased_fast_path_slot() {
        freeze_sees_every_fast_path_slot(Slot::Leased(0));
    }

    #[test]
    fn loom_freeze_counts_an_unleased_fast_path_slot() {
        freeze_sees_every_fast_path_slot(Slot::Shared(0));
    }
}

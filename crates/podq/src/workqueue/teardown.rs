//! Dropping the last handle of a workqueue (`destroy_workqueue`): drain, cancel what is
//! on the timer, retire every pwq and join the workers of pools no one else uses. The
//! rules are in the `Workqueue` docs (Shutdown).

use crate::stats::Item;
use crate::sync::Ordering::SeqCst;
use std::sync::Arc;

use podq_topology::CpuSet;

use super::registry::registry;
use super::{Pwq, Table, WqHandle};
use crate::delayed;
use crate::pool::{self, PoolCore};
use crate::sync::lock;

impl Drop for WqHandle {
    fn drop(&mut self) {
        let wq = &self.shared;
        // Off the control plane first, as the kernel's `destroy_workqueue` removes the
        // sysfs device first.
        #[cfg(feature = "control")]
        wq.hide();
        // Frozen items would never run, and the drain would wait for them forever.
        wq.thaw();
        // Dropped inside one of its own items, the workqueue cannot wait for itself:
        // its pwqs that still hold items then retire on their own as their last item
        // completes (`Pwq::complete`), activating waiting items on the way, so none is
        // lost. After a drain every pwq is empty and retires here.
        if pool::current_wq() != wq.id {
            pool::blocking(|| wq.drain());
        }
        pool::stop_rescuer(wq.id);
        // Marked under `config`: an attribute change in progress (an `auto` switch, a
        // control request) finishes before the table goes, with its retired pwqs in
        // `retired`; later ones see `destroyed` (`config_to_change`).
        let mut cfg = lock(&wq.config);
        wq.destroyed.store(true, SeqCst);
        let retired = std::mem::take(&mut cfg.retired);
        drop(cfg);
        let cancelled = delayed::cancel_for(wq.id);
        wq.counters.add(Item::Cancelled, cancelled);
        let old = wq.table.replace(Arc::new(Table {
            cpu_pwq: Vec::new(),
            dfl: None,
            unbound: CpuSet::new(),
        }));
        drop(old);
        let mut retiring: Vec<Arc<Pwq>> = Vec::new();
        lock(&wq.pwqs).retain(|pwq| {
            let retired = pwq.leave_table();
            if retired {
                retiring.push(Arc::clone(pwq));
            }
            !retired
        });
        wq.unplug_oldest();
        let mut cores: Vec<Arc<PoolCore>> =
            retiring.iter().map(|p| Arc::clone(&p.pool.core)).collect();
        // Dropping the last pwqs of a pool no other workqueue uses stops its workers;
        // join them here (never from a worker, and never under a lock).
        drop(retiring);
        if pool::current_wq() == 0 {
            // Pwqs retired by earlier attribute changes: their last item's worker drops
            // its reference right after completing it, which may stop their pool, a
            // moment after the drain saw them empty. Wait for that, then join.
            for (pwq, core) in retired {
                while pwq.strong_count() > 0 {
                    std::thread::yield_now();
                }
                cores.push(core);
            }
            for core in cores {
                core.join_if_stopped();
            }
        }
        lock(registry())
            .retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(wq)));
    }
}

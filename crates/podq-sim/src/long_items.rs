//! The runtime's CPU-intensive rule (`podq_policy::cpu_intensive`): the watchdog looks
//! every `cpu_intensive_look_period`, takes a worker whose item has run past the
//! threshold out of its pool's running count (at most as many as the pool's CPUs,
//! `may_leave_count`) and kicks the pool, so the items behind it get another worker;
//! the items in the worker's batch go back to the worklist's front, the pool's next
//! claims take one item each (`SINGLE_TAKES_AFTER_LONG_ITEM`), and the worker counts
//! again when its item ends. The runtime's look measures a run from the
//! first look that saw it; the model from the item's start, which makes a demotion
//! happen up to one look period sooner. The watchdog thread itself, its doze while no
//! item runs and its CPU time are not modelled.

use std::time::Duration;

use podq_policy::{
    cpu_intensive, cpu_intensive_look_period, may_leave_count, SINGLE_TAKES_AFTER_LONG_ITEM,
};

use crate::engine::{Role, Sim, Tid};
use crate::events::{Event, Ns};

impl Sim<'_> {
    /// How often the watchdog looks: from the queue under test's threshold (the
    /// runtime's is process-wide), or never when the rule is off.
    pub fn long_item_look_period(&self) -> Option<Ns> {
        let threshold = self.world.pools.iter().find_map(|p| p.cpu_intensive)?;
        Some(cpu_intensive_look_period(threshold).as_nanos() as Ns)
    }

    /// The watchdog's look: every worker whose item has run past its pool's threshold
    /// and still counts leaves the count, in thread order, while its pool has room.
    pub fn look_for_long_items(&mut self) {
        for tid in 0..self.threads.len() {
            let t = &self.threads[tid];
            let Role::Worker(pool) = t.role else {
                continue;
            };
            if !t.in_item || t.out_of_count {
                continue;
            }
            let p = &self.world.pools[pool];
            let ran = Duration::from_nanos(self.now - t.item_since);
            if cpu_intensive(ran, p.cpu_intensive)
                && may_leave_count(p.out_for_long_items, p.key.concurrency())
            {
                self.leave_count(tid, pool);
            }
        }
        if let Some(period) = self.long_item_look_period() {
            self.events.push(self.now + period, Event::LongItems);
        }
    }

    /// Takes worker `tid` out of its pool's count and hands the items of its batch back
    /// to the front of the worklist, in their order, as the runtime's watchdog does.
    fn leave_count(&mut self, tid: Tid, pool: usize) {
        self.threads[tid].out_of_count = true;
        let batch = std::mem::take(&mut self.threads[tid].batch);
        self.counters.handed_back += batch.len() as u64;
        let p = &mut self.world.pools[pool];
        p.taken -= batch.len() as u64;
        for entry in batch.into_iter().rev() {
            p.worklist.push_front(entry);
        }
        p.out_for_long_items += 1;
        p.nr_running -= 1;
        p.single_takes = SINGLE_TAKES_AFTER_LONG_ITEM;
        self.counters.cpu_intensive += 1;
        self.kick_now(tid, pool);
    }

    /// Worker `tid` of `pool` ended an item: it counts again if it was out.
    pub fn long_item_ended(&mut self, tid: Tid, pool: usize) {
        let t = &mut self.threads[tid];
        t.in_item = false;
        if std::mem::take(&mut t.out_of_count) {
            let p = &mut self.world.pools[pool];
            p.out_for_long_items -= 1;
            p.nr_running += 1;
        }
    }
}

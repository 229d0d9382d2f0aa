//! Queued locks: a holder, FIFO waiters that spin on their CPUs, and hand-off costs by
//! the distance between the releasing and the acquiring CPU.
//!
//! Uncontended, an acquisition costs one line transfer from the last holder's CPU.
//! Contended, the waiter gets the lock `2 x c2c(d) + lock_handoff_extra` after the
//! release, plus `lock_spinner_factor x c2c(d)` for every further spinner hammering the
//! line. A line whose home node is remote to both CPUs costs `remote_home` more.

use std::collections::VecDeque;

use serde::Serialize;

use crate::distance::Distance;
use crate::engine::{Sim, Tid};
use crate::events::{to_ns, Ns};

/// Which use of a lock an acquisition counts as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// A pool lock taken to append an item.
    Enqueue,
    /// A pool lock taken by a worker.
    Dequeue,
    /// The allocator's node list lock.
    Alloc,
}

/// Counts of one lock use (and in `podq bench`'s JSON, of a real one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LockCounts {
    /// Acquisitions.
    pub acquisitions: u64,
    /// Acquisitions that found the lock held.
    pub contended: u64,
    /// Total time spent waiting, nanoseconds.
    pub wait_ns: u64,
}

impl LockCounts {
    /// Adds `other`.
    pub fn add(&mut self, other: &LockCounts) {
        self.acquisitions += other.acquisitions;
        self.contended += other.contended;
        self.wait_ns += other.wait_ns;
    }

    /// `self - earlier`, for counters sampled at two instants (0 where a count went
    /// back).
    pub fn since(&self, earlier: &LockCounts) -> LockCounts {
        LockCounts {
            acquisitions: self.acquisitions.saturating_sub(earlier.acquisitions),
            contended: self.contended.saturating_sub(earlier.contended),
            wait_ns: self.wait_ns.saturating_sub(earlier.wait_ns),
        }
    }
}

/// A simulated lock.
pub struct Lock {
    holder: Option<Tid>,
    last_cpu: Option<usize>,
    home_node: usize,
    waiters: VecDeque<(Tid, usize, Ns, Side)>,
    /// Counts per [`Side`]: enqueue, dequeue, alloc.
    pub counts: [LockCounts; 3],
}

impl Lock {
    /// Whether thread `tid` holds it.
    pub fn held_by(&self, tid: Tid) -> bool {
        self.holder == Some(tid)
    }
}

fn index(side: Side) -> usize {
    match side {
        Side::Enqueue => 0,
        Side::Dequeue => 1,
        Side::Alloc => 2,
    }
}

impl Sim<'_> {
    /// A new free lock whose line lives on `home_node`.
    pub fn new_lock(&mut self, home_node: usize) -> usize {
        self.locks.push(Lock {
            holder: None,
            last_cpu: None,
            home_node,
            waiters: VecDeque::new(),
            counts: [LockCounts::default(); 3],
        });
        self.locks.len() - 1
    }

    fn transfer(&self, lock: usize, from: usize, to: usize) -> f64 {
        let mut ns = self.c2c(from, to);
        let home = self.locks[lock].home_node;
        if self.distance(from, to) >= Distance::Llc
            && self.cpus[from].node != home
            && self.cpus[to].node != home
        {
            ns += self.cost.remote_home;
        }
        ns
    }

    /// Thread `tid` acquires `lock`. Returns true when it must wait (for the transfer
    /// step or, spinning, for the hand-off); false when it holds the lock at once.
    pub fn lock_acquire(&mut self, tid: Tid, lock: usize, side: Side) -> bool {
        let cpu = self.threads[tid].cpu;
        self.threads[tid].held += 1;
        if self.locks[lock].holder.is_some() {
            self.locks[lock]
                .waiters
                .push_back((tid, cpu, self.now, side));
            return true;
        }
        // Counted when the lock is had (here, or at the hand-off for a waiter), so that
        // in any window a contended acquisition is one of the acquisitions.
        self.locks[lock].counts[index(side)].acquisitions += 1;
        self.locks[lock].holder = Some(tid);
        let last = self.locks[lock].last_cpu.replace(cpu);
        match last {
            Some(from) if from != cpu => {
                let ns = self.transfer(lock, from, cpu);
                self.step_after(tid, ns);
                true
            }
            _ => false,
        }
    }

    /// Thread `tid` releases `lock`; the first waiter gets it after the hand-off.
    pub fn lock_release(&mut self, tid: Tid, lock: usize) {
        debug_assert_eq!(self.locks[lock].holder, Some(tid));
        let cpu = self.threads[tid].cpu;
        self.threads[tid].held -= 1;
        let Some((next, next_cpu, since, side)) = self.locks[lock].waiters.pop_front() else {
            self.locks[lock].holder = None;
            return;
        };
        let line = self.transfer(lock, cpu, next_cpu);
        let others = self.locks[lock].waiters.len() as f64;
        let handoff = 2.0 * line
            + self.cost.lock_handoff_extra
            + others * self.cost.lock_spinner_factor * line;
        let l = &mut self.locks[lock];
        l.holder = Some(next);
        l.last_cpu = Some(next_cpu);
        let c = &mut l.counts[index(side)];
        c.acquisitions += 1;
        c.contended += 1;
        c.wait_ns += self.now + to_ns(handoff) - since;
        self.step_after(next, handoff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Op, Role};
    use crate::events::Event;
    use crate::programs::World;
    use crate::workload::Workload;
    use podq_topology::{CpuSet, Topology};

    /// Two threads on CPUs 0 and 1 (cores of one LLC) take one lock at the same
    /// instant: the second waits for the first's hold plus one hand-off.
    #[test]
    fn a_contended_acquisition_waits_for_the_hold_and_the_hand_off() {
        let topo = Topology::synthetic("2s24c2t").unwrap();
        let mut cost = crate::cost::machine("xeon-2s24c").unwrap().params;
        cost.jitter = 0.0;
        let world = World::new(Workload::Queue {
            producer_cpus: vec![0],
            item_ns: 0,
        });
        let mut sim = Sim::new(&topo, cost, 1, world);
        let lock = sim.new_lock(0);
        let ops = vec![
            Op::Lock(lock, Side::Enqueue),
            Op::Compute(100.0),
            Op::Unlock(lock),
            Op::Block,
        ];
        for cpu in [0, 1] {
            let tid = sim.spawn(Role::Producer(cpu), CpuSet::single(cpu), cpu, ops.clone());
            sim.wake(tid, cpu, cpu, None);
        }
        // Counts taken while the second thread waits (as a measured window may start
        // then): the acquisition it is waiting for is not counted yet, so the window
        // after it sees one contended acquisition among one, not one among none.
        let mut waiting = None;
        while let Some((at, event)) = sim.events.pop() {
            sim.now = at;
            match event {
                Event::Step { tid, generation } => sim.on_step(tid, generation),
                Event::Arrive { tid, cpu } => sim.on_arrive(tid, cpu),
                _ => unreachable!(),
            }
            if waiting.is_none() && !sim.locks[lock].waiters.is_empty() {
                waiting = Some(sim.locks[lock].counts[0]);
            }
        }
        let c = sim.locks[lock].counts[0];
        assert_eq!(c.acquisitions, 2);
        assert_eq!(c.contended, 1);
        let window = c.since(&waiting.expect("the second thread waited"));
        assert_eq!((window.acquisitions, window.contended), (1, 1));
        // Hold 100 ns, then 2 x 48 ns + 20 ns hand-off between cores of one LLC.
        assert_eq!(c.wait_ns, 216);
        // Wake-up 2 us, context switch 1.1 us, 100 + 116 + 100 ns.
        assert_eq!(sim.now, 2_000 + 1_100 + 316);
        assert_eq!(sim.busy_ns(0) + sim.busy_ns(1), 2 * 1_100 + 100 + 216 + 100);
    }

    #[test]
    fn counts_subtract_and_add() {
        let a = LockCounts {
            acquisitions: 10,
            contended: 4,
            wait_ns: 100,
        };
        let b = LockCounts {
            acquisitions: 3,
            contended: 1,
            wait_ns: 40,
        };
        assert_eq!(
            a.since(&b),
            LockCounts {
                acquisitions: 7,
                contended: 3,
                wait_ns: 60
            }
        );
        let mut c = b;
        c.add(&b);
        assert_eq!(c.acquisitions, 6);
    }
}

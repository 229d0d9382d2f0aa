//! The allocator model of `completion`, after SLUB: a small cache of free objects per
//! CPU and a partial list per node behind a lock.
//!
//! An allocation takes from the CPU cache, or refills half of it from the node list
//! under the node lock. A free into the allocating CPU's cache is the fast path; a
//! *remote* free (allocated on another CPU, or node with `RemoteFree::Node`) pays a
//! line transfer and a locked cmpxchg on the slab, and one in `slab_lock_every` takes
//! the object's node lock (the slab changes list); a local free into a full cache
//! takes the CPU's node lock. Departure from `podq bench`'s model, which takes the
//! node lock on every remote free: SLUB takes `list_lock` only when a slab changes
//! list (cost-model §5).

use serde::Serialize;

use crate::engine::{Op, Sim, Tid};
use crate::lock::Side;
use crate::workload::{RemoteFree, Workload};

/// Which object of an I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// Allocated by the producer, freed by rpciod.
    Request,
    /// Allocated by rpciod, freed by nfsiod.
    Task,
}

/// Counters of the allocator model (as `podq bench` reports them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AllocCounts {
    /// Allocations from the CPU cache.
    pub fast_allocs: u64,
    /// Allocations that refilled the CPU cache.
    pub slow_allocs: u64,
    /// Frees into the CPU cache.
    pub fast_frees: u64,
    /// Remote frees.
    pub remote_frees: u64,
    /// Local frees that found the CPU cache full.
    pub overflow_frees: u64,
}

impl AllocCounts {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &AllocCounts) {
        self.fast_allocs += other.fast_allocs;
        self.slow_allocs += other.slow_allocs;
        self.fast_frees += other.fast_frees;
        self.remote_frees += other.remote_frees;
        self.overflow_frees += other.overflow_frees;
    }

    /// `self - earlier`.
    pub fn since(&self, earlier: &AllocCounts) -> AllocCounts {
        AllocCounts {
            fast_allocs: self.fast_allocs - earlier.fast_allocs,
            slow_allocs: self.slow_allocs - earlier.slow_allocs,
            fast_frees: self.fast_frees - earlier.fast_frees,
            remote_frees: self.remote_frees - earlier.remote_frees,
            overflow_frees: self.overflow_frees - earlier.overflow_frees,
        }
    }
}

/// The allocator's state.
#[derive(Default)]
pub struct Slab {
    /// Free objects per CPU cache.
    pub cache: Vec<usize>,
    /// Cache capacity.
    pub capacity: usize,
    /// Node list locks, by node id.
    pub node_lock: Vec<usize>,
    /// Remote frees per node, for `slab_lock_every`.
    pub remote: Vec<u64>,
    /// Counters.
    pub counts: AllocCounts,
}

impl Sim<'_> {
    fn object_write(&self) -> f64 {
        match &self.world.workload {
            Workload::Completion(c) => self.cost.buf4k_local * c.object_size as f64 / 4096.0,
            _ => 0.0,
        }
    }

    /// Allocates `which` of I/O `io` on `tid`'s CPU.
    pub fn alloc(&mut self, tid: Tid, io: usize, which: Which) {
        let cpu = self.threads[tid].cpu;
        match which {
            Which::Request => self.world.ios[io].request_cpu = cpu,
            Which::Task => self.world.ios[io].task_cpu = cpu,
        }
        let write = self.object_write() + self.cost.slab_fast;
        let slab = &mut self.world.slab;
        if slab.cache[cpu] > 0 {
            slab.cache[cpu] -= 1;
            slab.counts.fast_allocs += 1;
            self.push_ops(tid, &[Op::Compute(write)]);
            return;
        }
        slab.counts.slow_allocs += 1;
        let refill = (slab.capacity / 2).max(1);
        slab.cache[cpu] = refill - 1;
        let lock = slab.node_lock[self.cpus[cpu].node];
        let hold = self.cost.slab_lock_hold + refill as f64 * self.cost.dram_local / self.cost.mlp;
        self.push_ops(
            tid,
            &[
                Op::Lock(lock, Side::Alloc),
                Op::Compute(hold),
                Op::Unlock(lock),
                Op::Compute(write),
            ],
        );
    }

    /// Frees `which` of I/O `io` on `tid`'s CPU.
    pub fn free(&mut self, tid: Tid, io: usize, which: Which) {
        let cpu = self.threads[tid].cpu;
        let owner = match which {
            Which::Request => self.world.ios[io].request_cpu,
            Which::Task => self.world.ios[io].task_cpu,
        };
        let rule = match &self.world.workload {
            Workload::Completion(c) => c.remote_free,
            _ => RemoteFree::Cpu,
        };
        let remote = match rule {
            RemoteFree::Cpu => owner != cpu,
            RemoteFree::Node => self.cpus[owner].node != self.cpus[cpu].node,
        };
        let hold = self.cost.slab_lock_hold;
        if remote {
            let home = self.cpus[owner].node;
            let every = self.cost.slab_lock_every.round().max(1.0) as u64;
            let cost = self.c2c(owner, cpu) + self.cost.slab_remote_extra;
            let slab = &mut self.world.slab;
            slab.counts.remote_frees += 1;
            slab.remote[home] += 1;
            if slab.remote[home] % every == 0 {
                let lock = slab.node_lock[home];
                self.push_ops(
                    tid,
                    &[
                        Op::Compute(cost),
                        Op::Lock(lock, Side::Alloc),
                        Op::Compute(hold),
                        Op::Unlock(lock),
                    ],
                );
            } else {
                self.push_ops(tid, &[Op::Compute(cost)]);
            }
            return;
        }
        let fast = self.cost.slab_fast;
        let slab = &mut self.world.slab;
        if slab.cache[cpu] < slab.capacity {
            slab.cache[cpu] += 1;
            slab.counts.fast_frees += 1;
            self.push_ops(tid, &[Op::Compute(fast)]);
        } else {
            slab.counts.overflow_frees += 1;
            let lock = slab.node_lock[self.cpus[cpu].node];
            self.push_ops(
                tid,
                &[
                    Op::Lock(lock, Side::Alloc),
                    Op::Compute(hold),
                    Op::Unlock(lock),
                ],
            );
        }
    }
}

//! What a workload needs from an executor, so podq and its peers run the same code.
//!
//! A workload builds its items once (`Queue::prepare`) and submits them again and
//! again, which is how the kernel's users treat a `work_struct` and how podq's `Work`
//! is meant to be used. Each system submits through its own natural API: podq re-queues
//! a `Work`, rayon and tokio spawn a closure, the channel pools send a shared handle.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::Thread;

use anyhow::{bail, Result};
use podq_topology::{Scope, Topology};
use serde::Serialize;

/// The body of an item: shared, run any number of times.
pub type Task = Arc<dyn Fn() + Send + Sync>;

/// How a queue is configured; peers have no scope and no strictness.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct QueueConfig {
    /// Affinity scope (podq only).
    pub scope: Option<Scope>,
    /// Strict pods (podq only).
    pub strict: Option<bool>,
}

impl QueueConfig {
    /// The configuration of a system that has no knobs.
    pub const PLAIN: QueueConfig = QueueConfig {
        scope: None,
        strict: None,
    };

    /// `scope/strict` for tables, `-` for peers.
    pub fn label(&self) -> String {
        match (self.scope, self.strict) {
            (Some(scope), Some(true)) => format!("{scope} strict"),
            (Some(scope), _) => scope.to_string(),
            (None, _) => "-".to_owned(),
        }
    }
}

/// Lock contention of one lock class, summed over pools: the simulator's type, so that
/// real and simulated runs report the same fields.
pub use podq_sim::LockCounts;

/// Pool lock counters of one queue, where the system keeps them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PoolLockCounts {
    /// The lock taken to append an item.
    pub enqueue: LockCounts,
    /// The lock taken by workers to take an item.
    pub dequeue: LockCounts,
}

impl PoolLockCounts {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &PoolLockCounts) {
        self.enqueue.add(&other.enqueue);
        self.dequeue.add(&other.dequeue);
    }

    /// `self - earlier`.
    pub fn since(&self, earlier: &PoolLockCounts) -> PoolLockCounts {
        PoolLockCounts {
            enqueue: self.enqueue.since(&earlier.enqueue),
            dequeue: self.dequeue.since(&earlier.dequeue),
        }
    }
}

/// An executor under test.
pub trait System: Send + Sync {
    /// The name used in tables and JSON (`podq`, `rayon`, ...).
    fn name(&self) -> &'static str;

    /// The configurations to run for the requested scopes and strictness. Systems
    /// without scopes return one plain configuration.
    fn configs(&self, scopes: &[Scope], strict: &[bool]) -> Vec<QueueConfig>;

    /// Creates a queue named `name` (names matter to podq's stats only).
    fn new_queue(&self, name: &str, config: QueueConfig) -> Result<Arc<dyn Queue>>;

    /// Called on a producer thread after it was pinned to virtual CPU `vcpu`.
    fn enter_cpu(&self, vcpu: usize) {
        let _ = vcpu;
    }

    /// Undoes `enter_cpu` on a thread that is not pinned.
    fn leave_cpu(&self) {}

    /// A fixed number of worker threads, if the system has one (the `memory` workload
    /// holds them all back with blockers; a pool that grows has none).
    fn workers(&self) -> Option<usize> {
        None
    }

    /// A queue whose items do not run until the returned gate opens (the `memory`
    /// workload keeps items queued with it). By default every worker runs a blocker
    /// that waits for the gate; systems whose pools grow override it.
    fn new_held_queue(&self, name: &str, config: QueueConfig) -> Result<(Arc<dyn Queue>, Gate)> {
        let Some(workers) = self.workers() else {
            bail!(
                "{} has no fixed set of workers to hold back (it starts threads for waiting items)",
                self.name()
            );
        };
        let queue = self.new_queue(name, config)?;
        let gate = Gate::new();
        let blockers: Vec<Box<dyn Item>> = (0..workers)
            .map(|_| {
                let gate = gate.clone();
                queue.prepare(Arc::new(move || gate.enter()))
            })
            .collect();
        for blocker in &blockers {
            blocker.submit();
        }
        gate.wait_entered(workers);
        Ok((queue, gate))
    }

    /// A function telling the virtual CPU of the calling thread as the system sees
    /// it; items call it on workers.
    fn cpu_probe(&self) -> fn() -> usize {
        placement::current_vcpu
    }
}

/// One queue of a system.
pub trait Queue: Send + Sync {
    /// Turns `task` into an item that can be submitted many times. An item is only
    /// submitted again after its previous run finished.
    fn prepare(&self, task: Task) -> Box<dyn Item>;

    /// Submits one run of the `throughput` workload's tiny one-shot item
    /// (`throughput::tiny(seq)`) through the system's spawn-like API, dropping any
    /// handle at once.
    fn spawn_tiny(&self, seq: u64);

    /// As [`Queue::spawn_tiny`] through an API with no handle at all. The peers' spawns
    /// have none, so by default the same call.
    fn execute_tiny(&self, seq: u64) {
        self.spawn_tiny(seq);
    }

    /// Changes the affinity scope while items flow (podq only).
    fn set_scope(&self, scope: Scope) -> Result<()> {
        bail!("changing the scope live needs podq (got {scope})")
    }

    /// Pool lock counters, if the system keeps them.
    fn lock_counts(&self) -> Option<PoolLockCounts> {
        None
    }

    /// The `auto` controller's report, while the queue is on `auto` (podq only).
    fn auto(&self) -> Option<podq::auto::AutoStats> {
        None
    }

    /// Items queued and finished so far, if the system counts them (podq).
    fn totals(&self) -> Option<podq::stats::Totals> {
        None
    }

    /// Pools behind the queue, if the system has several (podq).
    fn pools(&self) -> Option<usize> {
        None
    }

    /// Waits until every item queued so far has run, if the system has such a call
    /// (podq's `Workqueue::flush`); returns whether it had.
    fn flush(&self) -> bool {
        false
    }

    /// Whether a prepared item coalesces a submit with a run still pending (podq's
    /// PENDING bit); the `throughput` workload adds that rule to systems without it.
    fn coalesces(&self) -> bool {
        false
    }
}

/// A prepared item.
pub trait Item: Send + Sync {
    /// Queues one run of the item. Returns false when the call was coalesced with a
    /// run still pending (podq's PENDING bit); peers accept every call.
    fn submit(&self) -> bool;
}

/// Blockers wait here until it opens; the opener can wait for a number of them to
/// have entered.
#[derive(Clone, Debug, Default)]
pub struct Gate(Arc<(Mutex<GateState>, Condvar)>);

#[derive(Debug, Default)]
struct GateState {
    open: bool,
    entered: usize,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Counts the caller in and blocks until the gate opens.
    pub fn enter(&self) {
        let (state, cv) = &*self.0;
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        s.entered += 1;
        cv.notify_all();
        while !s.open {
            s = cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Blocks until `n` callers have entered.
    pub fn wait_entered(&self, n: usize) {
        let (state, cv) = &*self.0;
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        while s.entered < n {
            s = cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Opens the gate for good.
    pub fn open(&self) {
        let (state, cv) = &*self.0;
        state.lock().unwrap_or_else(|p| p.into_inner()).open = true;
        cv.notify_all();
    }
}

/// A one-shot completion a producer waits on: the worker sets the flag and unparks
/// the producer; the producer parks until it sees the flag. No polling, no sleeping.
#[derive(Debug)]
pub struct Completion {
    done: AtomicBool,
    waiter: Thread,
}

impl Completion {
    /// A completion the calling thread will wait on.
    pub fn for_current_thread() -> Arc<Completion> {
        Arc::new(Completion {
            done: AtomicBool::new(false),
            waiter: std::thread::current(),
        })
    }

    /// Signals the waiter.
    pub fn complete(&self) {
        // Release pairs with the Acquire swap in `wait`: the item's writes are visible
        // to the producer once it sees the flag.
        self.done.store(true, Ordering::Release);
        self.waiter.unpark();
    }

    /// Waits for `complete` and re-arms. Only the thread that created it may wait.
    pub fn wait(&self) {
        while !self.done.swap(false, Ordering::Acquire) {
            std::thread::park();
        }
    }
}

/// Virtual CPUs (those of the topology under test) and the real CPUs they run on.
pub mod placement {
    use super::*;

    thread_local! {
        static VCPU: Cell<Option<usize>> = const { Cell::new(None) };
    }

    /// Maps the topology's CPUs onto the CPUs this process may use: virtual CPU `v`
    /// runs on the `v % n`-th real usable CPU (ascending), as podq maps fake
    /// topologies. On the live topology this is the identity.
    #[derive(Clone, Debug)]
    pub struct CpuMap {
        topology: Topology,
        real: Vec<usize>,
    }

    impl CpuMap {
        /// Maps `topology` onto the CPUs in this process's affinity mask.
        pub fn new(topology: Topology) -> Result<CpuMap> {
            let real = allowed_cpus()?;
            Ok(CpuMap { topology, real })
        }

        /// The topology under test.
        pub fn topology(&self) -> &Topology {
            &self.topology
        }

        /// The usable virtual CPUs, ascending.
        pub fn vcpus(&self) -> Vec<usize> {
            self.topology.usable().iter().collect()
        }

        /// The real CPUs, ascending.
        pub fn real_cpus(&self) -> &[usize] {
            &self.real
        }

        /// Whether virtual CPUs are not simply the real ones.
        pub fn is_fake(&self) -> bool {
            self.vcpus() != self.real
        }

        /// The real CPU virtual CPU `vcpu` runs on.
        pub fn real_of(&self, vcpu: usize) -> usize {
            let index = self
                .topology
                .usable()
                .iter()
                .position(|c| c == vcpu)
                .unwrap_or(vcpu);
            self.real[index % self.real.len()]
        }

        /// Pins the calling thread to the real CPU of `vcpu` and records `vcpu` as
        /// the thread's virtual CPU.
        pub fn pin_current(&self, vcpu: usize) -> Result<()> {
            pin_to_real(&[self.real_of(vcpu)])?;
            set_current_vcpu(Some(vcpu));
            Ok(())
        }
    }

    /// Records the calling thread's virtual CPU (`None`: use the real one).
    pub fn set_current_vcpu(vcpu: Option<usize>) {
        VCPU.with(|c| c.set(vcpu));
    }

    /// The calling thread's virtual CPU if one was set, else the real CPU it runs on.
    pub fn current_vcpu() -> usize {
        VCPU.with(Cell::get).unwrap_or_else(real_cpu)
    }

    /// The real CPU the calling thread runs on right now.
    pub fn real_cpu() -> usize {
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        usize::try_from(cpu).unwrap_or(0)
    }

    /// Restricts the calling thread to `cpus`.
    pub fn pin_to_real(cpus: &[usize]) -> Result<()> {
        let set: podq_topology::CpuSet = cpus.iter().copied().collect();
        podq_topology::live::set_affinity_of(0, &set)
            .map_err(|e| anyhow::anyhow!("cannot pin thread to CPUs {cpus:?}: {e}"))
    }

    /// The CPUs in this process's affinity mask, ascending.
    pub fn allowed_cpus() -> Result<Vec<usize>> {
        let cpus: Vec<usize> = podq_topology::live::affinity()
            .map_err(|e| anyhow::anyhow!("cannot read the CPU affinity mask: {e}"))?
            .iter()
            .collect();
        if cpus.is_empty() {
            bail!("the CPU affinity mask is empty");
        }
        Ok(cpus)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_holds_blockers_until_it_opens() {
        let gate = Gate::new();
        let passed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (gate, passed) = (gate.clone(), Arc::clone(&passed));
                std::thread::spawn(move || {
                    gate.enter();
                    passed.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        gate.wait_entered(3);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(passed.load(Ordering::SeqCst), 0);
        gate.open();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(passed.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn completion_wakes_the_waiter_once_per_signal() {
        let c = Completion::for_current_thread();
        for _ in 0..100 {
            let signal = Arc::clone(&c);
            let t = std::thread::spawn(move || signal.complete());
            c.wait();
            t.join().unwrap();
        }
        // Re-armed: the flag is clear after each wait.
        assert!(!c.done.load(Ordering::Acquire));
    }
}

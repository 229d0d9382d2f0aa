//! podq: the Linux kernel's locality-aware unbound workqueues, in user space.
//!
//! A work item queued on a CPU runs on the worker pool serving that CPU's *pod*; the
//! workqueue's affinity [`Scope`] decides how big pods are, `strict` whether workers stay
//! inside them. Attributes change live: new items go to the new pools at once, queued
//! and running ones finish on the old pools, and [`Workqueue::flush`] covers both.
//!
//! ```
//! use podq::{Scope, Work, Workqueue};
//!
//! let wq = Workqueue::builder("example").scope(Scope::Cache).build()?;
//! let work = Work::new(|| println!("hello from a pool"));
//! wq.queue(&work);
//! let answer = wq.spawn(|| 40 + 2);
//! assert_eq!(answer.join().unwrap(), 42);
//! wq.flush();
//! # Ok::<(), podq::Error>(())
//! ```
//!
//! # Departures from the kernel
//! - Pods are built over the usable CPUs (see `podq_topology::Topology`), not the
//!   possible ones.
//! - A cpumask with no usable CPU is refused ([`Error::NoUsableCpu`]) instead of
//!   silently widening to the global mask; `max_active` outside `1..=2048`, and
//!   `min_active` above `max_active`, are refused instead of clamped.
//! - Pools run at most one worker per pod CPU at a time and grow beyond that only for
//!   [`blocking`] sections and for items that run past the CPU-intensive threshold
//!   (10 ms, [`watchdog::set_cpu_intensive_threshold`], at most one more per pod CPU;
//!   the kernel applies that rule to its per-CPU pools only, without a bound), up to
//!   [`policy::POOL_MAX_WORKERS`] threads: user space cannot see a worker sleep, nor
//!   one preempted on its CPU, which still counts until its item has run that long.
//!   `podq sim` applies the same rules (`--cpu-intensive`), and with `--worker-cap
//!   unlimited` simulates the kernel's pools beside podq's (README, "What it predicts
//!   for the NFS experiments").
//! - Rescuers are opt-in per workqueue ([`WorkqueueBuilder::rescuer`]) and answer only
//!   failed thread creation (there is no memory-reclaim context in user space); the
//!   cooldown retry runs on one process-wide manager thread, not on a pool's worker.
//! - Non-strict repatriation: the woken worker narrows its own affinity to the pod and
//!   widens it again (the kernel sets `wake_cpu` instead); it is counted the same way.
//! - Flush uses two colours with one flusher at a time instead of 16 colours and a
//!   flusher queue, counted on one atomic word per pwq (see `workqueue/README.md`).
//! - A worker accounts finished items in batches (up to 32, settled at once when a
//!   flusher waits or the worker blocks), and activation moves waiting items in turns
//!   of up to [`policy::ACTIVATION_TURN`] per pwq instead of one per completion; an
//!   item that waits for another item of its workqueue must wrap the wait in
//!   [`blocking`] (see `workqueue/README.md`, "Completion").
//! - Cancelled instances are not unlinked from queues; they carry a sequence number and
//!   are dropped when reached (see `work/README.md`).
//! - Dropping a workqueue cancels (and counts) delayed items still on the timer; the
//!   kernel leaves them to the caller.
//! - The stall watchdog ([`watchdog`]) samples each worker's run counter instead of
//!   stamping a time per item, and also applies the CPU-intensive rule, from its own
//!   thread rather than the scheduler tick; its long-item count only reports;
//!   `panic_on_stall` aborts the process.
//! - [`Work::enable`] on an item that is not disabled, and [`Work::disable`] past 65535
//!   levels, are errors (the kernel warns).
//! - [`Workqueue::freeze`] freezes one workqueue (the kernel freezes every freezable
//!   one at once, for suspend) by marking its pwqs frozen instead of setting their
//!   `max_active` to 0; dropping or shutting down a frozen workqueue thaws it first.
//! - [`Scope::Auto`] has no kernel counterpart: the workqueue chooses its scope from
//!   its statistics (see [`auto`]).
//!
//! # Shared state: legends and the lock graph
//!
//! Each field of shared state begins its doc with a rule letter from its module's
//! legend. A letter means one thing in the whole crate:
//!
//! | letter | rule | where |
//! |---|---|---|
//! | I | set at init, read-only after | everywhere |
//! | A | atomic; the ordering and what it pairs with are named at the field or use | everywhere |
//! | AW, AL, AS | atomics written by one worker / under the lock they count / by the holder of a thread lease (`lease.rs`) | `stats`, `published` |
//! | W | thread-private (a thread-local) | `context`, `current`, `busy`, `pool`, `workqueue`, `cpu` |
//! | M | `WqShared::config` | `workqueue` |
//! | T | a read section of `WqShared::table` (a `Published`: writers wait the sections out) | `workqueue` |
//! | S | `WqShared::pwqs` | `workqueue` |
//! | P | `Pwq::state` (the pwq lock) | `workqueue`, `workqueue::flush` |
//! | N | `NodeActive::pending` | `workqueue` |
//! | F | `FlushDomain::lock` | `workqueue::flush` |
//! | G | a process-wide registry's own mutex (live workqueues, pools by key, topology ids, worker beats, pool workers and the dozing watchdog for the CPU-intensive rule) | `workqueue`, `busy`, `pool::intensive` |
//! | WD | the watchdog's own mutexes (`WqWatch::found`, its remembered state) | `watchdog` |
//! | BL | a worker beat's label `Beat::label` | `busy` |
//! | L | `PoolCore::state` (the pool lock) | `pool` |
//! | K | `Worklist::spill` (the worklist lock; a multi-CPU pool's ring takes none) | `pool::worklist` |
//! | J | `PoolCore::joins` | `pool` |
//! | R | `PoolCounters::workers` | `stats` |
//! | B | the manager's `MANAGER.state` | `pool::rescue` |
//! | U | the rescuer table `RESCUERS` | `pool::rescue` |
//! | Q | `Rescuer::maydays` | `pool::rescue` |
//! | X | the timer's `Timer::state` | `delayed` |
//! | H | a work item's handoff slot | `work::state` |
//! | C | a work item's waiters (with its condvar) | `work::state` |
//! | D | a spawned item's closure, owned by the holder of its queue entry | `join` |
//! | V | a spawned item's slot (its waiter, then its result), under its `WAITER_LOCK` bit until `DONE`, then the handle's | `join` |
//! | Z | `FlushDomain::serial` (one flusher at a time) | `workqueue::flush` |
//! | E | a hook's own lock (the process-wide panic and error hooks) | `fault`, crate root |
//! | Y | the `auto` sampler's `SAMPLER.state` | `auto` |
//!
//! The lock graph: a lock may be taken while holding only locks to its left on a
//! path (an arrow means "is held while taking"); locks not on a path are leaves, held
//! alone:
//!
//! ```text
//! set_default_scope/refresh serialisers ─→ M config ─→ T table ─→ S pwqs ─→ P pwq ─→ N pending ─→ L pool ─→ K worklist
//!                                              │         │           ↑
//!                                              │         │  Z flush serial ─→ F flush
//!                                              │         └─→ F flush (a queue call undoing its count wakes flushers)
//!                                              ├─→ G pools by key
//!                                              └─→ cpu::REAL (usable CPUs)
//! L pool ─→ B manager
//! U rescuers ─→ Q maydays
//! leaves: G live workqueues, G topology ids, G worker beats, G pool workers, G the
//!         dozing watchdog, BL beat labels, WD watchdog
//!         findings and state, J joins, R stats workers, X timer,
//!         H handoff, C waiters, V a spawned item's slot, E hooks, Y auto sampler,
//!         `DelayedWork` target,
//!         the control server's registries (released before calling the runtime)
//! ```
//!
//! Rules that keep it acyclic: a pool's last handle (whose drop takes its lock and
//! joins workers) is dropped only with no lock held (`Released`, teardown); the manager
//! thread never takes a pool lock while holding its own; hooks and timers run with
//! no podq lock held.

mod attrs;
pub mod auto;
mod busy;
mod context;
#[cfg(feature = "control")]
pub mod control;
mod cpu;
mod current;
mod delayed;
mod entry;
mod error;
pub mod fault;
mod fence;
mod global;
mod join;
mod lease;
mod once;
mod pool;
mod published;
pub mod stats;
mod sync;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
mod threads;
mod trace;
pub mod watchdog;
mod work;
mod workqueue;

/// The README's library quick-start, run as doc tests so that it stays true (it
/// starts the control server, so only with the `control` feature).
#[cfg(all(doctest, feature = "control"))]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// Every decision of the runtime as a pure function (the `podq-policy` crate), shared
/// with the simulator.
pub use podq_policy as policy;

/// The topology layer (everything of `podq_topology`), plus [`topology::refresh`], which
/// re-reads the usable CPUs and re-pods live workqueues.
pub mod topology {
    pub use crate::workqueue::refresh::{refresh, NotRepodded, NotRepoddedReason, Refreshed};
    pub use podq_topology::*;
}

use crate::sync::unmodelled::RwLock;
use std::sync::Arc;

pub use attrs::Attrs;
pub use cpu::{current_cpu, pin_thread_to, set_thread_cpu};
pub use current::{current, Current};
pub use delayed::DelayedWork;
pub use error::{Error, SpawnError};
pub use fault::{clear_error_hook, set_error_hook, ErrorReport};
pub use global::{default_workqueue, execute, queue, spawn, spawn_named, DEFAULT_WORKQUEUE_NAME};
pub use join::{JoinHandle, Panicked};
pub use podq_topology::{CpuSet, Scope, Topology};
pub use pool::blocking;
pub use stats::WorkqueueStats;
pub use threads::WorkerThread;
pub use work::Work;
pub use workqueue::{
    default_scope, set_default_scope, CpuPool, CpuRun, NodeActiveDump, PodRun, PoolDump, PwqDump,
    RunningItem, Shutdown, Unfinished, Workqueue, WorkqueueBuilder, WorkqueueDump,
};
pub use workqueue::{worker_pools, WorkerPool};

/// What a panic hook is told about a panicking work item.
#[derive(Clone, Copy, Debug)]
pub struct PanicReport<'a> {
    /// The workqueue the item ran on.
    pub workqueue: &'a str,
    /// The panic message.
    pub message: &'a str,
}

/// A panic hook, shared by the workqueues it was given to.
pub(crate) type PanicHook = Arc<dyn Fn(&PanicReport<'_>) + Send + Sync>;

/// E: the process-wide panic hook.
static PANIC_HOOK: RwLock<Option<PanicHook>> = RwLock::new(None);

/// Sets the process-wide hook called (on the worker, after the item unwound) for every
/// panicking work item of a workqueue without its own
/// ([`WorkqueueBuilder::panic_hook`]); replaces the previous one. Panics are always caught and
/// counted, with or without a hook; the worker and its pool carry on.
pub fn set_panic_hook(hook: impl Fn(&PanicReport<'_>) + Send + Sync + 'static) {
    *PANIC_HOOK
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(hook));
}

/// Removes the panic hook.
pub fn clear_panic_hook() {
    *PANIC_HOOK
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
}

/// Calls `own` if given, else the process-wide hook.
pub(crate) fn report_panic(own: Option<&PanicHook>, workqueue: &str, message: &str) {
    let hook = match own {
        Some(hook) => Some(Arc::clone(hook)),
        None => PANIC_HOOK
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone(),
    };
    if let Some(hook) = hook {
        // A panicking hook must not take the worker down with it.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            hook(&PanicReport { workqueue, message })
        }));
    }
}

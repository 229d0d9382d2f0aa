//! Workqueues, their pool_workqueues (pwqs), and the queue path: `max_active`
//! admission, activation, flush and drain. Protocols: `workqueue/README.md`. Beside it:
//! `builder.rs` (building one), `registry.rs` (the process-wide registries and the
//! default scope), `apply.rs` (attribute changes), `refresh.rs` (re-reading the usable
//! CPUs), `teardown.rs` (dropping the last handle), `flush.rs` (flush colours and
//! in-flight counts), `completions.rs` (a worker's batched completions), `control.rs`
//! (the control plane's view), `freeze.rs` (freezing and thawing).
//!
//! Legend: I set at init; A atomic (ordering and pair named at each use); M guarded by
//! `WqShared::config` (serialises attribute changes); T read in a section of
//! `WqShared::table` (a `Published`, replaced whole under M); S guarded by
//! `WqShared::pwqs`; P guarded by `Pwq::state`; N guarded by `NodeActive::pending`; G
//! guarded by the registry's own mutex; W thread-private.
//!
//! Lock order (the crate docs give the whole graph): `config` → `table` → `pwqs` →
//! `Pwq::state` → `NodeActive::pending` → pool lock; `config` → the pools registry.
//! A flusher holds `FlushDomain::serial` and `FlushDomain::lock` while it reads the
//! pwqs' in-flight counts (atomics: no pwq lock).

mod apply;
mod broadcast;
mod builder;
mod completions;
mod congested;
#[cfg(feature = "control")]
mod control;
mod dump;
pub(crate) mod flush;
mod freeze;
mod min_active;
mod named;
mod node;
mod pools;
#[cfg(feature = "tracing")]
mod reentry;
pub(crate) mod refresh;
mod registry;
mod shutdown;
mod teardown;
pub(crate) mod watch;

pub use broadcast::{CpuRun, PodRun};
pub use builder::WorkqueueBuilder;
pub(crate) use completions::Completions;
pub use dump::{CpuPool, NodeActiveDump, PoolDump, PwqDump, RunningItem, WorkqueueDump};
pub use pools::{worker_pools, WorkerPool};
pub(crate) use registry::live_workqueues;
pub use registry::{default_scope, set_default_scope};
pub use shutdown::{Shutdown, Unfinished};

use std::cell::Cell;
use std::collections::VecDeque;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Weak;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::published::Published;
use podq_topology::{CpuSet, Scope, Topology};

use crate::auto::{self, AutoRun};
use crate::cpu::{self, CpuMap};
use crate::delayed::{self, DelayedWork};
use crate::join::{self, JoinHandle};
use crate::once;
use crate::policy::{self, Activation, Admission, PwqChoice, PwqQueue};
use crate::pool::{self, Pool, PoolCore};
use crate::stats::{Item, ItemCounters, PoolStats, WorkqueueStats};
use crate::sync::{
    AtomicBool, AtomicUsize, Mutex,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::Arc;

use crate::entry::{Entry, EntryMeta, Task, Waiting};
use crate::error::SpawnError;
use crate::fault::ErrorHook;
use crate::sync::lock;
use crate::work::{Work, WorkInner};
use crate::{Attrs, Error, PanicHook};
use flush::{Colour, FlushDomain, InFlight};
use node::NodeActive;

/// Inactive-list capacity a pwq keeps once its list empties (32 KiB of entries); a
/// flood's larger list is freed.
const KEPT_INACTIVE: usize = 1024;

thread_local! {
    /// W: the last CPU chosen round-robin by this thread (`wq_rr_cpu_last`).
    static RR_LAST: Cell<Option<usize>> = const { Cell::new(None) };
}

/// A workqueue: the object work is queued on. Cheap to clone (a handle); when the last
/// handle is dropped the workqueue is drained, its delayed items still on the timer are
/// cancelled (and counted as cancelled), and the workers of pools no other workqueue
/// uses are stopped and joined.
///
/// # Shutdown
/// Dropping the last handle (`destroy_workqueue`):
/// 1. Queued items, on worklists or waiting for an active slot, all run (a frozen
///    workqueue is thawed first: [`Workqueue::freeze`]): the drop drains the
///    workqueue, accepting only chained queueing from its own items; timers that fire
///    meanwhile queue their items, which run too.
/// 2. Running items are waited for.
/// 3. Delayed items still on the timer are cancelled: they are idle again (free to be
///    queued elsewhere) and never fire. The kernel leaves them to the caller.
/// 4. Pools no other workqueue uses stop; their workers exit and are joined.
///
/// Dropped inside one of its own items (an item held the last handle), the workqueue
/// cannot wait for itself: the drop returns at once, and the items still queued run
/// afterwards, after which the pools stop and their workers exit on their own.
///
/// The drop waits as long as the items take, as `destroy_workqueue` does: if no worker
/// thread can be created (a thread limit) and the workqueue has no rescuer
/// ([`WorkqueueBuilder::rescuer`]), its queued items wait for the pool's retries, and
/// so does the drop. [`Workqueue::shutdown`] bounds the wait and says what is left.
///
/// Process exit never waits for podq: workers and the timer are ordinary threads that
/// exit with the process. Items still queued, running or on the timer at that moment
/// do not run; drop (or flush) workqueues before leaving `main` to run them.
///
/// ```
/// use podq::{Scope, Workqueue};
///
/// let wq = Workqueue::builder("doc-wq").scope(Scope::Cpu).max_active(4).build()?;
/// let handle = wq.spawn(|| 6 * 7);
/// assert_eq!(handle.join().unwrap(), 42);
/// wq.set_scope(Scope::System)?;          // live: new items use the new pools
/// wq.flush();
/// # Ok::<(), podq::Error>(())
/// ```
#[derive(Clone)]
pub struct Workqueue {
    handle: Arc<WqHandle>,
}

/// The user-held part; its drop tears the workqueue down.
struct WqHandle {
    /// I: the shared part (also held by pwqs, timers and stats).
    shared: Arc<WqShared>,
}

/// Requested attributes and what they resolved to (all M).
struct Config {
    attrs: Attrs,
    effective_scope: Scope,
    /// Pwqs that left the table, with their pools, until they are gone: teardown waits
    /// for them and joins their pools' workers.
    retired: Vec<(Weak<Pwq>, Arc<PoolCore>)>,
    /// The controller choosing the scope while the requested one resolves to `auto`.
    auto: Option<AutoRun>,
}

/// The CPU → pwq table, swapped whole on an attribute change.
struct Table {
    /// Pwq of each CPU in the topology's numbering (`None`: not usable).
    cpu_pwq: Vec<Option<Arc<Pwq>>>,
    /// The pwq spanning the whole effective cpumask (`dfl_pwq`); `None` once destroyed.
    dfl: Option<Arc<Pwq>>,
    /// The effective cpumask (where `queue()` may select CPUs).
    unbound: CpuSet,
}

/// What an attribute change released (old table, retired pwqs), dropped unlocked.
struct Released {
    _table: Arc<Table>,
    _pwqs: Vec<Arc<Pwq>>,
}

/// Shared state of a workqueue.
pub(crate) struct WqShared {
    /// I: process-unique id (never 0).
    pub(crate) id: u64,
    /// I: name.
    pub(crate) name: String,
    /// I: whether ordered.
    ordered: bool,
    /// I: the topology CPU numbers refer to.
    topology: Arc<Topology>,
    /// I: identity of the topology for pool sharing.
    topology_id: u64,
    /// I: virtual → real CPUs.
    cpu_map: CpuMap,
    /// I: built on the live machine: its usable CPUs follow `topology::refresh`.
    live: bool,
    /// I: idle timeout of its pools' workers.
    idle_timeout: Duration,
    /// I: how its `auto` controller runs.
    auto_settings: auto::Settings,
    /// I: node id → index in `nodes` (the last index is the fallback counter).
    node_index: Vec<usize>,
    /// M: requested attributes; held across a whole change.
    config: Mutex<Config>,
    /// T: the CPU → pwq table.
    table: Published<Table>,
    /// S: every live pwq, oldest first (current and retiring ones: flush walks them).
    pwqs: Mutex<Vec<Arc<Pwq>>>,
    /// I (contents A/N): per-node active counters, fallback last.
    nodes: Vec<NodeActive<Arc<Pwq>>>,
    /// A/F/Z: flush generation and colours.
    flush: FlushDomain,
    /// A: drain calls in progress (`SeqCst`: pairs with the load in `check_accepting`;
    /// with the pwq lock both take, either a queue call sees the drain or the drain
    /// sees the call's item in flight).
    draining: AtomicUsize,
    /// A: set once torn down (`SeqCst`: pairs with the loads in `check_accepting` and
    /// `enqueue_any`, so no queue call or timer counts an item after teardown saw the
    /// pwqs empty).
    destroyed: AtomicBool,
    /// A: item counters of this workqueue.
    pub(crate) counters: ItemCounters,
    /// I: its own panic hook (`None`: the process-wide one).
    panic_hook: Option<PanicHook>,
    /// I: its own error hook (`None`: the process-wide one).
    pub(crate) error_hook: Option<ErrorHook>,
    /// I: how its pools and rescuer make threads.
    pub(crate) threads: Arc<crate::threads::ThreadOptions>,
    /// I (findings WD): its watchdog thresholds and what the watchdog found.
    pub(crate) watch: crate::watchdog::WqWatch,
    /// A (stored under M): whether it is frozen (`freeze.rs`).
    freeze: freeze::Freeze,
}

/// A pool_workqueue: one workqueue's link to one pool. What every queue call and
/// completion reads (the `I` fields and `gate`) shares no cache line with what they
/// write (`in_flight`) or with the pwq lock that a flood takes: a queue call would
/// otherwise miss on the pwq's first line whenever another CPU had just counted an
/// item in or out.
pub(crate) struct Pwq {
    /// I: the workqueue.
    pub(crate) wq: Arc<WqShared>,
    /// I: the pool.
    pub(crate) pool: Arc<Pool>,
    /// I: index of its node counter in `wq.nodes`.
    node: usize,
    /// A: items in flight (inactive, active, running) by flush colour, whether it is
    /// in the current table, and whether it retired (then queue calls that find it
    /// retry); see `flush.rs`.
    in_flight: CachePadded<InFlight>,
    /// A: new items must take the pwq lock: it has inactive items, is plugged, is
    /// frozen or is on its node's pending list. Stored (`SeqCst`) under the pwq lock
    /// when one of those changes; a queuer that loads it clear skips the lock and only
    /// tries a node slot — it cannot overtake an item whose queue call returned before
    /// its own began, since that item's store of the gate happened before the load.
    gate: AtomicBool,
    /// P: the pwq lock.
    state: CachePadded<Mutex<PwqState>>,
}

/// A queue entry's reference to its pwq (the kernel's `get_pwq`), held by the item's
/// count in the pwq's in-flight word rather than by the pwq's `Arc`, so that queueing
/// and completing an item touch no reference count: a pwq with items in flight cannot
/// retire, and until it retires `WqShared::pwqs` holds an `Arc` to it. The reference
/// is valid until the item is uncounted (`Pwq::complete`), and not after.
pub(crate) struct PwqRef(NonNull<Pwq>);

// SAFETY: a `PwqRef` is a shared reference to a `Pwq`, which is `Send` and `Sync`; its
// validity does not depend on the thread holding it.
unsafe impl Send for PwqRef {}
// SAFETY: as above; it only gives out `&Pwq`.
unsafe impl Sync for PwqRef {}

impl PwqRef {
    /// A reference for an item just counted in `pwq`'s in-flight word.
    fn counted(pwq: &Pwq) -> PwqRef {
        PwqRef(NonNull::from(pwq))
    }

    /// Whether both refer to the same pwq.
    pub(crate) fn same(&self, other: &PwqRef) -> bool {
        self.0 == other.0
    }
}

impl std::ops::Deref for PwqRef {
    type Target = Pwq;

    fn deref(&self) -> &Pwq {
        // SAFETY: the item this reference was made for is counted in the pwq's
        // in-flight word until `Pwq::complete` consumes the reference; meanwhile the
        // pwq cannot retire (retirement needs an empty word) and `WqShared::pwqs`
        // holds an `Arc` to it.
        unsafe { self.0.as_ref() }
    }
}

/// Everything a pwq's lock guards (all P).
struct PwqState {
    /// Items waiting for an active slot, FIFO.
    inactive: VecDeque<Waiting>,
    /// Where the pwq stands towards activation.
    hold: Hold,
    /// The workqueue is frozen: nothing activates until it thaws (`freeze.rs`); on
    /// top of any `hold`.
    frozen: bool,
}

/// Where a pwq stands towards activation (besides freezing, which holds any of these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    /// Its items may activate whenever a node slot is free: it has no inactive items,
    /// or they wait only because the workqueue is frozen.
    Open,
    /// On its node's pending list: its inactive items wait for a slot.
    Pending,
    /// Ordered workqueues: may not activate until older pwqs are gone (`unplug_oldest`).
    Plugged,
}

impl fmt::Debug for Workqueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workqueue")
            .field("name", &self.name())
            .field("attrs", &self.attrs())
            .finish()
    }
}

/// What a panicking spawn or execute returns: its `try_` form's result, or its refusal
/// (the workqueue drains and the caller is not one of its items) as a panic.
fn accepted<T, F>(result: Result<T, SpawnError<F>>) -> T {
    match result {
        Ok(made) => made,
        Err(e) => panic!("{}", e.error()),
    }
}

impl Workqueue {
    fn shared(&self) -> &Arc<WqShared> {
        &self.handle.shared
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.shared().name
    }

    /// The requested attributes.
    pub fn attrs(&self) -> Attrs {
        lock(&self.shared().config).attrs.clone()
    }

    /// The concrete scope in use: `Default` resolved, and for `auto` the scope its
    /// controller chose.
    pub fn effective_scope(&self) -> Scope {
        lock(&self.shared().config).effective_scope
    }

    /// The topology CPU numbers refer to.
    pub fn topology(&self) -> &Topology {
        &self.shared().topology
    }

    /// Queues `work` on the pod of the calling CPU ([`crate::current_cpu`]), or
    /// round-robin when that CPU is outside the cpumask. Returns false if it was already
    /// pending, is being cancelled, or the workqueue is draining and the caller is not
    /// one of its items (see [`Workqueue::try_queue`] for the reason).
    #[inline]
    pub fn queue(&self, work: &Work) -> bool {
        // A pending item is coalesced whatever else holds: the same `SeqCst` load the
        // full call would make first, without the call.
        if work.is_pending() {
            return false;
        }
        self.try_queue(work).unwrap_or(false)
    }

    /// As [`Workqueue::queue`], with a draining workqueue reported as an error.
    pub fn try_queue(&self, work: &Work) -> Result<bool, Error> {
        self.shared().queue_work(work, None)
    }

    /// Queues `work` on the pod of `cpu` (it only picks the pod; it does not pin). A CPU
    /// that is not usable in the topology acts as [`Workqueue::queue`].
    ///
    /// ```
    /// use podq::{Scope, Topology, Work, Workqueue};
    ///
    /// // A fake two-socket machine: its CPUs 0-15 are mapped onto the real ones.
    /// let wq = Workqueue::builder("doc-queue-on")
    ///     .topology(Topology::synthetic("2s4c2t")?)
    ///     .scope(Scope::Numa)
    ///     .build()?;
    /// let work = Work::new(|| {});
    /// assert!(wq.queue_on(12, &work)); // runs on node 1's pool (CPUs 4-7, 12-15)
    /// work.flush();
    /// assert!(wq.queue_node(0, &work)); // a CPU of node 0
    /// wq.flush();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn queue_on(&self, cpu: usize, work: &Work) -> bool {
        self.shared().queue_work(work, Some(cpu)).unwrap_or(false)
    }

    /// Queues `work` on a CPU of NUMA `node`: the calling CPU if it is on the node,
    /// else the node's first CPU; an unknown node acts as [`Workqueue::queue`].
    pub fn queue_node(&self, node: usize, work: &Work) -> bool {
        self.shared()
            .queue_work(work, self.node_cpu(node))
            .unwrap_or(false)
    }

    /// The CPU a call for NUMA `node` goes to (`select_numa_node_cpu`): the calling
    /// CPU if it is on the node, else the node's first CPU; `None` (the calling CPU's
    /// pod) for a node the topology does not have.
    fn node_cpu(&self, node: usize) -> Option<usize> {
        let topo = &self.shared().topology;
        let local = cpu::current_cpu();
        policy::select_node_cpu(local, topo.node_of(local), node, &topo.node_cpus(node))
    }

    /// Runs `f` once on this workqueue and returns a handle to its result.
    ///
    /// # Panics
    /// If the workqueue is draining and the caller is not one of its items; use
    /// [`Workqueue::try_spawn`] to get an error instead.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> JoinHandle<T> {
        accepted(self.try_spawn(f))
    }

    /// As [`Workqueue::spawn`], with a draining workqueue reported as an error that
    /// gives the closure back.
    ///
    /// ```
    /// let wq = podq::Workqueue::builder("doc-try-spawn").build()?;
    /// let answer = wq.try_spawn(|| 6 * 7).map_err(|e| e.into_parts().0)?;
    /// assert_eq!(answer.join().unwrap(), 42);
    /// # Ok::<(), podq::Error>(())
    /// ```
    pub fn try_spawn<T, F>(&self, f: F) -> Result<JoinHandle<T>, SpawnError<F>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        self.try_spawn_labelled(None, f)
    }

    /// [`Workqueue::try_spawn`] with the item's label, if any.
    fn try_spawn_labelled<T, F>(
        &self,
        label: Option<Arc<str>>,
        f: F,
    ) -> Result<JoinHandle<T>, SpawnError<F>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        self.try_queue_once(None, f, |f| join::pair_named(label, f))
    }

    /// As [`Workqueue::spawn`], on the pod of `cpu` as [`Workqueue::queue_on`] picks
    /// it: the kernel's `queue_work_on` for a closure. It picks the pod, it does not
    /// pin; a CPU that is not usable in the topology acts as `spawn`.
    ///
    /// ```
    /// use podq::{Scope, Topology, Workqueue};
    ///
    /// // A fake two-socket machine: its CPUs 0-15 are mapped onto the real ones.
    /// let wq = Workqueue::builder("doc-spawn-on")
    ///     .topology(Topology::synthetic("2s4c2t")?)
    ///     .scope(Scope::Numa)
    ///     .build()?;
    /// // Runs on node 1's pool (CPUs 4-7, 12-15), whatever CPU the caller is on.
    /// let ran_on = wq.spawn_on(12, podq::current_cpu).join()?;
    /// assert_eq!(wq.topology().node_of(ran_on), Some(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Panics
    /// If the workqueue is draining and the caller is not one of its items; use
    /// [`Workqueue::try_spawn_on`] to get an error instead.
    pub fn spawn_on<T: Send + 'static>(
        &self,
        cpu: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> JoinHandle<T> {
        accepted(self.try_spawn_on(cpu, f))
    }

    /// As [`Workqueue::spawn_on`], with a draining workqueue reported as an error that
    /// gives the closure back.
    pub fn try_spawn_on<T, F>(&self, cpu: usize, f: F) -> Result<JoinHandle<T>, SpawnError<F>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        self.try_queue_once(Some(cpu), f, |f| join::pair_named(None, f))
    }

    /// As [`Workqueue::spawn`], on a CPU of NUMA `node` as [`Workqueue::queue_node`]
    /// picks it: the calling CPU if it is on the node, else the node's first CPU. An
    /// unknown node acts as `spawn`.
    ///
    /// ```
    /// use podq::{Scope, Topology, Workqueue};
    ///
    /// // A fake two-socket machine: its CPUs 0-15 are mapped onto the real ones.
    /// let wq = Workqueue::builder("doc-spawn-node")
    ///     .topology(Topology::synthetic("2s4c2t")?)
    ///     .scope(Scope::Numa)
    ///     .build()?;
    /// let ran_on = wq.spawn_node(1, podq::current_cpu).join()?;
    /// assert_eq!(wq.topology().node_of(ran_on), Some(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Panics
    /// If the workqueue is draining and the caller is not one of its items; use
    /// [`Workqueue::try_spawn_node`] to get an error instead.
    pub fn spawn_node<T: Send + 'static>(
        &self,
        node: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> JoinHandle<T> {
        accepted(self.try_spawn_node(node, f))
    }

    /// As [`Workqueue::spawn_node`], with a draining workqueue reported as an error
    /// that gives the closure back.
    pub fn try_spawn_node<T, F>(&self, node: usize, f: F) -> Result<JoinHandle<T>, SpawnError<F>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        self.try_queue_once(self.node_cpu(node), f, |f| join::pair_named(None, f))
    }

    /// Queues the one-shot task `make` builds from `f` (with what it returns beside
    /// the task), on the pod of `cpu` if given, if the workqueue accepts it, else gives
    /// `f` back. Past the check the
    /// call counts as made before any drain that began since: it is queued and a drain
    /// waits for it. Only a destroyed workqueue refuses it then, which cannot happen
    /// while `self` lives; were it refused, the task would be dropped without running
    /// (a spawned item's handle reports that).
    fn try_queue_once<F, R>(
        &self,
        cpu: Option<usize>,
        f: F,
        make: impl FnOnce(F) -> (R, once::OnceTask),
    ) -> Result<R, SpawnError<F>> {
        let wq = self.shared();
        if let Err(e) = wq.check_accepting() {
            return Err(SpawnError::new(e, f));
        }
        let (made, task) = make(f);
        let _ = wq.enqueue_any(Task::Once(task), cpu, true);
        Ok(made)
    }

    /// Queues `f` to run once, with no handle: fire-and-forget, as `rayon::spawn`. A
    /// closure of up to two words (say an `Arc` and an index), aligned to at most one,
    /// travels in the queue entry itself and costs no allocation; a larger one costs
    /// one, its own (builds with the `tracing` feature always allocate: the events
    /// name an item by its block). Beyond the queue call it costs no locked
    /// instruction (a spawned item's handle costs one to drop). A panic in `f` goes to
    /// the panic hook, as for a spawned item whose handle was dropped. Panics if the
    /// workqueue is draining and the caller is not one of its items (see
    /// [`Workqueue::try_execute`]).
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::Arc;
    ///
    /// let wq = podq::Workqueue::builder("doc-execute").build()?;
    /// let done = Arc::new(AtomicU32::new(0));
    /// for _ in 0..4 {
    ///     let done = Arc::clone(&done);
    ///     wq.execute(move || {
    ///         done.fetch_add(1, Ordering::Relaxed);
    ///     });
    /// }
    /// wq.flush();
    /// assert_eq!(done.load(Ordering::Relaxed), 4);
    /// # Ok::<(), podq::Error>(())
    /// ```
    pub fn execute(&self, f: impl FnOnce() + Send + 'static) {
        accepted(self.try_execute(f))
    }

    /// As [`Workqueue::execute`], with a draining workqueue reported as an error that
    /// gives the closure back.
    pub fn try_execute<F>(&self, f: F) -> Result<(), SpawnError<F>>
    where
        F: FnOnce() + Send + 'static,
    {
        self.try_queue_once(None, f, |f| ((), once::detached(f)))
    }

    /// As [`Workqueue::execute`], on the pod of `cpu` (as [`Workqueue::spawn_on`]).
    /// Panics if the workqueue is draining and the caller is not one of its items (see
    /// [`Workqueue::try_execute_on`]).
    pub fn execute_on(&self, cpu: usize, f: impl FnOnce() + Send + 'static) {
        accepted(self.try_execute_on(cpu, f))
    }

    /// As [`Workqueue::execute_on`], with a draining workqueue reported as an error
    /// that gives the closure back.
    pub fn try_execute_on<F>(&self, cpu: usize, f: F) -> Result<(), SpawnError<F>>
    where
        F: FnOnce() + Send + 'static,
    {
        self.try_queue_once(Some(cpu), f, |f| ((), once::detached(f)))
    }

    /// As [`Workqueue::execute`], on a CPU of NUMA `node` (as [`Workqueue::spawn_node`]).
    /// Panics if the workqueue is draining and the caller is not one of its items (see
    /// [`Workqueue::try_execute_node`]).
    pub fn execute_node(&self, node: usize, f: impl FnOnce() + Send + 'static) {
        accepted(self.try_execute_node(node, f))
    }

    /// As [`Workqueue::execute_node`], with a draining workqueue reported as an error
    /// that gives the closure back.
    pub fn try_execute_node<F>(&self, node: usize, f: F) -> Result<(), SpawnError<F>>
    where
        F: FnOnce() + Send + 'static,
    {
        self.try_queue_once(self.node_cpu(node), f, |f| ((), once::detached(f)))
    }

    /// Arms `dwork` to be queued after `delay` (at once for zero). Returns false if it
    /// was already pending, or the workqueue is draining and the caller is not one of
    /// its items (see [`Workqueue::try_queue_delayed`] for the reason). When the timer
    /// fires, the pod is chosen from the CPU the timer thread runs on, as the kernel
    /// does; an item armed before a drain began is queued when it fires, drain or not.
    pub fn queue_delayed(&self, dwork: &DelayedWork, delay: Duration) -> bool {
        self.try_queue_delayed(dwork, delay).unwrap_or(false)
    }

    /// As [`Workqueue::queue_delayed`], with a draining workqueue reported as an error
    /// ([`Error::Draining`]).
    pub fn try_queue_delayed(&self, dwork: &DelayedWork, delay: Duration) -> Result<bool, Error> {
        delayed::queue(self.shared(), dwork, delay, None, false)
    }

    /// As [`Workqueue::queue_delayed`], queueing on the pod of `cpu` when it fires.
    pub fn queue_delayed_on(&self, cpu: usize, dwork: &DelayedWork, delay: Duration) -> bool {
        self.try_queue_delayed_on(cpu, dwork, delay)
            .unwrap_or(false)
    }

    /// As [`Workqueue::queue_delayed_on`], with a draining workqueue reported as an error.
    pub fn try_queue_delayed_on(
        &self,
        cpu: usize,
        dwork: &DelayedWork,
        delay: Duration,
    ) -> Result<bool, Error> {
        delayed::queue(self.shared(), dwork, delay, Some(cpu), false)
    }

    /// `mod_delayed_work`: (re)arms `dwork` with `delay` whatever its state; a pending
    /// instance is replaced. Returns whether one was pending; false also when the
    /// workqueue is draining and the caller is not one of its items (nothing changes
    /// then; see [`Workqueue::try_mod_delayed`]).
    pub fn mod_delayed(&self, dwork: &DelayedWork, delay: Duration) -> bool {
        self.try_mod_delayed(dwork, delay).unwrap_or(false)
    }

    /// As [`Workqueue::mod_delayed`], with a draining workqueue reported as an error.
    pub fn try_mod_delayed(&self, dwork: &DelayedWork, delay: Duration) -> Result<bool, Error> {
        delayed::queue(self.shared(), dwork, delay, None, true)
    }

    /// Waits until every item queued before the call has finished, on current and
    /// retiring pools alike. Items queued later do not hold it up.
    /// Called from one of this workqueue's own items it waits for that item too, and
    /// so never returns (the kernel's lockdep warns about the same mistake).
    pub fn flush(&self) {
        pool::blocking(|| self.shared().flush());
    }

    /// Waits until the workqueue is empty. Meanwhile only its own items may queue on it
    /// (chained work); other queue calls are refused ([`Error::Draining`]).
    pub fn drain(&self) {
        pool::blocking(|| self.shared().drain());
    }

    /// Changes the affinity scope.
    pub fn set_scope(&self, scope: Scope) -> Result<(), Error> {
        self.shared().change(|a| a.scope = scope)
    }

    /// Changes strictness.
    pub fn set_strict(&self, strict: bool) -> Result<(), Error> {
        self.shared().change(|a| a.strict = strict)
    }

    /// Changes the cpumask; one with no usable CPU is refused.
    pub fn set_cpumask(&self, mask: CpuSet) -> Result<(), Error> {
        self.shared().change(|a| a.cpumask = mask)
    }

    /// Changes the nice value of the workers (a new set of pools).
    pub fn set_nice(&self, nice: i32) -> Result<(), Error> {
        self.shared().change(|a| a.nice = nice)
    }

    /// Changes `max_active` (enforced per node: see [`WorkqueueBuilder::max_active`]);
    /// waiting items are activated at once if it rises. Refused for ordered workqueues.
    pub fn set_max_active(&self, n: usize) -> Result<(), Error> {
        self.shared().set_max_active(n)
    }

    /// A snapshot of this workqueue's statistics: its own item totals and, per pool it
    /// uses, workers, lock contention, locality and latency percentiles (zeros when the
    /// `stats` feature is off).
    ///
    /// ```
    /// use podq::Workqueue;
    ///
    /// let wq = Workqueue::builder("doc-stats").build()?;
    /// for i in 0..100 {
    ///     drop(wq.spawn(move || i * 2));
    /// }
    /// wq.flush();
    /// let stats = wq.stats();
    /// # #[cfg(feature = "stats")]
    /// assert_eq!(stats.totals.completed, 100);
    /// for pool in &stats.pools {
    ///     println!(
    ///         "pool {} (cpus {}): {} workers, queue->start p99 {} ns",
    ///         pool.id, pool.pod_cpus, pool.workers, pool.queue_to_start_ns.p99
    ///     );
    /// }
    /// # Ok::<(), podq::Error>(())
    /// ```
    pub fn stats(&self) -> WorkqueueStats {
        self.shared().stats_snapshot()
    }
}

impl WqShared {
    /// Tells the workqueue's panic hook, or else the process-wide one, that one of its
    /// items panicked with `message`.
    pub(crate) fn report_panic(&self, message: &str) {
        crate::report_panic(self.panic_hook.as_ref(), &self.name, message);
    }
}

impl WqShared {
    pub(crate) fn check_accepting(&self) -> Result<(), Error> {
        let refused = self.destroyed.load(SeqCst)
            || (self.draining.load(SeqCst) > 0 && pool::current_wq() != self.id);
        if refused {
            Err(Error::Draining {
                wq: self.name.clone(),
            })
        } else {
            Ok(())
        }
    }

    fn queue_work(self: &Arc<Self>, work: &Work, cpu: Option<usize>) -> Result<bool, Error> {
        self.check_accepting()?;
        let Some(seq) = work.inner.state.try_pend(false) else {
            return Ok(false);
        };
        let task = Task::Work {
            work: Arc::clone(&work.inner),
            seq,
        };
        if let Err(e) = self.enqueue(task, cpu) {
            // Refused after PENDING was taken (a drain or teardown began in between):
            // give it back, or the item would stay pending and never run.
            work.inner.state.release(seq);
            return Err(e);
        }
        Ok(true)
    }

    /// Queues a work instance that already owns PENDING (a fired timer). If the
    /// workqueue is gone, the instance is cancelled and counted.
    pub(crate) fn enqueue_pending(
        self: &Arc<Self>,
        work: Arc<WorkInner>,
        seq: u32,
        cpu: Option<usize>,
    ) {
        let task = Task::Work { work, seq };
        if let Err(task) = self.enqueue_any(task, cpu, true) {
            self.cancel_refused(task);
        }
    }

    /// A task that owned its queueing (PENDING, or a spawned item's block) and was
    /// refused (the workqueue is gone): a work instance is cancelled and counted, a
    /// spawned item dropped unrun (its handle reports that).
    fn cancel_refused(&self, task: Task) {
        if let Task::Work { work, seq } = task {
            if work.state.release(seq) {
                self.counters.inc(Item::Cancelled);
            }
        }
    }

    fn enqueue(self: &Arc<Self>, task: Task, cpu: Option<usize>) -> Result<(), Error> {
        self.enqueue_any(task, cpu, false)
            .map_err(|_| Error::Draining {
                wq: self.name.clone(),
            })
    }

    /// `__queue_work` from step 2: picks the pwq, counts the item in flight and either
    /// activates it or parks it on the pwq's inactive list. Gives the task back if the
    /// workqueue is destroyed (or, unless `from_timer`, draining for this caller).
    fn enqueue_any(
        self: &Arc<Self>,
        task: Task,
        cpu: Option<usize>,
        from_timer: bool,
    ) -> Result<(), Task> {
        #[cfg(feature = "tracing")]
        if crate::trace::in_locked_event() {
            if self.destroyed.load(SeqCst) || (!from_timer && self.check_accepting().is_err()) {
                return Err(task);
            }
            reentry::defer(self, task, cpu);
            return Ok(());
        }
        let queued_cpu = cpu::current_cpu();
        // The table's read section lasts until the item is on its way: it keeps the pwq
        // and its pool alive without another reference count per item, and lets
        // `freeze` wait out queue calls that passed the gate before it closed.
        let mut table;
        let (pwq, colour) = loop {
            if self.destroyed.load(SeqCst) || (!from_timer && self.check_accepting().is_err()) {
                return Err(task);
            }
            table = self.table.read();
            let Some(pwq) = Self::pick_pwq(&table, cpu, queued_cpu) else {
                return Err(task);
            };
            if let Some(colour) = pwq.count_in() {
                break (pwq, colour);
            }
            // Retired between the table read and the count: the table has moved on.
            drop(table);
        };
        let pool = &pwq.pool.core;
        ItemCounters::inc_both(&self.counters, &pool.stats.items, Item::Queued);
        let node = &self.nodes[pwq.node];
        let entry = Entry {
            task,
            meta: EntryMeta::new(PwqRef::counted(pwq), colour, queued_cpu),
        };
        crate::trace::queue_work(&entry, cpu, queued_cpu);
        // The read section ends before any kick: waking or starting a worker may call
        // an error hook (thread creation failed), which may change this workqueue.
        let mut join_pending = false;
        // A failed take may have overshot for a moment (`NodeActive::try_inc`): an undo
        // that is a release, so it calls for an activation pass too.
        let missed = Cell::new(false);
        let take_slot = || {
            let took = node.try_inc();
            missed.set(missed.get() || !took);
            took
        };
        let kick = if !pwq.gate.load(SeqCst) && take_slot() {
            pool.push(entry)
        } else {
            let mut st = lock(&pwq.state);
            let admit = policy::admit(st.queue(), take_slot);
            match admit.admission {
                Admission::Activate => {
                    drop(st);
                    pool.push(entry)
                }
                Admission::Wait => {
                    ItemCounters::inc_both(&self.counters, &pool.stats.items, Item::MaxActiveWaits);
                    st.inactive.push_back(entry.into_waiting());
                    join_pending = admit.join_pending;
                    if join_pending {
                        pwq.enter_pending(&mut st);
                    }
                    pwq.set_gate(&st);
                    None
                }
            }
        };
        drop(table);
        if let Some(pool) = kick {
            pool.wake_or_start();
        }
        if join_pending || missed.get() {
            // A slot may have been freed between our failed try and joining the
            // pending list (its releaser may not have seen us), or by our own undo.
            self.activate(node);
        }
        #[cfg(feature = "tracing")]
        reentry::run();
        Ok(())
    }

    /// The pwq for a queue call: that of `cpu` if usable, else of the selected CPU.
    fn pick_pwq(table: &Table, cpu: Option<usize>, local: usize) -> Option<&Arc<Pwq>> {
        let has_pwq = |c: usize| table.cpu_pwq.get(c).is_some_and(Option::is_some);
        let pick = policy::pick_pwq(cpu, has_pwq, local, &table.unbound, RR_LAST.with(Cell::get));
        if let Some(rr) = pick.rr_last {
            RR_LAST.with(|r| r.set(Some(rr)));
        }
        match pick.pwq {
            PwqChoice::Cpu(c) => table.cpu_pwq[c].as_ref(),
            PwqChoice::Default => table.dfl.as_ref(),
        }
    }

    /// Activates waiting items of `node` while slots are free (`node_activate_pending_pwq`),
    /// serving pwqs round-robin in turns (`policy::activation`).
    fn activate(&self, node: &NodeActive<Arc<Pwq>>) {
        // The pwq of the last turn, if it still has waiting items: back on the list at
        // the next `take_pending`. Until then it stays `Hold::Pending` (queuers do not
        // join for it), and this loop runs that call before it stops.
        let mut back = None;
        while let Some((pwq, slots)) = node.take_pending(policy::ACTIVATION_TURN, back.take()) {
            let mut st = lock(&pwq.state);
            let mut requeued = false;
            // False when the turn went to the calling worker's batch (nobody to kick).
            let mut pushed = true;
            let count = match policy::activation(st.queue(), slots) {
                Activation::Leave => {
                    st.hold = Hold::Open;
                    0
                }
                Activation::Take { count, requeue } => {
                    requeued = requeue;
                    if !requeue {
                        st.hold = Hold::Open;
                    }
                    let entries = st.inactive.drain(..count);
                    pushed = pwq
                        .pool
                        .core
                        .push_many(entries.map(|w| w.activate(PwqRef::counted(&pwq))));
                    if st.inactive.is_empty() && st.inactive.capacity() > KEPT_INACTIVE {
                        // A flood is over: give its list's memory back.
                        st.inactive.shrink_to(KEPT_INACTIVE);
                    }
                    count
                }
            };
            pwq.set_gate(&st);
            drop(st);
            if count < slots {
                node.release(slots - count);
            }
            if count > 0 && pushed {
                pwq.pool.core.kick();
            }
            if requeued {
                back = Some(pwq);
            }
        }
        #[cfg(feature = "tracing")]
        reentry::run();
    }

    fn flush(&self) {
        // The list is read after the flush took its colour: an item counted in that
        // colour sits on a pwq that joined the list before the table pointed at it,
        // so before the item's queue call read the table; a pwq leaves the list only
        // once empty. Reading it under the lock takes no reference to drop.
        self.flush
            .flush(|colour| lock(&self.pwqs).iter().all(|p| p.in_flight.clear(colour)));
    }

    fn drain(&self) {
        self.draining.fetch_add(1, SeqCst);
        loop {
            self.flush();
            if lock(&self.pwqs).iter().all(|p| p.in_flight.is_empty()) {
                break;
            }
        }
        self.draining.fetch_sub(1, SeqCst);
    }

    pub(crate) fn stats_snapshot(&self) -> WorkqueueStats {
        let cfg = lock(&self.config);
        let (attrs, effective_scope) = (cfg.attrs.clone(), cfg.effective_scope);
        let auto = cfg.auto.as_ref().map(AutoRun::stats);
        drop(cfg);
        let pwqs: Vec<Arc<Pwq>> = lock(&self.pwqs).clone();
        let mut seen: Vec<u64> = Vec::new();
        let mut pools = Vec::new();
        for pwq in &pwqs {
            let core = &pwq.pool.core;
            if seen.contains(&core.id) {
                continue;
            }
            seen.push(core.id);
            let (workers, idle) = core.worker_counts();
            pools.push(PoolStats {
                id: core.id,
                pod_cpus: core.key.pod.to_list(),
                strict: core.key.strict,
                nice: core.key.nice,
                workers,
                idle,
                ..PoolStats::from_counters(&core.stats)
            });
        }
        pools.sort_by_key(|p| p.id);
        WorkqueueStats {
            name: self.name.clone(),
            attrs,
            effective_scope,
            auto,
            totals: self.counters.snapshot(),
            watchdog: self.watch.snapshot(),
            pools,
        }
    }

    /// Takes the `auto` sample due at `now` and applies the switch it decides.
    /// Returns when the next sample is due, or `None` when not on `auto`.
    pub(crate) fn auto_sample(self: &Arc<Self>, now: Instant) -> Option<Instant> {
        match &lock(&self.config).auto {
            Some(run) if now >= run.next_at() => {}
            Some(run) => return Some(run.next_at()),
            None => return None,
        }
        // Counters first, without `config` (the lock order puts `pwqs` after it).
        let completed = self.counters.get(Item::Completed);
        let pwqs: Vec<Arc<Pwq>> = lock(&self.pwqs).clone();
        let mut pools: Vec<auto::PoolSample> = Vec::new();
        for pwq in &pwqs {
            let core = &pwq.pool.core;
            if pools.iter().all(|p| p.id != core.id) {
                pools.push(auto::PoolSample {
                    id: core.id,
                    pod: core.key.pod.clone(),
                    capacity: self.cpu_map.reals(&core.key.pod).len(),
                    stats: PoolStats::from_counters(&core.stats),
                });
            }
        }
        drop(pwqs);
        // A workqueue being torn down gets no new pools.
        let Ok(mut cfg) = self.config_to_change() else {
            return None;
        };
        let run = cfg.auto.as_mut()?;
        let before = run.clone();
        if !run.sample(now, completed, &pools) {
            return Some(run.next_at());
        }
        let attrs = cfg.attrs.clone();
        let released = match self.apply(&mut cfg, attrs) {
            Ok(released) => Some(released),
            Err(_) => {
                if let Some(run) = cfg.auto.as_mut() {
                    run.refused(before);
                }
                None
            }
        };
        let next = cfg.auto.as_ref().map(AutoRun::next_at);
        drop(cfg);
        drop(released);
        next
    }
}

impl PwqState {
    /// The pwq's queueing state, as admission and activation see it.
    fn queue(&self) -> PwqQueue {
        PwqQueue {
            inactive: self.inactive.len(),
            // To admission and activation a frozen pwq is a plugged one.
            plugged: self.hold == Hold::Plugged || self.frozen,
            on_pending: self.hold == Hold::Pending,
        }
    }
}

impl Pwq {
    /// A pwq of `wq` on `pool`, in the current table from the start.
    fn new(wq: Arc<WqShared>, pool: Arc<Pool>, node: usize, plugged: bool) -> Pwq {
        // Made under `config`, as freezing and thawing are: a frozen workqueue's new
        // pwqs start frozen.
        let frozen = wq.freeze.is_frozen();
        Pwq {
            wq,
            pool,
            node,
            in_flight: CachePadded::default(),
            gate: AtomicBool::new(plugged || frozen),
            state: CachePadded::new(Mutex::new(PwqState {
                inactive: VecDeque::new(),
                hold: if plugged { Hold::Plugged } else { Hold::Open },
                frozen,
            })),
        }
    }

    /// Puts the pwq on its node's pending list (under its lock, `st`): its inactive
    /// items wait for a slot. The caller then runs the node's activation pass.
    fn enter_pending(self: &Arc<Self>, st: &mut PwqState) {
        st.hold = Hold::Pending;
        self.wq.nodes[self.node].push_pending(Arc::clone(self));
    }

    /// Puts an open pwq with inactive items back on its node's pending list (after an
    /// unplug or a thaw).
    fn repend(self: &Arc<Self>, st: &mut PwqState) {
        if st.hold == Hold::Open && !st.inactive.is_empty() {
            self.enter_pending(st);
        }
    }

    /// Stores the gate from the state (call under the pwq lock after changing it).
    fn set_gate(&self, st: &PwqState) {
        let gate = !st.inactive.is_empty() || st.hold != Hold::Open || st.frozen;
        // Written only under the pwq lock, which the caller holds: an unchanged value
        // needs no store (in a flood every queue call lands here with the gate shut).
        if self.gate.load(Relaxed) != gate {
            self.gate.store(gate, SeqCst);
        }
    }

    /// Counts a new item in flight in the current flush colour; `None` if the pwq has
    /// retired. A flush that moves the colour between the read and the count makes the
    /// count go again (`flush.rs`). The caller keeps the pwq alive (it holds the table).
    fn count_in(&self) -> Option<Colour> {
        let flush = &self.wq.flush;
        loop {
            let gen = flush.current();
            let colour = FlushDomain::colour(gen);
            if !self.in_flight.add(colour, 1) {
                return None;
            }
            if flush.still(gen) {
                return Some(colour);
            }
            let mut undo = [0; 2];
            undo[colour.index()] = 1;
            Pwq::uncount(PwqRef::counted(self), undo, &self.wq);
        }
    }

    /// Active items of a pwq finished or were dropped (`pwq_dec_nr_in_flight`),
    /// `done[c]` of colour `c`, all counted under `pwq`, `ran` of them run: counts
    /// those as completed, frees their slots, lets waiting items in, and updates the
    /// in-flight counts (`uncount`). Returns whether
    /// pwqs still wait for a slot on the node after the activation pass (a backlog,
    /// for `policy::poll_pauses`). The pwq may be gone when this returns.
    pub(crate) fn complete(pwq: PwqRef, done: [u64; 2], ran: u64) -> bool {
        // The workqueue outlives the call even if the pwq does not.
        let wq = Arc::clone(&pwq.wq);
        // Before the uncount: a flush that this completion ends sees the count.
        wq.counters.add(Item::Completed, ran);
        let node = &wq.nodes[pwq.node];
        node.release((done[0] + done[1]) as usize);
        wq.activate(node);
        let waiting = node.has_waiting();
        Pwq::uncount(pwq, done, &wq);
        waiting
    }

    /// Uncounts items in flight of `pwq` (a workqueue of `wq`); wakes flushers when a
    /// colour cleared, and if that emptied a pwq no longer current, removes the
    /// retired pwq from the list.
    fn uncount(pwq: PwqRef, done: [u64; 2], wq: &Arc<WqShared>) {
        let gone = pwq.0.as_ptr().cast_const();
        let left = pwq.in_flight.remove(done);
        // Unless this removal retired it, the pwq may be freed from here on: `pwq` is
        // not used again.
        if left.retired {
            let mut list = lock(&wq.pwqs);
            let at = list.iter().position(|p| std::ptr::eq(Arc::as_ptr(p), gone));
            let last = at.map(|i| list.remove(i));
            drop(list);
            // Possibly the pool's last handle: dropped with no lock held, before
            // flushers wake, so that a flusher tearing the workqueue down holds the
            // last reference to the workqueue and joins the pool's workers itself.
            drop(last);
            wq.unplug_oldest();
        }
        if left.cleared {
            wq.flush.cleared();
        }
    }

    /// Leaves the table (an attribute change or teardown, under `pwqs`): retires it at
    /// once if empty, and says whether it did.
    fn leave_table(&self) -> bool {
        self.in_flight.leave()
    }
}

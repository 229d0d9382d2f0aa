//! Workqueues, their pool_workqueues (pwqs), `max_active` admission, flush, drain and
//! live attribute changes. Protocols: `workqueue/README.md`.
//!
//! Legend: I set at init; A atomic (ordering and pair named at each use); M guarded by
//! `WqShared::config` (serialises attribute changes); T guarded by `WqShared::table`
//! (read-mostly); S guarded by `WqShared::pwqs`; P guarded by `Pwq::state`; N guarded
//! by `NodeActive::pending`.
//!
//! Lock order: `config` → `table` → `pwqs` → `Pwq::state` → `NodeActive::pending` →
//! pool lock. `FlushDomain::lock` is taken before `pwqs` and `Pwq::state`.

#[cfg(feature = "control")]
mod control;
pub(crate) mod flush;
mod node;
pub(crate) mod refresh;

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{OnceLock, Weak};
use std::time::Duration;

use crossbeam_utils::sync::ShardedLock;
use podq_topology::{CpuSet, Scope, Topology};

use crate::attrs::{self, PoolKey};
use crate::cpu::{self, CpuMap};
use crate::delayed::{self, DelayedWork};
use crate::join::{self, JoinHandle};
use crate::policy::{self, Activation, Admission, PwqChoice, PwqQueue};
use crate::pool::{self, Pool, PoolCore};
use crate::stats::{ItemCounters, PoolStats, WorkqueueStats};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use crate::error::SpawnError;
use crate::fault::ErrorHook;
use crate::sync::lock_std as lock;
use crate::work::{Entry, EntryMeta, Task, Work, WorkInner};
use crate::{Attrs, Error, PanicHook, PanicReport};
use flush::{FlushDomain, InFlight};
use node::NodeActive;

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
/// 1. Queued items, on worklists or waiting for an active slot, all run: the drop
///    drains the workqueue, accepting only chained queueing from its own items; timers
///    that fire meanwhile queue their items, which run too.
/// 2. Running items are waited for.
/// 3. Delayed items still on the timer are cancelled: they are idle again (free to be
///    queued elsewhere) and never fire. The kernel leaves them to the caller.
/// 4. Pools no other workqueue uses stop; their workers exit and are joined.
///
/// Dropped inside one of its own items (an item held the last handle), the workqueue
/// cannot wait for itself: the drop returns at once, and the items still queued run
/// afterwards, after which the pools stop and their workers exit on their own.
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
    /// I: node id → index in `nodes` (the last index is the fallback counter).
    node_index: Vec<usize>,
    /// M: requested attributes; held across a whole change.
    config: Mutex<Config>,
    /// T: the CPU → pwq table.
    table: ShardedLock<Arc<Table>>,
    /// S: every live pwq, oldest first (current and retiring ones: flush walks them).
    pwqs: Mutex<Vec<Arc<Pwq>>>,
    /// I (contents A/N): per-node active counters, fallback last.
    nodes: Vec<NodeActive<Arc<Pwq>>>,
    /// A/F: flush generations.
    flush: FlushDomain,
    /// A: drain calls in progress (`SeqCst`; checked by queue calls).
    draining: AtomicUsize,
    /// A: set once torn down (`SeqCst`; checked by queue calls and timers).
    destroyed: AtomicBool,
    /// A: item counters of this workqueue.
    pub(crate) counters: ItemCounters,
    /// I: its own panic hook (`None`: the process-wide one).
    panic_hook: Option<PanicHook>,
    /// I: its own error hook (`None`: the process-wide one).
    pub(crate) error_hook: Option<ErrorHook>,
}

/// A pool_workqueue: one workqueue's link to one pool.
pub(crate) struct Pwq {
    /// I: the workqueue.
    pub(crate) wq: Arc<WqShared>,
    /// I: the pool.
    pub(crate) pool: Arc<Pool>,
    /// I: index of its node counter in `wq.nodes`.
    node: usize,
    /// P: the pwq lock.
    state: Mutex<PwqState>,
}

/// Everything a pwq's lock guards (all P).
struct PwqState {
    /// Items waiting for an active slot, FIFO.
    inactive: VecDeque<Entry>,
    /// Items in flight by flush generation (inactive, active, running).
    in_flight: InFlight,
    /// On its node's pending list.
    on_pending: bool,
    /// Ordered workqueues: may not activate until older pwqs are gone.
    plugged: bool,
    /// In the current table.
    current: bool,
    /// Retired: removed from `wq.pwqs`; queue calls that find it retry.
    dead: bool,
}

static NEXT_WQ_ID: AtomicUsize = AtomicUsize::new(1);
static NEXT_POOL_ID: AtomicUsize = AtomicUsize::new(0);

/// Live workqueues, for `stats::all()` and default-scope changes.
fn registry() -> &'static Mutex<Vec<Weak<WqShared>>> {
    static WQS: OnceLock<Mutex<Vec<Weak<WqShared>>>> = OnceLock::new();
    WQS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Live pools by key, for sharing.
fn pools() -> &'static Mutex<HashMap<PoolKey, Weak<Pool>>> {
    static POOLS: OnceLock<Mutex<HashMap<PoolKey, Weak<Pool>>>> = OnceLock::new();
    POOLS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Topologies seen so far, by their description, for pool keys.
fn topology_id(topology: &Topology) -> u64 {
    static IDS: OnceLock<Mutex<HashMap<String, u64>>> = OnceLock::new();
    let text = format!("{topology:?}");
    let mut ids = lock(IDS.get_or_init(|| Mutex::new(HashMap::new())));
    let next = ids.len() as u64;
    *ids.entry(text).or_insert(next)
}

pub(crate) fn live_workqueues() -> Vec<Arc<WqShared>> {
    lock(registry()).iter().filter_map(Weak::upgrade).collect()
}

/// The process default scope: set by `set_default_scope`, else from
/// `PODQ_DEFAULT_AFFINITY_SCOPE`, else `cache_shard`. A bad environment value is warned
/// about once, on stderr, when the default is first needed: the error hook is about
/// pools, and may not be set yet.
fn default_cell() -> &'static Mutex<Scope> {
    static DEFAULT: OnceLock<Mutex<Scope>> = OnceLock::new();
    DEFAULT.get_or_init(|| {
        let scope = env_default().unwrap_or_else(|e| {
            eprintln!(
                "podq: warning: {e}; using `{}` as the default scope",
                Scope::BUILTIN_DEFAULT
            );
            Scope::BUILTIN_DEFAULT
        });
        Mutex::new(scope)
    })
}

fn env_default() -> Result<Scope, Error> {
    let value = std::env::var(podq_topology::DEFAULT_SCOPE_ENV).ok();
    Ok(Scope::default_from_env_value(value.as_deref())?)
}

/// The process-wide default affinity scope that workqueues with `Scope::Default`
/// follow: the last [`set_default_scope`], else `PODQ_DEFAULT_AFFINITY_SCOPE`, else
/// `cache_shard`. A bad environment value reads as `cache_shard`, with one warning on
/// stderr for the process, and [`WorkqueueBuilder::build`] refuses workqueues on
/// `Scope::Default` while it is set.
pub fn default_scope() -> Scope {
    *lock(default_cell())
}

/// Sets the process-wide default scope; every live workqueue on `Scope::Default`
/// switches to it at once (queued items finish on their old pools). `Default` itself is
/// refused.
///
/// ```
/// use podq::{Scope, Workqueue};
///
/// let follows = Workqueue::builder("doc-follows").build()?; // on Scope::Default
/// let fixed = Workqueue::builder("doc-fixed").scope(Scope::Cpu).build()?;
/// let before = podq::default_scope();
/// podq::set_default_scope(Scope::Numa)?;
/// assert_eq!(follows.effective_scope(), Scope::Numa);
/// assert_eq!(fixed.effective_scope(), Scope::Cpu);
/// assert!(podq::set_default_scope(Scope::Default).is_err());
/// podq::set_default_scope(before)?;
/// # Ok::<(), podq::Error>(())
/// ```
pub fn set_default_scope(scope: Scope) -> Result<(), Error> {
    if scope == Scope::Default {
        return Err(Error::DefaultScope { scope });
    }
    static SERIAL: Mutex<()> = Mutex::new(());
    let _serial = lock(&SERIAL);
    *lock(default_cell()) = scope;
    for wq in live_workqueues() {
        let mut cfg = lock(&wq.config);
        if cfg.attrs.scope == Scope::Default {
            let attrs = cfg.attrs.clone();
            let released = wq.apply(&mut cfg, attrs)?;
            drop(cfg);
            drop(released);
        }
    }
    Ok(())
}

/// Builds a [`Workqueue`]; every setting has the kernel's default.
#[derive(Clone)]
pub struct WorkqueueBuilder {
    name: String,
    scope: Scope,
    strict: bool,
    cpumask: Option<CpuSet>,
    max_active: usize,
    ordered: bool,
    nice: i32,
    topology: Option<Topology>,
    idle_timeout: Duration,
    rescuer: bool,
    panic_hook: Option<PanicHook>,
    error_hook: Option<ErrorHook>,
}

impl fmt::Debug for WorkqueueBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkqueueBuilder")
            .field("name", &self.name)
            .field("scope", &self.scope)
            .field("strict", &self.strict)
            .field("cpumask", &self.cpumask)
            .field("max_active", &self.max_active)
            .field("ordered", &self.ordered)
            .field("nice", &self.nice)
            .field("idle_timeout", &self.idle_timeout)
            .field("rescuer", &self.rescuer)
            .field("panic_hook", &self.panic_hook.is_some())
            .field("error_hook", &self.error_hook.is_some())
            .finish_non_exhaustive()
    }
}

impl WorkqueueBuilder {
    /// The hook called for each of this workqueue's items that panics, instead of the
    /// process-wide one ([`crate::set_panic_hook`], the default). It runs on the
    /// worker after the item unwound; a panicking hook is caught.
    pub fn panic_hook(mut self, hook: impl Fn(&PanicReport<'_>) + Send + Sync + 'static) -> Self {
        self.panic_hook = Some(Arc::new(hook));
        self
    }

    /// The hook told about faults the runtime handles for this workqueue (a worker
    /// thread that could not be created for a pool its items wait on), instead of the
    /// process-wide one ([`crate::set_error_hook`], the default). A pool shared by
    /// several workqueues tells each waiting workqueue's hook once, and the process-wide
    /// hook once for those without one.
    pub fn error_hook(
        mut self,
        hook: impl Fn(&crate::ErrorReport<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.error_hook = Some(Arc::new(hook));
        self
    }

    /// Affinity scope (default: `Scope::Default`, following the process default).
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// Confine workers to their pod (default: false).
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// CPUs the workqueue may use (default: all usable CPUs of the topology).
    pub fn cpumask(mut self, mask: CpuSet) -> Self {
        self.cpumask = Some(mask);
        self
    }

    /// Limit of active items, `1..=2048` (default 1024, the kernel's `WQ_DFL_ACTIVE`);
    /// ignored for ordered workqueues, which run one at a time.
    ///
    /// Enforced per NUMA node, as the kernel does: each node of the workqueue's
    /// cpumask gets a share proportional to its CPUs, rounded up and never below
    /// `min(max_active, 8)` (`WQ_DFL_MIN_ACTIVE`, so no node starves), and pools that
    /// span nodes share a counter of `max_active` itself. The shares can add up to
    /// more than `max_active`: `max_active(3)` on a 2-node topology lets up to 6 items
    /// run, 3 on each node ([`policy::node_limits`]).
    pub fn max_active(mut self, n: usize) -> Self {
        self.max_active = n;
        self
    }

    /// One item at a time in queueing order (default: false).
    pub fn ordered(mut self, ordered: bool) -> Self {
        self.ordered = ordered;
        self
    }

    /// Nice value of the workers, `-20..=19` (default 0; -20 is the kernel's
    /// `WQ_HIGHPRI`). Negative values need privileges: when the OS refuses, workers run
    /// at their inherited priority and the pool's `nice_failures` counts it.
    pub fn nice(mut self, nice: i32) -> Self {
        self.nice = nice;
        self
    }

    /// The machine to place work on (default: the live machine). A topology with CPUs
    /// that are not real (a synthetic or captured one) is mapped onto the real CPUs
    /// round-robin.
    pub fn topology(mut self, topology: Topology) -> Self {
        self.topology = Some(topology);
        self
    }

    /// How long a surplus idle worker waits before exiting (default 300 s, the kernel's
    /// `IDLE_WORKER_TIMEOUT`). Part of the pool key: pools are shared only between
    /// workqueues with equal timeouts.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Give the workqueue a rescuer thread (default: false), as the kernel's
    /// `WQ_MEM_RECLAIM`: when a pool cannot start a worker (thread limits), the rescuer
    /// is called after 10 ms and runs this workqueue's items there, so they progress
    /// while creation keeps failing. Costs one idle thread per workqueue.
    pub fn rescuer(mut self, rescuer: bool) -> Self {
        self.rescuer = rescuer;
        self
    }

    /// Builds the workqueue, or says which setting is wrong.
    pub fn build(self) -> Result<Workqueue, Error> {
        if self.name.is_empty() {
            return Err(Error::EmptyName);
        }
        if self.scope == Scope::Default {
            env_default()?;
        }
        let (topology, live) = match self.topology {
            Some(t) => {
                let live = refresh::is_live_machine(&t);
                (t, live)
            }
            None => (cpu::live_topology(), true),
        };
        let cpumask = self.cpumask.unwrap_or_else(|| topology.usable().clone());
        let attrs = Attrs {
            scope: self.scope,
            strict: self.strict,
            cpumask,
            nice: self.nice,
            max_active: if self.ordered { 1 } else { self.max_active },
            ordered: self.ordered,
        };
        attrs::validate(&attrs)?;
        pool::start_manager()?;
        let node_ids = topology.nodes();
        let fallback = node_ids.len();
        let mut node_index = vec![fallback; node_ids.last().map_or(0, |n| n + 1)];
        for (i, &n) in node_ids.iter().enumerate() {
            node_index[n] = i;
        }
        let shared = Arc::new(WqShared {
            id: NEXT_WQ_ID.fetch_add(1, Relaxed) as u64,
            name: self.name,
            ordered: self.ordered,
            topology_id: topology_id(&topology),
            cpu_map: CpuMap::new(&topology),
            live,
            topology: Arc::new(topology),
            idle_timeout: self.idle_timeout,
            node_index,
            config: Mutex::new(Config {
                attrs: attrs.clone(),
                effective_scope: Scope::BUILTIN_DEFAULT,
                retired: Vec::new(),
            }),
            table: ShardedLock::new(Arc::new(Table {
                cpu_pwq: Vec::new(),
                dfl: None,
                unbound: CpuSet::new(),
            })),
            pwqs: Mutex::new(Vec::new()),
            nodes: (0..=fallback).map(|_| NodeActive::new()).collect(),
            flush: FlushDomain::default(),
            draining: AtomicUsize::new(0),
            destroyed: AtomicBool::new(false),
            counters: ItemCounters::default(),
            panic_hook: self.panic_hook,
            error_hook: self.error_hook,
        });
        {
            let mut cfg = lock(&shared.config);
            shared.apply(&mut cfg, attrs)?;
        }
        if self.rescuer {
            pool::start_rescuer(shared.id, &shared.name)?;
        }
        let mut wqs = lock(registry());
        wqs.retain(|w| w.strong_count() > 0);
        wqs.push(Arc::downgrade(&shared));
        Ok(Workqueue {
            handle: Arc::new(WqHandle { shared }),
        })
    }
}

impl fmt::Debug for Workqueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workqueue")
            .field("name", &self.name())
            .field("attrs", &self.attrs())
            .finish()
    }
}

impl Workqueue {
    /// A builder for a workqueue called `name`.
    pub fn builder(name: impl Into<String>) -> WorkqueueBuilder {
        WorkqueueBuilder {
            name: name.into(),
            scope: Scope::Default,
            strict: false,
            cpumask: None,
            max_active: policy::WQ_DFL_ACTIVE,
            ordered: false,
            nice: 0,
            topology: None,
            idle_timeout: policy::IDLE_WORKER_TIMEOUT,
            rescuer: false,
            panic_hook: None,
            error_hook: None,
        }
    }

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

    /// The scope in use, with `Default` resolved.
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
    pub fn queue(&self, work: &Work) -> bool {
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
        let topo = &self.shared().topology;
        let local = cpu::current_cpu();
        let cpu = policy::select_node_cpu(local, topo.node_of(local), node, &topo.node_cpus(node));
        self.shared().queue_work(work, cpu).unwrap_or(false)
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
        match self.try_spawn(f) {
            Ok(handle) => handle,
            Err(e) => panic!("{}", e.error()),
        }
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
        let wq = self.shared();
        if let Err(e) = wq.check_accepting() {
            return Err(SpawnError::new(e, f));
        }
        let (handle, task) = join::pair(f);
        // Past the check, the call counts as made before any drain that began since: it
        // is queued and a drain waits for it. Only a destroyed workqueue refuses it then,
        // which cannot happen while this handle lives; were it refused, the handle would
        // report the item dropped without running.
        let _ = wq.enqueue_any(Task::Once(task), None, true);
        Ok(handle)
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

    /// [`Workqueue::set_max_active`]; also what the control plane calls.
    fn set_max_active(&self, n: usize) -> Result<(), Error> {
        let wq = self;
        if wq.ordered {
            return Err(Error::Ordered {
                wq: wq.name.clone(),
                what: "max_active",
            });
        }
        if !policy::valid_max_active(n) {
            return Err(Error::InvalidMaxActive { value: n });
        }
        let mut cfg = lock(&wq.config);
        cfg.attrs.max_active = n;
        let effective = read(&wq.table).unbound.clone();
        wq.store_node_limits(&policy::node_limits(n, &effective, &wq.topology));
        drop(cfg);
        for node in &wq.nodes {
            wq.activate(node);
        }
        Ok(())
    }
}

impl Drop for WqHandle {
    fn drop(&mut self) {
        let wq = &self.shared;
        // Dropped inside one of its own items, the workqueue cannot wait for itself:
        // its pwqs that still hold items then retire on their own as their last item
        // completes (`Pwq::complete`), activating waiting items on the way, so none is
        // lost. After a drain every pwq is empty and retires here.
        if pool::current_wq() != wq.id {
            pool::blocking(|| wq.drain());
        }
        pool::stop_rescuer(wq.id);
        let retired = std::mem::take(&mut lock(&wq.config).retired);
        wq.destroyed.store(true, SeqCst);
        let cancelled = delayed::cancel_for(wq.id);
        wq.counters.cancelled.add(cancelled);
        let old = std::mem::replace(
            &mut *write(&wq.table),
            Arc::new(Table {
                cpu_pwq: Vec::new(),
                dfl: None,
                unbound: CpuSet::new(),
            }),
        );
        drop(old);
        let mut retiring: Vec<Arc<Pwq>> = Vec::new();
        lock(&wq.pwqs).retain(|pwq| {
            let mut st = lock(&pwq.state);
            st.current = false;
            st.dead = st.in_flight.is_empty();
            if st.dead {
                retiring.push(Arc::clone(pwq));
            }
            !st.dead
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

/// Write access to the table (poisoning ignored, as [`lock`]).
fn write<T>(l: &ShardedLock<T>) -> crossbeam_utils::sync::ShardedLockWriteGuard<'_, T> {
    match l.write() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Read access to the table (poisoning ignored, as [`lock`]).
fn read<T>(l: &ShardedLock<T>) -> crossbeam_utils::sync::ShardedLockReadGuard<'_, T> {
    match l.read() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
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
        if let Err(Task::Work { work, seq }) = self.enqueue_any(task, cpu, true) {
            if work.state.release(seq) {
                self.counters.cancelled.inc();
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
        let queued_cpu = cpu::current_cpu();
        loop {
            if self.destroyed.load(SeqCst) || (!from_timer && self.check_accepting().is_err()) {
                return Err(task);
            }
            let Some(pwq) = self.pick_pwq(cpu, queued_cpu) else {
                return Err(task);
            };
            let mut st = lock(&pwq.state);
            if st.dead {
                // Retired between the table read and the lock: the table has moved on.
                continue;
            }
            let gen = self.flush.current();
            st.in_flight.add(gen);
            self.counters.queued.inc();
            pwq.pool.core.stats.items.queued.inc();
            let entry = Entry {
                task,
                meta: EntryMeta {
                    pwq: Arc::clone(&pwq),
                    gen,
                    queued_cpu,
                    #[cfg(feature = "stats")]
                    queued_at: crate::stats::sample_stamp(),
                },
            };
            let node = &self.nodes[pwq.node];
            let admit = policy::admit(st.queue(), || node.try_inc());
            match admit.admission {
                Admission::Activate => {
                    drop(st);
                    pwq.pool.core.push(entry);
                }
                Admission::Wait => {
                    self.counters.max_active_waits.inc();
                    pwq.pool.core.stats.items.max_active_waits.inc();
                    st.inactive.push_back(entry);
                    let join_pending = admit.join_pending;
                    if join_pending {
                        st.on_pending = true;
                        node.push_pending(Arc::clone(&pwq));
                    }
                    drop(st);
                    if join_pending {
                        // A slot may have been freed between our failed try and joining
                        // the pending list; its releaser may not have seen us.
                        self.activate(node);
                    }
                }
            }
            return Ok(());
        }
    }

    /// The pwq for a queue call: that of `cpu` if usable, else of the selected CPU.
    fn pick_pwq(&self, cpu: Option<usize>, local: usize) -> Option<Arc<Pwq>> {
        let table = read(&self.table);
        let has_pwq = |c: usize| table.cpu_pwq.get(c).is_some_and(Option::is_some);
        let pick = policy::pick_pwq(cpu, has_pwq, local, &table.unbound, RR_LAST.with(Cell::get));
        if let Some(rr) = pick.rr_last {
            RR_LAST.with(|r| r.set(Some(rr)));
        }
        match pick.pwq {
            PwqChoice::Cpu(c) => table.cpu_pwq[c].clone(),
            PwqChoice::Default => table.dfl.clone(),
        }
    }

    /// Activates waiting items of `node` while slots are free (`node_activate_pending_pwq`),
    /// serving pwqs round-robin.
    fn activate(&self, node: &NodeActive<Arc<Pwq>>) {
        loop {
            let Some(pwq) = node.take_pending() else {
                return;
            };
            let mut st = lock(&pwq.state);
            match policy::activation(st.queue()) {
                Activation::Leave => {
                    st.on_pending = false;
                    drop(st);
                    node.release();
                }
                Activation::Take { requeue } => {
                    let entry = st.inactive.pop_front().expect("activation takes an item");
                    if requeue {
                        node.push_pending(Arc::clone(&pwq));
                    } else {
                        st.on_pending = false;
                    }
                    drop(st);
                    pwq.pool.core.push(entry);
                }
            }
        }
    }

    fn flush(&self) {
        // Every item queued before this call sits on a pwq that is on the list now (new
        // pwqs join the list before the table points at them; a pwq leaves it only when
        // empty), so one snapshot suffices. It is dropped outside the flush lock: it may
        // hold the last reference to a retired pwq.
        let pwqs: Vec<Arc<Pwq>> = lock(&self.pwqs).clone();
        self.flush.flush(|gen| {
            pwqs.iter()
                .all(|p| lock(&p.state).in_flight.clear_up_to(gen))
        });
    }

    fn drain(&self) {
        self.draining.fetch_add(1, SeqCst);
        loop {
            self.flush();
            let pwqs: Vec<Arc<Pwq>> = lock(&self.pwqs).clone();
            if pwqs.iter().all(|p| lock(&p.state).in_flight.is_empty()) {
                break;
            }
        }
        self.draining.fetch_sub(1, SeqCst);
    }

    fn change(self: &Arc<Self>, edit: impl FnOnce(&mut Attrs)) -> Result<(), Error> {
        let mut cfg = lock(&self.config);
        let mut attrs = cfg.attrs.clone();
        edit(&mut attrs);
        let released = self.apply(&mut cfg, attrs)?;
        drop(cfg);
        drop(released);
        Ok(())
    }

    /// `apply_workqueue_attrs`: prepare everything (errors leave no trace), then commit
    /// by adding the new pwqs to the flush list, swapping the table, and retiring old
    /// pwqs that are already empty. Old pwqs keep their items and finish them.
    ///
    /// Returns what the change released, for the caller to drop after unlocking
    /// `config`: dropping the last pwq of a pool stops and joins its workers, which
    /// must not happen under a lock an item might want.
    fn apply(self: &Arc<Self>, cfg: &mut Config, attrs: Attrs) -> Result<Released, Error> {
        // Prepare.
        attrs::validate(&attrs)?;
        let old_table = Arc::clone(&read(&self.table));
        let mut old: Vec<Arc<Pwq>> = Vec::new();
        for pwq in old_table
            .cpu_pwq
            .iter()
            .flatten()
            .chain(old_table.dfl.iter())
        {
            if !old.iter().any(|p| Arc::ptr_eq(p, pwq)) {
                old.push(Arc::clone(pwq));
            }
        }
        let old_keys: Vec<PoolKey> = old.iter().map(|p| p.pool.core.key.clone()).collect();
        let current = policy::Current {
            pools: &old_keys,
            pwqs_alive: !lock(&self.pwqs).is_empty(),
        };
        let shape = policy::WqShape {
            topology: &self.topology,
            topology_id: self.topology_id,
            ordered: self.ordered,
            idle_timeout: self.idle_timeout,
            default_scope: default_scope(),
        };
        let plan = policy::plan(&current, &attrs, &self.usable_now(), &shape)?;
        let mut fresh: Vec<Arc<Pwq>> = Vec::new();
        let pwqs: Vec<Arc<Pwq>> = plan
            .pools
            .iter()
            .map(|planned| {
                if let Some(i) = planned.reused {
                    return Arc::clone(&old[i]);
                }
                let node = planned
                    .node
                    .map_or(self.nodes.len() - 1, |n| self.node_index[n]);
                let pwq = Arc::new(Pwq {
                    wq: Arc::clone(self),
                    pool: self.pool_for(&planned.key),
                    node,
                    state: Mutex::new(PwqState {
                        inactive: VecDeque::new(),
                        in_flight: InFlight::default(),
                        on_pending: false,
                        plugged: plan.plugged,
                        current: true,
                        dead: false,
                    }),
                });
                fresh.push(Arc::clone(&pwq));
                pwq
            })
            .collect();
        let cpu_pwq: Vec<Option<Arc<Pwq>>> = plan
            .cpu_pool
            .iter()
            .map(|p| p.map(|i| Arc::clone(&pwqs[i])))
            .collect();
        let dfl = Arc::clone(&pwqs[0]);
        let effective = plan.effective.clone();
        let scope = plan.scope;
        let table = Arc::new(Table {
            cpu_pwq,
            dfl: Some(dfl),
            unbound: effective.clone(),
        });
        // Commit.
        lock(&self.pwqs).extend(fresh.iter().cloned());
        let old_table = std::mem::replace(&mut *write(&self.table), Arc::clone(&table));
        let mut retired = Vec::new();
        let in_new = |p: &Arc<Pwq>| {
            table
                .cpu_pwq
                .iter()
                .flatten()
                .chain(table.dfl.iter())
                .any(|q| Arc::ptr_eq(p, q))
        };
        {
            let mut list = lock(&self.pwqs);
            list.retain(|p| {
                let mut st = lock(&p.state);
                st.current = in_new(p);
                if !st.current && st.in_flight.is_empty() {
                    st.dead = true;
                    retired.push(Arc::clone(p));
                }
                if !st.current && !st.dead {
                    let known = cfg
                        .retired
                        .iter()
                        .any(|(w, _)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(p)));
                    if !known {
                        cfg.retired
                            .push((Arc::downgrade(p), Arc::clone(&p.pool.core)));
                    }
                }
                !st.dead
            });
        }
        cfg.retired.retain(|(w, _)| w.strong_count() > 0);
        cfg.attrs = attrs;
        cfg.effective_scope = scope;
        self.store_node_limits(&plan.limits);
        self.unplug_oldest();
        for node in &self.nodes {
            self.activate(node);
        }
        Ok(Released {
            _table: old_table,
            _pwqs: retired,
        })
    }

    /// The shared pool for `key`, created if none is alive.
    fn pool_for(&self, key: &PoolKey) -> Arc<Pool> {
        let mut pools = lock(pools());
        if let Some(pool) = pools.get(key).and_then(Weak::upgrade) {
            return pool;
        }
        pools.retain(|_, p| p.strong_count() > 0);
        let id = NEXT_POOL_ID.fetch_add(1, Relaxed) as u64;
        let pool = Arc::new(Pool::new(
            id,
            key.clone(),
            Arc::clone(&self.topology),
            &self.cpu_map,
            self.idle_timeout,
        ));
        pools.insert(key.clone(), Arc::downgrade(&pool));
        pool
    }

    /// Stores the node shares of `max_active` (`wq_update_node_max_active`).
    fn store_node_limits(&self, limits: &policy::NodeLimits) {
        for &(node, max) in &limits.per_node {
            self.nodes[self.node_index[node]].set_max(max);
        }
        self.nodes[self.nodes.len() - 1].set_max(limits.fallback);
    }

    /// Ordered workqueues: lets the oldest live pwq activate (`unplug_oldest_pwq`).
    fn unplug_oldest(&self) {
        if !self.ordered {
            return;
        }
        let Some(oldest) = lock(&self.pwqs).first().cloned() else {
            return;
        };
        let mut st = lock(&oldest.state);
        if !st.plugged {
            return;
        }
        st.plugged = false;
        let node = &self.nodes[oldest.node];
        if !st.inactive.is_empty() && !st.on_pending {
            st.on_pending = true;
            node.push_pending(Arc::clone(&oldest));
        }
        drop(st);
        self.activate(node);
    }

    pub(crate) fn stats_snapshot(&self) -> WorkqueueStats {
        let cfg = lock(&self.config);
        let (attrs, effective_scope) = (cfg.attrs.clone(), cfg.effective_scope);
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
            totals: self.counters.snapshot(),
            pools,
        }
    }
}

impl PwqState {
    /// The pwq's queueing state, as admission and activation see it.
    fn queue(&self) -> PwqQueue {
        PwqQueue {
            inactive: self.inactive.len(),
            plugged: self.plugged,
            on_pending: self.on_pending,
        }
    }
}

impl Pwq {
    /// An active item of this pwq finished or was dropped (`pwq_dec_nr_in_flight`):
    /// frees its slot, lets waiting items in, updates flush generations and retires
    /// the pwq once it is empty and no longer current.
    pub(crate) fn complete(self: Arc<Self>, gen: u64) {
        let wq = Arc::clone(&self.wq);
        let node = &wq.nodes[self.node];
        node.release();
        wq.activate(node);
        let mut st = lock(&self.state);
        let advanced = st.in_flight.remove(gen);
        let retire = st.in_flight.is_empty() && !st.current && !st.dead;
        if retire {
            st.dead = true;
        }
        drop(st);
        if retire {
            lock(&wq.pwqs).retain(|p| !Arc::ptr_eq(p, &self));
        }
        // Drop our reference before waking flushers, so that a flusher tearing the
        // workqueue down holds the last one and joins the pool's workers itself.
        drop(self);
        if retire {
            wq.unplug_oldest();
        }
        if advanced {
            wq.flush.advanced();
        }
    }
}

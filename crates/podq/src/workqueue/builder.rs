//! `WorkqueueBuilder`: every setting of a new workqueue, checked by `build`.

use crate::sync::{AtomicBool, AtomicUsize, Mutex, Ordering::Relaxed};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::published::Published;
use podq_topology::{CpuSet, Scope, Topology};

use super::flush::FlushDomain;
use super::registry::{env_default, registry, topology_id, NEXT_WQ_ID};
use super::{refresh, Config, NodeActive, Table, WqHandle, WqShared};
use crate::attrs;
use crate::auto;
use crate::cpu::{self, CpuMap};
use crate::fault::ErrorHook;
use crate::policy;
use crate::pool;
use crate::stats::ItemCounters;
use crate::sync::lock;
use crate::threads::ThreadOptions;
use crate::{Attrs, Error, PanicHook, PanicReport, WorkerThread, Workqueue};

/// Builds a [`Workqueue`]; every setting has the kernel's default.
#[derive(Clone)]
pub struct WorkqueueBuilder {
    name: String,
    scope: Scope,
    strict: bool,
    cpumask: Option<CpuSet>,
    max_active: Option<usize>,
    min_active: Option<usize>,
    ordered: bool,
    nice: i32,
    topology: Option<Topology>,
    idle_timeout: Duration,
    rescuer: bool,
    auto: auto::Settings,
    panic_hook: Option<PanicHook>,
    error_hook: Option<ErrorHook>,
    threads: ThreadOptions,
    stall_threshold: Option<Duration>,
    long_item_threshold: Option<Duration>,
}

impl fmt::Debug for WorkqueueBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkqueueBuilder")
            .field("name", &self.name)
            .field("scope", &self.scope)
            .field("strict", &self.strict)
            .field("cpumask", &self.cpumask)
            .field("max_active", &self.max_active)
            .field("min_active", &self.min_active)
            .field("ordered", &self.ordered)
            .field("nice", &self.nice)
            .field("idle_timeout", &self.idle_timeout)
            .field("rescuer", &self.rescuer)
            .field("auto", &self.auto)
            .field("panic_hook", &self.panic_hook.is_some())
            .field("error_hook", &self.error_hook.is_some())
            .field("thread_name", &self.threads.name.is_some())
            .field("stack_size", &self.threads.stack_size)
            .field("on_thread_start", &self.threads.on_start.is_some())
            .field("on_thread_stop", &self.threads.on_stop.is_some())
            .field("stall_threshold", &self.stall_threshold)
            .field("long_item_threshold", &self.long_item_threshold)
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

    /// Limit of active items, `1..=2048` (default 1024, the kernel's `WQ_DFL_ACTIVE`).
    /// An ordered workqueue runs one item at a time: any other value than 1 is refused
    /// for it ([`Error::Ordered`]), where the kernel's `alloc_ordered_workqueue` takes
    /// none.
    ///
    /// Enforced per NUMA node, as the kernel does: each node of the workqueue's
    /// cpumask gets a share proportional to its CPUs, rounded up and never below
    /// `min(max_active, 8)` (`WQ_DFL_MIN_ACTIVE`, so no node starves), and pools that
    /// span nodes share a counter of `max_active` itself. The shares can add up to
    /// more than `max_active`: `max_active(3)` on a 2-node topology lets up to 6 items
    /// run, 3 on each node ([`policy::node_limits`]).
    pub fn max_active(mut self, n: usize) -> Self {
        self.max_active = Some(n);
        self
    }

    /// The per-node floor under the node shares of `max_active` (the kernel's
    /// `workqueue_set_min_active` at creation; default `min(max_active, 8)`, the
    /// kernel's `WQ_DFL_MIN_ACTIVE`): every node of the cpumask may run at least this
    /// many items at once, whatever its share. Must not exceed `max_active`
    /// ([`Error::InvalidMinActive`], where the kernel clamps); refused for ordered
    /// workqueues ([`Error::Ordered`]). Changed live with [`Workqueue::set_min_active`].
    ///
    /// ```
    /// use podq::{Topology, Workqueue};
    ///
    /// let wq = Workqueue::builder("doc-min-active-builder")
    ///     .topology(Topology::synthetic("2s4c1t")?)
    ///     .max_active(16)
    ///     .min_active(12)
    ///     .build()?;
    /// assert_eq!(wq.attrs().min_active, 12);
    /// let too_high = Workqueue::builder("doc-min-active-high").max_active(4).min_active(5);
    /// assert!(too_high.build().is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn min_active(mut self, n: usize) -> Self {
        self.min_active = Some(n);
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

    /// How often `auto` judges the statistics (default 100 ms, at least 1 ms): a switch
    /// needs `confirm_windows` windows, and waits `min_dwell_windows` after the last.
    pub fn auto_window(mut self, window: Duration) -> Self {
        self.auto.window = window;
        self
    }

    /// The thresholds and limits of the `auto` controller (default:
    /// [`policy::auto::AutoConfig::default`]).
    pub fn auto_config(mut self, config: policy::auto::AutoConfig) -> Self {
        self.auto.config = config;
        self
    }

    /// The name of each worker thread, from its pool's id and its index in the pool
    /// (default: the kernel-style `podq/u<pool>:<index>`). The OS keeps the first 15
    /// bytes; a name is cut at its first NUL byte. A panicking function is reported
    /// through the panic hook and the default name used for that thread. The rescuer
    /// keeps its kernel name, `podq/R-<workqueue>`.
    ///
    /// Setting any thread option gives the workqueue pools of its own: pools are
    /// shared only between workqueues on default thread options.
    ///
    /// ```
    /// let wq = podq::Workqueue::builder("doc-thread-name")
    ///     .thread_name(|pool, index| format!("io-{pool}.{index}"))
    ///     .build()?;
    /// let name = wq.spawn(|| std::thread::current().name().map(str::to_owned));
    /// assert!(name.join().unwrap().unwrap().starts_with("io-"));
    /// # Ok::<(), podq::Error>(())
    /// ```
    pub fn thread_name(
        mut self,
        name: impl Fn(u64, usize) -> String + Send + Sync + 'static,
    ) -> Self {
        self.threads.name = Some(Arc::new(name));
        self
    }

    /// The stack size of worker and rescuer threads, in bytes (default: the standard
    /// library's, 2 MiB unless `RUST_MIN_STACK` says otherwise). The OS rounds it up to
    /// its minimum; 0 is refused ([`Error::InvalidStackSize`]). A size the OS cannot
    /// give fails thread creation, which is handled as any such failure (reported
    /// through the error hook, retried, rescued when the workqueue has a rescuer).
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.threads.stack_size = Some(bytes);
        self
    }

    /// A hook called on every new worker thread of this workqueue's pools, rescuer
    /// included, before it runs any item (after its affinity and nice value are set),
    /// with the pool and CPUs it serves. A panic in it is caught and reported through
    /// the panic hook; the thread carries on.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    ///
    /// let started = Arc::new(AtomicUsize::new(0));
    /// let count = Arc::clone(&started);
    /// let wq = podq::Workqueue::builder("doc-thread-start")
    ///     .on_thread_start(move |t| {
    ///         assert!(t.pool.is_some() && !t.cpus.is_empty());
    ///         count.fetch_add(1, Ordering::SeqCst);
    ///     })
    ///     .build()?;
    /// wq.spawn(|| ()).join().unwrap();
    /// assert!(started.load(Ordering::SeqCst) >= 1);
    /// # Ok::<(), podq::Error>(())
    /// ```
    pub fn on_thread_start(
        mut self,
        hook: impl Fn(&WorkerThread<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.threads.on_start = Some(Arc::new(hook));
        self
    }

    /// A hook called on every worker thread of this workqueue's pools, rescuer
    /// included, as it exits (reaped when idle, or its pool stopped), with the same
    /// description as [`WorkqueueBuilder::on_thread_start`]. A panic in it is caught
    /// and reported.
    pub fn on_thread_stop(
        mut self,
        hook: impl Fn(&WorkerThread<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.threads.on_stop = Some(Arc::new(hook));
        self
    }

    /// This workqueue's stall threshold (default: the process-wide one,
    /// [`crate::watchdog::set_stall_threshold`], 30 s): the watchdog reports one of its
    /// items running this long, and a pool it uses whose pending items wait this long
    /// with no progress (a pool shared by several workqueues uses the smallest of their
    /// thresholds). At least 1 ms.
    pub fn stall_threshold(mut self, threshold: Duration) -> Self {
        self.stall_threshold = Some(threshold);
        self
    }

    /// This workqueue's long-item threshold (default: the process-wide one,
    /// [`crate::watchdog::set_long_item_threshold`], 1 s): its items that run this long
    /// are counted in its stats, the first few with their label. At least 1 ms.
    pub fn long_item_threshold(mut self, threshold: Duration) -> Self {
        self.long_item_threshold = Some(threshold);
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
        if self.ordered && self.min_active.is_some() {
            return Err(Error::Ordered {
                wq: self.name,
                what: "min_active",
            });
        }
        if self.ordered && self.max_active.is_some_and(|n| n != 1) {
            return Err(Error::Ordered {
                wq: self.name,
                what: "max_active",
            });
        }
        let max_active = self.max_active.unwrap_or(policy::WQ_DFL_ACTIVE);
        if let Some(t) = self.stall_threshold {
            crate::watchdog::check("stall", t)?;
        }
        if let Some(t) = self.long_item_threshold {
            crate::watchdog::check("long-item", t)?;
        }
        if self.threads.stack_size == Some(0) {
            return Err(Error::InvalidStackSize { bytes: 0 });
        }
        // The latency clock's one-time calibration, here rather than in an item's path.
        #[cfg(feature = "stats")]
        crate::stats::init_clock();
        if self.auto.window < Duration::from_millis(1) {
            return Err(Error::InvalidAutoWindow {
                window: self.auto.window,
            });
        }
        self.auto
            .config
            .validate()
            .map_err(|reason| Error::InvalidAutoConfig { reason })?;
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
            max_active: if self.ordered { 1 } else { max_active },
            min_active: self
                .min_active
                .unwrap_or_else(|| policy::min_active(if self.ordered { 1 } else { max_active })),
            ordered: self.ordered,
        };
        attrs::validate(&attrs)?;
        pool::start_manager()?;
        crate::watchdog::start()?;
        let threads = Arc::new(self.threads.seal(&self.name, self.panic_hook.clone()));
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
            auto_settings: self.auto,
            node_index,
            config: Mutex::new(Config {
                attrs: attrs.clone(),
                effective_scope: Scope::BUILTIN_DEFAULT,
                retired: Vec::new(),
                auto: None,
            }),
            table: Published::new(Arc::new(Table {
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
            threads,
            watch: crate::watchdog::WqWatch::new(self.stall_threshold, self.long_item_threshold),
            freeze: super::freeze::Freeze::default(),
        });
        {
            let mut cfg = lock(&shared.config);
            shared.apply(&mut cfg, attrs)?;
        }
        if self.rescuer {
            let cpus = shared.cpu_map.reals(&lock(&shared.config).attrs.cpumask);
            pool::start_rescuer(shared.id, &shared.name, &shared.threads, cpus)?;
        }
        let on_auto = lock(&shared.config).auto.is_some();
        let mut wqs = lock(registry());
        wqs.retain(|w| w.strong_count() > 0);
        wqs.push(Arc::downgrade(&shared));
        drop(wqs);
        if on_auto {
            auto::wake_sampler()?;
        }
        Ok(Workqueue {
            handle: Arc::new(WqHandle { shared }),
        })
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
            max_active: None,
            min_active: None,
            ordered: false,
            nice: 0,
            topology: None,
            idle_timeout: policy::IDLE_WORKER_TIMEOUT,
            rescuer: false,
            auto: auto::Settings::default(),
            panic_hook: None,
            error_hook: None,
            threads: ThreadOptions::default(),
            stall_threshold: None,
            long_item_threshold: None,
        }
    }
}

//! Worker pools: the pool lock, its counts, kicking (wake or start a worker) and
//! `blocking` sections. The worker loop is in `pool/worker.rs`; sleep/wake protocol and
//! worklist: `pool/README.md`.
//!
//! Legend: I set at init; L guarded by `PoolCore::state` (the pool lock); A atomic
//! (ordering and pair named at each field; `stats.rs` counters are relaxed); J guarded
//! by `PoolCore::joins`; W worker-private (see `context.rs`).
//!
//! Lock order: pool lock → worklist lock (`worklist.rs`).

use std::cell::Cell;
use std::collections::VecDeque;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use podq_topology::{CpuSet, Topology};

use crate::attrs::PoolKey;
use crate::cpu::{self, CpuMap};
use crate::policy::{self, Kick, PoolLoad};
use crate::stats::{Item, PoolCounters};
use std::sync::Arc;

use crate::context::{self, BATCH, BLOCKING_DEPTH, WORKER_POOL};
use crate::entry::Entry;
use crate::sync::Ordering::SeqCst;
use crate::sync::{
    lock, lock_std, seqcst_pair_fence, thread, unmodelled, AtomicU32, AtomicUsize, Mutex,
};

mod fifo;
mod intensive;
mod rescue;
mod ring;
mod watch;
mod worker;
mod worklist;

pub(crate) use crate::current::{current_wq, running_work};
pub(crate) use fifo::Fifo;
/// The doze's two sides, for the loom model beside the beat's (`busy.rs`).
#[cfg(all(test, loom))]
pub(crate) use intensive::Doze;
pub(crate) use intensive::{doze, wake_up as watcher_woke, LongRuns};
pub(crate) use rescue::{start_manager, start_rescuer, stop_rescuer};
pub(crate) use worklist::Acquire;
use worklist::Worklist;

/// A handle on a pool. Pools are shared between workqueues (through pwqs, which hold
/// these); dropping the last handle stops the workers and joins them.
pub(crate) struct Pool {
    /// I: the pool itself, also held by its workers.
    pub(crate) core: Arc<PoolCore>,
}

/// Per-worker bookkeeping, inside the pool lock.
struct WorkerSlot {
    /// L: the worker's thread, set when it starts.
    thread: Option<thread::Thread>,
    /// L: the worker's last CPU (workqueue topology numbering).
    last_cpu: usize,
    /// L: when it last went idle.
    idle_since: Instant,
    /// L: a waker took it off the idle list (and counted it running).
    woken: bool,
    /// L: it was woken outside its pod and must move back (non-strict pools).
    repatriate: bool,
}

/// The pool's counts that queuers read without the pool lock, to skip it when no
/// worker needs waking. Written under the pool lock (all `SeqCst`: `running` and
/// `spinning` pair with the worklist length, see [`Worklist`]; `idle` and `workers`
/// are hints that every decision re-reads under the lock).
#[derive(Default)]
pub(crate) struct Counts {
    /// A: workers running or about to run items, not counting `blocking()` sections.
    running: AtomicUsize,
    /// A: workers polling the worklist before going idle (counted in `running`).
    spinning: AtomicUsize,
    /// A: mirror of `PoolState::idle.len()`.
    idle: AtomicUsize,
    /// A: mirror of `PoolState::nr_workers`.
    workers: AtomicUsize,
    /// A: claims of the worklist left to take one item each, after an item ran past the
    /// CPU-intensive threshold (`policy::SINGLE_TAKES_AFTER_LONG_ITEM`; set by the
    /// watchdog's demotion, counted down by the claims). `Relaxed`: a hint no
    /// correctness argument reads.
    single_takes: AtomicU32,
}

impl Counts {
    /// The load as queuers see it without the pool lock, for a worklist of `worklist`
    /// items read just before (`SeqCst` loads: see the fields).
    fn load(&self, worklist: usize, concurrency: usize) -> PoolLoad {
        PoolLoad {
            worklist,
            idle: self.idle.load(SeqCst),
            running: self.running.load(SeqCst),
            workers: self.workers.load(SeqCst),
            concurrency,
            spinning: self.spinning.load(SeqCst),
        }
    }
}

/// Sleep/wake, queuer side (after pushing onto `worklist`, without the pool lock):
/// whether a worker may need waking or creating, from the counts (`policy::kick`).
fn kick_wanted<T>(counts: &Counts, worklist: &Worklist<T>, concurrency: usize) -> bool {
    // Push, fence, then the counts: pairs with `go_idle` and the spinner's exit (their
    // write, a fence, then the length).
    seqcst_pair_fence();
    policy::kick(counts.load(worklist.len(), concurrency)) != Kick::Nothing
}

impl PoolState {
    /// The load under the pool lock (`running` and `spinning` change under it too,
    /// except for the sleeper's undo in `go_idle`, which only adds a running worker).
    fn load<T>(&self, counts: &Counts, worklist: &Worklist<T>, concurrency: usize) -> PoolLoad {
        PoolLoad {
            worklist: worklist.len(),
            idle: self.idle.len(),
            running: counts.running.load(SeqCst),
            workers: self.nr_workers,
            concurrency,
            spinning: counts.spinning.load(SeqCst),
        }
    }

    /// Sleep/wake, waker side (under the lock): what `policy::kick` (held back during
    /// the create cooldown, `cooling`) decides for this load. A wake-up takes the idle
    /// worker `policy::pick_idle` chooses off the idle list ([`PoolState::wake_at`]); a
    /// creation takes a slot for the new worker, counted running. Returns what to do
    /// once the lock is released, and whether the wake-up repatriates (for its
    /// statistics).
    fn kick<T>(
        &mut self,
        counts: &Counts,
        worklist: &Worklist<T>,
        concurrency: usize,
        key: &PoolKey,
        cooling: impl FnOnce() -> bool,
    ) -> (Action, bool) {
        match policy::kick_cooled(
            policy::kick(self.load(counts, worklist, concurrency)),
            cooling,
        ) {
            Kick::Nothing => (Action::Nothing, false),
            Kick::Wake => {
                let last_cpu =
                    |i: usize| self.slots[self.idle[i]].as_ref().map_or(0, |s| s.last_cpu);
                let pick = policy::pick_idle(self.idle.len(), last_cpu, &key.pod, key.strict);
                let Some((at, repatriate)) = pick else {
                    return (Action::Nothing, false);
                };
                let action = self
                    .wake_at(counts, at, repatriate)
                    .map_or(Action::Nothing, Action::Unpark);
                (action, repatriate)
            }
            Kick::Create => {
                let slot = WorkerSlot {
                    thread: None,
                    last_cpu: key.pod.first().unwrap_or(0),
                    idle_since: Instant::now(),
                    woken: false,
                    repatriate: false,
                };
                let index = match self.slots.iter().position(Option::is_none) {
                    Some(i) => {
                        self.slots[i] = Some(slot);
                        i
                    }
                    None => {
                        self.slots.push(Some(slot));
                        self.slots.len() - 1
                    }
                };
                self.nr_workers += 1;
                counts.workers.store(self.nr_workers, SeqCst);
                counts.running.fetch_add(1, SeqCst);
                (Action::Spawn(index), false)
            }
        }
    }

    /// Sleep/wake, waker side (under the lock): takes the idle worker at position `at`
    /// off the idle list, counts it running and marks it woken. Returns its thread, to
    /// unpark once the lock is released.
    fn wake_at(&mut self, counts: &Counts, at: usize, repatriate: bool) -> Option<thread::Thread> {
        let index = self.idle.remove(at)?;
        counts.idle.store(self.idle.len(), SeqCst);
        counts.running.fetch_add(1, SeqCst);
        let slot = self.slots[index].as_mut()?;
        slot.woken = true;
        slot.repatriate = repatriate;
        slot.thread.clone()
    }

    /// Sleep/wake, sleeper side (under the lock, after finding the worklist empty):
    /// worker `index` stops counting as running and joins the idle list (newest last).
    /// Then it looks at the worklist again: if an item arrived, it takes itself off
    /// the list and stays running, and this returns false.
    fn go_idle<T>(
        &mut self,
        counts: &Counts,
        worklist: &Worklist<T>,
        index: usize,
        last_cpu: usize,
    ) -> bool {
        // Decrement, fence, then the length: pairs with a queuer's push, fence, then
        // its load of `running` (`PoolCore::kick`).
        counts.running.fetch_sub(1, SeqCst);
        seqcst_pair_fence();
        if worklist.len() > 0 {
            counts.running.fetch_add(1, SeqCst);
            return false;
        }
        if let Some(slot) = self.slots[index].as_mut() {
            slot.woken = false;
            slot.idle_since = Instant::now();
            slot.last_cpu = last_cpu;
        }
        self.idle.push_back(index);
        counts.idle.store(self.idle.len(), SeqCst);
        true
    }
}

/// Everything the pool lock guards (all L).
#[derive(Default)]
pub(crate) struct PoolState {
    /// Idle workers' slot indices, oldest first; the newest is woken first (LIFO).
    idle: VecDeque<usize>,
    /// Workers by slot index; `None` marks a free slot.
    slots: Vec<Option<WorkerSlot>>,
    /// Workers alive or being started.
    nr_workers: usize,
    /// Set when the last handle is dropped: workers exit.
    shutdown: bool,
    /// Workers out of `Counts::running` for a long item (`intensive.rs`), at most the
    /// pool's concurrency (`policy::may_leave_count`).
    out_for_long_items: usize,
}

/// A pool: one worklist and its workers, for one pod.
pub(crate) struct PoolCore {
    /// I: process-unique id.
    pub(crate) id: u64,
    /// I: what makes this pool different from others.
    pub(crate) key: PoolKey,
    /// I: the topology CPU numbers refer to (for locality statistics).
    #[cfg_attr(not(feature = "stats"), allow(dead_code))]
    pub(crate) topology: Arc<Topology>,
    /// I: real CPUs workers may run on (the pod if strict, the wq cpumask otherwise).
    allowed: CpuSet,
    /// I: real CPUs of the pod (repatriation target).
    pod_real: CpuSet,
    /// I: the virtual CPU a worker running on real CPU `r` counts as.
    virt_of_real: Vec<usize>,
    /// I: how many workers may run items at once.
    concurrency: usize,
    /// I: idle time after which surplus workers exit.
    idle_timeout: Duration,
    // The three parts every item touches each have lines of their own: packed with one
    // another and with the read-only fields, a queuer's push invalidated what a worker
    // on another CPU was reading (spawn on `cpu` 5–10% slower once the worklist grew
    // by a pointer; padded, the open loop ran 1–11% faster in alternating sets).
    /// L: the pool lock.
    state: CachePadded<Mutex<PoolState>>,
    /// K, A: runnable items (a lock-free ring and, for what it cannot take, their own
    /// lock: `worklist.rs`).
    worklist: CachePadded<Worklist<Entry>>,
    /// A: counts readable without the pool lock.
    counts: CachePadded<Counts>,
    /// A: counters.
    pub(crate) stats: PoolCounters,
    /// J: join handles of started workers.
    joins: unmodelled::Mutex<Vec<JoinHandle<()>>>,
    /// I: how its workers are made (names, stack size, start/stop hooks).
    threads: Arc<crate::threads::ThreadOptions>,
}

/// What to do once the pool lock is released.
enum Action {
    Nothing,
    Unpark(thread::Thread),
    Spawn(usize),
}

impl Pool {
    pub(crate) fn new(
        id: u64,
        key: PoolKey,
        topology: Arc<Topology>,
        map: &CpuMap,
        idle_timeout: Duration,
        threads: Arc<crate::threads::ThreadOptions>,
    ) -> Pool {
        let pod = key.pod.clone();
        let mask = key.cpumask.clone().unwrap_or_else(|| pod.clone());
        let pod_real = map.reals(&pod);
        let concurrency = key.concurrency();
        let allowed = map.reals(key.allowed_cpus());
        let virt_of_real = map.virtual_table(&pod, &mask, pod.first().unwrap_or(0));
        Pool {
            core: Arc::new(PoolCore {
                id,
                concurrency,
                key,
                topology,
                allowed,
                pod_real,
                virt_of_real,
                idle_timeout,
                state: CachePadded::new(Mutex::new(PoolState::default())),
                worklist: CachePadded::new(Worklist::for_pod(concurrency)),
                counts: CachePadded::default(),
                stats: PoolCounters::default(),
                joins: unmodelled::Mutex::new(Vec::new()),
                threads,
            }),
        }
    }
}

impl Drop for Pool {
    /// Stops the workers; they exit once idle. Joining is left to
    /// [`PoolCore::join_if_stopped`], called by workqueue teardown: a pool's last
    /// handle may be dropped on one of its own workers or under a lock.
    fn drop(&mut self) {
        let core = &self.core;
        let idle: Vec<thread::Thread> = {
            let mut st = lock(&core.state);
            st.shutdown = true;
            st.idle
                .iter()
                .filter_map(|&i| st.slots[i].as_ref().and_then(|s| s.thread.clone()))
                .collect()
        };
        for t in idle {
            t.unpark();
        }
    }
}

impl PoolCore {
    /// Joins the workers if the pool was stopped (no handle left), except the caller.
    pub(crate) fn join_if_stopped(&self) {
        if !lock(&self.state).shutdown {
            return;
        }
        let me = std::thread::current().id();
        let joins = std::mem::take(&mut *lock_std(&self.joins));
        for handle in joins {
            if handle.thread().id() != me {
                let _ = handle.join();
            }
        }
    }

    /// Appends activated items (an activation turn) to the worklist in one acquisition,
    /// without a kick: the caller kicks once it has released the pwq lock. Returns false
    /// when it handed them to the calling thread's batch instead: on a one-CPU pod whose
    /// worklist is empty, when the caller is this pool's worker between two items and
    /// its batch holds less than a full batch (so that no more than about a batch waits
    /// out of the worklist's reach), unless the pool takes items one at a time after a
    /// long one (`intensive.rs`). That worker is the only one the pod may run and
    /// nothing older waits, so the push and the take that would follow it only copied
    /// the items twice and took the worklist lock twice (a flood on `cpu` activates
    /// half its items on the pool of the worker that freed the slots).
    pub(crate) fn push_many(&self, entries: impl ExactSizeIterator<Item = Entry>) -> bool {
        let entries = entries.inspect(crate::trace::activate_work);
        if self.concurrency == 1
            && self.worklist.len() == 0
            && !self.one_at_a_time()
            && context::works_between_items_for(self)
            && BATCH.with(|b| b.borrow().len()) < policy::MAX_BATCH
        {
            BATCH.with(|b| b.borrow_mut().extend(entries));
            return false;
        }
        self.worklist.push_many(entries, &self.stats.enqueue_lock);
        true
    }

    /// Appends an active item to the worklist. The pool lock is not taken: this returns
    /// the pool to kick ([`PoolCore::wake_or_start`], once the caller's locks are
    /// released) only when the counts read without the lock say a worker may need
    /// waking or creating (`policy::kick` on them, then again under the lock). The
    /// caller keeps the pool alive until then.
    #[must_use]
    pub(crate) fn push(self: &Arc<Self>, entry: Entry) -> Option<Arc<PoolCore>> {
        crate::trace::activate_work(&entry);
        self.worklist.push(entry, &self.stats.enqueue_lock);
        self.kick_wanted().then(|| Arc::clone(self))
    }

    /// Kicks the pool if the counts read without the lock say so.
    pub(crate) fn kick(self: &Arc<Self>) {
        if self.kick_wanted() {
            self.wake_or_start();
        }
    }

    /// Whether a worker may need waking or creating, from the counts read without the
    /// pool lock.
    fn kick_wanted(&self) -> bool {
        kick_wanted(&self.counts, &self.worklist, self.concurrency)
    }

    /// Under the pool lock, wakes or starts a worker if one is needed.
    pub(crate) fn wake_or_start(self: &Arc<Self>) {
        let mut st = lock(&self.state);
        let action = self.kick_locked(&mut st);
        drop(st);
        self.act(action);
    }

    /// Workers now and idle workers now.
    pub(crate) fn worker_counts(&self) -> (usize, usize) {
        let st = lock(&self.state);
        (st.nr_workers, st.idle.len())
    }

    /// Workers counted as running now (`Counts::running`), and workers out of that
    /// count for a long item.
    pub(crate) fn running_workers(&self) -> (usize, usize) {
        let st = lock(&self.state);
        (self.counts.running.load(SeqCst), st.out_for_long_items)
    }

    /// The load under the pool lock ([`PoolState::load`]).
    fn load(&self, st: &PoolState) -> PoolLoad {
        st.load(&self.counts, &self.worklist, self.concurrency)
    }

    /// Decides (under the lock) whether to wake or start a worker, and does it.
    fn kick_locked(&self, st: &mut PoolState) -> Action {
        let (action, repatriating) = st.kick(
            &self.counts,
            &self.worklist,
            self.concurrency,
            &self.key,
            || rescue::cooling(self.id),
        );
        if repatriating {
            // The workqueue's count is the woken worker's to charge (`worker.rs`).
            self.stats.items.inc(Item::Repatriated);
        }
        action
    }

    fn act(self: &Arc<Self>, action: Action) {
        match action {
            Action::Nothing => {}
            Action::Unpark(t) => t.unpark(),
            Action::Spawn(index) => self.spawn_worker(index),
        }
    }

    fn spawn_worker(self: &Arc<Self>, index: usize) {
        let core = Arc::clone(self);
        let builder = self.threads.worker(self.id, index);
        match crate::fault::spawn_worker_thread(builder, move || worker::worker_main(core, index)) {
            Ok(handle) => {
                self.stats.workers_created.inc();
                lock_std(&self.joins).push(handle);
            }
            Err(e) => self.spawn_failed(index, e),
        }
    }

    /// The CPU (workqueue topology numbering) a worker of this pool runs on now.
    pub(crate) fn worker_cpu(&self) -> usize {
        let real = cpu::real_cpu();
        self.virt_of_real
            .get(real)
            .copied()
            .unwrap_or_else(|| self.key.pod.first().unwrap_or(0))
    }

    /// A `blocking()` section starts on a worker of this pool: the items it took and
    /// has not started go back to the worklist, and it stops counting as running, so
    /// another worker may be woken or started for them.
    fn enter_blocking(self: &Arc<Self>) {
        // What this item waits for may need the slots, or the flush accounting, of
        // items this worker finished before it.
        context::settle_completions();
        let mut st = lock(&self.state);
        // A worker the watchdog took out of the count for a long item is out already.
        if crate::busy::enter_blocking() {
            st.out_for_long_items -= 1;
        } else {
            self.counts.running.fetch_sub(1, SeqCst);
        }
        // Under the pool lock, once out of the watchdog's reach: a demotion may have
        // taken the batch before (`intensive.rs`), none can now.
        BATCH.with(|b| self.worklist.push_front_all(&mut b.borrow_mut()));
        let action = self.kick_locked(&mut st);
        drop(st);
        self.act(action);
    }

    fn leave_blocking(&self) {
        let st = lock(&self.state);
        crate::busy::leave_blocking();
        self.counts.running.fetch_add(1, SeqCst);
        drop(st);
        // The item runs on, counted: the watchdog must look at it.
        intensive::worker_active();
    }
}

/// Runs `f`, telling the pool of the calling worker (if it is one) that it blocks, so
/// that the pool may wake or start another worker for waiting items. Outside a worker
/// it just runs `f`.
///
/// The kernel sees a worker sleep; user space does not, and podq runs at most one worker
/// per pod CPU, so an item that waits (I/O, locks, joins) should wrap the wait in
/// `blocking`. podq's own waits (`join`, `wait_timeout`, `flush`, `cancel_sync`,
/// `drain`) do so already.
///
/// ```
/// use std::time::Duration;
///
/// let wq = podq::Workqueue::builder("doc-io").build()?;
/// // Without `blocking`, these sleeps would take turns on the pool's few workers.
/// let reads: Vec<_> = (0..4)
///     .map(|i| {
///         wq.spawn(move || {
///             let bytes = podq::blocking(|| {
///                 std::thread::sleep(Duration::from_millis(10)); // stands for a read
///                 512 * i
///             });
///             bytes + 1
///         })
///     })
///     .collect();
/// let total: usize = reads.into_iter().map(|r| r.join().unwrap()).sum();
/// assert_eq!(total, 512 * 6 + 4);
/// # Ok::<(), podq::Error>(())
/// ```
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    struct Leave(Arc<PoolCore>);
    impl Drop for Leave {
        fn drop(&mut self) {
            BLOCKING_DEPTH.with(|d| d.set(d.get() - 1));
            self.0.leave_blocking();
        }
    }
    let pool = WORKER_POOL.with(|p| p.borrow().clone());
    let Some(pool) = pool else {
        return f();
    };
    if BLOCKING_DEPTH.with(Cell::get) > 0 {
        return f();
    }
    BLOCKING_DEPTH.with(|d| d.set(1));
    pool.enter_blocking();
    let _leave = Leave(pool);
    f()
}

/// Loom model of the sleep/wake protocol on the real `Worklist`, `kick_wanted`,
/// `PoolState::kick` (with `policy::kick` and `policy::pick_idle`), `PoolState::go_idle`,
/// `PoolState::wake_at`, `spin` and `sleep_once`:
/// `RUSTFLAGS="--cfg loom" cargo test -p podq --release --lib loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::worker::{sleep_once, spin};
    use super::*;
    use worklist::Plain;

    /// A strict one-CPU pool (concurrency 1).
    fn one_cpu_key() -> PoolKey {
        PoolKey {
            topology: 0,
            pod: CpuSet::single(0),
            strict: true,
            nice: 0,
            cpumask: None,
            idle_timeout: Duration::from_secs(1),
        }
    }

    /// `PoolCore::push` then its kick, on the same calls: push, decide on the counts
    /// without the lock, and only then lock, decide again and wake.
    fn queue(state: &Mutex<PoolState>, counts: &Counts, list: &Worklist<u32>, item: u32) {
        list.push(item, &Plain);
        if !kick_wanted(counts, list, 1) {
            return;
        }
        let mut st = lock(state);
        let (action, _) = st.kick(counts, list, 1, &one_cpu_key(), || false);
        drop(st);
        match action {
            Action::Nothing => {}
            Action::Unpark(t) => t.unpark(),
            Action::Spawn(_) => panic!("a one-CPU pool with its worker never creates another"),
        }
    }

    /// One worker (running, as a pool's first worker is) takes batches, spins and goes
    /// idle while a queuer pushes two items without the pool lock, skipping the wake-up
    /// whenever the lock-free counts say the worker runs or spins. The worker always
    /// gets both items, never sleeping through a wake-up (loom reports a deadlock if it
    /// does).
    #[test]
    fn loom_no_lost_wake_up() {
        loom::model(|| {
            let state = std::sync::Arc::new(Mutex::new(PoolState::default()));
            let counts = std::sync::Arc::new(Counts::default());
            let list = std::sync::Arc::new(Worklist::<u32>::with_capacity(2));
            {
                let mut st = lock(&*state);
                st.slots.push(Some(WorkerSlot {
                    thread: None,
                    last_cpu: 0,
                    idle_since: Instant::now(),
                    woken: false,
                    repatriate: false,
                }));
                st.nr_workers = 1;
                counts.workers.store(1, SeqCst);
                counts.running.store(1, SeqCst);
            }
            let worker = {
                let (state, counts, list) = (state.clone(), counts.clone(), list.clone());
                loom::thread::spawn(move || {
                    lock(&*state).slots[0].as_mut().unwrap().thread = Some(thread::current());
                    let mut got = Fifo::new();
                    let mut spun = false;
                    while got.len() < 2 {
                        if list.take_batch(|n| policy::batch_take(n, 1), &mut got, &Plain) > 0 {
                            spun = false;
                            continue;
                        }
                        if !spun {
                            spun = true;
                            spin(&counts, &list, policy::IDLE_SPIN, false, 2);
                            continue;
                        }
                        let mut st = lock(&*state);
                        if !st.go_idle(&counts, &list, 0, 0) {
                            continue;
                        }
                        drop(st);
                        loop {
                            let (guard, woken) = sleep_once(&state, 0, Duration::from_secs(1));
                            if woken {
                                break;
                            }
                            drop(guard);
                        }
                    }
                    assert_eq!(got, [1, 2]);
                })
            };
            queue(&state, &counts, &list, 1);
            queue(&state, &counts, &list, 2);
            worker.join().unwrap();
        });
    }
}

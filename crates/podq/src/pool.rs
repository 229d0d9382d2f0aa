//! Worker pools and their workers. Sleep/wake protocol and worklist: `pool/README.md`.
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

use podq_topology::{CpuSet, Topology};

use crate::attrs::PoolKey;
use crate::cpu::{self, CpuMap};
use crate::policy::{self, Kick, PoolLoad};
use crate::stats::{PoolCounters, Recorder, WorkerCounters};
use std::sync::Arc;

use crate::context::{self, BATCH, BLOCKING_DEPTH, COMPLETIONS, WORKER_POOL};
use crate::sync::Ordering::SeqCst;
use crate::sync::{fence, lock, lock_std, thread, AtomicUsize, Mutex, MutexGuard};
use crate::trace;
use crate::work::{Entry, EntryMeta, Start, Task};

mod rescue;
mod watch;
mod worklist;
pub(crate) use crate::context::{current_wq, running_work};
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

impl PoolState {
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
        fence(SeqCst);
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

/// Sleep/wake, sleeper side (after `go_idle`, lock released): parks once and returns
/// the lock and whether a waker marked worker `index` woken. `false` means a timeout or
/// a spurious wake-up; the caller decides whether to park again.
fn sleep_once(
    state: &Mutex<PoolState>,
    index: usize,
    timeout: Duration,
) -> (MutexGuard<'_, PoolState>, bool) {
    thread::park_timeout(timeout);
    let st = lock(state);
    let woken = st.slots[index].as_ref().is_some_and(|s| s.woken);
    (st, woken)
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
    /// L: the pool lock.
    state: Mutex<PoolState>,
    /// K: runnable items (their own lock).
    worklist: Worklist<Entry>,
    /// A: counts readable without the pool lock.
    counts: Counts,
    /// A: counters.
    pub(crate) stats: PoolCounters,
    /// J: join handles of started workers.
    joins: std::sync::Mutex<Vec<JoinHandle<()>>>,
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
        let allowed = map.reals(key.allowed_cpus());
        let virt_of_real = map.virtual_table(&pod, &mask, pod.first().unwrap_or(0));
        Pool {
            core: Arc::new(PoolCore {
                id,
                concurrency: key.concurrency(),
                key,
                topology,
                allowed,
                pod_real,
                virt_of_real,
                idle_timeout,
                state: Mutex::new(PoolState::default()),
                worklist: Worklist::default(),
                counts: Counts::default(),
                stats: PoolCounters::default(),
                joins: std::sync::Mutex::new(Vec::new()),
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

    /// Appends activated items to the worklist in one acquisition, without a kick: the
    /// caller kicks once it has released the pwq lock.
    pub(crate) fn push_many(&self, entries: impl ExactSizeIterator<Item = Entry>) {
        let entries = entries.inspect(crate::trace::activate_work);
        self.worklist.push_many(entries, &self.stats.enqueue_lock);
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
        // Push, fence, then the counts: pairs with `go_idle` and the spinner's exit
        // (their write, a fence, then the length).
        fence(SeqCst);
        policy::kick(self.load_unlocked()) != Kick::Nothing
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

    /// The load as queuers see it without the lock.
    fn load_unlocked(&self) -> PoolLoad {
        self.counts.load(self.worklist.len(), self.concurrency)
    }

    /// The load under the pool lock (`running` and `spinning` change under it too,
    /// except for the sleeper's undo in `go_idle`, which only adds a running worker).
    fn load(&self, st: &PoolState) -> PoolLoad {
        PoolLoad {
            worklist: self.worklist.len(),
            idle: st.idle.len(),
            running: self.counts.running.load(SeqCst),
            workers: st.nr_workers,
            concurrency: self.concurrency,
            spinning: self.counts.spinning.load(SeqCst),
        }
    }

    /// Decides (under the lock) whether to wake or start a worker.
    fn kick_locked(&self, st: &mut PoolState) -> Action {
        match policy::kick_cooled(policy::kick(self.load(st)), || rescue::cooling(self.id)) {
            Kick::Nothing => Action::Nothing,
            Kick::Wake => {
                let last_cpu = |i: usize| st.slots[st.idle[i]].as_ref().map_or(0, |s| s.last_cpu);
                let pick =
                    policy::pick_idle(st.idle.len(), last_cpu, &self.key.pod, self.key.strict);
                let Some((at, repatriate)) = pick else {
                    return Action::Nothing;
                };
                if repatriate {
                    // Charged, as in the kernel, to the workqueue of the first waiting item.
                    self.stats.items.repatriated.inc();
                    let mut first = true;
                    self.worklist.for_each(|e| {
                        if std::mem::take(&mut first) {
                            e.meta.pwq.wq.counters.repatriated.inc();
                        }
                    });
                }
                st.wake_at(&self.counts, at, repatriate)
                    .map_or(Action::Nothing, Action::Unpark)
            }
            Kick::Create => {
                let slot = WorkerSlot {
                    thread: None,
                    last_cpu: self.key.pod.first().unwrap_or(0),
                    idle_since: Instant::now(),
                    woken: false,
                    repatriate: false,
                };
                let index = match st.slots.iter().position(Option::is_none) {
                    Some(i) => {
                        st.slots[i] = Some(slot);
                        i
                    }
                    None => {
                        st.slots.push(Some(slot));
                        st.slots.len() - 1
                    }
                };
                st.nr_workers += 1;
                self.counts.workers.store(st.nr_workers, SeqCst);
                self.counts.running.fetch_add(1, SeqCst);
                Action::Spawn(index)
            }
        }
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
        match crate::fault::spawn_worker_thread(builder, move || worker_main(core, index)) {
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
        BATCH.with(|b| self.worklist.push_front_all(&mut b.borrow_mut()));
        // What this item waits for may need the slots, or the flush accounting, of
        // items this worker finished before it.
        context::settle_completions();
        let mut st = lock(&self.state);
        self.counts.running.fetch_sub(1, SeqCst);
        let action = self.kick_locked(&mut st);
        drop(st);
        self.act(action);
    }

    fn leave_blocking(&self) {
        let _st = lock(&self.state);
        self.counts.running.fetch_add(1, SeqCst);
    }
}

/// Runs `f`, telling the pool of the calling worker (if it is one) that it blocks, so
/// that the pool may wake or start another worker for waiting items. Outside a worker
/// it just runs `f`.
///
/// The kernel sees a worker sleep; user space does not, and podq runs at most one worker
/// per pod CPU, so an item that waits (I/O, locks, joins) should wrap the wait in
/// `blocking`. podq's own waits (`join`, `flush`, `cancel_sync`, `drain`) do so already.
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

fn worker_main(pool: Arc<PoolCore>, index: usize) {
    let mine = pool.stats.register_worker();
    work_loop(&pool, index, &mine);
    pool.stats.retire_worker(&mine);
}

/// A worker's life in its pool; `mine` (W) takes its accounting.
fn work_loop(pool: &Arc<PoolCore>, index: usize, mine: &WorkerCounters) {
    if cpu::set_affinity(&pool.allowed).is_err() {
        pool.stats.affinity_failures.inc();
    }
    if pool.key.nice != 0 && cpu::set_nice(pool.key.nice).is_err() {
        pool.stats.nice_failures.inc();
    }
    let _stopping = pool.threads.started(Some(pool.id), index, &pool.allowed);
    WORKER_POOL.with(|p| *p.borrow_mut() = Some(Arc::clone(pool)));
    COMPLETIONS.with(|c| c.borrow_mut().set_deferring(true));
    let mut cpu_clock = thread_cpu_ns();
    if let Some(slot) = lock(&pool.state).slots[index].as_mut() {
        slot.thread = Some(thread::current());
    }
    // Whether the worker polled the worklist since it last ran an item.
    let mut spun = false;
    loop {
        if let Some(entry) = BATCH.with(|b| b.borrow_mut().pop_front()) {
            run_entry(pool, entry, Some(mine));
            spun = false;
            continue;
        }
        // The batch is done: account its items before taking more or going idle.
        context::settle_completions();
        if take_batch(pool, mine) {
            continue;
        }
        if let policy::IdleStep::Spin(budget) = policy::idle_step(spun, policy::IDLE_SPIN) {
            spun = true;
            spin(&pool.counts, &pool.worklist, budget);
            continue; // the worklist is checked again
        }
        let mut st = lock(&pool.state);
        if st.shutdown {
            // Shutdown with an empty worklist (the last handle is gone, so no pwq can
            // queue).
            st.slots[index] = None;
            st.nr_workers -= 1;
            pool.counts.workers.store(st.nr_workers, SeqCst);
            pool.counts.running.fetch_sub(1, SeqCst);
            break;
        }
        if !st.go_idle(&pool.counts, &pool.worklist, index, pool.worker_cpu()) {
            continue; // an item arrived meanwhile
        }
        drop(st);
        let now = thread_cpu_ns();
        pool.stats.cpu_time_ns.add(now.saturating_sub(cpu_clock));
        cpu_clock = now;
        match idle(pool, index) {
            Some(repatriate) => {
                if repatriate {
                    // Narrow to the pod so the scheduler moves us there, then widen
                    // again: the kernel's wake_cpu nudge, paid by the woken worker.
                    let _ = cpu::set_affinity(&pool.pod_real);
                    let _ = cpu::set_affinity(&pool.allowed);
                }
            }
            None => break,
        }
    }
    let now = thread_cpu_ns();
    pool.stats.cpu_time_ns.add(now.saturating_sub(cpu_clock));
    COMPLETIONS.with(|c| c.borrow_mut().set_deferring(false));
    WORKER_POOL.with(|p| *p.borrow_mut() = None);
}

/// Takes this worker's share of the worklist into its batch (`policy::batch_take`) and,
/// if items are left, kicks the pool so wake-ups chain as in the kernel. Returns whether
/// it took any.
fn take_batch(pool: &Arc<PoolCore>, mine: &WorkerCounters) -> bool {
    let took = BATCH.with(|b| {
        pool.worklist.take_batch(
            |waiting| policy::batch_take(waiting, pool.concurrency),
            &mut b.borrow_mut(),
            &pool.stats.dequeue_lock.owned(mine.dequeue_acquisition()),
        )
    });
    if took == 0 {
        return false;
    }
    if pool.worklist.len() > 0 {
        pool.kick();
    }
    true
}

/// Sleep/wake, spinner side (after finding the worklist empty): counts the worker
/// spinning, polls the worklist length for at most `budget` ([`policy::idle_step`]), and stops
/// counting as spinning. Queuers skip the wake-up for items a spinner will take
/// (`policy::kick`), so the caller must look at the worklist again before going idle.
fn spin<T>(counts: &Counts, worklist: &Worklist<T>, budget: Duration) {
    counts.spinning.fetch_add(1, SeqCst);
    poll_worklist(worklist, budget);
    // Decrement, fence, then the caller's look at the worklist: pairs with a queuer's
    // push, fence, then its load of `spinning`.
    counts.spinning.fetch_sub(1, SeqCst);
    fence(SeqCst);
}

/// Polls the worklist until it holds an item or `budget` passes: a few pause loops,
/// then yields, so a producer on the same CPU gets to run.
#[cfg(not(loom))]
fn poll_worklist<T>(worklist: &Worklist<T>, budget: Duration) {
    const PAUSES: u32 = 64;
    let deadline = Instant::now() + budget;
    let mut rounds = 0u32;
    while worklist.len() == 0 {
        if rounds < PAUSES {
            std::hint::spin_loop();
            rounds += 1;
        } else if Instant::now() < deadline {
            std::thread::yield_now();
        } else {
            return;
        }
    }
}

/// The loom stand-in: one look and a yield (loom has no clock; any bound will do,
/// since the caller looks again).
#[cfg(loom)]
fn poll_worklist<T>(worklist: &Worklist<T>, _budget: Duration) {
    if worklist.len() == 0 {
        loom::thread::yield_now();
    }
}

/// Sleeps on the idle list until woken (returns whether to repatriate) or until reaped
/// or shut down (returns `None`; the worker has left the pool).
fn idle(pool: &PoolCore, index: usize) -> Option<bool> {
    loop {
        let (mut st, woken) = sleep_once(&pool.state, index, pool.idle_timeout);
        let slot = st.slots[index].as_ref().expect("a worker's own slot");
        if woken {
            return Some(slot.repatriate);
        }
        let idle = policy::IdleWorkers {
            idle: st.idle.len(),
            workers: st.nr_workers,
            oldest_idle_for: slot.idle_since.elapsed(),
        };
        let position = st.idle.iter().position(|&i| i == index);
        let reap = position.is_some() && policy::reap(idle, pool.idle_timeout) == position;
        if st.shutdown || reap {
            st.idle.retain(|&i| i != index);
            pool.counts.idle.store(st.idle.len(), SeqCst);
            st.slots[index] = None;
            st.nr_workers -= 1;
            pool.counts.workers.store(st.nr_workers, SeqCst);
            if reap {
                pool.stats.workers_reaped.inc();
            }
            drop(st);
            if reap {
                // Nobody will join a reaped worker: detach it.
                let me = std::thread::current().id();
                lock_std(&pool.joins).retain(|h| h.thread().id() != me);
            }
            return None;
        }
    }
}

/// Runs one entry taken off a worklist by a worker of `pool` (`mine`: its counters; `None`
/// for a rescuer).
fn run_entry(pool: &Arc<PoolCore>, entry: Entry, mine: Option<&WorkerCounters>) {
    let Entry { task, meta } = entry;
    let (work, mut seq) = match task {
        Task::Once(task) => {
            let traced = trace::execute_start(trace::Item::Once(&task), &meta, pool);
            execute(pool, mine, &meta, 0, || task.run());
            trace::execute_end(traced);
            return context::complete(meta);
        }
        Task::Work { work, seq } => (work, seq),
    };
    let mut meta = meta;
    loop {
        match work.state.start(seq) {
            Start::Stale => return discard(meta),
            Start::Run => break,
            Start::Busy => {
                let entry = Entry {
                    task: Task::Work {
                        work: Arc::clone(&work),
                        seq,
                    },
                    meta,
                };
                // What comes back (this entry, or one it displaced from the slot,
                // possibly of another instance and pwq) is taken through `start` again.
                let Some(back) = work.state.hand_off(entry) else {
                    return;
                };
                let Task::Work { seq: back_seq, .. } = back.task else {
                    unreachable!("only work entries are handed off")
                };
                seq = back_seq;
                meta = back.meta;
            }
        }
    }
    let addr = Arc::as_ptr(&work) as usize;
    loop {
        let traced = trace::execute_start(trace::Item::Work(&work), &meta, pool);
        execute(pool, mine, &meta, addr, || work.run());
        trace::execute_end(traced);
        context::complete(meta);
        loop {
            let Some(next) = work.state.finish() else {
                return;
            };
            let Entry {
                task,
                meta: next_meta,
            } = next;
            let Task::Work { seq: next_seq, .. } = task else {
                unreachable!("only work entries are handed off")
            };
            if work.state.restart(next_seq) {
                meta = next_meta;
                break;
            }
            discard(next_meta);
        }
    }
}

/// Drops an entry whose instance was cancelled or superseded.
fn discard(meta: EntryMeta) {
    meta.pwq.pool.core.stats.items.cancelled.inc();
    meta.pwq.wq.counters.cancelled.inc();
    context::complete(meta);
}

/// Runs `f` for an entry on the calling worker of `pool`, with its accounting: into
/// `mine` when the entry belongs to `pool` (a handed-off item may belong to another).
fn execute(
    pool: &PoolCore,
    mine: Option<&WorkerCounters>,
    meta: &EntryMeta,
    work_addr: usize,
    f: impl FnOnce() -> Option<String>,
) {
    let owner = &meta.pwq.pool.core;
    let record = match mine {
        Some(w) if std::ptr::eq(Arc::as_ptr(owner), pool) => Recorder::Worker(w),
        _ => Recorder::Shared(&owner.stats),
    };
    let wq = &meta.pwq.wq;
    let cpu = pool.worker_cpu();
    cpu::set_thread_cpu(Some(cpu));
    record.started();
    wq.counters.started.inc();
    // Two clock reads per measured item (`stats/sample.rs`): the start (also the
    // end of the queue-to-start wait) and the end; none for the others.
    #[cfg(feature = "stats")]
    let start = {
        record.locality(policy::locality(
            &owner.topology,
            meta.queued_cpu as usize,
            cpu,
        ));
        meta.queued_at.map(|queued| {
            let start = Instant::now();
            record.queue_to_start(queued.ns_until(start));
            start
        })
    };
    context::set_running(wq.id, work_addr);
    let running = crate::current::Running::new(wq, pool.id);
    let panicked = f();
    drop(running);
    #[cfg(feature = "stats")]
    if let Some(start) = start {
        record.run_time(crate::stats::elapsed_ns(start));
    }
    context::set_running(0, 0);
    record.completed();
    wq.counters.completed.inc();
    if let Some(message) = panicked {
        owner.stats.items.panicked.inc();
        wq.counters.panicked.inc();
        wq.report_panic(&message);
    }
}

/// CPU time of the calling thread (0 if unavailable).
fn thread_cpu_ns() -> u64 {
    #[cfg(feature = "stats")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        if rc == 0 {
            return u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000
                + u64::try_from(ts.tv_nsec).unwrap_or(0);
        }
    }
    0
}

/// Loom model of the sleep/wake protocol on the real `Worklist`, `spin`,
/// `PoolState::go_idle`, `PoolState::wake_at`, `sleep_once`, `Counts::load` and
/// `policy::kick`: `RUSTFLAGS="--cfg loom" cargo test -p podq --release --lib loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use worklist::Plain;

    /// The queuer's side of `PoolCore::push`: push, decide on the counts without the
    /// lock, and only then lock and wake the newest idle worker.
    fn queue(state: &Mutex<PoolState>, counts: &Counts, list: &Worklist<u32>, item: u32) {
        list.push(item, &Plain);
        fence(SeqCst);
        if policy::kick(counts.load(list.len(), 1)) == Kick::Nothing {
            return;
        }
        let mut st = lock(state);
        let to_wake = match policy::kick(counts.load(list.len(), 1)) {
            Kick::Wake => {
                let at = st.idle.len() - 1;
                st.wake_at(counts, at, false)
            }
            _ => None,
        };
        drop(st);
        if let Some(t) = to_wake {
            t.unpark();
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
            let list = std::sync::Arc::new(Worklist::<u32>::default());
            {
                let mut st = lock(&state);
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
                    lock(&state).slots[0].as_mut().unwrap().thread = Some(thread::current());
                    let mut got = VecDeque::new();
                    let mut spun = false;
                    while got.len() < 2 {
                        if list.take_batch(|n| policy::batch_take(n, 1), &mut got, &Plain) > 0 {
                            spun = false;
                            continue;
                        }
                        if !spun {
                            spun = true;
                            spin(&counts, &list, policy::IDLE_SPIN);
                            continue;
                        }
                        let mut st = lock(&state);
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

//! Failed worker creation: the cooldown retry (the kernel's manager with
//! `CREATE_COOLDOWN`) and the mayday to rescuers (`WQ_MEM_RECLAIM`).
//!
//! # Protocol
//! States of a pool: *fine*; *blocked* (a creation failed while the pool wanted a worker:
//! it is on the manager's list with a retry time and a mayday time); back to *fine* when
//! a retry succeeds or finds no worker wanted.
//!
//! 1. A worker spawn fails (`spawn_failed`): the slot is freed, `worker_spawn_failures`
//!    counted, the error hook called; if the pool still wants a worker
//!    (`policy::needs_worker`), it is blocked (`policy::block_creation`): retry after
//!    the create cooldown, mayday after `policy::MAYDAY_INITIAL_TIMEOUT`.
//! 2. While blocked, queue calls that would create a worker do not (`cooling`,
//!    `policy::kick_cooled`): no
//!    thread-creation storm at a limit. Waking idle workers is unaffected.
//! 3. Mayday (manager thread, then every `policy::MAYDAY_INTERVAL`: `CreateBlock::due`):
//!    for every workqueue with an item on the worklist that has a rescuer
//!    (`policy::mayday_targets`), put the pool on the rescuer's list once and unpark it
//!    (`maydays` counted).
//! 4. The rescuer takes the pool's items of its own workqueue, oldest first, and runs
//!    them on its thread with the pool's CPU affinity (`rescued` counted), while the pool
//!    still wants a worker; after `policy::RESCUER_BATCH` it goes to the back of its line
//!    (`policy::rescue_step`).
//! 5. Retry (manager, at the cooldown): the pool leaves the list and is kicked; a new
//!    failure goes back to step 1, a success leaves it fine.
//!
//! Races considered:
//! - A failure reported while the pool is already blocked: `block` keeps the earlier
//!   entry (one retry per cooldown).
//! - Items queued between the failure and `block`: their kick finds the pool not yet
//!   cooling and tries to create (and may fail: step 1 again). Never a lost item: a
//!   pool with waiting items and no worker is always on the list.
//! - A rescuer and a newly created worker both take items: each entry is removed from
//!   the worklist under the pool lock by exactly one of them.
//! - The pool is dropped while blocked: the list holds it weakly and forgets it.
//!
//! Legend: B guarded by `MANAGER.state`; U guarded by `RESCUERS`; Q guarded by
//! `Rescuer::maydays`; A atomic (ordering named at each use); I set at init.
//!
//! Lock order: pool lock → `MANAGER.state`; `RESCUERS` → `Rescuer::maydays` (taken with
//! no pool lock held).
//! The manager thread never takes a pool lock while holding its own.

use crate::sync::unmodelled::{AtomicBool, AtomicUsize, Condvar, Mutex};
use crate::sync::Ordering::SeqCst;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, OnceLock, Weak};
use std::thread;
use std::time::Instant;

use crate::cpu;
use crate::policy::{self, CreateBlock, Due, RescueStep};
use crate::sync::lock_std as lock;
use crate::threads::ThreadOptions;
use podq_topology::CpuSet;
// The pool lock: loom's mutex under `cfg(loom)`.
use crate::sync::lock as lock_pool;
use crate::Error;

use super::worker::run_entry;
use super::worklist::Worklist;
use super::{PoolCore, PoolState};
use crate::entry::Entry;

/// A pool whose worker creation failed.
struct Blocked {
    pool: Weak<PoolCore>,
    id: u64,
    /// When to retry and when to call the rescuers next.
    schedule: CreateBlock<Instant>,
}

/// The manager: one thread for the process, started with the first workqueue, so that
/// retrying never needs a new thread.
struct Manager {
    /// B: blocked pools, and whether the thread runs.
    state: Mutex<(Vec<Blocked>, bool)>,
    /// B: signalled when a pool is blocked.
    wake: Condvar,
    /// A: number of blocked pools (`SeqCst`, written under `state`; pairs with the load
    /// in `cooling`, which lets the queue path skip the lock when nothing is blocked: a
    /// stale 0 costs at most one creation attempt during a cooldown).
    count: AtomicUsize,
}

static MANAGER: Manager = Manager {
    state: Mutex::new((Vec::new(), false)),
    wake: Condvar::new(),
    count: AtomicUsize::new(0),
};

/// Starts the manager thread if it is not running.
pub(crate) fn start_manager() -> Result<(), Error> {
    let mut st = lock(&MANAGER.state);
    if st.1 {
        return Ok(());
    }
    thread::Builder::new()
        .name("podq/manager".to_owned())
        .spawn(manage)
        .map_err(|source| Error::Os {
            call: "spawn the podq/manager thread",
            source,
        })?;
    st.1 = true;
    Ok(())
}

/// Whether pool `id` is cooling down after a failed creation (called under its lock).
pub(super) fn cooling(id: u64) -> bool {
    MANAGER.count.load(SeqCst) > 0 && lock(&MANAGER.state).0.iter().any(|b| b.id == id)
}

/// Blocks creation on `pool` after a failure, if it still wants a worker (`wanted`).
fn block(pool: &Arc<PoolCore>, wanted: bool) {
    let now = Instant::now();
    let mut st = lock(&MANAGER.state);
    let blocked = st.0.iter().any(|b| b.id == pool.id);
    let cooldown = crate::fault::create_cooldown();
    let Some(schedule) = policy::block_creation(now, wanted, blocked, cooldown) else {
        return;
    };
    st.0.push(Blocked {
        pool: Arc::downgrade(pool),
        id: pool.id,
        schedule,
    });
    MANAGER.count.store(st.0.len(), SeqCst);
    drop(st);
    MANAGER.wake.notify_one();
}

fn manage() {
    let mut st = lock(&MANAGER.state);
    loop {
        let now = Instant::now();
        let mut retry = Vec::new();
        let mut mayday = Vec::new();
        // Pools are upgraded only when due, and dropped after unlocking: the last
        // reference to a pool must not be dropped under this lock.
        st.0.retain_mut(|b| {
            if b.pool.strong_count() == 0 {
                return false;
            }
            match b.schedule.due(now) {
                Due::Retry => {
                    retry.extend(b.pool.upgrade());
                    false
                }
                Due::Mayday => {
                    mayday.extend(b.pool.upgrade());
                    true
                }
                Due::Wait => true,
            }
        });
        MANAGER.count.store(st.0.len(), SeqCst);
        let next = st.0.iter().map(|b| b.schedule.next()).min();
        if !retry.is_empty() || !mayday.is_empty() {
            drop(st);
            for pool in mayday {
                pool.send_maydays();
            }
            for pool in retry {
                pool.retry_create();
            }
            st = lock(&MANAGER.state);
            continue;
        }
        st = match next {
            Some(at) => match MANAGER
                .wake
                .wait_timeout(st, at.saturating_duration_since(now))
            {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            },
            None => crate::sync::wait_std(&MANAGER.wake, st),
        };
    }
}

/// A workqueue's rescuer thread.
struct Rescuer {
    /// Q: pools that called for help, oldest first.
    maydays: Mutex<VecDeque<Arc<PoolCore>>>,
    /// A: set when the workqueue is gone (`SeqCst`; the thread exits once `maydays`
    /// is empty).
    stop: AtomicBool,
    /// I: the thread.
    thread: thread::Thread,
    /// I: the workqueue it serves.
    wq: u64,
}

/// A running rescuer and its join handle.
type Registered = (Arc<Rescuer>, Option<thread::JoinHandle<()>>);

/// U: rescuers by workqueue id.
fn rescuers() -> &'static Mutex<HashMap<u64, Registered>> {
    static RESCUERS: OnceLock<Mutex<HashMap<u64, Registered>>> = OnceLock::new();
    RESCUERS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Starts the rescuer of workqueue `wq` (`kworker/R-<name>`).
pub(crate) fn start_rescuer(
    wq: u64,
    name: &str,
    threads: &Arc<ThreadOptions>,
    cpus: CpuSet,
) -> Result<(), Error> {
    let (tx, rx) = std::sync::mpsc::channel::<Arc<Rescuer>>();
    let options = Arc::clone(threads);
    let handle = threads
        .rescuer(name)
        .spawn(move || {
            let _stopping = options.started(None, 0, &cpus);
            if let Ok(me) = rx.recv() {
                rescue_loop(&me);
            }
        })
        .map_err(|source| Error::Os {
            call: "spawn a rescuer thread",
            source,
        })?;
    let rescuer = Arc::new(Rescuer {
        maydays: Mutex::new(VecDeque::new()),
        stop: AtomicBool::new(false),
        thread: handle.thread().clone(),
        wq,
    });
    lock(rescuers()).insert(wq, (Arc::clone(&rescuer), Some(handle)));
    // The thread waits for its own handle; it cannot fail to receive it.
    let _ = tx.send(rescuer);
    Ok(())
}

/// Stops the rescuer of workqueue `wq`, if it has one, once it has answered its calls;
/// joins it unless called on it.
pub(crate) fn stop_rescuer(wq: u64) {
    let Some((rescuer, handle)) = lock(rescuers()).remove(&wq) else {
        return;
    };
    rescuer.stop.store(true, SeqCst);
    rescuer.thread.unpark();
    if let Some(handle) = handle {
        if handle.thread().id() != thread::current().id() {
            let _ = handle.join();
        }
    }
}

fn rescue_loop(me: &Rescuer) {
    loop {
        let next = lock(&me.maydays).pop_front();
        match next {
            Some(pool) => {
                if pool.rescue(me.wq) {
                    // Still stuck after a batch: go to the back of the line.
                    let mut q = lock(&me.maydays);
                    if !q.iter().any(|p| Arc::ptr_eq(p, &pool)) {
                        q.push_back(pool);
                    }
                }
            }
            // SeqCst pairs with the store in `stop_rescuer`, made before its unpark.
            None if me.stop.load(SeqCst) => return,
            None => thread::park(),
        }
    }
}

impl PoolCore {
    /// A worker could not be created: frees its slot, counts and reports the failure,
    /// and, if the pool still wants a worker, blocks creation for the cooldown and
    /// schedules the retry and the mayday.
    pub(super) fn spawn_failed(self: &Arc<Self>, index: usize, source: std::io::Error) {
        self.stats.worker_spawn_failures.inc();
        let (wanted, hooks, process_wide) = {
            let mut st = lock_pool(&self.state);
            st.slots[index] = None;
            st.nr_workers -= 1;
            self.counts.workers.store(st.nr_workers, SeqCst);
            self.counts.running.fetch_sub(1, SeqCst);
            let (hooks, process_wide) = waiting_hooks(&self.worklist);
            (!st.shutdown && needs_worker(self, &st), hooks, process_wide)
        };
        let error = Error::Os {
            call: "spawn a worker thread",
            source,
        };
        crate::fault::report_error(&hooks, process_wide, self.id, &self.key.pod, &error);
        block(self, wanted);
    }

    /// The cooldown is over: kicks the pool, creating a worker if one is still wanted
    /// (a new failure blocks it again).
    fn retry_create(self: &Arc<Self>) {
        let mut st = lock_pool(&self.state);
        if st.shutdown {
            return;
        }
        let action = self.kick_locked(&mut st);
        drop(st);
        self.act(action);
    }

    /// Calls the rescuers of the workqueues with items on the worklist.
    fn send_maydays(self: &Arc<Self>) {
        let worklist: Vec<u64> = {
            let st = lock_pool(&self.state);
            if !needs_worker(self, &st) {
                return;
            }
            let mut ids: Vec<u64> = Vec::new();
            self.worklist.for_each(|e| ids.push(e.meta.pwq.wq.id));
            ids
        };
        let rescuers = lock(rescuers());
        let wqs = policy::mayday_targets(worklist, |id| rescuers.contains_key(&id));
        for id in wqs {
            let Some((rescuer, _)) = rescuers.get(&id) else {
                continue;
            };
            let mut q = lock(&rescuer.maydays);
            if !q.iter().any(|p| Arc::ptr_eq(p, self)) {
                q.push_back(Arc::clone(self));
                self.stats.maydays.inc();
            }
            drop(q);
            rescuer.thread.unpark();
        }
    }

    /// Rescuer side: runs up to `policy::RESCUER_BATCH` items of workqueue `wq` from
    /// the worklist while the pool still wants a worker. Returns whether it stopped with
    /// such items left and the pool still stuck.
    fn rescue(self: &Arc<Self>, wq: u64) -> bool {
        let _ = cpu::set_affinity(&self.allowed);
        let mut ran = 0;
        loop {
            let entry = {
                let st = lock_pool(&self.state);
                let mut waiting = false;
                self.worklist
                    .for_each(|e| waiting |= e.meta.pwq.wq.id == wq);
                match policy::rescue_step(ran, needs_worker(self, &st), waiting) {
                    RescueStep::Stop => return false,
                    RescueStep::Requeue => return true,
                    // The pool lock is held, and workers take from the worklist without
                    // it: the item may be gone, then the rescue stops.
                    RescueStep::Take => self.worklist.take_where(|e| e.meta.pwq.wq.id == wq),
                }
            };
            let Some(entry) = entry else {
                return false;
            };
            self.stats.rescued.inc();
            run_entry(self, entry, None);
            ran += 1;
        }
    }
}

/// The error hooks of the workqueues with items on the worklist, each once, and whether
/// the process-wide hook is due too (some have none of their own, or none waits).
fn waiting_hooks(worklist: &Worklist<Entry>) -> (Vec<crate::fault::ErrorHook>, bool) {
    let mut seen: Vec<u64> = Vec::new();
    let mut hooks = Vec::new();
    let mut process_wide = worklist.len() == 0;
    worklist.for_each(|entry| {
        let wq = &entry.meta.pwq.wq;
        if seen.contains(&wq.id) {
            return;
        }
        seen.push(wq.id);
        match &wq.error_hook {
            Some(hook) => hooks.push(Arc::clone(hook)),
            None => process_wide = true,
        }
    });
    (hooks, process_wide)
}

/// Whether the pool wants a worker it has not got: items wait, no idle worker, fewer
/// running than its concurrency (`need_to_create_worker`).
fn needs_worker(pool: &PoolCore, st: &PoolState) -> bool {
    policy::needs_worker(pool.load(st))
}

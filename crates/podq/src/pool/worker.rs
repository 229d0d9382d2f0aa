//! A pool's workers: the loop each worker thread runs (take a batch, run it, spin, go
//! idle, sleep until woken, reaped or shut down), and running one entry with its
//! accounting (also used by the rescuer). Sleep/wake protocol: `README.md`. Legend:
//! `pool.rs`.

use std::time::Duration;
#[cfg(not(loom))]
use std::time::Instant;

use super::intensive;
use crate::context::{self, BATCH, COMPLETIONS, WORKER_POOL};
use crate::cpu;
use crate::entry::{Entry, EntryMeta, Task};
use crate::policy;
use crate::stats::{Item, ItemCounters, Recorder, WorkerCounters};
use crate::sync::Ordering::SeqCst;
use crate::sync::{lock, lock_std, seqcst_pair_fence, thread, Mutex, MutexGuard};
use crate::trace;
use crate::work::Start;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::worklist::Worklist;
use super::{Counts, PoolCore, PoolState};

/// Sleep/wake, sleeper side (after `go_idle`, lock released): parks once and returns
/// the lock and whether a waker marked worker `index` woken. `false` means a timeout or
/// a spurious wake-up; the caller decides whether to park again.
pub(super) fn sleep_once(
    state: &Mutex<PoolState>,
    index: usize,
    timeout: Duration,
) -> (MutexGuard<'_, PoolState>, bool) {
    thread::park_timeout(timeout);
    let st = lock(state);
    let woken = st.slots[index].as_ref().is_some_and(|s| s.woken);
    (st, woken)
}

pub(super) fn worker_main(pool: Arc<PoolCore>, index: usize) {
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
    let _registered = intensive::register(pool);
    intensive::worker_active();
    WORKER_POOL.with(|p| *p.borrow_mut() = Some(Arc::clone(pool)));
    COMPLETIONS.with(|c| c.borrow_mut().set_deferring(true));
    let mut cpu_clock = thread_cpu_ns();
    if let Some(slot) = lock(&pool.state).slots[index].as_mut() {
        slot.thread = Some(thread::current());
    }
    // Whether the worker polled the worklist since it last ran an item.
    let mut spun = false;
    // Woken to move back to its pod, with the repatriation not yet charged to a
    // workqueue.
    let mut repatriated = false;
    loop {
        if let Some(entry) = BATCH.with(|b| b.borrow_mut().pop_front()) {
            run_entry(pool, entry, Some(mine));
            spun = false;
            continue;
        }
        // The batch is done: account its items before taking more or going idle.
        let backlog = context::settle_completions();
        // Settling may have handed this worker activated items (`PoolCore::push_many`).
        if !BATCH.with(|b| b.borrow().is_empty()) || take_batch(pool, mine) {
            if std::mem::take(&mut repatriated) {
                // Charged, as in the kernel, to the workqueue of the first waiting item:
                // here the first this worker takes (a ring holds its items out of reach
                // of the waker's scan).
                BATCH.with(|b| {
                    if let Some(first) = b.borrow().front() {
                        first.meta.pwq.wq.counters.inc(Item::Repatriated);
                    }
                });
            }
            continue;
        }
        if let policy::IdleStep::Spin(budget) = policy::idle_step(spun, policy::IDLE_SPIN) {
            spun = true;
            spin(
                &pool.counts,
                &pool.worklist,
                budget,
                backlog,
                pool.concurrency,
            );
            continue; // the worklist is checked again
        }
        let mut st = lock(&pool.state);
        // Leaving the running state, it must be in the count to leave it.
        pool.count_me_again_locked(&mut st);
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
                intensive::worker_active();
                repatriated = repatriate;
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
    // No longer this pool's worker first: what the last settle activates goes onto the
    // worklist, not into the batch of a worker that is leaving.
    WORKER_POOL.with(|p| *p.borrow_mut() = None);
    COMPLETIONS.with(|c| c.borrow_mut().set_deferring(false));
}

/// Takes this worker's share of the worklist into its batch (`PoolCore::batch_take`) and,
/// if items are left, kicks the pool so wake-ups chain as in the kernel. Returns whether
/// it took any.
fn take_batch(pool: &Arc<PoolCore>, mine: &WorkerCounters) -> bool {
    let took = BATCH.with(|b| {
        pool.worklist.take_batch(
            |waiting| pool.batch_take(waiting),
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

/// Per real CPU, whether a worker polls its worklist there now (A, `Relaxed`: a hint
/// for `policy::poll_pauses`, which no correctness argument reads). Each flag sits on
/// its own cache line, written by the workers on that CPU only (give or take a
/// migration), so marking costs no locked instruction and no line moving between CPUs.
static POLLING: std::sync::OnceLock<
    Box<[crossbeam_utils::CachePadded<std::sync::atomic::AtomicBool>]>,
> = std::sync::OnceLock::new();

/// Sleep/wake, spinner side (after finding the worklist empty): counts the worker
/// spinning, polls the worklist length for at most `budget` ([`policy::idle_step`]),
/// pausing between looks as [`policy::poll_pauses`] says for `backlog`, a pod of
/// `pod_cpus` and whether another worker polls on this CPU already, and stops counting
/// as spinning. Queuers skip the wake-up for items a spinner will take (`policy::kick`),
/// so the caller must look at the worklist again before going idle.
pub(super) fn spin<T>(
    counts: &Counts,
    worklist: &Worklist<T>,
    budget: Duration,
    backlog: bool,
    pod_cpus: usize,
) {
    counts.spinning.fetch_add(1, SeqCst);
    // The flag this worker set, if it asked and found its CPU's flag clear.
    let mut marked = None;
    let mut cpu_shared = || {
        let flags = POLLING.get_or_init(|| {
            let cpus = cpu::real_cpus().last().map_or(1, |c| c + 1);
            (0..cpus).map(|_| Default::default()).collect()
        });
        let Some(flag) = flags.get(cpu::real_cpu()) else {
            return false;
        };
        // A load and a store, not a locked swap: two workers marking the same CPU at
        // once (one preempted between the two) both pause, as without the flag.
        if flag.load(Relaxed) {
            return true;
        }
        flag.store(true, Relaxed);
        marked = Some(flag);
        false
    };
    let pauses = policy::poll_pauses(backlog, pod_cpus, &mut cpu_shared);
    poll_worklist(worklist, budget, pauses);
    if let Some(flag) = marked {
        flag.store(false, Relaxed);
    }
    // Decrement, fence, then the caller's look at the worklist: pairs with a queuer's
    // push, fence, then its load of `spinning`.
    counts.spinning.fetch_sub(1, SeqCst);
    seqcst_pair_fence();
}

/// Polls the worklist until it holds an item or `budget` passes: `pauses` pause loops,
/// then yields, so a producer on the same CPU gets to run.
#[cfg(not(loom))]
fn poll_worklist<T>(worklist: &Worklist<T>, budget: Duration, pauses: u32) {
    let deadline = Instant::now() + budget;
    let mut rounds = 0u32;
    while worklist.len() == 0 {
        if rounds < pauses {
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
fn poll_worklist<T>(worklist: &Worklist<T>, _budget: Duration, _pauses: u32) {
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
pub(super) fn run_entry(pool: &Arc<PoolCore>, entry: Entry, mine: Option<&WorkerCounters>) {
    let Entry { task, meta } = entry;
    let (work, mut seq) = match task {
        Task::Once(task) => {
            let traced = trace::execute_start(trace::Item::Once(&task), &meta, pool);
            execute(pool, mine, &meta, 0, || task.run());
            trace::execute_end(traced, &meta);
            return context::complete(meta, true);
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
        trace::execute_end(traced, &meta);
        context::complete(meta, true);
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
    ItemCounters::inc_both(
        &meta.pwq.wq.counters,
        &meta.pwq.pool.core.stats.items,
        Item::Cancelled,
    );
    context::complete(meta, false);
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
    record.started(&wq.counters);
    // Two clock reads per measured item (`stats/sample.rs`, `stats/clock.rs`): the
    // start (also the end of the queue-to-start wait) and the end; none for the others.
    #[cfg(feature = "stats")]
    let start = {
        record.locality(&owner.topology, meta.queued_cpu(), cpu);
        meta.measured().map(|sample| record.measured_start(sample))
    };
    let running = crate::current::Running::new(wq, pool.id, work_addr);
    intensive::item_started();
    let panicked = f();
    if running.end() {
        // The watchdog took this worker out of the count for a long item.
        pool.count_me_again();
    }
    #[cfg(feature = "stats")]
    if let Some(start) = start {
        record.measured_end(start);
    }
    // The workqueue's `completed` count is added when the completion settles
    // (`workqueue/completions.rs`), once per batch.
    record.completed();
    if let Some(message) = panicked {
        ItemCounters::inc_both(&wq.counters, &owner.stats.items, Item::Panicked);
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

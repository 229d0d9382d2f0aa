//! Long items leave the count: a pool worker that has run one item for the CPU-intensive
//! threshold stops counting towards its pool's running workers
//! ([`policy::cpu_intensive`]), so that the pool may wake or start another worker for
//! the items behind it. The watchdog thread finds such runs ([`LongRuns::look`]); the
//! worker counts again when its item ends. States, steps and races: `README.md` beside
//! this file, "Long items".
//!
//! Legend: G guarded by its own mutex (`WORKERS`, `WATCHER`: leaves); A atomic.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::{PoolCore, PoolState};
use crate::busy::{self, Beat, COUNTED};
use crate::context::BatchRef;
use crate::fence;
use crate::policy;
use crate::sync::lock_std;
use crate::sync::unmodelled::Mutex;
use crate::sync::Ordering::{Relaxed, SeqCst};

/// A live pool worker, as the watchdog finds it.
struct PoolWorker {
    beat: Arc<Beat>,
    pool: Weak<PoolCore>,
    batch: BatchRef,
}

/// G: every live pool worker.
static WORKERS: Mutex<Vec<PoolWorker>> = Mutex::new(Vec::new());

/// The watchdog's doze: it looks only as often as its stall checks, for want of runs
/// ([`policy::CPU_INTENSIVE_DOZE_AFTER`]), and the next worker to become active or to
/// start an item wakes it.
pub(crate) struct Doze {
    /// A: set by the watchdog as it dozes, cleared by whoever wakes it. `Relaxed`, with
    /// fences (`fence.rs`): the watchdog's store, a heavy fence, then its look at the
    /// workers' beats ([`Doze::begin`]) pair with a worker's store of its beat's word
    /// as an item starts, a light fence, then its load of this flag
    /// ([`Doze::item_started`]), so of the two at least one sees the other.
    dozing: crate::sync::AtomicBool,
}

impl Doze {
    /// Under loom only: the runtime's static is built in place (a loom atomic has no
    /// `const` constructor).
    #[cfg(loom)]
    pub(crate) fn new() -> Doze {
        Doze {
            dozing: crate::sync::AtomicBool::new(false),
        }
    }

    /// A worker's item started (its beat's word is stored): whether the watchdog
    /// dozes, in which case the caller wakes it.
    #[inline]
    pub(crate) fn item_started(&self) -> bool {
        fence::light();
        self.wake()
    }

    /// Whether the watchdog dozes; the caller then wakes it (the flag is cleared).
    #[inline]
    fn wake(&self) -> bool {
        self.dozing.load(Relaxed) && self.dozing.swap(false, Relaxed)
    }

    /// The watchdog is about to doze: sets the flag, fences heavily, then calls `look`
    /// (a look at the workers' beats: whether one was active since the last). Returns
    /// whether to doze: the look found no activity, so a run that starts from now on
    /// finds the flag. Where the kernel lacks the heavy fence, it dozes unpaired (a run
    /// that starts at that moment may then be found a slow period late).
    pub(crate) fn begin(&self, look: impl FnOnce() -> bool) -> bool {
        self.dozing.store(true, Relaxed);
        if fence::heavy() && look() {
            // A worker's unpark may already be on its way: the next park returns early.
            self.dozing.store(false, Relaxed);
            return false;
        }
        true
    }

    /// The watchdog woke. Returns whether a worker woke it (it had dozed, and the flag
    /// is clear).
    fn end(&self, dozed: bool) -> bool {
        !self.dozing.swap(false, Relaxed) && dozed
    }
}

/// On a line of its own: every item start reads it.
#[cfg(not(loom))]
static DOZE: crossbeam_utils::CachePadded<Doze> = crossbeam_utils::CachePadded::new(Doze {
    dozing: crate::sync::AtomicBool::new(false),
});
/// Under loom the runtime's doze is never reached (the model makes its own).
#[cfg(loom)]
static DOZE: std::sync::LazyLock<Doze> = std::sync::LazyLock::new(Doze::new);

/// G: the thread to wake when a worker becomes active while it dozes ([`Doze`]).
static WATCHER: Mutex<Option<std::thread::Thread>> = Mutex::new(None);

/// A pool worker's registration; dropped when the worker exits.
pub(super) struct Registered(Arc<Beat>);

impl Drop for Registered {
    fn drop(&mut self) {
        lock_std(&WORKERS).retain(|w| !Arc::ptr_eq(&w.beat, &self.0));
    }
}

/// Registers the calling thread as a worker of `pool`.
pub(super) fn register(pool: &Arc<PoolCore>) -> Registered {
    let beat = busy::my_beat();
    lock_std(&WORKERS).push(PoolWorker {
        beat: Arc::clone(&beat),
        pool: Arc::downgrade(pool),
        batch: BatchRef::mine(),
    });
    Registered(beat)
}

/// The calling worker may start items now (it started, was woken, or left a
/// `blocking` section): wakes the watchdog if it dozes.
pub(super) fn worker_active() {
    if DOZE.wake() {
        wake_watcher();
    }
}

/// The calling worker started an item (after its beat's start): wakes the watchdog if
/// it dozes, so a run that began as it dozed off is timed from its start.
#[inline]
pub(super) fn item_started() {
    if DOZE.item_started() {
        wake_watcher();
    }
}

#[cold]
fn wake_watcher() {
    if let Some(watcher) = lock_std(&WATCHER).as_ref() {
        watcher.unpark();
    }
}

/// The watchdog (`watcher`) is about to sleep its slow period. `look` looks at the
/// workers again after the doze flag is set ([`Doze::begin`]). Returns whether to doze:
/// then the next worker to become active or to start an item wakes it.
pub(crate) fn doze(watcher: &std::thread::Thread, look: impl FnOnce() -> bool) -> bool {
    lock_std(&WATCHER).get_or_insert_with(|| watcher.clone());
    DOZE.begin(look)
}

/// The watchdog woke up. Returns whether a worker woke it from a doze (it had dozed,
/// and the flag is clear).
pub(crate) fn wake_up(dozed: bool) -> bool {
    DOZE.end(dozed)
}

/// What the watchdog remembers of the pool workers between its looks for long runs.
#[derive(Default)]
pub(crate) struct LongRuns {
    /// When each counted run (its beat's address and word) was first seen running.
    since: HashMap<(usize, u64), Instant>,
    /// Each worker's word at the last look.
    words: HashMap<usize, u64>,
    /// When a look last found a worker's word changed (an item started or ended).
    active_at: Option<Instant>,
}

impl LongRuns {
    /// A worker woke the dozing watchdog: it is about to start an item, perhaps after
    /// the next look, so the looks stay frequent for a while.
    pub(crate) fn worker_woke(&mut self, now: Instant) {
        self.active_at = Some(now);
    }

    /// One look at every pool worker: a counted run seen running for `threshold` leaves
    /// its pool's count (the pool kicks), and a demotion whose run ended without its
    /// worker undoing it is undone. Returns whether to look again soon
    /// ([`policy::cpu_intensive_look_period`]): a counted run is in progress, or a
    /// worker was active within [`policy::CPU_INTENSIVE_DOZE_AFTER`].
    pub(crate) fn look(&mut self, threshold: Duration, now: Instant) -> bool {
        // Found under the registry's lock, with no reference taken for the others; done
        // after it, each under its pool's lock.
        let mut due = Vec::new();
        let mut since = HashMap::with_capacity(self.since.len());
        let mut words = HashMap::with_capacity(self.words.len());
        for PoolWorker { beat, pool, batch } in lock_std(&WORKERS).iter() {
            let key = Arc::as_ptr(beat) as usize;
            let (word, standing) = beat.standing();
            if self.words.get(&key) != Some(&word) {
                self.active_at = Some(now);
            }
            words.insert(key, word);
            if standing & 1 == 1 && standing != word {
                due.push((Arc::clone(beat), Weak::clone(pool), Due::CountAgain));
            }
            if word & 1 == 0 || standing != COUNTED {
                continue;
            }
            let first = self.since.get(&(key, word)).copied().unwrap_or(now);
            since.insert((key, word), first);
            if policy::cpu_intensive(now - first, Some(threshold)) {
                due.push((
                    Arc::clone(beat),
                    Weak::clone(pool),
                    Due::Demote(word, *batch),
                ));
            }
        }
        let counted_runs = !since.is_empty();
        self.since = since;
        self.words = words;
        for (beat, pool, what) in due {
            let Some(pool) = pool.upgrade() else {
                continue;
            };
            match what {
                Due::Demote(word, batch) => pool.demote(&beat, word, batch),
                Due::CountAgain => pool.count_again(&beat),
            }
        }
        counted_runs
            || self
                .active_at
                .is_some_and(|at| now - at < policy::CPU_INTENSIVE_DOZE_AFTER)
    }
}

/// What a look found to do for one worker.
enum Due {
    /// Take its run of this word out of the count, and its batch back.
    Demote(u64, BatchRef),
    /// Undo a demotion whose run ended.
    CountAgain,
}

impl PoolCore {
    /// Watchdog: run `word` of `beat`, a worker of this pool, has run too long. If it
    /// still runs, its worker counts and the pool has room for one more worker out
    /// (`policy::may_leave_count`), the worker leaves the running count (pool lock);
    /// after a heavy fence, the items in its `batch` go back to the front of the
    /// worklist if the demotion stands (`Beat::demotion_stands`), and the pool kicks
    /// for the items waiting (pool lock again).
    fn demote(self: &Arc<Self>, beat: &Beat, word: u64, batch: BatchRef) {
        let mut st = crate::sync::lock(&self.state);
        if !policy::may_leave_count(st.out_for_long_items, self.concurrency) || !beat.demote(word) {
            return;
        }
        st.out_for_long_items += 1;
        self.counts.running.fetch_sub(1, SeqCst);
        self.counts
            .single_takes
            .store(policy::SINGLE_TAKES_AFTER_LONG_ITEM, Relaxed);
        self.stats.cpu_intensive.inc();
        drop(st);
        // Outside the pool lock: microseconds, an interrupt to every CPU that runs a
        // thread of the process.
        let paired = fence::heavy();
        let mut st = crate::sync::lock(&self.state);
        if paired && beat.demotion_stands(word) {
            // SAFETY: the pool lock is held, and the worker runs `word`, which it will
            // end by seeing its demotion and taking this lock (`demotion_stands`).
            let n = unsafe { batch.hand_back(|items| self.worklist.push_front_all(items)) };
            self.stats.handed_back.add(n as u64);
        }
        let action = self.kick_locked(&mut st);
        drop(st);
        self.act(action);
    }

    /// Watchdog: `beat`'s demoted run ended and its worker did not count itself again;
    /// counts it (pool lock), unless the worker does so first.
    fn count_again(&self, beat: &Beat) {
        let mut st = crate::sync::lock(&self.state);
        if beat.undo_demotion(true) {
            self.back_in_count(&mut st);
        }
    }

    /// Whether the pool's workers take items one at a time now, after a long item
    /// (`policy::SINGLE_TAKES_AFTER_LONG_ITEM`).
    pub(super) fn one_at_a_time(&self) -> bool {
        self.counts.single_takes.load(Relaxed) > 0
    }

    /// A worker claims items: one, if the pool takes them one at a time now (counting
    /// that claim), else its share (`policy::batch_take_after_long_items`).
    pub(super) fn batch_take(&self, waiting: usize) -> usize {
        let single = self.one_at_a_time()
            && self
                .counts
                .single_takes
                .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
                .is_ok();
        policy::batch_take_after_long_items(waiting, self.concurrency, single)
    }

    /// The calling worker's item ended while it stood demoted: it counts again.
    pub(super) fn count_me_again(&self) {
        let mut st = crate::sync::lock(&self.state);
        self.count_me_again_locked(&mut st);
    }

    /// [`count_me_again`](Self::count_me_again) under the pool lock (`st`), if the
    /// calling worker stands demoted: before it changes its running count itself.
    pub(super) fn count_me_again_locked(&self, st: &mut PoolState) {
        if busy::undo_my_demotion() {
            self.back_in_count(st);
        }
    }

    /// A demotion was undone (pool lock, `st`): its worker leaves the pool's workers out
    /// for long items and counts as running again.
    fn back_in_count(&self, st: &mut PoolState) {
        st.out_for_long_items -= 1;
        self.counts.running.fetch_add(1, SeqCst);
    }
}

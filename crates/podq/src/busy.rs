//! What every worker runs now, readable from other threads: one [`Beat`] per thread
//! that has run an item, in a process-wide list. `shutdown` counts a workqueue's running
//! items from it and the stall watchdog sees items that run long.
//!
//! A worker writes its beat twice per item (start, end), with no clock read and no
//! locked instruction: a run counter that readers compare between two looks. A beat
//! whose counter did not move between looks `d` apart has run one item for at least
//! `d` (`watchdog.rs` turns that into durations).
//!
//! The word's protocol (one writer, any readers): see `Beat::word`. Its loom model,
//! `loom_a_look_sees_its_runs_ids`, runs the real `Beat` methods through the `sync`
//! facade. A pool worker's beat also says whether the worker counts in its pool's
//! running workers (`Beat::standing`): the watchdog takes a worker that runs one item
//! too long out of that count (`pool/intensive.rs`, whose README gives the protocol;
//! loom model `loom_a_demotion_is_undone_once`).
//!
//! Legend: A atomic (ordering and pair named at each field); W thread-private;
//! G guarded by `BEATS` (a leaf lock); BL guarded by `Beat::label` (a leaf lock, taken
//! only for labelled items).

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Weak};

use crate::fence;
use crate::sync::unmodelled::Mutex;

use crate::sync::lock_std as lock;
use crate::sync::{
    AtomicU64, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};

/// One thread's current item.
pub(crate) struct Beat {
    /// A: twice the number of items this thread started, plus one while it runs one:
    /// a start moves it to the next odd value, an end to the next even one, so every
    /// run has a word of its own. Written by its thread only (`Release`: pairs with the
    /// readers' `Acquire`, so a reader that sees a run's word sees that run's `wq` and
    /// `pool`, or those of a later run, never an earlier one's).
    word: AtomicU64,
    /// A: the workqueue id of the item running (written before `word`, `Relaxed`).
    wq: AtomicU64,
    /// A: the id of the pool whose worker runs it (written before `word`, `Relaxed`).
    pool: AtomicU64,
    /// A: a pool worker's standing in its pool's count of running workers
    /// (`pool/intensive.rs`): [`COUNTED`]; the odd word of a run the watchdog took out
    /// of the count (a *demotion*), until someone undoes it; or [`IN_BLOCKING`] (not
    /// counted, and not to be demoted). Written under the worker's pool lock, except
    /// the worker's own undo at the end of a run (a CAS from a run's word to
    /// `COUNTED`): every change is a CAS or a swap, so of the worker and the watchdog
    /// exactly one undoes a demotion. Always `COUNTED` for other threads.
    standing: AtomicU64,
    /// BL: the running item's label, if it has one.
    label: Mutex<Option<Arc<str>>>,
    /// I: the thread's name.
    pub(crate) thread: String,
}

/// [`Beat::standing`]: the worker counts as running whenever it runs.
pub(crate) const COUNTED: u64 = 0;
/// [`Beat::standing`]: the worker is in a `blocking` section (even, so never a run's
/// word).
pub(crate) const IN_BLOCKING: u64 = 2;

thread_local! {
    /// W: this thread's beat, made when it starts its first item; owns it.
    static MINE: RefCell<Option<Arc<Beat>>> = const { RefCell::new(None) };
    /// W: the same beat as a plain pointer (null until made), so that the two writes
    /// per item read a thread-local without a destructor to check.
    static MINE_PTR: Cell<*const Beat> = const { Cell::new(std::ptr::null()) };
}

/// The calling thread's beat, made on first use.
#[inline]
fn mine() -> &'static Beat {
    let mut ptr = MINE_PTR.with(Cell::get);
    if ptr.is_null() {
        ptr = first_beat();
    }
    // SAFETY: `MINE` holds the `Arc` this points into for the rest of the thread's
    // life, and only this thread reads `MINE_PTR`; thread-local destruction runs no
    // work item, so no caller outlives it.
    unsafe { &*ptr }
}

/// G: every live beat (dead ones are pruned when a new one registers).
static BEATS: Mutex<Vec<Weak<Beat>>> = Mutex::new(Vec::new());

impl Beat {
    fn new(thread: String) -> Beat {
        Beat {
            word: AtomicU64::new(0),
            wq: AtomicU64::new(0),
            pool: AtomicU64::new(0),
            standing: AtomicU64::new(COUNTED),
            label: Mutex::new(None),
            thread,
        }
    }

    /// Its thread starts an item of workqueue `wq` on a worker of `pool`.
    #[inline]
    fn start(&self, wq: u64, pool: u64) {
        self.wq.store(wq, Relaxed);
        self.pool.store(pool, Relaxed);
        let word = self.word.load(Relaxed);
        // Odd, and one run further (an odd word, a run that never ended, moves by two).
        let next = if word & 1 == 0 { word + 1 } else { word + 2 };
        self.word.store(next, Release);
    }

    /// Its thread's item ended. Returns whether the thread stands demoted (its pool
    /// should count it again: [`Beat::undo_demotion`]); a demotion stored at the same
    /// moment may be missed, and the watchdog undoes it later (`pool/intensive.rs`),
    /// but not one that [`Beat::demotion_stands`] confirmed.
    #[inline]
    fn end(&self) -> bool {
        let word = self.word.load(Relaxed);
        // Even, and one further: the next run's word differs from this one's.
        self.word.store(word + (word & 1), Release);
        // Pairs with the watchdog's heavy fence between its demotion and
        // `demotion_stands`.
        fence::light();
        self.standing.load(Relaxed) & 1 == 1
    }

    /// Watchdog, under the worker's pool lock: takes run `word` out of the count if it
    /// is still running and the worker counts. Returns whether it did (the caller then
    /// drops the worker from its pool's running count).
    pub(crate) fn demote(&self, word: u64) -> bool {
        // Acquire: pairs with the Release store of `word`, as in `read`.
        self.word.load(Acquire) == word
            && word & 1 == 1
            && self
                .standing
                .compare_exchange(COUNTED, word, AcqRel, Relaxed)
                .is_ok()
    }

    /// Watchdog, under the worker's pool lock, after [`Beat::demote`] took run `word`
    /// out of the count and a heavy fence ([`crate::fence::heavy`]) followed: whether
    /// the run goes on with the demotion in force. Then the worker is sure to see the
    /// demotion when the run ends, and so to take its pool lock before it touches its
    /// batch again (`PoolCore::count_me_again`): the demotion's CAS, the heavy fence,
    /// then this load of the word pair with the run's end, which stores the even word,
    /// fences lightly, then loads `standing`. `standing` changes only under the pool
    /// lock, and the word only by its worker.
    pub(crate) fn demotion_stands(&self, word: u64) -> bool {
        self.word.load(Relaxed) == word && self.standing.load(Relaxed) == word
    }

    /// Undoes the demotion in force, if any (with `only_if_ended`, only once its run
    /// ended). Returns whether it did (the caller then counts the worker again). The
    /// worker undoes its own at any time; the watchdog one whose run ended, which the
    /// worker missed.
    pub(crate) fn undo_demotion(&self, only_if_ended: bool) -> bool {
        let standing = self.standing.load(Acquire);
        standing & 1 == 1
            && !(only_if_ended && self.word.load(Acquire) == standing)
            && self
                .standing
                .compare_exchange(standing, COUNTED, AcqRel, Relaxed)
                .is_ok()
    }

    /// Its worker enters a `blocking` section (under its pool lock). Returns whether it
    /// stood demoted, so already out of the count.
    pub(crate) fn enter_blocking(&self) -> bool {
        self.standing.swap(IN_BLOCKING, AcqRel) & 1 == 1
    }

    /// Its worker leaves its `blocking` section (under its pool lock) and counts again.
    pub(crate) fn leave_blocking(&self) {
        self.standing.store(COUNTED, Release);
    }

    /// The word of its run and its standing, as the watchdog sees them.
    pub(crate) fn standing(&self) -> (u64, u64) {
        let word = self.word.load(Acquire);
        (word, self.standing.load(Acquire))
    }

    /// The word, then the ids of the run it names (or of a later run).
    fn read(&self) -> (u64, u64, u64) {
        // Acquire: pairs with the Release stores of `word`.
        let word = self.word.load(Acquire);
        (word, self.wq.load(Relaxed), self.pool.load(Relaxed))
    }
}

/// The calling thread starts an item of workqueue `wq` on a worker of `pool`.
#[inline]
pub(crate) fn start(wq: u64, pool: u64) {
    mine().start(wq, pool);
}

/// The calling thread's item ended. Returns whether the thread, a pool worker, stands
/// demoted (`Beat::end`).
#[inline]
pub(crate) fn end() -> bool {
    mine().end()
}

/// The calling worker counts again if it stood demoted (under its pool lock); returns
/// whether it did.
pub(crate) fn undo_my_demotion() -> bool {
    mine().undo_demotion(false)
}

/// The calling worker enters a `blocking` section (under its pool lock); returns
/// whether it stood demoted ([`Beat::enter_blocking`]).
pub(crate) fn enter_blocking() -> bool {
    mine().enter_blocking()
}

/// The calling worker leaves its `blocking` section (under its pool lock).
pub(crate) fn leave_blocking() {
    mine().leave_blocking();
}

/// The calling thread's beat, kept by a pool worker to register it for demotions
/// (`pool/intensive.rs`).
pub(crate) fn my_beat() -> Arc<Beat> {
    MINE.with(|m| m.borrow().clone()).unwrap_or_else(install)
}

/// Gives the calling thread's running item a label (`None`: clears it).
pub(crate) fn set_label(label: Option<&Arc<str>>) {
    *lock(&mine().label) = label.cloned();
}

/// Makes and registers the calling thread's beat.
#[cold]
fn first_beat() -> *const Beat {
    // `MINE` keeps the beat alive for the rest of the thread's life.
    Arc::as_ptr(&install())
}

/// Makes, registers and keeps the calling thread's beat.
fn install() -> Arc<Beat> {
    let beat = register();
    MINE.with(|m| *m.borrow_mut() = Some(Arc::clone(&beat)));
    MINE_PTR.with(|p| p.set(Arc::as_ptr(&beat)));
    beat
}

fn register() -> Arc<Beat> {
    let beat = Arc::new(Beat::new(
        std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_owned(),
    ));
    let mut beats = lock(&BEATS);
    beats.retain(|b| b.strong_count() > 0);
    beats.push(Arc::downgrade(&beat));
    beat
}

/// One look at a beat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Look {
    /// The beat's address, to tell beats apart between looks.
    pub(crate) beat: usize,
    /// The run counter word (odd: running).
    pub(crate) word: u64,
    /// The running item's workqueue and pool ids.
    pub(crate) wq: u64,
    pub(crate) pool: u64,
    /// Its label.
    pub(crate) label: Option<Arc<str>>,
    /// The thread's name.
    pub(crate) thread: String,
}

/// Every beat now (odd `word`: running; the label only for running ones).
pub(crate) fn looks() -> Vec<Look> {
    let beats: Vec<Arc<Beat>> = lock(&BEATS).iter().filter_map(Weak::upgrade).collect();
    beats
        .iter()
        .map(|beat| {
            let (word, wq, pool) = beat.read();
            Look {
                beat: Arc::as_ptr(beat) as usize,
                word,
                wq,
                pool,
                label: if word & 1 == 1 {
                    lock(&beat.label).clone()
                } else {
                    None
                },
                thread: beat.thread.clone(),
            }
        })
        .collect()
}

/// Every thread running an item now.
pub(crate) fn running() -> Vec<Look> {
    looks().into_iter().filter(Look::running).collect()
}

impl Look {
    /// Whether the thread runs an item.
    pub(crate) fn running(&self) -> bool {
        self.word & 1 == 1
    }
}

/// How many threads run an item of workqueue `wq` now.
pub(crate) fn running_of(wq: u64) -> usize {
    running().iter().filter(|l| l.wq == wq).count()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Beat;

    /// Regression: an end used to clear the odd bit only, so every run of a thread had
    /// the word 1 and the watchdog took back-to-back short items for one long one.
    #[test]
    fn every_run_has_a_word_of_its_own() {
        let beat = Beat::new("t".into());
        let mut words = vec![beat.read().0];
        for run in 1..=3 {
            beat.start(run, 10 * run);
            words.push(beat.read().0);
            assert_eq!(beat.read(), (2 * run - 1, run, 10 * run));
            beat.end();
            words.push(beat.read().0);
        }
        assert_eq!(words, [0, 1, 2, 3, 4, 5, 6]);
        // A run that never ended (its thread unwound past the end) moves by two.
        beat.start(4, 40);
        beat.start(5, 50);
        assert_eq!(beat.read(), (9, 5, 50));
        beat.end();
        assert_eq!(beat.read().0, 10);
    }
}

/// Loom model of the beat on the real `Beat` methods:
/// `RUSTFLAGS="--cfg loom" cargo test -p podq --release --lib loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::{Beat, COUNTED};
    use crate::sync::UnsafeCell;
    use loom::sync::{Arc, Mutex};

    /// A worker runs two items (workqueue 1 on pool 10, then 2 on 20) while a reader
    /// looks twice. In every interleaving: the words it sees never go back; a look at
    /// a run's word (1: the first running, 2: it ended, 3: the second running) sees
    /// that run's ids or the second's, never an earlier state (0, or the first's ids
    /// once the second's word is seen); the second look sees the same run or a later
    /// one.
    #[test]
    fn loom_a_look_sees_its_runs_ids() {
        loom::model(|| {
            let beat = Arc::new(Beat::new("worker".into()));
            let worker = {
                let beat = beat.clone();
                loom::thread::spawn(move || {
                    beat.start(1, 10);
                    beat.end();
                    beat.start(2, 20);
                    beat.end();
                })
            };
            let check = |(word, wq, pool): (u64, u64, u64)| match word {
                0 => {}
                1 | 2 => {
                    assert!(wq == 1 || wq == 2, "word {word}: wq {wq}");
                    assert!(pool == 10 || pool == 20, "word {word}: pool {pool}");
                }
                3 | 4 => assert_eq!((wq, pool), (2, 20), "word {word}"),
                other => panic!("word {other} after two runs"),
            };
            let first = beat.read();
            check(first);
            let second = beat.read();
            check(second);
            assert!(second.0 >= first.0, "the word went back");
            worker.join().unwrap();
            assert_eq!(beat.read(), (4, 2, 20));
        });
    }

    /// The watchdog dozes off while a worker starts an item (`pool/intensive.rs`,
    /// `Doze`): the worker stores its beat's word then checks the doze flag; the
    /// watchdog sets the flag, fences, then looks at the word again. In every
    /// interleaving the watchdog either sees the run and stays awake, or the worker sees
    /// the flag and wakes it: a run never starts unseen under a doze. It fails if the
    /// watchdog dozes without its second look, or if the worker's light fence is left
    /// out.
    #[test]
    fn loom_a_run_that_starts_as_the_watchdog_dozes_is_seen() {
        loom::model(|| {
            let beat = Arc::new(Beat::new("worker".into()));
            let doze = Arc::new(crate::pool::Doze::new());
            let worker = {
                let (beat, doze) = (beat.clone(), doze.clone());
                loom::thread::spawn(move || {
                    beat.start(1, 10);
                    doze.item_started()
                })
            };
            // The watchdog's first look found the worker idle (word 0).
            let dozes = doze.begin(|| beat.read().0 != 0);
            let woke_it = worker.join().unwrap();
            assert!(
                !dozes || woke_it,
                "a run started unseen while the watchdog dozes"
            );
        });
    }

    /// The count of a pool's running workers, under its pool lock, as the runtime keeps
    /// it (`Counts::running`, written under the pool lock).
    type Running = Arc<Mutex<usize>>;

    /// The worker's side after its run ended (`execute`, then `work_loop`'s step under
    /// the pool lock before `go_idle`): undoes a demotion it sees, then goes idle,
    /// leaving the count.
    fn end_and_go_idle(beat: &Beat, running: &Running) {
        if beat.end() {
            let mut count = running.lock().unwrap();
            if beat.undo_demotion(false) {
                *count += 1;
            }
        }
        let mut count = running.lock().unwrap();
        if beat.undo_demotion(false) {
            *count += 1;
        }
        assert!(*count >= 1, "the idle worker was not counted");
        *count -= 1;
    }

    /// The watchdog's side (`pool/intensive.rs`): demotes run 1, then, at its next look,
    /// undoes a demotion whose run ended, both under the pool lock.
    fn demote_then_repair(beat: &Beat, running: &Running) {
        {
            let mut count = running.lock().unwrap();
            if beat.demote(1) {
                assert!(*count >= 1, "demoted a worker that was not counted");
                *count -= 1;
            }
        }
        let mut count = running.lock().unwrap();
        if beat.undo_demotion(true) {
            *count += 1;
        }
    }

    /// Run 1 of a counted worker, which does `worker` (in its own thread) while the
    /// watchdog demotes it and looks again; then the count is empty (the worker went
    /// idle) and the worker stands counted normally.
    fn against_the_watchdog(worker: impl FnOnce(&Beat, &Running) + Send + 'static) {
        let beat = Arc::new(Beat::new("worker".into()));
        let running: Running = Arc::new(Mutex::new(1));
        beat.start(1, 10);
        let thread = {
            let (beat, running) = (beat.clone(), running.clone());
            loom::thread::spawn(move || worker(&beat, &running))
        };
        demote_then_repair(&beat, &running);
        thread.join().unwrap();
        assert_eq!(*running.lock().unwrap(), 0);
        assert_eq!(beat.standing(), (2, COUNTED));
    }

    /// A worker's run ends while the watchdog demotes it and looks again. In every
    /// interleaving the count never goes below zero, the idle worker leaves it exactly
    /// once, and the worker ends up counted normally: of the worker's undo and the
    /// watchdog's repair, exactly one counts it again. It fails if the worker's undo at
    /// its locked step is left out (the repair alone comes too late for `go_idle`) or
    /// if either undo is not a compare-and-swap.
    #[test]
    fn loom_a_demotion_is_undone_once() {
        loom::model(|| against_the_watchdog(end_and_go_idle));
    }

    /// A worker's run ends while the watchdog demotes it under the pool lock, fences
    /// heavily outside it, and, under the lock again, empties the worker's batch if
    /// `Beat::demotion_stands` (`PoolCore::demote`); the worker then takes the next
    /// item of its batch, after the locked undo if it saw its demotion (`execute`, then
    /// `work_loop`). The batch is a cell whose accesses loom checks: in every
    /// interleaving they are ordered, and an item is taken by one side only. It fails
    /// with either fence left out: the worker may then miss a demotion that the
    /// watchdog confirmed, and pop its batch while the watchdog empties it.
    #[test]
    fn loom_a_demoted_workers_batch_is_taken_by_one_thread_at_a_time() {
        loom::model(|| {
            let beat = Arc::new(Beat::new("worker".into()));
            let running: Running = Arc::new(Mutex::new(1));
            let batch = Arc::new(UnsafeCell::new(vec![7u32]));
            beat.start(1, 10);
            let worker = {
                let (beat, running, batch) = (beat.clone(), running.clone(), batch.clone());
                loom::thread::spawn(move || {
                    if beat.end() {
                        let mut count = running.lock().unwrap();
                        if beat.undo_demotion(false) {
                            *count += 1;
                        }
                    }
                    // SAFETY: the protocol under test; loom reports an unordered access.
                    batch.with_mut(|items| unsafe { (*items).pop() })
                })
            };
            let demoted = {
                let mut count = running.lock().unwrap();
                let demoted = beat.demote(1);
                if demoted {
                    *count -= 1;
                }
                demoted
            };
            let taken = if demoted && crate::fence::heavy() {
                let _count = running.lock().unwrap();
                // SAFETY: as above.
                beat.demotion_stands(1)
                    .then(|| batch.with_mut(|items| unsafe { (*items).pop() }))
                    .flatten()
            } else {
                None
            };
            let popped = worker.join().unwrap();
            assert_eq!(
                u32::from(taken.is_some()) + u32::from(popped.is_some()),
                1,
                "the item went to exactly one side"
            );
        });
    }

    /// The same with a `blocking` section inside the run (`PoolCore::enter_blocking`
    /// and `leave_blocking`): a worker demoted before it blocks leaves the count once,
    /// and one blocking is never demoted.
    #[test]
    fn loom_a_blocking_section_and_a_demotion_leave_the_count_once() {
        loom::model(|| {
            against_the_watchdog(|beat, running| {
                {
                    let mut count = running.lock().unwrap();
                    if !beat.enter_blocking() {
                        *count -= 1;
                    }
                }
                {
                    let mut count = running.lock().unwrap();
                    beat.leave_blocking();
                    *count += 1;
                }
                end_and_go_idle(beat, running);
            });
        });
    }
}

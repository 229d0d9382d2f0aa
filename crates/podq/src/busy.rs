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
//! facade.
//!
//! Legend: A atomic (ordering and pair named at each field); W thread-private;
//! G guarded by `BEATS` (a leaf lock); BL guarded by `Beat::label` (a leaf lock, taken
//! only for labelled items).

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Weak};

use crate::sync::unmodelled::Mutex;

use crate::sync::lock_std as lock;
use crate::sync::{AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

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
    /// BL: the running item's label, if it has one.
    label: Mutex<Option<Arc<str>>>,
    /// I: the thread's name.
    pub(crate) thread: String,
}

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

    /// Its thread's item ended.
    #[inline]
    fn end(&self) {
        let word = self.word.load(Relaxed);
        // Even, and one further: the next run's word differs from this one's.
        self.word.store(word + (word & 1), Release);
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

/// The calling thread's item ended.
#[inline]
pub(crate) fn end() {
    mine().end();
}

/// Gives the calling thread's running item a label (`None`: clears it).
pub(crate) fn set_label(label: Option<&Arc<str>>) {
    *lock(&mine().label) = label.cloned();
}

/// Makes and registers the calling thread's beat.
#[cold]
fn first_beat() -> *const Beat {
    let beat = register();
    let ptr = Arc::as_ptr(&beat);
    MINE.with(|m| *m.borrow_mut() = Some(beat));
    MINE_PTR.with(|p| p.set(ptr));
    ptr
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
    use super::Beat;
    use loom::sync::Arc;

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
}

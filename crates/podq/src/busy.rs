//! What every worker runs now, readable from other threads: one [`Beat`] per thread
//! that has run an item, in a process-wide list. `shutdown` counts a workqueue's running
//! items from it and the stall watchdog sees items that run long.
//!
//! A worker writes its beat twice per item (start, end), with no clock read and no
//! locked instruction: a run counter that readers compare between two looks. A beat
//! whose counter did not move between looks `d` apart has run one item for at least
//! `d` (`watchdog.rs` turns that into durations).
//!
//! Legend: A atomic (ordering and pair named at each field); W thread-private;
//! G guarded by `BEATS` (a leaf lock); BL guarded by `Beat::label` (a leaf lock, taken
//! only for labelled items).

use crate::sync::unmodelled::{AtomicU64, Mutex};
use crate::sync::Ordering::{Acquire, Relaxed, Release};
use std::cell::{Cell, RefCell};
use std::sync::{Arc, Weak};

use crate::sync::lock_std as lock;

/// One thread's current item.
pub(crate) struct Beat {
    /// A: twice the number of items this thread started, plus one while it runs one.
    /// Written by its thread only (`Release`: pairs with the readers' `Acquire`, so the
    /// `wq` and `pool` written before it are seen with it).
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

/// The calling thread starts an item of workqueue `wq` on a worker of `pool`.
#[inline]
pub(crate) fn start(wq: u64, pool: u64) {
    let beat = mine();
    beat.wq.store(wq, Relaxed);
    beat.pool.store(pool, Relaxed);
    let word = beat.word.load(Relaxed);
    // Odd, and one run further (an odd word, a run that never ended, moves by two).
    let next = if word & 1 == 0 { word + 1 } else { word + 2 };
    beat.word.store(next, Release);
}

/// The calling thread's item ended.
#[inline]
pub(crate) fn end() {
    let beat = mine();
    let word = beat.word.load(Relaxed);
    beat.word.store(word & !1, Release);
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
    let beat = Arc::new(Beat {
        word: AtomicU64::new(0),
        wq: AtomicU64::new(0),
        pool: AtomicU64::new(0),
        label: Mutex::new(None),
        thread: std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_owned(),
    });
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
            // Acquire: pairs with the Release stores of `word`.
            let word = beat.word.load(Acquire);
            Look {
                beat: Arc::as_ptr(beat) as usize,
                word,
                wq: beat.wq.load(Relaxed),
                pool: beat.pool.load(Relaxed),
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

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
//! G guarded by `BEATS` (a leaf lock); V guarded by `Beat::label` (a leaf lock, taken
//! only for labelled items).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::{Arc, Mutex, Weak};

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
    /// V: the running item's label, if it has one.
    label: Mutex<Option<Arc<str>>>,
    /// I: the thread's name.
    pub(crate) thread: String,
}

thread_local! {
    /// W: this thread's beat, made when it starts its first item.
    static MINE: RefCell<Option<Arc<Beat>>> = const { RefCell::new(None) };
}

/// G: every live beat (dead ones are pruned when a new one registers).
static BEATS: Mutex<Vec<Weak<Beat>>> = Mutex::new(Vec::new());

/// The calling thread starts an item of workqueue `wq` on a worker of `pool`.
pub(crate) fn start(wq: u64, pool: u64) {
    MINE.with(|m| {
        let mut mine = m.borrow_mut();
        let beat = mine.get_or_insert_with(register);
        beat.wq.store(wq, Relaxed);
        beat.pool.store(pool, Relaxed);
        let word = beat.word.load(Relaxed);
        // Odd, and one run further (an odd word, a run that never ended, moves by two).
        let next = if word & 1 == 0 { word + 1 } else { word + 2 };
        beat.word.store(next, Release);
    });
}

/// The calling thread's item ended.
pub(crate) fn end() {
    MINE.with(|m| {
        if let Some(beat) = m.borrow().as_ref() {
            let word = beat.word.load(Relaxed);
            beat.word.store(word & !1, Release);
        }
    });
}

/// Gives the calling thread's running item a label (`None`: clears it).
pub(crate) fn set_label(label: Option<&Arc<str>>) {
    MINE.with(|m| {
        if let Some(beat) = m.borrow().as_ref() {
            *lock(&beat.label) = label.cloned();
        }
    });
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

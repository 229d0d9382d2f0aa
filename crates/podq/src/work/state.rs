//! The state word of a work item: PENDING, RUNNING, the collision handoff, waiters,
//! the disable depth and the queue sequence number. Protocol: `work/README.md`.
//!
//! Legend: I set at init; A atomic (ordering and pair named at each use);
//! H guarded by `handoff`; C guarded by `waiters` (with its condvar).

use crate::sync::{lock, wait, AtomicU32, AtomicU64, Condvar, Mutex, Ordering::*};

/// Queued (on the timer, an inactive list, a worklist or the handoff slot), not started.
pub(crate) const PENDING: u64 = 1;
/// A worker is running the function.
pub(crate) const RUNNING: u64 = 1 << 1;
/// An instance is waiting in the handoff slot for the running worker.
pub(crate) const HANDOFF: u64 = 1 << 2;
/// Someone waits in `wait_until`; whoever changes RUNNING or PENDING must notify.
pub(crate) const WAITERS: u64 = 1 << 3;
/// The pending instance sits on the timer (delayed work).
pub(crate) const TIMER: u64 = 1 << 4;
const DISABLE_SHIFT: u32 = 16;
const DISABLE_ONE: u64 = 1 << DISABLE_SHIFT;
const DISABLE_MASK: u64 = 0xffff << DISABLE_SHIFT;
const SEQ_SHIFT: u32 = 32;
/// The deepest the disable depth goes: `disable` beyond it is refused.
pub(crate) const MAX_DISABLE_DEPTH: u32 = 0xffff;

/// The sequence number of the latest queueing (bumped by every queue and every steal).
pub(crate) fn seq_of(word: u64) -> u32 {
    (word >> SEQ_SHIFT) as u32
}

fn with_seq(word: u64, seq: u32) -> u64 {
    (word & 0xffff_ffff) | (u64::from(seq) << SEQ_SHIFT)
}

fn disabled(word: u64) -> bool {
    word & DISABLE_MASK != 0
}

/// `a` is at or before `b`, in wrapping sequence order.
pub(crate) fn seq_le(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) >= 0
}

/// What a worker may do with an instance it took off a worklist.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// PENDING cleared, RUNNING set: run it.
    Run,
    /// The instance was cancelled or superseded: drop it.
    Stale,
    /// Another worker runs the item: hand the instance to it.
    Busy,
}

/// The state of one work item. `T` is what travels through the handoff slot (a queue
/// entry in the runtime, a plain value in the loom models).
pub(crate) struct WorkState<T> {
    /// A: flags, disable depth and sequence (see the constants). Every transition is a
    /// `SeqCst` RMW, so all transitions of one item are totally ordered; the
    /// `Acquire`/`Release` halves pair the queuer's stores before `try_pend` with the
    /// worker's loads after `start`.
    word: AtomicU64,
    /// A: sequence of the running (or last run) instance; written after RUNNING is set
    /// (`Release`), read by `wait_until` (`Acquire`). Read alone it may be one run old,
    /// which only makes a flush wait for one more run, never less.
    run_seq: AtomicU32,
    /// H: the instance handed to the running worker (valid while HANDOFF is set).
    handoff: Mutex<Option<T>>,
    /// C: waiters of `wait_until`.
    waiters: Mutex<()>,
    /// C: signalled when RUNNING or PENDING changes while WAITERS is set.
    wake: Condvar,
}

impl<T> WorkState<T> {
    pub(crate) fn new() -> Self {
        WorkState {
            word: AtomicU64::new(0),
            run_seq: AtomicU32::new(0),
            handoff: Mutex::new(None),
            waiters: Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    /// The whole word (for tests and `is_pending`).
    pub(crate) fn load(&self) -> u64 {
        self.word.load(SeqCst)
    }

    /// Applies `f` until the CAS succeeds; `f` returns `None` to give up. Returns the
    /// old word and whether it changed.
    fn update(&self, mut f: impl FnMut(u64) -> Option<u64>) -> (u64, bool) {
        let mut old = self.word.load(SeqCst);
        loop {
            let Some(new) = f(old) else {
                return (old, false);
            };
            match self.word.compare_exchange_weak(old, new, SeqCst, SeqCst) {
                Ok(_) => return (old, true),
                Err(current) => old = current,
            }
        }
    }

    fn notify_if(&self, old: u64) {
        if old & WAITERS != 0 {
            drop(lock(&self.waiters));
            self.wake.notify_all();
        }
    }

    /// `test_and_set(PENDING)`: fails if already pending or disabled. On success the new
    /// instance's sequence number is returned; `timer` marks it as sitting on the timer.
    pub(crate) fn try_pend(&self, timer: bool) -> Option<u32> {
        let flags = PENDING | if timer { TIMER } else { 0 };
        let (old, ok) = self.update(|w| {
            (w & PENDING == 0 && !disabled(w))
                .then(|| with_seq(w | flags, seq_of(w).wrapping_add(1)))
        });
        ok.then(|| seq_of(old).wrapping_add(1))
    }

    /// Grabs PENDING whatever the state (`mod_delayed_work`): a pending instance is
    /// superseded (it becomes stale wherever it is). Returns whether one was pending and
    /// the new instance's sequence, or `None` if the item is disabled.
    pub(crate) fn repend(&self, timer: bool) -> Option<(bool, u32)> {
        let (old, ok) = self.update(|w| {
            (!disabled(w)).then(|| {
                let flags = (w & !TIMER) | PENDING | if timer { TIMER } else { 0 };
                with_seq(flags, seq_of(w).wrapping_add(1))
            })
        });
        ok.then(|| (old & PENDING != 0, seq_of(old).wrapping_add(1)))
    }

    /// The timer fired for instance `seq`: it leaves the timer (still PENDING). False if
    /// the instance was cancelled or superseded meanwhile.
    pub(crate) fn fire_timer(&self, seq: u32) -> bool {
        self.update(|w| {
            (w & (PENDING | TIMER) == PENDING | TIMER && seq_of(w) == seq).then_some(w & !TIMER)
        })
        .1
    }

    /// Takes a pending instance off the timer to queue it now (`flush_delayed_work`):
    /// the timer's instance becomes stale and the new sequence is returned.
    pub(crate) fn steal_timer(&self) -> Option<u32> {
        let (old, ok) = self.update(|w| {
            (w & (PENDING | TIMER) == PENDING | TIMER)
                .then(|| with_seq(w & !TIMER, seq_of(w).wrapping_add(1)))
        });
        ok.then(|| seq_of(old).wrapping_add(1))
    }

    /// A worker took instance `seq` off a worklist. `Run` clears PENDING and sets
    /// RUNNING in one step: the kernel's "clear PENDING just before the function runs".
    pub(crate) fn start(&self, seq: u32) -> Start {
        let mut verdict = Start::Stale;
        let (_, ok) = self.update(|w| {
            if w & PENDING == 0 || seq_of(w) != seq {
                verdict = Start::Stale;
                None
            } else if w & RUNNING != 0 {
                verdict = Start::Busy;
                None
            } else {
                verdict = Start::Run;
                Some((w & !PENDING) | RUNNING)
            }
        });
        if ok {
            // Release: pairs with the Acquire load in `wait_until`.
            self.run_seq.store(seq, Release);
        }
        verdict
    }

    /// Hands `payload` to the worker running the item. Returns an entry the caller must
    /// take through `start` again: `payload` itself if that worker finished meanwhile,
    /// or the entry it displaced from the slot (an instance that went stale while it
    /// waited there, or — if `payload` went stale since its `start` — the live one).
    pub(crate) fn hand_off(&self, payload: T) -> Option<T> {
        // HANDOFF and the slot change together under the slot lock: HANDOFF is set
        // exactly while the slot holds an entry.
        let mut slot = lock(&self.handoff);
        let (_, ok) = self.update(|w| (w & RUNNING != 0).then_some(w | HANDOFF));
        if ok {
            slot.replace(payload)
        } else {
            Some(payload)
        }
    }

    /// The running worker finished one run. Returns the next instance handed to it (the
    /// item stays RUNNING: the caller must `restart` it), or `None` with RUNNING cleared.
    pub(crate) fn finish(&self) -> Option<T> {
        loop {
            let (old, ok) = self.update(|w| (w & HANDOFF == 0).then_some(w & !(RUNNING | WAITERS)));
            if ok {
                self.notify_if(old);
                return None;
            }
            // Clear HANDOFF and empty the slot in one hold of the slot lock, so that a
            // depositor cannot set HANDOFF again in between and leave it set over an
            // empty slot. Only this worker clears HANDOFF, so the CAS succeeds.
            let mut slot = lock(&self.handoff);
            let (_, ok) = self.update(|w| (w & HANDOFF != 0).then_some(w & !HANDOFF));
            if ok {
                return slot.take();
            }
        }
    }

    /// Runs handed-off instance `seq` on the worker already holding RUNNING. False if it
    /// went stale (the caller drops it and calls `finish` again).
    pub(crate) fn restart(&self, seq: u32) -> bool {
        let (old, ok) = self
            .update(|w| (w & PENDING != 0 && seq_of(w) == seq).then_some(w & !(PENDING | WAITERS)));
        if ok {
            // Release: pairs with the Acquire load in `wait_until`.
            self.run_seq.store(seq, Release);
            self.notify_if(old);
        }
        ok
    }

    /// `cancel_work`: clears PENDING (the queued instance goes stale). Returns whether
    /// the item was pending. Never waits.
    pub(crate) fn cancel(&self) -> bool {
        let (old, ok) = self.update(|w| {
            (w & PENDING != 0)
                .then(|| with_seq(w & !(PENDING | TIMER | WAITERS), seq_of(w).wrapping_add(1)))
        });
        if ok {
            self.notify_if(old);
        }
        ok
    }

    /// Gives back PENDING taken for instance `seq` that was never queued (the workqueue
    /// refused it); does nothing if that instance was cancelled meanwhile (a later
    /// instance is never touched). Returns whether it gave it back.
    pub(crate) fn release(&self, seq: u32) -> bool {
        let (old, ok) = self.update(|w| {
            (w & PENDING != 0 && seq_of(w) == seq)
                .then(|| with_seq(w & !(PENDING | TIMER | WAITERS), seq.wrapping_add(1)))
        });
        if ok {
            self.notify_if(old);
        }
        ok
    }

    /// Raises the disable depth (queueing fails while it is above zero) and cancels a
    /// pending instance. Returns whether one was pending, or `None` (nothing changed)
    /// when the depth is already at [`MAX_DISABLE_DEPTH`]; an item that deep is
    /// disabled, so nothing of it is pending either.
    pub(crate) fn disable(&self) -> Option<bool> {
        let (old, ok) = self.update(|w| {
            if w & DISABLE_MASK == DISABLE_MASK {
                None
            } else if w & PENDING != 0 {
                Some(
                    with_seq(w & !(PENDING | TIMER | WAITERS), seq_of(w).wrapping_add(1))
                        + DISABLE_ONE,
                )
            } else {
                Some(w + DISABLE_ONE)
            }
        });
        if !ok {
            return None;
        }
        self.notify_if(old);
        Some(old & PENDING != 0)
    }

    /// Lowers the disable depth. Returns whether it reached zero (queueing accepted
    /// again), or `None` (nothing changed) if the item was not disabled.
    pub(crate) fn enable(&self) -> Option<bool> {
        let (old, ok) = self.update(|w| disabled(w).then(|| w - DISABLE_ONE));
        ok.then_some((old & DISABLE_MASK) == DISABLE_ONE)
    }

    /// The disable depth.
    pub(crate) fn disable_depth(&self) -> u32 {
        ((self.load() & DISABLE_MASK) >> DISABLE_SHIFT) as u32
    }

    /// Blocks until `done(word, run_seq)` holds.
    pub(crate) fn wait_until(&self, done: impl Fn(u64, u32) -> bool) {
        // Acquire: pairs with the Release stores of run_seq.
        if done(self.word.load(SeqCst), self.run_seq.load(Acquire)) {
            return;
        }
        let mut guard = lock(&self.waiters);
        loop {
            // Setting WAITERS first: a transition after this RMW sees it and notifies
            // under `waiters`, which we hold until `wait` releases it.
            let word = self.word.fetch_or(WAITERS, SeqCst) | WAITERS;
            if done(word, self.run_seq.load(Acquire)) {
                return;
            }
            guard = wait(&self.wake, guard);
        }
    }

    /// `flush_work`: waits for the instance pending at the call (unless it is on the
    /// timer) and the running one to finish. Returns whether there was one to wait for.
    pub(crate) fn flush(&self) -> bool {
        let word = self.load();
        if word & RUNNING == 0 && (word & PENDING == 0 || word & TIMER != 0) {
            return false;
        }
        let target = seq_of(word);
        self.wait_until(|w, run| {
            let pending = w & PENDING != 0 && w & TIMER == 0 && seq_of(w) == target;
            let running = w & RUNNING != 0 && seq_le(run, target);
            !pending && !running
        });
        true
    }

    /// Waits until no worker runs the item.
    pub(crate) fn wait_not_running(&self) {
        self.wait_until(|w, _| w & RUNNING == 0);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn pending_bit_lifecycle() {
        let s: WorkState<u32> = WorkState::new();
        let a = s.try_pend(false).unwrap();
        assert_eq!(
            s.try_pend(false),
            None,
            "queueing a pending item does nothing"
        );
        assert_eq!(s.start(a), Start::Run);
        assert_eq!(
            s.load() & PENDING,
            0,
            "PENDING clears as the function starts"
        );
        let b = s
            .try_pend(false)
            .expect("queueing while running schedules one more run");
        assert_eq!(s.start(b), Start::Busy, "never concurrently with itself");
        assert_eq!(s.hand_off(b), None);
        assert_eq!(s.finish(), Some(b));
        assert!(s.restart(b));
        assert_eq!(s.finish(), None);
        assert_eq!(s.load() & (PENDING | RUNNING | HANDOFF), 0);
    }

    #[test]
    fn cancel_makes_instances_stale() {
        let s: WorkState<u32> = WorkState::new();
        let a = s.try_pend(false).unwrap();
        assert!(s.cancel());
        assert!(!s.cancel());
        assert_eq!(s.start(a), Start::Stale);
        let b = s.try_pend(true).unwrap();
        assert!(!s.flush(), "flush_work ignores an instance on the timer");
        let (was, c) = s.repend(true).unwrap();
        assert!(was);
        assert!(!s.fire_timer(b), "superseded timer instance");
        assert!(s.fire_timer(c));
        assert_eq!(s.start(c), Start::Run);
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn disable_refuses_queueing() {
        let s: WorkState<u32> = WorkState::new();
        let a = s.try_pend(false).unwrap();
        assert_eq!(s.disable(), Some(true));
        assert_eq!(s.try_pend(false), None);
        assert_eq!(s.repend(false), None);
        assert_eq!(s.start(a), Start::Stale);
        assert_eq!(s.enable(), Some(true));
        assert!(s.try_pend(false).is_some());
    }

    #[test]
    fn disable_nests_and_refuses_beyond_its_depth() {
        let s: WorkState<u32> = WorkState::new();
        assert_eq!(s.enable(), None, "enabling an enabled item changes nothing");
        assert_eq!(s.disable(), Some(false));
        assert_eq!(s.disable(), Some(false));
        assert_eq!(s.disable_depth(), 2);
        assert_eq!(s.enable(), Some(false), "still disabled once");
        assert_eq!(s.try_pend(false), None);
        assert_eq!(s.enable(), Some(true));
        assert_eq!(s.disable_depth(), 0);
        for _ in 0..MAX_DISABLE_DEPTH {
            assert!(s.disable().is_some());
        }
        let word = s.load();
        assert_eq!(
            s.disable(),
            None,
            "the depth does not wrap or saturate silently"
        );
        assert_eq!(s.load(), word);
        assert_eq!(s.disable_depth(), MAX_DISABLE_DEPTH);
        let seq = seq_of(word);
        for _ in 1..MAX_DISABLE_DEPTH {
            assert_eq!(s.enable(), Some(false));
        }
        assert_eq!(s.enable(), Some(true));
        assert_eq!(seq_of(s.load()), seq, "the sequence is untouched");
        assert_eq!(s.try_pend(false), Some(seq.wrapping_add(1)));
    }

    #[test]
    fn handoff_returns_when_runner_finished() {
        let s: WorkState<u32> = WorkState::new();
        let a = s.try_pend(false).unwrap();
        assert_eq!(s.start(a), Start::Run);
        let b = s.try_pend(false).unwrap();
        assert_eq!(s.start(b), Start::Busy);
        assert_eq!(s.finish(), None);
        assert_eq!(s.hand_off(b), Some(b), "runner gone: take it back");
        assert_eq!(s.start(b), Start::Run);
    }

    /// An instance waiting in the handoff slot is cancelled and the item queued again
    /// while the same run goes on: the new instance's depositor finds HANDOFF already
    /// set. The stale entry must come back to be dropped (and accounted), and the new
    /// one must reach the runner; before, the stale entry was overwritten unaccounted
    /// and the runner could leave RUNNING set with nothing to run.
    #[test]
    fn handoff_over_a_cancelled_handed_instance() {
        let s: WorkState<u32> = WorkState::new();
        let a = s.try_pend(false).unwrap();
        assert_eq!(s.start(a), Start::Run);
        let b = s.try_pend(false).unwrap();
        assert_eq!(s.start(b), Start::Busy);
        assert_eq!(s.hand_off(b), None);
        assert!(s.cancel(), "the handed instance is still pending");
        let c = s.try_pend(false).unwrap();
        assert_eq!(s.start(c), Start::Busy);
        let back = s
            .hand_off(c)
            .expect("the displaced stale instance comes back");
        assert_eq!(back, b);
        assert_eq!(s.start(back), Start::Stale, "dropped and counted cancelled");
        assert_eq!(s.finish(), Some(c), "the runner gets the live instance");
        assert!(s.restart(c));
        assert_eq!(s.finish(), None);
        assert_eq!(s.load() & (PENDING | RUNNING | HANDOFF), 0);
    }

    #[test]
    fn sequence_order_wraps() {
        assert!(seq_le(1, 1));
        assert!(seq_le(1, 2));
        assert!(!seq_le(2, 1));
        assert!(seq_le(u32::MAX, 0));
    }
}

/// Loom models of the pending-bit protocol, run on the real `WorkState`:
/// `RUSTFLAGS="--cfg loom" cargo test -p podq --release --lib loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;

    /// A worker's handling of one instance taken off a worklist, as `pool::worker::run_entry`:
    /// start it, hand it off if busy, run it and whatever is handed to it.
    fn process(s: &WorkState<u32>, seq: u32, running: &AtomicBool, runs: &AtomicU32) {
        let mut seq = seq;
        loop {
            match s.start(seq) {
                Start::Stale => return,
                Start::Run => break,
                Start::Busy => match s.hand_off(seq) {
                    None => return,
                    Some(back) => seq = back,
                },
            }
        }
        loop {
            assert!(!running.swap(true, SeqCst), "ran concurrently with itself");
            runs.fetch_add(1, SeqCst);
            running.store(false, SeqCst);
            loop {
                let Some(next) = s.finish() else {
                    return;
                };
                if s.restart(next) {
                    seq = next;
                    break;
                }
            }
            let _ = seq;
        }
    }

    /// Two threads each queue the item and, if accepted, act as the worker that takes
    /// the instance off a worklist: every accepted queueing runs exactly once (or merges
    /// into a pending one), never concurrently, and the item ends idle.
    #[test]
    fn loom_queue_run_requeue() {
        loom::model(|| {
            let s = Arc::new(WorkState::<u32>::new());
            let running = Arc::new(AtomicBool::new(false));
            let runs = Arc::new(AtomicU32::new(0));
            let accepted = Arc::new(AtomicU32::new(0));
            let queue_and_work = {
                let (s, running, runs, accepted) =
                    (s.clone(), running.clone(), runs.clone(), accepted.clone());
                move || {
                    if let Some(seq) = s.try_pend(false) {
                        accepted.fetch_add(1, SeqCst);
                        process(&s, seq, &running, &runs);
                    }
                }
            };
            let other = loom::thread::spawn(queue_and_work.clone());
            queue_and_work();
            other.join().unwrap();
            assert_eq!(runs.load(SeqCst), accepted.load(SeqCst));
            assert!(accepted.load(SeqCst) >= 1);
            assert_eq!(s.load() & (PENDING | RUNNING | HANDOFF), 0);
        });
    }

    /// `cancel_sync` against an item that re-queues itself from its own function: once
    /// the canceller has waited, nothing is pending or running, and queueing is refused
    /// until it re-enables.
    #[test]
    fn loom_cancel_sync_beats_self_requeue() {
        loom::model(|| {
            let s = Arc::new(WorkState::<u32>::new());
            let first = s.try_pend(false).unwrap();
            let worker = {
                let s = s.clone();
                loom::thread::spawn(move || {
                    let mut seq = first;
                    // Three rounds keep the model small; a last instance left pending
                    // stands for an entry still on a worklist.
                    for _ in 0..3 {
                        if s.start(seq) != Start::Run {
                            return;
                        }
                        let again = s.try_pend(false);
                        assert!(s.finish().is_none());
                        match again {
                            Some(next) => seq = next,
                            None => return,
                        }
                    }
                })
            };
            let canceller = {
                let s = s.clone();
                loom::thread::spawn(move || {
                    assert!(s.disable().is_some());
                    s.wait_not_running();
                    assert_eq!(s.load() & (PENDING | RUNNING), 0, "survived cancel_sync");
                    assert_eq!(s.try_pend(false), None, "queueing refused while disabled");
                    assert_eq!(s.enable(), Some(true));
                })
            };
            worker.join().unwrap();
            canceller.join().unwrap();
        });
    }

    /// A handed instance is cancelled and the item queued again while the same run goes
    /// on; the new instance's worker hands it off (finding HANDOFF set over the stale
    /// entry) while the runner finishes. The live instance runs exactly once, the stale
    /// one is dropped exactly once, and the item ends idle.
    #[test]
    fn loom_handoff_over_a_stale_handed_instance() {
        loom::model(|| {
            let s = Arc::new(WorkState::<u32>::new());
            let first = s.try_pend(false).unwrap();
            assert_eq!(s.start(first), Start::Run);
            let stale = s.try_pend(false).unwrap();
            assert_eq!(s.start(stale), Start::Busy);
            assert_eq!(s.hand_off(stale), None);
            assert!(s.cancel());
            let live = s.try_pend(false).unwrap();
            let runs = Arc::new(AtomicU32::new(0));
            let dropped = Arc::new(AtomicU32::new(0));
            let depositor = {
                let (s, runs, dropped) = (s.clone(), runs.clone(), dropped.clone());
                loom::thread::spawn(move || {
                    let mut seq = live;
                    loop {
                        match s.start(seq) {
                            Start::Stale => {
                                dropped.fetch_add(1, SeqCst);
                                return;
                            }
                            Start::Run => break,
                            Start::Busy => match s.hand_off(seq) {
                                None => return,
                                Some(back) => seq = back,
                            },
                        }
                    }
                    assert_eq!(seq, live);
                    runs.fetch_add(1, SeqCst);
                    assert_eq!(s.finish(), None, "nothing else was queued");
                })
            };
            // The runner ends its run of `first` and runs what is handed to it.
            while let Some(next) = s.finish() {
                if s.restart(next) {
                    assert_eq!(next, live);
                    runs.fetch_add(1, SeqCst);
                } else {
                    dropped.fetch_add(1, SeqCst);
                }
            }
            depositor.join().unwrap();
            assert_eq!(runs.load(SeqCst), 1, "the live instance runs once");
            assert_eq!(
                dropped.load(SeqCst),
                1,
                "the stale instance is dropped once"
            );
            assert_eq!(s.load() & (PENDING | RUNNING | HANDOFF), 0);
        });
    }

    /// `flush` returns only after the instance pending at its call has run.
    #[test]
    fn loom_flush_waits_for_the_pending_instance() {
        loom::model(|| {
            let s = Arc::new(WorkState::<u32>::new());
            let running = Arc::new(AtomicBool::new(false));
            let runs = Arc::new(AtomicU32::new(0));
            let seq = s.try_pend(false).unwrap();
            let worker = {
                let (s, running, runs) = (s.clone(), running.clone(), runs.clone());
                loom::thread::spawn(move || process(&s, seq, &running, &runs))
            };
            let flusher = {
                let (s, runs) = (s.clone(), runs.clone());
                loom::thread::spawn(move || {
                    s.flush();
                    assert_eq!(runs.load(SeqCst), 1, "flush returned before the run ended");
                })
            };
            worker.join().unwrap();
            flusher.join().unwrap();
        });
    }
}

//! Flush colours and in-flight accounting on atomics: which items a `flush()` must wait
//! for, and when a retired pwq is empty. Protocol: `workqueue/README.md` ("Flush").
//!
//! Legend: A atomic (ordering and pair named at each field); F guarded by
//! `FlushDomain::lock`; Z guarded by `FlushDomain::serial` (one flusher at a time).

use crate::sync::{
    lock, seqcst_pair_fence, wait, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex,
    Ordering::SeqCst,
};

/// One of the two flush colours; an item takes the colour of the generation it was
/// queued in (`gen & 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Colour(u8);

impl Colour {
    fn of(gen: u64) -> Colour {
        Colour((gen & 1) as u8)
    }

    fn shift(self) -> u32 {
        32 * u32::from(self.0)
    }

    pub(crate) fn index(self) -> usize {
        usize::from(self.0)
    }

    /// The colour as one bit (for `EntryMeta`'s packed word), and back.
    pub(crate) fn bit(self) -> u64 {
        u64::from(self.0)
    }

    pub(crate) fn from_bit(bit: u64) -> Colour {
        Colour((bit & 1) as u8)
    }
}

/// Set once a pwq retired: only from an all-zero word, so a retired pwq never again
/// counts an item (a queuer that finds it undoes its add and retries).
const DEAD: u64 = 1 << 63;
/// One colour's count: 31 bits, with a guard bit above colour 0's.
const COUNT: u64 = (1 << 31) - 1;

/// The count of colour index `c` in an [`InFlight`] word.
fn count_of(word: u64, c: usize) -> u64 {
    (word >> (32 * c)) & COUNT
}

/// In-flight items of one pwq by colour, and its retirement.
#[derive(Debug)]
pub(crate) struct InFlight {
    /// A: bits 0–30 colour 0, bits 32–62 colour 1, bit 63 [`DEAD`]. Every access is
    /// `SeqCst` (so totally ordered; `sync::seqcst_pair_fence` between a write and the
    /// read it pairs with gives loom the same order): a
    /// queuer's add, then its re-read of the generation, against a flusher's bump of
    /// it, then its loads of this word ([`FlushDomain::gen`]); a removal, then its load
    /// of `flushers` or of `current`, against a flusher's increment of `flushers`, then
    /// its loads of this word, or [`InFlight::leave`]'s store of `current`, then its
    /// retirement attempt. In each pair at least one side sees the other.
    word: AtomicU64,
    /// A: the pwq is in the current table (see `word` for its pair).
    current: AtomicBool,
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight {
            word: AtomicU64::new(0),
            current: AtomicBool::new(true),
        }
    }
}

/// What a removal did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Left {
    /// A colour the removal counted down reached zero: a flusher may be done.
    pub(crate) cleared: bool,
    /// It emptied a pwq that had left the table, and retired it (exactly one removal
    /// or [`InFlight::leave`] does).
    pub(crate) retired: bool,
}

impl InFlight {
    /// Counts `n` items of `colour`. Returns false, counting nothing, if the pwq has
    /// retired.
    pub(crate) fn add(&self, colour: Colour, n: u64) -> bool {
        let step = n << colour.shift();
        let before = self.word.fetch_add(step, SeqCst);
        if before & DEAD != 0 {
            self.word.fetch_sub(step, SeqCst);
            return false;
        }
        true
    }

    /// Uncounts items that finished (or were dropped, or whose queueing was undone):
    /// `done[c]` of colour `c`. Retires the pwq if that emptied it and it has left the
    /// table.
    pub(crate) fn remove(&self, done: [u64; 2]) -> Left {
        let step = done[0] | (done[1] << 32);
        let after = self.word.fetch_sub(step, SeqCst) - step;
        let cleared = (0..2).any(|c| done[c] > 0 && count_of(after, c) == 0);
        let retired = after == 0
            && {
                // Between the removal and the load of `current`: see `word`.
                seqcst_pair_fence();
                !self.current.load(SeqCst)
            }
            && self.try_retire();
        Left { cleared, retired }
    }

    /// The pwq leaves the table (an attribute change or teardown); retires it at once
    /// if nothing is in flight. Returns whether it did.
    pub(crate) fn leave(&self) -> bool {
        self.current.store(false, SeqCst);
        // Between the store and the retirement attempt: see `word`.
        seqcst_pair_fence();
        self.try_retire()
    }

    /// Retires the pwq if nothing is in flight (`CAS 0 → DEAD`): exactly one caller
    /// succeeds.
    fn try_retire(&self) -> bool {
        self.word.compare_exchange(0, DEAD, SeqCst, SeqCst).is_ok()
    }

    /// Whether no item of `colour` is in flight.
    pub(crate) fn clear(&self, colour: Colour) -> bool {
        count_of(self.word.load(SeqCst), colour.index()) == 0
    }

    /// Whether uncounting `done[c]` items of each colour `c` would clear a colour
    /// (a hint: the word may change before the removal).
    pub(crate) fn would_clear(&self, done: [u64; 2]) -> bool {
        let word = self.word.load(SeqCst);
        (0..2).any(|c| done[c] > 0 && count_of(word, c) <= done[c])
    }

    /// Whether nothing is in flight.
    pub(crate) fn is_empty(&self) -> bool {
        self.word.load(SeqCst) & !DEAD == 0
    }

    /// How many items are in flight, both colours together.
    pub(crate) fn total(&self) -> u64 {
        let word = self.word.load(SeqCst);
        count_of(word, 0) + count_of(word, 1)
    }
}

/// The flush state of one workqueue.
#[derive(Debug, Default)]
pub(crate) struct FlushDomain {
    /// A: the generation; its low bit is the colour new items take. Only a flusher
    /// bumps it (`SeqCst`, under `serial`). A queuer reads it, adds its item to the
    /// pwq's [`InFlight`] and reads it again (`SeqCst`); if it moved, it undoes the add
    /// and retries. So an item is counted in the colour of a generation that was
    /// still current after its add: the flusher's bump, then its loads of the counts,
    /// see that add.
    gen: AtomicU64,
    /// Z: serialises flushers, so that a colour is reused only after every item of
    /// its previous use finished.
    serial: Mutex<()>,
    /// A: flushers waiting. Incremented (`SeqCst`) before a flusher's first check and
    /// read (`SeqCst`) by completions after their remove: either a completion sees the
    /// flusher or the flusher's check sees the completion.
    flushers: AtomicUsize,
    /// F: serialises checks against notifications.
    lock: Mutex<()>,
    /// F: signalled when a colour count reached zero while a flusher waits.
    cv: Condvar,
}

impl FlushDomain {
    /// The generation a newly queued item tries to take.
    pub(crate) fn current(&self) -> u64 {
        self.gen.load(SeqCst)
    }

    /// The colour of generation `gen`.
    pub(crate) fn colour(gen: u64) -> Colour {
        Colour::of(gen)
    }

    /// Whether generation `gen` is still current (a queuer's check after its add).
    pub(crate) fn still(&self, gen: u64) -> bool {
        // Between the add and this load: see `InFlight::word`.
        seqcst_pair_fence();
        self.gen.load(SeqCst) == gen
    }

    /// Whether a flusher waits (completions deferred by a worker settle at once then).
    pub(crate) fn waited_on(&self) -> bool {
        self.flushers.load(SeqCst) > 0
    }

    /// Waits until `clear(colour)` holds for the colour of every item queued before
    /// this call; later items take the other colour.
    pub(crate) fn flush(&self, clear: impl Fn(Colour) -> bool) {
        let _one = lock(&self.serial);
        // Every earlier flusher returned: items of older generations have finished,
        // and the colour about to be waited for holds only this generation's items.
        let colour = Colour::of(self.gen.fetch_add(1, SeqCst));
        self.flushers.fetch_add(1, SeqCst);
        // Between the writes and the loads of the counts: see `InFlight::word`.
        seqcst_pair_fence();
        let mut guard = lock(&self.lock);
        while !clear(colour) {
            guard = wait(&self.cv, guard);
        }
        drop(guard);
        self.flushers.fetch_sub(1, SeqCst);
    }

    /// Called after a removal cleared a colour (see [`Left::cleared`]).
    pub(crate) fn cleared(&self) {
        // Between the removal and this load: see `InFlight::word`.
        seqcst_pair_fence();
        if self.flushers.load(SeqCst) > 0 {
            drop(lock(&self.lock));
            self.cv.notify_all();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn colours_count_apart_and_retirement_closes_the_word() {
        let f = InFlight::default();
        let (c0, c1) = (Colour::of(4), Colour::of(7));
        assert!(f.clear(c0) && f.is_empty());
        assert!(f.add(c0, 2));
        assert!(f.add(c1, 1));
        let left = |cleared, retired| Left { cleared, retired };
        assert!(!f.leave(), "items in flight");
        assert_eq!(f.remove([0, 1]), left(true, false));
        assert!(f.clear(c1) && !f.clear(c0));
        assert_eq!(f.remove([1, 0]), left(false, false));
        assert_eq!(
            f.remove([1, 0]),
            left(true, true),
            "the last item retires it"
        );
        assert!(!f.leave(), "retired once");
        assert!(!f.add(c0, 1), "a retired pwq counts nothing");
        let g = InFlight::default();
        assert!(g.add(c0, 1));
        assert_eq!(g.remove([1, 0]), left(true, false), "still in the table");
        assert!(g.leave(), "an empty pwq retires as it leaves the table");
        assert!(f.is_empty());
    }

    #[test]
    fn each_flush_takes_the_other_colour() {
        let d = FlushDomain::default();
        let first = FlushDomain::colour(d.current());
        let waited = std::cell::Cell::new(None);
        d.flush(|c| {
            waited.set(Some(c));
            true
        });
        assert_eq!(waited.get(), Some(first), "waits for the colour items took");
        assert!(!d.still(0));
        assert_ne!(FlushDomain::colour(d.current()), first);
        d.flush(|_| true);
        assert_eq!(FlushDomain::colour(d.current()), first);
        assert!(!d.waited_on());
    }
}

/// Loom model of the flush protocol on the real `InFlight` and `FlushDomain`:
/// `RUSTFLAGS="--cfg loom" cargo test -p podq --release --lib loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;

    /// The queue side as `Pwq::count_in`: take the generation, add, re-check, undo and
    /// retry if a flush moved it.
    fn count_in(domain: &FlushDomain, pwq: &InFlight) -> Colour {
        loop {
            let gen = domain.current();
            let colour = FlushDomain::colour(gen);
            assert!(pwq.add(colour, 1));
            if domain.still(gen) {
                return colour;
            }
            let mut done = [0; 2];
            done[colour.index()] = 1;
            if pwq.remove(done).cleared {
                domain.cleared();
            }
        }
    }

    fn complete(domain: &FlushDomain, pwq: &InFlight, colour: Colour) {
        let mut done = [0; 2];
        done[colour.index()] = 1;
        if pwq.remove(done).cleared {
            domain.cleared();
        }
    }

    /// Two pwqs; an item queued on each before the flush; completions race with the
    /// flusher (no lost wake-up: loom reports a deadlock otherwise), and the flush never
    /// returns before both earlier items are done. A third item is queued while the
    /// flush starts (either side of it is right) and completes like any other.
    #[test]
    fn loom_flush_waits_exactly_for_earlier_items() {
        loom::model(|| {
            let domain = Arc::new(FlushDomain::default());
            let pwqs: Arc<[InFlight; 2]> = Arc::new(Default::default());
            let done = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
            let colours: Vec<Colour> = (0..2).map(|i| count_in(&domain, &pwqs[i])).collect();
            let completers: Vec<_> = (0..2)
                .map(|i| {
                    let (domain, pwqs, done) = (domain.clone(), pwqs.clone(), done.clone());
                    let colour = colours[i];
                    loom::thread::spawn(move || {
                        done[i].store(true, SeqCst);
                        complete(&domain, &pwqs[i], colour);
                    })
                })
                .collect();
            let late = {
                let (domain, pwqs) = (domain.clone(), pwqs.clone());
                loom::thread::spawn(move || {
                    let colour = count_in(&domain, &pwqs[0]);
                    complete(&domain, &pwqs[0], colour);
                })
            };
            domain.flush(|c| pwqs.iter().all(|p| p.clear(c)));
            assert!(
                done[0].load(SeqCst) && done[1].load(SeqCst),
                "flush returned early"
            );
            for c in completers {
                c.join().unwrap();
            }
            late.join().unwrap();
            assert!(pwqs.iter().all(InFlight::is_empty));
        });
    }

    /// A completion emptying a pwq races with an attribute change taking it out of
    /// the table: the pwq retires exactly once, and a queuer that finds it retired
    /// counts nothing there.
    #[test]
    fn loom_retired_once() {
        loom::model(|| {
            let pwq = Arc::new(InFlight::default());
            let colour = FlushDomain::colour(0);
            assert!(pwq.add(colour, 1));
            let completer = {
                let pwq = pwq.clone();
                loom::thread::spawn(move || pwq.remove([1, 0]).retired)
            };
            let by_change = pwq.leave();
            let by_completion = completer.join().unwrap();
            assert!(by_change ^ by_completion, "retired exactly once");
            assert!(!pwq.add(colour, 1));
            assert!(pwq.is_empty());
        });
    }

    /// A queue call counting its item on a pwq races with an attribute change taking
    /// the pwq out of the table (`Pwq::count_in` against `InFlight::leave`): either the
    /// item is counted and the pwq stays alive until that item's removal retires it,
    /// or the pwq retired first and the add is refused (the queuer retries on the new
    /// table). Never both, never neither.
    #[test]
    fn loom_queue_call_against_attribute_change() {
        loom::model(|| {
            let pwq = Arc::new(InFlight::default());
            let colour = FlushDomain::colour(0);
            let queuer = {
                let pwq = pwq.clone();
                loom::thread::spawn(move || {
                    if !pwq.add(colour, 1) {
                        return None;
                    }
                    Some(pwq.remove([1, 0]).retired)
                })
            };
            let retired_by_change = pwq.leave();
            match queuer.join().unwrap() {
                None => assert!(retired_by_change, "refused only by a retired pwq"),
                Some(retired_by_item) => {
                    assert!(
                        retired_by_change ^ retired_by_item,
                        "retired exactly once, and not under a counted item"
                    );
                }
            }
            assert!(pwq.is_empty() && !pwq.add(colour, 1));
        });
    }
}

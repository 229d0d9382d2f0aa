//! Flush generations: which items a `flush()` must wait for. Protocol:
//! `workqueue/README.md`.
//!
//! Legend: A atomic (ordering and pair named at each use); F guarded by
//! `FlushDomain::lock`; P guarded by the owning pwq's lock (the caller holds it).

use std::collections::VecDeque;

use crate::sync::{lock, wait, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering::SeqCst};

/// In-flight item counts of one pool_workqueue, by flush generation (P).
///
/// Generations are read under the pwq lock and the wq generation only grows, so they
/// arrive in non-decreasing order: the deque stays sorted, and its front is the oldest
/// generation with an item in flight. Its capacity is reused, so steady-state queueing
/// does not allocate.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    /// P: (generation, items) pairs, ascending, no zero count at the front.
    counts: VecDeque<(u64, u64)>,
}

impl InFlight {
    /// An item of generation `gen` was queued.
    pub(crate) fn add(&mut self, gen: u64) {
        match self.counts.back_mut() {
            Some((g, n)) if *g == gen => *n += 1,
            _ => self.counts.push_back((gen, 1)),
        }
    }

    /// An item of generation `gen` finished (or was dropped). Returns whether the
    /// oldest generation in flight changed, i.e. whether a flusher may be done.
    pub(crate) fn remove(&mut self, gen: u64) -> bool {
        if let Some((_, n)) = self.counts.iter_mut().find(|(g, _)| *g == gen) {
            *n -= 1;
        }
        let mut advanced = false;
        while self.counts.front().is_some_and(|&(_, n)| n == 0) {
            self.counts.pop_front();
            advanced = true;
        }
        advanced
    }

    /// Whether no item of generation `gen` or older is in flight.
    pub(crate) fn clear_up_to(&self, gen: u64) -> bool {
        self.counts.front().map_or(true, |&(g, _)| g > gen)
    }

    /// Whether nothing is in flight.
    pub(crate) fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// How many items are in flight, all generations together.
    pub(crate) fn total(&self) -> u64 {
        self.counts.iter().map(|&(_, n)| n).sum()
    }
}

/// The flush state of one workqueue.
#[derive(Debug, Default)]
pub(crate) struct FlushDomain {
    /// A: the current generation; items take it when queued (read under their pwq
    /// lock), a flush advances it (`SeqCst`, no pair needed beyond the pwq locks).
    gen: AtomicU64,
    /// A: flushers waiting. Incremented (`SeqCst`) before a flusher's first check and
    /// read (`SeqCst`) by completions after they update a pwq; the pwq lock orders the
    /// two, so a completion either sees the flusher or the flusher sees it.
    flushers: AtomicUsize,
    /// F: serialises checks against notifications.
    lock: Mutex<()>,
    /// F: signalled when some pwq's oldest generation advanced while flushers wait.
    cv: Condvar,
}

impl FlushDomain {
    /// The generation a newly queued item takes (call under the pwq lock).
    pub(crate) fn current(&self) -> u64 {
        self.gen.load(SeqCst)
    }

    /// Waits until `all_clear(gen)` holds, where `gen` is the generation of every item
    /// queued before this call; later items take a newer generation.
    pub(crate) fn flush(&self, all_clear: impl Fn(u64) -> bool) {
        let gen = self.gen.fetch_add(1, SeqCst);
        self.flushers.fetch_add(1, SeqCst);
        let mut guard = lock(&self.lock);
        while !all_clear(gen) {
            guard = wait(&self.cv, guard);
        }
        drop(guard);
        self.flushers.fetch_sub(1, SeqCst);
    }

    /// Called after a pwq's oldest generation advanced (outside the pwq lock).
    pub(crate) fn advanced(&self) {
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
    fn generations_track_the_oldest() {
        let mut f = InFlight::default();
        assert!(f.clear_up_to(0));
        f.add(1);
        f.add(1);
        f.add(3);
        assert!(!f.clear_up_to(1));
        assert!(!f.remove(3), "a younger item finishing changes nothing");
        assert!(!f.remove(1));
        assert!(f.remove(1), "the oldest generation emptied");
        assert!(f.clear_up_to(5));
        assert!(f.is_empty());
    }
}

/// Loom model of the flush protocol on the real `InFlight` and `FlushDomain`:
/// `RUSTFLAGS="--cfg loom" cargo test -p podq --release --lib loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;

    /// Two pwqs; an item queued on each before the flush; completions race with the
    /// flusher (no lost wake-up: loom reports a deadlock otherwise), and the flush never
    /// returns before both earlier items are done.
    #[test]
    fn loom_flush_waits_exactly_for_earlier_items() {
        loom::model(|| {
            let domain = Arc::new(FlushDomain::default());
            let pwqs: Arc<[Mutex<InFlight>; 2]> = Arc::new(Default::default());
            let done = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
            let mut gens = [0; 2];
            for (i, g) in gens.iter_mut().enumerate() {
                let mut st = lock(&pwqs[i]);
                *g = domain.current();
                st.add(*g);
            }
            let completers: Vec<_> = (0..2)
                .map(|i| {
                    let (domain, pwqs, done) = (domain.clone(), pwqs.clone(), done.clone());
                    let gen = gens[i];
                    loom::thread::spawn(move || {
                        done[i].store(true, SeqCst);
                        let advanced = lock(&pwqs[i]).remove(gen);
                        if advanced {
                            domain.advanced();
                        }
                    })
                })
                .collect();
            // An item queued while the flush starts: it may fall on either side of the
            // flush's generation, and completes later like any item.
            let late = {
                let (domain, pwqs) = (domain.clone(), pwqs.clone());
                loom::thread::spawn(move || {
                    let g = {
                        let mut st = lock(&pwqs[0]);
                        let g = domain.current();
                        st.add(g);
                        g
                    };
                    let advanced = lock(&pwqs[0]).remove(g);
                    if advanced {
                        domain.advanced();
                    }
                })
            };
            domain.flush(|gen| pwqs.iter().all(|p| lock(p).clear_up_to(gen)));
            assert!(
                done[0].load(SeqCst) && done[1].load(SeqCst),
                "flush returned early"
            );
            for c in completers {
                c.join().unwrap();
            }
            late.join().unwrap();
        });
    }
}

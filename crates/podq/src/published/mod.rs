//! A published value: readers borrow the current one with no locked instruction, a
//! writer replaces it and waits until no reader can still hold the old one (a grace
//! period, as in RCU). The CPU → pwq table is one: every queue call reads it, an
//! attribute change replaces it. Protocol, states and races: `README.md`.
//!
//! Legend: I set at init; A atomic (ordering and pair named at each use); AS written
//! by the holder of a thread lease (`lease.rs`) only; U guarded by `unleased`.

mod barrier;

use std::ops::Deref;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::lease::{self, Slot, LEASES};
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed, Release};
use crate::sync::{read_lock, spin_wait, write_lock, AtomicPtr, AtomicUsize};
use crate::sync::{ReadLock, ReadLockGuard};
use barrier::Barrier;

/// A value readers borrow and writers replace whole (see the module docs).
pub(crate) struct Published<T> {
    /// A: the current value, from `Arc::into_raw`. A writer's `AcqRel` swap pairs with
    /// readers' `Acquire` loads (they see the value's contents) and with the previous
    /// writer's swap.
    current: AtomicPtr<T>,
    /// AS: per lease, the lessee's read sections: odd while it is in one. Its
    /// `Release` store on leaving pairs with a writer's `Acquire` loads, so whatever the
    /// reader did with the value happens before the writer frees it.
    readers: [CachePadded<AtomicUsize>; LEASES],
    /// U: readers without a lease read under this lock; writers take it exclusively,
    /// which serialises them and waits those readers out.
    unleased: ReadLock<()>,
    /// I: the reader's and the writer's fences.
    barrier: Barrier,
}

// SAFETY: a `Published<T>` hands out `&T` to many threads (so `T: Sync`) and drops
// values on whichever thread replaced them or dropped it (so `T: Send`), as `Arc<T>`.
unsafe impl<T: Send + Sync> Send for Published<T> {}
// SAFETY: as for `Send`.
unsafe impl<T: Send + Sync> Sync for Published<T> {}

impl<T> Published<T> {
    pub(crate) fn new(value: Arc<T>) -> Published<T> {
        Published {
            current: AtomicPtr::new(Arc::into_raw(value).cast_mut()),
            readers: std::array::from_fn(|_| CachePadded::new(AtomicUsize::new(0))),
            unleased: ReadLock::new(()),
            barrier: Barrier::new(),
        }
    }

    /// Borrows the current value until the guard drops. Nothing a writer does waits
    /// for less than the guard, so keep it short; a nested read by the same thread is
    /// allowed, a replace inside one deadlocks.
    #[inline]
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        self.read_as(reader_slot())
    }

    /// [`read`](Self::read) as the holder of `slot` (the loom models pick it).
    #[inline]
    pub(crate) fn read_as(&self, slot: Slot) -> ReadGuard<'_, T> {
        let Slot::Leased(i) = slot else {
            let guard = read_lock(&self.unleased);
            // Acquire: pairs with the writers' swaps (which the lock orders anyway).
            let value = self.current.load(Acquire);
            return ReadGuard {
                value,
                exit: Exit::Unleased(guard),
            };
        };
        let mine = &*self.readers[i];
        let seq = mine.load(Relaxed);
        if seq & 1 == 1 {
            // This thread is in a section already, which covers whatever it loads.
            return ReadGuard {
                value: self.current.load(Acquire),
                exit: Exit::Nested,
            };
        }
        // Announce, fence, then load: the writer's side is swap, fence, then read the
        // announcements (`wait_for_readers`). Either this load sees the new value or
        // the writer sees the section and waits for it.
        mine.store(seq.wrapping_add(1), Relaxed);
        self.barrier.light();
        let value = self.current.load(Acquire);
        ReadGuard {
            value,
            exit: Exit::Leased {
                mine,
                seq: seq.wrapping_add(2),
            },
        }
    }

    /// The current value, as a reference of its own.
    pub(crate) fn load(&self) -> Arc<T> {
        let guard = self.read();
        // SAFETY: the pointer came from `Arc::into_raw` and the guard keeps that `Arc`
        // alive, so the count is positive while we add one to it.
        unsafe {
            Arc::increment_strong_count(guard.value);
            Arc::from_raw(guard.value)
        }
    }

    /// Publishes `new` and returns the old value once no reader can hold it.
    pub(crate) fn replace(&self, new: Arc<T>) -> Arc<T> {
        let _writers = write_lock(&self.unleased);
        let old = self.current.swap(Arc::into_raw(new).cast_mut(), AcqRel);
        self.wait_for_readers();
        // SAFETY: `old` came from `Arc::into_raw` and was the published value, whose
        // reference the table held; no reader holds it any more (`wait_for_readers`),
        // and no later reader can load it, so that reference is ours to take back.
        unsafe { Arc::from_raw(old) }
    }

    /// Waits until every read section that began before the call has ended.
    pub(crate) fn synchronize(&self) {
        let _writers = write_lock(&self.unleased);
        self.wait_for_readers();
    }

    /// The grace period: fence, then wait for each leased section seen open to end.
    /// Unleased readers are excluded by the caller's write lock.
    fn wait_for_readers(&self) {
        debug_assert!(
            !matches!(reader_slot(), Slot::Leased(i) if self.readers[i].load(Relaxed) & 1 == 1),
            "a Published replaced or synchronised inside its own read section"
        );
        self.barrier.heavy();
        for reader in &self.readers {
            // Acquire: pairs with the reader's `Release` on leaving (see `readers`).
            let seen = reader.load(Acquire);
            if seen & 1 == 0 {
                continue;
            }
            // A changed count means that section ended; a later one loads the new value.
            let mut spins = 0;
            while reader.load(Acquire) == seen {
                spin_wait(&mut spins);
            }
        }
    }
}

impl<T> Drop for Published<T> {
    fn drop(&mut self) {
        let value = self.current.load(Relaxed);
        // SAFETY: `&mut self`: no reader or writer is left, and `value` came from
        // `Arc::into_raw` and holds the reference the table kept.
        drop(unsafe { Arc::from_raw(value) });
    }
}

/// Which kind of reader the calling thread is: the holder of a lease if it has one.
/// Under loom every model thread shares the OS thread's leases, so the runtime reads
/// unleased there and the models choose slots themselves.
#[inline]
fn reader_slot() -> Slot {
    if cfg!(loom) {
        Slot::Shared(0)
    } else {
        lease::slot()
    }
}

/// A borrowed published value.
pub(crate) struct ReadGuard<'a, T> {
    value: *const T,
    exit: Exit<'a>,
}

/// How a read section ends.
enum Exit<'a> {
    /// The leased slot goes to `seq` (even: outside).
    Leased { mine: &'a AtomicUsize, seq: usize },
    /// Inside another section of the same thread: nothing to do.
    Nested,
    /// The shared lock is released.
    Unleased(#[allow(dead_code)] ReadLockGuard<'a, ()>),
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the value was published while this section was announced (or under
        // the unleased lock), and writers free a replaced value only after every such
        // section ended; the guard lives no longer than the section.
        unsafe { &*self.value }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    fn drop(&mut self) {
        if let Exit::Leased { mine, seq } = self.exit {
            // Release: pairs with the writer's `Acquire` loads (see `readers`).
            mine.store(seq, Release);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::AtomicBool;
    use crate::sync::Ordering::SeqCst;

    /// A value that counts its drops and says whether it was dropped.
    struct Tracked {
        id: usize,
        dropped: Arc<AtomicUsize>,
    }

    impl Drop for Tracked {
        fn drop(&mut self) {
            self.dropped.fetch_add(1, SeqCst);
        }
    }

    fn tracked(id: usize, dropped: &Arc<AtomicUsize>) -> Arc<Tracked> {
        Arc::new(Tracked {
            id,
            dropped: Arc::clone(dropped),
        })
    }

    #[test]
    fn a_replace_returns_the_old_value_and_readers_see_the_new_one() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let p = Published::new(tracked(1, &dropped));
        assert_eq!(p.read().id, 1);
        let old = p.replace(tracked(2, &dropped));
        assert_eq!(old.id, 1);
        assert_eq!(p.read().id, 2);
        assert_eq!(p.load().id, 2);
        drop(old);
        assert_eq!(dropped.load(SeqCst), 1);
        drop(p);
        assert_eq!(dropped.load(SeqCst), 2);
    }

    #[test]
    fn a_nested_read_sees_a_value_and_the_outer_section_still_holds() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let p = Published::new(tracked(1, &dropped));
        let outer = p.read();
        {
            let inner = p.read();
            assert_eq!(inner.id, 1);
        }
        assert_eq!(outer.id, 1);
        drop(outer);
        assert_eq!(p.replace(tracked(2, &dropped)).id, 1);
    }

    #[test]
    fn a_replace_waits_for_an_open_section() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let p = Arc::new(Published::new(tracked(1, &dropped)));
        let entered = Arc::new(std::sync::Barrier::new(2));
        let leave = Arc::new(AtomicBool::new(false));
        let reader = {
            let (p, entered, leave) = (Arc::clone(&p), Arc::clone(&entered), Arc::clone(&leave));
            std::thread::spawn(move || {
                let guard = p.read();
                entered.wait();
                while !leave.load(SeqCst) {
                    std::thread::yield_now();
                }
                guard.id
            })
        };
        entered.wait();
        let writer = {
            let (p, dropped) = (Arc::clone(&p), Arc::clone(&dropped));
            std::thread::spawn(move || drop(p.replace(tracked(2, &dropped))))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(
            dropped.load(SeqCst),
            0,
            "the old value went while a reader held it"
        );
        assert!(!writer.is_finished());
        leave.store(true, SeqCst);
        assert_eq!(reader.join().unwrap(), 1);
        writer.join().unwrap();
        assert_eq!(dropped.load(SeqCst), 1);
    }

    /// Readers with and without leases (more threads than leases) against a writer
    /// replacing the value: every value read is alive, every replaced one is dropped
    /// exactly once.
    #[test]
    fn readers_with_and_without_leases_never_see_a_dropped_value() {
        const READERS: usize = LEASES + 4;
        const REPLACES: usize = 300;
        let dropped = Arc::new(AtomicUsize::new(0));
        let p = Arc::new(Published::new(tracked(0, &dropped)));
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(std::sync::Barrier::new(READERS + 1));
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let (p, dropped, stop) = (Arc::clone(&p), Arc::clone(&dropped), Arc::clone(&stop));
                let started = Arc::clone(&started);
                std::thread::spawn(move || {
                    let mut last = 0;
                    let mut first = true;
                    while first || !stop.load(Relaxed) {
                        let v = p.read();
                        // Ids only grow, and a value read is not yet dropped: the drop
                        // count stays below its id plus one.
                        assert!(v.id >= last);
                        assert!(dropped.load(SeqCst) <= v.id, "read a dropped value");
                        last = v.id;
                        drop(v);
                        if first {
                            started.wait();
                            first = false;
                        }
                    }
                })
            })
            .collect();
        started.wait();
        for id in 1..=REPLACES {
            drop(p.replace(tracked(id, &dropped)));
            assert_eq!(dropped.load(SeqCst), id);
        }
        stop.store(true, SeqCst);
        for r in readers {
            r.join().unwrap();
        }
        drop(p);
        assert_eq!(dropped.load(SeqCst), REPLACES + 1);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::Ordering::SeqCst;
    use crate::sync::{AtomicBool, UnsafeCell};
    use loom::thread;

    /// A value whose contents the writer overwrites once it has it back: loom reports
    /// a race if a reader's access is not ordered before that.
    struct Cell {
        data: UnsafeCell<usize>,
    }

    fn cell(v: usize) -> Arc<Cell> {
        Arc::new(Cell {
            data: UnsafeCell::new(v),
        })
    }

    /// The reader of `slot` reads once; the writer replaces and scribbles on the old
    /// value. The reader sees 1 or 2 and never races the scribble.
    fn reader_against_replace(slot: Slot) {
        loom::model(move || {
            let p = Arc::new(Published::new(cell(1)));
            let reader = {
                let p = Arc::clone(&p);
                thread::spawn(move || {
                    let g = p.read_as(slot);
                    let v = g.data.with(|d| unsafe { *d });
                    assert!(v == 1 || v == 2, "read {v}");
                })
            };
            let old = p.replace(cell(2));
            // SAFETY (model): exclusive once no reader holds it; loom checks it.
            old.data.with_mut(|d| unsafe { *d = 0 });
            reader.join().unwrap();
        });
    }

    #[test]
    fn loom_a_leased_reader_never_sees_a_replaced_value_go() {
        reader_against_replace(Slot::Leased(0));
    }

    #[test]
    fn loom_an_unleased_reader_never_sees_a_replaced_value_go() {
        reader_against_replace(Slot::Shared(0));
    }

    /// A reader marks a flag inside its section; `synchronize` returning means the
    /// section ended or had not announced itself, and then it reads the new value.
    #[test]
    fn loom_synchronize_waits_out_a_section_that_saw_the_old_value() {
        loom::model(|| {
            let p = Arc::new(Published::new(cell(1)));
            let flag = Arc::new(AtomicBool::new(false));
            let reader = {
                let (p, flag) = (Arc::clone(&p), Arc::clone(&flag));
                thread::spawn(move || {
                    let g = p.read_as(Slot::Leased(1));
                    let v = g.data.with(|d| unsafe { *d });
                    // Only a section that read the old value may set the flag.
                    if v == 1 {
                        flag.store(true, Relaxed);
                    }
                })
            };
            let new = cell(2);
            let old = p.replace(new);
            drop(old);
            p.synchronize();
            // Every section that saw value 1 ended before `replace` returned, and
            // its store happened before; one that saw 2 stored nothing.
            let saw_old = flag.load(SeqCst);
            reader.join().unwrap();
            assert_eq!(saw_old, flag.load(SeqCst));
        });
    }
}

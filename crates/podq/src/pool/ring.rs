//! The worklist's lock-free part: a bounded ring of slots that queuers claim one at a
//! time and workers take in batches, each with one compare-and-swap on its own cache
//! line (after Vyukov's bounded MPMC queue: every slot carries a stamp saying whose turn
//! it is). A holder of the worklist lock can *close* the ring: no queuer and no worker
//! can claim a position after that, and the closer moves what the ring holds, in order,
//! to the locked list.
//! Protocol: `pool/README.md` ("Worklist").
//!
//! Legend: I set at init; A atomic (ordering and pair named at each use); S guarded by
//! its slot's stamp (written by the one thread whose turn the stamp says it is).

use std::mem::MaybeUninit;

use crossbeam_utils::CachePadded;

use super::fifo::Fifo;

use crate::sync::Ordering::{Acquire, Relaxed, Release};
use crate::sync::{spin_wait, AtomicUsize, UnsafeCell};

/// Set in `tail` and `head` while the ring is closed. Positions count up from 0 and
/// never reach it (2^63 claims).
const CLOSED: usize = 1 << (usize::BITS - 1);

/// Why a push was refused: the item comes back with it.
pub(super) enum Refused<T> {
    /// Every slot holds an item.
    Full(T),
    /// A lock holder closed the ring.
    Closed(T),
}

/// A bounded ring of items (see the module docs).
pub(super) struct Ring<T> {
    /// A: the next position to claim for an item, and [`CLOSED`]. Claimed with a
    /// `Relaxed` compare-and-swap: the item's visibility comes from its slot's stamp;
    /// closing is a read-modify-write on this word, so it is ordered after every claim
    /// it does not refuse.
    tail: CachePadded<AtomicUsize>,
    /// A: the next position to take, and [`CLOSED`]. Claimed like `tail`.
    head: CachePadded<AtomicUsize>,
    /// I: the slots; their number is a power of two.
    slots: Box<[Slot<T>]>,
}

struct Slot<T> {
    /// A: for the slot's position `p` of this lap, `p` while it is free for `p`'s
    /// queuer, `p + 1` once that queuer wrote the item (a `Release` store pairing with
    /// the taker's `Acquire` load), `p + capacity` once a worker took it (a `Release`
    /// store pairing with the next lap's queuer's `Acquire` load).
    stamp: AtomicUsize,
    /// S: the item while the stamp is `p + 1`.
    value: UnsafeCell<MaybeUninit<T>>,
}

// SAFETY: a slot's value moves from the queuer that claimed its position to the worker
// that took it, one thread at a time, handed over through the stamp (see `Slot`); so
// the ring is `Sync` and `Send` when the items are `Send`.
unsafe impl<T: Send> Sync for Ring<T> {}
// SAFETY: as for `Sync`.
unsafe impl<T: Send> Send for Ring<T> {}

/// Notes that another thread's claim made this one retry, calling `on_first` the
/// first time.
#[inline]
fn note_retry(retried: &mut bool, on_first: &mut dyn FnMut()) {
    if !*retried {
        *retried = true;
        on_first();
    }
}

impl<T> Ring<T> {
    /// An open, empty ring of `capacity` slots (a power of two).
    pub(super) fn new(capacity: usize) -> Ring<T> {
        assert!(capacity.is_power_of_two(), "ring capacity {capacity}");
        Ring {
            tail: CachePadded::new(AtomicUsize::new(0)),
            head: CachePadded::new(AtomicUsize::new(0)),
            slots: (0..capacity)
                .map(|p| Slot {
                    stamp: AtomicUsize::new(p),
                    value: UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect(),
        }
    }

    fn slot(&self, position: usize) -> &Slot<T> {
        &self.slots[position & (self.slots.len() - 1)]
    }

    /// Appends `item`. Returns whether another thread's claim made this one retry;
    /// `on_retry` is called at the first retry (the statistics time the retries from
    /// there).
    pub(super) fn push(&self, item: T, on_retry: &mut dyn FnMut()) -> Result<bool, Refused<T>> {
        let mut retried = false;
        let mut spins = 0;
        let mut tail = self.tail.load(Relaxed);
        loop {
            if tail & CLOSED != 0 {
                return Err(Refused::Closed(item));
            }
            let slot = self.slot(tail);
            // Acquire: pairs with the Release store of the worker that freed the slot.
            let stamp = slot.stamp.load(Acquire);
            let lag = stamp.wrapping_sub(tail) as isize;
            if lag == 0 {
                match self
                    .tail
                    .compare_exchange_weak(tail, tail + 1, Relaxed, Relaxed)
                {
                    Ok(_) => {
                        // SAFETY: the claim made position `tail` ours: no other queuer
                        // can claim it, and no worker reads the slot before the stamp
                        // below says it holds an item.
                        slot.value.with_mut(|v| unsafe { (*v).write(item) });
                        // Release: pairs with the taker's Acquire load of the stamp.
                        slot.stamp.store(tail + 1, Release);
                        return Ok(retried);
                    }
                    Err(now) => {
                        tail = now;
                        note_retry(&mut retried, on_retry);
                    }
                }
            } else if lag < 0 {
                // The slot still holds the item of the lap before.
                return Err(Refused::Full(item));
            } else {
                // Another queuer claimed this position already, and our `tail` is
                // behind: a load that may be as old again until the line arrives.
                note_retry(&mut retried, on_retry);
                spin_wait(&mut spins);
                tail = self.tail.load(Relaxed);
            }
        }
    }

    /// Appends items of `batch` in order, as many as the free run of slots after
    /// `tail` holds, with one claim. Returns how many it appended (0: full or closed)
    /// and whether another thread's claim made it retry (`on_retry` as in `push`).
    /// `batch` must yield as many items as its `len` says (its claimed slots are
    /// filled from it).
    pub(super) fn push_run(
        &self,
        batch: &mut impl ExactSizeIterator<Item = T>,
        on_retry: &mut dyn FnMut(),
    ) -> (usize, bool) {
        let mut retried = false;
        let mut spins = 0;
        let mut tail = self.tail.load(Relaxed);
        loop {
            if tail & CLOSED != 0 {
                return (0, retried);
            }
            // Acquire: pairs with the Release stores of the workers that freed them.
            let free = (0..batch.len().min(self.slots.len()))
                .take_while(|&k| self.slot(tail + k).stamp.load(Acquire) == tail + k)
                .count();
            if free == 0 {
                let stamp = self.slot(tail).stamp.load(Acquire);
                if (stamp.wrapping_sub(tail) as isize) < 0 || batch.len() == 0 {
                    return (0, retried);
                }
                // Another queuer claimed this position already.
                note_retry(&mut retried, on_retry);
                spin_wait(&mut spins);
                tail = self.tail.load(Relaxed);
                continue;
            }
            match self
                .tail
                .compare_exchange_weak(tail, tail + free, Relaxed, Relaxed)
            {
                Ok(_) => {
                    for p in tail..tail + free {
                        let item = batch.next().expect("a batch as long as its len");
                        let slot = self.slot(p);
                        // SAFETY: as in `push`: the claim made position `p` ours.
                        slot.value.with_mut(|v| unsafe { (*v).write(item) });
                        // Release: pairs with the taker's Acquire load of the stamp.
                        slot.stamp.store(p + 1, Release);
                    }
                    return (free, retried);
                }
                Err(now) => {
                    tail = now;
                    note_retry(&mut retried, on_retry);
                }
            }
        }
    }

    /// Moves up to `max` of the oldest items to the end of `into`, waiting for a queuer
    /// that claimed the oldest position and has not written it yet. Returns how many
    /// it moved (none once the ring is closed) and whether another thread's claim made
    /// it retry (`on_retry` as in `push`; waiting for a queuer's write is no retry).
    pub(super) fn take(
        &self,
        max: usize,
        into: &mut Fifo<T>,
        on_retry: &mut dyn FnMut(),
    ) -> (usize, bool) {
        let mut retried = false;
        let mut spins = 0;
        let mut head = self.head.load(Relaxed);
        if max == 0 {
            return (0, false);
        }
        loop {
            if head & CLOSED != 0 {
                return (0, retried);
            }
            // Acquire: pairs with the queuers' Release stores of the stamps, so the
            // items read below are theirs.
            let ready = (0..max.min(self.slots.len()))
                .take_while(|&k| self.slot(head + k).stamp.load(Acquire) == head + k + 1)
                .count();
            if ready == 0 {
                let now = self.head.load(Relaxed);
                if now != head {
                    head = now;
                    note_retry(&mut retried, on_retry);
                    continue;
                }
                let tail = self.tail.load(Relaxed) & !CLOSED;
                if tail.wrapping_sub(head) as isize <= 0 {
                    return (0, retried);
                }
                // Claimed, not written yet: its queuer is between two instructions,
                // or was preempted there.
                spin_wait(&mut spins);
                continue;
            }
            match self
                .head
                .compare_exchange_weak(head, head + ready, Relaxed, Relaxed)
            {
                Ok(_) => {
                    self.read_out(head..head + ready, into);
                    return (ready, retried);
                }
                Err(now) => {
                    head = now;
                    note_retry(&mut retried, on_retry);
                }
            }
        }
    }

    /// Moves the items of `positions`, which the caller claimed, to `into`, freeing
    /// their slots, waiting for each one's queuer to have written it.
    fn read_out(&self, positions: std::ops::Range<usize>, into: &mut Fifo<T>) {
        for p in positions {
            let slot = self.slot(p);
            let mut spins = 0;
            // Acquire: pairs with the queuer's Release store of the stamp.
            while slot.stamp.load(Acquire) != p + 1 {
                spin_wait(&mut spins);
            }
            // SAFETY: the stamp says position `p` holds its item, and the caller's
            // claim made it ours: no other thread takes it, and no queuer writes the
            // slot before the stamp below frees it.
            into.push_back(slot.value.with_mut(|v| unsafe { (*v).assume_init_read() }));
            // Release: pairs with the next lap's queuer's Acquire load.
            slot.stamp.store(p + self.slots.len(), Release);
        }
    }

    /// Closes the ring (the caller holds the worklist lock): every later claim, of a
    /// queuer or a worker, is refused until [`reopen`](Self::reopen), and the items no
    /// worker claimed before go to the end of `into`, oldest first. Returns whether
    /// it was open.
    pub(super) fn close_into(&self, into: &mut Fifo<T>) -> bool {
        let tail = self.tail.fetch_or(CLOSED, Relaxed);
        if tail & CLOSED != 0 {
            return false;
        }
        // Every claim of a queuer is below `tail` now, every claim of a worker below
        // `head`: what lies between is ours alone.
        let head = self.head.fetch_or(CLOSED, Relaxed);
        self.read_out(head..tail, into);
        self.head.store(tail | CLOSED, Relaxed);
        true
    }

    /// Opens the ring again (the caller holds the worklist lock; the ring is empty).
    pub(super) fn reopen(&self) {
        self.head.fetch_and(!CLOSED, Relaxed);
        self.tail.fetch_and(!CLOSED, Relaxed);
    }

    pub(super) fn is_closed(&self) -> bool {
        self.tail.load(Relaxed) & CLOSED != 0
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        self.close_into(&mut Fifo::new());
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Two threads claim on one ring at once: a call that retried called back exactly
    /// once, at its first retry, and a call that did not never did. Tried until the
    /// threads met at least once (on a busy machine they may run one after the other).
    #[test]
    fn a_claim_calls_back_once_at_its_first_retry() {
        let claims = |ring: &Ring<usize>| {
            let mut retried = 0;
            let mut out = Fifo::new();
            for i in 0..20_000 {
                let mut calls = 0;
                let again = if i % 2 == 0 {
                    ring.push(i, &mut || calls += 1).unwrap_or(false)
                } else {
                    ring.take(1, &mut out, &mut || calls += 1).1
                };
                assert_eq!(calls, usize::from(again), "call {i}");
                retried += calls;
            }
            retried
        };
        for _ in 0..200 {
            let ring = Ring::new(64);
            let retried: usize = std::thread::scope(|s| {
                let threads = [s.spawn(|| claims(&ring)), s.spawn(|| claims(&ring))];
                threads.into_iter().map(|t| t.join().unwrap()).sum()
            });
            if retried > 0 {
                return;
            }
        }
        // One CPU runs the two one after the other: only the relation is checked there.
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        assert!(
            cpus < 2,
            "two threads claiming 20 000 times each never met in 200 tries"
        );
    }

    #[test]
    fn items_come_out_in_order_across_laps_until_full_or_closed() {
        let ring = Ring::new(4);
        let mut out = Fifo::new();
        for lap in 0..3 {
            for i in 0..4 {
                assert!(matches!(ring.push(lap * 10 + i, &mut || {}), Ok(false)));
            }
            assert!(matches!(ring.push(99, &mut || {}), Err(Refused::Full(99))));
            assert_eq!(ring.take(3, &mut out, &mut || {}), (3, false));
            assert_eq!(ring.take(3, &mut out, &mut || {}), (1, false));
            assert_eq!(ring.take(3, &mut out, &mut || {}), (0, false));
        }
        assert_eq!(out, [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23]);
        ring.push(6, &mut || {}).ok().unwrap();
        ring.push(7, &mut || {}).ok().unwrap();
        out.clear();
        assert_eq!(ring.take(1, &mut out, &mut || {}), (1, false));
        assert!(ring.close_into(&mut out));
        assert_eq!(out, [6, 7]);
        assert!(!ring.close_into(&mut out));
        assert!(ring.is_closed());
        assert!(matches!(ring.push(8, &mut || {}), Err(Refused::Closed(8))));
        assert_eq!(ring.take(9, &mut out, &mut || {}), (0, false));
        ring.reopen();
        assert!(!ring.is_closed());
        assert!(matches!(ring.push(9, &mut || {}), Ok(false)));
        assert_eq!(ring.take(9, &mut out, &mut || {}), (1, false));
        assert_eq!(out, [6, 7, 9]);
    }

    #[test]
    fn a_run_fills_the_free_slots_in_order() {
        let ring = Ring::new(4);
        ring.push(0, &mut || {}).ok().unwrap();
        let mut batch = 1..9;
        assert_eq!(ring.push_run(&mut batch, &mut || {}), (3, false));
        assert_eq!(batch.len(), 5);
        assert_eq!(ring.push_run(&mut batch, &mut || {}), (0, false), "full");
        let mut out = Fifo::new();
        assert_eq!(ring.take(2, &mut out, &mut || {}), (2, false));
        assert_eq!(ring.push_run(&mut batch, &mut || {}), (2, false));
        assert_eq!(ring.take(9, &mut out, &mut || {}), (4, false));
        assert_eq!(out, [0, 1, 2, 3, 4, 5]);
        ring.close_into(&mut out);
        assert_eq!(ring.push_run(&mut batch, &mut || {}), (0, false), "closed");
    }

    #[test]
    fn dropping_the_ring_drops_the_items_left_in_it() {
        let item = std::sync::Arc::new(());
        let ring = Ring::new(2);
        ring.push(item.clone(), &mut || {}).ok().unwrap();
        ring.push(item.clone(), &mut || {}).ok().unwrap();
        let mut out = Fifo::new();
        ring.take(1, &mut out, &mut || {});
        ring.push(item.clone(), &mut || {}).ok().unwrap();
        drop(ring);
        assert_eq!(std::sync::Arc::strong_count(&item), 2);
    }
}

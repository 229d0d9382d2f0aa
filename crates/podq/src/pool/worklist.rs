//! A pool's worklist: runnable items, FIFO, behind their own short lock, apart from the
//! pool lock that guards the workers. Queuers push one item per acquisition; workers
//! take a batch per acquisition. Protocol: `pool/README.md` ("Worklist").
//!
//! Legend: K guarded by `Worklist::items` (the worklist lock, held for a push or a
//! batch take only, never while running anything); A atomic.

use std::collections::VecDeque;

use crate::sync::{lock, AtomicUsize, Mutex, MutexGuard, Ordering::SeqCst};

/// How a worklist lock is taken: plainly, or counting contention (`stats.rs`).
pub(crate) trait Acquire {
    /// Locks `mutex`.
    fn acquire<'a, X>(&self, mutex: &'a Mutex<X>) -> MutexGuard<'a, X>;
}

/// Takes the lock with nothing counted (the models and unit tests).
#[cfg(test)]
pub(crate) struct Plain;

#[cfg(test)]
impl Acquire for Plain {
    fn acquire<'a, X>(&self, mutex: &'a Mutex<X>) -> MutexGuard<'a, X> {
        lock(mutex)
    }
}

/// Runnable items of one pool. `T` is a queue entry in the runtime and a plain value
/// in the loom models.
pub(crate) struct Worklist<T> {
    /// K: the items, oldest first.
    items: Mutex<VecDeque<T>>,
    /// A: how many items `items` holds; changed under the lock, read without it.
    /// `SeqCst`: a queuer's increment and its `SeqCst` load of the pool's running and
    /// spinning counts pair with a worker's decrement of those counts and its load of
    /// this length (the Dekker pair of the sleep/wake protocol, `pool.rs`: all
    /// `SeqCst`, so at least one side sees the other; `sync::seqcst_pair_fence`).
    len: AtomicUsize,
}

impl<T> Default for Worklist<T> {
    fn default() -> Self {
        Worklist {
            items: Mutex::new(VecDeque::new()),
            len: AtomicUsize::new(0),
        }
    }
}

impl<T> Worklist<T> {
    /// Appends an item.
    pub(crate) fn push(&self, item: T, how: &impl Acquire) {
        let mut items = how.acquire(&self.items);
        items.push_back(item);
        self.len.fetch_add(1, SeqCst);
    }

    /// Appends items in one acquisition (activation's turn).
    pub(crate) fn push_many(&self, batch: impl ExactSizeIterator<Item = T>, how: &impl Acquire) {
        let n = batch.len();
        if n == 0 {
            return;
        }
        let mut items = how.acquire(&self.items);
        items.extend(batch);
        self.len.fetch_add(n, SeqCst);
    }

    /// Puts `batch` back in front, in its order: items a worker took and has not
    /// started, given back when it blocks.
    pub(crate) fn push_front_all(&self, batch: &mut VecDeque<T>) {
        if batch.is_empty() {
            return;
        }
        let mut items = lock(&self.items);
        let n = batch.len();
        while let Some(item) = batch.pop_back() {
            items.push_front(item);
        }
        self.len.fetch_add(n, SeqCst);
    }

    /// Items waiting now.
    pub(crate) fn len(&self) -> usize {
        self.len.load(SeqCst)
    }

    /// Moves up to `want(len)` of the oldest items into `into` (its end), deciding the
    /// batch size under the lock from the length there. Returns how many it moved.
    pub(crate) fn take_batch(
        &self,
        want: impl FnOnce(usize) -> usize,
        into: &mut VecDeque<T>,
        how: &impl Acquire,
    ) -> usize {
        if self.len.load(SeqCst) == 0 {
            return 0;
        }
        let mut items = how.acquire(&self.items);
        let n = want(items.len()).min(items.len());
        into.extend(items.drain(..n));
        self.len.fetch_sub(n, SeqCst);
        n
    }

    /// Takes the oldest item that `pick` accepts (the rescuer's scan).
    pub(crate) fn take_where(&self, pick: impl Fn(&T) -> bool) -> Option<T> {
        let mut items = lock(&self.items);
        let at = items.iter().position(pick)?;
        let item = items.remove(at);
        self.len.fetch_sub(1, SeqCst);
        item
    }

    /// Applies `f` to every waiting item, oldest first.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&T)) {
        lock(&self.items).iter().for_each(&mut f);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn batches_keep_fifo_order_and_given_back_items_go_first() {
        let list = Worklist::default();
        for i in 0..10 {
            list.push(i, &Plain);
        }
        let mut mine = VecDeque::new();
        assert_eq!(list.take_batch(|len| len / 2, &mut mine, &Plain), 5);
        assert_eq!(mine, [0, 1, 2, 3, 4]);
        assert_eq!(list.len(), 5);
        mine.pop_front();
        list.push_front_all(&mut mine);
        assert!(mine.is_empty());
        assert_eq!(list.len(), 9);
        assert_eq!(list.take_where(|&i| i > 6), Some(7));
        let mut all = VecDeque::new();
        assert_eq!(list.take_batch(|_| 100, &mut all, &Plain), 8);
        assert_eq!(all, [1, 2, 3, 4, 5, 6, 8, 9]);
        assert_eq!(list.take_batch(|_| 100, &mut all, &Plain), 0);
        assert_eq!(list.take_where(|_| true), None);
    }
}

/// Loom model of the worklist on its own: two queuers and a worker taking batches;
/// every item is taken exactly once and each queuer's items stay in order.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    #[test]
    fn loom_batches_take_every_item_once_in_order() {
        loom::model(|| {
            let list = Arc::new(Worklist::default());
            let queuers: Vec<_> = (0..2)
                .map(|q| {
                    let list = list.clone();
                    loom::thread::spawn(move || {
                        list.push((q, 0), &Plain);
                        list.push((q, 1), &Plain);
                    })
                })
                .collect();
            let mut taken = VecDeque::new();
            while taken.len() < 4 {
                if list.take_batch(|len| len.div_ceil(2), &mut taken, &Plain) == 0 {
                    loom::thread::yield_now();
                }
            }
            for q in queuers {
                q.join().unwrap();
            }
            assert_eq!(list.len(), 0);
            for q in 0..2 {
                let seq: Vec<u32> = taken.iter().filter(|e| e.0 == q).map(|e| e.1).collect();
                assert_eq!(seq, [0, 1]);
            }
        });
    }
}
